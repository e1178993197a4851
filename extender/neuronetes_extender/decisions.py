"""The extender's decisions as functions over a snapshot: filter, prioritize, bind planning and
preemption refinement (kube-scheduler's framework, for one extender).

Each takes the cache's parts (`Parts`: the snapshot, the store, the holds and the gang manager)
with the cache's lock held, and returns a typed result (`FilterDecision`, scores,
`BindPlan`) or raises `BindRefusedError` / `PodUnknownError` with a reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import numpy as np
import numpy.typing as npt

from neuronetes import contracts as c
from neuronetes.assignment import build_assignment, visible_devices_annotations
from neuronetes.engine import PlacementEngine, Separation, scale_scores
from neuronetes.engine.core import FEASIBLE
from neuronetes.engine.filters import FILTERS
from neuronetes.inventory import Allocation, ClusterState
from neuronetes.model import GpuGrant, Placement, PodRequest

from .config import ExtenderSettings
from .gang_manager import GangManager
from .gangs import GangSpec, gang_assignment
from .holds import HoldBook, owned_by
from .nodefit import node_fit_reason
from .pods import PodInfo
from .results import (
    IN_GANG,
    NO_OTHER_NODE,
    BindPlan,
    BindRefusedError,
    CacheInvariantError,
    Explanation,
    FilterDecision,
    Hold,
    PodUnknownError,
)
from .slices import gpu_index, slice_request_mismatch
from .snapshot import NodeLookup, Snapshot, violated_locality
from .store import ClusterStore

__all__ = [
    "REASON_UNKNOWN_NODE",
    "Parts",
    "explain",
    "fewest_victims",
    "filter_pod",
    "prepare_bind",
    "prioritize",
    "scratch_engine",
]

log = logging.getLogger(__name__)

REASON_UNKNOWN_NODE: Final = "node not in the gpu inventory yet"
_MAX_REASON: Final = 240
_TOP_TERMS: Final = 3  # terms an explanation lists (the largest differences from the runner-up)


@dataclass(frozen=True, slots=True, eq=False)
class Parts:
    """The cache's parts a decision reads and writes (under the cache's lock)."""

    snap: Snapshot
    store: ClusterStore
    holds: HoldBook
    gangs: GangManager


def short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


# ---- explanations ---------------------------------------------------------------------------------
def explain(
    snap: Snapshot, placement: Placement, *, runner_up: int | None, alone: str = NO_OTHER_NODE
) -> Explanation:
    """The placement's explanation as the filter makes it: node, GPUs, why, and the runner-up
    (the row of the candidate that scored best after the node; None: there is none, `alone` says
    why). The terms that set the two apart are scored at bind (`_explain_held`)."""
    st, i = snap.state, placement.node_index
    gpus = st.nodes[i].gpus
    return Explanation(
        placement.node,
        tuple(g.gpu_index for g in placement.grants),
        tuple(gpus[g.gpu_index].uuid for g in placement.grants if g.gpu_index < len(gpus)),
        placement.reason,
        runner_up="" if runner_up is None else st.nodes[runner_up].name,
        alone="" if runner_up is not None else alone,
    )


def _explain_held(snap: Snapshot, hold: Hold, placement: Placement) -> Explanation:
    """The held placement's explanation with the terms that set its node apart from the
    runner-up, the node seen as the filter saw it (the hold's own resources given back for the
    moment). A gang member's slot has no runner-up of its own: the gang was placed as a whole."""
    st = snap.state
    alloc = st.allocations.get(hold.alloc_id)
    if alloc is not None:
        st.release(hold.alloc_id)
    try:
        held = hold.explanation or explain(snap, placement, runner_up=None, alone=IN_GANG)
        explanation = held.scored(_versus(snap, placement, held.runner_up), _TOP_TERMS)
    finally:
        if alloc is not None:
            st.allocate(alloc.id, alloc.node_index, alloc.cpu_milli, alloc.memory_mib, alloc.grants)
    return explanation


def _versus(snap: Snapshot, placement: Placement, runner_up: str) -> Separation | None:
    """The engine's comparison of the node with `runner_up` now, two rows whatever the cluster's
    size (None: no runner-up; one gone from the inventory is one that no longer fits)."""
    row = snap.state.index.get(runner_up, -1)
    rivals = [row] if row >= 0 else []
    return snap.engine.separation(placement.request, placement.node_index, rivals) if runner_up else None


