"""Drive one workload through the pool under one policy, and summarise what it cost and served."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from .policies import Policy, PoolState
from .server import Pool, Request, ServerModel, Snapshot
from .workloads import Workload

REVERSAL_WINDOW_S = 300.0  # a change against the previous one's direction within this is a reversal


@dataclass(slots=True)
class Run:
    policy: str
    workload: str
    requests: list[Request]
    end: float
    replica_seconds: float  # from each replica's creation to its stop
    replica_integral: float  # the same, as the sum over ticks of the replicas holding a GPU
    events: list[tuple[float, int, int]] = field(default_factory=list)  # (time, from, to) of spec.replicas
    timeline: list[tuple[float, int, int]] = field(
        default_factory=list
    )  # (time, spec.replicas, holding a GPU)
    rules: dict[str, int] = field(default_factory=dict)


def simulate(
    workload: Workload,
    policy: Policy,
    model: ServerModel,
    *,
    initial_replicas: int,
    min_replicas: int,
    max_replicas: int,
    dt: float = 0.1,
    scrape_s: float = 5.0,
    drain_limit_s: float = 3600.0,
    sample_every_s: float = 15.0,
) -> Run:
    """Ticks of `dt` until the workload has ended and every request is finished (or `drain_limit_s`
    after its end). The policy sees the latest scrape, taken every `scrape_s`."""
    requests = [Request(r.rid, r.arrival, r.prompt, r.output) for r in workload.requests]
    pool = Pool.warm(model, initial_replicas)
    done: list[Request] = []
    snapshot: Snapshot | None = None
    events: list[tuple[float, int, int]] = []
    timeline: list[tuple[float, int, int]] = []
    integral = 0.0
    prime = getattr(policy, "prime", None)
    if prime is not None:
        prime(0.0, initial_replicas)
    tick, cursor, next_scrape, next_sample = 0, 0, 0.0, 0.0
    while True:
        now = tick * dt
        if now >= workload.duration_s and (
            len(done) == len(requests) or now >= workload.duration_s + drain_limit_s
        ):
            break
        if now >= next_scrape:
            snapshot = pool.scrape(now)
            next_scrape += scrape_s
        desired, ready, starting = pool.counts(now)
        wanted = policy.decide(now, snapshot, PoolState(desired, ready, starting))
        if wanted is not None:
            wanted = min(max(wanted, min_replicas), max_replicas)
            if wanted != desired:
                pool.scale_to(wanted, now)
                events.append((now, desired, wanted))
        alive = pool.alive(now)
        if now >= next_sample:
            timeline.append((now, pool.counts(now)[0], alive))
            next_sample += sample_every_s
        integral += alive * dt
        start = cursor
        while cursor < len(requests) and requests[cursor].arrival <= now:
            cursor += 1
        pool.step(now, dt, requests[start:cursor], done)
        tick += 1
    end = tick * dt
    rules = dict(getattr(policy, "rules", {}))
    return Run(
        policy.name,
        workload.name,
        requests,
        end,
        pool.replica_seconds(end),
        integral,
        events,
        timeline,
        rules,
    )


def reversals(events: list[tuple[float, int, int]], window_s: float = REVERSAL_WINDOW_S) -> int:
    """Changes of spec.replicas against the direction of the previous change, within `window_s` of it."""
    count = 0
    for (t0, a0, b0), (t1, a1, b1) in pairwise(events):
        if (b0 - a0) * (b1 - a1) < 0 and t1 - t0 <= window_s:
            count += 1
    return count


def summarise(run: Run, slo_ttft_s: float) -> dict[str, Any]:
    served = [r for r in run.requests if r.served]
    ttft = np.array([r.ttft for r in served]) if served else np.array([np.nan])
    p50, p95, p99 = (float(np.percentile(ttft, q)) for q in (50, 95, 99))
    peak = max((alive for _, _, alive in run.timeline), default=0)
    return {
        "policy": run.policy,
        "workload": run.workload,
        "requests": len(run.requests),
        "served": len(served),
        "ttft_p50_s": p50,
        "ttft_p95_s": p95,
        "ttft_p99_s": p99,
        "slo_attainment": sum(1 for r in served if r.ttft <= slo_ttft_s) / len(run.requests)
        if run.requests
        else 1.0,
        "replica_seconds": run.replica_seconds,
        "mean_replicas": run.replica_seconds / run.end if run.end else 0.0,
        "peak_replicas": peak,
        "scale_events": len(run.events),
        "reversals": reversals(run.events),
        "end_s": run.end,
        "rules": run.rules,
        "events": [list(e) for e in run.events],
        "timeline": [list(t) for t in run.timeline],
    }


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Ours against the baseline with the highest attainment (ties: fewer replica-seconds)."""
    ours = next((r for r in rows if r["policy"] == "ours"), None)
    baselines = [r for r in rows if r["policy"] != "ours"]
    if ours is None or not baselines:
        return None
    best = max(baselines, key=lambda r: (r["slo_attainment"], -r["replica_seconds"]))
    share = ours["replica_seconds"] / best["replica_seconds"]
    return {
        "workload": ours["workload"],
        "best_baseline": best["policy"],
        "attainment_ours": ours["slo_attainment"],
        "attainment_best": best["slo_attainment"],
        "attainment_met": ours["slo_attainment"] >= best["slo_attainment"],
        "replica_seconds_share": share,
        "replica_seconds_met": share <= 0.85,
        "reversals_ours": ours["reversals"],
        "reversals_met": ours["reversals"] == 0,
    }
