"""Bind latency at a steady arrival rate: the phase `e2e_throughput.py` runs after each backlog.

A backlog drain measures throughput: kube-scheduler sends binds as fast as it decides, faster
than a small API server answers them, so every bind waits in a queue and its latency says how
long the queue was, not what a bind costs. This phase measures what a user of a busy cluster
sees instead: ``--steady-pods`` pods created one by one at ``--steady-rate`` pods/s (each at its
scheduled instant, from a few threads so one slow create does not delay the next) while
kube-scheduler runs, with or without the extender. The phase starts once the cluster is quiet
(its processes and the extender back to the CPU they used at rest before the backlog, plus 0.15:
kwok has marked the backlog Running and the extender has posted its queued Events), as a busy
cluster's steady state is, not in the aftermath of a burst. Per phase it reports

- ``create_to_bound_ms``: from the start of each pod's create request to the moment a watch
  first sees its ``spec.nodeName`` (exact p50/p99/max over the pods, not a histogram);
- ``bind_ms``: with the extender, its bind handler (its own histogram, the Binding POST
  included) and its Binding POST alone; without it, kube-scheduler's own Bind extension point;
- ``apiserver_binding_ms``: the API server's own ``POST pods/binding`` latency in the phase;
- the achieved arrival rate (a loaded client may fall behind the schedule; it is printed).

Histograms are the difference of two scrapes around the phase, so earlier runs do not count.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kube_bench import (
    Api,
    Hist,
    binding_latency_ms,
    binding_latency_text,
    default_binder,
    histogram_deltas,
    log,
    pod_manifest,
    scheduler_metrics,
    scrape,
    wait_quiet,
    watching,
)

from neuronetes import contracts as c
from neuronetes.devcluster import DevCluster

CREATE_WORKERS = 4  # creates in flight at once: enough that one slow create does not hold the pace


def exact_ms(samples: Sequence[float]) -> dict[str, Any]:
    """count, p50, p99 and max of `samples` (seconds) in ms, by rank (nearest-rank quantiles)."""
    if not samples:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(samples)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000

    return {
        "count": len(ordered),
        "p50": round(rank(0.5), 2),
        "p99": round(rank(0.99), 2),
        "max": round(ordered[-1] * 1000, 2),
    }


def run_steady(
    dev: DevCluster,
    api: Api,
    *,
    label: str,
    namespace: str,
    count: int,
    rate: float,
    gpus: int,
    extender_url: str | None,
    extra: dict[str, int],
    idle: float,
    timeout: float,
) -> dict[str, Any]:
    """Create `count` pods at `rate` pods/s in `namespace` while kube-scheduler runs; the figures
    of the module docstring."""
    waited, cores = wait_quiet(dev, extra, idle)
    log(
        f"{label}, steady: namespace {namespace}, {count} pods at {rate:g} pods/s "
        f"(after {waited:.0f} s for the cluster to quieten: {cores:.2f} CPUs in use, {idle:.2f} at rest)"
    )
    api.call(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    path = f"/api/v1/namespaces/{namespace}/pods"
    bodies = {
        f"s-{k:05d}": json.dumps(pod_manifest(f"s-{k:05d}", namespace, gpus)).encode() for k in range(count)
    }
    created_at: dict[str, float] = {}
    lock = threading.Lock()
    ext_before = scrape(f"{extender_url}/metrics") if extender_url else None
    sched_before = None if extender_url else scheduler_metrics(dev, api.token)
    api_before = binding_latency_text(api)

    def create(name: str, due: float) -> None:
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        started = time.monotonic()
        with lock:
            created_at[name] = started
        status, data = api.request("POST", path, bodies[name])
        if status != 201:
            raise RuntimeError(f"creating {name}: HTTP {status}: {data[:300].decode(errors='replace')}")

    with watching(api, namespace, count) as watch:
        t0 = time.monotonic() + 0.2
        with ThreadPoolExecutor(CREATE_WORKERS) as pool:
            for _ in pool.map(create, bodies, [t0 + k / rate for k in range(count)]):
                pass
        created_s = max(created_at.values()) - min(created_at.values())
        if not watch.wait(timeout):
            raise RuntimeError(
                f"{label}, steady: only {len(watch.bound_at)} of {count} pods bound after {timeout:.0f} s"
            )
    api_after = binding_latency_text(api)
    latencies = [watch.bound_at[name] - created_at[name] for name in bodies]
    out: dict[str, Any] = {
        "pods": count,
        "rate_asked": rate,
        "quiet_after_s": round(waited, 1),
        "rate_achieved": round((count - 1) / created_s, 2) if created_s > 0 else None,
        "create_to_bound_ms": exact_ms(latencies),
        "apiserver_binding_ms": binding_latency_ms(api_before, api_after),
    }
    if extender_url and ext_before is not None:
        ext_after = scrape(f"{extender_url}/metrics")
        verbs = histogram_deltas(ext_before, ext_after, c.METRIC_SCHEDULER_LATENCY, "verb")
        calls = histogram_deltas(ext_before, ext_after, c.METRIC_API_LATENCY, "call")
        out["bind_ms"] = verbs.get("bind", Hist()).summary_ms()
        out["binding_post_ms"] = calls.get("binding", Hist()).summary_ms()
    else:
        binds = default_binder(scheduler_metrics(dev, api.token)).minus(default_binder(sched_before))
        out["bind_ms"] = binds.summary_ms()
    c2b = out["create_to_bound_ms"]
    log(
        f"{label}, steady: {out['rate_achieved']} pods/s achieved; create→bound p50 {c2b['p50']} "
        f"p99 {c2b['p99']} ms; bind p99 {out['bind_ms'].get('p99')} ms"
    )
    return out
