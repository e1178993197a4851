"""neuronetes.runtime's scheduler: the documented API examples on NumPy, pacing and leftovers on a
fake clock, priorities, slices, tiles, thread tasks with yield_task, metrics, bad input."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from runtime_fakes import FakeClock, busy, fake_scheduler

from neuronetes import runtime

STATS_KEYS = {
    "memory_usage",
    "bandwidth_usage",
    "pacing_delay_count",
    "tiles_executed",
    "eviction_count",
    "queue_position",
    "state",
}


def _squares(out: np.ndarray) -> runtime.TiledWorkload:
    """Squares into `out`, ten tiles each made longer than a tick (so one step runs one tile)."""

    def tile(start: int, stop: int) -> None:
        out[start:stop] = np.arange(start, stop) ** 2
        time.sleep(0.002)

    return runtime.tiled(tile, len(out), tile=len(out) // 10, adaptive=False)


def test_the_documented_examples_run_as_written_on_numpy() -> None:
    out = np.zeros(1000)
    fn = _squares(out)
    sched = runtime.Scheduler(window_ms=10, tick_ms=1, backend="auto")
    assert sched.backend.name == "numpy"
    task_id = sched.submit(fn, memory=None, bandwidth=None, policy="best_effort", priority=0, slice=None)
    sched.step()
    task = sched.task(task_id)
    assert task.run_micro_kernel() is True
    sched.run(until=None)
    stats = sched.stats(task_id)
    assert set(stats) == STATS_KEYS
    assert stats["state"] == "finished" and stats["tiles_executed"] >= 2
    assert task.run_micro_kernel() is False
    np.testing.assert_array_equal(out, np.arange(1000) ** 2)


def test_the_module_level_scheduler_runs_a_task() -> None:
    values: list[int] = []
    task_id = runtime.scheduler.submit(lambda: values.append(1))
    runtime.scheduler.run(until=task_id)
    assert values == [1] and runtime.scheduler.stats(task_id)["state"] == "finished"


def test_guaranteed_tasks_get_their_share_of_each_window_exactly() -> None:
    clock = FakeClock()
    sched = fake_scheduler(clock)
    low = sched.submit(busy(clock, 0.001), bandwidth=0.2, policy="guaranteed")
    high = sched.submit(busy(clock, 0.001), bandwidth=0.5, policy="guaranteed")
    sched.run(until=1.0)
    assert sched.task(low).total_s == pytest.approx(0.2, abs=0.002)
    assert sched.task(high).total_s == pytest.approx(0.5, abs=0.002)
    assert sched.stats(low)["bandwidth_usage"] == pytest.approx(0.2)
    # Held in every window once its share was spent.
    assert sched.stats(low)["pacing_delay_count"] >= 95


def test_a_tile_that_overruns_its_allowance_is_paid_back_in_later_windows() -> None:
    clock = FakeClock()
    sched = fake_scheduler(clock)  # 10 ms windows
    long_tiles = sched.submit(
        busy(clock, 0.007), bandwidth=0.2, policy="guaranteed"
    )  # 7 ms against 2 ms a window
    sched.run(until=1.0)
    assert sched.task(long_tiles).total_s == pytest.approx(0.2, abs=0.008)


def _shares(*tasks: dict[str, Any], seconds: float = 1.0) -> list[float]:
    """Busy tasks of 1 ms tiles submitted with these arguments, run for `seconds` on a fake clock:
    each one's share of that time."""
    clock = FakeClock()
    sched = fake_scheduler(clock)
    ids = [sched.submit(busy(clock, 0.001), **kw) for kw in tasks]
    sched.run(until=seconds)
    return [sched.task(i).total_s / seconds for i in ids]


def test_burstable_takes_leftovers_and_is_throttled_back_to_its_share_under_contention() -> None:
    guaranteed, burstable = _shares(
        {"bandwidth": 0.5, "policy": "guaranteed"}, {"bandwidth": 0.2, "policy": "burstable"}
    )
    assert guaranteed == pytest.approx(0.5, abs=0.002)
    assert burstable == pytest.approx(0.5, abs=0.002)  # 0.2 own + 0.3 leftovers
    guaranteed, burstable = _shares(
        {"bandwidth": 0.8, "policy": "guaranteed"}, {"bandwidth": 0.2, "policy": "burstable"}
    )
    assert guaranteed == pytest.approx(0.8, abs=0.002) and burstable == pytest.approx(0.2, abs=0.002)


def test_best_effort_runs_on_leftovers_only_and_under_its_cap() -> None:
    guaranteed, neighbour, capped = _shares(
        {"bandwidth": 0.3, "policy": "guaranteed"}, {}, {"bandwidth": 0.1, "priority": 5}
    )
    assert guaranteed == pytest.approx(0.3, abs=0.002)
    assert capped == pytest.approx(0.1, abs=0.002)
    assert neighbour == pytest.approx(0.6, abs=0.003)


