"""GPU-aware preemption (`neuronetes.engine.preempt`): decision time on a loaded cluster, and the
oracle sweep against a brute force on random small clusters.

Decision time: a cluster of N nodes (a mix of 8×A100-80GB, 4×T4 and 8×A100-40GB in MIG mode)
filled to about 90 % with pods of three priorities (batch 0, standard 100, critical 1000): whole
GPUs, shares and MIG instances, gangs of 2-4 members across nodes, random start times and
GPU-seconds lost (GPUs × seconds run). Each decision is one `choose_victims` for a preemptor of
priority 500 (whole 1, 2, 4 or 8 GPUs; a 60 GiB share; MIG 4g.20gb and 7g.40gb), timed twice:
with the `CandidateIndex` of the snapshot kept (built once for every pending pod decided on that
snapshot) and cold (the index built inside the decision). Figures: p50 and p99 of one decision,
the index's build time, the most nodes searched in one decision, and how many decisions evicted.

Oracle: `tests/preempt_cases.py`'s random small clusters (the unit test runs 10,000), here more.

    python bench/preemption.py [--nodes 1000 5000] [--decisions 200] [--oracle-cases 50000] \
        [--json bench/results/preemption.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from preempt_cases import judge, random_case, random_grants  # noqa: E402

from neuronetes.engine.preempt import CandidateIndex, Unit, Victim, choose_victims, group_units  # noqa: E402
from neuronetes.inventory import ClusterState  # noqa: E402
from neuronetes.model import GpuSpec, NodeSpec, PodRequest  # noqa: E402

PRIORITIES = (0, 0, 0, 100, 100, 1000)
NOW = 100_000.0


def nodes(n: int) -> list[NodeSpec]:
    out = []
    for k in range(n):
        kind = k % 10
        if kind < 6:
            model, mem, count, mig = "A100-80GB", 81920, 8, False
        elif kind < 9:
            model, mem, count, mig = "T4", 15360, 4, False
        else:
            model, mem, count, mig = "A100-40GB", 40960, 8, True
        gpus = tuple(
            GpuSpec(
                j, f"n{k}-{j}", model, mem, nvlink_group=j // 4, nvlink_bandwidth_gbps=300.0, mig_enabled=mig
            )
            for j in range(count)
        )
        out.append(NodeSpec(f"node-{k:05d}", 128_000, 1_024_000, gpus))
    return out


def _request(rng: random.Random, row: int, state: ClusterState) -> PodRequest:
    if state.gpu_mig[row].any():
        return PodRequest(
            "p", cpu_milli=1000, gpus=1, mig_profile=rng.choice(["1g.5gb", "2g.10gb", "3g.20gb"])
        )
    if rng.random() < 0.4:
        return PodRequest("p", cpu_milli=2000, gpus=rng.choice([1, 1, 2, 4]))
    cap = int(state.gpu_mem_cap[row, 0])
    return PodRequest(
        "p",
        cpu_milli=1000,
        gpus=1,
        gpu_milli=rng.choice([250, 500]),
        gpu_memory_mib=cap // rng.choice([4, 2]),
    )


def loaded(n: int, seed: int) -> tuple[ClusterState, list[Unit]]:
    """N nodes filled to about 90 % of their GPUs, and the candidate units of their pods."""
    rng = random.Random(seed)
    state = ClusterState(nodes(n))
    victims: list[Victim] = []
    target = 0.9 * float(state.gpu_milli_cap.sum())
    used = 0.0
    k = 0
    rows = [rng.randrange(n) for _ in range(50 * n)] + [r for r in range(n) for _ in range(12)]
    while rows and (used < target or k >= 50 * n):
        k += 1
        priority = rng.choice(PRIORITIES)
        gang = f"gang-{k}" if rng.random() < 0.05 else ""
        for m in range(rng.randint(2, 4) if gang else 1):
            if not rows:
                break
            row = rows.pop() if used >= target else rows.pop(0)
            req = _request(rng, row, state)
            grants = random_grants(rng, state, row, req)
            if grants is None:
                continue
            alloc = f"pod/{k}-{m}"
            state.allocate(alloc, row, req.cpu_milli, req.memory_mib, grants)
            used += sum(g.milli if g.mig_profile is None else 1000 / 7 for g in grants)
            started = NOW - rng.uniform(60, 86_400)
            victims.append(
                Victim(
                    f"{k}-{m}",
                    priority,
                    start_time=started,
                    allocation=alloc,
                    group=gang,
                    # One pod in ten runs under one of 50 PDBs (each allowing 0-2 disruptions).
                    pdb=f"pdb{k % 50}" if rng.random() < 0.1 else "",
                    pdb_allowed=k % 50 % 3,
                    gpu_seconds_lost=len(grants) * (NOW - started),
                )
            )
    return state, group_units(victims)


PREEMPTORS = (
    PodRequest("whole-1", cpu_milli=4000, gpus=1, priority=500),
    PodRequest("whole-2", cpu_milli=4000, gpus=2, priority=500),
    PodRequest("whole-4", cpu_milli=8000, gpus=4, priority=500),
    PodRequest("whole-8", cpu_milli=8000, gpus=8, priority=500),
    PodRequest("share-60g", cpu_milli=2000, gpus=1, gpu_milli=500, gpu_memory_mib=61440, priority=500),
    PodRequest("mig-4g", cpu_milli=2000, gpus=1, mig_profile="4g.20gb", priority=500),
    PodRequest("mig-7g", cpu_milli=2000, gpus=1, mig_profile="7g.40gb", priority=500),
)


def decision_times(n: int, decisions: int, seed: int) -> dict[str, float | int | str]:
    """p50/p99 of one decision with the candidate index kept for the snapshot (a caller deciding
    for several pending pods builds it once) and built inside each decision (cold)."""
    built = time.perf_counter()
    state, units = loaded(n, seed)
    built = time.perf_counter() - built
    t0 = time.perf_counter()
    index = CandidateIndex(state, units)
    index_ms = (time.perf_counter() - t0) * 1000
    warm: list[float] = []
    cold: list[float] = []
    searched: list[int] = []
    needed = 0
    for k in range(decisions):
        req = PREEMPTORS[k % len(PREEMPTORS)]
        t0 = time.perf_counter()
        decision = choose_victims(state, req, index)
        warm.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        again = choose_victims(state, req, units)
        cold.append((time.perf_counter() - t0) * 1000)
        assert again.victims == decision.victims and again.nodes == decision.nodes
        searched.append(decision.nodes_searched)
        needed += decision.needed and decision.node is not None
    util = 1 - float(state.gpu_milli_free.sum()) / float(state.gpu_milli_cap.sum())
    return {
        "nodes": n,
        "pods": sum(len(u.pods) for u in units),
        "gpu_milli_used_pct": round(100 * util, 1),
        "decisions": decisions,
        "with_victims": needed,
        "p50_ms": round(float(np.percentile(warm, 50)), 2),
        "p99_ms": round(float(np.percentile(warm, 99)), 2),
        "cold_p50_ms": round(float(np.percentile(cold, 50)), 2),
        "cold_p99_ms": round(float(np.percentile(cold, 99)), 2),
        "index_ms": round(index_ms, 1),
        "nodes_searched_max": max(searched),
        "build_s": round(built, 1),
    }


def oracle(cases: int) -> dict[str, float | int]:
    t0 = time.perf_counter()
    needed = agreed = minimal = feasible = 0
    for seed in range(cases):
        v = judge(random_case(random.Random(seed)))
        minimal += v.minimal
        feasible += v.feasible
        if v.needed:
            needed += 1
            agreed += v.agrees
    return {
        "cases": cases,
        "needing_preemption": needed,
        "equal_to_brute_force_pct": round(100 * agreed / max(needed, 1), 3),
        "minimal_pct": round(100 * minimal / cases, 3),
        "feasible_pct": round(100 * feasible / cases, 3),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="*", default=[1000, 5000])
    ap.add_argument("--decisions", type=int, default=200)
    ap.add_argument("--oracle-cases", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [decision_times(n, args.decisions, args.seed) for n in args.nodes]
    head = (
        "nodes",
        "pods",
        "used%",
        "p50 ms",
        "p99 ms",
        "cold p50",
        "cold p99",
        "index ms",
        "searched",
        "victims",
    )
    print(" ".join(f"{h:>9}" for h in head))
    for r in rows:
        cells = (
            r["nodes"],
            r["pods"],
            r["gpu_milli_used_pct"],
            r["p50_ms"],
            r["p99_ms"],
            r["cold_p50_ms"],
            r["cold_p99_ms"],
            r["index_ms"],
            r["nodes_searched_max"],
            f"{r['with_victims']}/{r['decisions']}",
        )
        print(" ".join(f"{c!s:>9}" for c in cells))
    result: dict[str, object] = {"decision_time": rows}
    if args.oracle_cases:
        o = oracle(args.oracle_cases)
        result["oracle"] = o
        print(
            f"oracle: {o['cases']} cases, {o['needing_preemption']} needing preemption: "
            f"{o['equal_to_brute_force_pct']} % equal to the brute force, {o['minimal_pct']} % minimal, "
            f"{o['feasible_pct']} % fit ({o['seconds']} s)"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
