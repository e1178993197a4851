"""The cost/SLO decision tree of an AgentPool, and the fallback model's hold time. Pure.

`decide` is the tree of docs/fallback.md as one function: from what is known of the pool now (a
`PolicyInputs`) to one `Decision` — which step to take, which model to serve after it, and why.

1. Is the TTFT SLO met with ``sloHeadroomMs`` to spare (`slo_state`)?
2. SLO met → reduce cost: spot interrupted past ``interruptionThreshold`` (action ``fallback-model``)
   → the fallback model; spot available → use spot; the smaller model viable (``fallbackModel`` with
   the ``costExceeded`` trigger, and the cost over budget) → degrade to it; the fallback served while
   no trigger holds any more → restore ``spec.model``; else keep as is.
3. SLO at risk → improve performance: scale up replicas (below ``maxReplicas``); move off spot (use
   on-demand); serve the faster model (the fallback when ``fallbackTrigger.sloAtRisk`` names it the
   faster one, ``spec.model`` when the fallback was taken only for cost); else keep as is.
4. SLO state unknown (its signal missing or stale) → keep as is: no step is taken blind.

`hold_model` adds the hysteresis: a switch to the fallback model happens at once, a switch back to
``spec.model`` only after the tree has wanted it for ``holdSeconds`` without a break, so the pool
makes at most one round trip per hold time however its signals flap.

Only the model steps are acted on by the fallback (``neuronetes_operator.fallback``); the others name
what the autoscaler (scale up) or the spot placement (use spot, use on-demand) does, and the model
stays as it is while they are the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "DEFAULT_HOLD_SECONDS",
    "TRIGGER_COST",
    "TRIGGER_SLO",
    "TRIGGER_SPOT",
    "Action",
    "Decision",
    "HeldModel",
    "PolicyInputs",
    "SloSignal",
    "SloState",
    "decide",
    "hold_model",
    "slo_state",
    "triggers_holding",
]

DEFAULT_HOLD_SECONDS: Final = 300
"""``fallbackTrigger.holdSeconds`` unset: how long the tree must want ``spec.model`` back, without
a break, before the pool rolls back to it."""

TRIGGER_COST: Final = "costExceeded"
TRIGGER_SLO: Final = "sloAtRisk"
TRIGGER_SPOT: Final = "spotInterruptions"
"""Not a ``fallbackTrigger`` flag: ``interruptionThreshold`` with ``action: fallback-model`` tripped
(``status.spot.fallbackRequested``, docs/spot.md); the threshold's action is the opt-in."""


class SloState(StrEnum):
    MET = "met"
    """Expected TTFT at most ``ttftMs − sloHeadroomMs`` (or the pool has no TTFT SLO)."""
    AT_RISK = "at-risk"
    """Expected TTFT above ``ttftMs − sloHeadroomMs``: within the headroom of the SLO, or past it."""
    UNKNOWN = "unknown"
    """The autoscaler has no fresh estimate: no step is taken on it."""


class Action(StrEnum):
    """The tree's steps; the model steps are the fallback's, the others say who acts."""

    KEEP = "keep"
    """Nothing to do, or nothing left to try."""
    USE_SPOT = "use-spot"
    """SLO met: put more replicas on spot (the spot placement acts)."""
    DEGRADE_MODEL = "degrade-model"
    """SLO met, cost over budget: serve ``fallbackModel``."""
    RESTORE_MODEL = "restore-model"
    """SLO met, no trigger holds: serve ``spec.model`` again (after the hold time)."""
    SCALE_UP = "scale-up"
    """SLO at risk below ``maxReplicas``: the autoscaler adds replicas."""
    USE_ON_DEMAND = "use-on-demand"
    """SLO at risk with spot replicas: move them to on-demand (the spot placement acts)."""
    FASTER_MODEL = "faster-model"
    """SLO at risk with no replica left to add: serve the faster of the two models."""


