"""The fallback model step of a pool reconcile: which model the pool serves now, and why. Pure.

`choose_model` reads what the pool's object already says — the autoscaling controller's last
decision (``status.autoscaling``: expected TTFT, when, stale metrics), the cost part's condition
``CostBudgetExceeded``, the spot state (``status.spot``: units allowed on spot and used, the
interruption threshold's ``fallbackRequested``; ``status.spotReplicas``), the model served
(``status.activeModel``) and the hold state (``status.fallback``) — builds the
`neuronetes.costpolicy.PolicyInputs`, asks the decision tree (`neuronetes.costpolicy.decide`) and
applies its hold time (`neuronetes.costpolicy.hold_model`).
The reconcile builds the pods of the chosen model (`pods.PoolTemplate`'s ``model``), so a switch is
the ordinary rolling replacement of outdated pods (`reconcile.plan`, reason ``Outdated``), and writes
``status.activeModel``, ``status.fallback`` and the condition ``FallbackActive`` (docs/fallback.md).

It runs in the pool reconcile, not in the autoscaler's tick: the switch is a change of the pods'
template, which only the reconcile plans; the reconcile runs whether or not the autoscaling
controller is on (``costExceeded`` needs no autoscaler); and the autoscaler's status writes and the
cost condition's are events of the pool, which queue its reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from neuronetes.api.models import AgentPoolSpec, Condition, FallbackStatus
from neuronetes.costpolicy import (
    DEFAULT_HOLD_SECONDS,
    TRIGGER_COST,
    TRIGGER_SLO,
    TRIGGER_SPOT,
    Decision,
    PolicyInputs,
    decide,
    hold_model,
    slo_state,
)
from neuronetes.spot import is_spot_node, spot_allowance

from .budget import BUDGET_REACHED, COST_BUDGET_EXCEEDED, PrimaryCost
from .policy import ResolvedPool

__all__ = [
    "FALLBACK_CONDITION",
    "SLO_SIGNAL_MAX_AGE_S",
    "ModelChoice",
    "choose_model",
    "policy_inputs",
]

FALLBACK_CONDITION: Final = "FallbackActive"
SLO_SIGNAL_MAX_AGE_S: Final = 120.0
"""``status.autoscaling`` older than this (``lastDecisionTime``) is no SLO signal: the autoscaler
rewrites it at least every 30 s while it decides for the pool, so four missed refreshes mean it
is not deciding (controller off, pool passive, metrics unreadable)."""


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """What the reconcile does about the model: serve `model`, write `status` and `condition`, and
    post `event` (type, reason, message) when the model changed."""

    model: str | None
    decision: Decision
    status: FallbackStatus
    condition: Condition
    event: tuple[str, str, str] | None


def _time(value: Any) -> float | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


def _iso(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).replace(microsecond=0)


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cd in status.get("conditions") or []:
        if isinstance(cd, Mapping) and cd.get("type") == kind:
            return cd
    return None


def policy_inputs(
    pool: Mapping[str, Any],
    spec: AgentPoolSpec,
    resolved: ResolvedPool,
    nodes: Mapping[str, Mapping[str, Any]],
    *,
    now: float,
    autoscaler_on: bool = True,
    primary: PrimaryCost | None = None,
) -> PolicyInputs:
    """The decision tree's inputs from the pool's object (spec and status) and the node cache;
    `primary`: while the fallback serves a pool with a budget, what ``spec.model`` would cost
    (`budget.primary_cost`): the cost trigger holds while it does not fit."""
    status = pool.get("status") or {}
    cost = spec.scheduling.cost_optimization if spec.scheduling else None
    autoscaling = spec.autoscaling if spec.autoscaling is not None and spec.autoscaling.enabled else None
    decided = status.get("autoscaling") or {}
    stamp = _time(decided.get("lastDecisionTime"))
    fresh = stamp is not None and now - stamp <= SLO_SIGNAL_MAX_AGE_S and not decided.get("staleMetrics")
    expected = decided.get("expectedTTFTSeconds")
    slo = slo_state(
        autoscaling.ttft_ms if autoscaling is not None else None,
        cost.slo_headroom_ms if cost is not None else None,
        float(expected) if isinstance(expected, int | float) else None,
        fresh=fresh,
    )
    replicas = spec.replicas if spec.replicas is not None else spec.min_replicas
    spot_replicas = int(status.get("spotReplicas") or 0)
    spot = status.get("spot") or {}
    # The spot placement's own state (`spot_plan.spot_state`): units it may put on spot (0 while the
    # interruption threshold turns spot off) and units on spot; before its first write, the share.
    allowed = spot.get("allowedUnits")
    if not isinstance(allowed, int):
        allowed = spot_allowance(replicas, resolved.spot.max_spot_percent)
    used = spot.get("spotUnits")
    used = used if isinstance(used, int) else spot_replicas
    spot_nodes = any(is_spot_node(n.get("metadata", {}).get("labels") or {}) for n in nodes.values())
    budget = _condition(status, COST_BUDGET_EXCEEDED)
    trigger = cost.fallback_trigger if cost is not None else None
    return PolicyInputs(
        slo=slo,
        # Over budget, not merely unpriced (`budget.UNKNOWN_PRICES`); on the fallback, also while
        # the primary model would not fit.
        cost_exceeded=(
            budget is not None and budget.get("status") == "True" and budget.get("reason") == BUDGET_REACHED
        )
        or (primary is not None and not primary.fits),
        spot_available=resolved.spot_allowed and spot_nodes and used < allowed,
        spot_replicas=spot_replicas,
        spot_fallback_requested=bool(spot.get("fallbackRequested")),
        replicas=replicas,
        max_replicas=spec.max_replicas if autoscaling is not None and autoscaler_on else None,
        primary_model=spec.model,
        fallback_model=resolved.fallback_model,
        trigger_cost_exceeded=bool(trigger and trigger.cost_exceeded),
        trigger_slo_at_risk=bool(trigger and trigger.slo_at_risk),
        active_model=status.get("activeModel"),
    )


def choose_model(
    pool: Mapping[str, Any],
    spec: AgentPoolSpec,
    inputs: PolicyInputs,
    *,
    now: float,
    primary: PrimaryCost | None = None,
) -> ModelChoice | None:
    """The model the pool serves after this reconcile, from the tree's `inputs` (`policy_inputs`,
    with the same `primary`), for a pool with a fallback model (None: it has none, and serves
    ``spec.model``)."""
    fallback = inputs.fallback_model
    if fallback is None:
        return None
    decision = decide(inputs)
    previous = (pool.get("status") or {}).get("fallback") or {}
    active = fallback if inputs.on_fallback else spec.model
    cost = spec.scheduling.cost_optimization if spec.scheduling else None
    trigger = cost.fallback_trigger if cost is not None else None
    hold_s = trigger.hold_seconds if trigger is not None else DEFAULT_HOLD_SECONDS
    held = hold_model(
        decision,
        active=active,
        primary=spec.model,
        restore_since=_time(previous.get("restoreSince")),
        now=now,
        hold_s=hold_s,
    )
    switched_at = now if held.switched else _time(previous.get("lastSwitchTime"))
    status = FallbackStatus(
        action=decision.action.value,
        reason=decision.reason[:1024],
        triggers=list(decision.triggers) or None,  # type: ignore[arg-type]
        restore_since=None if held.restore_since is None else _iso(held.restore_since),
        last_switch_time=None if switched_at is None else _iso(switched_at),
    )
    primary_name = spec.model or "spec.template"
    budget = _condition(pool.get("status") or {}, COST_BUDGET_EXCEEDED)
    figures = decision.reason
    if TRIGGER_COST in decision.triggers and budget is not None and budget.get("message"):
        figures += f"; {COST_BUDGET_EXCEEDED}: {budget['message']}"
    if primary is not None and (TRIGGER_COST in decision.triggers or held.model != fallback):
        figures += f"; {primary.describe(primary_name)}"
    generation = int(pool["metadata"].get("generation") or 0)
    on_fallback = held.model == fallback
    if on_fallback:
        if TRIGGER_COST in decision.triggers:
            reason = "CostBudgetExceeded"
        elif TRIGGER_SLO in decision.triggers:
            reason = "SloAtRisk"
        else:
            reason = "SpotInterruptions" if TRIGGER_SPOT in decision.triggers else "FallbackHeld"
        message = f"serving {fallback} instead of {primary_name}: {figures}"
        if held.restore_since is not None:
            back = _iso(held.restore_since + hold_s).isoformat().replace("+00:00", "Z")
            message += (
                f"; back to {primary_name} at {back} unless a trigger holds again (holdSeconds {hold_s})"
            )
    else:
        reason, message = "PrimaryModel", f"serving {primary_name}: {figures}"
    condition = Condition(
        type=FALLBACK_CONDITION,
        status="True" if on_fallback else "False",
        reason=reason,
        message=message[:32768],
        observed_generation=generation,
    )
    event = None
    if held.switched:
        came = fallback if not on_fallback else primary_name
        went = fallback if on_fallback else primary_name
        event = (
            "Normal",
            "FallbackModel" if on_fallback else "PrimaryModel",
            f"{came} -> {went} (rolling replacement): {figures}",
        )
    return ModelChoice(held.model, decision, status, condition, event)
