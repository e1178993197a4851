"""The gang bind barrier, as the serving loop sees it: a member's bind waits for its group.

No member of a gang is bound before every member has reached bind (kube-scheduler has no
Permit phase for extenders). The cache decides the barrier (`GpuCache.gang_arrive`, which never
blocks); a waiting bind parks no thread: it awaits a future that the cache's barrier listener
resolves (through the waiter's own loop, `call_soon_threadsafe`) whenever its group may have
changed, then asks again. The member's pod gets an Event saying how many of its group are at
the barrier. At shutdown `fail_all` fails every waiting bind at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Final

from .cache import BindPlan, GpuCache
from .events import EventRecorder, PodRef

__all__ = ["REASON_WAITING", "GangBarrier"]

REASON_WAITING: Final = "GangWaiting"
POLL_SECONDS: Final = 1.0
"""A waiting bind also asks again this often (an expiry is noticed by time, not by an event)."""

_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class GangBarrier:
    def __init__(self, cache: GpuCache, events: EventRecorder) -> None:
        self.cache = cache
        self.events = events
        self._waiters: dict[str, list[_Waiter]] = {}
        self._lock = threading.Lock()
        cache.set_barrier_listener(self._changed)

    def _changed(self, group_id: str) -> None:
        """The cache's listener (called under its lock, from any thread): wake the group's waiters."""
        with self._lock:
            waiters = list(self._waiters.get(group_id, ()))
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(_wake, future)

    def _add(self, group_id: str, waiter: _Waiter) -> None:
        with self._lock:
            self._waiters.setdefault(group_id, []).append(waiter)

    def _remove(self, group_id: str, waiter: _Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(group_id, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(group_id, None)

    def waiting(self) -> int:
        """Binds waiting at a barrier now."""
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

    async def wait(self, plan: BindPlan, pod: PodRef, timeout: float) -> str | None:
        """None once the group's barrier opened for `plan`, else why the bind must not go on
        (the barrier failed, or `timeout` seconds passed)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout
        told = -1
        while True:
            waiter: _Waiter = (loop, loop.create_future())
            self._add(plan.group, waiter)  # before asking: a change in between still wakes us
            try:
                state = self.cache.gang_arrive(plan)
                if state.status == "open":
                    return None
                if state.status == "failed":
                    return state.reason
                if state.arrived != told:
                    told = state.arrived
                    note = f"{state.arrived} of {state.size} members at the bind barrier (gang {plan.group})"
                    self.events.record(pod, REASON_WAITING, note, action="Binding")
                remaining = give_up - loop.time()
                if remaining <= 0:
                    return f"{state.reason}; gave up after {timeout:g} s"
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter[1], min(remaining, POLL_SECONDS))
            finally:
                self._remove(plan.group, waiter)

    def fail_all(self, reason: str) -> None:
        """Fail every waiting bind now, and any that arrives later (shutdown). Any thread."""
        self.cache.fail_waiting_binds(reason)
