"""Pod Events that tell users what the extender decided (``kubectl describe pod`` shows them).

Decisions only `record` an event (a dictionary write, any thread); one task on the event loop
posts them as ``events.k8s.io/v1`` Events with reportingController ``neuronetes-extender``. Two
things keep a storm of pods from flooding the API server: events for the same pod and reason
that are still unposted collapse into one (the latest message wins; a gang member's "3 of 4 at
the barrier" becomes "4 of 4"), and posting is rate-limited by a token bucket. Past
`max_pending` unposted events, new ones are dropped and counted. An event recorded with
``every_s`` (a Pending pod's rejections, which kube-scheduler asks about on every retry) is
recorded at most once per that many seconds per pod and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol
from urllib.parse import quote

from .kube import KubeError

__all__ = ["REPORTING_CONTROLLER", "EventPoster", "EventRecorder", "PodRef", "rejections_note"]

log = logging.getLogger(__name__)

REPORTING_CONTROLLER: Final = "neuronetes-extender"
NOTE_MAX: Final = 1024  # the API server's limit on an Event's note
NODES_PER_REASON: Final = 5  # node names listed per rejection reason (the rest are counted)


def rejections_note(reasons: dict[str, str]) -> str:
    """Rejected nodes grouped by reason, most nodes first, a few names each:
    ``3 node(s) rejected: insufficient gpu memory [n1, n2, n3]; unhealthy gpus [n4 +2 more]``.
    Node names are bracketed so a reader can split the note per reason (`neuronetes explain`)."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in reasons.items():
        by_reason.setdefault(reason, []).append(node)
    parts = []
    for reason, nodes in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        names = sorted(nodes)
        shown = ", ".join(names[:NODES_PER_REASON])
        more = f" +{len(names) - NODES_PER_REASON} more" if len(names) > NODES_PER_REASON else ""
        parts.append(f"{reason} [{shown}{more}]")
    return f"{len(reasons)} node(s) rejected: " + "; ".join(parts)


class EventPoster(Protocol):
    async def post(self, path: str, body: dict[str, Any]) -> bytes: ...


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str = ""


@dataclass(slots=True)
class _Pending:
    pod: PodRef
    reason: str
    action: str
    note: str
    type: str


def _micro_time(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventRecorder:
    """Aggregated, rate-limited pod Events, posted by `run` (a task on the serving loop)."""

    def __init__(
        self,
        poster: EventPoster | None,
        *,
        instance: str | None = None,
        rate_per_s: float = 50.0,
        burst: int = 100,
        max_pending: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.poster = poster
        self.instance = instance or socket.gethostname()
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_pending = max_pending
        self._clock = clock
        self._pending: dict[tuple[str, str, str], _Pending] = {}
        self._last: dict[tuple[str, str, str], float] = {}  # `every_s` events: when last recorded
        self._lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.posted = 0
        self.dropped = 0
        self.failed = 0

    def record(
        self, pod: PodRef, reason: str, note: str, *, action: str, type: str = "Normal", every_s: float = 0.0
    ) -> None:
        """Queue an event for `pod` (replaces an unposted one of the same reason); with `every_s`,
        only if none of this reason was recorded for the pod in the last `every_s` seconds. Any thread."""
        if self.poster is None:
            return
        key = (pod.namespace, pod.name, reason)
        with self._lock:
            if key not in self._pending and len(self._pending) >= self.max_pending:
                self.dropped += 1
                return
            if every_s > 0 and not self._due(key, every_s):
                return
            self._pending[key] = _Pending(pod, reason, action, note[:NOTE_MAX], type)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed (shutdown)
                loop.call_soon_threadsafe(wake.set)

    def _due(self, key: tuple[str, str, str], every_s: float) -> bool:
        """Whether a throttled event for `key` may be recorded now (then it is noted as recorded).
        The book forgets entries older than `every_s` once it holds `max_pending` of them."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < every_s:
            return False
        if last is None and len(self._last) >= self.max_pending:
            self._last = {k: t for k, t in self._last.items() if now - t < every_s}
            if len(self._last) >= self.max_pending:
                self.dropped += 1
                return False
        self._last[key] = now
        return True

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _take(self) -> _Pending | None:
        with self._lock:
            if not self._pending:
                return None
            key = next(iter(self._pending))
            return self._pending.pop(key)

    def _body(self, event: _Pending) -> dict[str, Any]:
        pod = event.pod
        now_ns = time.time_ns()
        regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name}
        if pod.uid:
            regarding["uid"] = pod.uid
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # Named as Kubernetes' own recorders name events: the object's name and the time.
            "metadata": {"name": f"{pod.name}.{now_ns:x}", "namespace": pod.namespace},
            "eventTime": _micro_time(now_ns / 1e9),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.instance,
            "action": event.action,
            "reason": event.reason,
            "note": event.note,
            "type": event.type,
            "regarding": regarding,
        }

    async def post_one(self, event: _Pending) -> None:
        if self.poster is None:
            return
        path = f"/apis/events.k8s.io/v1/namespaces/{quote(event.pod.namespace, safe='')}/events"
        try:
            await self.poster.post(path, self._body(event))
            self.posted += 1
        except KubeError as exc:
            self.failed += 1
            log.debug(
                "event %s for %s/%s not posted: %s", event.reason, event.pod.namespace, event.pod.name, exc
            )

    async def run(self) -> None:
        """Post queued events until cancelled (then `drain` posts what is left, bounded)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        tokens = float(self.burst)
        last = self._clock()
        while True:
            event = self._take()
            if event is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self._clock()
            tokens = min(float(self.burst), tokens + (now - last) * self.rate_per_s)
            last = now
            if tokens < 1.0:
                await asyncio.sleep((1.0 - tokens) / self.rate_per_s)
                tokens = 1.0
                last = self._clock()
            tokens -= 1.0
            await self.post_one(event)

    async def drain(self, timeout: float) -> None:
        """Post what is still queued, for at most `timeout` seconds (shutdown)."""
        deadline = self._clock() + timeout
        while self._clock() < deadline:
            event = self._take()
            if event is None:
                return
            try:
                await asyncio.wait_for(self.post_one(event), max(0.01, deadline - self._clock()))
            except TimeoutError:
                return
