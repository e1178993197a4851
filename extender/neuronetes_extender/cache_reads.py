"""The read part of the `GpuCache` facade: the policy in force, the invariant check, holds,
pods and node specs, a pod's score terms on a node, per-GPU usage, demand and the stats the
metrics and `/debug` endpoints show.

Reads only, over the `CacheBooks`; not thread-safe: the facade takes its lock for every call
(and brings the snapshot up to date first where the read needs it).
"""

from __future__ import annotations

from neuronetes.engine.policy import Policy
from neuronetes.model import NodeSpec

from .books import CacheBooks
from .demand import DemandInputs, take_inputs
from .pods import PodInfo
from .results import CacheStats, Hold
from .snapshot import check_books
from .store import RESOURCES

__all__ = ["CacheReads"]


class CacheReads:
    """`GpuCache`'s reads (the facade holds the lock)."""

    def __init__(self, books: CacheBooks) -> None:
        self._books = books

    def policy(self) -> Policy:
        """The placement policy in force (the configured weights applied)."""
        return self._books.snap.engine.policy

    def check_invariants(self) -> None:
        """`snapshot.check_books`: nothing oversubscribed, leaked or held for nothing (raises
        `CacheInvariantError`)."""
        b = self._books
        check_books(b.snap.state, b.store.pods.keys(), b.holds, b.store.slices.keys())

    def holds(self) -> list[Hold]:
        return list(self._books.holds)

    def hold_of(self, pod_id: str) -> Hold | None:
        return self._books.holds.of(pod_id)

    def pod(self, pod_id: str) -> PodInfo | None:
        return self._books.store.pods.get(pod_id)

    def node_spec(self, name: str) -> NodeSpec | None:
        return self._books.store.specs.get(name)

    def explain(self, pod: PodInfo, node: str) -> dict[str, float]:
        """`pod`'s score on `node` by scorer term, as the engine sees it now ({}: not feasible)."""
        snap = self._books.snap
        i = snap.state.index.get(node)
        return {} if i is None or pod.gpu_error else snap.engine.explain(pod.request, i)

    def gpu_usage(self, node: str) -> list[tuple[int, int]] | None:
        """Per GPU of `node`: (milli-GPU free, MiB free) as the cache counts them now."""
        st = self._books.snap.state
        i = st.index.get(node)
        if i is None:
            return None
        return [
            (int(st.gpu_milli_free[i, j]), int(st.gpu_mem_free[i, j])) for j in range(int(st.gpu_count[i]))
        ]

    def demand_inputs(self) -> DemandInputs:
        """What `demand.measure` needs, copied under the lock (measured outside it)."""
        snap = self._books.snap
        return take_inputs(snap.state, self._books.store.pods.values(), snap.settings.gang_ttl_seconds)

    def stats(self) -> CacheStats:
        b = self._books
        store = b.store
        pods = store.pods.values()
        return CacheStats(
            nodes=len(store.specs),
            gpus=sum(len(s.gpus) for s in store.specs.values()),
            pods=len(store.pods),
            bound_pods=sum(1 for p in pods if p.holds_resources),
            pending_gpu_pods=sum(1 for p in pods if p.pending_gpu),
            holds=len(b.holds),
            gangs=len(b.gangs.groups),
            unaccounted_pods=len(b.ledger.unaccounted),
            conflicts=b.ledger.conflicts + b.slices.conflicts,
            rebuilds=b.snap.rebuilds,
            synced=store.synced,
            sync_age_seconds={r: store.sync_age(r) for r in RESOURCES},
            ignored_assignment_changes=b.ledger.ignored_changes,
        )
