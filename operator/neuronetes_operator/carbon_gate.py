"""The carbon gate-release controller: removes the ``neuronetes.io/carbon`` scheduling gate.

Every tick (``carbon.intervalSeconds``) it reads the intensity source when its refresh is due
(``carbon.source``; `neuronetes.carbon.intensity`), lists the pool pods that still carry the gate,
and asks `neuronetes.carbon.release.release_reason` for each one with its pool's policy. A pod to
release gets a JSON patch that removes the gate (tested first, so a concurrent change is not undone:
a pod's scheduling gates may only be removed after creation, never added), its pool an Event
``CarbonGateReleased`` saying why (a Warning when the source is stale: fail open), and the pool's
``status.carbon`` the counts, the intensity read and the location-based gCO2 estimate. A pod whose
pool no longer time-shifts (or is gone) is released with reason ``disabled``. A source that cannot
be read or answers garbage is one line in ``status.carbon.message`` and the log, never a crash.
docs/carbon.md, "The controller".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from neuronetes import contracts as c
from neuronetes.carbon.intensity import (
    CarbonAwareSDKSource,
    ElectricityMapsSource,
    FileSource,
    IntensityError,
    IntensityReading,
    IntensitySource,
    WattTimeSource,
    read_credential,
)
from neuronetes.carbon.release import (
    ANNOTATION_DEADLINE,
    ANNOTATION_EXPECTED_RUNTIME,
    GATE,
    GatedPod,
    GatePolicy,
    Reason,
    avoided_grams,
    gpu_watts,
    mean_intensity,
    parse_duration,
    release_reason,
)

from .carbon_admission import time_shifting
from .metrics_source import MetricsError, PrometheusClient
from .objects import api_message, patch_status, post_event
from .pods import LABEL_POOL
from .settings import CarbonSettings, IntensitySourceSettings

__all__ = ["DISABLED", "CarbonGateController", "build_source", "gate_policy", "gated_pod"]

log = logging.getLogger("neuronetes_operator.carbon_gate")

DISABLED = "disabled"
"""Release reason of a pod whose pool no longer time-shifts, or is gone."""
ACCOUNTING_RUNTIME_S = 3600.0
"""The run time the gCO2 estimate counts for a pod with no expected run time (one hour)."""


def build_source(cfg: IntensitySourceSettings) -> IntensitySource:
    """The `IntensitySource` `cfg` describes; IntensityError when a field or credential is missing."""
    if cfg.type == "file":
        if not cfg.path:
            raise IntensityError("carbon.source: type file needs path")
        return FileSource(cfg.path)
    if not cfg.url or not cfg.location:
        raise IntensityError(f"carbon.source: type {cfg.type} needs url and location")
    if cfg.type == "carbon-aware-sdk":
        return CarbonAwareSDKSource(cfg.url, cfg.location, cfg.window_minutes, cfg.timeout_seconds)
    secret = read_credential(cfg.credential_file, cfg.credential_env)
    if cfg.type == "electricity-maps":
        return ElectricityMapsSource(cfg.url, cfg.location, secret, cfg.timeout_seconds)
    if not cfg.username:
        raise IntensityError("carbon.source: type watttime needs username")
    return WattTimeSource(cfg.url, cfg.location, cfg.username, secret, cfg.timeout_seconds)


def _seconds(text: Any) -> float | None:
    try:
        return parse_duration(str(text)) if text else None
    except ValueError:
        return None


def gate_policy(pool: Mapping[str, Any]) -> GatePolicy:
    """The release decision's view of a pool's ``carbonAware`` block."""
    carbon = ((pool.get("spec") or {}).get("scheduling") or {}).get("carbonAware") or {}
    shifting = carbon.get("timeShifting") or {}
    return GatePolicy(
        clean_energy_hours=shifting.get("cleanEnergyHours"),
        time_zone=str(shifting.get("timeZone") or "UTC"),
        max_carbon_intensity=carbon.get("maxCarbonIntensity"),
        max_delay_s=_seconds(shifting.get("maxDelay")) or 6 * 3600.0,
        expected_runtime_s=_seconds(shifting.get("expectedRuntime")),
    )


def gated_pod(pod: Mapping[str, Any]) -> GatedPod:
    """The release decision's view of a pod: creation time, and its deadline annotations when they
    parse (an unparsable one is ignored: the pool's maxDelay still bounds the wait)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    created = datetime.fromisoformat(str(meta["creationTimestamp"]))
    deadline = None
    raw = annotations.get(ANNOTATION_DEADLINE)
    if raw:
        try:
            deadline = datetime.fromisoformat(str(raw))
            if deadline.tzinfo is None:
                deadline = deadline.replace(tzinfo=UTC)
        except ValueError:
            deadline = None
    return GatedPod(created, deadline, _seconds(annotations.get(ANNOTATION_EXPECTED_RUNTIME)))


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for ctr in (pod.get("spec") or {}).get("containers") or []:
        limits = (ctr.get("resources") or {}).get("limits") or {}
        value = limits.get(c.RESOURCE_GPU)
        try:
            total += int(value) if value is not None else 0
        except (TypeError, ValueError):
            continue
    return total or 1  # a MIG instance or a slice: counted as one GPU's power (an upper bound)


class CarbonGateController:
    """Reads, decides and releases for every time-shifted pool, one `tick` at a time (from a thread)."""

    def __init__(self, api: Any, settings: CarbonSettings, namespaces: list[str] | None = None) -> None:
        self.settings = settings
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespaces = list(namespaces or [])
        self.reading: IntensityReading | None = None
        self.error: str | None = None
        self._next_read: datetime | None = None
        self._source: IntensitySource | None = None
        self._then: dict[str, float] = {}
        """Per gated pod (uid): the mean intensity expected over its run had it started when gated."""
        self.prometheus = (
            PrometheusClient(
                settings.prometheus_url, settings.source.timeout_seconds if settings.source else 5.0
            )
            if settings.prometheus_url
            else None
        )

    @property
    def refresh_s(self) -> float | None:
        return self.settings.source.refresh_seconds if self.settings.source else None

    def read_source(self, now: datetime) -> None:
        """Read the source if its refresh is due; a failure keeps the last reading (it ages to stale)."""
        cfg = self.settings.source
        if cfg is None or (self._next_read is not None and now < self._next_read):
            return
        self._next_read = datetime.fromtimestamp(now.timestamp() + cfg.refresh_seconds, UTC)
        try:
            if self._source is None:
                self._source = build_source(cfg)
            self.reading = self._source.read(now)
            self.error = None
        except IntensityError as exc:
            self.error = str(exc)[:1024]
            log.warning("carbon intensity not read: %s", self.error)

    def _items(self, plural: str | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        scopes: list[str | None] = [*self.namespaces] or [None]
        for ns in scopes:
            if plural is None:
                # Gated pods are Pending: the API server leaves out every running pod.
                query = {"label_selector": LABEL_POOL, "field_selector": "status.phase=Pending"}
                answer = (
                    self.core.list_namespaced_pod(ns, _preload_content=False, **query)
                    if ns
                    else self.core.list_pod_for_all_namespaces(_preload_content=False, **query)
                )
                out.extend(json.loads(answer.data).get("items") or [])
            elif ns:
                out.extend(
                    self.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, ns, plural).get("items")
                    or []
                )
            else:
                out.extend(
                    self.custom.list_cluster_custom_object(c.GROUP, c.VERSION, plural).get("items") or []
                )
        return out

    def tick(self, now: datetime | None = None) -> None:
        """One round: read the source if due, release what may start, write each pool's status."""
        now = now or datetime.now(UTC)
        self.read_source(now)
        pools = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self._items("agentpools")}
        gated: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for pod in self._items(None):
            meta = pod["metadata"]
            if _gated(pod) and not meta.get("deletionTimestamp"):
                gated.setdefault((meta["namespace"], meta["labels"][LABEL_POOL]), []).append(pod)
        for key, pods in gated.items():
            pool = pools.get(key)
            if pool is None or not time_shifting(pool):
                for pod in pods:
                    self._release(pod, pool, DISABLED, 0.0)
        for key, pool in pools.items():
            if time_shifting(pool):
                try:
                    self._pool(pool, gated.get(key, []), now)
                except ApiException as exc:
                    log.warning("carbon gate of pool %s/%s: %s", *key, api_message(exc))
        live = {p["metadata"]["uid"] for pods in gated.values() for p in pods}
        self._then = {uid: v for uid, v in self._then.items() if uid in live}

    def _watts(self, pool: Mapping[str, Any]) -> float:
        gpu_type = ((pool.get("spec") or {}).get("gpuRequirements") or {}).get("type")
        measured = None
        if self.prometheus is not None:
            selector = f'{{model_name=~"(?i).*{gpu_type}.*"}}' if gpu_type and str(gpu_type).isalnum() else ""
            try:
                measured = self.prometheus.scalar(f"avg({c.METRIC_GPU_POWER}{selector})")
            except MetricsError as exc:
                log.info("GPU power not read from Prometheus (TDP used): %s", exc)
        return gpu_watts(gpu_type, measured)

    def _pool(self, pool: Mapping[str, Any], pods: list[dict[str, Any]], now: datetime) -> None:
        policy = gate_policy(pool)
        reading = self.reading
        old = (pool.get("status") or {}).get("carbon") or {}
        released = int(old.get("releasedPods") or 0)
        avoided = float(old.get("avoidedGramsCO2") or 0.0)
        last_reason, last_time = old.get("lastReleaseReason"), old.get("lastReleaseTime")
        waiting = 0
        watts: float | None = None
        for pod in pods:
            view = gated_pod(pod)
            runtime = view.expected_runtime_s or policy.expected_runtime_s or ACCOUNTING_RUNTIME_S
            uid = pod["metadata"]["uid"]
            if reading is not None and uid not in self._then:
                self._then[uid] = mean_intensity(reading, view.created, runtime)
            reason = release_reason(view, policy, reading, now, self.refresh_s)
            if reason is None:
                waiting += 1
                continue
            grams = 0.0
            if reading is not None and uid in self._then and reason is not Reason.STALE:
                watts = watts if watts is not None else self._watts(pool)
                grams = avoided_grams(
                    _gpus(pod), watts, runtime, self._then[uid], mean_intensity(reading, now, runtime)
                )
            if self._release(pod, pool, reason, grams):
                released += 1
                avoided += grams
                last_reason, last_time = str(reason), now.isoformat()
            else:
                waiting += 1
        carbon: dict[str, Any] = {
            "gatedPods": waiting,
            "releasedPods": released,
            "avoidedGramsCO2": round(avoided, 1),
            "accounting": "location-based",
            "lastReleaseReason": last_reason,
            "lastReleaseTime": last_time,
            "message": self.error,
        }
        if reading is not None:
            carbon.update(
                intensity=round(reading.intensity, 1),
                intensitySource=reading.source,
                intensityTime=reading.at.isoformat(),
            )
        if any(old.get(k) != v for k, v in carbon.items()):
            patch_status(self.custom, "agentpools", pool["metadata"], {"status": {"carbon": carbon}})

    def _release(
        self, pod: Mapping[str, Any], pool: Mapping[str, Any] | None, reason: str, grams: float
    ) -> bool:
        """Remove the gate from `pod` (JSON patch, tested first) and say so; False when it failed."""
        meta = pod["metadata"]
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        index = next(i for i, g in enumerate(gates) if g.get("name") == GATE)
        patch = [
            {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
        ]
        try:
            self.core.patch_namespaced_pod(meta["name"], meta["namespace"], patch)
        except ApiException as exc:
            if exc.status not in (404, 409, 422):
                log.warning(
                    "carbon gate of pod %s/%s not removed: %s",
                    meta["namespace"],
                    meta["name"],
                    api_message(exc),
                )
            return False
        log.info("pod %s/%s released from the carbon gate: %s", meta["namespace"], meta["name"], reason)
        if pool is not None:
            stale = reason == Reason.STALE
            why = {
                Reason.WINDOW: "the clean-energy window is open",
                Reason.STALE: "the intensity source is stale or unreadable "
                f"({self.error or 'no recent reading'}): fail open",
                Reason.INTENSITY: "the grid intensity is at or under maxCarbonIntensity",
                Reason.DEADLINE: "its release-by time (deadline minus expected run time, or maxDelay) came",
                Reason.FORECAST: "the forecast has no cleaner period before its release-by time",
            }.get(reason, "its pool no longer time-shifts")  # type: ignore[call-overload]
            intensity = f"; intensity {self.reading.intensity:g} gCO2/kWh" if self.reading is not None else ""
            message = (
                f"pod {meta['name']} released ({reason}): {why}{intensity}; "
                f"estimated {grams:+.0f} gCO2 avoided (location-based)"
            )
            post_event(self.core, pool, "Warning" if stale else "Normal", "CarbonGateReleased", message)
        return True
