"""neuronetes.runtime on the CPU backend: pacing accuracy and the isolation figure.

    python bench/runtime.py [--seconds 2] [--repeat N] [--json [PATH]]

- **Pacing accuracy**: two or three `guaranteed` tasks at bandwidth 0.2/0.5/0.8 combinations, each
  an endless adaptive NumPy workload (square roots over a slice of a 4M-element array, sized by the
  tile), run for `--seconds` of wall time; a task's achieved share is the wall time spent inside
  its own function (timed by this script, not by the scheduler) ÷ the run's wall time. Target:
  within ±2 points of its bandwidth.
- **Isolation**: a latency-sensitive `guaranteed` task (bandwidth 0.3) serves a request every
  10 ms, each four tiles of ~0.25 ms; its per-request latency is from the request's arrival to its
  last tile's end. Run alone, then beside a `best_effort` neighbour (an endless adaptive workload,
  1 ms target tiles); and the neighbour alone for its solo throughput. Target: p99 with the
  neighbour ≤ 1.10 × solo p99, and the neighbour keeps ≥ 50 % of its solo throughput.

Wall-clock figures on a shared machine: run it on an otherwise idle one for figures to quote.
`--repeat N` runs both N times and adds, per task and for the isolation figures, the mean, the
worst and how many runs met the target: one run's figure varies with the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np

from neuronetes import runtime

SOURCE = np.random.default_rng(7).random(1 << 22)
ITEM = 256  # floats per tile item
COMBOS = [(0.2, 0.5), (0.2, 0.8), (0.5, 0.5), (0.2, 0.2, 0.5)]
RESULTS = Path(__file__).parent / "results" / "runtime.json"


class TimedWork:
    """An endless tiled workload that adds up the wall time spent in its own function."""

    def __init__(self) -> None:
        self.inside_s = 0.0
        self.items = 0

    def __call__(self, start: int, stop: int) -> None:
        t0 = time.perf_counter()
        np.sqrt(SOURCE[: min(stop - start, len(SOURCE) // ITEM) * ITEM])
        self.inside_s += time.perf_counter() - t0
        self.items += stop - start


def endless(work: TimedWork) -> runtime.TiledWorkload:
    return runtime.tiled(work, 1 << 62, target_ms=1.0)


def pacing(seconds: float) -> list[dict[str, Any]]:
    rows = []
    for combo in COMBOS:
        sched = runtime.Scheduler(backend="numpy", metrics=False)
        works = [TimedWork() for _ in combo]
        for share, work in zip(combo, works, strict=True):
            sched.submit(endless(work), bandwidth=share, policy="guaranteed")
        t0 = time.perf_counter()
        sched.run(until=seconds)
        elapsed = time.perf_counter() - t0
        achieved = [w.inside_s / elapsed for w in works]
        accounted = [t.total_s / elapsed for t in sched.tasks()]
        rows.append(
            {
                "bandwidths": list(combo),
                "achieved": [round(a, 4) for a in achieved],
                "error_pp": [round(100 * (a - b), 2) for a, b in zip(achieved, combo, strict=True)],
                "scheduler_accounted": [round(a, 4) for a in accounted],
                "seconds": round(elapsed, 3),
            }
        )
    return rows


def _calibrated_tile() -> Callable[[], None]:
    """A NumPy call of about 0.25 ms on this machine."""
    n = 1 << 12
    while True:
        t0 = time.perf_counter()
        for _ in range(20):
            np.sqrt(SOURCE[:n])
        if (time.perf_counter() - t0) / 20 >= 0.00025 or n >= len(SOURCE):

            def tile(size: int = n) -> None:
                np.sqrt(SOURCE[:size])

            return tile
        n *= 2


def serve(
    latencies: list[float], requests: int, period_s: float, tile: Callable[[], None]
) -> Callable[[], Generator[float | None, None, None]]:
    def server() -> Generator[float | None, None, None]:
        arrival = time.perf_counter() + period_s
        for _ in range(requests):
            wait = arrival - time.perf_counter()
            if wait > 0:
                yield wait
            for _ in range(4):
                tile()
                yield None
            latencies.append(time.perf_counter() - arrival)
            arrival += period_s

    return server


def isolation(seconds: float) -> dict[str, Any]:
    period = 0.010
    requests = int(seconds / period)
    tile = _calibrated_tile()

    def one(with_server: bool, with_neighbour: bool) -> tuple[list[float], float]:
        sched = runtime.Scheduler(backend="numpy", metrics=False)
        latencies: list[float] = []
        work = TimedWork()
        if with_server:
            server = sched.submit(
                serve(latencies, requests, period, tile), bandwidth=0.3, policy="guaranteed"
            )
        if with_neighbour:
            sched.submit(endless(work), policy="best_effort")
        t0 = time.perf_counter()
        sched.run(until=server if with_server else seconds)
        return latencies, work.items / (time.perf_counter() - t0)

    solo, _ = one(True, False)
    _, neighbour_solo = one(False, True)
    mixed, neighbour_mixed = one(True, True)

    def p99(values: list[float]) -> float:
        return statistics.quantiles(values, n=100)[98]

    return {
        "requests": requests,
        "solo_p50_ms": round(1000 * statistics.median(solo), 3),
        "solo_p99_ms": round(1000 * p99(solo), 3),
        "mixed_p50_ms": round(1000 * statistics.median(mixed), 3),
        "mixed_p99_ms": round(1000 * p99(mixed), 3),
        "p99_ratio": round(p99(mixed) / p99(solo), 3),
        "neighbour_solo_items_per_s": round(neighbour_solo),
        "neighbour_mixed_items_per_s": round(neighbour_mixed),
        "neighbour_kept": round(neighbour_mixed / neighbour_solo, 3),
    }


def _print_run(seconds: float, rows: list[dict[str, Any]], iso: dict[str, Any]) -> None:
    print(f"pacing accuracy, CPU backend, {seconds:g} s each (target ±2 pp)")
    print(f"{'bandwidths':<20} {'achieved':<28} {'error (pp)':<24} {'scheduler-accounted':<24}")
    for row in rows:
        print(
            f"{'/'.join(f'{b:g}' for b in row['bandwidths']):<20} "
            f"{' '.join(f'{a:.3f}' for a in row['achieved']):<28} "
            f"{' '.join(f'{e:+.2f}' for e in row['error_pp']):<24} "
            f"{' '.join(f'{a:.3f}' for a in row['scheduler_accounted']):<24}"
        )
    print(f"worst error {max(abs(e) for row in rows for e in row['error_pp']):.2f} pp")
    print(
        f"isolation: guaranteed (0.3) p50/p99 {iso['solo_p50_ms']:.3f}/{iso['solo_p99_ms']:.3f} ms alone, "
        f"{iso['mixed_p50_ms']:.3f}/{iso['mixed_p99_ms']:.3f} ms beside best_effort "
        f"(p99 ratio {iso['p99_ratio']:.3f}, target <= 1.10); "
        f"neighbour kept {iso['neighbour_kept']:.1%} of its solo throughput (target >= 50 %)"
    )


def summarize(runs: list[tuple[list[dict[str, Any]], dict[str, Any]]]) -> dict[str, Any]:
    """Per task of each combination and for the isolation figures: mean, worst, runs on target."""
    tasks = []
    for i, row in enumerate(runs[0][0]):
        for j, bandwidth in enumerate(row["bandwidths"]):
            errors = [rows[i]["error_pp"][j] for rows, _ in runs]
            tasks.append(
                {
                    "bandwidths": row["bandwidths"],
                    "bandwidth": bandwidth,
                    "mean_error_pp": round(statistics.mean(errors), 2),
                    "worst_error_pp": max(errors, key=abs),
                    "within_2pp": sum(abs(e) <= 2.0 for e in errors),
                }
            )
    ratios = [iso["p99_ratio"] for _, iso in runs]
    kept = [iso["neighbour_kept"] for _, iso in runs]
    return {
        "runs": len(runs),
        "pacing": tasks,
        "p99_ratio_worst": max(ratios),
        "p99_ratio_within_target": sum(r <= 1.10 for r in ratios),
        "neighbour_kept_worst": min(kept),
        "neighbour_kept_within_target": sum(k >= 0.5 for k in kept),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="run everything N times (default 1)")
    ap.add_argument("--json", nargs="?", const=str(RESULTS), default=None, metavar="PATH")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    runs = []
    for index in range(args.repeat):
        rows, iso = pacing(args.seconds), isolation(max(args.seconds, 3.0))
        runs.append((rows, iso))
        if args.repeat > 1:
            print(f"--- run {index + 1} of {args.repeat}")
        _print_run(args.seconds, rows, iso)
    summary = summarize(runs) if args.repeat > 1 else None
    if summary:
        n = summary["runs"]
        print(f"over {n} runs (target ±2 pp; p99 ratio <= 1.10; neighbour >= 50 %)")
        print(f"{'bandwidths':<20} {'task':<6} {'mean (pp)':<10} {'worst (pp)':<11} within target")
        for task in summary["pacing"]:
            print(
                f"{'/'.join(f'{b:g}' for b in task['bandwidths']):<20} {task['bandwidth']:<6g} "
                f"{task['mean_error_pp']:<+10.2f} {task['worst_error_pp']:<+11.2f} {task['within_2pp']}/{n}"
            )
        print(
            f"isolation: worst p99 ratio {summary['p99_ratio_worst']:.3f} "
            f"({summary['p99_ratio_within_target']}/{n} within target); worst neighbour kept "
            f"{summary['neighbour_kept_worst']:.1%} ({summary['neighbour_kept_within_target']}/{n})"
        )
    if args.json:
        rows, iso = runs[-1]
        worst = max(abs(e) for row in rows for e in row["error_pp"])
        out: dict[str, Any] = {"backend": "numpy", "pacing": rows, "worst_error_pp": worst, "isolation": iso}
        if summary:
            out["repeated"] = summary
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
