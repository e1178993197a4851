"""The token autoscaler (neuronetes.autoscale): each rule, each safety layer, and the four failure
shapes of docs/autoscaling.md driven through `TokenAutoscaler.decide` over simulated time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronetes.api import models
from neuronetes.autoscale import (
    AutoscaleSettings,
    Bounds,
    Decision,
    PoolSignals,
    ReplicaCounts,
    TokenAutoscaler,
    lag_replicas,
)

pytestmark = pytest.mark.unit

BOUNDS = Bounds(min_replicas=1, max_replicas=16)


def staffed(load: float) -> float:
    """The replicas for ``load`` replicas' capacity at the default staffing_beta (square-root staffing)."""
    return load + 0.75 * math.sqrt(load)


def signals(now: float, **over: object) -> PoolSignals:
    """An idle pool's reading at ``now``, with ``over`` changed."""
    base: dict[str, object] = {
        "now": now,
        "tokens_in_queue": 0.0,
        "prefill_tokens_per_second": 0.0,
        "waiting_requests": 0.0,
        "running_requests": 0.0,
        "kv_cache_usage": 0.1,
        "request_rate": 0.0,
    }
    return PoolSignals(**{**base, **over})  # type: ignore[arg-type]


def counts(
    desired: int, ready: int | None = None, starting: int = 0, unschedulable: int = 0
) -> ReplicaCounts:
    return ReplicaCounts(
        desired=desired,
        ready=desired - starting - unschedulable if ready is None else ready,
        starting=starting,
        unschedulable=unschedulable,
    )


def busy(now: float, tokens: float, tps: float, **over: object) -> PoolSignals:
    """A pool serving requests: ``tokens`` queued, ``tps`` prompt tokens per second processed."""
    serving: dict[str, object] = {"running_requests": 4.0, "request_rate": 2.0}
    return signals(now, tokens_in_queue=tokens, prefill_tokens_per_second=tps, **{**serving, **over})


# ---- the law ---------------------------------------------------------------------------------


def test_expected_ttft_over_the_slo_scales_to_the_replicas_that_drain_the_queue_in_time() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=2.0, model_load_s=1.0))
    # 2 ready replicas measured 10 000 tokens/s together: 5 000 each.
    decision = scaler.decide(busy(0, tokens=40_000, tps=10_000), counts(2), BOUNDS)
    assert decision.expected_ttft_s == pytest.approx(40_000 / 10_000 + 1.0)
    # ceil(40 000 / (5 000 x 2)) = 4, which is also the x2 cap from 2.
    assert (decision.desired, decision.rule) == (4, "ttft-slo")
    assert decision.inputs["tokens_per_second_per_replica"] == 5_000
    assert decision.inputs["target"] == 4
    assert decision.next_decision_at == 5.0


def test_the_spec_throughput_stands_in_until_one_is_measured() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, tokens_per_second_per_replica=1_000))
    decision = scaler.decide(busy(0, tokens=3_000, tps=0.0), counts(2), BOUNDS)
    # 1 000 x 2 ready = 2 000 tokens/s: 1.5 s expected; ceil(3 000 / (1 000 x 1)) = 3.
    assert decision.expected_ttft_s == pytest.approx(1.5)
    assert (decision.desired, decision.rule) == (3, "ttft-slo")


def test_no_throughput_known_holds_and_says_so() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0))
    decision = scaler.decide(busy(0, tokens=3_000, tps=0.0), counts(2), BOUNDS)
    assert (decision.desired, decision.rule, decision.expected_ttft_s) == (2, "hold:no-throughput", None)


def test_scale_up_is_capped_at_double_and_at_max_replicas() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0))
    assert scaler.decide(busy(0, 100_000, 2_000), counts(2), BOUNDS).desired == 4  # wants 100
    assert scaler.decide(busy(5, 100_000, 2_000), counts(2), Bounds(1, 3)).desired == 3
    held = scaler.decide(busy(10, 100_000, 2_000), counts(3), Bounds(1, 3))
    assert (held.desired, held.rule) == (3, "hold:bounds")


def test_scale_up_adds_at_least_one_replica_whatever_the_limit() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, scale_up_limit=1.0))
    assert scaler.decide(busy(0, 100_000, 1_000), counts(1), BOUNDS).desired == 2


def test_a_target_within_the_tolerance_holds() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0))
    # 20 replicas x 1 000: needs ceil(21 000 / 1 000) = 21, 5 % more: within 10 %.
    decision = scaler.decide(busy(0, 21_000, 20_000), counts(20), Bounds(1, 64))
    assert (decision.desired, decision.rule) == (20, "hold:tolerance")
    decision = scaler.decide(busy(5, 23_000, 20_000), counts(20), Bounds(1, 64))
    assert (decision.desired, decision.rule) == (23, "ttft-slo")


