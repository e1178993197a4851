"""The reflector: list + watch of one resource into the `GpuCache` (one background thread each).

The usual reflector loop: list (paged) → replace the cache's set → watch from the list's
resourceVersion (with bookmarks) → apply events; relist when the server answers 410 Gone (the
resourceVersion fell out of its window), after any error (with capped exponential backoff),
and every `resync_period` seconds regardless, so a missed event cannot linger. The cache is
ready (`GpuCache.synced`) once both first lists are in.

Each reflector says how long it has been broken (`Reflector.broken_for`: since the first failed
list or broken watch, until a list succeeds again); `WatchHealth` gathers them, so readiness and
the filter can refuse to decide from a cache that no longer follows the API server.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, Generic, Protocol, TypeVar

import msgspec

from neuronetes import contracts as c

from .kube import KubeApi, KubeError, WatchStream
from .wire import ListMeta, ObjectMeta, WatchEvent, decoder

__all__ = ["CustomObject", "CustomObjectList", "Reflector", "WatchHealth", "crd_installed"]

log = logging.getLogger(__name__)


class _Object(Protocol):
    @property
    def metadata(self) -> ObjectMeta: ...


T = TypeVar("T", bound=_Object)
GONE: Final = 410
NOT_FOUND: Final = 404


class _Status(msgspec.Struct):
    code: int = 0
    message: str = ""
    reason: str = ""


class _Meta(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class _Gone(Exception):
    pass


class Reflector(Generic[T]):
    """Keeps one resource of the cache in step with the API server."""

    def __init__(
        self,
        api: KubeApi,
        resource: str,
        path: str,
        item: type[T],
        list_type: type[Any],
        *,
        on_replace: Callable[[Iterable[T]], None],
        on_upsert: Callable[[T], None],
        on_delete: Callable[[T], None],
        on_synced: Callable[[], None],
        on_heard: Callable[[], None],
        page_size: int = 500,
        watch_timeout: float = 300.0,
        resync_period: float = 600.0,
        max_backoff: float = 30.0,
        on_missing: Callable[[], None] | None = None,
    ) -> None:
        """`on_missing` makes the resource optional (a CRD that may not be installed): when the API
        does not serve `path`, `run` calls it, counts the resource synced and returns."""
        self.api = api
        self.resource = resource
        self.path = path
        self._item = decoder(item)
        self._list = decoder(list_type)
        self._on_replace: Callable[[Iterable[T]], None] = on_replace
        self._on_upsert: Callable[[T], None] = on_upsert
        self._on_delete: Callable[[T], None] = on_delete
        self._on_synced = on_synced
        self._on_heard = on_heard
        self._on_missing = on_missing
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.resync_period = resync_period
        self.max_backoff = max_backoff
        self.relists = 0
        self.synced = False
        self._broken_since: float | None = None  # monotonic; None while connected
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"reflector-{self.resource}", daemon=True)
        self._thread.start()

    def signal_stop(self) -> None:
        """Ask the loop to end and unblock a watch read (returns at once)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.close()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(max(0.0, timeout))

    def stop(self, timeout: float = 5.0) -> None:
        self.signal_stop()
        self.join(timeout)

    def broken_for(self, now: float | None = None) -> float:
        """Seconds since the watch broke (a failed list or a broken stream); 0 while connected."""
        since = self._broken_since
        if since is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - since)

    def _broken(self) -> None:
        if self._broken_since is None:
            self._broken_since = time.monotonic()

    def run(self) -> None:
        if self._on_missing is not None:
            installed = crd_installed(self.api, self.path, self._stop, on_error=self._broken)
            if installed is None:
                return  # stopped
            if not installed:
                self._broken_since = None
                self._on_missing()
                self.synced = True
                self._on_synced()
                return
        backoff = 0.0
        while not self._stop.is_set():
            try:
                rv = self.relist()
                backoff = 0.0
                self.watch(rv)
            except _Gone:
                log.info("%s: resourceVersion too old (410 Gone), relisting", self.resource)
            except KubeError as exc:
                if self._stop.is_set():
                    break
                self._broken()
                backoff = min(self.max_backoff, max(0.5, backoff * 2))
                log.warning("%s: %s; relisting in %.1fs", self.resource, exc, backoff)
                self._stop.wait(backoff * random.uniform(0.8, 1.2))
            except Exception:
                if self._stop.is_set():
                    break
                self._broken()
                backoff = min(self.max_backoff, max(0.5, backoff * 2))
                log.exception("%s: reflector failed; relisting in %.1fs", self.resource, backoff)
                self._stop.wait(backoff)

    # ---- list and watch --------------------------------------------------------------------------
    def relist(self) -> str:
        """List every object (paged) and hand the set to the cache; returns the resourceVersion."""
        items: list[T] = []
        token = ""
        rv = ""
        while True:
            query = [("limit", str(self.page_size))]
            if token:
                query.append(("continue", token))
            try:
                page: Any = self._list.decode(self.api.get(self.path, query, timeout=120.0))
            except KubeError as exc:
                if exc.status == GONE:  # the continue token expired: start over
                    raise _Gone from None
                raise
            except msgspec.DecodeError as exc:
                raise KubeError(0, f"{self.resource}: undecodable list: {exc}") from None
            items.extend(page.items or ())
            rv = str(page.metadata.resource_version)
            token = str(page.metadata.continue_)
            if not token:
                break
        self._on_replace(items)
        self._broken_since = None
        self.relists += 1
        if not self.synced:
            self.synced = True
            self._on_synced()
        log.info("%s: listed %d at resourceVersion %s", self.resource, len(items), rv)
        return rv

    def watch(self, rv: str) -> None:
        """Apply watch events from `rv` until the resync period ends (or 410: raises `_Gone`)."""
        deadline = time.monotonic() + self.resync_period
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 1:
                return
            timeout = max(1, int(min(self.watch_timeout, remaining) * random.uniform(0.9, 1.0)))
            query = [
                ("watch", "true"),
                ("resourceVersion", rv),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(timeout)),
            ]
            with self.api.watch(self.path, query, read_timeout=timeout + 30.0) as stream:
                self._stream = stream
                try:
                    for line in stream:
                        rv = self._event(line, rv)
                        if self._stop.is_set():
                            return
                finally:
                    self._stream = None

    def _event(self, line: bytes, rv: str) -> str:
        try:
            event = decoder(WatchEvent).decode(line)
        except msgspec.DecodeError as exc:
            raise KubeError(0, f"{self.resource}: undecodable watch event: {exc}") from None
        kind = event.type
        if kind == "ERROR":
            status = msgspec.json.decode(event.object, type=_Status)
            if status.code == GONE:
                raise _Gone
            raise KubeError(status.code, status.message or status.reason or "watch error")
        if kind == "BOOKMARK":
            self._on_heard()
            meta = msgspec.json.decode(event.object, type=_Meta).metadata
            return meta.resource_version or rv
        try:
            obj: T = self._item.decode(event.object)
        except msgspec.DecodeError as exc:
            log.warning("%s: skipping an undecodable %s event: %s", self.resource, kind, exc)
            return rv
        if kind in ("ADDED", "MODIFIED"):
            self._on_upsert(obj)
        elif kind == "DELETED":
            self._on_delete(obj)
        return obj.metadata.resource_version or rv


