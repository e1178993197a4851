"""The extender's decisions as functions over the cache's books: filter, prioritize and
preemption's victims per GPU (kube-scheduler's framework, for one extender; the bind is `binding`'s).

Each takes the `CacheBooks` with the cache's lock held and returns a typed result
(`FilterDecision`, scores, victims); a refusal is an answer, never an exception.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Final

import numpy as np
import numpy.typing as npt

from neuronetes import contracts as c
from neuronetes.engine import PlacementEngine, Separation, scale_scores
from neuronetes.engine.core import FEASIBLE
from neuronetes.engine.filters import FILTERS
from neuronetes.engine.preempt import group_units, node_victims
from neuronetes.engine.victims import pdb_violations
from neuronetes.inventory import ClusterState
from neuronetes.model import Placement, PodRequest

from .books import CacheBooks
from .budgets import BudgetBook, victim_of
from .config import ExtenderSettings
from .gangs import GangSpec
from .holds import owned_by
from .pods import PodInfo
from .results import NO_OTHER_NODE, Explanation, FilterDecision, Hold
from .snapshot import REASON_UNKNOWN_NODE, NodeLookup, Snapshot, violated_locality

__all__ = [
    "REASON_UNKNOWN_NODE",
    "TOP_TERMS",
    "explain",
    "filter_pod",
    "gpu_victims",
    "prioritize",
    "short",
    "versus",
]

log = logging.getLogger(__name__)

_MAX_REASON: Final = 240
TOP_TERMS: Final = 3  # terms an explanation lists (the largest differences from the runner-up)


def short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


# ---- explanations ---------------------------------------------------------------------------------
def explain(
    engine: PlacementEngine, placement: Placement, *, runner_up: int | None, alone: str = NO_OTHER_NODE
) -> Explanation:
    """The placement's explanation as the filter makes it: node, GPUs, why, and the runner-up
    (the row of the candidate that scored best after the node; None: there is none, `alone` says
    why). The terms that set the two apart are scored at bind (`explain_held`, on a scratch copy
    of the state)."""
    st, i = engine.state, placement.node_index
    gpus = st.nodes[i].gpus
    return Explanation(
        placement.node,
        tuple(g.gpu_index for g in placement.grants),
        tuple(gpus[g.gpu_index].uuid for g in placement.grants if g.gpu_index < len(gpus)),
        placement.reason,
        runner_up="" if runner_up is None else st.nodes[runner_up].name,
        alone="" if runner_up is not None else alone,
    )


def versus(engine: PlacementEngine, placement: Placement, runner_up: str) -> Separation | None:
    """`engine`'s comparison of the node with `runner_up`, two rows whatever the cluster's size
    (None: no runner-up; one gone from the inventory is one that no longer fits)."""
    row = engine.state.index.get(runner_up, -1)
    rivals = [row] if row >= 0 else []
    return engine.separation(placement.request, placement.node_index, rivals) if runner_up else None


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


def _assume(books: CacheBooks, pod: PodInfo, placement: Placement, explanation: Explanation) -> Hold | None:
    """Hold the placement for `pod` for the assume TTL (None: it does not fit: a bug upstream)."""
    snap = books.snap
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
    if not books.holds.allocate(snap.state, hold):
        log.error("engine placement of %s on %s does not fit the state it was made on", pod.key, hold.node)
        return None
    hold = replace(hold, grants=snap.state.allocations[hold.alloc_id].grants)
    books.holds.put(hold)
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


def filter_pod(books: CacheBooks, pod: PodInfo, lookup: NodeLookup, gang: GangSpec | None) -> FilterDecision:
    """The engine's choice for a GPU pod among the looked-up nodes, held at once (assume TTL).

    Any earlier hold of the pod is replaced. Rejected nodes get their engine filter's reason
    (unresolvable ones, by the filter's own flag, separately: preemption cannot help there). A
    gang member (`pod.gang`, with the group's size and TTL in `gang`) gets its slot of the
    group's reservation, made now for the whole group if there is none.
    """
    snap = books.snap
    settings = snap.settings
    nodes = snap.state.nodes
    if gang is not None and pod.gang is not None and not pod.gpu_error:
        refused = gang_limit_reason(pod, gang, settings)
        if refused is not None:
            refused = short(refused)
            unresolvable = {nodes[i].name: refused for i in lookup.candidates.tolist()}
            return FilterDecision((), dict.fromkeys(lookup.unknown, REASON_UNKNOWN_NODE), unresolvable, None)
        decided = books.gangs.filter_member(pod, lookup, gang)
        if decided is not None:
            return decided
    books.release_hold_of(pod.id, refilter=True)
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
    explanation = explain(snap.engine, placement, runner_up=order[1] if len(order) > 1 else None)
    hold = _assume(books, pod, placement, explanation)
    if hold is None:
        failed[placement.node] = "gpu placement conflict, retry"
        return FilterDecision((), failed, unresolvable, None)
    top = tuple(nodes[i].name for i in order[: settings.filter_top_k])
    return FilterDecision(
        top, failed, unresolvable, hold, violated_locality(snap.state, placement), explanation
    )


# ---- prioritize -----------------------------------------------------------------------------------
def prioritize(books: CacheBooks, pod: PodInfo, lookup: NodeLookup) -> list[int]:
    """0..10 per node: the engine's scores (`scale_scores`); the node holding the pod's GPUs alone
    gets 10 (the hold was made with the pod's GPUs taken, so the engine's view of that node is
    skewed; and kube-scheduler should bind where the GPUs are held).

    A pod with a candidate limit (``max_nodes_to_score``) is scored among the nodes asked about
    alone: they passed the filter, whose answer lists nodes of the window it scored, so they are
    scored without taking (and moving the rotation to) another window; asked about more nodes
    than its limit, a window of them is scored and the rest get 0."""
    snap = books.snap
    if pod.gpu_error:
        return [0] * len(lookup.names)
    asked = lookup.candidates if pod.request.max_nodes_to_score > 0 else None
    scores = scale_scores(snap.engine.evaluate(pod.request, asked), lookup.rows)
    hold = books.holds.of(pod.id)
    if hold is not None:
        held = snap.state.index.get(hold.node, -2)
        scores = np.where(lookup.rows == held, 10, np.minimum(scores, 9))
    return [int(x) for x in scores.tolist()]


# ---- preemption -----------------------------------------------------------------------------------
def gpu_victims(
    books: CacheBooks, pod: PodInfo, node: str, budgets: BudgetBook | None = None
) -> tuple[list[PodInfo], int] | None:
    """The pods to evict on `node` so that `pod` fits there, chosen per GPU
    (`neuronetes.engine.preempt`: a victim given back is checked on the GPU it holds; least by
    the order `pod` asks for, kube-scheduler's by default), lowest priority first, and how many
    of them their PodDisruptionBudgets (`budgets`) do not let go now; a dry run on a copy of
    the state.

    Candidates are the lower-priority pods bound to `node`. A gang is one candidate, and only
    when every bound member runs on `node` (kube-scheduler evicts one node's pods, and part of a
    gang is never a victim); a pod inside a GPUSlice is none (the slice's reservation outlives
    it, and kube-scheduler cannot release a slice). Start times are the pods' ``status.startTime``.
    None: the node is unknown, or evicting every candidate does not make room.
    """
    st = books.snap.state
    row = st.index.get(node)
    if row is None or pod.gpu_error:
        return None
    own = books.holds.alloc_of(pod.id)
    if own is not None and own in st.allocations:
        st = st.without(own)
    pods = books.store.pods
    here = [pods[a[4:]] for a in sorted(st.by_node[row]) if a.startswith("pod/") and a[4:] in pods]
    gangs = {info.gang_id for info in here if info.gang_id is not None}
    members: dict[str, list[PodInfo]] = {}
    if gangs:
        for info in pods.values():
            if info.gang_id in gangs and info.node:
                members.setdefault(info.gang_id, []).append(info)
    victims = []
    for info in here:
        gang = info.gang_id
        if gang is not None and any(m.node != node for m in members.get(gang, ())):
            continue  # members elsewhere: not kube-scheduler's to evict from this node
        victims.append(victim_of(info, budgets, allocation="pod/" + info.id))
    found = node_victims(st, pod.request, node, group_units(victims), order=pod.victim_order)
    if isinstance(found, str):
        return None
    chosen = [pods[p] for u in found.victims for p in u.pods]
    return sorted(chosen, key=lambda info: (info.priority, info.id)), pdb_violations(found.victims)