# ---- filter ---------------------------------------------------------------------------------------
def _reasons(
    state: ClusterState, candidates: npt.NDArray[np.int64], codes_all: npt.NDArray[np.int16]
) -> tuple[dict[str, str], dict[str, str]]:
    """(FailedNodes, FailedAndUnresolvableNodes) for the rejected `candidates`."""
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    codes = codes_all[candidates]
    bad = np.nonzero(codes != FEASIBLE)[0]
    nodes = state.nodes
    for i, code in zip(candidates[bad].tolist(), codes[bad].tolist(), strict=True):
        flt = FILTERS[code]
        (unresolvable if flt.unresolvable else failed)[nodes[i].name] = flt.reason
    return failed, unresolvable


def _place(
    snap: Snapshot, req: PodRequest, candidates: npt.NDArray[np.int64], top_k: int
) -> tuple[Placement | None, list[int]]:
    """The engine's placement among `candidates`, and feasible rows best first: the placement's,
    then up to max(`top_k`, 2) − 1 others (the first of them the runner-up its explanation names),
    all from one evaluation."""
    engine = snap.engine
    cand = None if candidates.size == snap.state.n_nodes else candidates
    ev = engine.evaluate(req, cand)
    placement = engine.place_evaluated(req, ev)
    if placement is None:
        return None, []
    others = ev.best_rows(max(top_k, 2) - 1, exclude=placement.node_index)
    return placement, [placement.node_index, *others]


def _assume(parts: Parts, pod: PodInfo, placement: Placement, explanation: Explanation) -> Hold | None:
    """Hold the placement for `pod` for the assume TTL (None: it does not fit: a bug upstream)."""
    snap = parts.snap
    hold = Hold(
        alloc_id="hold/" + pod.id,
        node=placement.node,
        request=placement.request,
        grants=placement.grants,
        expires_at=snap.now() + snap.settings.assume_ttl_seconds,
        score=placement.score,
        reason=placement.reason,
        explanation=explanation,
        **owned_by(pod),
    )
    if not parts.holds.allocate(snap.state, hold):
        log.error("engine placement of %s on %s does not fit the state it was made on", pod.key, hold.node)
        return None
    hold = replace(hold, grants=snap.state.allocations[hold.alloc_id].grants)
    parts.holds.put(hold)
    return hold


def gang_limit_reason(pod: PodInfo, spec: GangSpec, settings: ExtenderSettings) -> str | None:
    """Why a tenant's gang hint is refused (above the extender's bounds), checked before planning."""
    gang = pod.gang
    if gang is None:
        return None
    if spec.size > settings.max_gang_size:
        source = f"label {c.LABEL_GANG_SIZE}" if gang.size is not None else "the pod group's minMember"
        return (
            f"gang {gang.name}: {source} asks for {spec.size} members, above the extender's limit "
            f"maxGangSize={settings.max_gang_size}"
        )
    if gang.timeout_s is not None and gang.timeout_s > settings.max_gang_timeout_seconds:
        return (
            f"gang {gang.name}: annotation {c.ANNOTATION_GANG_TIMEOUT}={gang.timeout_s:g} is above the "
            f"extender's limit maxGangTimeoutSeconds={settings.max_gang_timeout_seconds:g}"
        )
    return None


def filter_pod(parts: Parts, pod: PodInfo, lookup: NodeLookup, gang: GangSpec | None) -> FilterDecision:
    """The engine's choice for a GPU pod among the looked-up nodes, held at once (assume TTL).

    Any earlier hold of the pod is replaced. Rejected nodes get their engine filter's reason
    (unresolvable ones, by the filter's own flag, separately: preemption cannot help there). A
    gang member (`pod.gang`, with the group's size and TTL in `gang`) gets its slot of the
    group's reservation, made now for the whole group if there is none.
    """
    snap = parts.snap
    settings = snap.settings
    nodes = snap.state.nodes
    if gang is not None and pod.gang is not None and not pod.gpu_error:
        refused = gang_limit_reason(pod, gang, settings)
        if refused is not None:
            refused = short(refused)
            unresolvable = {nodes[i].name: refused for i in lookup.candidates.tolist()}
            return FilterDecision((), dict.fromkeys(lookup.unknown, REASON_UNKNOWN_NODE), unresolvable, None)
        decided = parts.gangs.filter_member(pod, lookup, gang)
        if decided is not None:
            return decided
    parts.gangs.release_hold_of(pod.id, refilter=True)
    unknown = dict.fromkeys(lookup.unknown, REASON_UNKNOWN_NODE)
    if pod.gpu_error:
        reason = short(f"invalid gpu request: {pod.gpu_error}")
        return FilterDecision((), unknown, {nodes[i].name: reason for i in lookup.candidates.tolist()}, None)
    req = pod.request
    placement, order = _place(snap, req, lookup.candidates, settings.filter_top_k)
    failed, unresolvable = _reasons(snap.state, lookup.candidates, snap.engine.evaluate(req, ()).reasons)
    failed.update(unknown)
    if placement is None:
        return FilterDecision((), failed, unresolvable, None)
    explanation = explain(snap, placement, runner_up=order[1] if len(order) > 1 else None)
    hold = _assume(parts, pod, placement, explanation)
    if hold is None:
        failed[placement.node] = "gpu placement conflict, retry"
        return FilterDecision((), failed, unresolvable, None)
    top = tuple(nodes[i].name for i in order[: settings.filter_top_k])
    return FilterDecision(
        top, failed, unresolvable, hold, violated_locality(snap.state, placement), explanation
    )


