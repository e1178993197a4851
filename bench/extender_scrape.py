"""Cost of one scrape of the extender's /metrics, and how long it holds the GPU cache's lock.

The fragmentation and pending-gang gauges (`neuronetes_extender.demand`) are measured at scrape time: one
pass over the pods and a few array copies under the cache's lock, then NumPy per distinct
pending shape outside it. For each size (N 8-GPU nodes, P pending GPU pods of mixed shapes, no
API server: the cache is filled through its own ``replace_nodes``/``replace_pods``) this prints
the median of a full ``/metrics`` rendering and of the part that holds the lock (the decisions
wait for it), as one JSON object.

    .venv/bin/python bench/extender_scrape.py [--sizes 1000x1000,5000x10000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from neuronetes import contracts as c
from neuronetes.profiles import PROFILES, node_manifest
from neuronetes_extender.cache import GpuCache
from neuronetes_extender.demand import take_inputs
from neuronetes_extender.events import EventRecorder
from neuronetes_extender.metrics import ExtenderMetrics
from neuronetes_extender.watch import WatchHealth
from neuronetes_extender.wire import Node, Pod

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pod_builder import manifest, served

# whole GPUs, or (compute %, memory MiB) of one shared GPU
SHAPES: tuple[dict[str, int], ...] = (
    {c.RESOURCE_GPU: 1},
    {c.RESOURCE_GPU: 2},
    {c.RESOURCE_GPU: 8},
    {c.RESOURCE_GPU_COMPUTE: 25, c.RESOURCE_GPU_MEMORY: 8192},
    {c.RESOURCE_GPU_COMPUTE: 50, c.RESOURCE_GPU_MEMORY: 20480},
)


def filled_cache(nodes: int, pending: int) -> GpuCache:
    cache = GpuCache()
    profile = PROFILES["dgx-a100-80gb"]
    cache.replace_nodes(
        [msgspec.convert(node_manifest(profile.node_spec(f"n{i}")), Node) for i in range(nodes)]
    )
    pods = [served(manifest(f"p{i}", SHAPES[i % len(SHAPES)])) for i in range(pending)]
    cache.replace_pods([msgspec.convert(p, Pod) for p in pods])
    cache.mark_synced("nodes")
    cache.mark_synced("pods")
    return cache


def median_ms(fn: Any, rounds: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 3)


def measure(nodes: int, pending: int, rounds: int) -> dict[str, Any]:
    cache = filled_cache(nodes, pending)
    metrics = ExtenderMetrics(cache.stats)
    metrics.attach(WatchHealth(), EventRecorder(None), cache.demand)
    settings = cache.settings.get()

    def locked_part() -> None:
        with cache._lock:  # what `GpuCache.demand` does under the lock
            cache._ensure()
            take_inputs(cache._books.snap.state, cache._books.store.pods.values(), settings.gang_ttl_seconds)

    return {
        "nodes": nodes,
        "pending_pods": pending,
        "scrape_ms_p50": median_ms(metrics.render, rounds),
        "demand_ms_p50": median_ms(cache.demand, rounds),
        "demand_lock_held_ms_p50": median_ms(locked_part, rounds),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000x1000,5000x10000", help="NODESxPENDING, comma-separated")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    print(json.dumps({"scrapes": [measure(n, p, args.rounds) for n, p in sizes]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
