"""The MIG layout planner against today's peers and against the optimum, on synthetic demand streams.

Each case: 16–64 MIG GPUs of mixed models (A100-40GB, A100-80GB, H100-80GB, H200), some partly used
(instances with running clients), some idle with a stale layout, some re-laid out a minute ago
(within the hysteresis interval), and a stream of pending demand (profiles of those models, some
restricted to one model) sized to 30–75 % of the free memory slices. Three planners per case:

* ours: `plan_mig_layouts(strategy="best")`;
* first-fit templates: today's peers (a GPU with running instances serves only from its idle
  instances, an idle GPU takes the one mig-parted template that serves the most, first fit);
* exact: `strategy="exact"` with a large state budget, on the cases of at most 16 GPUs (exact in
  demand served and GPUs used; a case whose search runs out of budget is reported, not counted).

Figures: GPUs used (with an instance in use after the plan), demand served, running instances
disturbed (must be 0), plan time (p50/p99 per GPU count, wall clock and the thread's CPU time:
on a shared machine the wall clock includes waiting for a core).

    python bench/mig_planner.py --cases 200 --json bench/results/mig_planner.json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from neuronetes.mig import MigLayout, catalog_for
from neuronetes.migplan import GpuMigState, MigDemand, MigPlan, plan_mig_layouts

MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200")
NOW_S = 10_000.0
EXACT_BUDGET = 400_000


def random_layout(rng: random.Random, model: str, tries: int) -> MigLayout:
    """A valid layout from `tries` random placements (each kept when it fits)."""
    catalog = catalog_for(model)
    layout = catalog.empty_layout()
    for _ in range(tries):
        profile = rng.choice(catalog.profiles)
        starts = layout.valid_starts(profile)
        if starts:
            layout = layout.place_at(profile, rng.choice(starts))
    return layout


def random_case(rng: random.Random, n_gpus: int) -> tuple[list[MigDemand], list[GpuMigState]]:
    """One synthetic cluster and its pending demand."""
    models = rng.sample(MODELS, rng.randint(1, len(MODELS)))
    gpus: list[GpuMigState] = []
    for i in range(n_gpus):
        model = rng.choice(models)
        kind = rng.random()
        if kind < 0.45:  # partly used: some instances run clients
            layout = random_layout(rng, model, rng.randint(1, 4))
            in_use = frozenset(inst.start for inst in layout if rng.random() < 0.7)
        elif kind < 0.7:  # idle, with a stale layout
            layout, in_use = random_layout(rng, model, rng.randint(1, 6)), frozenset()
        else:
            layout, in_use = catalog_for(model).empty_layout(), frozenset()
        last = NOW_S - 60.0 if rng.random() < 0.1 else None
        gpus.append(GpuMigState(f"gpu-{i}", layout, in_use, last))
    weights = [8, 6, 4, 3, 2, 1, 0]  # small profiles are asked for more often; no +me
    demand: list[MigDemand] = []
    budget = sum(
        8 - len([s for inst in g.layout if inst.start in g.in_use for s in inst.slots]) for g in gpus
    )
    target = budget * rng.uniform(0.3, 0.75)
    asked = 0.0
    while asked < target:
        catalog = catalog_for(rng.choice(models))
        profile = rng.choices(list(reversed(catalog.profiles)), weights=weights)[0]
        restrict = catalog.gpu_model if rng.random() < 0.2 else None
        demand.append(MigDemand(f"pod-{len(demand)}", profile.name, restrict))
        asked += profile.memory_slices
    return demand, gpus


def disturbed(plan: MigPlan) -> int:
    """Running instances the plan destroys or moves (the planner's guarantee says 0)."""
    return sum(
        1 for g in plan.gpus for inst in g.in_use if inst not in g.target.instances or inst in g.destroy
    )


def run(cases: int, sizes: list[int], seed: int) -> dict[str, Any]:
    # The planner's per-model tables are built once per process: build them before timing.
    plan_mig_layouts(*random_case(random.Random(seed), 64), now_s=NOW_S)
    rows: dict[int, dict[str, Any]] = {}
    for n in sizes:
        stats: dict[str, Any] = {
            "cases": 0, "ours_gpus": 0, "ff_gpus": 0, "opt_gpus": 0, "opt_cases": 0, "opt_over_budget": 0,
            "ours_gpus_on_opt": 0, "ours_served_on_opt": 0, "equal_to_opt": 0, "served_less_than_opt": 0,
            "ours_served": 0, "ff_served": 0, "opt_served": 0, "demand": 0, "disturbed": 0,
            "worse_than_ff": 0, "gap_max_pct": 0.0, "ours_ms": [], "ours_cpu_ms": [], "search": {},
        }  # fmt: skip
        for c in range(cases):
            rng = random.Random(seed * 1_000_003 + n * 1009 + c)
            demand, gpus = random_case(rng, n)
            gc.collect()  # the previous case's exact search leaves much garbage: not this plan's cost
            t0, c0 = time.perf_counter(), time.thread_time()
            ours = plan_mig_layouts(demand, gpus, now_s=NOW_S)
            stats["ours_ms"].append((time.perf_counter() - t0) * 1000)
            stats["ours_cpu_ms"].append((time.thread_time() - c0) * 1000)
            ff = plan_mig_layouts(demand, gpus, now_s=NOW_S, strategy="templates")
            stats["cases"] += 1
            stats["demand"] += len(demand)
            stats["search"][ours.search] = stats["search"].get(ours.search, 0) + 1
            stats["disturbed"] += disturbed(ours)
            stats["ours_gpus"] += ours.gpus_used
            stats["ff_gpus"] += ff.gpus_used
            stats["ours_served"] += ours.served
            stats["ff_served"] += ff.served
            if (-ours.served, ours.gpus_used) > (-ff.served, ff.gpus_used):
                stats["worse_than_ff"] += 1
            if n <= 16:
                opt = plan_mig_layouts(demand, gpus, now_s=NOW_S, strategy="exact", exact_budget=EXACT_BUDGET)
                if opt.search != "exact":
                    stats["opt_over_budget"] += 1
                    continue
                stats["opt_cases"] += 1
                stats["opt_gpus"] += opt.gpus_used
                stats["opt_served"] += opt.served
                stats["ours_gpus_on_opt"] += ours.gpus_used
                stats["ours_served_on_opt"] += ours.served
                stats["equal_to_opt"] += (ours.served, ours.gpus_used) == (opt.served, opt.gpus_used)
                if ours.served < opt.served:
                    stats["served_less_than_opt"] += 1
                else:
                    gap = 100.0 * (ours.gpus_used - opt.gpus_used) / max(1, opt.gpus_used)
                    stats["gap_max_pct"] = max(stats["gap_max_pct"], gap)
        for name in ("ms", "cpu_ms"):
            values = sorted(stats.pop(f"ours_{name}"))
            stats[f"plan_{name}_p50"] = round(statistics.median(values), 2)
            stats[f"plan_{name}_p99"] = round(values[min(len(values) - 1, int(0.99 * len(values)))], 2)
        rows[n] = stats
    return {"seed": seed, "cases_per_size": cases, "sizes": rows}


def print_table(result: dict[str, Any]) -> None:
    print(
        "| GPUs | cases | demand | served ours / ff | GPUs used ours / ff | vs ff | worse than ff "
        "| exact solved | served ours / opt | GPUs ours / opt | vs opt (worst case) | equal to opt "
        "| served < opt | disturbed | plan ms p50 / p99 | CPU ms p50 / p99 |"
    )
    print("|" + "---:|" * 16)
    for n, s in result["sizes"].items():
        vs_ff = 100.0 * (s["ours_gpus"] - s["ff_gpus"]) / max(1, s["ff_gpus"])
        if s["opt_cases"]:
            vs_opt = 100.0 * (s["ours_gpus_on_opt"] - s["opt_gpus"]) / max(1, s["opt_gpus"])
            opt = (
                f"{s['opt_cases']}/{s['cases']} | {s['ours_served_on_opt']} / {s['opt_served']} "
                f"| {s['ours_gpus_on_opt']} / {s['opt_gpus']} | {vs_opt:+.1f} % ({s['gap_max_pct']:+.1f} %) "
                f"| {s['equal_to_opt']} | {s['served_less_than_opt']}"
            )
        else:
            opt = "– | – | – | – | – | –"
        print(
            f"| {n} | {s['cases']} | {s['demand']} | {s['ours_served']} / {s['ff_served']} "
            f"| {s['ours_gpus']} / {s['ff_gpus']} | {vs_ff:+.1f} % | {s['worse_than_ff']} | {opt} "
            f"| {s['disturbed']} | {s['plan_ms_p50']} / {s['plan_ms_p99']} "
            f"| {s['plan_cpu_ms_p50']} / {s['plan_cpu_ms_p99']} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100, help="cases per GPU count")
    parser.add_argument("--sizes", default="16,32,64", help="GPU counts, comma separated (16-64)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        print(f"--sizes: expected comma-separated integers, got {args.sizes!r}", file=sys.stderr)
        return 2
    result = run(args.cases, sizes, args.seed)
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
