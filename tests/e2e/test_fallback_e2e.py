"""The fallback model end to end: the operator as a process rolls a pool to its fallbackModel while a
trigger holds, and back once it has been clear for ``holdSeconds``.

The triggers are read from the pool's status, where the other steps put them: the condition
``CostBudgetExceeded``, which the operator's own budget step computes from the nodes' prices (the
dgx-a100-80gb profile: 40.97/h for 8 GPUs: 10.24/h a replica of llama-70b on 2 GPUs, 5.12/h one of
llama-8b on ``fallbackGPUCount`` 1), and the autoscaling
controller's ``status.autoscaling`` (expected TTFT), which the test writes through the status
subresource as that controller does; the operator runs with its autoscaling controller off so that
it does not overwrite the decision the test wrote (kwok pods serve no metrics). Pods are kwok pods
on kwok nodes; the extender places them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from operator_stack import operator_stack

from neuronetes import contracts as c
from neuronetes.devcluster.localstack import LocalStack
from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.pods import ENV_MODEL, LABEL_POOL

pytestmark = pytest.mark.e2e

NS = "fallback-e2e"
HOLD_S = 4


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    work = Path(tmp_path_factory.mktemp("fallback"))
    # Resync every 2 s: the roll back is due HOLD_S after the trigger cleared, with no event then.
    settings = {**dev_operator_settings(), "resyncSeconds": 2, "autoscaler": {"enabled": False}}
    with operator_stack(cluster, work, NS, settings=settings, replicas=1) as up:
        # The pools run on these nodes only: the budget prices a pod by every node it may land on,
        # and nodes other tests left in the shared cluster may have no price (unknown: nothing is
        # created).
        up.add_nodes("dgx-a100-80gb", 2, "fb-dgx", labels={OWN_NODES: "true"})
        up.local.start()
        yield up.local


OWN_NODES = "neuronetes.test/fallback-e2e"
ON_OWN_NODES = {"nodeSelector": {OWN_NODES: "true"}}
BUDGET_FOR_PRIMARY = 24  # two replicas of llama-70b (2 GPUs each) on dgx-a100-80gb nodes: 20.48/h
BUDGET_FOR_FALLBACK = 12  # two of llama-8b (1 GPU each): 10.24/h; one of llama-70b fits, two do not


def pool_manifest(name: str, trigger: str, budget: float = BUDGET_FOR_PRIMARY, **spec: Any) -> str:
    """A pool of 2 replicas serving llama-70b on 2 GPUs each (template labelled size=large) with
    fallback llama-8b on 1 GPU each (fallbackTemplate labelled size=small) on `trigger`, as JSON for
    ``kubectl apply``."""
    cost = {
        "maxCostPerHour": budget,
        "sloHeadroomMs": 200,
        "fallbackModel": "llama-8b",
        "fallbackGPUCount": 1,
        "fallbackTemplate": {"metadata": {"labels": {"size": "small"}}, "spec": ON_OWN_NODES},
        "fallbackTrigger": {trigger: True, "holdSeconds": HOLD_S},
    }
    body = {
        "model": "llama-70b",
        "replicas": 2,
        "minReplicas": 1,
        "maxReplicas": 2,
        "gpuRequirements": {"count": 2},
        "template": {"metadata": {"labels": {"size": "large"}}, "spec": ON_OWN_NODES},
        "scheduling": {"costOptimization": cost},
        **spec,
    }
    return json.dumps(
        {"apiVersion": c.API_VERSION, "kind": "AgentPool", "metadata": {"name": name}, "spec": body}
    )


def status_of(cluster: E2ECluster, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "agentpool", name, "-n", NS).get("status") or {})


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((cd for cd in status.get("conditions") or [] if cd["type"] == kind), None)


def patch_status(cluster: E2ECluster, name: str, status: dict[str, Any]) -> None:
    cluster.kubectl(
        "patch", "agentpool", name, "-n", NS, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def set_budget(cluster: E2ECluster, name: str, per_hour: float) -> None:
    patch = {"spec": {"scheduling": {"costOptimization": {"maxCostPerHour": per_hour}}}}
    cluster.kubectl("patch", "agentpool", name, "-n", NS, "--type=merge", "-p", json.dumps(patch))


def set_expected_ttft(cluster: E2ECluster, name: str, seconds: float) -> None:
    """``status.autoscaling`` as the autoscaling controller writes it after a decision."""
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    decided = {"currentReplicas": 2, "desiredReplicas": 2, "rule": "hold", "lastDecisionTime": now}
    patch_status(cluster, name, {"autoscaling": {**decided, "expectedTTFTSeconds": seconds}})


GPUS = {"large": "2", "small": "1"}


def serving(
    cluster: E2ECluster, name: str, model: str, size: str, replicas: int = 2
) -> dict[str, Any] | None:
    """The pool's status once `replicas` Ready pods of `model` (its template: `size`, and its GPUs)
    serve it."""
    status = status_of(cluster, name)
    pods = get_json(cluster, "pods", "-n", NS, "-l", f"{LABEL_POOL}={name}")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    ok = (
        status.get("activeModel") == model
        and len(live) == replicas
        and all(
            p["metadata"]["annotations"].get(c.ANNOTATION_MODEL) == model
            and p["metadata"]["labels"].get("size") == size
            and {"name": ENV_MODEL, "value": model} in p["spec"]["containers"][0]["env"]
            and p["spec"]["containers"][0]["resources"]["limits"].get(c.RESOURCE_GPU) == GPUS[size]
            and any(
                cd["type"] == "Ready" and cd["status"] == "True" for cd in p["status"].get("conditions") or []
            )
            for p in live
        )
    )
    return status if ok else None


def events(cluster: E2ECluster, name: str) -> list[dict[str, Any]]:
    found = get_json(cluster, "events", "-n", NS, "--field-selector", f"involvedObject.name={name}")["items"]
    return sorted(found, key=lambda e: e.get("firstTimestamp") or "")


def reasons(cluster: E2ECluster, name: str) -> list[str]:
    return [e["reason"] for e in events(cluster, name)]


def test_cost_exceeded_rolls_to_the_fallback_model_and_back(cluster: E2ECluster, stack: LocalStack) -> None:
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=pool_manifest("cost", "costExceeded"))
    status = wait_until(lambda: serving(cluster, "cost", "llama-70b", "large"), timeout=120, what="70b Ready")
    active = condition(status, "FallbackActive")
    assert active is not None and (active["status"], active["reason"]) == ("False", "PrimaryModel")
    budget = condition(status, "CostBudgetExceeded")
    assert budget is not None and budget["status"] == "False"

    # The budget lowered under the running cost: the budget step keeps one replica of llama-70b and
    # says so, and its condition is the fallback step's trigger. llama-8b on one GPU a replica
    # serves both replicas within the budget.
    set_budget(cluster, "cost", BUDGET_FOR_FALLBACK)
    status = wait_until(
        lambda: serving(cluster, "cost", "llama-8b", "small"), timeout=120, what="8b rolled in"
    )
    active = condition(status, "FallbackActive")
    assert active is not None and (active["status"], active["reason"]) == ("True", "CostBudgetExceeded")
    assert "serving llama-8b instead of llama-70b" in active["message"]
    assert "llama-70b would cost 20.48/h at 2 replicas, over maxCostPerHour 12.00/h" in active["message"]
    assert status["fallback"]["triggers"] == ["costExceeded"]
    budget = condition(status, "CostBudgetExceeded")
    assert budget is not None and (budget["status"], budget["reason"]) == ("False", "WithinBudget")
    # The cost in status follows the second pod's bind by one reconcile.
    wait_until(
        lambda: abs(status_of(cluster, "cost")["cost"]["currentPerHour"] - 10.24) < 0.01,
        timeout=30,
        what="status.cost 10.24/h",
    )
    assert "FallbackModel" in reasons(cluster, "cost")
    # The fallback fits, the primary still does not: past holdSeconds the pool stays (no round trip).
    time.sleep(HOLD_S + 4)
    assert serving(cluster, "cost", "llama-8b", "small") is not None
    assert "PrimaryModel" not in reasons(cluster, "cost")

    set_budget(cluster, "cost", BUDGET_FOR_PRIMARY)
    status = wait_until(lambda: serving(cluster, "cost", "llama-70b", "large"), timeout=120, what="70b back")
    active = condition(status, "FallbackActive")
    assert active is not None and (active["status"], active["reason"]) == ("False", "PrimaryModel")
    assert status["fallback"]["action"] == "keep" and "restoreSince" not in status["fallback"]
    said = events(cluster, "cost")
    switched = [e["reason"] for e in said if e["reason"] in ("FallbackModel", "PrimaryModel")]
    told = "\n".join(f"{e.get('firstTimestamp')} {e['reason']}: {e['message']}" for e in said)
    assert switched == ["FallbackModel", "PrimaryModel"], told  # one switch each way, no flapping
    back = next(e["message"] for e in said if e["reason"] == "PrimaryModel")
    assert "within maxCostPerHour 24.00/h" in back


def test_slo_at_risk_rolls_to_the_faster_fallback_and_back(cluster: E2ECluster, stack: LocalStack) -> None:
    manifest = pool_manifest("slo", "sloAtRisk", autoscaling={"ttftMs": 1000})
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=manifest)
    wait_until(lambda: serving(cluster, "slo", "llama-70b", "large"), timeout=120, what="70b Ready")

    set_expected_ttft(cluster, "slo", 0.95)  # over ttftMs 1000 - sloHeadroomMs 200
    status = wait_until(
        lambda: serving(cluster, "slo", "llama-8b", "small"), timeout=120, what="8b rolled in"
    )
    active = condition(status, "FallbackActive")
    assert active is not None and (active["status"], active["reason"]) == ("True", "SloAtRisk")
    assert "expected TTFT 950ms vs 800ms allowed" in active["message"]

    set_expected_ttft(cluster, "slo", 0.3)
    status = wait_until(lambda: serving(cluster, "slo", "llama-70b", "large"), timeout=120, what="70b back")
    active = condition(status, "FallbackActive")
    assert active is not None and active["status"] == "False"
    assert "expected TTFT 300ms vs 800ms allowed" in active["message"]
