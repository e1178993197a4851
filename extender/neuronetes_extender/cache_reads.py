"""The read side of the `GpuCache` facade: the policy in force, the invariant check, holds,
pods and node specs, a pod's score terms on a node, per-GPU usage, demand and the stats the
metrics and `/debug` endpoints show.

A mixin (like `GangFacade`) so that the facade's module keeps to its feeds and decisions; every
read takes the facade's lock and, where it reads the snapshot, brings it up to date first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from neuronetes.engine.policy import Policy
from neuronetes.model import NodeSpec

from .demand import Demand, measure, take_inputs
from .gang_manager import GangManager
from .holds import HoldBook
from .ledger import Ledger
from .pods import PodInfo
from .results import CacheStats, Hold
from .slices import SliceBook
from .snapshot import Snapshot, check_books
from .store import RESOURCES, ClusterStore

__all__ = ["CacheReads"]


class CacheReads:
    """`GpuCache`'s reads (each takes the lock)."""

    _lock: threading.RLock
    _snap: Snapshot
    _store: ClusterStore
    _holds: HoldBook
    _ledger: Ledger
    _slices: SliceBook
    _gangs: GangManager
    _ensure: Callable[[], None]  # the facade's: bring the snapshot up to date (lock held)

    @property
    def policy(self) -> Policy:
        """The placement policy in force (the configured weights applied)."""
        with self._lock:
            self._ensure()
            return self._snap.engine.policy

    def check_invariants(self) -> None:
        """`snapshot.check_books`: nothing oversubscribed, leaked or held for nothing (raises
        `CacheInvariantError`)."""
        with self._lock:
            self._ensure()
            check_books(self._snap.state, self._store.pods.keys(), self._holds, self._store.slices.keys())

    def holds(self) -> list[Hold]:
        with self._lock:
            return list(self._holds)

    def hold_of(self, pod_id: str) -> Hold | None:
        with self._lock:
            return self._holds.of(pod_id)

    def pod(self, pod_id: str) -> PodInfo | None:
        with self._lock:
            return self._store.pods.get(pod_id)

    def node_spec(self, name: str) -> NodeSpec | None:
        with self._lock:
            return self._store.specs.get(name)

    def explain(self, pod: PodInfo, node: str) -> dict[str, float]:
        """`pod`'s score on `node` by scorer term, as the engine sees it now ({}: not feasible)."""
        with self._lock:
            self._ensure()
            i = self._snap.state.index.get(node)
            return {} if i is None or pod.gpu_error else self._snap.engine.explain(pod.request, i)

    def gpu_usage(self, node: str) -> list[tuple[int, int]] | None:
        """Per GPU of `node`: (milli-GPU free, MiB free) as the cache counts them now."""
        with self._lock:
            self._ensure()
            st = self._snap.state
            i = st.index.get(node)
            if i is None:
                return None
            return [
                (int(st.gpu_milli_free[i, j]), int(st.gpu_mem_free[i, j]))
                for j in range(int(st.gpu_count[i]))
            ]

    def demand(self) -> Demand:
        """Unallocated and fragmented GPU capacity against the pending pods, and pending gangs."""
        with self._lock:
            self._ensure()
            inputs = take_inputs(
                self._snap.state, self._store.pods.values(), self._snap.settings.gang_ttl_seconds
            )
        return measure(inputs)

    def stats(self) -> CacheStats:
        with self._lock:
            self._ensure()
            store = self._store
            pods = store.pods.values()
            return CacheStats(
                nodes=len(store.specs),
                gpus=sum(len(s.gpus) for s in store.specs.values()),
                pods=len(store.pods),
                bound_pods=sum(1 for p in pods if p.holds_resources),
                pending_gpu_pods=sum(1 for p in pods if p.pending_gpu),
                holds=len(self._holds),
                gangs=len(self._gangs.groups),
                unaccounted_pods=len(self._ledger.unaccounted),
                conflicts=self._ledger.conflicts + self._slices.conflicts,
                rebuilds=self._snap.rebuilds,
                synced=store.synced,
                sync_age_seconds={r: store.sync_age(r) for r in RESOURCES},
                ignored_assignment_changes=self._ledger.ignored_changes,
            )