@dataclass(frozen=True, slots=True)
class SloSignal:
    """The SLO state and the figures it was judged on (milliseconds; None: not known)."""

    state: SloState
    expected_ttft_ms: float | None = None
    threshold_ms: float | None = None
    """``ttftMs − sloHeadroomMs``: the most expected TTFT that still counts as met."""
    detail: str = ""

    def describe(self) -> str:
        if self.detail:
            return self.detail
        return f"expected TTFT {self.expected_ttft_ms:.0f}ms vs {self.threshold_ms:.0f}ms allowed"


def slo_state(
    ttft_ms: int | None, headroom_ms: int | None, expected_ttft_s: float | None, *, fresh: bool
) -> SloSignal:
    """The SLO state from the autoscaler's estimate (``status.autoscaling.expectedTTFTSeconds``).

    At risk means ``expected_ttft > ttftMs − sloHeadroomMs``: less than the headroom is left under
    the SLO (headroom unset is 0: at risk only past the SLO itself). A pool without a TTFT SLO
    (``spec.autoscaling`` off or without ``ttftMs``) has nothing to put at risk: met. An estimate
    that is missing, or not `fresh` (see ``neuronetes_operator.fallback``), is unknown.
    """
    if ttft_ms is None:
        return SloSignal(SloState.MET, detail="no TTFT SLO (spec.autoscaling.ttftMs)")
    threshold = float(max(ttft_ms - (headroom_ms or 0), 0))
    if expected_ttft_s is None or not fresh:
        why = "no estimate" if expected_ttft_s is None else "stale estimate"
        return SloSignal(SloState.UNKNOWN, threshold_ms=threshold, detail=f"TTFT {why} from the autoscaler")
    expected = expected_ttft_s * 1000.0
    state = SloState.AT_RISK if expected > threshold else SloState.MET
    return SloSignal(state, expected_ttft_ms=expected, threshold_ms=threshold)


@dataclass(frozen=True, slots=True)
class PolicyInputs:
    """What the tree reads about one pool.

    Attributes:
        slo: the SLO state (`slo_state`).
        cost_exceeded: the pool's cost is over ``maxCostPerHour`` (condition ``CostBudgetExceeded``).
        spot_available: the pool may use spot and spot capacity could take more of its replicas
            (``status.spot``: fewer units on spot than allowed — none while the interruption
            threshold turns spot off — and a spot node in the cluster).
        spot_fallback_requested: ``status.spot.fallbackRequested``: the interruption threshold
            (action ``fallback-model``) is tripped.
        spot_replicas: replicas running on spot nodes now.
        replicas: replicas now; max_replicas: the autoscaler's ceiling (None: it cannot scale up).
        primary_model: ``spec.model``; fallback_model: ``costOptimization.fallbackModel`` (None: none).
        trigger_cost_exceeded, trigger_slo_at_risk: ``fallbackTrigger``'s flags.
        active_model: the model served now (``status.activeModel``).
    """

    slo: SloSignal
    cost_exceeded: bool = False
    spot_available: bool = False
    spot_replicas: int = 0
    spot_fallback_requested: bool = False
    replicas: int = 0
    max_replicas: int | None = None
    primary_model: str | None = None
    fallback_model: str | None = None
    trigger_cost_exceeded: bool = False
    trigger_slo_at_risk: bool = False
    active_model: str | None = None

    @property
    def on_fallback(self) -> bool:
        return self.fallback_model is not None and self.active_model == self.fallback_model


@dataclass(frozen=True, slots=True)
class Decision:
    """The tree's answer: the step, the model to serve after it, the triggers that hold, and why."""

    action: Action
    model: str | None
    reason: str
    triggers: tuple[str, ...] = ()