# ---- prioritize -----------------------------------------------------------------------------------
def prioritize(parts: Parts, pod: PodInfo, lookup: NodeLookup) -> list[int]:
    """0..10 per node: the engine's scores (`scale_scores`); the node holding the pod's GPUs alone
    gets 10 (the hold was made with the pod's GPUs taken, so the engine's view of that node is
    skewed; and kube-scheduler should bind where the GPUs are held)."""
    snap = parts.snap
    if pod.gpu_error:
        return [0] * len(lookup.names)
    scores = scale_scores(snap.engine.evaluate(pod.request), lookup.rows)
    hold = parts.holds.of(pod.id)
    if hold is not None:
        held = snap.state.index.get(hold.node, -2)
        scores = np.where(lookup.rows == held, 10, np.minimum(scores, 9))
    return [int(x) for x in scores.tolist()]


# ---- bind -----------------------------------------------------------------------------------------
def _check_node_rules(store: ClusterStore, info: PodInfo, node: str) -> None:
    """Refuse unless `node` passes the pod's nodeSelector, required node affinity and taints."""
    facts = store.facts.get(node)
    if facts is None:
        raise BindRefusedError(f"{node}: node not known to the extender")
    why = node_fit_reason(facts, info.node_selector, info.affinity, info.tolerations)
    if why is not None:
        raise BindRefusedError(short(f"pod {info.key}: {why}"))


def prepare_bind(parts: Parts, pod_id: str, node: str, pod: PodInfo | None) -> BindPlan:
    """The Binding's annotations for `pod_id` on `node`: only what this extender decided.

    A GPU pod binds only where its live hold (from this extender's filter) is, with exactly
    those GPUs; the hold is re-stamped with a full TTL so it cannot expire while the Binding is
    posted. Every pod binds only if the node passes its nodeSelector, required node affinity and
    taints (kube-scheduler checked them for what it filtered; a request that did not come from it
    did not). Pods of other schedulers are never bound.

    Raises:
        PodUnknownError: the pod is not known (pass `pod` after fetching it).
        BindRefusedError: the pod may not go to `node` (the message says why).
    """
    snap, store, holds = parts.snap, parts.store, parts.holds
    known = store.pods.get(pod_id)
    if known is not None and known.node:
        if known.node != node:
            raise BindRefusedError(f"pod {known.key} is already bound to {known.node}")
        return BindPlan(pod_id, node, {}, None, known.assignment, already_bound=True)
    info = pod or known
    if info is None:
        raise PodUnknownError(pod_id)
    allowed = snap.settings.bind_scheduler_names
    if info.scheduler_name not in allowed:
        raise BindRefusedError(
            f"pod {info.key}: schedulerName {info.scheduler_name!r} is not "
            f"{' or '.join(allowed)}; not ours to bind"
        )
    if info.gpu_error:
        raise BindRefusedError(short(f"invalid gpu request: {info.gpu_error}"))
    if info.gpu is None and not info.slice:
        _check_node_rules(store, info, node)
        return BindPlan(pod_id, node, {}, None)
    hold = holds.of(pod_id)
    if hold is None:
        raise BindRefusedError(
            f"pod {info.key}: no gpus held for it on {node} (this extender did not filter it there, "
            "or the hold expired); it is scheduled again"
        )
    group = parts.gangs.groups.get(hold.group) if hold.group else None
    if hold.node != node:
        if group is not None:
            raise BindRefusedError(f"gang {group.name}: this member's gpus are reserved on {hold.node}")
        raise BindRefusedError(f"pod {info.key}: its gpus are held on {hold.node}, not on {node}")
    i = snap.state.index.get(node)
    if i is None:
        if group is None:
            holds.drop(snap.state, hold.alloc_id)
        raise BindRefusedError(f"{node}: {REASON_UNKNOWN_NODE}")
    _check_node_rules(store, info, node)  # a filter reached without kube-scheduler's own checks
    if group is None:
        hold = holds.renew(hold.alloc_id, snap.now() + snap.settings.assume_ttl_seconds)
    if hold.gpu is None:
        raise CacheInvariantError(f"hold {hold.alloc_id} of pod {pod_id} carries no gpu request")
    placement = Placement(hold.request, node, i, hold.grants, hold.score, hold.reason)
    qos = c.QoS.GUARANTEED
    if info.slice:
        placement, qos = _inside_slice(parts, info, hold, placement)
    uid = info.assignment_uid
    try:
        assignment = build_assignment(
            placement, snap.state.nodes[i], hold.gpu, qos=qos, pod_uid=uid, gang=gang_assignment(group)
        )
    except ValueError as exc:
        if group is None:
            holds.drop(snap.state, hold.alloc_id)
        raise BindRefusedError(short(f"cannot build the gpu assignment: {exc}")) from None
    annotations = {c.ANNOTATION_ASSIGNED_GPUS: c.encode_assignment(assignment)}
    if snap.settings.visible_devices_annotations:
        annotations.update(visible_devices_annotations(assignment))
    explanation = hold.explanation if info.slice else _explain_held(snap, hold, placement)
    if group is not None:
        return BindPlan(
            pod_id,
            node,
            annotations,
            hold.alloc_id,
            assignment,
            group=group.id,
            reservation_id=group.reservation_id,
            explanation=explanation,
        )
    return BindPlan(pod_id, node, annotations, hold.alloc_id, assignment, explanation=explanation)


