"""Per-decision latency of the placement engine, at trace scale and at 5,000 nodes.

For each cluster it replays one seed of the openb trace (tune 1.3) through `place` + `commit`
and reports the median and p99 of one decision, the whole seed's wall time, and the latency of
a *cold* decision (every node re-scored: a new request shape, or a cache invalidated by a
profile change), which bounds the worst case.

    python bench/placement_latency.py [--policy default] [--pods PODS.csv] [--synthetic 5000] \
        [--json OUT.json]

`--pods` replays another pod list (a pinned variant from `bench/openb_variants.py`, say);
`--synthetic 0` skips the 5,000-node cluster. `--max-nodes-to-score N` gives every pod the
candidate limit N (an AgentPool's ``fastScheduling.maxNodesToScore``; docs/locality.md): the
engine scores at most N feasible nodes per decision, and the unallocated share at 100 % arrival
says what that costs in placement quality.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from neuronetes.engine import PlacementEngine, WorkloadProfile
from neuronetes.inventory import ClusterState
from neuronetes.model import NodeSpec, PodRequest
from neuronetes.sim.simulate import simulate
from neuronetes.sim.trace import load_nodes, load_pods

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("NEURONETES_TRACE_DIR", ROOT.parent / "shared" / "data" / "openb" / "csv"))


def synthetic(nodes: list[NodeSpec], target: int) -> list[NodeSpec]:
    """`target` nodes drawn round-robin from the real node mix, renamed."""
    return [replace(nodes[k % len(nodes)], name=f"synth-{k:05d}") for k in range(target)]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def measure(nodes: list[NodeSpec], pods: list[PodRequest], policy: str, seed: int) -> dict[str, float]:
    run = simulate(nodes, pods, policy, seed, tune=1.3, time_decisions=True)
    ms = [t * 1000 for t in run.decision_seconds]
    # Cold decisions: a fresh engine scores every node for each request.
    state = ClusterState(nodes)
    engine = PlacementEngine(state, policy)
    engine.set_profile(WorkloadProfile.from_requests(pods))
    cold = []
    for pod in pods[:: max(1, len(pods) // 50)][:50]:
        engine.set_profile(engine.profile)  # drop the cache
        t0 = time.perf_counter()
        engine.place(pod)
        cold.append((time.perf_counter() - t0) * 1000)
    return {
        "nodes": len(nodes),
        "decisions": len(ms),
        "seed_seconds": round(run.seconds, 2),
        "decision_ms_p50": round(statistics.median(ms), 4),
        "decision_ms_p99": round(pct(ms, 99), 4),
        "cold_decision_ms_p50": round(statistics.median(cold), 3),
        "cold_decision_ms_p99": round(pct(cold, 99), 3),
        "unallocated_gpu_pct_at_100": round(run.unallocated(100), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    ap.add_argument("--synthetic", type=int, default=5000, help="nodes of the synthetic cluster (0: none)")
    ap.add_argument("--max-nodes-to-score", type=int, default=0, help="candidate limit per pod (0: none)")
    ap.add_argument("--json")
    ns = ap.parse_args()
    real = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    pods = [replace(p, max_nodes_to_score=ns.max_nodes_to_score) for p in load_pods(ns.pods)]
    results = [measure(real, pods, ns.policy, ns.seed)]
    if ns.synthetic > 0:
        results.append(measure(synthetic(real, ns.synthetic), pods, ns.policy, ns.seed))
    limit = ns.max_nodes_to_score or "none"
    print(f"policy {ns.policy}, pods {ns.pods.name}, seed {ns.seed}, candidate limit {limit}, one process")
    head = ("nodes", "decisions", "seed s", "p50 ms", "p99 ms", "cold p50", "cold p99", "unalloc%")
    print(" ".join(f"{h:>9}" for h in head))
    for r in results:
        print(
            f"{r['nodes']:>6} {r['decisions']:>9} {r['seed_seconds']:>7} {r['decision_ms_p50']:>8} "
            f"{r['decision_ms_p99']:>8} {r['cold_decision_ms_p50']:>9} {r['cold_decision_ms_p99']:>9}"
            f" {r['unallocated_gpu_pct_at_100']:>9}"
        )
    if ns.json:
        out = {
            "policy": ns.policy,
            "pods": ns.pods.name,
            "max_nodes_to_score": ns.max_nodes_to_score,
            "results": results,
        }
        Path(ns.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