def test_an_idle_pool_steps_down_one_replica_after_the_cooldown_never_below_min() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, cooldown_s=60, stabilization_s=0))
    assert scaler.decide(signals(0, request_rate=1.0), counts(3), BOUNDS).rule == "hold:cooldown"
    assert scaler.decide(signals(30), counts(3), BOUNDS).rule == "hold:cooldown"
    down = scaler.decide(signals(60), counts(3), BOUNDS)
    assert (down.desired, down.rule) == (2, "idle-step-down")
    assert scaler.decide(signals(65), counts(2), BOUNDS).desired == 1
    floor = scaler.decide(signals(70), counts(1), BOUNDS)
    assert (floor.desired, floor.rule) == (1, "hold:bounds")


def test_a_queue_under_half_a_second_of_work_still_lets_an_idle_pool_step_down() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, cooldown_s=0, stabilization_s=0))
    # 400 tokens queued, 1 000 tokens/s: 0.4 s of work; no arrivals.
    reading = busy(0, 400, 1_000, request_rate=0.0)
    assert scaler.decide(reading, counts(3), BOUNDS).rule == "idle-step-down"
    reading = busy(5, 600, 1_000, request_rate=0.0)
    assert scaler.decide(reading, counts(3), BOUNDS).rule == "hold"


def test_the_lag_rule_asks_for_enough_replicas_to_bring_lag_under_the_threshold() -> None:
    # 2 replicas x prefetch 10 x throughput 5 = 100 drained; depth 1 000: lag 900 > 100.
    desired, lag = lag_replicas(1_000, 2, 10, 5.0, 100, BOUNDS)
    assert lag == 900
    assert desired == 16  # ceil((1 000 - 100) / 50) = 18, capped at maxReplicas
    desired, lag = lag_replicas(500, 2, 10, 5.0, 100, BOUNDS)
    assert (desired, lag) == (8, 400)  # 500 - 8 x 50 = 100: at the threshold
    assert lag_replicas(150, 2, 10, 5.0, 100, BOUNDS) == (2, 50)  # under the threshold: unchanged
    assert lag_replicas(150, 2, 10, 0.0, 100, BOUNDS) == (16, 150)  # nothing drains: the most
    with pytest.raises(ValueError, match=r"spec\.queueConfig\.prefetch"):
        lag_replicas(1, 1, 0, 1.0, 1, BOUNDS)


def test_under_continuous_traffic_the_pool_right_sizes_after_a_quiet_window() -> None:
    scaler = TokenAutoscaler(
        AutoscaleSettings(
            slo_ttft_s=2.0, tokens_per_second_per_replica=4_000, stabilization_s=300, step_down_headroom=0
        )
    )
    # 14 000 prompt tokens/s arrive and are prefilled, the queue is empty: 3.5 replicas' load, 4.9 staffed.
    steady = {"request_rate": 14.0, "kv_cache_usage": 0.1}
    held = [scaler.decide(busy(t, 0, 14_000, **steady), counts(16), BOUNDS) for t in range(0, 300, 5)]
    assert {d.rule for d in held} == {"hold:stabilization"}
    assert held[-1].inputs["steady_replicas"] == pytest.approx(staffed(3.5))
    first = scaler.decide(busy(300, 0, 14_000, **steady), counts(16), BOUNDS)
    assert (first.desired, first.rule) == (8, "right-size")  # the down cap: at most halve
    # The next step needs a whole quiet window again.
    assert scaler.decide(busy(305, 0, 14_000, **steady), counts(8), BOUNDS).rule == "hold:stabilization"
    assert scaler.decide(busy(595, 0, 14_000, **steady), counts(8), BOUNDS).desired == 8
    second = scaler.decide(busy(600, 0, 14_000, **steady), counts(8), BOUNDS)
    assert (second.desired, second.rule) == (5, "right-size")
    assert scaler.decide(busy(605, 0, 14_000, **steady), counts(5), BOUNDS).rule == "hold"


def test_a_queue_inside_the_window_restarts_it_and_kv_use_bounds_the_right_size() -> None:
    scaler = TokenAutoscaler(
        AutoscaleSettings(
            slo_ttft_s=2.0, tokens_per_second_per_replica=4_000, stabilization_s=300, step_down_headroom=0
        )
    )
    # KV: the fullest replica at 35 %, as if all 16 were: 16 x 0.35 = 5.6 replicas' load, 7.4 staffed.
    steady = {"request_rate": 14.0, "kv_cache_usage": 0.35}
    for t in range(0, 150, 5):
        scaler.decide(busy(t, 0, 14_000, **steady), counts(16), BOUNDS)
    # 40 000 tokens queued: over half a second of the pool's 64 000 tokens/s, not near empty.
    queued = scaler.decide(busy(150, 40_000, 14_000, **steady), counts(16), BOUNDS)
    assert (queued.desired, queued.rule) == (16, "hold")
    for t in range(155, 455, 5):
        assert scaler.decide(busy(t, 0, 14_000, **steady), counts(16), BOUNDS).desired == 16
    down = scaler.decide(busy(455, 0, 14_000, **steady), counts(16), BOUNDS)
    assert (down.desired, down.rule) == (8, "right-size")
    assert down.inputs["arrival_replicas"] == pytest.approx(staffed(3.5))
    assert down.inputs["steady_replicas"] == pytest.approx(staffed(16 * 0.35))


