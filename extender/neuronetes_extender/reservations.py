"""Gang reservations in the API, and the group objects that say how big a gang is.

`ReservationStore` mirrors the cache's gang reservations into ``GangReservation`` objects (one
per group, server-side applied by a background writer so no decision waits on the API server)
and follows them: every list and every event hands the objects to the cache's idempotent
restore, so a standby extender holds the slots the active one reserved and can take over; a
reservation whose object is deleted, or that another extender ended, is released. It restores
before the extender reports ready. `GroupDirectory` knows each group's size and timeout from
watches of its group objects: the scheduler-plugins ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``)
or Volcano's (``scheduling.volcano.sh/v1beta1``), ``spec.minMember`` and ``scheduleTimeoutSeconds``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import quote

from neuronetes import contracts as c
from neuronetes.model import NodeSpec

from .cache import GpuCache
from .gangs import (
    ANNOTATION_RESERVATION_ID,
    GangGroup,
    GangSpec,
    ReservationDecodeError,
    decode_reservation,
    encode_reservation,
)
from .kube import KubeApi, KubeError, nudge_pod
from .pods import PodInfo
from .watch import CustomObject, CustomObjectList, Reflector, WatchHealth

__all__ = ["RESERVATIONS", "GroupDirectory", "ReservationStore"]

log = logging.getLogger(__name__)

RESERVATIONS: Final = "gangreservations"
FIELD_MANAGER: Final = "neuronetes-extender"
_BASE: Final = f"/apis/{c.API_VERSION}"
_DELETE_PHASES: Final = frozenset({"Bound", "Released"})
_LIVE_PHASES: Final = frozenset({"Reserved", "Binding"})
NOT_FOUND: Final = 404
"""Written on a pending pod so kube-scheduler retries it now (GPUs it may fit were released)."""


def _path(namespace: str, name: str = "") -> str:
    base = f"{_BASE}/namespaces/{quote(namespace, safe='')}/{RESERVATIONS}"
    return f"{base}/{quote(name, safe='')}" if name else base


class ReservationStore:
    """Keeps ``GangReservation`` objects in step with `cache`'s gang reservations."""

    def __init__(
        self,
        cache: GpuCache,
        api: KubeApi,
        *,
        resync_period: float = 600.0,
        health: WatchHealth | None = None,
    ) -> None:
        self.cache = cache
        self.api = api
        self.resync_period = resync_period
        self.enabled = True  # False when the CRD is not installed: reservations live in memory only
        self.writes = 0
        self.errors = 0
        self._pending: dict[str, tuple[dict[str, Any], bool, str]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reflector: Reflector[CustomObject] | None = None
        self.health = health
        cache.require_sync(RESERVATIONS)
        cache.on_gang_change = self._changed

    # ---- cache -> API ------------------------------------------------------------------------
    def _changed(self, group: GangGroup, specs: dict[str, NodeSpec], ended: bool) -> None:
        """Called under the cache's lock: encode now, write later (latest state per group wins)."""
        obj = encode_reservation(group, specs)
        with self._lock:
            self._pending[group.id] = (obj, ended, group.phase)
        self._wake.set()

    def _write(self, obj: dict[str, Any], ended: bool, phase: str) -> None:
        meta = obj["metadata"]
        path = _path(meta["namespace"], meta["name"])
        if ended and phase in _DELETE_PHASES:
            try:
                self.api.delete(path)
            except KubeError as exc:
                if exc.status != NOT_FOUND:
                    raise
            return
        status = obj["status"]
        body = {k: v for k, v in obj.items() if k != "status"}
        self.api.apply(path, body, field_manager=FIELD_MANAGER)
        self.api.apply(
            path + "/status",
            {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "status": status,
            },
            field_manager=FIELD_MANAGER,
        )

    def flush(self) -> None:
        """Write every pending change now (the writer thread's body; tests call it directly)."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                batch = list(self._pending.items())
                self._pending.clear()
            for group_id, (obj, ended, phase) in batch:
                if not self.enabled:
                    continue
                try:
                    self._write(obj, ended, phase)
                    self.writes += 1
                except KubeError as exc:
                    self.errors += 1
                    log.warning("gang %s: writing its GangReservation failed: %s", group_id, exc)
                    if exc.ambiguous or exc.status in (409, 429):
                        with self._lock:  # retry, unless a newer state is already queued
                            self._pending.setdefault(group_id, (obj, ended, phase))
                        self._stop.wait(0.5)

    def _writer(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self.cache.synced:
                self.cache.tick()  # a reservation expires (and says so) even when no pod is scheduled
            self.flush()
            self.nudge()

    def nudge(self) -> int:
        """Touch pending pods the filter rejected once a reservation freed GPUs (kube-scheduler
        retries a parked pod when it changes); returns how many were touched."""
        touched = sum(nudge_pod(self.api, namespace, name) for namespace, name in self.cache.take_nudges())
        if touched:
            log.info("nudged %d pending pod(s): gang reservations released GPUs", touched)
        return touched

    # ---- API -> cache ------------------------------------------------------------------------
    def listed(self, items: Iterable[CustomObject]) -> None:
        """The reflector listed every GangReservation: restore those the cache does not hold."""
        self._restore(items)

    def upserted(self, item: CustomObject) -> None:
        """One GangReservation was added or changed (by this extender or the other one)."""
        phase = (item.status or {}).get("phase") or "Reserved"
        if phase in _LIVE_PHASES:
            self._restore((item,))
        else:  # another extender ended it (bound, expired, failed): stop holding its slots
            self.deleted(item)

    def _restore(self, items: Iterable[CustomObject]) -> None:
        restored = []
        for item in items:
            try:
                restored.append(decode_reservation(item.as_object("GangReservation")))
            except ReservationDecodeError as exc:
                meta = item.metadata
                log.warning("GangReservation %s/%s ignored: %s", meta.namespace, meta.name, exc)
        n = self.cache.restore_gangs(restored)
        if n:
            log.info("restored %d gang reservation(s) from the API", n)

    def deleted(self, item: CustomObject) -> None:
        """Somebody deleted a reservation's object: release it (unless it is an older one)."""
        rid = (item.metadata.annotations or {}).get(ANNOTATION_RESERVATION_ID)
        group = str(item.spec.get("groupName") or "")
        if rid and group:
            released = self.cache.release_gang(f"{item.metadata.namespace}/{group}", rid)
            if released:
                log.info(
                    "gang %s/%s: reservation object deleted, %d slots released",
                    item.metadata.namespace,
                    group,
                    released,
                )

    def _no_crd(self) -> None:
        log.warning(
            "the GangReservation CRD is not installed: gang reservations are kept in memory only "
            "and do not survive a restart"
        )
        self.enabled = False

    def _start_reflector(self) -> None:
        # Restore only once nodes and pods are in: a slot whose pod is already bound is not held.
        while not self._stop.is_set():
            if self.cache.is_synced("nodes") and self.cache.is_synced("pods"):
                break
            self._stop.wait(0.1)
        if self._stop.is_set():
            return
        reflector: Reflector[CustomObject] = Reflector(
            self.api,
            RESERVATIONS,
            f"{_BASE}/{RESERVATIONS}",
            CustomObject,
            CustomObjectList,
            on_replace=self.listed,
            on_upsert=self.upserted,
            on_delete=self.deleted,
            on_synced=lambda: self.cache.mark_synced(RESERVATIONS),
            on_heard=lambda: self.cache.touch(RESERVATIONS),
            resync_period=self.resync_period,
            on_missing=self._no_crd,
        )
        self._reflector = reflector
        if self.health is not None:
            self.health.add(reflector)
        reflector.run()

    def start(self) -> None:
        for target, name in ((self._writer, "gang-writer"), (self._start_reflector, "reflector-gangs")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the reflector and the writer within `timeout` seconds, writing what is pending."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        if self._reflector is not None:
            self._reflector.signal_stop()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if deadline - time.monotonic() > 0:
            self.flush()


GroupSize = tuple[int, float | None]
"""(minMember, scheduleTimeoutSeconds) of a group object."""


def _group_size(obj: CustomObject) -> GroupSize | str:
    size = obj.spec.get("minMember")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return "has no positive spec.minMember"
    timeout = obj.spec.get("scheduleTimeoutSeconds")
    if isinstance(timeout, int) and not isinstance(timeout, bool) and timeout > 0:
        return size, float(timeout)
    return size, None


class GroupDirectory:
    """Group size and timeout of a gang, from its pod labels or its group object.

    Group objects come from watches of the optional PodGroup CRDs (scheduler-plugins' and
    Volcano's), never from a request-time GET: the filter only reads this map.
    """

    SOURCES: Final = {
        c.LABEL_POD_GROUP_X_K8S: "/apis/scheduling.x-k8s.io/v1alpha1/podgroups",
        c.ANNOTATION_GROUP_NAME_VOLCANO: "/apis/scheduling.volcano.sh/v1beta1/podgroups",
    }

    def __init__(self) -> None:
        self._groups: dict[str, dict[tuple[str, str], GroupSize | str]] = {k: {} for k in self.SOURCES}
        self._synced: set[str] = set()
        self._lock = threading.Lock()
        self.reflectors: list[Reflector[CustomObject]] = []

    # ---- fed by the watches ------------------------------------------------------------------
    def replace(self, key: str, items: Iterable[CustomObject]) -> None:
        groups = {(o.metadata.namespace, o.metadata.name): _group_size(o) for o in items}
        with self._lock:
            self._groups[key] = groups
            self._synced.add(key)

    def upsert(self, key: str, obj: CustomObject) -> None:
        with self._lock:
            self._groups[key][(obj.metadata.namespace, obj.metadata.name)] = _group_size(obj)

    def delete(self, key: str, obj: CustomObject) -> None:
        with self._lock:
            self._groups[key].pop((obj.metadata.namespace, obj.metadata.name), None)

    def _missing(self, key: str) -> None:
        log.info("%s is not served: gangs named by %s need the gang-size label", self.SOURCES[key], key)
        with self._lock:
            self._synced.add(key)

    def reflector(self, api: KubeApi, key: str, *, resync_period: float = 600.0) -> Reflector[CustomObject]:
        """The watch of one PodGroup kind (not started)."""

        def mark_synced() -> None:
            with self._lock:
                self._synced.add(key)

        reflector: Reflector[CustomObject] = Reflector(
            api,
            f"podgroups ({key})",
            self.SOURCES[key],
            CustomObject,
            CustomObjectList,
            on_replace=lambda items: self.replace(key, items),
            on_upsert=lambda obj: self.upsert(key, obj),
            on_delete=lambda obj: self.delete(key, obj),
            on_synced=mark_synced,
            on_heard=lambda: None,
            resync_period=resync_period,
            on_missing=lambda: self._missing(key),
        )
        self.reflectors.append(reflector)
        return reflector

    # ---- read by the filter ------------------------------------------------------------------
    def group(self, key: str, namespace: str, name: str) -> GroupSize | str:
        """The group object's size and timeout, or why it cannot be told."""
        if key not in self.SOURCES:
            return f"label {c.LABEL_GANG_SIZE} is missing"
        with self._lock:
            found = self._groups[key].get((namespace, name))
            synced = key in self._synced
        if found is None:
            return f"PodGroup {namespace}/{name} not found{'' if synced else ' (PodGroups not listed yet)'}"
        if isinstance(found, str):
            return f"PodGroup {namespace}/{name} {found}"
        return found

    def spec_for(self, pod: PodInfo, default_ttl: float) -> GangSpec | str:
        """The gang's size and reservation TTL, or why they cannot be told (a filter reason)."""
        gang = pod.gang
        if gang is None:
            return "not a gang member"
        size, timeout = gang.size, gang.timeout_s
        if size is None:
            found = self.group(gang.key, pod.namespace, gang.name)
            if isinstance(found, str):
                return f"gang {gang.name}: size unknown ({found})"
            size, group_timeout = found
            timeout = timeout or group_timeout
        return GangSpec(size=size, ttl_seconds=timeout or default_ttl)
