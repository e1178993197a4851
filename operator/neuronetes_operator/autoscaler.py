"""The autoscaling controller: acts on AgentPools' ``spec.autoscaling`` and ToolBindings' ``autoscaleOnLag``.

Every tick (``autoscaler.intervalSeconds``) it takes the next ``poolsPerTick`` pools in turn, reads
each one's metrics (`metrics_source`), asks the pool's `TokenAutoscaler` (kept in memory, rebuilt
when ``spec.autoscaling`` changes), takes the larger of that and its ToolBindings' lag rule, and
sets ``spec.replicas`` through the scale subresource. A HorizontalPodAutoscaler or KEDA ScaledObject
that targets the pool makes it passive. What it decided is in ``status.autoscaling``, in an Event
when the replicas change, and in the operator's metrics. docs/autoscaling.md, "The controller".

`PoolState.step` is the decision for one pool given what was read (pure: no API, the caller's
clock); `AutoscalerController` does the reading and the writing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from neuronetes import contracts as c
from neuronetes.api.models import DEFAULT_MAX_REPLICAS, AgentPool, Autoscaling, ToolBinding, decode
from neuronetes.autoscale import (
    Bounds,
)
from neuronetes.autoscale import lag_replicas as lag_rule
from neuronetes.autoscale.signals import METRIC_NAMES

from .autoscale_step import (
    DIGITS,
    STATUS_REFRESH_S,
    LagAsk,
    PoolState,
    Step,
    autoscaled,
    iso_time,
    live_pods,
    pod_ready,
    replica_counts,
    rotate,
)
from .metrics_source import (
    MetricsError,
    PodSample,
    PrometheusClient,
    Reading,
    pool_reading,
    prometheus_reading,
    scrape,
)
from .objects import patch_status, post_event
from .pods import LABEL_POOL
from .settings import AutoscalerSettings

__all__ = [
    "AutoscalerController",
    "AutoscalerMetrics",
    "LagAsk",
    "PoolState",
    "Step",
    "replica_counts",
    "rotate",
]

log = logging.getLogger("neuronetes_operator.autoscaler")

KEDA_RECHECK_S = 60.0
"""How long a cluster without KEDA's ScaledObject CRD is not asked again."""


# ---- the operator's metrics ----------------------------------------------------------------------


def _help(name: str) -> str:
    return next(m.help for m in c.METRICS if m.name == name)


