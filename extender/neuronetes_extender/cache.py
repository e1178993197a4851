"""The cluster GPU cache: a thin facade that owns the one lock and delegates to its parts.

Shaped like kube-scheduler's ``internal/cache``: small parts, one job each, none thread-safe on
its own; `GpuCache` holds the lock for every call into them, and only briefly (every decision is
a few NumPy operations on cached per-shape scores; never network I/O). The parts, by composition:

- `CacheBooks` (`books`, the store part): the `ClusterStore` (nodes, GPUNodes and pods as the
  watches report them), the `Snapshot` (the engine's `ClusterState` and `PlacementEngine`,
  rebuilt when the node set changes), the `Ledger` (what each bound pod holds, ``pod/<id>``,
  written by our binds) and the `SliceBook` (what each Bound GPUSlice reserves), kept current;
- `HoldBook` (`holds`): every hold (``hold/<id>``, ``group/<ns>/<group>/<i>``) with the one TTL;
  a lone pod's hold is the book's alone; released GPUs nudge the pods the filter rejected;
- `GangManager` (`gang_manager`, restore in `gang_restore`): gang reservations only: plan,
  claim, the non-blocking bind barrier, release;
- the decisions: `decisions` (filter, prioritize, preemption refinement) and `binding` (bind
  plan and outcome), functions over the books that answer with typed results;
- `CacheReads` (`cache_reads`): what the metrics, `/debug` and the explain tools read;
- `demand`: free capacity against the pending pods (the fragmentation gauges), read at scrape.

Pods are identified by UID (``namespace/name`` for hand-made requests without one). Nothing is
oversubscribed (`ClusterState` refuses it) and nothing is leaked (allocations are derived from
the pods and holds the cache keeps, never patched in place): `check_invariants` checks both and
raises `CacheInvariantError`, the one exception (a bug); refusals are answers (`BindRefused`).

Past 400 lines for one reason: it is the facade, a few lines per call around the one lock (the
preemption controller's calls included: `preemption`), and every part it calls is its own module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace

from neuronetes.api.models import GPUNode
from neuronetes.engine.policy import Policy
from neuronetes.engine.preempt import PreemptionDecision, choose_victims
from neuronetes.model import Locality, NodeSpec, PodRequest
from neuronetes.pricing import PriceTable

from . import binding
from . import decisions as d
from .books import CacheBooks
from .budgets import Budget
from .cache_reads import CacheReads
from .config import ExtenderSettings, SettingsSource
from .demand import Demand, measure
from .gang_manager import GangListener
from .gang_preemption import decide_for_gang, missing_members, pending_members
from .gang_restore import restore_gangs
from .gangs import GangGroup, GangSpec, RestoredGang
from .pods import PodInfo, pod_identity
from .preemption import PreemptionBook, Reservation
from .preemption import candidates as preemption_candidates
from .results import (
    BarrierState,
    BindPlan,
    BindRefused,
    CacheInvariantError,
    CacheStats,
    Explanation,
    FilterDecision,
    Hold,
)
from .slice_filter import filter_slice_pod
from .slices import GPUSLICES, SliceInfo
from .store import GPUNODES, RESOURCES
from .wire import Node, Pod

__all__ = [
    "GPUNODES",
    "GPUSLICES",
    "RESOURCES",
    "BarrierState",
    "BindPlan",
    "BindRefused",
    "CacheInvariantError",
    "CacheStats",
    "Explanation",
    "FilterDecision",
    "GangListener",
    "GpuCache",
    "Hold",
]


class GpuCache:
    """The extender's picture of the cluster's GPUs (thread-safe): every method takes the one
    lock and asks a part."""

    def __init__(
        self,
        settings: SettingsSource | ExtenderSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings if isinstance(settings, SettingsSource) else SettingsSource(initial=settings)
        self._lock = threading.RLock()
        self._settings_version = self.settings.version
        self._books = CacheBooks(self.settings.get(), clock)
        self._reads = CacheReads(self._books)
        self._preempt = PreemptionBook()

    def _ensure(self) -> None:
        """Bring the books up to date (lock held): settings, node changes, expired holds."""
        settings = self.settings.get()  # re-reads a changed settings file (at most once a second)
        changed = self.settings.version != self._settings_version
        self._settings_version = self.settings.version
        self._books.ensure(settings, changed)

    # ---- feeding from the API server -----------------------------------------------------------
    def set_node_specs(self, specs: Iterable[NodeSpec]) -> None:
        """Replace the node set with ready-made specs (tests, benchmarks)."""
        with self._lock:
            self._books.store.set_node_specs(specs)

    def replace_nodes(self, nodes: Iterable[Node]) -> None:
        """The node set after a (re)list."""
        with self._lock:
            self._books.store.replace_nodes(nodes)
        self.touch("nodes")

    def upsert_node(self, node: Node) -> None:
        if not node.metadata.name:
            return
        with self._lock:
            self._books.store.upsert_node(node)
        self.touch("nodes")

    def delete_node(self, name: str) -> None:
        with self._lock:
            self._books.store.delete_node(name)
        self.touch("nodes")

    def set_price_table(self, prices: PriceTable) -> None:
        """The price table changed (`neuronetes.kube.pricetable`): every node is priced again."""
        with self._lock:
            self._books.store.set_prices(prices)

    def replace_gpunodes(self, objs: Iterable[GPUNode]) -> None:
        """Every GPUNode after a (re)list: each node's GPUs as its agent discovered them."""
        with self._lock:
            self._books.store.replace_gpunodes(objs)
        self.touch(GPUNODES)

    def upsert_gpunode(self, obj: GPUNode) -> None:
        with self._lock:
            if self._books.store.upsert_gpunode(obj):
                # The node's GPUs changed (a MIG relayout made instances, a GPU came back): pods
                # the filter rejected may fit now.
                self._books.holds.freed = True
        self.touch(GPUNODES)

    def delete_gpunode(self, name: str) -> None:
        with self._lock:
            self._books.store.delete_gpunode(name)
        self.touch(GPUNODES)

    def replace_slices(self, slices: Iterable[SliceInfo]) -> None:
        """Every Bound GPUSlice after a (re)list (`slices.slice_of` of each object)."""
        with self._lock:
            if self._books.store.replace_slices(slices):
                self._books.holds.freed = True  # pods waiting for a slice may fit now
        self.touch(GPUSLICES)

    def put_slice(self, key: str, info: SliceInfo | None) -> None:
        """GPUSlice `key` (``namespace/name``) changed: `info` is what it reserves (None: nothing,
        or it is gone)."""
        with self._lock:
            if self._books.store.put_slice(key, info):
                self._books.holds.freed = True
        self.touch(GPUSLICES)

    def replace_budgets(self, budgets: Iterable[Budget]) -> None:
        """Every PodDisruptionBudget after a (re)list (`budgets.budget_of` of each object)."""
        with self._lock:
            self._preempt.budgets.replace(budgets)

    def put_budget(self, key: str, budget: Budget | None) -> None:
        """PodDisruptionBudget `key` (``namespace/name``) changed (None: it is gone)."""
        with self._lock:
            self._preempt.budgets.put(key, budget)

    def upsert_pod(self, pod: Pod) -> None:
        meta = pod.metadata  # `ClusterStore.previous` needs no lock
        previous = self._books.store.previous(pod_identity(meta.uid, meta.namespace, meta.name))
        info = PodInfo.from_pod(pod, previous)
        with self._lock:
            self._books.upsert(info)
        self.touch("pods")

    def delete_pod(self, pod: Pod) -> None:
        info = PodInfo.from_pod(pod)
        with self._lock:
            self._books.remove(info.id)
        self.touch("pods")

    def replace_pods(self, pods: Iterable[Pod]) -> None:
        """The pod set after a (re)list: pods not in it are gone."""
        infos = [PodInfo.from_pod(p) for p in pods]
        with self._lock:
            books = self._books
            keep = {i.id for i in infos}
            for gone in [k for k in books.store.pods if k not in keep]:
                books.remove(gone)
            for info in infos:
                books.upsert(info)
        self.touch("pods")

    # ---- sync bookkeeping ----------------------------------------------------------------------
    def touch(self, resource: str) -> None:
        """The API server just told this cache something about `resource` (sync age 0)."""
        self._books.store.touch(resource)

    def mark_synced(self, resource: str) -> None:
        """The first list of `resource` ("nodes", "pods", …) is in."""
        with self._lock:
            self._books.store.mark_synced(resource)

    def require_sync(self, resource: str) -> None:
        """`synced` also waits for `resource` (e.g. the gang reservations a restart restores)."""
        with self._lock:
            self._books.store.require_sync(resource)

    def is_synced(self, resource: str) -> bool:
        with self._lock:
            return self._books.store.is_synced(resource)

    @property
    def synced(self) -> bool:
        return self._books.store.synced

    def sync_age(self, resource: str) -> float:
        """Seconds since the API server last told this cache anything about `resource` (inf: never)."""
        return self._books.store.sync_age(resource)

    # ---- decisions -----------------------------------------------------------------------------
    def filter(self, pod: PodInfo, node_names: Sequence[str], gang: GangSpec | None = None) -> FilterDecision:
        """`decisions.filter_pod`; a GPU pod found no node for is remembered to be nudged."""
        with self._lock:
            self._ensure()
            books = self._books
            # Nodes held for a preemptor of higher priority are not this pod's (`preemption`).
            blocked = self._preempt.blocked(pod) if self._preempt.reservations else {}
            names = [n for n in node_names if n not in blocked] if blocked else node_names
            lookup = books.lookup(names)
            if pod.slice:
                decision = filter_slice_pod(books, pod, lookup)
            else:
                decision = d.filter_pod(books, pod, lookup, gang)
            if blocked:
                held = {n: blocked[n] for n in node_names if n in blocked}
                decision = replace(decision, failed={**decision.failed, **held})
            if decision.feasible:
                books.holds.rejected.pop(pod.id, None)
                self._preempt.placed(pod.id)
            elif pod.gpu is not None:
                books.holds.rejected[pod.id] = (pod.namespace, pod.name)
                self._preempt.rejected(pod.id, books.snap.now(), node_names, gang)
            return decision

    # ---- preemption (`preemption.PreemptionController`) ------------------------------------------
    def preemption_due(self, min_pending_s: float) -> list[PodInfo]:
        """Pods the filter rejected at least `min_pending_s` ago that may preempt now."""
        with self._lock:
            self._ensure()
            now = self._books.snap.now()
            pods = self._books.store.pods
            self._preempt.expire(pods, now, planned=self._books.gangs.groups.keys())
            return self._preempt.due(pods, now, min_pending_s)

    def decide_preemption(self, pod: PodInfo) -> PreemptionDecision:
        """Where `pod` goes and whom it evicts (`choose_victims` over `preemption.candidates`; a
        dry run on a copy of the state)."""
        with self._lock:
            self._ensure()
            books = self._books
            state = books.snap.state.read_copy()
            book = self._preempt
            members = missing_members(books.store.pods, pod, book.gang_specs.get(pod.id))
            low = min((m.priority for m in members), default=pod.priority)
            lowest = replace(pod, priority=low)  # a gang's victims are below every member
            units = preemption_candidates(state, books.store, lowest, book.refused_until, book.budgets)
            # A node held for another preemptor of this priority or higher is that one's: two
            # preemptors freeing the same GPUs would each evict, and one would find them taken.
            blocked = book.blocked(pod)
            offered = [n for n in book.offered.get(pod.id, ()) if n not in blocked]
            policy = books.snap.settings.policy
        # Outside the lock: at thousands of nodes a decision takes long enough to stall filters.
        if pod.gang is None:
            return choose_victims(state, pod.request, units, nodes=offered, order=pod.victim_order)
        if not members:
            return PreemptionDecision(
                (), (), "the gang's size is not known or no member is missing", needed=False
            )
        return decide_for_gang(state, members, units, nodes=offered, order=pod.victim_order, policy=policy)

    def hold_nodes_for(self, pod: PodInfo, nodes: Collection[str], seconds: float) -> None:
        """Refuse `nodes` to pods of `pod`'s priority or lower for `seconds`, or until it binds (a
        gang member: until no member waits or the gang's own reservation is made)."""
        with self._lock:
            until = self._books.snap.now() + seconds
            book = self._preempt
            group = pod.gang_id or ""
            for node in sorted(nodes):
                key = f"{group}@{node}" if group else pod.id
                book.reservations[key] = Reservation(pod.id, pod.key, pod.priority, node, until, group)

    def drop_holds_for(self, pod: PodInfo) -> None:
        """The preemption attempt of `pod` (or its gang) ended without evictions enough."""
        with self._lock:
            book = self._preempt
            for key in [k for k, h in book.reservations.items() if h.pod == pod.id]:
                del book.reservations[key]

    def pending_members(self, pod: PodInfo) -> list[PodInfo]:
        """The pods to tell when room is made: `pod`, or its gang's pending members."""
        with self._lock:
            return pending_members(self._books.store.pods, pod)

    def refuse_victim(self, pod_id: str, seconds: float) -> None:
        """Leave `pod_id` out of preemption decisions for `seconds` (its eviction was refused)."""
        with self._lock:
            self._preempt.refused_until[pod_id] = self._books.snap.now() + seconds

    def reservations(self) -> list[Reservation]:
        with self._lock:
            return list(self._preempt.reservations.values())

    def take_nudges(self) -> list[tuple[str, str]]:
        """Pending pods the filter rejected, once GPUs were released since (a hold expired or was
        released, a gang ended, a pod went); then the list is cleared. kube-scheduler parks
        extender-rejected pods for up to 5 minutes unless something about them changes, so the
        caller touches them (`ReservationStore`)."""
        with self._lock:
            self._ensure()
            holds = self._books.holds
            if not holds.freed:
                return []
            holds.freed = False
            pods = self._books.store.pods
            out = [
                key
                for pod_id, key in holds.rejected.items()
                if (p := pods.get(pod_id)) is not None and p.pending_gpu
            ]
            holds.rejected.clear()
            return out

    def prioritize(self, pod: PodInfo, node_names: Sequence[str]) -> list[int]:
        """`decisions.prioritize`: 0..10 per node."""
        with self._lock:
            self._ensure()
            return d.prioritize(self._books, pod, self._books.lookup(node_names))

    def prepare_bind(self, pod_id: str, node: str, pod: PodInfo | None = None) -> BindPlan | BindRefused:
        """`binding.prepare_bind`: the plan, or why the pod may not go to `node`. `pod`: the pod
        as the caller obtained it (needed when the cache does not know it yet)."""
        with self._lock:
            self._ensure()
            return binding.prepare_bind(self._books, pod_id, node, pod)

    def bind_done(self, plan: BindPlan, *, ok: bool, ambiguous: bool = False, pod: Pod | None = None) -> None:
        """`binding.bind_done`: a bind's outcome recorded (`pod`: the pod as the API returned it)."""
        with self._lock:
            binding.bind_done(self._books, plan, ok=ok, ambiguous=ambiguous, pod=pod)

    def refine_victims(self, pod: PodInfo, node: str) -> tuple[list[PodInfo], int] | None:
        """The pods to evict on `node` so that `pod` fits there, per GPU, lowest priority first,
        and their PodDisruptionBudget violations (`decisions.gpu_victims`, a dry run: nothing
        here changes); None: no room even then."""
        with self._lock:
            self._ensure()
            return d.gpu_victims(self._books, pod, node, self._preempt.budgets)

    # ---- gang reservations ---------------------------------------------------------------------
    @property
    def on_gang_change(self) -> GangListener | None:
        """Told of every change of a gang reservation (under the lock: it must not block)."""
        return self._books.gangs.on_change

    @on_gang_change.setter
    def on_gang_change(self, listener: GangListener | None) -> None:
        with self._lock:
            self._books.gangs.on_change = listener

    def set_barrier_listener(self, fn: Callable[[str], None] | None) -> None:
        """`fn(group_id)` is called (under the lock: it must not block) whenever a group's
        barrier state may have changed: a member arrived, it opened, expired, was released or
        failed. A waiting bind then asks `gang_arrive` again."""
        with self._lock:
            self._books.gangs.barrier_listener = fn

    def gang_arrive(self, plan: BindPlan) -> BarrierState:
        """`plan`'s member is at bind: the barrier says open, wait or failed (never blocks;
        idempotent: a member counts as arrived from its first call)."""
        with self._lock:
            self._ensure()
            return self._books.gangs.arrive(plan)

    def fail_waiting_binds(self, reason: str) -> None:
        """Shutdown: every member waiting at (or reaching) a barrier gets "failed" with `reason`."""
        with self._lock:
            self._books.gangs.fail_waiting(reason)

    def restore_gangs(self, restored: Iterable[RestoredGang]) -> int:
        """Hold the slots of reservations read from the API (a restart, or a standby following
        the active extender); may be called again with the current set: known groups stay as
        they are, new ones are restored. Returns how many groups were restored now."""
        with self._lock:
            self._ensure()
            return restore_gangs(self._books, restored)

    def release_gang(self, group_id: str, reservation_id: str | None = None) -> int:
        """Release every slot of `group_id` (only if it is still `reservation_id`, when given)."""
        with self._lock:
            return self._books.gangs.release(group_id, reservation_id)

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
            return self._books.gangs.reserve(group, members, locality, ttl)

    def tick(self) -> None:
        """Apply what time has done (expired holds and reservations) without a decision."""
        with self._lock:
            self._ensure()

    def gangs(self) -> list[GangGroup]:
        with self._lock:
            self._ensure()
            return list(self._books.gangs.groups.values())

    # ---- reads (`CacheReads`) ------------------------------------------------------------------
    @property
    def policy(self) -> Policy:
        """The placement policy in force (the configured weights applied)."""
        with self._lock:
            self._ensure()
            return self._reads.policy()

    def check_invariants(self) -> None:
        """Nothing oversubscribed, leaked or held for nothing (raises `CacheInvariantError`)."""
        with self._lock:
            self._ensure()
            self._reads.check_invariants()

    def holds(self) -> list[Hold]:
        with self._lock:
            return self._reads.holds()

    def hold_of(self, pod_id: str) -> Hold | None:
        with self._lock:
            return self._reads.hold_of(pod_id)

    def pod(self, pod_id: str) -> PodInfo | None:
        with self._lock:
            return self._reads.pod(pod_id)

    def node_spec(self, name: str) -> NodeSpec | None:
        with self._lock:
            return self._reads.node_spec(name)

    def explain(self, pod: PodInfo, node: str) -> dict[str, float]:
        """`pod`'s score on `node` by scorer term, as the engine sees it now ({}: not feasible)."""
        with self._lock:
            self._ensure()
            return self._reads.explain(pod, node)

    def gpu_usage(self, node: str) -> list[tuple[int, int]] | None:
        """Per GPU of `node`: (milli-GPU free, MiB free) as the cache counts them now."""
        with self._lock:
            self._ensure()
            return self._reads.gpu_usage(node)

    def demand(self) -> Demand:
        """Unallocated and fragmented GPU capacity against the pending pods, and pending gangs."""
        with self._lock:
            self._ensure()
            inputs = self._reads.demand_inputs()
        return measure(inputs)

    def stats(self) -> CacheStats:
        with self._lock:
            self._ensure()
            return self._reads.stats()
