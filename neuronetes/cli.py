"""The `neuronetes` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from neuronetes.engine.policy import POLICIES
from neuronetes.model import NodeSpec, PodRequest
from neuronetes.sim import report
from neuronetes.sim.simulate import RunResult, parse_seeds, simulate, summarise
from neuronetes.sim.trace import TraceError, load_nodes, load_pods


def _run_one(args: tuple[Sequence[NodeSpec], Sequence[PodRequest], str, int, float]) -> RunResult:
    nodes, pods, policy, seed, tune = args
    return simulate(nodes, pods, policy, seed, tune)


def cmd_simulate(ns: argparse.Namespace) -> int:
    policies = [p.strip() for p in ns.policy.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            print(f"error: unknown policy {p!r}; choose from {', '.join(POLICIES)}", file=sys.stderr)
            return 2
    try:
        seeds = parse_seeds(ns.seeds)
        nodes = load_nodes(ns.nodes)
        pods = load_pods(ns.pods)
    except (OSError, TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    trace = Path(ns.pods).stem
    jobs = [(nodes, pods, p, s, ns.tune) for p in policies for s in seeds]
    workers = max(1, min(ns.workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        done = [_run_one(j) for j in jobs]
    else:
        with ProcessPoolExecutor(workers) as pool:
            done = list(pool.map(_run_one, jobs))
    results: dict[str, list[RunResult]] = {p: [] for p in policies}
    for (_, _, p, _, _), r in zip(jobs, done, strict=True):
        results[p].append(r)
        if ns.verbose:
            print(
                f"{p:<11} seed {r.seed}: {r.seconds:6.1f}s  unallocated@100% {r.unallocated(100):6.2f}",
                file=sys.stderr,
            )
    expected = report.load_expected(ns.compare, trace) if ns.compare else None
    print(report.table(trace, results, expected))
    for p, runs in results.items():
        secs = [r.seconds for r in runs]
        print(f"{p}: {len(runs)} seed(s), {min(secs):.1f}–{max(secs):.1f} s per seed")
    if ns.json:
        summaries = [summarise(trace, p, runs) for p, runs in results.items()]
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(
            json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2) + "\n"
        )
    if ns.plot:
        Path(ns.plot).parent.mkdir(parents=True, exist_ok=True)
        report.plot(ns.plot, trace, results, expected)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuronetes", description="NeuroNetes GPU scheduling")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="replay a pod trace through the placement engine (FGD protocol)")
    sim.add_argument("--nodes", required=True, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    sim.add_argument("--pods", required=True, help="pod list CSV (openb columns)")
    sim.add_argument("--policy", default="default", help=f"policy or comma list: {', '.join(POLICIES)}")
    sim.add_argument("--seeds", default="42-51", help="seeds, e.g. 42-51 or 42,43")
    sim.add_argument("--tune", type=float, default=1.3, help="inflate GPU requests to TUNE × capacity")
    sim.add_argument("--json", help="write results JSON here")
    sim.add_argument("--compare", help="folder with the paper's analysis_allo_discrete.csv")
    sim.add_argument("--plot", help="write an allocated-vs-arrived PNG here")
    sim.add_argument("--workers", type=int, default=0, help="processes (default: CPU count)")
    sim.add_argument("-v", "--verbose", action="store_true")
    sim.set_defaults(func=cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    return int(ns.func(ns))


if __name__ == "__main__":
    raise SystemExit(main())