def test_priority_orders_tasks_of_one_class() -> None:
    clock = FakeClock()
    sched = fake_scheduler(clock)
    order: list[str] = []

    def named(name: str) -> runtime.TiledWorkload:
        return runtime.tiled(lambda a, b: order.append(name), 3, tile=1, adaptive=False)

    sched.submit(named("low"), priority=0)
    sched.submit(named("high"), priority=9)
    sched.run()
    assert order == ["high"] * 3 + ["low"] * 3


def test_a_waiting_task_is_not_run_early_and_the_loop_sleeps_until_it_wakes() -> None:
    clock = FakeClock()
    sched = fake_scheduler(clock)
    woke_at: list[float] = []

    def periodic() -> Generator[float, None, str]:
        for _ in range(3):
            woke_at.append(clock.now)
            yield 0.05
        return "done"

    task_id = sched.submit(periodic)
    sched.run()
    assert woke_at == pytest.approx([0.0, 0.05, 0.10])
    assert sched.task(task_id).result() == "done"


def test_slices_hold_their_tasks_to_the_slice_bandwidth() -> None:
    clock = FakeClock()
    sched = fake_scheduler(clock)
    sched.create_slice("inference", memory=1 << 20, bandwidth=0.4, priority=1)
    a = sched.submit(busy(clock, 0.001), slice="inference")
    b = sched.submit(busy(clock, 0.001), bandwidth=0.1, policy="burstable", slice="inference")
    outside = sched.submit(busy(clock, 0.001), bandwidth=0.2, policy="guaranteed")
    sched.run(until=1.0)
    assert sched.task(a).total_s + sched.task(b).total_s == pytest.approx(0.4, abs=0.003)
    assert sched.task(b).total_s >= 0.1 - 0.002
    assert sched.task(outside).total_s == pytest.approx(0.2, abs=0.002)
    with pytest.raises(runtime.AdmissionError, match="memory"):
        sched.submit(busy(clock, 0.001), memory=2 << 20, slice="inference")
    with pytest.raises(runtime.AdmissionError, match="bandwidth"):
        sched.create_slice("training", bandwidth=0.7)


def test_adaptive_tiles_approach_the_target_duration() -> None:
    clock = FakeClock()
    sched = fake_scheduler(clock)
    sizes: list[int] = []

    def work(start: int, stop: int) -> None:
        sizes.append(stop - start)
        clock.advance((stop - start) * 10e-6)  # 10 µs an item: 100 items make the 1 ms target

    task_id = sched.submit(runtime.tiled(work, 10_000))
    sched.run()
    assert sum(sizes) == 10_000
    assert sizes[:4] == [1, 2, 4, 8]  # growth is capped at twice the last tile
    assert set(sizes[10:-1]) == {100}
    assert sched.stats(task_id)["tiles_executed"] == len(sizes)


def test_decorator_form_and_plain_call() -> None:
    seen: list[tuple[int, int]] = []

    @runtime.tiled(n=10, tile=4, adaptive=False)
    def chunks(start: int, stop: int) -> None:
        seen.append((start, stop))

    chunks()
    assert seen == [(0, 4), (4, 8), (8, 10)]


def test_hand_written_loops_yield_between_tiles_on_a_worker_thread() -> None:
    clock = FakeClock()
    sched = fake_scheduler(clock)
    trace: list[str] = []

    def loop(name: str) -> int:
        for _ in range(3):
            trace.append(name)
            runtime.yield_task()
        return len(name)

    first = sched.submit(lambda: loop("a"), priority=1)
    second = sched.submit(lambda: loop("bb"))
    sched.run()
    assert trace == ["a", "a", "a", "bb", "bb", "bb"]
    assert sched.task(first).result() == 1 and sched.task(second).result() == 2
    assert sched.stats(first)["tiles_executed"] == 4  # three yields and the return
    runtime.yield_task()  # outside a task: returns at once


def test_a_failing_task_is_recorded_and_the_others_finish() -> None:
    clock = FakeClock()
    sched = fake_scheduler(clock)

    def broken() -> None:
        raise KeyError("boom")

    bad = sched.submit(broken)
    good = sched.submit(busy(clock, 0.001, tiles=3))
    sched.run()
    assert sched.stats(bad)["state"] == "failed" and sched.stats(good)["state"] == "finished"
    with pytest.raises(KeyError, match="boom"):
        sched.task(bad).result()


