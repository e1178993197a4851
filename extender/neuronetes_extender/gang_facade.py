"""The gang-reservation part of the `GpuCache` facade: the listeners, the non-blocking bind
barrier (and its blocking form for threaded callers), restore, release and reserve.

A mixin so that the facade's module stays one screenful per job; it uses the facade's lock,
its `GangManager` and its `_ensure` (bring the snapshot up to date), nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from neuronetes.model import Locality, PodRequest

from .gang_manager import GangListener, GangManager
from .gangs import GangGroup, RestoredGang
from .holds import HoldBook
from .results import BarrierState, BindPlan, Hold
from .snapshot import Snapshot

__all__ = ["GangFacade"]


class GangFacade:
    """`GpuCache`'s gang methods (each takes the lock)."""

    _lock: threading.RLock
    _clock: Callable[[], float]
    _snap: Snapshot
    _holds: HoldBook
    _gangs: GangManager
    _barrier_listener: Callable[[str], None] | None
    _ensure: Callable[[], None]  # the facade's: bring the snapshot up to date (lock held)

    # ---- gang reservations ---------------------------------------------------------------------
    @property
    def on_gang_change(self) -> GangListener | None:
        """Told of every change of a gang reservation (under the lock: it must not block)."""
        return self._gangs.on_change

    @on_gang_change.setter
    def on_gang_change(self, listener: GangListener | None) -> None:
        with self._lock:
            self._gangs.on_change = listener

    def set_barrier_listener(self, fn: Callable[[str], None] | None) -> None:
        """`fn(group_id)` is called (under the lock: it must not block) whenever a group's
        barrier state may have changed: a member arrived, it opened, expired, was released or
        failed. A waiting bind then asks `gang_arrive` again."""
        with self._lock:
            self._barrier_listener = fn

    def _barrier_changed(self, group_id: str) -> None:
        fn = self._barrier_listener
        if fn is not None:
            fn(group_id)

    def gang_arrive(self, plan: BindPlan) -> BarrierState:
        """`plan`'s member is at bind: the barrier says open, wait or failed (never blocks;
        idempotent: a member counts as arrived from its first call)."""
        with self._lock:
            self._ensure()
            return self._gangs.arrive(plan)

    def fail_waiting_binds(self, reason: str) -> None:
        """Shutdown: every member waiting at (or reaching) a barrier gets "failed" with `reason`."""
        with self._lock:
            self._gangs.fail_waiting(reason)

    def restore_gangs(self, restored: Iterable[RestoredGang]) -> int:
        """Hold the slots of reservations read from the API (a restart, or a standby following
        the active extender); may be called again with the current set: known groups stay as
        they are, new ones are restored. Returns how many groups were restored now."""
        with self._lock:
            self._ensure()
            return self._gangs.restore(restored)

    def release_gang(self, group_id: str, reservation_id: str | None = None) -> int:
        """Release every slot of `group_id` (only if it is still `reservation_id`, when given)."""
        with self._lock:
            return self._gangs.release(group_id, reservation_id)

    def reserve_group(
        self,
        group: str,
        members: Sequence[PodRequest],
        locality: Locality = Locality.ANY,
        ttl: float | None = None,
    ) -> tuple[Hold, ...] | None:
        """Hold GPUs for every member of `group` at once, or for none (slots expire together after
        `ttl`, default the assume TTL, unless released; members claim them at their filter)."""
        with self._lock:
            self._ensure()
            existing = self._gangs.groups.get(group)
            if existing is not None:
                self._gangs.end(existing, "Released")
            namespace, _, name = group.rpartition("/")
            ttl = self._snap.settings.assume_ttl_seconds if ttl is None else ttl
            planned = self._gangs.plan(group, namespace, name, len(members), members, locality, ttl)
            if planned is None:
                return None
            return tuple(h for s in planned.slots if (h := self._holds.get(s.alloc_id)) is not None)

    def tick(self) -> None:
        """Apply what time has done (expired holds and reservations) without a decision."""
        with self._lock:
            self._ensure()

    def gangs(self) -> list[GangGroup]:
        with self._lock:
            self._ensure()
            return list(self._gangs.groups.values())
