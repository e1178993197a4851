"""The preemption churn soak: the extender's cache and preemption controller on a simulated
cluster and clock for 30 simulated minutes (tests/preemption_churn.py says what is real and what
is simulated), with mixed priorities (0, 100, 500, 1000), Poisson arrivals, departures, evicted
pods re-queued, three workloads in ten asking for the fewest-victims order, one in ten a gang of
two pods.

Figures per (arrival rate, seed): preemptions, evictions, **preemption loops** (an eviction that
closes a cycle "A's pod evicted B's pod ... evicted A's": goal 0), victims re-placed onto the
GPUs held for their preemptor (goal 0), holds that ran out before their preemptor bound,
preemptors bound (on the held node), the most times one workload was evicted, a preemptor's
seconds from its first eviction to its bind (p50/p99), and the controller's tick (wall ms,
p99; 2-core machine shared with other work).

    python bench/preemption_soak.py [--seconds 1800] [--rates 0.3 0.5] [--seeds 1 2 3] \
        [--json bench/results/preemption_soak.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from preemption_churn import ChurnSoak  # noqa: E402

COLUMNS = (
    ("rate/s", "rate"),
    ("seed", "seed"),
    ("arrivals", "arrivals"),
    ("binds", "binds"),
    ("preempt", "preemptions"),
    ("by gangs", "gang_preemptions"),
    ("evicted", "evictions"),
    ("loops", "loops"),
    ("retook", "victims_retook_held_gpus"),
    ("expired", "holds_expired_unbound"),
    ("bound", "preemptors_bound"),
    ("on held", "preemptors_bound_on_held_node"),
    ("max ev/wl", "max_evictions_of_one_workload"),
    ("bind p50", "time_to_bind_p50_s"),
    ("bind p99", "time_to_bind_p99_s"),
    ("tick p99", "tick_p99_ms"),
    ("wall s", "wall_s"),
)


def soak(rate: float, seed: int, seconds: int) -> dict[str, float]:
    started = time.perf_counter()
    f = ChurnSoak(seed, arrivals_per_s=rate, mean_run_s=400).run(seconds)
    row = {k: v for k, v in vars(f).items() if not isinstance(v, list)}
    row.update(
        rate=rate,
        seed=seed,
        time_to_bind_p50_s=f.percentile(f.time_to_bind_s, 0.5),
        time_to_bind_p99_s=f.percentile(f.time_to_bind_s, 0.99),
        tick_p99_ms=round(f.percentile(f.tick_ms, 0.99), 1),
        wall_s=round(time.perf_counter() - started, 1),
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=1800)
    ap.add_argument("--rates", type=float, nargs="*", default=[0.3, 0.5])
    ap.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print(" ".join(f"{h:>9}" for h, _ in COLUMNS))
    rows = []
    for rate in args.rates:
        for seed in args.seeds:
            row = soak(rate, seed, args.seconds)
            rows.append(row)
            print(" ".join(f"{row[k]!s:>9}" for _, k in COLUMNS), flush=True)
    print(
        f"total: {sum(r['preemptions'] for r in rows)} preemptions, "
        f"{sum(r['evictions'] for r in rows)} evictions, {sum(r['loops'] for r in rows)} loops, "
        f"{sum(r['victims_retook_held_gpus'] for r in rows)} victims back on held GPUs "
        f"over {len(rows)} soaks of {args.seconds} simulated s"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"soaks": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
