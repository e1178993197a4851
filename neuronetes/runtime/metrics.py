"""Prometheus metrics of the runtime's schedulers, computed at scrape time.

Each scheduler registers with one registry: the one given as `registry=`, else prometheus_client's
default ``REGISTRY`` (what ``start_http_server`` and ``make_asgi_app`` serve by default). One
collector per registry covers all its schedulers (weakly held), labelled ``scheduler``; per-task
series cover tasks not yet finished.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from neuronetes.runtime.scheduling import Scheduler

TASK_LABELS = ["scheduler", "task", "policy", "slice"]


class RuntimeCollector(Collector):
    """The figures of `stats()` for every live task of the schedulers registered with it."""

    def __init__(self) -> None:
        self.schedulers: weakref.WeakSet[Scheduler] = weakref.WeakSet()

    def collect(self) -> Iterator[Any]:
        memory = GaugeMetricFamily(
            "neuronetes_runtime_task_memory_bytes",
            "Bytes the task's memory pool charges it",
            labels=TASK_LABELS,
        )
        bandwidth = GaugeMetricFamily(
            "neuronetes_runtime_task_bandwidth_share",
            "The task's measured share of the last full pacing window",
            labels=TASK_LABELS,
        )
        tiles = CounterMetricFamily(
            "neuronetes_runtime_task_tiles", "Tiles the task has run", labels=TASK_LABELS
        )
        delays = CounterMetricFamily(
            "neuronetes_runtime_task_pacing_delays",
            "Windows in which the task was ready but held for lack of allowance",
            labels=TASK_LABELS,
        )
        evictions = CounterMetricFamily(
            "neuronetes_runtime_task_evictions",
            "Blocks of the task evicted to host memory",
            labels=TASK_LABELS,
        )
        states = GaugeMetricFamily(
            "neuronetes_runtime_tasks", "Tasks per state", labels=["scheduler", "state"]
        )
        all_tiles = CounterMetricFamily("neuronetes_runtime_tiles", "Tiles run", labels=["scheduler"])
        for sched in list(self.schedulers):
            counts: dict[str, int] = {}
            for task in sched.tasks():
                stats = sched.stats(task.id)
                counts[stats["state"]] = counts.get(stats["state"], 0) + 1
                if stats["state"] in ("finished", "failed"):
                    continue
                labels = [sched.name, task.id, task.policy, task.partition.name]
                memory.add_metric(labels, stats["memory_usage"])
                bandwidth.add_metric(labels, stats["bandwidth_usage"])
                tiles.add_metric(labels, stats["tiles_executed"])
                delays.add_metric(labels, stats["pacing_delay_count"])
                evictions.add_metric(labels, stats["eviction_count"])
            for state, count in counts.items():
                states.add_metric([sched.name, state], count)
            all_tiles.add_metric([sched.name], sched.tiles_total)
        yield from (memory, bandwidth, tiles, delays, evictions, states, all_tiles)


_collectors: weakref.WeakKeyDictionary[Any, RuntimeCollector] = weakref.WeakKeyDictionary()


def export(scheduler: Scheduler, registry: Any = None) -> RuntimeCollector:
    """Export `scheduler`'s metrics through `registry` (None: the default registry)."""
    target = REGISTRY if registry is None else registry
    collector = _collectors.get(target)
    if collector is None:
        collector = RuntimeCollector()
        target.register(collector)
        _collectors[target] = collector
    collector.schedulers.add(scheduler)
    return collector