def _inside_slice(parts: Parts, info: PodInfo, hold: Hold, placement: Placement) -> tuple[Placement, c.QoS]:
    """The placement of a pod that names a GPUSlice: the slice's GPU with the slice's share (the
    hold took only CPU and memory), and the slice's QoS class."""
    sl = parts.store.slices.get(info.slice_key)
    if sl is None or sl.node != placement.node:
        parts.holds.drop(parts.snap.state, hold.alloc_id)
        raise BindRefusedError(
            f"pod {info.key}: GPUSlice {info.slice} is no longer Bound on {placement.node}"
        )
    why = slice_request_mismatch(info, sl)
    j = gpu_index(parts.snap.state, placement.node_index, sl.gpu_uuid)
    if why is not None or j is None:
        parts.holds.drop(parts.snap.state, hold.alloc_id)
        raise BindRefusedError(short(why or f"{placement.node} has no GPU {sl.gpu_uuid}"))
    return replace(placement, grants=(GpuGrant(j, sl.milli, sl.memory_mib),)), sl.qos


# ---- preemption -----------------------------------------------------------------------------------
def scratch_engine(parts: Parts, pod: PodInfo, node: str) -> PlacementEngine | None:
    """A one-node copy of `node` with everything allocated there but `pod`'s own hold."""
    st = parts.snap.state
    i = st.index.get(node)
    if i is None or pod.gpu_error:
        return None
    scratch = ClusterState([st.nodes[i]], max_gpus_per_node=st.max_gpus)
    own = parts.holds.alloc_of(pod.id)
    for alloc_id in sorted(st.by_node[i]):
        if alloc_id == own:
            continue
        a = st.allocations[alloc_id]
        scratch.allocate(alloc_id, 0, a.cpu_milli, a.memory_mib, a.grants)
    return PlacementEngine(scratch, parts.snap.engine.policy)


def fewest_victims(
    engine: PlacementEngine, req: PodRequest, victims: Sequence[tuple[str, int]]
) -> list[str] | None:
    """The fewest of `victims` ((pod identity, priority)) whose removal lets `req` onto the
    scratch node: lowest priority first until it fits, then each given back (highest priority
    first) if it still fits without evicting it. None: even all of them do not make room."""
    scratch = engine.state

    def fits() -> bool:
        return engine.place(req, candidates=[0]) is not None

    removed: list[tuple[str, int, Allocation]] = []
    if not fits():
        for pod_id, priority in sorted(victims, key=lambda v: (v[1], v[0])):
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
