"""The extender's Prometheus metrics (names and help from `neuronetes.contracts`).

kube-scheduler has no per-extender latency metric, so the extender exports its own. Each app
gets its own `CollectorRegistry` (several apps in one process — tests — never collide).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from neuronetes import contracts as c

from .cache import RESOURCES, CacheStats
from .demand import Demand, PendingGangClock
from .events import EventRecorder
from .watch import WatchHealth

__all__ = ["CONTENT_TYPE_LATEST", "LATENCY_BUCKETS", "ExtenderMetrics"]

LATENCY_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Sub-millisecond resolution where decisions live; up to kube-scheduler's 5 s httpTimeout."""


def _help(name: str) -> str:
    return next(m.help for m in c.METRICS if m.name == name)


class ExtenderMetrics:
    def __init__(self, stats: Callable[[], CacheStats], registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.latency = Histogram(
            c.METRIC_SCHEDULER_LATENCY,
            _help(c.METRIC_SCHEDULER_LATENCY),
            ("verb", "result"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # prometheus-client appends `_total` to counter names: give it the stem.
        self.attempts = Counter(
            c.METRIC_SCHEDULER_ATTEMPTS.removesuffix("_total"), _help(c.METRIC_SCHEDULER_ATTEMPTS), registry=r
        )
        self.success = Counter(
            c.METRIC_SCHEDULER_SUCCESS.removesuffix("_total"), _help(c.METRIC_SCHEDULER_SUCCESS), registry=r
        )
        self.topology_violations = Counter(
            c.METRIC_TOPOLOGY_VIOLATIONS.removesuffix("_total"),
            _help(c.METRIC_TOPOLOGY_VIOLATIONS),
            ("locality",),
            registry=r,
        )
        self.requests = Counter(
            c.METRIC_SCHEDULER_REQUESTS.removesuffix("_total"),
            _help(c.METRIC_SCHEDULER_REQUESTS),
            ("verb", "code"),
            registry=r,
        )
        self.api_latency = Histogram(
            c.METRIC_API_LATENCY, _help(c.METRIC_API_LATENCY), ("call",), buckets=LATENCY_BUCKETS, registry=r
        )
        self._stats = stats
        self._snapshot: CacheStats | None = None
        self._attached = False

        def gauge(name: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, _help(name), labels, registry=r)

        gauge(c.METRIC_SCHEDULER_PENDING).set_function(lambda: self._stat().pending_gpu_pods)
        gauge(c.METRIC_CACHE_NODES).set_function(lambda: self._stat().nodes)
        gauge(c.METRIC_CACHE_GPUS).set_function(lambda: self._stat().gpus)
        gauge(c.METRIC_CACHE_PODS).set_function(lambda: self._stat().bound_pods)
        gauge(c.METRIC_CACHE_HOLDS).set_function(lambda: self._stat().holds)
        gauge(c.METRIC_CACHE_UNACCOUNTED).set_function(lambda: self._stat().unaccounted_pods)
        sync_age = gauge(c.METRIC_CACHE_SYNC_AGE, ("resource",))
        for resource in RESOURCES:
            sync_age.labels(resource).set_function(
                lambda resource=resource: self._stat().sync_age_seconds.get(resource, float("inf"))  # type: ignore[misc]
            )

    def attach(
        self, health: WatchHealth, events: EventRecorder, demand: Callable[[], Demand] | None = None
    ) -> None:
        """Export the watches' health, the Event writer's counts and, given `demand` (the cache's
        `demand`), fragmentation and pending gangs (once per registry)."""
        if not self._attached:
            self.registry.register(_EdgeCollector(health, events))
            if demand is not None:
                self.registry.register(_DemandCollector(demand))
            self._attached = True

    def _stat(self) -> CacheStats:
        # One cache snapshot per scrape: `render` takes it, the gauges' callbacks read it.
        return self._snapshot if self._snapshot is not None else self._stats()

    def observe(self, verb: str, result: str, seconds: float) -> None:
        self.latency.labels(verb, result).observe(seconds)

    def render(self) -> bytes:
        self._snapshot = self._stats()
        try:
            return generate_latest(self.registry)
        finally:
            self._snapshot = None

    def serve(self, host: str, port: int) -> int:
        """Serve only `GET /metrics` on `host`:`port` (0: a free port) in a daemon thread; returns the port.

        The verbs' port stays on loopback (whoever reaches it could bind pods), so Prometheus in the
        cluster scrapes this read-only listener instead (`--metrics-bind-address`).
        """
        scrape = CollectorRegistry(auto_describe=False)
        scrape.register(_SnapshotCollector(self))
        server, _ = start_http_server(port, addr=host, registry=scrape)
        return int(server.server_port)

    def collect_snapshot(self) -> Iterator[Metric]:
        """Every metric of the registry, the cache's gauges read from one snapshot (as `render`)."""
        self._snapshot = self._stats()
        try:
            yield from self.registry.collect()
        finally:
            self._snapshot = None


class _SnapshotCollector(Collector):
    """The extender's registry as one collector, for the metrics-only listener."""

    def __init__(self, metrics: ExtenderMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self.metrics.collect_snapshot()


class _EdgeCollector(Collector):
    """Watch health and Event counts, read at scrape time."""

    def __init__(self, health: WatchHealth, events: EventRecorder) -> None:
        self.health = health
        self.events = events

    def collect(self) -> Iterator[Metric]:
        broken = GaugeMetricFamily(c.METRIC_WATCH_BROKEN, _help(c.METRIC_WATCH_BROKEN), labels=("resource",))
        for resource, seconds in sorted(self.health.broken_for_each().items()):
            broken.add_metric((resource,), seconds)
        yield broken
        name = c.METRIC_EVENTS.removesuffix("_total")
        events = CounterMetricFamily(name, _help(c.METRIC_EVENTS), labels=("result",))
        for result, count in (
            ("posted", self.events.posted),
            ("failed", self.events.failed),
            ("dropped", self.events.dropped),
        ):
            events.add_metric((result,), count)
        yield events


class _DemandCollector(Collector):
    """GPU allocation, fragmentation and pending gangs, measured at scrape time (`demand.py`)."""

    def __init__(self, demand: Callable[[], Demand]) -> None:
        self.demand = demand
        self.gangs = PendingGangClock(time.monotonic)

    def collect(self) -> Iterator[Metric]:
        now = self.demand()
        past = self.gangs.past_timeout(now.pending_gangs)
        for name, value in (
            (c.METRIC_GPUS_ALLOCATED, now.gpus_allocated),
            (c.METRIC_GPUS_UNALLOCATED, now.gpus_unallocated),
            (c.METRIC_GPUS_FRAGMENTED, now.gpus_fragmented),
            (c.METRIC_GANGS_PENDING, float(len(now.pending_gangs))),
            (c.METRIC_GANGS_PAST_TIMEOUT, float(past)),
        ):
            yield GaugeMetricFamily(name, _help(name), value=value)
