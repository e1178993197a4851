"""The gang bind barrier, as the serving loop sees it: a member's bind waits for its group.

No member of a gang is bound before every member has reached bind (kube-scheduler has no
Permit phase for extenders). The cache decides the barrier; this module only waits for it on
behalf of one bind request, telling the member's pod how many of its group are there.
"""

from __future__ import annotations

import functools
from typing import Final

import anyio.to_thread

from .cache import BindPlan, GpuCache
from .events import EventRecorder, PodRef

__all__ = ["REASON_WAITING", "GangBarrier"]

REASON_WAITING: Final = "GangWaiting"


class GangBarrier:
    def __init__(self, cache: GpuCache, events: EventRecorder) -> None:
        self.cache = cache
        self.events = events

    async def wait(self, plan: BindPlan, pod: PodRef, timeout: float) -> str | None:
        """None once the group's barrier opened for `plan`, else why the bind must not go on."""
        self.events.record(
            pod, REASON_WAITING, f"gang {plan.group}: waiting at the bind barrier", action="Bind"
        )
        wait = functools.partial(self.cache.await_gang, plan, timeout=timeout)
        return await anyio.to_thread.run_sync(wait, abandon_on_cancel=True)
