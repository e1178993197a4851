"""Check "runtime": the runtime library (`neuronetes.runtime`) on its GPU backends.

For each of PyTorch and CuPy that sees the GPU (a missing one is skipped, naming it):

- ``<fw>.backend``: a tile of matrix products is timed by CUDA events (> 0, and no longer than its
  wall time), the two streams have distinct priorities (high: the device's greatest), and the
  memory capacity is positive and at most the GPU's memory.
- ``<fw>.eviction``: tasks' soft-reserved arrays, updated tile by tile, run once with room for all
  of them and once with room for five of twelve (evicted to pinned host memory and reloaded): the
  results are bit-identical; eviction and reload counts are figures.
- ``<fw>.in-slice``: the backend, made in a process under the shim over a 2 GiB region, reports a
  capacity of at most 2 GiB (the shim's ``cuMemGetInfo`` is the container's, docs/shim.md).
- ``<fw>.pacing``: two tasks at bandwidth 0.2 and 0.5 on one `runtime.Scheduler` for 2 s; each
  one's achieved share (the device time of its own work, timed by its own CUDA events, over the
  wall time) is within ±3 pp of its bandwidth (figure beside it: its items × a solo per-item time).
- ``<fw>.isolation``: a latency-sensitive `guaranteed` task (bandwidth 0.3) whose requests arrive
  on a clock (every 2 ms, or sparser so that they ask for 8 % of the device), each four one-item
  tiles, its latency from arrival to its last tile's completion,
  beside a `best_effort` neighbour: its p99 is at most 1.10 × its solo p99 while the neighbour
  keeps at least 50 % of its solo throughput (as `bench/runtime.py` measures on the CPU).

The scheduler sub-checks use the documented API only: ``runtime.Scheduler(window_ms=10, tick_ms=1,
backend=NAME)``, ``submit(runtime.tiled(fn, n, tile=…), bandwidth=…, policy=…)`` where the tiled
``fn(start, stop)`` does items ``start..stop``, and ``step()``; where that API is missing they fail
saying so. The check runs on a GPU only: over the fake driver the runner reports "skipped: no GPU".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any, Final

import numpy as np

from ..context import GIB, Context
from ..model import Report

SLICE_LIMIT: Final = 2 * GIB
SIZE: Final = 512  # the matrices of a work item (a 512² fp32 product: tens of µs on an H100)
PACING_BANDWIDTHS: Final = (0.2, 0.5)
PACING_SECONDS: Final = 2.0
TOLERANCE_PP: Final = 3.0
ISOLATION_P99_RATIO: Final = 1.10
ISOLATION_NEIGHBOUR_SHARE: Final = 0.50
ISOLATION_PERIOD_S: Final = 0.002  # a request every 2 ms at least
REQUEST_LOAD: Final = 0.08  # of the wall time: well inside the server's 0.3 share
REQUEST_TILES: Final = 4  # each of one work item, synchronised


def run(ctx: Context) -> Report:
    from neuronetes.runtime.gpu_backends import (
        CupyBackend,
        TorchBackend,
        cupy_available,
        torch_available,
    )

    report = Report()
    frameworks: tuple[tuple[str, Callable[[], bool], Callable[[], Any]], ...] = (
        ("torch", torch_available, TorchBackend),
        ("cupy", cupy_available, CupyBackend),
    )
    for name, available, make in frameworks:
        if not available():
            report.skip(name, f"skipped: needs {'PyTorch' if name == 'torch' else 'CuPy'} with a CUDA device")
            continue
        try:  # one framework's failure is its own: the other is still checked
            backend = make()
            backend_check(ctx, report, backend)
            eviction_check(report, backend)
            slice_check(ctx, report, name)
            scheduler_checks(report, backend)
        except Exception as exc:
            report.check(f"{name}.error", False, f"error: {type(exc).__name__}: {exc}")
    return report


# ---- the backend itself


def _sync(backend: Any) -> None:
    if backend.name == "torch":
        backend.xp.cuda.synchronize()
    else:
        backend.xp.cuda.Device().synchronize()


def _matrices(backend: Any) -> tuple[Any, Any]:
    xp = backend.xp
    if backend.name == "torch":
        a = xp.randn(SIZE, SIZE, device=backend.device)
        return a, xp.empty_like(a)
    a = xp.random.standard_normal((SIZE, SIZE), dtype=xp.float32)
    return a, xp.empty_like(a)


def _items(backend: Any, a: Any, out: Any, count: int) -> None:
    """`count` work items: matrix products into `out`."""
    xp = backend.xp
    for _ in range(count):
        xp.matmul(a, a, out=out)


def backend_check(ctx: Context, report: Report, backend: Any) -> None:
    a, out = _matrices(backend)
    _items(backend, a, out, 10)  # warm-up: the framework's handles and kernels
    _sync(backend)
    started = time.perf_counter()
    _, device_s = backend.time_tile(lambda: _items(backend, a, out, 50))
    wall_s = time.perf_counter() - started
    streams = {}
    for high in (True, False):
        with backend.stream(high) as stream:
            current = stream if stream is not None else backend.xp.cuda.current_stream()
            streams["high" if high else "low"] = int(current.priority)
    capacity = int(backend.memory_capacity())
    ok = 0 < device_s <= wall_s and streams["high"] < streams["low"] and 0 < capacity <= ctx.gpu_total_bytes
    report.check(
        f"{backend.name}.backend",
        ok,
        "events time tiles, two stream priorities, capacity within the GPU"
        if ok
        else "a tile's time, the stream priorities or the capacity is wrong",
        tile_device_ms=device_s * 1e3,
        tile_wall_ms=wall_s * 1e3,
        stream_priorities=streams,
        capacity_bytes=capacity,
        gpu_total_bytes=ctx.gpu_total_bytes,
    )


# ---- eviction


def evicted_vs_roomy(backend: Any) -> dict[str, Any]:
    """The same tile-by-tile computation over soft-reserved arrays with room for all (no eviction)
    and with room for five of twelve: whether the results are byte for byte the same, and the
    tight run's eviction and reload counts. Any backend (the unit tests run it on NumPy)."""
    from neuronetes.runtime.memory import MemoryManager

    def computation(capacity: int) -> tuple[list[bytes], MemoryManager]:
        mm = MemoryManager(capacity, backend)
        rng = np.random.default_rng(7)
        tasks: list[list[Any]] = []
        for t in range(3):
            mm.reserve(f"task-{t}", None, hard=False)
            arrays = [mm.array(f"task-{t}", (64, 64), np.float32) for _ in range(4)]
            for arr in arrays:
                arr.put(rng.standard_normal((64, 64)).astype(np.float32))
            tasks.append(arrays)
        for step in range(5):
            for arrays in tasks:
                for i, arr in enumerate(arrays):
                    with mm.pinned(arr, arrays[(i + 1) % len(arrays)]) as (x, y):
                        x += (y @ y.T) * 1e-3 + step
                        x *= 0.5
        return [arr.to_numpy().tobytes() for arrays in tasks for arr in arrays], mm

    block = 64 * 64 * 4
    roomy, _ = computation(64 * block)
    tight, mm = computation(5 * block)
    owners = mm.owners()
    return {
        "identical": roomy == tight,
        "evictions": sum(mm.evictions(o) for o in owners),
        "reloads": sum(mm.reloads(o) for o in owners),
    }


