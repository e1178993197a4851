"""The cache's books and keeping them current: the store part of the `GpuCache` facade.

`CacheBooks` holds the parts every decision reads and writes (the `ClusterStore`, the
`Snapshot`, the `Ledger`, the `SliceBook`, the `HoldBook` and the `GangManager`) and does the one
job of keeping the snapshot true to the store: a watch event's pod accounted, a gone pod
forgotten, the snapshot rebuilt when the node set changes, expired holds dropped. Not
thread-safe: the facade calls it with its lock held.

A pod's hold is released here in one place (`release_hold_of`): a slot of a live gang goes back
to the `GangManager`, any other hold (a lone pod's) is the `HoldBook`'s to drop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from .config import ExtenderSettings
from .gang_manager import GangManager
from .holds import HoldBook
from .ledger import Ledger
from .pods import PodInfo
from .slices import SliceBook, slice_covers
from .snapshot import NodeLookup, Snapshot
from .store import ClusterStore

__all__ = ["CacheBooks"]

log = logging.getLogger(__name__)


class CacheBooks:
    """The cache's parts, kept current from the store (not thread-safe on its own)."""

    def __init__(self, settings: ExtenderSettings, clock: Callable[[], float]) -> None:
        self.snap = Snapshot.empty(settings, clock)
        self.store = ClusterStore(clock)
        self.holds = HoldBook()
        self.ledger = Ledger()
        self.slices = SliceBook()
        self.gangs = GangManager(self.snap, self.store, self.holds)
        self._memo: NodeLookup | None = None

    # ---- keeping the snapshot current ----------------------------------------------------------
    def ensure(self, settings: ExtenderSettings, settings_changed: bool) -> None:
        """Bring the snapshot up to date: settings, node changes, expired holds."""
        if settings_changed:
            self.snap.use_settings(settings, rebuild_pending=self.store.dirty)
        if self.store.dirty:
            self.rebuild()
        now = self.snap.now()
        for due in self.holds.due(now):
            hold = self.holds.get(due.alloc_id)
            if hold is None or hold.expires_at > now or self.gangs.expire(hold):
                continue  # gone or renewed meanwhile, or its gang expired with it
            log.info("hold %s for %s on %s expired", hold.alloc_id, hold.pod or hold.group, hold.node)
            self.holds.drop(self.snap.state, hold.alloc_id)

    def rebuild(self) -> None:
        """Rebuild from the node specs; replay bound pods and Bound slices, then live holds (those
        that no longer fit are dropped; those whose node is gone wait, dormant, for it or their TTL)."""
        snap = self.snap
        snap.rebuild(self.store.specs.values())
        self.store.dirty = False
        self.ledger.reset()
        for info in self.store.pods.values():
            if info.holds_resources:
                self.account(info)
        for sl in self.store.slices.values():  # after the pods: a running pod outranks a claim
            self.slices.account(snap, self.holds, sl)
        for hold in sorted(self.holds, key=lambda h: h.expires_at):
            if hold.node not in snap.state.index:
                continue
            if not self.holds.allocate(snap.state, hold):
                log.info(
                    "hold %s dropped: no longer fits on %s after a node change", hold.alloc_id, hold.node
                )
                self.holds.forget(hold.alloc_id)

    def lookup(self, names: Sequence[str]) -> NodeLookup:
        """The rows of `names` (the last lookup again when the state and names are the same)."""
        memo = self._memo
        if memo is None or not memo.matches(self.snap.state, names):
            memo = self._memo = NodeLookup.build(self.snap.state, names)
        return memo

    # ---- pods ----------------------------------------------------------------------------------
    def account(self, info: PodInfo) -> None:
        in_slice = bool(info.slice) and slice_covers(info, self.store.slices)
        self.ledger.account(self.snap, self.holds, info, self._fulfil, in_slice=in_slice)

    def _fulfil(self, pod_id: str) -> None:
        self.release_hold_of(pod_id, bound=True)

    def upsert(self, info: PodInfo) -> None:
        """A pod as the watch (or a bind) reports it."""
        info = self.store.put_pod(info)
        if info.terminal:
            self.release_hold_of(info.id)
        if not self.store.dirty:
            self.account(info)
            if info.terminal:
                self.retry_slices()

    def remove(self, pod_id: str) -> None:
        """A pod is gone."""
        self.store.pop_pod(pod_id)
        self.holds.rejected.pop(pod_id, None)
        self.release_hold_of(pod_id)
        self.ledger.remove(self.snap, pod_id)
        self.retry_slices()

    def retry_slices(self) -> None:
        """A pod went or finished: slices left out for overlapping it may fit now."""
        if self.slices.unaccounted and not self.store.dirty:
            self.slices.retry(self.snap, self.holds, self.store.slices)

    def release_hold_of(self, pod_id: str, *, bound: bool = False, refilter: bool = False) -> None:
        """The pod no longer needs its hold: bound (`bound`), gone, finished, or filtered again
        (`refilter`: its GPUs are not freed for others, the pod takes new ones at once).

        A slot of a live gang is handed back to its group (or marked bound) by the gang manager;
        a lone pod's hold is dropped from the `HoldBook`.
        """
        hold = self.holds.of(pod_id)
        if hold is None or self.gangs.leave_slot_of(hold, bound=bound):
            return
        self.holds.drop(self.snap.state, hold.alloc_id, freed=not (bound or refilter))
