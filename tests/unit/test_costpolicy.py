"""The cost/SLO decision tree (`neuronetes.costpolicy.decide`): one test per branch, the SLO state
with its headroom, the hold time, and properties over every input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuronetes.costpolicy import (
    Action,
    Decision,
    PolicyInputs,
    SloSignal,
    SloState,
    decide,
    hold_model,
    slo_state,
)

pytestmark = pytest.mark.unit

MET = slo_state(1000, 200, 0.5, fresh=True)
AT_RISK = slo_state(1000, 200, 0.9, fresh=True)
UNKNOWN = slo_state(1000, 200, None, fresh=True)


def inputs(slo: SloSignal, **kw: object) -> PolicyInputs:
    base: dict[str, object] = {
        "primary_model": "llama-70b",
        "fallback_model": "llama-8b",
        "active_model": "llama-70b",
        "replicas": 4,
        "max_replicas": 4,
    }
    base.update(kw)
    return PolicyInputs(slo=slo, **base)  # type: ignore[arg-type]


# ---- the SLO state -----------------------------------------------------------------------------------


def test_at_risk_means_less_than_the_headroom_left_under_the_slo() -> None:
    assert slo_state(1000, 200, 0.8, fresh=True).state is SloState.MET  # exactly the headroom left
    assert slo_state(1000, 200, 0.801, fresh=True).state is SloState.AT_RISK
    assert slo_state(1000, None, 0.999, fresh=True).state is SloState.MET  # no headroom: the SLO itself
    assert slo_state(1000, None, 1.001, fresh=True).state is SloState.AT_RISK
    assert slo_state(1000, 5000, 0.0, fresh=True).state is SloState.MET  # headroom past the SLO: 0 allowed
    signal = slo_state(1000, 200, 0.9, fresh=True)
    assert (signal.expected_ttft_ms, signal.threshold_ms) == (900.0, 800.0)
    assert signal.describe() == "expected TTFT 900ms vs 800ms allowed"


def test_no_slo_is_met_and_a_missing_or_stale_estimate_is_unknown() -> None:
    assert slo_state(None, 200, None, fresh=False).state is SloState.MET
    assert slo_state(1000, 0, None, fresh=True).state is SloState.UNKNOWN
    stale = slo_state(1000, 0, 5.0, fresh=False)
    assert stale.state is SloState.UNKNOWN and "stale" in stale.describe()


# ---- SLO met: cheaper -----------------------------------------------------------------------------


def test_slo_met_and_spot_available_uses_spot_first() -> None:
    got = decide(inputs(MET, spot_available=True, cost_exceeded=True, trigger_cost_exceeded=True))
    assert got.action is Action.USE_SPOT and got.model == "llama-70b"


def test_slo_met_cost_exceeded_degrades_to_the_fallback_model() -> None:
    got = decide(inputs(MET, cost_exceeded=True, trigger_cost_exceeded=True))
    assert got.action is Action.DEGRADE_MODEL and got.model == "llama-8b"
    assert got.triggers == ("costExceeded",) and "cost over budget" in got.reason


def test_slo_met_spot_interrupted_past_the_threshold_degrades_to_the_fallback_model() -> None:
    # interruptionThreshold's action fallback-model tripped: the fallback comes before more spot.
    got = decide(inputs(MET, spot_fallback_requested=True, spot_available=True))
    assert got.action is Action.DEGRADE_MODEL and got.model == "llama-8b"
    assert got.triggers == ("spotInterruptions",) and "interruptionThreshold" in got.reason
    # Once on the fallback, it is kept while the threshold holds, and restored once it cleared.
    kept = decide(inputs(MET, spot_fallback_requested=True, active_model="llama-8b"))
    assert kept.action is Action.KEEP and kept.model == "llama-8b"
    back = decide(inputs(MET, active_model="llama-8b"))
    assert back.action is Action.RESTORE_MODEL and back.model == "llama-70b"


def test_slo_met_cost_exceeded_without_the_trigger_keeps_the_model() -> None:
    got = decide(inputs(MET, cost_exceeded=True))
    assert got.action is Action.KEEP and got.model == "llama-70b" and got.triggers == ()


def test_slo_met_on_the_fallback_with_no_trigger_left_restores_the_model() -> None:
    got = decide(inputs(MET, active_model="llama-8b", trigger_cost_exceeded=True))
    assert got.action is Action.RESTORE_MODEL and got.model == "llama-70b"


def test_slo_met_on_the_fallback_while_the_cost_trigger_holds_keeps_it() -> None:
    got = decide(inputs(MET, active_model="llama-8b", cost_exceeded=True, trigger_cost_exceeded=True))
    assert got.action is Action.KEEP and got.model == "llama-8b"


def test_slo_met_with_nothing_cheaper_keeps_as_is() -> None:
    got = decide(inputs(MET))
    assert got.action is Action.KEEP and got.model == "llama-70b"


# ---- SLO at risk: faster --------------------------------------------------------------------------


def test_slo_at_risk_below_max_replicas_scales_up() -> None:
    got = decide(inputs(AT_RISK, replicas=2, trigger_slo_at_risk=True))
    assert got.action is Action.SCALE_UP and got.model == "llama-70b" and "2 of 4" in got.reason


def test_slo_at_risk_at_max_replicas_on_spot_moves_to_on_demand() -> None:
    got = decide(inputs(AT_RISK, spot_replicas=2, trigger_slo_at_risk=True))
    assert got.action is Action.USE_ON_DEMAND and got.model == "llama-70b"


def test_slo_at_risk_with_the_slo_trigger_serves_the_faster_fallback() -> None:
    got = decide(inputs(AT_RISK, trigger_slo_at_risk=True))
    assert got.action is Action.FASTER_MODEL and got.model == "llama-8b"
    assert got.triggers == ("sloAtRisk",) and "expected TTFT 900ms vs 800ms" in got.reason


def test_slo_at_risk_on_a_fallback_taken_for_cost_goes_back_to_the_model() -> None:
    got = decide(inputs(AT_RISK, active_model="llama-8b", cost_exceeded=True, trigger_cost_exceeded=True))
    assert got.action is Action.FASTER_MODEL and got.model == "llama-70b"


def test_slo_at_risk_with_nothing_faster_keeps_as_is() -> None:
    assert decide(inputs(AT_RISK)).action is Action.KEEP
    # Already on the faster model: nothing left.
    on_fast = decide(inputs(AT_RISK, active_model="llama-8b", trigger_slo_at_risk=True))
    assert on_fast.action is Action.KEEP and on_fast.model == "llama-8b"


def test_autoscaling_off_is_no_scale_up() -> None:
    got = decide(inputs(AT_RISK, replicas=1, max_replicas=None, trigger_slo_at_risk=True))
    assert got.action is Action.FASTER_MODEL


def test_slo_unknown_takes_no_step() -> None:
    got = decide(inputs(UNKNOWN, cost_exceeded=True, trigger_cost_exceeded=True, spot_available=True))
    assert got.action is Action.KEEP and got.model == "llama-70b" and "unknown" in got.reason


# ---- the hold time ----------------------------------------------------------------------------------


def test_to_the_fallback_at_once_and_back_only_after_the_hold_without_a_break() -> None:
    degrade = Decision(Action.DEGRADE_MODEL, "small", "r")
    restore = Decision(Action.RESTORE_MODEL, "big", "r")
    keep = Decision(Action.KEEP, "small", "r")
    kw = {"primary": "big", "hold_s": 60.0}
    went = hold_model(degrade, active="big", restore_since=None, now=0.0, **kw)  # type: ignore[arg-type]
    assert (went.model, went.switched) == ("small", True)
    first = hold_model(restore, active="small", restore_since=None, now=10.0, **kw)  # type: ignore[arg-type]
    assert (first.model, first.restore_since, first.switched) == ("small", 10.0, False)
    waiting = hold_model(restore, active="small", restore_since=10.0, now=69.0, **kw)  # type: ignore[arg-type]
    assert (waiting.model, waiting.restore_since) == ("small", 10.0)
    # A break (the tree keeps the fallback) restarts the wait.
    broken = hold_model(keep, active="small", restore_since=10.0, now=50.0, **kw)  # type: ignore[arg-type]
    assert (broken.model, broken.restore_since) == ("small", None)
    back = hold_model(restore, active="small", restore_since=10.0, now=70.0, **kw)  # type: ignore[arg-type]
    assert (back.model, back.restore_since, back.switched) == ("big", None, True)


# ---- properties -----------------------------------------------------------------------------------

SLOS = st.sampled_from([MET, AT_RISK, UNKNOWN, slo_state(None, None, None, fresh=False)])
MODELS = st.sampled_from([None, "big", "small"])


@st.composite
def any_inputs(draw: st.DrawFn) -> PolicyInputs:
    return PolicyInputs(
        slo=draw(SLOS),
        cost_exceeded=draw(st.booleans()),
        spot_available=draw(st.booleans()),
        spot_replicas=draw(st.integers(0, 8)),
        replicas=draw(st.integers(0, 8)),
        max_replicas=draw(st.none() | st.integers(0, 8)),
        primary_model=draw(st.sampled_from([None, "big"])),
        fallback_model=draw(st.sampled_from([None, "small"])),
        trigger_cost_exceeded=draw(st.booleans()),
        trigger_slo_at_risk=draw(st.booleans()),
        active_model=draw(MODELS),
    )


@given(any_inputs())
def test_the_model_is_always_the_pools_own_and_changes_only_by_a_model_step(got: PolicyInputs) -> None:
    d = decide(got)
    assert d.model in (got.primary_model, got.fallback_model)
    if got.fallback_model is None:  # never a fallback without a fallback model
        assert d.model == got.primary_model and d.triggers == ()
        assert d.action not in (Action.DEGRADE_MODEL, Action.RESTORE_MODEL, Action.FASTER_MODEL)
    served = got.fallback_model if got.on_fallback else got.primary_model
    model_steps = (Action.DEGRADE_MODEL, Action.RESTORE_MODEL, Action.FASTER_MODEL)
    assert (d.model != served) == (d.action in model_steps)


@given(any_inputs())
def test_cheaper_steps_only_when_the_slo_is_met_faster_ones_only_when_at_risk(got: PolicyInputs) -> None:
    d = decide(got)
    if d.action in (Action.USE_SPOT, Action.DEGRADE_MODEL, Action.RESTORE_MODEL):
        assert got.slo.state is SloState.MET
    if d.action in (Action.SCALE_UP, Action.USE_ON_DEMAND, Action.FASTER_MODEL):
        assert got.slo.state is SloState.AT_RISK
    if got.slo.state is SloState.UNKNOWN:
        assert d.action is Action.KEEP


@given(any_inputs(), st.floats(0, 1000), st.floats(0, 1000))
def test_hold_never_switches_back_before_the_hold_time(got: PolicyInputs, since: float, hold: float) -> None:
    d = decide(got)
    active = got.fallback_model if got.on_fallback else got.primary_model
    held = hold_model(
        d, active=active, primary=got.primary_model, restore_since=since, now=since + 1, hold_s=hold
    )
    if held.switched and held.model == got.primary_model:
        assert hold <= 1
    assert held.model in (active, d.model)