class CustomObject(msgspec.Struct, kw_only=True):
    """A NeuroNetes custom object as listed/watched (validated against its model when used)."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: dict[str, Any] = msgspec.field(default_factory=dict)
    status: dict[str, Any] | None = None

    def as_object(self, kind: str) -> dict[str, Any]:
        meta = msgspec.to_builtins(self.metadata)
        for key in ("uid", "resourceVersion", "deletionTimestamp", "generateName"):
            meta.pop(key, None)
        out: dict[str, Any] = {"apiVersion": c.API_VERSION, "kind": kind, "metadata": meta, "spec": self.spec}
        if self.status is not None:
            out["status"] = self.status
        return out


class CustomObjectList(msgspec.Struct, kw_only=True):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[CustomObject] | None = None


def crd_installed(
    api: KubeApi, path: str, stop: threading.Event, on_error: Callable[[], None] = lambda: None
) -> bool | None:
    """Whether the API serves `path` (a custom resource's collection); errors other than 404 retry
    (calling `on_error`) until `stop` is set (then None)."""
    while not stop.is_set():
        try:
            api.get(path, [("limit", "1")])
            return True
        except KubeError as exc:
            if exc.status == NOT_FOUND:
                return False
            on_error()
            log.warning("%s: %s; retrying", path, exc)
            stop.wait(1.0)
    return None


class WatchHealth:
    """The reflectors whose breakage makes the extender unready (and its filter refuse)."""

    def __init__(self) -> None:
        self._reflectors: list[Reflector[Any]] = []
        self._lock = threading.Lock()

    def add(self, reflector: Reflector[Any]) -> None:
        with self._lock:
            self._reflectors.append(reflector)

    def broken_for_each(self) -> dict[str, float]:
        """Resource -> seconds its watch has been broken (0: connected), for every watch."""
        now = time.monotonic()
        with self._lock:
            reflectors = list(self._reflectors)
        return {r.resource: r.broken_for(now) for r in reflectors}

    def broken(self) -> dict[str, float]:
        """Resource -> seconds its watch has been broken, for every broken one."""
        return {name: t for name, t in self.broken_for_each().items() if t > 0}

    def stale(self, limit: float) -> str | None:
        """Why decisions must wait (a watch broken longer than `limit` seconds), or None."""
        over = {name: t for name, t in self.broken().items() if t > limit}
        if not over:
            return None
        parts = ", ".join(f"{name} for {t:.0f} s" for name, t in sorted(over.items()))
        return f"watch broken ({parts}; limit {limit:g} s): the GPU cache may be stale"