def test_the_right_size_step_down_leaves_headroom_for_growth_over_the_window() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=2.0, tokens_per_second_per_replica=4_000))
    # 14 000 tokens/s: 4.9 replicas staffed, x 1.25 headroom = 6.1 -> 7 (not 5): a rise of
    # 25 % over the window's highest demand leaves the pool within its tolerance instead of reversing.
    steady = {"request_rate": 14.0, "kv_cache_usage": 0.1}
    for t in range(0, 300, 5):
        scaler.decide(busy(t, 0, 14_000, **steady), counts(8), BOUNDS)
    down = scaler.decide(busy(300, 0, 14_000, **steady), counts(8), BOUNDS)
    assert (down.desired, down.rule) == (7, "right-size")
    risen = scaler.decide(busy(305, 0, 17_500, **steady), counts(7), BOUNDS)  # 5.9 replicas staffed
    assert risen.desired == 7 and risen.rule.startswith("hold")
    with pytest.raises(ValueError, match="step_down_headroom"):
        AutoscaleSettings(slo_ttft_s=1.0, step_down_headroom=-0.1)


def test_a_rise_sustained_over_a_load_time_is_extrapolated_over_the_next_one() -> None:
    settings_ = AutoscaleSettings(slo_ttft_s=2.0, model_load_s=60, tokens_per_second_per_replica=1_000)
    scaler = TokenAutoscaler(settings_)
    # Arrivals rise 100 tokens/s every 5 s (1 200 tokens/s a minute, about 1.3 replicas staffed) while
    # the pool holds 20 replicas: no scale-up, but the rise is tracked. The growth is the smaller rise
    # of the window's two halves (the later one: staffing is concave), over the next minute.
    for i in range(13):
        held = scaler.decide(busy(5 * i, 0, 10_000 + 100 * i), counts(20), Bounds(1, 64))
        assert held.desired == 20
    assert held.inputs["demand_growth"] == pytest.approx(2 * (staffed(11.2) - staffed(10.6)))
    # Now short of supply on 10 replicas (13.8 needed): the target adds the minute's growth to come.
    up = scaler.decide(busy(65, 0, 11_300), counts(10), Bounds(1, 64))
    assert up.inputs["arrival_replicas"] == pytest.approx(staffed(11.3))
    growth = 2 * (staffed(11.3) - staffed(10.7))
    assert (up.desired, up.rule) == (math.ceil(staffed(11.3) + growth), "arrival-rate")
    # One burst (a rise in the last half of the window only) extrapolates nothing.
    scaler = TokenAutoscaler(settings_)
    for i in range(12):
        scaler.decide(busy(5 * i, 0, 10_000), counts(20), Bounds(1, 64))
    burst = scaler.decide(busy(60, 0, 20_000), counts(10), Bounds(1, 64))
    assert burst.inputs["demand_growth"] == 0
    assert (burst.desired, burst.rule) == (20, "arrival-rate")  # the cap: at most double


def test_during_a_cold_start_the_arrival_rate_still_adds_what_the_starting_replicas_miss() -> None:
    scaler = TokenAutoscaler(
        AutoscaleSettings(slo_ttft_s=2.0, model_load_s=60, tokens_per_second_per_replica=1_000)
    )
    starting = counts(4, ready=2, starting=2)
    # 2 800 tokens/s: 4.1 replicas staffed, within the tolerance of the 4 the starting ones make.
    assert scaler.decide(busy(0, 0, 2_800), starting, BOUNDS).rule == "hold"
    # Saturation cannot say how much is missing: it waits for the starting replicas.
    full = scaler.decide(busy(5, 0, 2_800, kv_cache_usage=0.95), starting, BOUNDS)
    assert (full.desired, full.rule) == (4, "hold:cold-start")
    # 4 200 tokens/s: 5.7 replicas staffed, starting ones counted as supply: 2 more now, not in a
    # minute; once the demand has been watched for half a load time (30 s), not at once.
    assert scaler.decide(busy(10, 0, 4_200), starting, BOUNDS).rule == "hold"
    more = scaler.decide(busy(30, 0, 4_200), starting, BOUNDS)
    assert (more.desired, more.rule) == (6, "arrival-rate")


