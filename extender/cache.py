"""The cluster GPU cache: every node's GPUs, every pod's allocation, and the decisions on them.

One `GpuCache` holds the engine's `ClusterState` and `PlacementEngine` behind one lock. It is fed
by the API server (`neuronetes.extender.watch` calls `replace_*` / `upsert_*` / `delete_*`) and
asked by the extender's verbs (`filter`, `prioritize`, `prepare_bind`, `refine_victims`). Every
decision is a few NumPy operations on cached per-shape scores, well under a millisecond, so the
lock is held only briefly and never across network I/O.

What is counted (allocation ids in the `ClusterState`):

- ``pod/<id>``: a pod bound to a node (and not finished): its CPU and memory, and for a GPU pod
  the GPUs its `neuronetes.io/assigned-gpus` annotation names. A GPU pod bound without a
  readable assignment (placed by something else) is given the GPUs the engine would pick on its
  node, so the node's totals stay honest.
- ``hold/<id>``: a *hold*, the filter's decision for a pending pod, recorded at once with a TTL
  so a later pod's filter cannot take the same GPUs before this pod binds. The bind realises it
  (the Binding carries exactly those GPUs) and turns it into ``pod/<id>``; otherwise it expires.
  A hold whose node leaves the inventory stays, dormant, until the node returns (its Binding may
  be in flight) or its TTL ends.
- ``group/<namespace>/<group>/<i>``: a gang reservation's member *slots* (`neuronetes.extender.gangs`):
  the whole group placed at once by `neuronetes.engine.gang.plan_gang` at its first member's
  filter, or not at all. Members claim slots at their filter, wait at the bind barrier
  (`await_gang`) until every member has reached bind, and turn their slot into ``pod/<id>`` when
  bound. The slots expire together; a restarted extender restores them (`restore_gangs`).

Pods are identified by UID (``namespace/name`` for hand-made requests without one). A pod's
``nodeName`` is write-once in Kubernetes, so a watch event showing a pod unbound after this cache
bound it is stale and does not undo the binding.

Node set changes (a node added, removed, relabelled, cordoned, resized) mark the state dirty;
the next decision rebuilds it from the node specs and replays bound pods, then live holds
(those that no longer fit are dropped: their bind re-places or fails; those whose node is gone
wait, unallocated, for it). Nothing is
oversubscribed (`ClusterState` refuses it) and nothing is leaked (allocations are derived from
the pods and holds the cache keeps, never patched in place): `check_invariants` checks both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from neuronetes import contracts as c
from neuronetes.api.models import GPUNode
from neuronetes.assignment import PodGpuRequest, build_assignment, visible_devices_annotations
from neuronetes.engine import PlacementEngine
from neuronetes.engine.core import FEASIBLE
from neuronetes.engine.filters import FILTERS
from neuronetes.engine.gang import plan_gang
from neuronetes.engine.policy import Policy
from neuronetes.inventory import Allocation, ClusterState, OversubscriptionError
from neuronetes.model import GpuGrant, Locality, NodeSpec, Placement, PodRequest

from .config import ExtenderSettings, SettingsSource
from .gangs import GangGroup, GangSlot, GangSpec, RestoredGang, same_shape
from .nodes import NodeSpecError, apply_gpunode, node_spec_from_node, unusable_node
from .pods import PodInfo, assigned_gpu_uuids
from .wire import Node, Pod

__all__ = [
    "UNRESOLVABLE_FILTERS",
    "BindPlan",
    "BindRefusedError",
    "CacheStats",
    "FilterDecision",
    "GpuCache",
    "Hold",
    "PodUnknownError",
]

log = logging.getLogger(__name__)

UNRESOLVABLE_FILTERS: Final = frozenset({"NodeSchedulable", "GpuModel", "GpuCount", "GpuHealth", "Price"})
"""Engine filters that preempting pods cannot satisfy (reported in ``FailedAndUnresolvableNodes``)."""
REASON_UNKNOWN_NODE: Final = "node not in the gpu inventory yet"
REASON_NOT_CHOSEN: Final = "gpus chosen on another node"
_MAX_REASON: Final = 240
RESOURCES: Final = ("nodes", "pods")
GPUNODES: Final = "gpunodes"
GangListener = Callable[[GangGroup, dict[str, NodeSpec], bool], None]
"""Told (under the cache's lock: it must not block) of every change of a gang reservation:
the group, the node specs, and whether the reservation has ended (its phase says how)."""


class PodUnknownError(LookupError):
    """The cache knows neither the pod nor a hold for it (the caller may fetch it and retry)."""


class BindRefusedError(RuntimeError):
    """The pod cannot be bound to the node (the message is the reason)."""


@dataclass(frozen=True, slots=True)
class Hold:
    """GPUs (and CPU/memory) held on a node for a pod until its bind, or until `expires_at`."""

    alloc_id: str
    pod: str  # pod identity; "" for a group member not yet claimed
    node: str
    request: PodRequest
    gpu: PodGpuRequest | None
    grants: tuple[GpuGrant, ...]
    expires_at: float
    score: float = 0.0
    reason: str = ""
    group: str = ""
    uid: str = ""
    namespace: str = ""
    name: str = ""
    priority: int = 0


@dataclass(frozen=True, slots=True)
class FilterDecision:
    feasible: tuple[str, ...]
    """Nodes the pod may go to, best first; the first holds the pod's GPUs (`hold`)."""
    failed: dict[str, str]
    unresolvable: dict[str, str]
    hold: Hold | None
    topology_violation: str | None = None


@dataclass(frozen=True, slots=True)
class BindPlan:
    """What a bind must post, decided under the lock; `GpuCache.bind_done` records the outcome."""

    pod: str
    node: str
    annotations: dict[str, str]
    alloc_id: str | None  # the hold this bind realises (None for a pod without GPUs)
    assignment: c.Assignment | None = None
    already_bound: bool = False
    group: str = ""  # the gang whose slot this bind realises ("" for a lone pod)
    reservation_id: str = ""


@dataclass(frozen=True, slots=True)
class CacheStats:
    nodes: int
    gpus: int
    pods: int
    bound_pods: int
    pending_gpu_pods: int
    holds: int
    gangs: int
    unaccounted_pods: int
    conflicts: int
    rebuilds: int
    synced: bool
    sync_age_seconds: dict[str, float] = field(default_factory=dict)


_FILTER_REASONS: Final = tuple((f.reason, f.name in UNRESOLVABLE_FILTERS) for f in FILTERS)


@dataclass(frozen=True, slots=True, eq=False)
class _NodeLookup:
    state: ClusterState
    names: list[str]
    rows: npt.NDArray[np.int64]  # per name: its row, -1 when unknown
    candidates: npt.NDArray[np.int64]  # known rows, first occurrence order, no duplicates
    unknown: tuple[str, ...]


def _held_for(pod: PodInfo) -> dict[str, Any]:
    """The fields of a `Hold` that say whose it is."""
    return {
        "pod": pod.id,
        "gpu": pod.gpu,
        "uid": pod.uid,
        "namespace": pod.namespace,
        "name": pod.name,
        "priority": pod.priority,
    }


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


class GpuCache:
    """The extender's picture of the cluster's GPUs (thread-safe)."""

    def __init__(
        self,
        settings: SettingsSource | ExtenderSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(settings, SettingsSource):
            self.settings = settings
        else:
            self.settings = SettingsSource(initial=settings)
        self._clock = clock
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # bind barriers wait on it
        self._groups: dict[str, GangGroup] = {}
        self._rejected: dict[str, tuple[str, str]] = {}  # pod id -> (namespace, name): filter found no node
        self._nudge = False  # GPUs were released that rejected pods may now use
        self.on_gang_change: GangListener | None = None
        self._required: set[str] = set(RESOURCES)
        self._specs: dict[str, NodeSpec] = {}
        self._node_specs: dict[str, NodeSpec] = {}  # from the Node objects alone
        self._gpunodes: dict[str, GPUNode] = {}  # the agents' GPUNode objects, by node name
        self._pods: dict[str, PodInfo] = {}
        self._holds: dict[str, Hold] = {}
        self._hold_of: dict[str, str] = {}  # pod identity -> alloc id of its hold
        self._bound_sig: dict[str, tuple[object, ...]] = {}
        self._unaccounted: set[str] = set()
        self._synced: set[str] = set()
        self._heard: dict[str, float] = {}
        self.conflicts = 0
        self.rebuilds = 0
        self._current = self.settings.get()
        self._settings_version = self.settings.version
        self._state = ClusterState([])
        self._engine = self._new_engine(self._state)
        self._dirty = False
        self._memo: _NodeLookup | None = None

    # ---- plumbing ------------------------------------------------------------------------------
    def _new_engine(self, state: ClusterState) -> PlacementEngine:
        s = self._current
        return PlacementEngine(state, s.policy, weights=dict(s.weights) or None)

    def _ensure(self) -> None:
        """Bring the state up to date: settings, node changes, expired holds (lock held)."""
        settings = self.settings.get()
        if self.settings.version != self._settings_version:
            policy_changed = (settings.policy, settings.weights) != (
                self._current.policy,
                self._current.weights,
            )
            self._current, self._settings_version = settings, self.settings.version
            if policy_changed and not self._dirty:
                self._engine = self._new_engine(self._state)
        if self._dirty:
            self._rebuild()
        now = self._clock()
        for group in [g for g in self._groups.values() if g.expires_at <= now]:
            log.info(
                "gang %s: reservation expired with %d of %d members at bind",
                group.id,
                group.ready_members,
                group.size,
            )
            self._end_group(group, "Expired")
        for hold in [h for h in self._holds.values() if h.expires_at <= now]:
            log.info("hold %s for %s on %s expired", hold.alloc_id, hold.pod or hold.group, hold.node)
            self._drop_hold(hold.alloc_id)

    def _rebuild(self) -> None:
        specs = sorted(self._specs.values(), key=lambda s: s.name)
        self._state = ClusterState(specs)
        self._engine = self._new_engine(self._state)
        self._bound_sig.clear()
        self._unaccounted.clear()
        self._dirty = False
        self.rebuilds += 1
        for info in self._pods.values():
            if info.holds_resources:
                self._account(info)
        for hold in sorted(self._holds.values(), key=lambda h: h.expires_at):
            if hold.node not in self._state.index:
                continue  # dormant until its node is back (a bind may be in flight) or it expires
            if not self._allocate_hold(hold):
                log.info(
                    "hold %s dropped: no longer fits on %s after a node change", hold.alloc_id, hold.node
                )
                self._forget_hold(hold.alloc_id)

    def _allocate_hold(self, hold: Hold) -> bool:
        i = self._state.index.get(hold.node)
        if i is None:
            return False
        req = hold.request
        try:
            self._state.allocate(
                hold.alloc_id, i, req.cpu_milli, req.memory_mib, hold.grants, hold.expires_at
            )
        except OversubscriptionError:
            return False
        return True

    def _forget_hold(self, alloc_id: str) -> Hold | None:
        hold = self._holds.pop(alloc_id, None)
        if hold is not None and hold.pod and self._hold_of.get(hold.pod) == alloc_id:
            del self._hold_of[hold.pod]
        return hold

    def _drop_hold(self, alloc_id: str) -> Hold | None:
        hold = self._forget_hold(alloc_id)
        if alloc_id in self._state.allocations:
            self._state.release(alloc_id)
        return hold

    def _drop_hold_of(self, pod: str, *, bound: bool = False) -> None:
        """The pod no longer needs its hold: bound (`bound`), gone, finished or re-filtered.

        A gang slot is not dropped but handed back to the group (or marked bound).
        """
        alloc_id = self._hold_of.get(pod)
        if alloc_id is None:
            return
        hold = self._holds.get(alloc_id)
        if hold is not None and hold.group and hold.group in self._groups:
            self._leave_slot(hold, bound=bound)
        else:
            self._drop_hold(alloc_id)

    # ---- bound pods ------------------------------------------------------------------------------
    def _grants_of(self, info: PodInfo, i: int) -> tuple[GpuGrant, ...] | None:
        """The GPUs a bound pod holds on node row `i` (None: cannot be told)."""
        gpu = info.gpu
        if gpu is None:
            return ()
        st = self._state
        req = gpu.request
        spec = st.nodes[i]
        assignment = info.assignment
        if assignment is not None and assignment.node == info.node:
            by_uuid = {g.uuid: g.index for g in spec.gpus}
            grants: list[GpuGrant] = []
            for uuid, profile, start in assigned_gpu_uuids(assignment):
                j = by_uuid.get(uuid)
                if j is None:
                    break
                if profile is not None:
                    grants.append(GpuGrant(j, 0, 0, profile, start))
                elif req.exclusive:
                    grants.append(GpuGrant(j, int(st.gpu_milli_cap[i, j]), int(st.gpu_mem_cap[i, j])))
                else:
                    grants.append(GpuGrant(j, req.gpu_milli, req.gpu_memory_mib))
            else:
                if len(grants) == req.gpus:
                    return tuple(grants)
            log.warning(
                "pod %s: assignment on %s does not match the node's GPUs or the pod's request; "
                "holding GPUs the engine picks instead",
                info.key,
                info.node,
            )
        elif info.assignment_error:
            log.warning("pod %s: unreadable assignment (%s)", info.key, info.assignment_error)
        # A GPU pod bound without (a usable) assignment: hold what the engine would give it there.
        try:
            grants_guess, _ = self._engine.select_gpus(info.request, i)
        except RuntimeError:
            return None
        return tuple(grants_guess)

    def _account(self, info: PodInfo) -> None:
        """Make the state hold exactly what `info` holds (lock held, state current)."""
        st = self._state
        alloc_id = "pod/" + info.id
        i = st.index.get(info.node) if info.holds_resources else None
        if i is None:  # finished, pending, or on a node not (yet) known: holds nothing here
            if alloc_id in st.allocations:
                st.release(alloc_id)
            self._bound_sig.pop(info.id, None)
            self._unaccounted.discard(info.id)
            return
        # What decides the allocation; status-only updates (most pod events) change none of it.
        signature: tuple[object, ...] = (
            info.node,
            info.cpu_milli,
            info.memory_mib,
            info.gpu,
            info.assignment,
        )
        if self._bound_sig.get(info.id) == signature and (
            alloc_id in st.allocations or info.id in self._unaccounted
        ):
            return  # unchanged (a conflict is retried when the pod or the node set changes)
        if alloc_id in st.allocations:
            st.release(alloc_id)
        self._bound_sig.pop(info.id, None)
        self._drop_hold_of(info.id, bound=True)  # bound: its hold (if any) is fulfilled
        grants = self._grants_of(info, i)
        if grants is None:
            self._unaccounted.add(info.id)
            log.warning("pod %s on %s: its GPUs cannot be told; they are not counted", info.key, info.node)
            grants = ()
        self._bound_sig[info.id] = signature
        if not self._allocate_evicting(alloc_id, i, info.cpu_milli, info.memory_mib, grants):
            self.conflicts += 1
            self._unaccounted.add(info.id)
            log.error(
                "pod %s is bound to %s but its resources are not free there (double booking?); "
                "it is not counted",
                info.key,
                info.node,
            )
            return
        if grants or info.gpu is None:
            self._unaccounted.discard(info.id)

    def _allocate_evicting(
        self, alloc_id: str, i: int, cpu: int, memory: int, grants: tuple[GpuGrant, ...]
    ) -> bool:
        """Allocate for a bound pod; holds on the node give way to it (the API server is the truth)."""
        st = self._state
        holds = sorted(
            (h for h in self._holds.values() if st.index.get(h.node) == i), key=lambda h: -h.expires_at
        )
        while True:
            try:
                st.allocate(alloc_id, i, cpu, memory, grants)
                return True
            except OversubscriptionError:
                if not holds:
                    return False
                victim = holds.pop(0)
                log.info("hold %s on %s gives way to a bound pod", victim.alloc_id, victim.node)
                self._drop_hold(victim.alloc_id)

    # ---- feeding from the API server -------------------------------------------------------------
    def _spec_of(self, node: Node) -> NodeSpec:
        try:
            return node_spec_from_node(node)
        except NodeSpecError as exc:
            log.warning("%s: nothing will be placed there", exc)
            return unusable_node(node.metadata.name)

    def _merged(self, spec: NodeSpec) -> NodeSpec:
        gpunode = self._gpunodes.get(spec.name)
        return (
            spec
            if gpunode is None or (not spec.schedulable and not spec.gpus)
            else apply_gpunode(spec, gpunode)
        )

    def _set_spec(self, name: str) -> None:
        """Recompute `name`'s spec from its Node and GPUNode (lock held)."""
        base = self._node_specs.get(name)
        spec = None if base is None else self._merged(base)
        if self._specs.get(name) != spec:
            if spec is None:
                del self._specs[name]
            else:
                self._specs[name] = spec
            self._dirty = True

    def set_node_specs(self, specs: Iterable[NodeSpec]) -> None:
        """Replace the node set with ready-made specs (tests, benchmarks)."""
        with self._lock:
            self._node_specs = {s.name: s for s in specs}
            new = {name: self._merged(s) for name, s in self._node_specs.items()}
            if new != self._specs:
                self._specs = new
                self._dirty = True

    def replace_nodes(self, nodes: Iterable[Node]) -> None:
        """The node set after a (re)list."""
        self.set_node_specs(self._spec_of(n) for n in nodes if n.metadata.name)
        self.touch("nodes")

    def upsert_node(self, node: Node) -> None:
        if not node.metadata.name:
            return
        spec = self._spec_of(node)
        with self._lock:
            self._node_specs[spec.name] = spec
            self._set_spec(spec.name)
        self.touch("nodes")

    def delete_node(self, name: str) -> None:
        with self._lock:
            self._node_specs.pop(name, None)
            self._set_spec(name)
        self.touch("nodes")

    # ---- the agents' GPUNode objects -------------------------------------------------------------
    def replace_gpunodes(self, objs: Iterable[GPUNode]) -> None:
        """Every GPUNode after a (re)list: each node's GPUs as its agent discovered them."""
        with self._lock:
            new = {str(o.metadata.get("name") or ""): o for o in objs}
            new.pop("", None)
            names = set(new) | set(self._gpunodes)
            self._gpunodes = new
            for name in names:
                self._set_spec(name)
        self.touch(GPUNODES)

    def upsert_gpunode(self, obj: GPUNode) -> None:
        name = str(obj.metadata.get("name") or "")
        if name:
            with self._lock:
                self._gpunodes[name] = obj
                self._set_spec(name)
        self.touch(GPUNODES)

    def delete_gpunode(self, name: str) -> None:
        with self._lock:
            if self._gpunodes.pop(name, None) is not None:
                self._set_spec(name)
        self.touch(GPUNODES)

    def _merge(self, info: PodInfo) -> PodInfo:
        old = self._pods.get(info.id)
        if old is not None and old.node and not info.node:
            # nodeName is write-once: an event showing the pod unbound predates our binding.
            return replace(
                info, node=old.node, assignment=old.assignment, assignment_error=old.assignment_error
            )
        return info

    def _upsert(self, info: PodInfo) -> None:
        info = self._merge(info)
        self._pods[info.id] = info
        if info.terminal:
            self._drop_hold_of(info.id)
        if not self._dirty:
            self._account(info)

    def upsert_pod(self, pod: Pod) -> None:
        info = PodInfo.from_pod(pod)
        with self._lock:
            self._upsert(info)
        self.touch("pods")

    def delete_pod(self, pod: Pod) -> None:
        info = PodInfo.from_pod(pod)
        with self._lock:
            self._remove(info.id)
        self.touch("pods")

    def _remove(self, pod_id: str) -> None:
        self._pods.pop(pod_id, None)
        self._rejected.pop(pod_id, None)
        self._drop_hold_of(pod_id)
        alloc_id = "pod/" + pod_id
        if alloc_id in self._state.allocations:
            self._state.release(alloc_id)
        self._bound_sig.pop(pod_id, None)
        self._unaccounted.discard(pod_id)

    def replace_pods(self, pods: Iterable[Pod]) -> None:
        """The pod set after a (re)list: pods not in it are gone."""
        infos = [PodInfo.from_pod(p) for p in pods]
        with self._lock:
            keep = {i.id for i in infos}
            for gone in [k for k in self._pods if k not in keep]:
                self._remove(gone)
            for info in infos:
                self._upsert(info)
        self.touch("pods")

    def touch(self, resource: str) -> None:
        """The API server just told this cache something about `resource` (sync age 0)."""
        self._heard[resource] = self._clock()

    def mark_synced(self, resource: str) -> None:
        """The first list of `resource` ("nodes" or "pods") is in."""
        with self._lock:
            self._synced.add(resource)
        self.touch(resource)

    def require_sync(self, resource: str) -> None:
        """`synced` also waits for `resource` (e.g. the gang reservations a restart restores)."""
        with self._lock:
            self._required.add(resource)

    def is_synced(self, resource: str) -> bool:
        with self._lock:
            return resource in self._synced

    @property
    def synced(self) -> bool:
        return all(r in self._synced for r in self._required)

    def sync_age(self, resource: str) -> float:
        """Seconds since the API server last told this cache anything about `resource` (inf: never)."""
        heard = self._heard.get(resource)
        return float("inf") if heard is None else max(0.0, self._clock() - heard)

    # ---- decisions -----------------------------------------------------------------------------
    def _lookup(self, names: Sequence[str]) -> _NodeLookup:
        """Rows of `names` in the current state (memoised: kube-scheduler repeats its node list)."""
        memo = self._memo
        if memo is not None and memo.state is self._state and memo.names == names:
            return memo
        index = self._state.index
        rows = np.fromiter((index.get(n, -1) for n in names), dtype=np.int64, count=len(names))
        known = rows[rows >= 0]
        _, first = np.unique(known, return_index=True)
        candidates = known[np.sort(first)]
        unknown = tuple(dict.fromkeys(n for n, r in zip(names, rows.tolist(), strict=True) if r < 0))
        memo = _NodeLookup(self._state, list(names), rows, candidates, unknown)
        self._memo = memo
        return memo

    def _reasons(
        self, candidates: npt.NDArray[np.int64], reasons: npt.NDArray[np.int16]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """(FailedNodes, FailedAndUnresolvableNodes) for the rejected `candidates`."""
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        codes = reasons[candidates]
        bad = np.nonzero(codes != FEASIBLE)[0]
        nodes = self._state.nodes
        for i, code in zip(candidates[bad].tolist(), codes[bad].tolist(), strict=True):
            reason, hopeless = _FILTER_REASONS[code]
            (unresolvable if hopeless else failed)[nodes[i].name] = reason
        return failed, unresolvable

    def _place(
        self, req: PodRequest, candidates: npt.NDArray[np.int64], top_k: int
    ) -> tuple[Placement | None, list[int]]:
        """The engine's placement among `candidates`, and up to `top_k` feasible rows best first."""
        engine = self._engine
        everything = candidates.size == self._state.n_nodes
        cand = None if everything else candidates
        try:
            placement = engine.place(req, candidates=cand)
        except RuntimeError:
            placement = None
        if placement is not None and top_k <= 1:
            return placement, [placement.node_index]
        ev = engine.evaluate(req, cand)
        if ev.rows.size == 0:
            return None, []
        k = min(top_k + 1, ev.rows.size)
        best = np.argpartition(-ev.node_scores, k - 1)[:k] if k < ev.rows.size else np.arange(ev.rows.size)
        order = [int(ev.rows[j]) for j in best[np.argsort(-ev.node_scores[best], kind="stable")]]
        if placement is not None:
            return placement, [placement.node_index, *(i for i in order if i != placement.node_index)][:top_k]
        # The engine's GPU selection refused its own first choice: take the next node that works.
        for i in (int(ev.rows[j]) for j in np.argsort(-ev.node_scores, kind="stable")):
            try:
                grants, why = engine.select_gpus(req, i)
            except RuntimeError:
                continue
            node = self._state.nodes[i].name
            return Placement(req, node, i, tuple(grants), 0.0, why), [i]
        return None, []

    def _hold(self, pod: PodInfo, placement: Placement, ttl: float) -> Hold | None:
        alloc_id = "hold/" + pod.id
        req = placement.request
        expires = self._clock() + ttl
        try:
            alloc = self._state.allocate(
                alloc_id, placement.node_index, req.cpu_milli, req.memory_mib, placement.grants, expires
            )
        except OversubscriptionError as exc:
            log.error("engine placement of %s on %s does not fit: %s", pod.key, placement.node, exc)
            return None
        hold = Hold(
            alloc_id=alloc_id,
            node=placement.node,
            request=req,
            grants=alloc.grants,
            expires_at=expires,
            score=placement.score,
            reason=placement.reason,
            **_held_for(pod),
        )
        self._holds[alloc_id] = hold
        self._hold_of[pod.id] = alloc_id
        return hold

    def _violated_locality(self, placement: Placement) -> str | None:
        req = placement.request
        if len(placement.grants) < 2 or req.locality not in (Locality.NVLINK, Locality.SAME_SOCKET):
            return None
        st, i = self._state, placement.node_index
        cols = [g.gpu_index for g in placement.grants]
        if req.locality is Locality.NVLINK:
            groups = {int(st.gpu_nvlink_group[i, j]) for j in cols}
            ok = len(groups) == 1 and min(groups) >= 0
        else:
            ok = len({int(st.gpu_socket[i, j]) for j in cols}) == 1
        return None if ok else req.locality.value

    def filter(self, pod: PodInfo, node_names: Sequence[str], gang: GangSpec | None = None) -> FilterDecision:
        decision = self._filter(pod, node_names, gang)
        with self._lock:
            if decision.feasible:
                self._rejected.pop(pod.id, None)
            elif pod.gpu is not None:
                self._rejected[pod.id] = (pod.namespace, pod.name)
        return decision

    def take_nudges(self) -> list[tuple[str, str]]:
        """Pending pods the filter rejected, once GPUs they may fit were released since (then the
        list is cleared): kube-scheduler parks extender-rejected pods for up to 5 minutes unless
        something about them changes, so the caller touches them (`ReservationStore`)."""
        with self._lock:
            if not self._nudge:
                return []
            self._nudge = False
            out = [
                key
                for pod_id, key in self._rejected.items()
                if (p := self._pods.get(pod_id)) is not None and p.pending_gpu
            ]
            self._rejected.clear()
            return out

    def _filter(self, pod: PodInfo, node_names: Sequence[str], gang: GangSpec | None) -> FilterDecision:
        """The engine's choice for a GPU pod among `node_names`, held at once for the assume TTL.

        Any earlier hold of the pod is replaced. Rejected nodes get their engine filter's
        categorical reason (unresolvable ones separately: preemption cannot help there). A gang
        member (`pod.gang`, with the group's size and TTL in `gang`) gets its slot of the group's
        reservation, made now for the whole group if there is none.
        """
        with self._lock:
            self._ensure()
            lookup = self._lookup(node_names)
            unknown = dict.fromkeys(lookup.unknown, REASON_UNKNOWN_NODE)
            if gang is not None and pod.gang is not None and not pod.gpu_error:
                decided = self._filter_gang(pod, lookup, unknown, gang)
                if decided is not None:
                    return decided
            self._drop_hold_of(pod.id)
            if pod.gpu_error:
                reason = _short(f"invalid gpu request: {pod.gpu_error}")
                nodes = self._state.nodes
                return FilterDecision(
                    (), unknown, {nodes[i].name: reason for i in lookup.candidates.tolist()}, None
                )
            req = pod.request
            top_k = self._current.filter_top_k
            placement, order = self._place(req, lookup.candidates, top_k)
            failed, unresolvable = self._reasons(lookup.candidates, self._engine.evaluate(req, ()).reasons)
            failed.update(unknown)
            if placement is None:
                return FilterDecision((), failed, unresolvable, None)
            hold = self._hold(pod, placement, self._current.assume_ttl_seconds)
            if hold is None:
                failed[placement.node] = "gpu placement conflict, retry"
                return FilterDecision((), failed, unresolvable, None)
            nodes = self._state.nodes
            top = tuple(nodes[i].name for i in order[:top_k])
            return FilterDecision(top, failed, unresolvable, hold, self._violated_locality(placement))

    def prioritize(self, pod: PodInfo, node_names: Sequence[str]) -> list[int]:
        """0..10 per node: the engine's scores; the node holding the pod's GPUs alone gets 10.

        The engine's scale (`PlacementEngine.prioritize`): the best feasible node of the cluster
        is 10, the worst 0, linear between; infeasible and unknown nodes 0. (The hold was made with
        the pod's GPUs taken, so the engine's view of that node is skewed; and kube-scheduler
        should bind where the GPUs are held.)
        """
        with self._lock:
            self._ensure()
            if pod.gpu_error:
                return [0] * len(node_names)
            lookup = self._lookup(node_names)
            ev = self._engine.evaluate(pod.request)
            scores = np.zeros(len(node_names), dtype=np.int64)
            finite = np.isfinite(ev.node_scores)
            if finite.any():
                values = ev.node_scores[finite]
                lo, hi = float(values.min()), float(values.max())
                full = np.full(self._state.n_nodes, np.nan)
                full[ev.rows[finite]] = values
                known = lookup.rows >= 0
                mine = full[lookup.rows[known]]
                scaled = np.full(mine.shape, 10.0) if hi - lo <= 0 else np.round(10 * (mine - lo) / (hi - lo))
                scores[known] = np.where(np.isnan(mine), 0, scaled).astype(np.int64)
            alloc_id = self._hold_of.get(pod.id)
            if alloc_id is not None:
                held = self._state.index.get(self._holds[alloc_id].node, -2)
                scores = np.where(lookup.rows == held, 10, np.minimum(scores, 9))
            return [int(x) for x in scores.tolist()]

    def prepare_bind(self, pod_id: str, node: str, pod: PodInfo | None = None) -> BindPlan:
        """The Binding's annotations for `pod_id` on `node`, from its hold (or a placement made now).

        The hold is re-stamped with a full TTL, so it cannot expire while the Binding is posted.

        Raises:
            PodUnknownError: neither a hold nor the pod is known (pass `pod` after fetching it).
            BindRefusedError: the pod cannot go to `node` (already bound elsewhere, no room).
        """
        with self._lock:
            self._ensure()
            known = self._pods.get(pod_id)
            if known is not None and known.node:
                if known.node != node:
                    raise BindRefusedError(f"pod {known.key} is already bound to {known.node}")
                return BindPlan(pod_id, node, {}, None, known.assignment, already_bound=True)
            info = pod or known
            alloc_id = self._hold_of.get(pod_id)
            hold = self._holds.get(alloc_id) if alloc_id is not None else None
            group = self._groups.get(hold.group) if hold is not None and hold.group else None
            if hold is not None and group is not None and hold.node != node:
                raise BindRefusedError(f"gang {group.name}: this member's gpus are reserved on {hold.node}")
            if hold is not None and hold.node != node:
                log.info(
                    "pod %s binds to %s, not to %s where its hold was: placing again", pod_id, node, hold.node
                )
                self._drop_hold(hold.alloc_id)
                hold = None
            if hold is None:
                if info is None:
                    raise PodUnknownError(pod_id)
                if info.gpu_error:
                    raise BindRefusedError(_short(f"invalid gpu request: {info.gpu_error}"))
                if info.gpu is None:
                    return BindPlan(pod_id, node, {}, None)
                i = self._state.index.get(node)
                if i is None:
                    raise BindRefusedError(f"{node}: {REASON_UNKNOWN_NODE}")
                placement, _ = self._place(info.request, np.array([i], dtype=np.int64), 1)
                if placement is None:
                    reason = self._engine.evaluate(info.request, ()).reason_text(i) or "no room"
                    raise BindRefusedError(f"{node}: {reason}")
                hold = self._hold(info, placement, self._current.assume_ttl_seconds)
                if hold is None:
                    raise BindRefusedError(f"{node}: gpu placement conflict")
            elif node not in self._state.index:
                if group is None:
                    self._drop_hold(hold.alloc_id)
                raise BindRefusedError(f"{node}: {REASON_UNKNOWN_NODE}")
            elif group is None:
                hold = replace(hold, expires_at=self._clock() + self._current.assume_ttl_seconds)
                self._holds[hold.alloc_id] = hold
            assert hold.gpu is not None
            i = self._state.index[node]
            placement = Placement(hold.request, node, i, hold.grants, hold.score, hold.reason)
            uid = info.assignment_uid if info is not None else (hold.uid or None)
            gang_doc = self._gang_assignment(group)
            try:
                assignment = build_assignment(
                    placement, self._state.nodes[i], hold.gpu, pod_uid=uid if uid else None, gang=gang_doc
                )
            except ValueError as exc:
                if group is None:
                    self._drop_hold(hold.alloc_id)
                raise BindRefusedError(_short(f"cannot build the gpu assignment: {exc}")) from None
            annotations = {c.ANNOTATION_ASSIGNED_GPUS: c.encode_assignment(assignment)}
            if self._current.visible_devices_annotations:
                annotations.update(visible_devices_annotations(assignment))
            if group is not None:
                return BindPlan(
                    pod_id,
                    node,
                    annotations,
                    hold.alloc_id,
                    assignment,
                    group=group.id,
                    reservation_id=group.reservation_id,
                )
            return BindPlan(pod_id, node, annotations, hold.alloc_id, assignment)

    def bind_done(self, plan: BindPlan, *, ok: bool, ambiguous: bool = False, pod: Pod | None = None) -> None:
        """Record a bind's outcome.

        On success the hold becomes the pod's committed allocation (the watch will report the
        same pod; that is a no-op). On a definite failure the hold is released; on an ambiguous
        one (timeout, server error) it stays until the watch tells or the TTL ends.
        """
        with self._lock:
            hold = self._holds.get(plan.alloc_id) if plan.alloc_id else None
            if not ok:
                if hold is not None and not ambiguous:
                    group = self._groups.get(hold.group) if hold.group else None
                    if group is not None:
                        # After the barrier: a partial gang. The operator recreates the group.
                        log.warning("gang %s: binding %s failed after the barrier", group.id, plan.pod)
                        self._end_group(group, "Failed")
                    else:
                        self._drop_hold(hold.alloc_id)
                return
            if pod is not None:
                self._upsert(PodInfo.from_pod(pod))
                return
            info = self._pods.get(plan.pod)
            if info is None and hold is not None:
                info = PodInfo(
                    id=plan.pod,
                    uid=hold.uid,
                    namespace=hold.namespace,
                    name=hold.name,
                    node="",
                    phase="Pending",
                    deleting=False,
                    priority=hold.priority,
                    cpu_milli=hold.request.cpu_milli,
                    memory_mib=hold.request.memory_mib,
                    gpu=hold.gpu,
                    gpu_error="",
                    assignment=None,
                    assignment_error="",
                    resource_version="",
                )
            if info is None:
                return  # a pod without GPUs the watch will report
            if hold is not None:
                self._drop_hold_of(plan.pod, bound=True)
                if plan.alloc_id in self._holds:
                    self._drop_hold(hold.alloc_id)
            self._upsert(info.bound_to(plan.node, plan.assignment))

    def refine_victims(self, pod: PodInfo, node: str, victims: Sequence[tuple[str, int]]) -> list[str] | None:
        """The fewest of `victims` ((pod identity, priority)) whose removal lets `pod` onto `node`.

        Victims go lowest priority first until the pod fits, then each is given back (highest
        priority first) if the pod still fits without evicting it. Works on a scratch copy of the
        node: nothing in the cache changes. None: even all victims do not make room.
        """
        with self._lock:
            self._ensure()
            i = self._state.index.get(node)
            if i is None or pod.gpu_error:
                return None
            st = self._state
            scratch = ClusterState([st.nodes[i]], max_gpus_per_node=st.max_gpus)
            own = self._hold_of.get(pod.id)
            for alloc_id in sorted(st.by_node[i]):
                if alloc_id == own:
                    continue
                a = st.allocations[alloc_id]
                scratch.allocate(alloc_id, 0, a.cpu_milli, a.memory_mib, a.grants)
            engine = PlacementEngine(scratch, self._engine.policy)
        req = pod.request

        def fits() -> bool:
            try:
                return engine.place(req, candidates=[0]) is not None
            except RuntimeError:
                return False

        ordered = sorted(victims, key=lambda v: (v[1], v[0]))
        removed: list[tuple[str, int, Allocation]] = []
        if not fits():
            for pod_id, priority in ordered:
                alloc = scratch.allocations.get("pod/" + pod_id)
                if alloc is None:
                    continue  # holds nothing on this node
                scratch.release(alloc.id)
                removed.append((pod_id, priority, alloc))
                if fits():
                    break
            else:
                return None
        kept: set[str] = set()
        for pod_id, _, alloc in sorted(removed, key=lambda r: (-r[1], r[0])):
            scratch.allocate(alloc.id, 0, alloc.cpu_milli, alloc.memory_mib, alloc.grants)
            if fits():
                kept.add(pod_id)
            else:
                scratch.release(alloc.id)
        return [pod_id for pod_id, _, _ in removed if pod_id not in kept]

    # ---- gang reservations ---------------------------------------------------------------------
    def _emit(self, group: GangGroup, ended: bool = False) -> None:
        listener = self.on_gang_change
        if listener is not None:
            try:
                listener(group, self._specs, ended)
            except Exception:  # a listener's failure must not break a decision
                log.exception("gang %s: reservation listener failed", group.id)

    def _end_group(self, group: GangGroup, phase: str) -> int:
        """Release every unbound slot of `group` and forget it; returns how many were held."""
        if self._groups.get(group.id) is group:
            del self._groups[group.id]
        held = 0
        for slot in group.slots:
            if not slot.bound and slot.alloc_id in self._holds:
                self._drop_hold(slot.alloc_id)
                held += 1
        group.phase = phase
        if held:
            self._nudge = True
        self._emit(group, ended=True)
        self._cond.notify_all()
        return held

    def _plan_group(
        self,
        group_id: str,
        namespace: str,
        name: str,
        size: int,
        members: Sequence[PodRequest],
        locality: Locality,
        ttl: float,
        candidates: Sequence[int] | None = None,
    ) -> GangGroup | None:
        """Plan and hold every member of a group at once (`plan_gang`), or nothing."""
        prefix = f"group/{group_id}"
        plan = plan_gang(self._engine, members, locality, alloc_prefix=prefix, candidates=candidates)
        if plan is None:
            return None
        expires = self._clock() + ttl
        group = GangGroup(
            id=group_id,
            namespace=namespace,
            name=name,
            size=size,
            locality=locality,
            expires_at=expires,
            expires_wall=time.time() + ttl,
            slots=[],
        )
        holds = []
        for k, (placement, alloc_id) in enumerate(zip(plan.placements, plan.alloc_ids, strict=True)):
            alloc = self._state.allocations[alloc_id]
            self._state.release(alloc_id)  # re-held below, as a hold with the group's deadline
            holds.append(
                Hold(
                    alloc_id=alloc_id,
                    pod="",
                    node=placement.node,
                    request=placement.request,
                    gpu=None,
                    grants=alloc.grants,
                    expires_at=expires,
                    score=placement.score,
                    reason=placement.reason,
                    group=group_id,
                )
            )
            group.slots.append(GangSlot(k, alloc_id, members[k], placement.node, alloc.grants))
        for hold in holds:
            ok = self._allocate_hold(hold)
            assert ok, "a group plan that was just committed must fit again"
            self._holds[hold.alloc_id] = hold
        self._groups[group_id] = group
        self._emit(group)
        return group

    def _claim(self, group: GangGroup, slot: GangSlot, pod: PodInfo) -> Hold:
        """`pod` takes `slot` (its hold now carries the pod's identity and GPU request)."""
        old = self._hold_of.get(pod.id)
        if old is not None and old != slot.alloc_id:
            self._drop_hold_of(pod.id)
        hold = replace(self._holds[slot.alloc_id], request=pod.request, **_held_for(pod))
        self._holds[slot.alloc_id] = hold
        self._hold_of[pod.id] = slot.alloc_id
        slot.pod, slot.pod_name, slot.pod_uid = pod.id, pod.name, pod.uid
        self._emit(group)
        return hold

    def _leave_slot(self, hold: Hold, *, bound: bool) -> None:
        """A member's slot: bound (its GPUs are the pod's now), or handed back to the group."""
        group = self._groups[hold.group]
        slot = next(s for s in group.slots if s.alloc_id == hold.alloc_id)
        group.arrived.discard(hold.pod)
        if bound:
            slot.bound = True
            self._drop_hold(hold.alloc_id)
            if all(s.bound for s in group.slots):
                log.info("gang %s: all %d members bound", group.id, group.size)
                self._end_group(group, "Bound")
                return
        else:
            if self._hold_of.get(hold.pod) == hold.alloc_id:
                del self._hold_of[hold.pod]
            self._holds[hold.alloc_id] = replace(
                hold, pod="", request=slot.request, gpu=None, uid="", namespace="", name="", priority=0
            )
            slot.pod = slot.pod_name = slot.pod_uid = ""
        self._emit(group)
        self._cond.notify_all()

    def _gang_reject(
        self, lookup: _NodeLookup, unknown: dict[str, str], reason: str, keep: int = -1
    ) -> dict[str, str]:
        nodes = self._state.nodes
        failed = {nodes[i].name: reason for i in lookup.candidates.tolist() if i != keep}
        failed.update(unknown)
        return failed

    def _filter_gang(
        self, pod: PodInfo, lookup: _NodeLookup, unknown: dict[str, str], spec: GangSpec
    ) -> FilterDecision | None:
        """A gang member's filter: its slot in the group's reservation (None: place it alone)."""
        gang = pod.gang
        group_id = pod.gang_id
        assert gang is not None and group_id is not None
        group = self._groups.get(group_id)
        if group is not None and any(not s.bound and s.alloc_id not in self._holds for s in group.slots):
            log.info("gang %s: a reserved slot was lost (node change or eviction); planning again", group_id)
            self._end_group(group, "Released")
            group = None
        if group is None:
            mates = [p for p in self._pods.values() if p.gang_id == group_id and p.id != pod.id]
            bound = sum(1 for p in mates if p.holds_resources and p.gpu is not None)
            needed = spec.size - bound
            if needed <= 0:
                return None  # the gang is complete: an extra member is placed like any pod
            waiting = sorted(
                (p for p in mates if p.pending_gpu and p.gpu is not None and not p.gpu_error),
                key=lambda p: p.name,
            )
            members = [pod.request, *(p.request for p in waiting[: needed - 1])]
            members += [pod.request] * (needed - len(members))
            locality = pod.request.locality
            group = self._plan_group(
                group_id,
                pod.namespace,
                gang.name,
                spec.size,
                members,
                locality,
                spec.ttl_seconds,
                lookup.candidates.tolist(),
            )
            if group is None:
                where = "" if locality is Locality.ANY else f" {locality.value}"
                reason = f"gang {gang.name}: no room for all {needed} members{where}"
                return FilterDecision((), self._gang_reject(lookup, unknown, reason), {}, None)
        slot = next((s for s in group.slots if s.pod == pod.id and not s.bound), None)
        if slot is None:
            free = [s for s in group.slots if not s.pod and not s.bound]
            slot = next((s for s in free if same_shape(s.request, pod.request)), None)
            if slot is None:
                reason = (
                    f"gang {gang.name}: no reserved member slot has this pod's resources"
                    if free
                    else f"gang {gang.name}: all {len(group.slots)} reserved member slots are taken"
                )
                return FilterDecision((), self._gang_reject(lookup, unknown, reason), {}, None)
            hold = self._claim(group, slot, pod)
        else:
            hold = self._holds[slot.alloc_id]
        row = self._state.index.get(slot.node, -1)
        if row < 0 or not bool((lookup.candidates == row).any()):
            reason = (
                f"gang {gang.name}: this member's gpus are reserved on {slot.node}, not among these nodes"
            )
            return FilterDecision((), self._gang_reject(lookup, unknown, reason), {}, None)
        reason = f"gang {gang.name}: gpus reserved on {slot.node}"
        placement = Placement(hold.request, slot.node, row, hold.grants, hold.score, hold.reason)
        return FilterDecision(
            (slot.node,),
            self._gang_reject(lookup, unknown, reason, keep=row),
            {},
            hold,
            self._violated_locality(placement),
        )

    @staticmethod
    def _gang_assignment(group: GangGroup | None) -> c.GangAssignment | None:
        if group is None:
            return None
        try:
            return msgspec.convert({"name": group.name, "size": group.size}, c.GangAssignment)
        except msgspec.ValidationError:
            return None  # e.g. a Volcano group name longer than a label value: not recorded

    def await_gang(self, plan: BindPlan, *, timeout: float | None = None) -> str | None:
        """The bind barrier: wait until every member of `plan.group` has reached bind.

        Returns None when the Binding may be posted, else why not (the reservation expired or
        was released first, or `timeout` passed). Called from the bind's own thread; the lock is
        released while waiting.
        """
        give_up = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                self._ensure()
                group = self._groups.get(plan.group)
                if group is None or group.reservation_id != plan.reservation_id:
                    return "gang reservation ended before every member reached bind (expired or released)"
                slot = next((s for s in group.slots if s.pod == plan.pod), None)
                if slot is None or (not slot.bound and slot.alloc_id not in self._holds):
                    return f"gang {group.name}: this member's reserved gpus were released"
                if plan.pod not in group.arrived and not slot.bound:
                    group.arrived.add(plan.pod)
                    self._emit(group)
                    self._cond.notify_all()
                if group.open or group.ready_members >= group.size:
                    if not group.open:
                        self._open_barrier(group)
                    return None
                now = self._clock()
                if give_up is not None and now >= give_up:
                    return (
                        f"gang {group.name}: {group.ready_members} of {group.size} "
                        "members at bind; still waiting"
                    )
                limit = group.expires_at if give_up is None else min(group.expires_at, give_up)
                self._cond.wait(min(max(limit - now, 0.01), 0.5))

    def _open_barrier(self, group: GangGroup) -> None:
        """Every member reached bind: the Bindings go out; holds last the assume TTL from now."""
        group.open = True
        group.phase = "Binding"
        ttl = self._current.assume_ttl_seconds
        deadline = self._clock() + ttl
        if deadline > group.expires_at:
            group.expires_wall += deadline - group.expires_at
            group.expires_at = deadline
        for slot in group.slots:
            hold = self._holds.get(slot.alloc_id)
            if hold is not None:
                self._holds[slot.alloc_id] = replace(hold, expires_at=group.expires_at)
        log.info("gang %s: all %d members at bind, binding", group.id, group.size)
        self._emit(group)
        self._cond.notify_all()

    def restore_gangs(self, restored: Iterable[RestoredGang]) -> int:
        """Hold the slots of reservations read back from the API (an extender restart).

        Expired ones are ended (their objects updated); slots whose pod is bound already count
        as bound; a reservation whose slots no longer fit is released. Returns how many groups
        were restored.
        """
        count = 0
        with self._lock:
            now, wall = self._clock(), time.time()
            for r in restored:
                group_id = f"{r.namespace}/{r.name}"
                if group_id in self._groups or r.phase not in ("Reserved", "Binding"):
                    continue
                remaining = r.expires_wall - wall
                group = GangGroup(
                    id=group_id,
                    namespace=r.namespace,
                    name=r.name,
                    size=r.size,
                    locality=r.locality,
                    expires_at=now + remaining,
                    expires_wall=r.expires_wall,
                    slots=[replace(s) for s in r.slots],
                    phase=r.phase,
                    open=r.phase == "Binding",
                )
                if r.reservation_id:
                    group.reservation_id = r.reservation_id
                if remaining <= 0:
                    self._end_group(group, "Expired")
                    continue
                self._groups[group_id] = group
                by_name = {
                    (p.namespace, p.name): p for p in self._pods.values() if p.namespace == r.namespace
                }
                intact = True
                for slot in group.slots:
                    pod = self._pods.get(slot.pod_uid) if slot.pod_uid else None
                    if pod is None and slot.pod_name:
                        pod = by_name.get((r.namespace, slot.pod_name))
                    if pod is not None and pod.holds_resources:
                        slot.bound = True
                    if slot.bound:
                        continue
                    spec = self._specs.get(slot.node)
                    if spec is not None and slot.request.exclusive:
                        mem = {g.index: g.memory_mib for g in spec.gpus}
                        slot.grants = tuple(
                            replace(g, memory_mib=mem.get(g.gpu_index, g.memory_mib)) for g in slot.grants
                        )
                    hold = Hold(
                        alloc_id=slot.alloc_id,
                        pod="",
                        node=slot.node,
                        request=slot.request,
                        gpu=None,
                        grants=slot.grants,
                        expires_at=group.expires_at,
                        reason="restored gang reservation",
                        group=group_id,
                    )
                    self._holds[slot.alloc_id] = hold
                    if not self._dirty and slot.node in self._state.index and not self._allocate_hold(hold):
                        intact = False
                    slot.pod = slot.pod_name = slot.pod_uid = ""
                    if pod is not None and pod.pending_gpu and not pod.gpu_error:
                        self._claim(group, slot, pod)
                if not intact:
                    log.warning("gang %s: restored reservation no longer fits; released", group_id)
                    self._end_group(group, "Released")
                    continue
                if all(s.bound for s in group.slots):
                    self._end_group(group, "Bound")
                    continue
                log.info("gang %s: reservation restored (%d slots)", group_id, len(group.slots))
                self._emit(group)
                count += 1
        return count

    def release_gang(self, group_id: str, reservation_id: str | None = None) -> int:
        """Release every slot of `group_id` (only if it is still `reservation_id`, when given)."""
        with self._lock:
            group = self._groups.get(group_id)
            if group is None or (reservation_id is not None and group.reservation_id != reservation_id):
                return 0
            return self._end_group(group, "Released")

    def reserve_group(
        self,
        group: str,
        members: Sequence[PodRequest],
        locality: Locality = Locality.ANY,
        ttl: float | None = None,
    ) -> tuple[Hold, ...] | None:
        """Hold GPUs for every member of `group` at once (`plan_gang`), or for none.

        The slots (``group/<group>/<i>``) expire together after `ttl` (default: the assume TTL)
        unless released; members of the group claim them at their filter.
        """
        with self._lock:
            self._ensure()
            existing = self._groups.get(group)
            if existing is not None:
                self._end_group(existing, "Released")
            namespace, _, name = group.rpartition("/")
            planned = self._plan_group(
                group,
                namespace,
                name,
                len(members),
                members,
                locality,
                self._current.assume_ttl_seconds if ttl is None else ttl,
            )
            if planned is None:
                return None
            return tuple(self._holds[s.alloc_id] for s in planned.slots)

    def tick(self) -> None:
        """Apply what time has done (expired holds and reservations) without a decision."""
        with self._lock:
            self._ensure()

    def gangs(self) -> list[GangGroup]:
        with self._lock:
            self._ensure()
            return list(self._groups.values())

    # ---- introspection -------------------------------------------------------------------------
    @property
    def policy(self) -> Policy:
        """The placement policy in force (the configured weights applied)."""
        with self._lock:
            self._ensure()
            return self._engine.policy

    def check_invariants(self) -> None:
        """`ClusterState.check_invariants` plus: every allocation belongs to a pod or a hold."""
        with self._lock:
            self._ensure()
            self._state.check_invariants()
            for alloc_id in self._state.allocations:
                if alloc_id.startswith("pod/"):
                    assert alloc_id[4:] in self._pods, f"leaked allocation {alloc_id}"
                else:
                    assert alloc_id in self._holds, f"leaked allocation {alloc_id}"
            for alloc_id, hold in self._holds.items():
                if hold.node in self._state.index:  # else dormant: its node is gone for now
                    assert alloc_id in self._state.allocations, f"hold {alloc_id} holds nothing"

    def holds(self) -> list[Hold]:
        with self._lock:
            return list(self._holds.values())

    def hold_of(self, pod_id: str) -> Hold | None:
        with self._lock:
            alloc_id = self._hold_of.get(pod_id)
            return self._holds.get(alloc_id) if alloc_id is not None else None

    def pod(self, pod_id: str) -> PodInfo | None:
        with self._lock:
            return self._pods.get(pod_id)

    def node_spec(self, name: str) -> NodeSpec | None:
        with self._lock:
            return self._specs.get(name)

    def gpu_usage(self, node: str) -> list[tuple[int, int]] | None:
        """Per GPU of `node`: (milli-GPU free, MiB free) as the cache counts them now."""
        with self._lock:
            self._ensure()
            i = self._state.index.get(node)
            if i is None:
                return None
            n = int(self._state.gpu_count[i])
            return [
                (int(self._state.gpu_milli_free[i, j]), int(self._state.gpu_mem_free[i, j])) for j in range(n)
            ]

    def stats(self) -> CacheStats:
        with self._lock:
            self._ensure()
            pods = self._pods.values()
            return CacheStats(
                nodes=len(self._specs),
                gpus=sum(len(s.gpus) for s in self._specs.values()),
                pods=len(self._pods),
                bound_pods=sum(1 for p in pods if p.holds_resources),
                pending_gpu_pods=sum(1 for p in pods if p.pending_gpu),
                holds=len(self._holds),
                gangs=len(self._groups),
                unaccounted_pods=len(self._unaccounted),
                conflicts=self.conflicts,
                rebuilds=self.rebuilds,
                synced=self.synced,
                sync_age_seconds={r: self.sync_age(r) for r in RESOURCES},
            )