def test_prometheus_metrics_through_the_given_registry() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    sched = fake_scheduler(clock, registry=registry, metrics=True, name="notebook")
    task_id = sched.submit(busy(clock, 0.001), bandwidth=0.5, policy="guaranteed", memory=4096)
    sched.run(until=0.1)
    labels = {"scheduler": "notebook", "task": task_id, "policy": "guaranteed", "slice": ""}
    assert registry.get_sample_value("neuronetes_runtime_task_memory_bytes", labels) == 4096
    assert (
        registry.get_sample_value("neuronetes_runtime_task_tiles_total", labels)
        == sched.stats(task_id)["tiles_executed"]
    )
    assert registry.get_sample_value("neuronetes_runtime_task_bandwidth_share", labels) == pytest.approx(0.5)
    state = sched.stats(task_id)["state"]
    assert (
        registry.get_sample_value("neuronetes_runtime_tasks", {"scheduler": "notebook", "state": state}) == 1
    )


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"memory": -1}, "memory"),
        ({"memory": 1.5}, "memory"),
        ({"bandwidth": 0}, "bandwidth"),
        ({"bandwidth": 1.5}, "bandwidth"),
        ({"bandwidth": -0.2}, "bandwidth"),
        ({"bandwidth": "half"}, "bandwidth"),
        ({"policy": "premium"}, "policy"),
        ({"policy": "guaranteed"}, "bandwidth"),
        ({"priority": "high"}, "priority"),
        ({"slice": "nowhere"}, "slice"),
        ({"fn": 42}, "fn"),
    ],
)
def test_bad_submit_arguments_raise_one_clear_error_naming_the_argument(
    kwargs: dict[str, object], argument: str
) -> None:
    sched = fake_scheduler(FakeClock())
    fn = kwargs.pop("fn", lambda: None)
    with pytest.raises(runtime.InvalidArgument, match=f"^{argument}: ") as caught:
        sched.submit(fn, **kwargs)  # type: ignore[arg-type]
    assert caught.value.argument == argument and isinstance(caught.value, ValueError)
    assert sched.tasks() == []


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: runtime.Scheduler(window_ms=0, metrics=False), "window_ms"),
        (lambda: runtime.Scheduler(tick_ms=-1, metrics=False), "tick_ms"),
        (lambda: runtime.Scheduler(backend="tpu", metrics=False), "backend"),
        (lambda: runtime.tiled(lambda a, b: None, -1), "n"),
        (lambda: runtime.tiled(lambda a, b: None, 10, tile=0), "tile"),
        (lambda: runtime.tiled("f", 10), "fn"),  # type: ignore[call-overload]
        (lambda: fake_scheduler(FakeClock()).stats("task-404"), "task_id"),
        (lambda: fake_scheduler(FakeClock()).run(until=-1), "until"),
    ],
)
def test_other_bad_arguments_name_themselves(make: object, argument: str) -> None:
    with pytest.raises(runtime.InvalidArgument) as caught:
        make()  # type: ignore[operator]
    assert caught.value.argument == argument


def _random_mix(clock: FakeClock, sched: runtime.Scheduler, seed: int, log: list[tuple[str, float]]) -> None:
    """Tasks of every policy, priorities, slices, tile lengths and waits drawn from `seed`; each
    tile appends (task name, start time) to `log`."""
    import random

    rng = random.Random(seed)
    sched.create_slice("s", bandwidth=0.5, priority=rng.randint(0, 2))

    def task(name: str, tiles: int) -> Any:
        def body() -> Generator[float | None, None, None]:
            for _ in range(tiles):
                log.append((name, clock.now))
                clock.advance(rng.choice([0.0002, 0.0007, 0.0013, 0.004]))
                yield rng.choice([None, None, None, 0.003, 0.011])

        return body

    shares: dict[str, list[float | None]] = {
        "guaranteed": [0.1, 0.2, 0.3],
        "burstable": [0.1, 0.25],
        "best_effort": [None, 0.5],
    }
    for i in range(rng.randint(2, 5)):
        policy = rng.choice(list(shares))
        with contextlib.suppress(runtime.AdmissionError):  # a guaranteed share that does not fit
            sched.submit(
                task(f"t{i}", rng.randint(5, 60)),
                bandwidth=rng.choice(shares[policy]),
                policy=policy,
                priority=rng.randint(0, 2),
                slice=rng.choice([None, "s"]),
            )


@pytest.mark.parametrize("seed", range(25))
def test_run_chooses_every_tile_as_a_fresh_choice_would(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` keeps going between tiles and `_pick` reuses its last in-share choice while nothing that
    could change it has happened: the tiles run, in order and at the same times, equal a run where
    every tile is chosen afresh by `_choose`."""
    clock, fast_log = FakeClock(), []  # type: ignore[var-annotated]
    fast = fake_scheduler(clock)
    _random_mix(clock, fast, seed, fast_log)
    fast.run()

    def fresh(self: runtime.Scheduler, now: float) -> Any:
        self._roll_window(now)
        self._admit_queued()
        return self._choose(now)

    monkeypatch.setattr(runtime.Scheduler, "_pick", fresh)
    clock, fresh_log = FakeClock(), []  # type: ignore[var-annotated]
    reference = fake_scheduler(clock)
    _random_mix(clock, reference, seed, fresh_log)
    reference.run()
    assert len(fast_log) > 10
    assert fast_log == fresh_log


def test_run_until_a_predicate_stops_after_the_tile_that_makes_it_true() -> None:
    clock = FakeClock()
    sched = fake_scheduler(clock, tick_ms=50)  # a tick far longer than the tiles
    task_id = sched.submit(busy(clock, 0.001), bandwidth=1.0, policy="guaranteed")
    sched.run(until=lambda: sched.task(task_id).tiles >= 7)
    assert sched.task(task_id).tiles == 7
    sched.run(until=0.0105)  # a deadline: the tile that crosses it is the last
    assert sched.task(task_id).tiles == 7 + 11