def test_a_queue_growing_in_front_of_a_saturated_pool_sizes_for_the_arrivals_and_the_backlog() -> None:
    scaler = TokenAutoscaler(
        AutoscaleSettings(slo_ttft_s=2.0, model_load_s=30, tokens_per_second_per_replica=1_000)
    )
    assert scaler.decide(busy(0, 0, 2_000), counts(2), BOUNDS).rule == "hold"
    # 2 ready replicas prefill 2 000 tokens/s (their capacity: 10 waiting per replica, saturated) and
    # the queue grows 2 000 tokens/s: 4 000 arrive, 5.5 replicas staffed; the queue grown for a load
    # time, 10 000 + 2 000 x 30 tokens, takes 2.3 replicas over the next one: 8 (the cap: 4).
    grows = scaler.decide(busy(5, 10_000, 2_000, waiting_requests=20.0), counts(2), BOUNDS)
    assert (grows.desired, grows.rule) == (4, "queue-growth")
    assert grows.inputs["queue_growth_target"] == 8
    # Still growing while the 2 start: they count as supply, and the rule is not held by their start
    # (20 000 + 60 000 tokens: 2.7 replicas, 8.2 in all: 9, the cap: 8).
    starting = scaler.decide(
        busy(10, 20_000, 2_000, waiting_requests=40.0), counts(4, ready=2, starting=2), BOUNDS
    )
    assert (starting.desired, starting.rule) == (8, "queue-growth")
    assert starting.inputs["queue_growth_target"] == 9
    # Requests not waiting in front of the whole pool (2 per ready replica, under the saturation
    # threshold of 8): the rule does not act; the backlog floor does.
    scaler = TokenAutoscaler(
        AutoscaleSettings(slo_ttft_s=2.0, model_load_s=30, tokens_per_second_per_replica=1_000)
    )
    scaler.decide(busy(0, 0, 2_000), counts(2), BOUNDS)
    floor = scaler.decide(busy(5, 10_000, 2_000, waiting_requests=4.0), counts(2), BOUNDS)
    assert (floor.desired, floor.rule, floor.inputs["queue_growth_target"]) == (4, "ttft-slo", 2)


def test_capacity_is_measured_once_the_ready_count_has_held_for_half_a_load_time() -> None:
    scaler = TokenAutoscaler(
        AutoscaleSettings(slo_ttft_s=2.0, model_load_s=30, tokens_per_second_per_replica=8_000)
    )
    saturated = {"waiting_requests": 80.0}
    scaler.decide(busy(0, 50_000, 10_000, **saturated), counts(2), BOUNDS)
    # The first count read is taken as settled: 2 ready, saturated and the queue not draining,
    # 10 000 tokens/s: 5 000 a replica.
    first = scaler.decide(busy(5, 55_000, 10_000, **saturated), counts(2), BOUNDS)
    assert first.inputs["tokens_per_second_per_replica"] == 5_000
    # 2 more became Ready: the rate still holds mostly the first 2's work (12 000 tokens/s over 4 is
    # 3 000), not a capacity, and is not recorded: once the 5 000 has left the capacity window (600 s)
    # it still stands, not the 3 000 measured 5 s after it.
    scaler.decide(busy(10, 60_000, 12_000, **saturated), counts(4), BOUNDS)
    later = scaler.decide(busy(607, 0, 12_000), counts(4), BOUNDS)
    assert later.inputs["tokens_per_second_per_replica"] == 5_000
    # Half a load time after the change, 4 saturated replicas measure 24 000 tokens/s: 6 000 each.
    held = scaler.decide(busy(612, 10_000, 24_000, waiting_requests=160.0), counts(4), BOUNDS)
    assert held.inputs["tokens_per_second_per_replica"] == 6_000


def test_the_arrival_rate_scales_up_ahead_of_the_queue_beyond_the_tolerance() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=2.0, tokens_per_second_per_replica=8_000))
    # 24 000 tokens/s on 4 replicas: R = 24 000 / 8 000 = 3, R + 0.75 sqrt(R) = 4.3, within 10 % of 4.
    assert scaler.decide(busy(0, 0, 24_000), counts(4), BOUNDS).rule == "hold"
    # R = 3.75: 5.2 replicas, once the demand has been watched for half a load time (90 s unknown).
    assert scaler.decide(busy(40, 0, 30_000), counts(4), BOUNDS).rule == "hold"
    up = scaler.decide(busy(45, 0, 30_000), counts(4), BOUNDS)
    assert (up.desired, up.rule) == (6, "arrival-rate")
    # Arrivals are what was prefilled plus the queue's growth: a queue that shrank by 10 000 tokens
    # in 5 s while 30 000 tokens/s were prefilled means 28 000 tokens/s arrive.
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=2.0, tokens_per_second_per_replica=8_000))
    scaler.decide(busy(0, 10_000, 30_000), counts(6), BOUNDS)
    assert scaler.decide(busy(5, 0, 30_000), counts(6), BOUNDS).inputs["arrival_tokens_per_second"] == 28_000
    with pytest.raises(ValueError, match="staffing_beta"):
        AutoscaleSettings(slo_ttft_s=1.0, staffing_beta=-0.5)


