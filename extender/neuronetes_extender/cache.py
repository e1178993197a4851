"""The cluster GPU cache: a thin facade that owns the one lock and delegates.

Shaped like kube-scheduler's ``internal/cache``: the parts each do one job and none is
thread-safe on its own; `GpuCache` holds the lock for every call into them, and only briefly
(every decision is a few NumPy operations on cached per-shape scores; never network I/O).

- `ClusterStore` (`store`): nodes, GPUNodes and pods as the watches report them;
- `Snapshot` (`snapshot`): the engine's `ClusterState` and `PlacementEngine`, rebuilt from the
  store when the node set changes (bound pods replayed, then live holds);
- `Ledger` (`ledger`): what each bound pod holds (``pod/<id>``), written by our binds, never
  re-read from a tenant-writable annotation;
- `SliceBook` (`slices`): what each Bound GPUSlice reserves (``slice/<ns>/<name>``), read from
  the status the operator writes; pods naming a slice run inside it;
- `HoldBook` (`holds`): holds (``hold/<id>``, ``group/<ns>/<group>/<i>``) with the one TTL;
  released GPUs nudge the pods the filter rejected;
- `GangManager` (`gang_manager`): gang reservations, their non-blocking bind barrier, restore;
- `decisions`: filter, prioritize, bind planning and preemption refinement over the parts;
- `demand`: free capacity against the pending pods (the fragmentation gauges), read at scrape.

Pods are identified by UID (``namespace/name`` for hand-made requests without one). Nothing is
oversubscribed (`ClusterState` refuses it) and nothing is leaked (allocations are derived from
the pods and holds the cache keeps, never patched in place): `check_invariants` checks both and
raises `CacheInvariantError`.

This module holds the feeds (one short locked method per watch event) and the decisions; the
gang methods are in `GangFacade` (`gang_facade`) and the reads in `CacheReads` (`cache_reads`),
mixins that take the same lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from neuronetes.api.models import GPUNode
from neuronetes.model import NodeSpec

from . import decisions as d
from .cache_reads import CacheReads
from .config import ExtenderSettings, SettingsSource
from .gang_facade import GangFacade
from .gang_manager import GangListener, GangManager
from .gangs import GangSpec
from .holds import HoldBook, pod_of_hold
from .ledger import Ledger
from .pods import PodInfo, pod_identity
from .results import (
    BarrierState,
    BindPlan,
    BindRefusedError,
    CacheInvariantError,
    CacheStats,
    Explanation,
    FilterDecision,
    Hold,
    PodUnknownError,
)
from .slice_filter import filter_slice_pod
from .slices import GPUSLICES, SliceBook, SliceInfo, slice_covers
from .snapshot import NodeLookup, Snapshot
from .store import GPUNODES, RESOURCES, ClusterStore
from .wire import Node, Pod

__all__ = [
    "GPUNODES",
    "GPUSLICES",
    "RESOURCES",
    "BarrierState",
    "BindPlan",
    "BindRefusedError",
    "CacheInvariantError",
    "CacheStats",
    "Explanation",
    "FilterDecision",
    "GangListener",
    "GpuCache",
    "Hold",
    "PodUnknownError",
]

log = logging.getLogger(__name__)


class GpuCache(GangFacade, CacheReads):
    """The extender's picture of the cluster's GPUs (thread-safe); gang methods in `GangFacade`,
    reads in `CacheReads`."""

    def __init__(
        self,
        settings: SettingsSource | ExtenderSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings if isinstance(settings, SettingsSource) else SettingsSource(initial=settings)
        self._clock = clock
        self._lock = threading.RLock()
        self._settings_version = self.settings.version
        self._snap = Snapshot.empty(self.settings.get(), clock)
        self._store = ClusterStore(clock)
        self._holds = HoldBook()
        self._ledger = Ledger()
        self._slices = SliceBook()
        self._gangs = GangManager(self._snap, self._store, self._holds, d.REASON_UNKNOWN_NODE)
        self._gangs.barrier_listener = self._barrier_changed
        self._barrier_listener: Callable[[str], None] | None = None
        self._parts = d.Parts(self._snap, self._store, self._holds, self._gangs)
        self._memo: NodeLookup | None = None

    # ---- keeping the snapshot current (lock held) ---------------------------------------------
    def _ensure(self) -> None:
        """Bring the snapshot up to date: settings, node changes, expired holds."""
        settings = self.settings.get()  # re-reads a changed settings file (at most once a second)
        if self.settings.version != self._settings_version:
            self._settings_version = self.settings.version
            self._snap.use_settings(settings, rebuild_pending=self._store.dirty)
        if self._store.dirty:
            self._rebuild()
        now = self._clock()
        for due in self._holds.due(now):
            hold = self._holds.get(due.alloc_id)
            if hold is None or hold.expires_at > now or self._gangs.expire(hold):
                continue  # gone or renewed meanwhile, or its gang expired with it
            log.info("hold %s for %s on %s expired", hold.alloc_id, hold.pod or hold.group, hold.node)
            self._holds.drop(self._snap.state, hold.alloc_id)

    def _rebuild(self) -> None:
        """Rebuild from the node specs; replay bound pods and Bound slices, then live holds (those
        that no longer fit are dropped; those whose node is gone wait, dormant, for it or their TTL)."""
        snap = self._snap
        snap.rebuild(self._store.specs.values())
        self._store.dirty = False
        self._ledger.reset()
        for info in self._store.pods.values():
            if info.holds_resources:
                self._account(info)
        for sl in self._store.slices.values():  # after the pods: a running pod outranks a claim
            self._slices.account(snap, self._holds, sl)
        for hold in sorted(self._holds, key=lambda h: h.expires_at):
            if hold.node not in snap.state.index:
                continue
            if not self._holds.allocate(snap.state, hold):
                log.info(
                    "hold %s dropped: no longer fits on %s after a node change", hold.alloc_id, hold.node
                )
                self._holds.forget(hold.alloc_id)

    def _account(self, info: PodInfo) -> None:
        in_slice = bool(info.slice) and slice_covers(info, self._store.slices)
        self._ledger.account(self._snap, self._holds, info, self._fulfil, in_slice=in_slice)

    def _fulfil(self, pod_id: str) -> None:
        self._gangs.release_hold_of(pod_id, bound=True)

    def _lookup(self, names: Sequence[str]) -> NodeLookup:
        memo = self._memo
        if memo is None or not memo.matches(self._snap.state, names):
            memo = self._memo = NodeLookup.build(self._snap.state, names)
        return memo

    # ---- feeding from the API server -----------------------------------------------------------
    def set_node_specs(self, specs: Iterable[NodeSpec]) -> None:
        """Replace the node set with ready-made specs (tests, benchmarks)."""
        with self._lock:
            self._store.set_node_specs(specs)

    def replace_nodes(self, nodes: Iterable[Node]) -> None:
        """The node set after a (re)list."""
        with self._lock:
            self._store.replace_nodes(nodes)
        self.touch("nodes")

    def upsert_node(self, node: Node) -> None:
        if not node.metadata.name:
            return
        with self._lock:
            self._store.upsert_node(node)
        self.touch("nodes")

    def delete_node(self, name: str) -> None:
        with self._lock:
            self._store.delete_node(name)
        self.touch("nodes")

    def replace_gpunodes(self, objs: Iterable[GPUNode]) -> None:
        """Every GPUNode after a (re)list: each node's GPUs as its agent discovered them."""
        with self._lock:
            self._store.replace_gpunodes(objs)
        self.touch(GPUNODES)

    def upsert_gpunode(self, obj: GPUNode) -> None:
        with self._lock:
            self._store.upsert_gpunode(obj)
        self.touch(GPUNODES)

    def delete_gpunode(self, name: str) -> None:
        with self._lock:
            self._store.delete_gpunode(name)
        self.touch(GPUNODES)

    def replace_slices(self, slices: Iterable[SliceInfo]) -> None:
        """Every Bound GPUSlice after a (re)list (`slices.slice_of` of each object)."""
        with self._lock:
            if self._store.replace_slices(slices):
                self._holds.freed = True  # pods waiting for a slice may fit now
        self.touch(GPUSLICES)

    def put_slice(self, key: str, info: SliceInfo | None) -> None:
        """GPUSlice `key` (``namespace/name``) changed: `info` is what it reserves (None: nothing,
        or it is gone)."""
        with self._lock:
            if self._store.put_slice(key, info):
                self._holds.freed = True
        self.touch(GPUSLICES)

    def _upsert(self, info: PodInfo) -> None:
        info = self._store.put_pod(info)
        if info.terminal:
            self._gangs.release_hold_of(info.id)
        if not self._store.dirty:
            self._account(info)
            if info.terminal:
                self._retry_slices()

    def _remove(self, pod_id: str) -> None:
        self._store.pop_pod(pod_id)
        self._holds.rejected.pop(pod_id, None)
        self._gangs.release_hold_of(pod_id)
        self._ledger.remove(self._snap, pod_id)
        self._retry_slices()

    def _retry_slices(self) -> None:
        """A pod went or finished: slices left out for overlapping it may fit now."""
        if self._slices.unaccounted and not self._store.dirty:
            self._slices.retry(self._snap, self._holds, self._store.slices)

    def upsert_pod(self, pod: Pod) -> None:
        meta = pod.metadata  # `ClusterStore.previous` needs no lock
        info = PodInfo.from_pod(pod, self._store.previous(pod_identity(meta.uid, meta.namespace, meta.name)))
        with self._lock:
            self._upsert(info)
        self.touch("pods")

    def delete_pod(self, pod: Pod) -> None:
        info = PodInfo.from_pod(pod)
        with self._lock:
            self._remove(info.id)
        self.touch("pods")

    def replace_pods(self, pods: Iterable[Pod]) -> None:
        """The pod set after a (re)list: pods not in it are gone."""
        infos = [PodInfo.from_pod(p) for p in pods]
        with self._lock:
            keep = {i.id for i in infos}
            for gone in [k for k in self._store.pods if k not in keep]:
                self._remove(gone)
            for info in infos:
                self._upsert(info)
        self.touch("pods")

    # ---- sync bookkeeping ----------------------------------------------------------------------
    def touch(self, resource: str) -> None:
        """The API server just told this cache something about `resource` (sync age 0)."""
        self._store.touch(resource)

    def mark_synced(self, resource: str) -> None:
        """The first list of `resource` ("nodes", "pods", …) is in."""
        with self._lock:
            self._store.mark_synced(resource)

    def require_sync(self, resource: str) -> None:
        """`synced` also waits for `resource` (e.g. the gang reservations a restart restores)."""
        with self._lock:
            self._store.require_sync(resource)

    def is_synced(self, resource: str) -> bool:
        with self._lock:
            return self._store.is_synced(resource)

    @property
    def synced(self) -> bool:
        return self._store.synced

    def sync_age(self, resource: str) -> float:
        """Seconds since the API server last told this cache anything about `resource` (inf: never)."""
        return self._store.sync_age(resource)

    # ---- decisions -----------------------------------------------------------------------------
    def filter(self, pod: PodInfo, node_names: Sequence[str], gang: GangSpec | None = None) -> FilterDecision:
        """`decisions.filter_pod`; a GPU pod found no node for is remembered to be nudged."""
        with self._lock:
            self._ensure()
            lookup = self._lookup(node_names)
            if pod.slice:
                decision = filter_slice_pod(self._parts, pod, lookup)
            else:
                decision = d.filter_pod(self._parts, pod, lookup, gang)
            if decision.feasible:
                self._holds.rejected.pop(pod.id, None)
            elif pod.gpu is not None:
                self._holds.rejected[pod.id] = (pod.namespace, pod.name)
            return decision

    def take_nudges(self) -> list[tuple[str, str]]:
        """Pending pods the filter rejected, once GPUs were released since (a hold expired or was
        released, a gang ended, a pod went); then the list is cleared. kube-scheduler parks
        extender-rejected pods for up to 5 minutes unless something about them changes, so the
        caller touches them (`ReservationStore`)."""
        with self._lock:
            self._ensure()
            if not self._holds.freed:
                return []
            self._holds.freed = False
            pods = self._store.pods
            out = [
                key
                for pod_id, key in self._holds.rejected.items()
                if (p := pods.get(pod_id)) is not None and p.pending_gpu
            ]
            self._holds.rejected.clear()
            return out

    def prioritize(self, pod: PodInfo, node_names: Sequence[str]) -> list[int]:
        """`decisions.prioritize`: 0..10 per node."""
        with self._lock:
            self._ensure()
            return d.prioritize(self._parts, pod, self._lookup(node_names))

    def prepare_bind(self, pod_id: str, node: str, pod: PodInfo | None = None) -> BindPlan:
        """`decisions.prepare_bind` (raises `PodUnknownError`, `BindRefusedError`)."""
        with self._lock:
            self._ensure()
            plan = d.prepare_bind(self._parts, pod_id, node, pod)
            if not plan.already_bound and (known := pod or self._store.pods.get(pod_id)) is not None:
                self._store.expect_bound(known.bound_to(plan.node, plan.assignment, plan.annotations))
            return plan

    def bind_done(self, plan: BindPlan, *, ok: bool, ambiguous: bool = False, pod: Pod | None = None) -> None:
        """Record a bind's outcome.

        On success the hold becomes the pod's allocation in the ledger (the watch will report the
        same pod; that is a no-op). On a definite failure the hold is released; on an ambiguous
        one (timeout, server error) it stays until the watch tells or the TTL ends.
        """
        with self._lock:
            self._store.bind_settled(plan.pod)
            hold = self._holds.get(plan.alloc_id)
            if not ok:
                if hold is not None and not ambiguous:
                    group = self._gangs.groups.get(hold.group) if hold.group else None
                    if group is not None:
                        # After the barrier: a partial gang. The operator recreates the group.
                        log.warning("gang %s: binding %s failed after the barrier", group.id, plan.pod)
                        self._gangs.end(group, "Failed")
                    else:
                        self._holds.drop(self._snap.state, hold.alloc_id)
                return
            if hold is not None:
                self._ledger.record_bind(plan.pod, plan.node, hold.grants, plan.assignment)
            if pod is not None:
                self._upsert(PodInfo.from_pod(pod))
                return
            info = self._store.pods.get(plan.pod)
            if info is None and hold is not None:  # fetched at bind, not yet seen by the watch
                info = pod_of_hold(plan.pod, hold)
            if info is not None:
                self._upsert(info.bound_to(plan.node, plan.assignment, plan.annotations))

    def refine_victims(self, pod: PodInfo, node: str, victims: Sequence[tuple[str, int]]) -> list[str] | None:
        """The fewest of `victims` ((pod identity, priority)) whose removal lets `pod` onto `node`
        (`decisions.fewest_victims`, on a scratch copy of the node: nothing here changes)."""
        with self._lock:
            self._ensure()
            engine = d.scratch_engine(self._parts, pod, node)
        return None if engine is None else d.fewest_victims(engine, pod.request, victims)
