"""The operator's fallback step (`neuronetes_operator.fallback.choose_model`) on pool objects as the
API server returns them: the triggers read from ``status`` (the cost condition, the autoscaler's
decision), the pods of the model served, the hold time, the status and the admission checks."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from neuronetes import contracts as c
from neuronetes.api.models import AgentPool, decode
from neuronetes_operator.budget import (
    BUDGET_REACHED,
    UNKNOWN_PRICES,
    PoolPrices,
    PrimaryCost,
    pod_gpus,
    primary_cost,
)
from neuronetes_operator.fallback import SLO_SIGNAL_MAX_AGE_S, choose_model, policy_inputs
from neuronetes_operator.pods import ANNOTATION_MODEL, ENV_MODEL, desired_pods
from neuronetes_operator.policy import resolve
from neuronetes_operator.reconcile import plan
from neuronetes_operator.status import pool_status
from neuronetes_operator.validation import review_object

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC).timestamp()
SPEC = """
model: llama-70b
minReplicas: 2
maxReplicas: 2
autoscaling: {ttftMs: 1000}
template:
  spec:
    containers:
      - name: vllm
        image: vllm/vllm-openai:v0.6.3
        args: ["--model", "$(AGENTPOOL_MODEL)"]
scheduling:
  costOptimization:
    sloHeadroomMs: 200
    maxCostPerHour: 10
    fallbackModel: llama-8b
    fallbackTrigger: {costExceeded: true, sloAtRisk: true, holdSeconds: 60}