def test_a_backlog_replicas_were_added_for_asks_again_only_while_it_is_not_draining() -> None:
    scaler = TokenAutoscaler(
        AutoscaleSettings(slo_ttft_s=1.0, model_load_s=30, tokens_per_second_per_replica=1_000)
    )
    first = scaler.decide(busy(0, 8_000, 2_000, waiting_requests=8.0), counts(2), BOUNDS)
    assert (first.desired, first.rule) == (4, "ttft-slo")  # wants 8, the cap halves it
    assert scaler.decide(busy(5, 8_000, 2_000), counts(4, starting=2), BOUNDS).rule == "hold:cold-start"
    # Ready, and the queue (pinned to the first two replicas) drains: 10 waiting per ready replica
    # would double the pool, the backlog floor would ask for 7: neither does.
    draining = busy(30, 7_000, 2_500, waiting_requests=40.0)
    held = scaler.decide(draining, counts(4), BOUNDS)
    assert (held.desired, held.rule) == (4, "hold:backlog-draining")
    assert held.inputs["backlog_target"] == 7
    # The queue grows again: the supply did not keep up, the floor applies.
    again = scaler.decide(busy(35, 7_500, 2_500, waiting_requests=40.0), counts(4), BOUNDS)
    assert (again.desired, again.rule) == (8, "ttft-slo")


def test_capacity_is_measured_only_under_saturation_and_the_spec_is_the_prior() -> None:
    scaler = TokenAutoscaler(
        AutoscaleSettings(slo_ttft_s=2.0, tokens_per_second_per_replica=8_000, capacity_window_s=60)
    )

    def per_replica(reading: PoolSignals) -> float | None:
        return scaler.decide(reading, counts(4), Bounds(1, 64)).inputs["tokens_per_second_per_replica"]

    # Not saturated: 2 500 a replica is the arrival rate, not the capacity.
    assert per_replica(busy(0, 0, 10_000)) == 8_000
    # One replica's KV full is not the pool saturated.
    assert per_replica(busy(5, 0, 10_000, kv_cache_usage=0.95)) == 8_000
    # 10 waiting a ready replica and the queue growing: the pool prefills all it can.
    assert per_replica(busy(10, 50_000, 20_000, waiting_requests=40.0)) == 5_000
    # A lower reading under saturation within the window does not lower it (the highest stands).
    assert per_replica(busy(15, 60_000, 12_000, waiting_requests=48.0)) == 5_000
    # Once the queue is gone, and past the window, the measured capacity stands.
    assert per_replica(busy(20, 0, 10_000)) == 5_000
    assert per_replica(busy(500, 0, 10_000)) == 5_000
    # A queue that is draining (replicas that just became Ready take the arrivals) measures nothing.
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=2.0, tokens_per_second_per_replica=8_000))
    per_replica(busy(0, 60_000, 8_000, waiting_requests=40.0))
    assert per_replica(busy(5, 50_000, 8_000, waiting_requests=40.0)) == 8_000


# ---- safety layers -----------------------------------------------------------------------------


def test_saturation_scales_up_by_the_cap_whatever_the_token_estimate() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=10.0))
    kv_full = scaler.decide(busy(0, 100, 10_000, kv_cache_usage=0.93), counts(3), BOUNDS)
    assert (kv_full.desired, kv_full.rule) == (6, "saturation")
    waiting = scaler.decide(busy(5, 100, 10_000, waiting_requests=24.0), counts(3), BOUNDS)
    assert (waiting.desired, waiting.rule) == (6, "saturation")  # 8 waiting per ready replica
    assert waiting.inputs["waiting_per_replica"] == 8.0


def test_after_a_scale_up_the_stabilization_window_holds_scale_down() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, cooldown_s=0, stabilization_s=300))
    assert scaler.decide(busy(0, 8_000, 2_000), counts(2), BOUNDS).desired == 4
    rules = {scaler.decide(signals(t), counts(4), BOUNDS).rule for t in range(5, 300, 5)}
    assert rules == {"hold:stabilization"}
    # 300 s after the last recommendation of 4, the window's highest is 3.
    assert scaler.decide(signals(305), counts(4), BOUNDS).desired == 3


def test_starting_replicas_hold_scale_up_until_ready_or_the_model_load_time() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, model_load_s=60))
    assert scaler.decide(busy(0, 8_000, 2_000), counts(2), BOUNDS).desired == 4
    held = scaler.decide(busy(5, 12_000, 2_000), counts(4, ready=2, starting=2), BOUNDS)
    assert (held.desired, held.rule) == (4, "hold:cold-start")
    saturated = busy(30, 12_000, 2_000, kv_cache_usage=0.99)
    assert scaler.decide(saturated, counts(4, ready=2, starting=2), BOUNDS).rule == "hold:cold-start"
    # Still starting a model load time after they were first seen (t=5): the start may be stuck;
    # scaling resumes.
    assert scaler.decide(busy(60, 12_000, 2_000), counts(4, ready=2, starting=2), BOUNDS).desired == 4
    assert scaler.decide(busy(65, 12_000, 2_000), counts(4, ready=2, starting=2), BOUNDS).desired == 8
    # Ready: supply arrived, the backlog decides again at once.
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, model_load_s=60))
    scaler.decide(busy(0, 8_000, 2_000), counts(2), BOUNDS)
    scaler.decide(busy(5, 8_000, 2_000), counts(4, ready=2, starting=2), BOUNDS)
    assert scaler.decide(busy(10, 40_000, 4_000), counts(4), BOUNDS).rule == "ttft-slo"


