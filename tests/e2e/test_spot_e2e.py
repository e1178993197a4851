"""Spot capacity end to end: the operator, the webhook and the extender as processes, kwok nodes
labelled spot or on-demand (``karpenter.sh/capacity-type``, with their prices), the real
kube-scheduler.

* A pool at ``maxSpotPercent: 50`` of 4 replicas has at most 2 pods on spot, at every reconcile.
* The AWS Node Termination Handler's taint on a spot node that hosts one of its pods: the
  replacement is Ready on an on-demand node before the notice's deadline (the pod's Ready
  condition against the deadline the pool's status records), then the old pod is gone.
* ``interruptionThreshold {count: 2, window: 30s}``: two notices turn spot off (``SpotDisabled``,
  an Event, every pod moves to on-demand); 30 s without one turn it on again.
* notice → replacement Ready, measured over ``$NEURONETES_SPOT_RUNS`` (20) notices: p50 and max
  printed (bench/spot_interruption.py runs this test and prints them).

Every pod takes a whole 4-GPU node, so where each pod can go is exact. The nodes carry a label of
this test that the pools require, and are deleted at the end.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from kubernetes import client
from operator_stack import OperatorStack, operator_stack

from neuronetes.spot import is_spot_node
from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.pods import LABEL_POOL

pytestmark = pytest.mark.e2e

NS = "spot-e2e"
MARK = "neuronetes-e2e/spot"
PROFILE = "t4x4-pcie"
NTH = "aws-node-termination-handler/spot-itn"
RUNS = int(os.environ.get("NEURONETES_SPOT_RUNS", "20"))


def pool(name: str, replicas: int, cost: dict[str, Any], group: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": MARK, "operator": "In", "values": [group]}]}
    return {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "minReplicas": 1,
            "gpuRequirements": {"count": 4},
            "scheduling": {"costOptimization": cost},
            "template": {
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                        }
                    }
                }
            },
        },
    }


class Spot:
    """The cluster seen by one test: pools, pods, nodes and the operator's Events."""

    def __init__(self, cluster: E2ECluster, stack: OperatorStack) -> None:
        self.cluster, self.stack = cluster, stack
        api = cluster.api_client()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def add(self, count: int, prefix: str, *, spot: bool, group: str) -> list[str]:
        capacity = "spot" if spot else "on-demand"
        labels = {"karpenter.sh/capacity-type": capacity, MARK: group}
        return self.stack.add_nodes(PROFILE, count, prefix, spot=spot, labels=labels)

    def apply(self, obj: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def pool(self, name: str) -> dict[str, Any]:
        return dict(
            self.custom.get_namespaced_custom_object("neuronetes.io", "v1alpha1", NS, "agentpools", name)
        )

    def pods(self, name: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(NS, label_selector=f"{LABEL_POOL}={name}").items)

    def live(self, name: str) -> list[Any]:
        return [p for p in self.pods(name) if p.metadata.deletion_timestamp is None]

    def spot_node(self, node: str) -> bool:
        return is_spot_node(self.core.read_node(node).metadata.labels or {})

    def taint(self, node: str, key: str | None) -> None:
        """Put the notice taint `key` on `node` (None: take every notice taint off)."""
        taints = [t for t in self.core.read_node(node).spec.taints or [] if t.key != NTH]
        if key is not None:
            taints.append(client.V1Taint(key=key, value="true", effect="NoSchedule"))
        self.core.patch_node(node, {"spec": {"taints": [t.to_dict() for t in taints] or None}})

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        for cd in (self.pool(name).get("status") or {}).get("conditions") or []:
            if cd["type"] == kind:
                return dict(cd)
        return {}

    def events(self, reason: str) -> list[str]:
        found = self.core.list_namespaced_event(NS, field_selector=f"reason={reason}").items
        return [e.message for e in found]


def ready(pod: Any) -> bool:
    return any(cd.type == "Ready" and cd.status == "True" for cd in pod.status.conditions or [])


def ready_since(pod: Any) -> datetime:
    since: datetime = next(
        cd.last_transition_time for cd in pod.status.conditions or [] if cd.type == "Ready"
    )
    return since


def settled(spot: Spot, name: str, want: int) -> list[Any] | None:
    """The pool's pods once `want` are live, all Ready and bound, and none is terminating."""
    pods = spot.pods(name)
    ok = len(pods) == want and all(
        ready(p) and p.spec.node_name and not p.metadata.deletion_timestamp for p in pods
    )
    return pods if ok else None


@pytest.fixture(scope="module")
def spot(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spot]:
    work = Path(tmp_path_factory.mktemp("spot"))
    with operator_stack(cluster, work, NS, settings=dev_operator_settings()) as up:
        view = Spot(cluster, up)
        up.local.start()
        yield view


def test_max_spot_percent_and_a_notice_moves_the_pod_to_on_demand_before_the_deadline(spot: Spot) -> None:
    spot.add(3, "spe-spot", spot=True, group="share")
    spot.add(3, "spe-od", spot=False, group="share")
    cost = {
        "spotEnabled": True,
        "spotStrategy": {"maxSpotPercent": 50, "onInterruption": "migrate-to-on-demand"},
    }
    spot.apply(pool("share", 4, cost, "share"))
    pods = wait_until(lambda: settled(spot, "share", 4), timeout=120, what="4 pods Ready")
    on_spot = [p for p in pods if spot.spot_node(p.spec.node_name)]
    assert len(on_spot) <= 2  # maxSpotPercent 50 of 4
    status = wait_until(lambda: (spot.pool("share").get("status") or {}).get("spot"), what="status.spot")
    assert status["allowedUnits"] == 2
    if not on_spot:
        pytest.fail(f"no pod went to spot (nodes: {[p.spec.node_name for p in pods]})")

    victim = on_spot[0]
    node = victim.spec.node_name
    spot.taint(node, NTH)
    replacement_name = victim.metadata.name + "-r"

    def replaced() -> Any:
        live = {p.metadata.name: p for p in spot.pods("share")}
        new = live.get(replacement_name)
        return new if new is not None and ready(new) and victim.metadata.name not in live else None

    new = wait_until(replaced, timeout=150, what="the replacement Ready and the old pod gone")
    assert not spot.spot_node(new.spec.node_name) and new.spec.node_name != node
    (entry,) = [i for i in spot.pool("share")["status"]["spot"]["interruptions"] if i["node"] == node]
    assert entry["source"] == "aws-nth-spot-itn"
    deadline = datetime.fromisoformat(entry["deadline"])
    assert ready_since(new) <= deadline
    pods = wait_until(lambda: settled(spot, "share", 4), timeout=60, what="4 pods Ready again")
    assert sum(spot.spot_node(p.spec.node_name) for p in pods) <= 2
    assert any(node in m for m in spot.events("SpotInterrupted"))
    assert spot.events("SpotReplaced")
    wait_until(
        lambda: (
            spot.pool("share")["status"].get("spotReplicas")
            == sum(spot.spot_node(p.spec.node_name) for p in spot.live("share"))
        ),
        what="status.spotReplicas right",
    )
    spot.cluster.kubectl("delete", "agentpool", "share", "-n", NS)


def test_the_interruption_threshold_turns_spot_off_and_on_again(spot: Spot) -> None:
    spot_nodes = spot.add(2, "spt-spot", spot=True, group="threshold")
    spot.add(2, "spt-od", spot=False, group="threshold")
    cost = {
        "spotEnabled": True,
        "interruptionThreshold": {"count": 2, "window": "30s", "action": "disable-spot"},
    }
    spot.apply(pool("thr", 2, cost, "threshold"))
    pods = wait_until(lambda: settled(spot, "thr", 2), timeout=120, what="2 pods Ready")
    # The spot controller writes its conditions on its own tick, which may come after the pods are
    # Ready: wait for the first write, then it must say spot is allowed.
    first = wait_until(lambda: spot.condition("thr", "SpotDisabled"), timeout=60, what="SpotDisabled written")
    assert first["status"] == "False", first
    noticed = 0
    for node in spot_nodes:
        if any(p.spec.node_name == node for p in spot.live("thr")):
            spot.taint(node, NTH)
            noticed += 1

            def drained(node: str = node) -> bool:
                return not any(p.spec.node_name == node for p in spot.live("thr"))

            wait_until(drained, timeout=150, what=f"pods off {node}")
    assert noticed == 2, [p.spec.node_name for p in pods]
    disabled = wait_until(
        lambda: spot.condition("thr", "SpotDisabled").get("status") == "True", what="SpotDisabled"
    )
    assert disabled and spot.events("InterruptionThresholdReached")
    assert spot.pool("thr")["status"]["spot"]["allowedUnits"] == 0
    # The quiet period: one window (30 s) without a notice; the notice taints go, spot comes back.
    for node in spot_nodes:
        spot.taint(node, None)
    wait_until(
        lambda: spot.condition("thr", "SpotDisabled").get("status") == "False",
        timeout=120,
        what="spot back on after the quiet period",
    )
    assert spot.events("InterruptionThresholdCleared")
    spot.cluster.kubectl("delete", "agentpool", "thr", "-n", NS)


def test_notice_to_replacement_ready_measured(spot: Spot) -> None:
    """One spot node, two on-demand: the pool's spot pod is noticed, replaced on on-demand, then
    (taint off, the spare on-demand node cordoned, the replacement deleted) recreated on spot."""
    (spot_node,) = spot.add(1, "spm-spot", spot=True, group="measure")
    on_demand = spot.add(2, "spm-od", spot=False, group="measure")
    cost = {"spotEnabled": True, "spotStrategy": {"maxSpotPercent": 50}}
    spot.apply(pool("meas", 2, cost, "measure"))
    seconds: list[float] = []
    for _ in range(RUNS):
        pods = wait_until(lambda: settled(spot, "meas", 2), timeout=120, what="2 pods Ready")
        victims = [p for p in pods if p.spec.node_name == spot_node]
        assert victims, [p.spec.node_name for p in pods]
        victim = victims[0].metadata.name
        started = time.monotonic()
        spot.taint(spot_node, NTH)

        def replaced(victim: str = victim) -> Any:
            live = [
                p for p in spot.pods("meas") if p.metadata.name != victim and p.spec.node_name != spot_node
            ]
            new = [p for p in live if p.metadata.name in (victim + "-r", victim.removesuffix("-r"))]
            return new[0] if new and ready(new[0]) else None

        new = wait_until(replaced, timeout=150, interval=0.05, what="the replacement Ready")
        seconds.append(time.monotonic() - started)
        assert new.spec.node_name in on_demand

        def gone(victim: str = victim) -> bool:
            return victim not in {p.metadata.name for p in spot.pods("meas")}

        wait_until(gone, timeout=150, what="the old pod gone")
        # Back to one pod on spot for the next run.
        spot.taint(spot_node, None)
        spare = new.spec.node_name
        spot.cluster.kubectl("cordon", spare)
        spot.core.delete_namespaced_pod(new.metadata.name, NS)
        wait_until(
            lambda: any(p.spec.node_name == spot_node and ready(p) for p in spot.live("meas")),
            timeout=120,
            what="a pod on the spot node again",
        )
        spot.cluster.kubectl("uncordon", spare)
    p50 = statistics.median(seconds)
    print(
        f"\nspot notice -> replacement Ready over {len(seconds)} runs: p50 {p50:.2f}s max {max(seconds):.2f}s"
    )
    print(
        "SPOT_RESULT "
        + json.dumps(
            {
                "runs": len(seconds),
                "p50_s": round(p50, 3),
                "max_s": round(max(seconds), 3),
                "seconds": [round(s, 3) for s in seconds],
            }
        )
    )
    assert len(seconds) == RUNS
    spot.cluster.kubectl("delete", "agentpool", "meas", "-n", NS)
