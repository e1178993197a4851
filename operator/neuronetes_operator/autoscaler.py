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
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from neuronetes import contracts as c
from neuronetes.api.models import DEFAULT_MAX_REPLICAS, AgentPool, Autoscaling, ToolBinding, decode
from neuronetes.autoscale import (
    AutoscaleSettings,
    Bounds,
    Decision,
    PoolSignals,
    ReplicaCounts,
    TokenAutoscaler,
)
from neuronetes.autoscale import lag_replicas as lag_rule
from neuronetes.autoscale.signals import METRIC_NAMES

from .metrics_source import (
    FIRST_SCRAPE,
    MetricsError,
    PodCounters,
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
from .status import AUTOSCALER_CONDITIONS

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

CONDITION_CONFLICT, CONDITION_STALE = AUTOSCALER_CONDITIONS
STATUS_REFRESH_S = 30.0
"""status.autoscaling is written when the decision changes, else at most this often (each write
wakes the pool's reconcile)."""
KEDA_RECHECK_S = 60.0
"""How long a cluster without KEDA's ScaledObject CRD is not asked again."""
_DIGITS = re.compile(r"\d+(\.\d+)?")


# ---- pure --------------------------------------------------------------------------------------------


def rotate(items: Sequence[Any], start: int, count: int) -> tuple[list[Any], int]:
    """``count`` items from ``start`` on, wrapping; and where the next turn starts. Every item is
    served once every ``ceil(len / count)`` turns whatever the order of the list."""
    if not items:
        return [], 0
    start %= len(items)
    taken = [items[(start + i) % len(items)] for i in range(min(count, len(items)))]
    return taken, (start + len(taken)) % len(items)


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(cd.get("type") == "Ready" and cd.get("status") == "True" for cd in conditions)


def _pod_unschedulable(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        cd.get("type") == "PodScheduled"
        and cd.get("status") == "False"
        and cd.get("reason") == "Unschedulable"
        for cd in conditions
    )


def live_pods(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods not terminating and not finished."""
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def replica_counts(desired: int, pods: Iterable[Mapping[str, Any]]) -> ReplicaCounts:
    """The pool's replicas by state (``ReplicaCounts``): ready, starting, unschedulable."""
    ready = starting = unschedulable = 0
    for pod in live_pods(pods):
        if _pod_ready(pod):
            ready += 1
        elif _pod_unschedulable(pod):
            unschedulable += 1
        else:
            starting += 1
    return ReplicaCounts(desired=desired, ready=ready, starting=starting, unschedulable=unschedulable)


@dataclass(frozen=True, slots=True)
class LagAsk:
    """What a pool's ToolBindings ask for: the most replicas any of them wants, and which one."""

    desired: int
    lag: float
    binding: str


@dataclass(frozen=True, slots=True)
class Step:
    """What one tick decided for one pool and what to write."""

    desired: int
    current: int
    rule: str
    decision: Decision | None
    status: dict[str, Any] | None
    """status.autoscaling to write (None: nothing changed enough to write)."""
    conditions: list[dict[str, Any]] | None
    """status.conditions to write (None: unchanged)."""
    events: list[tuple[str, str, str]]
    """(type, reason, message) Events to post."""
    ready_after_s: list[float]
    """Seconds from a scale-up decision to its replicas Ready, for each scale-up that completed."""


def _fmt(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class PoolState:
    """One pool's memory: its `TokenAutoscaler`, counters for rates, what was last said and written."""

    spec: Autoscaling | None
    interval_s: float
    autoscaler: TokenAutoscaler | None = None
    counters: PodCounters = field(default_factory=PodCounters)
    last_written: tuple[Any, ...] | None = None
    last_written_at: float = -math.inf
    warned_stale: tuple[Any, ...] | None = None
    warned_conflict: str | None = None
    scale_up: tuple[int, float] | None = None
    """(replicas, when decided) of the scale-up waiting for its replicas to be Ready."""
    last_scale_at: float | None = None

    def __post_init__(self) -> None:
        if self.spec is not None and self.spec.enabled:
            self.autoscaler = TokenAutoscaler(AutoscaleSettings.from_spec(self.spec, self.interval_s))

    def step(
        self,
        *,
        now: float,
        current: int,
        pods: Sequence[Mapping[str, Any]],
        bounds: Bounds,
        reading: Reading | None,
        lag: LagAsk | None,
        conflict: str | None,
        conditions: Sequence[Mapping[str, Any]],
        generation: int,
    ) -> Step:
        """The pool's decision at ``now`` (wall-clock seconds) from what was read."""
        counts = replica_counts(current, pods)
        events: list[tuple[str, str, str]] = []
        ready_after = self._scale_up_done(counts, now)
        decision: Decision | None = None
        if conflict is not None:
            desired, rule = current, "hold:conflict"
            if self.warned_conflict != conflict:
                events.append(
                    (
                        "Warning",
                        CONDITION_CONFLICT,
                        f"{conflict} targets this pool: the autoscaler stays passive",
                    )
                )
        else:
            desired, rule = current, "hold"
            if self.autoscaler is not None and reading is not None:
                values = {name: reading.values.get(name) for name in METRIC_NAMES}
                signals = PoolSignals(now=now, **values, stale=reading.stale)
                decision = self.autoscaler.decide(signals, counts, bounds)
                desired, rule = decision.desired, decision.rule
            if lag is not None and lag.desired > desired:
                desired, rule = bounds.clamp(lag.desired), "toolbinding-lag"
        self.warned_conflict = conflict

        stale = () if reading is None or conflict else reading.stale
        problem = None if reading is None or conflict else reading.problem
        stale_key = (stale, _DIGITS.sub("N", problem or "")) if stale else None
        if stale_key is not None and stale_key != self.warned_stale and problem != FIRST_SCRAPE:
            events.append(
                (
                    "Warning",
                    CONDITION_STALE,
                    f"metrics {', '.join(stale)} not trusted ({problem}): no scale-down",
                )
            )
        self.warned_stale = stale_key

        inputs = dict(decision.inputs) if decision is not None else {}
        if lag is not None:
            inputs.update(lag=lag.lag, lag_replicas=float(lag.desired))
        if desired != current:
            self.last_scale_at = now
            direction = "Up" if desired > current else "Down"
            shown = ", ".join(f"{k}={_fmt(v)}" for k, v in inputs.items() if v is not None and k != "current")
            ttft = "" if decision is None else f"; expected TTFT {_fmt(decision.expected_ttft_s)}s"
            binding = f" (ToolBinding {lag.binding})" if lag is not None and rule == "toolbinding-lag" else ""
            events.append(
                (
                    "Normal",
                    f"Autoscaled{direction}",
                    f"{current} -> {desired} replicas by {rule}{binding}{ttft}: {shown}",
                )
            )
            if desired > current:
                since = self.scale_up[1] if self.scale_up is not None else now
                self.scale_up = (desired, since)
            else:
                self.scale_up = None

        key = (desired, current, rule, stale, conflict, problem is None)
        status: dict[str, Any] | None = None
        if key != self.last_written or now - self.last_written_at >= STATUS_REFRESH_S:
            self.last_written, self.last_written_at = key, now
            status = {
                "currentReplicas": current,
                "desiredReplicas": desired,
                "rule": rule,
                "expectedTTFTSeconds": None
                if decision is None or decision.expected_ttft_s is None
                else round(decision.expected_ttft_s, 3),
                "inputs": {k: round(v, 4) for k, v in inputs.items() if v is not None and math.isfinite(v)}
                or None,
                "staleMetrics": list(stale) or None,
                "message": problem,
                "conflict": conflict,
                "lastDecisionTime": _iso(now),
                "nextDecisionTime": _iso(now + self.interval_s),
                "lastScaleTime": None if self.last_scale_at is None else _iso(self.last_scale_at),
            }
        return Step(
            desired=desired,
            current=current,
            rule=rule,
            decision=decision,
            status=status,
            # The first scrape's missing rates are not worth a condition that the next tick clears.
            conditions=_own_conditions(
                conditions, conflict, () if problem == FIRST_SCRAPE else stale, problem, generation, now
            ),
            events=events,
            ready_after_s=ready_after,
        )

    def _scale_up_done(self, counts: ReplicaCounts, now: float) -> list[float]:
        """The scale-up whose replicas are all Ready now: seconds since its decision (the time is
        this tick's, so it is late by at most one interval)."""
        if self.scale_up is None or counts.ready < self.scale_up[0]:
            return []
        since = self.scale_up[1]
        self.scale_up = None
        return [max(0.0, now - since)]


def _own_conditions(
    old: Sequence[Mapping[str, Any]],
    conflict: str | None,
    stale: Sequence[str],
    problem: str | None,
    generation: int,
    now: float,
) -> list[dict[str, Any]] | None:
    """The pool's conditions with this controller's set as they are now; None when nothing changes."""
    wanted: dict[str, tuple[str, str]] = {}
    if conflict is not None:
        wanted[CONDITION_CONFLICT] = (
            "PassiveForOtherAutoscaler",
            f"{conflict} targets this pool: no scaling by NeuroNetes",
        )
    if stale:
        wanted[CONDITION_STALE] = (
            "NoScaleDown",
            f"{', '.join(stale)}: {problem or 'missing'}; scale-down held",
        )
    current = {cd.get("type"): cd for cd in old if cd.get("type") in AUTOSCALER_CONDITIONS}
    same = set(current) == set(wanted) and all(
        current[t].get("reason") == r
        and _DIGITS.sub("N", current[t].get("message") or "") == _DIGITS.sub("N", m)
        for t, (r, m) in wanted.items()
    )
    if same:
        return None
    kept = [dict(cd) for cd in old if cd.get("type") not in AUTOSCALER_CONDITIONS]
    for kind, (reason, message) in wanted.items():
        previous = current.get(kind)
        kept.append(
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message[:1024],
                "observedGeneration": generation,
                "lastTransitionTime": (previous or {}).get("lastTransitionTime") or _iso(now),
            }
        )
    return kept


def _autoscaled(pool: Mapping[str, Any]) -> bool:
    """Whether the pool's spec asks for autoscaling (``enabled`` defaults to true in the block)."""
    block = (pool.get("spec") or {}).get("autoscaling")
    return isinstance(block, Mapping) and block.get("enabled", True) is not False


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
        candidates = sorted(k for k, p in pools.items() if _autoscaled(p) or k in lag)
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
                _pod_ready(p),
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
            p["metadata"]["name"] for p in live if _pod_ready(p) and p["metadata"]["name"] not in targets
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
            why = _DIGITS.sub("N", str(exc))
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
            status["lastPollTime"] = _iso(now)
            if desired > current:
                status["lastScaleTime"] = _iso(now)
            patch_status(self.custom, "toolbindings", meta, {"status": status})
        return key, LagAsk(desired=desired, lag=lag, binding=meta["name"])