def test_without_a_model_load_time_a_start_holds_for_the_cold_start_bound() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, cold_start_s=90))
    starting = counts(4, ready=2, starting=2)
    assert scaler.decide(busy(0, 12_000, 2_000), starting, BOUNDS).rule == "hold:cold-start"
    assert scaler.decide(busy(85, 12_000, 2_000), starting, BOUNDS).rule == "hold:cold-start"
    assert scaler.decide(busy(90, 12_000, 2_000), starting, BOUNDS).rule == "ttft-slo"


def test_unschedulable_replicas_hold_scale_up_but_not_scale_down() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, cooldown_s=0, stabilization_s=0))
    stuck = counts(4, ready=2, unschedulable=2)
    held = scaler.decide(busy(0, 40_000, 2_000, kv_cache_usage=0.99), stuck, BOUNDS)
    assert (held.desired, held.rule) == (4, "hold:unschedulable")
    down = scaler.decide(signals(5), stuck, BOUNDS)
    assert (down.desired, down.rule) == (3, "idle-step-down")


def test_stale_or_missing_metrics_never_scale_down_but_fresh_saturation_scales_up() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, cooldown_s=0, stabilization_s=0))
    for reading in (
        signals(0, stale=("tokens_in_queue",)),
        signals(5, tokens_in_queue=None),
        signals(10, request_rate=None),
        signals(15, stale=("kv_cache_usage",)),
    ):
        decision = scaler.decide(reading, counts(4), BOUNDS)
        assert (decision.desired, decision.rule) == (4, "hold:stale-metrics")
    up = scaler.decide(signals(20, kv_cache_usage=0.95, stale=("tokens_in_queue",)), counts(4), BOUNDS)
    assert (up.desired, up.rule) == (8, "saturation")
    stale_kv = scaler.decide(signals(25, kv_cache_usage=0.95, stale=("kv_cache_usage",)), counts(4), BOUNDS)
    assert stale_kv.rule == "hold:stale-metrics"


def test_a_queue_idle_replicas_do_not_drain_is_not_a_reason_to_scale_up_and_is_ignored_later() -> None:
    scaler = TokenAutoscaler(
        AutoscaleSettings(
            slo_ttft_s=1.0,
            tokens_per_second_per_replica=1_000,
            orphan_window_s=60,
            stabilization_s=0,
            cooldown_s=0,
        )
    )
    orphans = signals(0, tokens_in_queue=50_000.0, waiting_requests=40.0)
    first = scaler.decide(orphans, counts(3), BOUNDS)
    assert (first.desired, first.rule) == (3, "hold:orphaned-queue")
    after = scaler.decide(replace(orphans, now=60), counts(3), BOUNDS)
    assert (after.desired, after.rule) == (2, "idle-step-down")
    assert after.inputs["tokens_in_queue"] == 0.0


def test_replicas_outside_the_bounds_are_brought_inside() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0))
    assert scaler.decide(signals(0), counts(20), BOUNDS).desired == 16
    assert scaler.decide(signals(5), counts(0), BOUNDS).rule == "bounds"


def test_a_pool_at_zero_wakes_on_the_first_request() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0))
    zero = Bounds(0, 8)
    assert scaler.decide(signals(0), counts(0), zero).desired == 0
    woke = scaler.decide(signals(5, waiting_requests=1.0, request_rate=0.2), counts(0), zero)
    assert (woke.desired, woke.rule) == (1, "wake-from-zero")


def test_history_stays_bounded_however_long_the_run() -> None:
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=1.0, cooldown_s=0, stabilization_s=10**9))
    current = 1
    for step in range(20_000):
        tokens = 50_000.0 if step % 7 == 0 else 0.0
        current = scaler.decide(
            busy(step * 5.0, tokens, 5_000, request_rate=0.0), counts(current), BOUNDS
        ).desired
    assert scaler.history_size <= BOUNDS.max_replicas + 1