def triggers_holding(inputs: PolicyInputs) -> tuple[str, ...]:
    """The ``fallbackTrigger`` flags that are set and whose condition holds now."""
    if inputs.fallback_model is None:
        return ()
    out: list[str] = []
    if inputs.trigger_cost_exceeded and inputs.cost_exceeded:
        out.append(TRIGGER_COST)
    if inputs.trigger_slo_at_risk and inputs.slo.state is SloState.AT_RISK:
        out.append(TRIGGER_SLO)
    if inputs.spot_fallback_requested:
        out.append(TRIGGER_SPOT)
    return tuple(out)


def decide(inputs: PolicyInputs) -> Decision:
    """The decision tree (module docstring; docs/fallback.md): one step for the pool, and why."""
    triggers = triggers_holding(inputs)
    active = inputs.active_model if inputs.on_fallback else inputs.primary_model
    slo = inputs.slo.describe()

    def out(action: Action, why: str, model: str | None = active) -> Decision:
        return Decision(action, model, f"{why}; {slo}", triggers)

    if inputs.slo.state is SloState.UNKNOWN:
        return out(Action.KEEP, "SLO state unknown: no step taken")
    if inputs.slo.state is SloState.MET:
        if TRIGGER_SPOT in triggers and not inputs.on_fallback:
            return out(
                Action.DEGRADE_MODEL,
                f"SLO met, spot interrupted past interruptionThreshold: serve {inputs.fallback_model}",
                inputs.fallback_model,
            )
        if inputs.spot_available:
            return out(Action.USE_SPOT, "SLO met: spot capacity first (cheapest step)")
        if TRIGGER_COST in triggers and not inputs.on_fallback:
            return out(
                Action.DEGRADE_MODEL,
                f"SLO met, cost over budget: serve the smaller model {inputs.fallback_model}",
                inputs.fallback_model,
            )
        if inputs.on_fallback and not triggers:
            return out(
                Action.RESTORE_MODEL,
                f"SLO met and no fallback trigger holds: back to {inputs.primary_model}",
                inputs.primary_model,
            )
        return out(Action.KEEP, "SLO met: no cheaper step left")
    # At risk.
    if inputs.max_replicas is not None and inputs.replicas < inputs.max_replicas:
        return out(
            Action.SCALE_UP, f"SLO at risk: more replicas ({inputs.replicas} of {inputs.max_replicas})"
        )
    if inputs.spot_replicas > 0:
        return out(Action.USE_ON_DEMAND, f"SLO at risk: {inputs.spot_replicas} spot replicas to on-demand")
    if TRIGGER_SLO in triggers and not inputs.on_fallback:
        return out(
            Action.FASTER_MODEL,
            f"SLO at risk at maxReplicas: serve the faster model {inputs.fallback_model}",
            inputs.fallback_model,
        )
    if inputs.on_fallback and not inputs.trigger_slo_at_risk:
        # The fallback was taken for cost only; the SLO comes before the budget.
        return out(
            Action.FASTER_MODEL,
            f"SLO at risk at maxReplicas: back to {inputs.primary_model} (the fallback was for cost)",
            inputs.primary_model,
        )
    return out(Action.KEEP, "SLO at risk: no faster step left")


@dataclass(frozen=True, slots=True)
class HeldModel:
    """The model to serve after the hold time is applied, and since when ``spec.model`` is wanted
    back (None: it is not; the caller keeps it, e.g. in ``status.fallback.restoreSince``)."""

    model: str | None
    restore_since: float | None
    switched: bool


def hold_model(
    decision: Decision,
    *,
    active: str | None,
    primary: str | None,
    restore_since: float | None,
    now: float,
    hold_s: float,
) -> HeldModel:
    """Hysteresis on `decision`'s model: to the fallback at once; back to `primary` once the tree has
    wanted it since `restore_since` for `hold_s` seconds (a decision that does not want it back
    resets the wait)."""
    if decision.model == active:
        return HeldModel(active, None, False)
    if decision.model != primary:
        return HeldModel(decision.model, None, True)
    since = now if restore_since is None else restore_since
    if now - since >= hold_s:
        return HeldModel(primary, None, True)
    return HeldModel(active, since, False)