"""


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def pool(spec: str = SPEC, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1", "generation": 2},
        "spec": yaml.safe_load(spec),
        "status": status or {},
    }


def budget(exceeded: bool, reason: str = BUDGET_REACHED) -> dict[str, Any]:
    return {
        "type": "CostBudgetExceeded",
        "status": "True" if exceeded else "False",
        "reason": reason if exceeded else "WithinBudget",
        "message": "cost 12.0/h over maxCostPerHour 10.0/h",
    }


def decided(ttft_s: float | None, at: float = NOW) -> dict[str, Any]:
    return {"rule": "hold", "expectedTTFTSeconds": ttft_s, "lastDecisionTime": iso(at)}


def choose(obj: dict[str, Any], now: float = NOW) -> Any:
    spec = decode(obj, AgentPool).spec
    return choose_model(obj, spec, policy_inputs(obj, spec, resolve(spec), {}, now=now), now=now)


def test_the_spot_placements_state_is_the_trees_spot_input_and_its_threshold_a_trigger() -> None:
    spot_spec = SPEC.replace("sloHeadroomMs: 200", "sloHeadroomMs: 200\n    spotEnabled: true")
    spot_node = {"s1": {"metadata": {"labels": {"karpenter.sh/capacity-type": "spot"}}}}

    def inputs(spot: dict[str, Any]) -> Any:
        obj = pool(spot_spec, {"activeModel": "llama-70b", "autoscaling": decided(0.3), "spot": spot})
        spec = decode(obj, AgentPool).spec
        return policy_inputs(obj, spec, resolve(spec), spot_node, now=NOW)

    # status.spot as the spot placement writes it: a unit left of the share, or none (spot turned off).
    assert inputs({"allowedUnits": 1, "spotUnits": 0}).spot_available
    assert not inputs({"allowedUnits": 1, "spotUnits": 1}).spot_available
    assert not inputs({"allowedUnits": 0, "spotUnits": 0, "thresholdAction": "disable-spot"}).spot_available
    # interruptionThreshold with action fallback-model tripped: the pool rolls to its fallback model.
    obj = pool(
        spot_spec,
        {
            "activeModel": "llama-70b",
            "autoscaling": decided(0.3),
            "spot": {"allowedUnits": 1, "spotUnits": 1, "fallbackRequested": True},
        },
    )
    got = choose(obj)
    assert got.model == "llama-8b" and got.status.triggers == ["spotInterruptions"]
    assert got.condition.status == "True" and got.condition.reason == "SpotInterruptions"


def test_cost_exceeded_condition_switches_to_the_fallback_with_its_figures() -> None:
    obj = pool(status={"activeModel": "llama-70b", "autoscaling": decided(0.3), "conditions": [budget(True)]})
    got = choose(obj)
    assert got.model == "llama-8b" and got.decision.action == "degrade-model"
    assert (got.condition.type, got.condition.status, got.condition.reason) == (
        "FallbackActive",
        "True",
        "CostBudgetExceeded",
    )
    assert "serving llama-8b instead of llama-70b" in got.condition.message
    assert "cost 12.0/h over maxCostPerHour 10.0/h" in got.condition.message
    assert "expected TTFT 300ms vs 800ms allowed" in got.condition.message
    assert got.event is not None and got.event[:2] == ("Normal", "FallbackModel")
    assert got.event[2].startswith("llama-70b -> llama-8b (rolling replacement)")
    assert got.status.triggers == ["costExceeded"] and got.status.last_switch_time is not None


def test_unknown_prices_are_not_cost_exceeded() -> None:
    """Replicas held back only because nobody prices their nodes (e.g. an operator that has not
    seen every node yet) do not roll the pool: the smaller model is not known to be cheaper."""
    unpriced = [budget(True, UNKNOWN_PRICES)]
    obj = pool(status={"activeModel": "llama-70b", "autoscaling": decided(0.3), "conditions": unpriced})
    got = choose(obj)
    assert got.model == "llama-70b" and got.decision.action == "keep" and got.event is None
    assert got.status.triggers is None
    assert (got.condition.status, got.condition.reason) == ("False", "PrimaryModel")
    # The same pool over budget does switch: only the reason differs.
    obj["status"]["conditions"] = [budget(True)]
    assert choose(obj).decision.action == "degrade-model"


def test_slo_at_risk_from_the_autoscalers_status_switches_at_max_replicas() -> None:
    obj = pool(status={"activeModel": "llama-70b", "autoscaling": decided(0.95)})
    got = choose(obj)
    assert got.model == "llama-8b" and got.decision.action == "faster-model"
    assert got.condition.reason == "SloAtRisk" and "expected TTFT 950ms vs 800ms" in got.condition.message
    # Below maxReplicas the tree scales up first: the model stays.
    more = pool(SPEC.replace("maxReplicas: 2", "maxReplicas: 4"), obj["status"])
    assert choose(more).model == "llama-70b" and choose(more).decision.action == "scale-up"


def test_a_stale_or_missing_autoscaler_decision_takes_no_step() -> None:
    old = pool(
        status={
            "activeModel": "llama-70b",
            "autoscaling": decided(0.95, at=NOW - SLO_SIGNAL_MAX_AGE_S - 1),
            "conditions": [budget(True)],
        }
    )
    got = choose(old)
    assert got.model == "llama-70b" and got.decision.action == "keep" and "stale" in got.decision.reason
    assert (got.condition.status, got.condition.reason) == ("False", "PrimaryModel")
    assert got.event is None
    stale = pool(status={"autoscaling": {**decided(0.95), "staleMetrics": ["tokens_in_queue"]}})
    assert choose(stale).decision.action == "keep"


def test_back_to_the_model_only_after_the_hold_time() -> None:
    status: dict[str, Any] = {
        "activeModel": "llama-8b",
        "autoscaling": decided(0.3),
        "conditions": [budget(False)],
    }
    first = choose(pool(status=status))
    assert first.model == "llama-8b" and first.decision.action == "restore-model"
    assert first.condition.reason == "FallbackHeld" and "back to llama-70b at" in first.condition.message
    assert first.status.restore_since is not None and first.event is None
    status["fallback"] = {"restoreSince": iso(NOW)}
    assert choose(pool(status=status), now=NOW + 59).model == "llama-8b"
    status["autoscaling"] = decided(0.3, at=NOW + 60)
    back = choose(pool(status=status), now=NOW + 60)
    assert back.model == "llama-70b" and back.status.restore_since is None
    assert back.event is not None and back.event[1] == "PrimaryModel"
    assert back.event[2].startswith("llama-8b -> llama-70b")


def test_the_fallback_pods_differ_only_by_the_model_and_roll_one_at_a_time() -> None:
    obj = pool(status={"conditions": [budget(True)], "autoscaling": decided(0.3)})
    spec = decode(obj, AgentPool).spec
    resolved = resolve(spec)
    before = desired_pods(obj, spec, resolved)
    after = desired_pods(obj, spec, resolved, model="llama-8b")
    old, new = before[0].manifest, after[0].manifest
    assert old["spec"]["containers"][0]["env"] == [{"name": ENV_MODEL, "value": "llama-70b"}]
    assert new["spec"]["containers"][0]["env"] == [{"name": ENV_MODEL, "value": "llama-8b"}]
    assert (
        old["metadata"]["annotations"][ANNOTATION_MODEL],
        new["metadata"]["annotations"][ANNOTATION_MODEL],
    ) == (
        "llama-70b",
        "llama-8b",
    )
    assert before[0].template.digest != after[0].template.digest
    ready = [{"type": "Ready", "status": "True"}]
    pods = [
        {**copy.deepcopy(d.manifest), "status": {"phase": "Running", "conditions": ready}} for d in before
    ]
    actions = plan(after, pods)
    assert [(a.verb, a.reason) for a in actions] == [("delete", "Outdated")]  # one replica at a time


def test_the_fallback_template_is_used_for_the_fallback_model_only() -> None:
    spec_text = SPEC + (
        "    fallbackTemplate:\n"
        "      metadata: {labels: {tier: small}}\n"
        "      spec: {containers: [{name: small, image: vllm/vllm-openai:v0.6.3}]}\n"
    )
    obj = pool(spec_text)
    spec = decode(obj, AgentPool).spec
    small = desired_pods(obj, spec, resolve(spec), model="llama-8b")[0].manifest
    big = desired_pods(obj, spec, resolve(spec))[0].manifest
    assert (
        small["spec"]["containers"][0]["name"] == "small" and small["metadata"]["labels"]["tier"] == "small"
    )
    assert big["spec"]["containers"][0]["name"] == "vllm" and "tier" not in big["metadata"]["labels"]


def test_the_fallback_pods_hold_fallback_gpu_count_gpus() -> None:
    """A smaller model on fewer GPUs is what makes the fallback cheaper: its pods ask for
    fallbackGPUCount GPUs, the primary's for gpuRequirements.count, and the budget prices each by
    what it asks."""
    spec_text = SPEC + "    fallbackGPUCount: 1\ngpuRequirements: {count: 4}\n"
    obj = pool(spec_text)
    spec = decode(obj, AgentPool).spec
    small = desired_pods(obj, spec, resolve(spec), model="llama-8b")[0].manifest
    big = desired_pods(obj, spec, resolve(spec))[0].manifest
    assert small["spec"]["containers"][0]["resources"]["limits"] == {"neuronetes.io/gpu": "1"}
    assert big["spec"]["containers"][0]["resources"]["limits"] == {"neuronetes.io/gpu": "4"}
    assert (pod_gpus(small), pod_gpus(big)) == (1, 4)


def on_fallback(primary: PrimaryCost, now: float = NOW, **status: Any) -> Any:
    """The pool serving llama-8b, its own budget condition clear, and what llama-70b would cost."""
    obj = pool(
        status={"activeModel": "llama-8b", "autoscaling": decided(0.3, at=now), "conditions": [budget(False)]}
        | status
    )
    spec = decode(obj, AgentPool).spec
    inputs = policy_inputs(obj, spec, resolve(spec), {}, now=now, primary=primary)
    return choose_model(obj, spec, inputs, now=now, primary=primary)


def test_on_the_fallback_the_cost_trigger_holds_while_the_primary_would_not_fit() -> None:
    """The fallback fits the budget (its condition is clear); the pool goes back only once
    spec.model would fit too, not round trip every holdSeconds."""
    over = on_fallback(PrimaryCost(20.48, 2, 12.0))
    assert over.model == "llama-8b" and over.decision.action == "keep"
    assert over.status.triggers == ["costExceeded"] and over.status.restore_since is None
    assert (over.condition.status, over.condition.reason) == ("True", "CostBudgetExceeded")
    assert "llama-70b would cost 20.48/h at 2 replicas, over maxCostPerHour 12.00/h" in over.condition.message
    assert over.event is None
    unknown = on_fallback(PrimaryCost(None, 2, 12.0))
    assert unknown.model == "llama-8b" and "would cost an unknown price" in unknown.condition.message
    # The budget raised: the primary fits, and after the hold time the pool goes back.
    fits = on_fallback(PrimaryCost(20.48, 2, 24.0))
    assert fits.model == "llama-8b" and fits.decision.action == "restore-model"
    assert fits.status.restore_since is not None
    back = on_fallback(PrimaryCost(20.48, 2, 24.0), now=NOW + 60, fallback={"restoreSince": iso(NOW)})
    assert back.model == "llama-70b" and back.event is not None and back.event[1] == "PrimaryModel"
    assert "within maxCostPerHour 24.00/h" in back.event[2]


def test_the_primary_cost_is_its_pods_projection() -> None:
    obj = pool(SPEC + "gpuRequirements: {count: 2}\n")
    spec = decode(obj, AgentPool).spec
    want = desired_pods(obj, spec, resolve(spec))
    node = {"metadata": {"labels": {c.LABEL_PRICE_PER_HOUR: "40.96", c.LABEL_GPU_COUNT: "8"}}}
    priced = PoolPrices({"n1": node}, template_spec=want[0].template.spec)
    assert primary_cost(want, priced, 12.0) == PrimaryCost(20.48, 2, 12.0)
    assert not primary_cost(want, priced, 12.0).fits and primary_cost(want, priced, 20.48).fits
    unpriced = PoolPrices({"n1": {"metadata": {"labels": {}}}}, template_spec=want[0].template.spec)
    assert primary_cost(want, unpriced, 100.0) == PrimaryCost(None, 2, 100.0)
    assert not PrimaryCost(None, 2, 100.0).fits


def test_a_pool_without_a_fallback_model_is_as_before() -> None:
    obj = pool("model: llama-70b\nminReplicas: 1\n")
    spec = decode(obj, AgentPool).spec
    assert choose(obj) is None
    pod = desired_pods(obj, spec, resolve(spec))[0].manifest
    assert (
        "env" not in pod["spec"]["containers"][0] and ANNOTATION_MODEL not in pod["metadata"]["annotations"]
    )
    status = pool_status(obj, resolve(spec), [], {})
    assert status.active_model == "llama-70b" and status.fallback is None


def test_status_shows_the_active_model_and_leaves_the_cost_condition_to_the_budget_step() -> None:
    obj = pool(status={"conditions": [budget(True)], "autoscaling": decided(0.3)})
    spec = decode(obj, AgentPool).spec
    resolved = resolve(spec)
    status = pool_status(obj, resolved, [], {}, model=choose(obj))
    assert status.active_model == "llama-8b"
    assert status.fallback is not None and status.fallback.action == "degrade-model"
    kinds = {cd.type: cd.status for cd in status.conditions or []}
    # The budget step computes CostBudgetExceeded every reconcile (status.budget_condition): a status
    # without its plan (here: none passed, as for a pool whose budget was removed) drops it.
    assert kinds["FallbackActive"] == "True" and "CostBudgetExceeded" not in kinds
    effect = next(p.effect for p in resolved.policies if p.name == "costOptimization")
    assert effect is not None and "serves llama-8b while a fallbackTrigger holds" in effect


def test_a_fallback_template_is_checked_as_the_pools_template_is() -> None:
    bad = pool(SPEC + "    fallbackTemplate: {spec: {nodeName: n1, containers: [{name: a, image: b}]}}\n")
    assert review_object(bad) == [
        "spec.scheduling.costOptimization.fallbackTemplate.spec.nodeName: must not be set; the NeuroNetes "
        "scheduler places the pool's pods (use a nodeSelector)"
    ]
    assert review_object(pool()) == []