def test_settings_come_from_the_spec_and_a_missing_slo_names_its_field() -> None:
    pool = models.decode(
        yaml.safe_load(
            """
kind: AgentPool
spec:
  maxReplicas: 8
  autoscaling:
    ttftMs: 500
    tokensPerSecond: 2000
    modelLoadSeconds: 45
    behavior: {scaleUpLimit: 3, tolerance: 0.05, saturation: {kvCacheUsage: 0.8}}
"""
        ),
        models.AgentPool,
    )
    assert pool.spec.autoscaling is not None
    got = AutoscaleSettings.from_spec(pool.spec.autoscaling)
    assert (got.slo_ttft_s, got.tokens_per_second_per_replica, got.model_load_s) == (0.5, 2000, 45)
    assert (got.scale_up_limit, got.tolerance, got.saturation_kv) == (3, 0.05, 0.8)
    assert (got.stabilization_s, got.orphan_window_s, got.saturation_waiting_per_replica) == (300, 60, 8)
    with pytest.raises(ValueError, match=r"spec\.autoscaling\.ttftMs"):
        AutoscaleSettings.from_spec(models.Autoscaling())


# ---- the four failure shapes, over simulated time ------------------------------------------------


@dataclass
class SimulatedPool:
    """A pool's queue and replicas: prompts arrive, ready replicas prefill, new replicas load."""

    capacity_per_replica: float  # prompt tokens/s one ready replica prefills
    load_s: float
    ready: int
    starting: list[float] = field(default_factory=list)  # when each starting replica is Ready
    unschedulable: int = 0
    queue: float = 0.0
    orphaned: float = 0.0  # tokens of requests whose clients left: queued, never served
    decisions: list[Decision] = field(default_factory=list)

    @property
    def desired(self) -> int:
        return self.ready + len(self.starting) + self.unschedulable

    def step(self, now: float, dt: float, arrivals_tps: float, kv: float) -> PoolSignals:
        self.ready += sum(1 for t in self.starting if t <= now)
        self.starting = [t for t in self.starting if t > now]
        self.queue += arrivals_tps * dt
        processed = min(self.queue, self.ready * self.capacity_per_replica * dt)
        self.queue -= processed
        return PoolSignals(
            now=now,
            tokens_in_queue=self.queue + self.orphaned,
            prefill_tokens_per_second=processed / dt,
            waiting_requests=(self.queue + self.orphaned) / 1_000,
            running_requests=float(self.ready) if processed else 0.0,
            kv_cache_usage=kv,
            request_rate=arrivals_tps / 1_000,
        )

    def apply(self, decision: Decision, now: float) -> None:
        self.decisions.append(decision)
        change = decision.desired - self.desired
        self.starting += [now + self.load_s] * max(change, 0)
        for _ in range(max(-change, 0)):
            if self.unschedulable:
                self.unschedulable -= 1
            elif self.starting:
                self.starting.pop()
            else:
                self.ready -= 1

    def run(
        self,
        scaler: TokenAutoscaler,
        bounds: Bounds,
        until: float,
        load: object,
        kv: float = 0.2,
        start: float = 0.0,
    ) -> None:
        dt = scaler.settings.decision_interval_s
        for i in range(int((until - start) / dt)):
            now = start + i * dt
            tps = load(now) if callable(load) else float(load)  # type: ignore[arg-type]
            reading = self.step(now, dt, tps, kv)
            replicas = ReplicaCounts(self.desired, self.ready, len(self.starting), self.unschedulable)
            self.apply(scaler.decide(reading, replicas, bounds), now)


def reversals_within(decisions: list[Decision], window_s: float) -> int:
    """Scale-downs that came less than ``window_s`` after a scale-up."""
    last_up, count, previous = -math.inf, 0, None
    for d in decisions:
        now = d.next_decision_at
        if previous is not None and d.desired > previous:
            last_up = now
        elif previous is not None and d.desired < previous and now - last_up < window_s:
            count += 1
        previous = d.desired
    return count


def test_prefill_heavy_load_at_low_kv_use_scales_on_tokens() -> None:
    pool = SimulatedPool(capacity_per_replica=4_000, load_s=30, ready=1)
    scaler = TokenAutoscaler(
        AutoscaleSettings(slo_ttft_s=2.0, model_load_s=30, tokens_per_second_per_replica=4_000)
    )
    pool.run(scaler, BOUNDS, until=600, load=14_000, kv=0.15)  # long prompts, short answers
    rules = {d.rule for d in pool.decisions}
    assert "ttft-slo" in rules and "saturation" not in rules
    # The backlog floor doubles once (2). The queue then grows 10 000 tokens/s in front of the one
    # ready replica (100 waiting per replica), and the queue-growth rule sets the pool while the
    # starts load, the starting replicas counted as supply: 14 000 tokens/s staffed at 4 000 a
    # replica is 4.9 replicas, and the queue grown at its trend for a load time (at t=20, 200 000 +
    # 10 000 x 30 tokens) takes 4.2 replicas over the next load time: 10, by the cap's steps 4, 8, 10.
    # Once the queue drains, the backlog that asked for replicas never asks again (the pool used to
    # run away to 16 by doubling), and the right-size step leaves the staffed demand with its
    # headroom: 4.9 x 1.25 -> 7.
    assert [d.desired for d in pool.decisions if d.rule == "ttft-slo"] == [2]
    assert [d.desired for d in pool.decisions if d.rule == "queue-growth"] == [4, 8, 10]
    assert [d.desired for d in pool.decisions if d.rule == "right-size"] == [7]
    assert "hold:backlog-draining" in rules
    assert max(d.desired for d in pool.decisions) == 10
    assert pool.desired == 7
    assert pool.queue < 14_000 * 2.0  # drained within the SLO's worth of arrivals