def eviction_check(report: Report, backend: Any) -> None:
    got = evicted_vs_roomy(backend)
    ok = bool(got["identical"]) and got["evictions"] > 0 and got["reloads"] > 0
    report.check(
        f"{backend.name}.eviction",
        ok,
        "bit-identical to the run without eviction" if ok else "results differ, or nothing was evicted",
        **got,
    )


# ---- inside a slice


def slice_check(ctx: Context, report: Report, name: str) -> None:
    region = ctx.region(f"runtime-{name}", SLICE_LIMIT)
    r = ctx.workload(
        "runtime_capacity", [name], ctx.env(region), timeout=120, name=f"runtime capacity {name}"
    )
    capacity = r.result.get("capacity_bytes")
    ok = r.returncode == 0 and isinstance(capacity, int) and 0 < capacity <= SLICE_LIMIT
    report.check(
        f"{name}.in-slice",
        ok,
        f"capacity {capacity} ≤ the slice's {SLICE_LIMIT}" if ok else f"capacity {capacity}: {r.why()}",
        capacity_bytes=capacity,
        limit_bytes=SLICE_LIMIT,
    )


# ---- the scheduler on the GPU backend


def _per_item_seconds(backend: Any, a: Any, out: Any) -> float:
    _, seconds = backend.time_tile(lambda: _items(backend, a, out, 200))
    return float(seconds) / 200