class AutoscalerMetrics:
    """The controller's Prometheus metrics (names and help: `neuronetes.contracts.METRICS`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            c.METRIC_AUTOSCALER_DECISIONS.removesuffix("_total"),
            _help(c.METRIC_AUTOSCALER_DECISIONS),
            ("namespace", "pool", "rule"),
            registry=registry,
        )
        self.desired = Gauge(
            c.METRIC_AUTOSCALER_DESIRED,
            _help(c.METRIC_AUTOSCALER_DESIRED),
            ("namespace", "pool"),
            registry=registry,
        )
        self.scaleup_to_ready = Histogram(
            c.METRIC_SCALEUP_TO_READY,
            _help(c.METRIC_SCALEUP_TO_READY),
            ("namespace", "pool"),
            buckets=(1, 2, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600, 1200),
            registry=registry,
        )


# ---- the controller --------------------------------------------------------------------------------


class AutoscalerController:
    """Reads and writes for `PoolState.step`, one `tick` at a time (called from a thread)."""

    def __init__(
        self,
        api: Any,
        settings: AutoscalerSettings,
        metrics: AutoscalerMetrics,
        namespaces: Sequence[str] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.namespaces = tuple(namespaces)
        self.clock = clock
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.hpa = client.AutoscalingV2Api(api)
        self._pools: dict[tuple[str, str], PoolState] = {}
        self._pool_turn = 0
        self._binding_turn = 0
        self._keda_absent_until = -math.inf
        """Until when KEDA's ScaledObject CRD is taken as absent (asked again every KEDA_RECHECK_S)."""
        self._gauged: set[tuple[str, str]] = set()
        self._unreadable: dict[tuple[str, str], str] = {}
        """ToolBinding → the reason its queue was last unreadable (one Warning per change)."""
        self._binding_written: dict[tuple[str, str], tuple[dict[str, Any], float]] = {}
        self._scrapes = ThreadPoolExecutor(
            settings.scrape_concurrency, thread_name_prefix="autoscaler-scrape"
        )

    def close(self) -> None:
        self._scrapes.shutdown(wait=False, cancel_futures=True)

    # ---- listing -------------------------------------------------------------------------------

    def _list(self, plural: str) -> list[dict[str, Any]]:
        if not self.namespaces:
            return list(self.custom.list_cluster_custom_object(c.GROUP, c.VERSION, plural).get("items") or [])
        out: list[dict[str, Any]] = []
        for ns in self.namespaces:
            out += (
                self.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, ns, plural).get("items") or []
            )
        return out

    def tick(self) -> None:
        """One round: the ToolBindings' lag, then the next pools in turn."""
        now = self.clock()
        pools = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self._list("agentpools")}
        lag = self._bindings(pools, now)
        candidates = sorted(k for k, p in pools.items() if autoscaled(p) or k in lag)
        for gone in set(self._pools) - set(candidates):
            del self._pools[gone]
        for gone in self._gauged - set(candidates):
            self.metrics.desired.remove(*gone)
            self._gauged.discard(gone)
        chosen, self._pool_turn = rotate(candidates, self._pool_turn, self.settings.pools_per_tick)
        conflicts = self._conflicts({ns for ns, _ in chosen}, now)
        for key in chosen:
            try:
                self._pool(pools[key], now, lag.get(key), conflicts.get(key))
            except (ApiException, OSError, ValueError, msgspec.ValidationError) as exc:
                log.warning("autoscaling of %s/%s failed: %s", key[0], key[1], exc)

    def _conflicts(self, namespaces: Iterable[str], now: float) -> dict[tuple[str, str], str]:
        """Pools targeted by another autoscaler: pool → "HorizontalPodAutoscaler ns/name"."""
        out: dict[tuple[str, str], str] = {}
        for ns in sorted(namespaces):
            for hpa in self.hpa.list_namespaced_horizontal_pod_autoscaler(ns).items:
                ref = hpa.spec.scale_target_ref
                if ref.kind == "AgentPool" and (ref.api_version or "").split("/")[0] == c.GROUP:
                    out.setdefault((ns, ref.name), f"HorizontalPodAutoscaler {ns}/{hpa.metadata.name}")
            if now < self._keda_absent_until:
                continue
            try:
                found = self.custom.list_namespaced_custom_object("keda.sh", "v1alpha1", ns, "scaledobjects")
            except ApiException as exc:
                if exc.status == 404:  # no KEDA in this cluster (yet)
                    self._keda_absent_until = now + KEDA_RECHECK_S
                    continue
                raise
            for obj in found.get("items") or []:
                ref = (obj.get("spec") or {}).get("scaleTargetRef") or {}
                if ref.get("kind") == "AgentPool":
                    out.setdefault(
                        (ns, ref.get("name", "")), f"KEDA ScaledObject {ns}/{obj['metadata']['name']}"
                    )
        return out

    def _pods(self, namespace: str, pool: str) -> list[dict[str, Any]]:
        found = self.core.list_namespaced_pod(namespace, label_selector=f"{LABEL_POOL}={pool}")
        return [self.core.api_client.sanitize_for_serialization(p) for p in found.items]

    # ---- one pool -------------------------------------------------------------------------------

    def _pool(self, obj: Mapping[str, Any], now: float, lag: LagAsk | None, conflict: str | None) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        spec = decode(obj, AgentPool).spec
        autoscaling = spec.autoscaling if spec.autoscaling is not None and spec.autoscaling.enabled else None
        state = self._pools.get(key)
        if state is None or state.spec != autoscaling:
            state = self._pools[key] = PoolState(autoscaling, self.settings.interval_seconds)
        current = spec.replicas if spec.replicas is not None else spec.min_replicas
        bounds = Bounds(spec.min_replicas, max(spec.min_replicas, spec.max_replicas or DEFAULT_MAX_REPLICAS))
        pods = self._pods(*key)
        reading = None
        if autoscaling is not None and conflict is None:
            reading = self._read(state, autoscaling, key[0], pods, now)
        step = state.step(
            now=now,
            current=current,
            pods=pods,
            bounds=bounds,
            reading=reading,
            lag=lag,
            conflict=conflict,
            conditions=(obj.get("status") or {}).get("conditions") or [],
            generation=int(meta.get("generation") or 0),
        )
        if step.desired != current:
            self.custom.patch_namespaced_custom_object_scale(
                c.GROUP, c.VERSION, key[0], "agentpools", key[1], {"spec": {"replicas": step.desired}}
            )
        body: dict[str, Any] = {}
        if step.status is not None:
            body["autoscaling"] = step.status
        if step.conditions is not None:
            body["conditions"] = step.conditions
        if body:
            patch_status(self.custom, "agentpools", meta, {"status": body})
        for etype, reason, message in step.events:
            post_event(self.core, obj, etype, reason, message)
        self.metrics.decisions.labels(*key, step.rule).inc()
        self.metrics.desired.labels(*key).set(step.desired)
        self._gauged.add(key)
        for seconds in step.ready_after_s:
            self.metrics.scaleup_to_ready.labels(*key).observe(seconds)

    def _read(
        self,
        state: PoolState,
        spec: Autoscaling,
        namespace: str,
        pods: Sequence[Mapping[str, Any]],
        now: float,
    ) -> Reading:
        source = spec.metrics
        live = live_pods(pods)
        if source.source == "prometheus":
            url = source.prometheus_url or self.settings.prometheus_url
            if url is None:
                return Reading(
                    dict.fromkeys(METRIC_NAMES),
                    METRIC_NAMES,
                    "source prometheus without prometheusURL (nor the operator's autoscaler.prometheusURL)",
                )
            prom = PrometheusClient(url, self.settings.http_timeout_seconds)
            names = [p["metadata"]["name"] for p in live]
            return prometheus_reading(prom, source, namespace, names, self.settings.rate_window_seconds, now)
        targets = {
            p["metadata"]["name"]: (
                f"http://{p['status']['podIP']}:{source.port}{source.path}",
                pod_ready(p),
            )
            for p in live
            if (p.get("status") or {}).get("podIP")
        }
        futures = {
            name: self._scrapes.submit(
                scrape,
                url,
                self.settings.http_timeout_seconds,
                self.settings.max_scrape_bytes,
                source.queries,
            )
            for name, (url, _) in targets.items()
        }
        samples: dict[str, PodSample] = {}
        failed: dict[str, str] = {}
        for name, future in futures.items():
            try:
                samples[name] = future.result()
            except MetricsError as exc:
                if targets[name][1]:  # a starting engine need not answer yet
                    failed[name] = str(exc)
        ready_without_ip = [
            p["metadata"]["name"] for p in live if pod_ready(p) and p["metadata"]["name"] not in targets
        ]
        for name in ready_without_ip:
            failed[name] = "no pod IP"
        rates = state.counters.rates(now, samples)
        return pool_reading(samples, failed, rates, source.queries)

    # ---- ToolBindings ---------------------------------------------------------------------------

    def _bindings(
        self, pools: Mapping[tuple[str, str], Mapping[str, Any]], now: float
    ) -> dict[tuple[str, str], LagAsk]:
        """The lag rule of the next ToolBindings in turn: pool → the largest ask."""
        bindings = sorted(
            self._list("toolbindings"), key=lambda b: (b["metadata"]["namespace"], b["metadata"]["name"])
        )
        chosen, self._binding_turn = rotate(bindings, self._binding_turn, self.settings.bindings_per_tick)
        out: dict[tuple[str, str], LagAsk] = {}
        for obj in chosen:
            try:
                ask = self._binding(obj, pools, now)
            except (ApiException, msgspec.ValidationError, ValueError) as exc:
                log.warning(
                    "ToolBinding %s/%s: %s", obj["metadata"]["namespace"], obj["metadata"]["name"], exc
                )
                continue
            if ask is not None:
                key, lag = ask
                if key not in out or lag.desired > out[key].desired:
                    out[key] = lag
        return out

    def _binding(
        self, obj: Mapping[str, Any], pools: Mapping[tuple[str, str], Mapping[str, Any]], now: float
    ) -> tuple[tuple[str, str], LagAsk] | None:
        spec = decode(obj, ToolBinding).spec
        cfg, meta = spec.queue_config, obj["metadata"]
        if not cfg.autoscale_on_lag or spec.pool_ref is None or spec.queue is None:
            return None
        key = (meta["namespace"], spec.pool_ref.name)
        pool = pools.get(key)
        if pool is None:
            return None
        if spec.queue.type != "prometheus":
            return None  # brokers are read through their exporters: docs/autoscaling.md
        url = spec.queue.address or self.settings.prometheus_url
        binding = (meta["namespace"], meta["name"])
        try:
            if url is None:
                raise MetricsError(
                    "no Prometheus: spec.queue.address and the operator's autoscaler.prometheusURL are unset"
                )
            depth = PrometheusClient(url, self.settings.http_timeout_seconds).scalar(spec.queue.name)
            if depth is None:
                raise MetricsError(f"the query {spec.queue.name!r} matched no series")
        except MetricsError as exc:
            why = DIGITS.sub("N", str(exc))
            if self._unreadable.get(binding) != why:
                self._unreadable[binding] = why
                post_event(self.core, obj, "Warning", "QueueUnreadable", f"queue depth not read: {exc}")
                patch_status(self.custom, "toolbindings", meta, {"status": {"queueDepth": None, "lag": None}})
            return None
        self._unreadable.pop(binding, None)
        pool_spec = decode(pool, AgentPool).spec
        current = pool_spec.replicas if pool_spec.replicas is not None else pool_spec.min_replicas
        bounds = Bounds(
            pool_spec.min_replicas,
            max(pool_spec.min_replicas, pool_spec.max_replicas or DEFAULT_MAX_REPLICAS),
        )
        threshold = cfg.max_lag_threshold if cfg.max_lag_threshold is not None else 0
        desired, lag = lag_rule(max(depth, 0.0), current, cfg.prefetch, cfg.throughput, threshold, bounds)
        status: dict[str, Any] = {
            "queueDepth": round(max(depth, 0.0)),
            "lag": round(lag),
            "desiredReplicas": desired,
        }
        written = self._binding_written.get(binding)
        # Written when it changes, else at most every STATUS_REFRESH_S (each write wakes the
        # binding's reconcile).
        if written is None or written[0] != status or now - written[1] >= STATUS_REFRESH_S:
            self._binding_written[binding] = (dict(status), now)
            status["lastPollTime"] = iso_time(now)
            if desired > current:
                status["lastScaleTime"] = iso_time(now)
            patch_status(self.custom, "toolbindings", meta, {"status": status})
        return key, LagAsk(desired=desired, lag=lag, binding=meta["name"])
