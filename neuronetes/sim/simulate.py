"""Replaying a pod trace through the placement engine, following the FGD paper's protocol.

Protocol (Weng et al., ATC'23): pods sorted by name and shuffled per seed; the workload is
"tuned" by appending pods sampled with replacement until GPU requests reach `tune` × cluster
GPUs; pods arrive one at a time, never depart, and a pod that fits nowhere fails and is never
retried. Quality is the share of cluster GPUs left unallocated when arrived GPU requests
(failed pods included) reach a given share of capacity.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from neuronetes.engine import PlacementEngine, WorkloadProfile
from neuronetes.inventory import ClusterState
from neuronetes.model import NodeSpec, PodRequest

REPORT_POINTS = (95, 100, 130)
MAX_POINT = 130


def build_workload(
    pods: Sequence[PodRequest], capacity_milli: int, seed: int, tune: float
) -> list[PodRequest]:
    """The arrival sequence for one seed: tuned with samples, then shuffled."""
    base = sorted(pods, key=lambda p: p.name)
    rng = random.Random(seed)
    work = list(base)
    if tune > 0 and base:
        target = tune * capacity_milli
        demand = sum(p.gpu_milli_total for p in base)
        k = 0
        while demand < target:
            pick = base[rng.randrange(len(base))]
            k += 1
            work.append(replace(pick, name=f"{pick.name}-tune-{k}"))
            demand += pick.gpu_milli_total
    rng.shuffle(work)
    return work


@dataclass
class RunResult:
    seed: int
    seconds: float
    allocated_pct: list[float]  # index = arrived % of capacity (0..130)
    placed: int = 0
    failed: int = 0
    decision_seconds: list[float] = field(default_factory=list, repr=False)

    def unallocated(self, point: int) -> float:
        return 100.0 - self.allocated_pct[point]


def simulate(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodRequest],
    policy: str,
    seed: int,
    tune: float = 1.3,
    coverage: float = 0.95,
    time_decisions: bool = False,
    weights: dict[str, float] | None = None,
) -> RunResult:
    state = ClusterState(nodes)
    capacity = state.total_gpu_milli()
    if capacity == 0:
        raise ValueError("the node list has no GPUs")
    workload = build_workload(pods, capacity, seed, tune)
    engine = PlacementEngine(state, policy, seed=seed, weights=weights)
    engine.set_profile(WorkloadProfile.from_requests(workload), coverage)
    allocated_pct = [0.0] * (MAX_POINT + 1)  # point 0: the empty cluster, before any arrival
    next_point = 1
    arrived = allocated = 0
    placed = failed = 0
    timings: list[float] = []
    started = time.perf_counter()
    for k, pod in enumerate(workload):
        t0 = time.perf_counter() if time_decisions else 0.0
        decision = engine.place(pod)
        if decision is not None:
            engine.commit(decision, f"{k}:{pod.name}")
            allocated += pod.gpu_milli_total
            placed += 1
        else:
            failed += 1
        if time_decisions:
            timings.append(time.perf_counter() - t0)
        arrived += pod.gpu_milli_total
        while next_point <= MAX_POINT and arrived * 100 >= next_point * capacity:
            allocated_pct[next_point] = 100.0 * allocated / capacity
            next_point += 1
    while next_point <= MAX_POINT:  # a short trace: carry the final figure forward
        allocated_pct[next_point] = 100.0 * allocated / capacity
        next_point += 1
    return RunResult(seed, time.perf_counter() - started, allocated_pct, placed, failed, timings)


def _seed(text: str, part: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"seed {part!r} is not a whole number or a range of them; write e.g. 42-51 or 42,43"
        ) from None


def parse_seeds(spec: str) -> list[int]:
    """`42-51`, `42,43,50` or a mix; ValueError saying which part is no seed."""
    seeds: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part[1:]:
            rest, hi = part[1:].split("-", 1)  # part[0] may be a minus sign
            a, b = _seed(part[0] + rest, part), _seed(hi, part)
            if b < a:
                raise ValueError(f"seed range {part!r} is empty")
            seeds.extend(range(a, b + 1))
        else:
            seeds.append(_seed(part, part))
    if not seeds:
        raise ValueError("no seeds given")
    return seeds


def summarise(trace: str, policy: str, runs: Sequence[RunResult]) -> dict[str, object]:
    return {
        "trace": trace,
        "policy": policy,
        "runs": [
            {
                "seed": r.seed,
                "seconds": round(r.seconds, 3),
                "unallocated_gpu_pct": {str(p): round(r.unallocated(p), 4) for p in REPORT_POINTS},
            }
            for r in runs
        ],
        "median_unallocated_gpu_pct": {
            str(p): round(statistics.median(r.unallocated(p) for r in runs), 4) for p in REPORT_POINTS
        },
    }