def scheduler_checks(report: Report, backend: Any) -> None:
    try:
        from neuronetes import runtime

        api: Any = runtime  # the scheduler's API, built beside this module: read as documented
        scheduler, tiled = api.Scheduler, api.tiled
    except (ImportError, AttributeError) as exc:
        for sub in ("pacing", "isolation"):
            report.check(
                f"{backend.name}.{sub}", False, f"error: the runtime's Scheduler API is missing: {exc}"
            )
        return
    a, out = _matrices(backend)
    item_s = _per_item_seconds(backend, a, out)

    def make() -> Any:
        return scheduler(window_ms=10, tick_ms=1, backend=backend.name)

    # pacing: two tasks, each held to its bandwidth of measured device time
    sched = make()
    done = {b: 0 for b in PACING_BANDWIDTHS}
    device_s = {b: 0.0 for b in PACING_BANDWIDTHS}

    def worker(b: float) -> Callable[[int, int], None]:
        def fn(start: int, stop: int) -> None:
            # The task's own device time (its own events, as the CPU bench times its own function):
            # a share computed from a solo per-item time is off by whatever the GPU's clocks did
            # between that measurement and the run.
            _, seconds = backend.time_tile(lambda: _items(backend, a, out, stop - start))
            device_s[b] += seconds
            done[b] += stop - start

        return fn

    for b in PACING_BANDWIDTHS:
        sched.submit(tiled(worker(b), 1 << 40, tile=8), bandwidth=b, policy="guaranteed")
    elapsed = _drive(sched, PACING_SECONDS)
    shares = {str(b): 100 * device_s[b] / elapsed for b in PACING_BANDWIDTHS}
    by_solo_item = {str(b): 100 * done[b] * item_s / elapsed for b in PACING_BANDWIDTHS}
    ok = all(abs(shares[str(b)] - 100 * b) <= TOLERANCE_PP for b in PACING_BANDWIDTHS)
    report.check(
        f"{backend.name}.pacing",
        ok,
        f"each within ±{TOLERANCE_PP:g} pp of its bandwidth" if ok else "a task missed its bandwidth",
        achieved_percent=shares,
        by_solo_item_time_percent=by_solo_item,
        item_device_us=item_s * 1e6,
        seconds=elapsed,
    )

    # isolation: a latency-sensitive guaranteed task's requests, arriving on a clock, beside a
    # best-effort neighbour that takes whatever is left
    # A request is REQUEST_TILES synchronised items; arrivals are spaced so the requests ask for
    # REQUEST_LOAD of the wall time whatever a request costs (timed here, alone, as the server runs
    # it), and never closer than ISOLATION_PERIOD_S.
    def one_request() -> None:
        for _ in range(REQUEST_TILES):
            _items(backend, a, out, 1)
            _sync(backend)

    one_request()
    began = time.perf_counter()
    for _ in range(20):
        one_request()
    request_s = (time.perf_counter() - began) / 20
    period = max(ISOLATION_PERIOD_S, request_s / REQUEST_LOAD)

    def latency_run(neighbour: bool, alone_neighbour: bool = False) -> tuple[list[float], int, float]:
        sched = make()
        latencies: list[float] = []
        neighbour_items = [0]

        def server() -> Generator[float | None, None, None]:
            # A request every `period`: REQUEST_TILES tiles of work; its latency runs from its
            # arrival to its last tile's completion (queueing behind the neighbour included).
            arrival = time.perf_counter() + period
            while True:
                wait = arrival - time.perf_counter()
                if wait > 0:
                    yield wait
                for _ in range(REQUEST_TILES):
                    _items(backend, a, out, 1)
                    _sync(backend)
                    yield None
                latencies.append(time.perf_counter() - arrival)
                arrival += period

        def filler(start: int, stop: int) -> None:
            _items(backend, a, out, stop - start)
            neighbour_items[0] += stop - start

        if not alone_neighbour:
            sched.submit(server, bandwidth=0.3, policy="guaranteed")
        if neighbour or alone_neighbour:
            sched.submit(tiled(filler, 1 << 40, tile=8), policy="best_effort")
        elapsed = _drive(sched, PACING_SECONDS)
        return latencies, neighbour_items[0], elapsed

    solo, _, _ = latency_run(neighbour=False)
    shared, items, shared_s = latency_run(neighbour=True)
    _, solo_items, solo_s = latency_run(neighbour=False, alone_neighbour=True)
    p99_solo = float(np.percentile(solo, 99)) if solo else None
    p99_shared = float(np.percentile(shared, 99)) if shared else None
    ratio = p99_shared / p99_solo if p99_solo and p99_shared else None
    kept = (items / shared_s) / (solo_items / solo_s) if solo_items and shared_s and solo_s else None
    ok = (
        ratio is not None
        and kept is not None
        and ratio <= ISOLATION_P99_RATIO
        and kept >= ISOLATION_NEIGHBOUR_SHARE
    )
    report.check(
        f"{backend.name}.isolation",
        ok,
        f"p99 {ratio:.2f}× solo, neighbour keeps {100 * kept:.0f} %"
        if ratio is not None and kept is not None
        else "a run produced no requests or no neighbour work",
        p99_solo_ms=None if p99_solo is None else p99_solo * 1e3,
        p99_shared_ms=None if p99_shared is None else p99_shared * 1e3,
        p99_ratio=ratio,
        neighbour_kept=kept,
        requests=len(shared),
        period_ms=period * 1e3,
        request_ms=request_s * 1e3,
    )


def _drive(sched: Any, seconds: float) -> float:
    """Step `sched` for `seconds` of wall time; the seconds it ran."""
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        sched.step()
    return time.perf_counter() - started
