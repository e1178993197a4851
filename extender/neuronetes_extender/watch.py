"""The reflector: list + watch of one resource into the `GpuCache` (one background thread each).

A `Reflector` is the core `neuronetes.kube.Informer` with the extender's settings: paged lists,
watches from the list's resourceVersion (with bookmarks), a relist at once on 410 Gone, after any
error (with capped, jittered exponential backoff) and every `resync_period` seconds regardless,
so a missed event cannot linger. The cache is ready (`GpuCache.synced`) once both first lists
are in.

Each reflector says how long it has been broken (`Reflector.broken_for`: since the first failed
list or broken watch, until a list succeeds again); `WatchHealth` gathers them, so readiness and
the filter can refuse to decide from a cache that no longer follows the API server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import msgspec

from neuronetes import contracts as c
from neuronetes.kube.codec import StructCodec
from neuronetes.kube.informer import Informer, InformerHooks, InformerSettings, ListWatch
from neuronetes.kube.informer import crd_installed as crd_installed

from .wire import ListMeta, ObjectMeta

__all__ = ["CustomObject", "CustomObjectList", "Reflector", "WatchHealth", "crd_installed"]


class _Object(Protocol):
    @property
    def metadata(self) -> ObjectMeta: ...


T = TypeVar("T", bound=_Object)


class Reflector(Informer[T]):
    """Keeps one resource of the cache in step with the API server."""

    def __init__(
        self,
        api: ListWatch,
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

        def change(kind: str, obj: T) -> None:
            if kind == "DELETED":
                on_delete(obj)
            else:
                on_upsert(obj)

        hooks = InformerHooks(on_replace, change, on_synced, on_heard, on_missing)
        settings = InformerSettings(
            page_size=page_size,
            watch_timeout=watch_timeout,
            resync_period=resync_period,
            max_backoff=max_backoff,
        )
        super().__init__(
            api,
            resource,
            path,
            StructCodec(item, list_type),
            hooks,
            settings,
            thread_name=f"reflector-{resource}",
        )


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


class WatchHealth:
    """The reflectors whose breakage makes the extender unready (and its filter refuse)."""

    def __init__(self) -> None:
        self._reflectors: list[Informer[Any]] = []
        self._lock = threading.Lock()

    def add(self, reflector: Informer[Any]) -> None:
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
