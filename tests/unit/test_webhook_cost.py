"""What an AgentPool admission review costs does not grow with the pool's replica count.

Counted, not timed: the pod-building calls of `neuronetes_operator.pods` (each pod a pool makes is
a deep copy of its spec) during the webhook's answer to ``kubectl create``, at 1 replica and at the
CRD's maximum, and whether the process-wide `CONVERT_LOCK` is held while the pool is checked.
``bench/admission.py`` measures the same reviews' time and memory (bench/README.md).
"""

from __future__ import annotations

import copy
import types
from collections.abc import Iterator
from typing import Any

import pytest

from neuronetes.api.models import MAX_REPLICAS
from neuronetes_operator import CONVERT_LOCK, pods, validation
from neuronetes_operator.admission import POD_CHECKS
from neuronetes_operator.webhook import admission_response

pytestmark = pytest.mark.unit

TEMPLATE = {
    "metadata": {"labels": {"app": "chat"}},
    "spec": {
        "containers": [
            {"name": "server", "image": "vllm", "env": [{"name": "A", "value": "1"}]},
            {"name": "envoy", "image": "envoy"},
        ],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
    },
}


def review(replicas: int, gang: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "minReplicas": gang or 1,
        "maxReplicas": replicas,
        "gpuRequirements": {"count": 1, "type": "H100", "memory": "80Gi"},
        "template": TEMPLATE,
    }
    if gang:
        spec["scheduling"] = {"gangScheduling": {"enabled": True, "minMembers": gang}}
    pool = {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": "p"},
        "spec": spec,
    }
    return {"request": {"uid": "u", "operation": "CREATE", "namespace": "ns", "object": pool}}


class Counting:
    """`copy` as `neuronetes_operator.pods` uses it, counting deep copies."""

    def __init__(self) -> None:
        self.calls = 0

    def deepcopy(self, x: Any) -> Any:
        self.calls += 1
        return copy.deepcopy(x)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counting]:
    counter = Counting()
    monkeypatch.setattr(pods, "copy", types.SimpleNamespace(deepcopy=counter.deepcopy))
    yield counter


def _copies(counter: Counting, body: dict[str, Any]) -> int:
    before = counter.calls
    answer = admission_response("/objects", body)
    assert answer["response"]["allowed"], answer
    return counter.calls - before


@pytest.mark.parametrize("gang", [0, 8], ids=["replicas", "gangs"])
def test_admission_of_a_pool_at_the_maximum_builds_as_much_as_at_one_replica(
    counted: Counting, monkeypatch: pytest.MonkeyPatch, gang: int
) -> None:
    one = _copies(counted, review(gang or 1, gang))
    most = _copies(counted, review(MAX_REPLICAS, gang))
    assert one > 0 and most == one, (
        f"{one} pod-building copies at {gang or 1} replicas, {most} at {MAX_REPLICAS}"
    )
    # ... and exactly one pod is built and checked, whatever the count.
    built: list[str] = []
    original = pods.PoolTemplate.pod

    def pod(self: Any, name: str, gang_index: int | None) -> dict[str, Any]:
        built.append(name)
        return original(self, name, gang_index)

    monkeypatch.setattr(pods.PoolTemplate, "pod", pod)
    admission_response("/objects", review(MAX_REPLICAS, gang))
    assert built == (["pool-0-0"] if gang else ["pool-0"])


def test_the_global_lock_is_not_held_while_a_pool_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[bool] = []

    def probe(pod: Any) -> list[str]:
        held.append(CONVERT_LOCK.locked())
        return []

    monkeypatch.setitem(POD_CHECKS, "probe", probe)
    admission_response("/objects", review(MAX_REPLICAS))
    assert held == [False]


def test_the_longest_gang_label_is_checked_by_rule_not_by_building_pods() -> None:
    from neuronetes.api.models import AgentPoolSpec, GangScheduling, Scheduling

    # Beyond the CRD's bounds (the webhook does not rely on them): 10^13 gangs of 2.
    spec = AgentPoolSpec(
        replicas=2 * 10**13,
        min_replicas=2,
        scheduling=Scheduling(gang_scheduling=GangScheduling(enabled=True, min_members=2)),
    )
    (refusal,) = validation.check_pool_names("x" * 50, spec)
    assert refusal.startswith("metadata.name: the pool's last gang would be labelled")
    assert validation.check_pool_names("x" * 50, AgentPoolSpec(replicas=MAX_REPLICAS)) == []