def test_an_orphaned_queue_does_not_pin_the_pool_up_and_scale_down_proceeds() -> None:
    pool = SimulatedPool(capacity_per_replica=4_000, load_s=30, ready=6, orphaned=80_000)
    scaler = TokenAutoscaler(
        AutoscaleSettings(
            slo_ttft_s=2.0, tokens_per_second_per_replica=4_000, cooldown_s=60, stabilization_s=60
        )
    )
    pool.run(scaler, BOUNDS, until=900, load=0.0)
    assert all(d.desired <= 6 for d in pool.decisions)
    assert pool.desired == BOUNDS.min_replicas
    assert "hold:orphaned-queue" in {d.rule for d in pool.decisions}


def test_a_panic_burst_scales_up_and_does_not_flap_back_within_the_window() -> None:
    pool = SimulatedPool(capacity_per_replica=4_000, load_s=30, ready=2)
    scaler = TokenAutoscaler(AutoscaleSettings(slo_ttft_s=2.0, model_load_s=30, cooldown_s=30))

    def load(now: float) -> float:
        return 40_000.0 if 200 <= now < 230 else 6_000.0  # sustained, with a 30 s panic burst

    pool.run(scaler, BOUNDS, until=900, load=load)
    before = [d.desired for d in pool.decisions if d.next_decision_at <= 200]
    during = [d.desired for d in pool.decisions if 200 < d.next_decision_at <= 300]
    assert max(during) > max(before)
    assert reversals_within(pool.decisions, scaler.settings.stabilization_s) == 0


def test_unready_and_unschedulable_replicas_neither_block_scale_down_nor_add_scale_up() -> None:
    pool = SimulatedPool(capacity_per_replica=4_000, load_s=30, ready=2, starting=[1e9], unschedulable=2)
    scaler = TokenAutoscaler(
        AutoscaleSettings(
            slo_ttft_s=2.0, tokens_per_second_per_replica=4_000, cooldown_s=60, stabilization_s=60
        )
    )
    pool.run(scaler, BOUNDS, until=120, load=lambda now: 30_000.0 if now < 60 else 0.0)
    assert max(d.desired for d in pool.decisions) == 5  # never above the first desired
    assert {d.rule for d in pool.decisions if d.next_decision_at <= 60} >= {"hold:unschedulable"}
    pool.run(scaler, BOUNDS, until=600, load=0.0, start=120)  # then idle
    assert pool.desired < 5
    assert pool.unschedulable == 0


# ---- properties over random readings -------------------------------------------------------------

reading_values = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6, allow_nan=False))


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            reading_values,
            reading_values,
            reading_values,
            st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
            reading_values,
            st.integers(min_value=0, max_value=3),
            st.integers(min_value=0, max_value=2),
            st.booleans(),
        ),
        min_size=1,
        max_size=120,
    ),
    min_replicas=st.integers(min_value=0, max_value=4),
    spread=st.integers(min_value=0, max_value=40),
)
def test_decisions_stay_in_bounds_within_the_caps_and_never_flap(
    steps: list[tuple[float | None, float | None, float | None, float | None, float | None, int, int, bool]],
    min_replicas: int,
    spread: int,
) -> None:
    bounds = Bounds(min_replicas, min_replicas + spread)
    s = AutoscaleSettings(
        slo_ttft_s=1.0, cooldown_s=20, stabilization_s=60, tokens_per_second_per_replica=500
    )
    scaler = TokenAutoscaler(s)
    current, decisions = min_replicas, []
    for i, (tokens, tps, waiting, kv, rate, starting, unschedulable, stale) in enumerate(steps):
        reading = PoolSignals(
            now=i * 5.0,
            tokens_in_queue=tokens,
            prefill_tokens_per_second=tps,
            waiting_requests=waiting,
            running_requests=waiting,
            kv_cache_usage=kv,
            request_rate=rate,
            stale=("waiting_requests",) if stale else (),
        )
        starting, unschedulable = min(starting, current), min(unschedulable, current - min(starting, current))
        replicas = ReplicaCounts(current, current - starting - unschedulable, starting, unschedulable)
        decision = scaler.decide(reading, replicas, bounds)
        assert bounds.min_replicas <= decision.desired <= bounds.max_replicas
        assert decision.desired <= s.most_up(current)
        assert decision.desired >= s.fewest_down(current)
        if unschedulable:
            assert decision.desired <= current
        current = decision.desired
        decisions.append(decision)
    assert reversals_within(decisions, s.stabilization_s) == 0
