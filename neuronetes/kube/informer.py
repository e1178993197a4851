"""The informer: list + watch of one resource, in one background thread.

The usual reflector loop: list (paged) → hand the whole set to `on_replace` → watch from the
list's resourceVersion (with bookmarks) → hand each change to `on_change`; relist at once when
the server answers 410 Gone (the resourceVersion fell out of its window), after any other error
with capped exponential backoff, and every `resync_period` seconds regardless (when set), so a
missed event cannot linger.

Each informer says how long it has been broken (`Informer.broken_for`: since the first failed
list or broken watch, until a list succeeds again) and calls `on_heard` for every bookmark, so a
component can refuse to decide from a view that no longer follows the API server, and export
how stale it is. `stop` returns within its timeout: it closes the open watch from outside.

Objects are decoded by a `Codec` (`neuronetes.kube.codec`): `StructCodec` into msgspec structs
(the extender's lean wire types), `JsonCodec` into plain dicts (the agent's).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, Protocol, TypeVar

import msgspec

from .client import KubeError
from .codec import Codec

__all__ = ["Informer", "InformerHooks", "InformerSettings", "ListWatch", "WatchLines", "crd_installed"]

log = logging.getLogger(__name__)

GONE: Final = 410
NOT_FOUND: Final = 404

T = TypeVar("T")


class WatchLines(Protocol):
    """An open watch: its lines (one event each); `close` ends it from any thread."""

    def __enter__(self) -> WatchLines: ...
    def __exit__(self, *exc: object) -> None: ...
    def close(self) -> None: ...
    def __iter__(self) -> Iterator[bytes]: ...


class ListWatch(Protocol):
    """What an informer needs of the API server (`KubeClient`; a fake in unit tests)."""

    def get(
        self, path: str, query: Sequence[tuple[str, str]] = (), *, timeout: float | None = None
    ) -> bytes: ...
    def watch(self, path: str, query: Sequence[tuple[str, str]], *, read_timeout: float) -> WatchLines: ...


class _ObjectMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""


class _Versioned(msgspec.Struct):
    metadata: _ObjectMeta = msgspec.field(default_factory=_ObjectMeta)


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw = msgspec.Raw(b"null")


class _Status(msgspec.Struct):
    code: int = 0
    message: str = ""
    reason: str = ""


class _Gone(Exception):
    pass


@dataclass(frozen=True, slots=True)
class InformerSettings:
    """How one informer lists and watches.

    `page_size` 0 lists in one request; `list_timeout` None uses the client's own; `resync_period`
    None never relists while a watch holds; `jitter` spreads the watch timeouts (and the backoff
    after an API error) so that many informers do not reconnect together.
    """

    query: tuple[tuple[str, str], ...] = ()
    page_size: int = 500
    list_timeout: float | None = 120.0
    watch_timeout: float = 300.0
    resync_period: float | None = 600.0
    min_backoff: float = 0.5
    max_backoff: float = 30.0
    jitter: bool = True


def _ignore(*_: object) -> None:
    return None


@dataclass(frozen=True, slots=True)
class InformerHooks(Generic[T]):
    """What an informer calls (from its thread).

    `on_replace`: the whole set after each (re)list; `on_change`: ``ADDED``, ``MODIFIED`` or
    ``DELETED`` and the object; `on_synced`: once, after the first list; `on_heard`: at each
    bookmark; `on_missing` makes the resource optional (a CRD that may not be installed): when the
    API does not serve its path, the informer calls it, counts the resource synced and ends.
    """

    on_replace: Callable[[Sequence[T]], None]
    on_change: Callable[[str, T], None]
    on_synced: Callable[[], None] = field(default=_ignore)
    on_heard: Callable[[], None] = field(default=_ignore)
    on_missing: Callable[[], None] | None = None


class Informer(Generic[T]):
    """Keeps one consumer in step with one resource of the API server."""

    def __init__(
        self,
        api: ListWatch,
        resource: str,
        path: str,
        codec: Codec[T],
        hooks: InformerHooks[T],
        settings: InformerSettings = InformerSettings(),
        *,
        thread_name: str = "",
    ) -> None:
        self.api = api
        self.resource = resource
        self.path = path
        self.codec = codec
        self.hooks = hooks
        self.settings = settings
        self.relists = 0
        self.synced = False
        self._broken_since: float | None = None  # monotonic; None while connected
        self._stop = threading.Event()
        self._stream: WatchLines | None = None
        self._thread_name = thread_name or f"informer-{resource}"
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self._thread_name, daemon=True)
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

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def broken_for(self, now: float | None = None) -> float:
        """Seconds since the watch broke (a failed list or a broken stream); 0 while connected."""
        since = self._broken_since
        if since is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - since)

    def _broken(self) -> None:
        if self._broken_since is None:
            self._broken_since = time.monotonic()

    def _next_backoff(self, backoff: float) -> float:
        return min(self.settings.max_backoff, max(self.settings.min_backoff, backoff * 2))

    def run(self) -> None:
        on_missing = self.hooks.on_missing
        if on_missing is not None:
            installed = crd_installed(self.api, self.path, self._stop, on_error=self._broken)
            if installed is None:
                return  # stopped
            if not installed:
                self._broken_since = None
                on_missing()
                self.synced = True
                self.hooks.on_synced()
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
                backoff = self._next_backoff(backoff)
                log.warning("%s: %s; relisting in %.1fs", self.resource, exc, backoff)
                self._stop.wait(backoff * (random.uniform(0.8, 1.2) if self.settings.jitter else 1.0))
            except Exception:
                if self._stop.is_set():
                    break
                self._broken()
                backoff = self._next_backoff(backoff)
                log.exception("%s: informer failed; relisting in %.1fs", self.resource, backoff)
                self._stop.wait(backoff)

    # ---- list and watch --------------------------------------------------------------------------
    def relist(self) -> str:
        """List every object (paged) and hand the set to `on_replace`; returns the resourceVersion."""
        items: list[T] = []
        token = ""
        rv = ""
        settings = self.settings
        while True:
            query = list(settings.query)
            if settings.page_size:
                query.append(("limit", str(settings.page_size)))
            if token:
                query.append(("continue", token))
            try:
                page = self.codec.page(self.api.get(self.path, query, timeout=settings.list_timeout))
            except KubeError as exc:
                if exc.status == GONE:  # the continue token expired: start over
                    raise _Gone from None
                raise
            except msgspec.DecodeError as exc:
                raise KubeError(0, f"{self.resource}: undecodable list: {exc}") from None
            items.extend(page.items)
            rv = page.resource_version
            token = page.continue_token
            if not token:
                break
        self.hooks.on_replace(items)
        self._broken_since = None
        self.relists += 1
        if not self.synced:
            self.synced = True
            self.hooks.on_synced()
        log.info("%s: listed %d at resourceVersion %s", self.resource, len(items), rv)
        return rv

    def watch(self, rv: str) -> None:
        """Apply watch events from `rv` until the resync period ends (or 410: raises `_Gone`)."""
        settings = self.settings
        period = settings.resync_period
        deadline = None if period is None else time.monotonic() + period
        while not self._stop.is_set():
            longest = settings.watch_timeout
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 1:
                    return
                longest = min(longest, remaining)
            timeout = max(1, int(longest * (random.uniform(0.9, 1.0) if settings.jitter else 1.0)))
            query = [
                *settings.query,
                ("watch", "true"),
                ("resourceVersion", rv),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(timeout)),
            ]
            with self.api.watch(self.path, query, read_timeout=timeout + 30.0) as stream:
                self._stream = stream
                try:
                    if self._stop.is_set():  # stopped while connecting: nobody closed this one
                        return
                    for line in stream:
                        rv = self._event(line, rv)
                        if self._stop.is_set():
                            return
                finally:
                    self._stream = None

    def _event(self, line: bytes, rv: str) -> str:
        try:
            event = msgspec.json.decode(line, type=_Event)
        except msgspec.DecodeError as exc:
            raise KubeError(0, f"{self.resource}: undecodable watch event: {exc}") from None
        kind = event.type
        if kind == "ERROR":
            status = msgspec.json.decode(event.object, type=_Status)
            if status.code == GONE:
                raise _Gone
            raise KubeError(status.code, status.message or status.reason or "watch error")
        if kind == "BOOKMARK":
            self.hooks.on_heard()
            return msgspec.json.decode(event.object, type=_Versioned).metadata.resource_version or rv
        try:
            obj = self.codec.item(event.object)
        except msgspec.DecodeError as exc:
            log.warning("%s: skipping an undecodable %s event: %s", self.resource, kind, exc)
            return rv
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.hooks.on_change(kind, obj)
        return self.codec.version(obj) or rv


def crd_installed(
    api: ListWatch, path: str, stop: threading.Event, on_error: Callable[[], None] = lambda: None
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
