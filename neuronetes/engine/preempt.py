"""GPU-aware preemption: which lower-priority pods to evict, on which node, so that a pending
pod (or a gang) fits — per GPU, not per node total.

kube-scheduler's preemption sees node totals: it cannot tell that a 40 GiB share needs room on
*one* GPU, not 40 GiB over four, and it may evict the wrong pods or none. Here the victims are
chosen per GPU (`neuronetes.engine.victims.search_node`: a victim given back in the check is
given back on the GPU it holds), then one node is chosen across nodes with kube-scheduler's
order (`victims.set_key`): fewest PodDisruptionBudget violations, lowest highest-victim priority,
lowest priority sum, fewest victims, latest start of the highest-priority victims, and fewest
GPU-seconds lost last (`VictimOrder.FEWEST_VICTIMS` moves the victim count before the priority
keys).

Candidates are *units* (`Unit`): a pod, a gang's members (evicted together or not at all, on
whatever nodes they run) or a GPUSlice with the pods inside it (one victim). `group_units` makes
them from per-pod `Victim`s. Only units whose every pod has a lower priority than the preemptor
are candidates (a gang with one member at or above it is not).

Bounds: `CandidateIndex` (the candidates as arrays) finds in a few NumPy passes the nodes where
evicting every candidate could make room on enough GPUs, and a lower bound on the best key each
could reach (for whole GPUs the k-th least of the GPUs' highest unit priorities). Nodes are
searched least bound first; the search stops at the first node whose bound is not below the
best set found, and after `SearchLimits.max_nodes` nodes (kube-scheduler itself tries at most
10 % of the nodes, and at least 100): a node past the cap is not looked at even when it holds
a better set. The per-node bounds are `victims`'s. A gang preemptor's members are placed one after another,
each on the best node for it with the victims of the members before it gone (so a member may
reuse their room); all members fit or no victim is chosen. That member-by-member order is not
an exact joint search.

Nothing here changes the state: the decision is a dry run on a `Workspace` copy.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from neuronetes.engine.candidates import CandidateIndex
from neuronetes.engine.core import PlacementEngine, Unschedulable
from neuronetes.engine.filters import FILTERS
from neuronetes.engine.victims import (
    PRIORITY_OFFSET,
    NodeVictims,
    SearchLimits,
    SetKey,
    Unit,
    VictimOrder,
    Workspace,
    search_node,
    set_key,
)
from neuronetes.inventory import ClusterState
from neuronetes.model import PodRequest

__all__ = [
    "CandidateIndex",
    "NodeVictims",
    "PreemptionDecision",
    "SearchLimits",
    "SetKey",
    "Unit",
    "Victim",
    "VictimOrder",
    "choose_victims",
    "group_units",
    "node_victims",
    "set_key",
]

BOOL = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Victim:
    """One pod that could be evicted (or a GPUSlice's own reservation, see `group_units`)."""

    pod: str
    priority: int
    start_time: float = 0.0
    allocation: str | None = None
    """Its allocation id in the state (None: it holds nothing of its own, e.g. a pod inside a
    GPUSlice, whose slice's reservation is the allocation)."""
    group: str = ""
    """Victims naming the same group go together: a gang's name, a GPUSlice's key ("": alone)."""
    pdb: str = ""
    """The PodDisruptionBudget covering the pod ("": none; the Eviction API refuses a pod that
    more than one covers, so one is all a victim can have)."""
    pdb_allowed: int = 0
    """That PDB's ``status.disruptionsAllowed`` (every victim of one PDB carries the same)."""
    gpu_seconds_lost: float = 0.0


def group_units(victims: Iterable[Victim], *, counted_once: Collection[str] = ()) -> list[Unit]:
    """Victims grouped into units: by `group`, else each alone. A group named in `counted_once`
    (a GPUSlice and its pods) counts as one victim with its highest priority; any other group
    (a gang) counts each member. Every pod counts against its PodDisruptionBudget, a slice's
    pods too (each of their evictions is a disruption)."""
    groups: dict[str, list[Victim]] = {}
    for v in victims:
        groups.setdefault(v.group or "pod/" + v.pod, []).append(v)
    units = []
    for key, members in sorted(groups.items()):
        top = max(v.priority for v in members)
        once = key in counted_once
        units.append(
            Unit(
                id=key,
                pods=tuple(v.pod for v in members),
                allocations=tuple(v.allocation for v in members if v.allocation is not None),
                priority=top,
                priority_sum=(top + PRIORITY_OFFSET)
                if once
                else sum(v.priority + PRIORITY_OFFSET for v in members),
                count=1 if once else len(members),
                pdbs=_pdb_counts(members),
                start_time=min(v.start_time for v in members if v.priority == top),
                gpu_seconds_lost=sum(v.gpu_seconds_lost for v in members),
            )
        )
    return units


def _pdb_counts(members: Sequence[Victim]) -> tuple[tuple[str, int, int], ...]:
    """(PDB, members it covers, its allowed disruptions) per PDB among `members`."""
    counts: dict[str, list[int]] = {}
    for v in members:
        if v.pdb:
            counts.setdefault(v.pdb, [0, v.pdb_allowed])[0] += 1
    return tuple((name, n, allowed) for name, (n, allowed) in sorted(counts.items()))


@dataclass(frozen=True, slots=True)
class PreemptionDecision:
    """Where the preemptor goes and whom it evicts, or why nowhere.

    `nodes` has one node per member (one for a lone pod); empty when there is no decision.
    `victims` is empty when the preemptor fits without evicting anyone (`needed` False).
    """

    nodes: tuple[str, ...]
    victims: tuple[Unit, ...]
    reason: str
    needed: bool = True
    key: SetKey = field(default_factory=lambda: set_key(()))
    nodes_searched: int = 0

    @property
    def node(self) -> str | None:
        return self.nodes[0] if self.nodes else None

    @property
    def pods(self) -> tuple[str, ...]:
        """Every pod to evict (a gang's members on other nodes included)."""
        return tuple(p for u in self.victims for p in u.pods)


def _passing(state: ClusterState, req: PodRequest, rows: npt.NDArray[np.int64], *, fixed_only: bool) -> BOOL:
    """Which of `rows` pass the engine's filters for `req` (`fixed_only`: only those no
    eviction can change, kube-scheduler's unresolvable ones)."""
    ok = np.ones(rows.size, dtype=bool)
    for flt in FILTERS:
        if fixed_only and not flt.unresolvable:
            continue
        alive = np.nonzero(ok)[0]
        if alive.size == 0:
            break
        ok[alive] = flt.fn(state, req, rows[alive])
    return ok


def node_victims(
    state: ClusterState,
    req: PodRequest,
    node: str,
    candidates: Sequence[Unit],
    limits: SearchLimits | None = None,
    order: VictimOrder = VictimOrder.LOWEST_PRIORITY_FIRST,
) -> NodeVictims | str:
    """The victims on one node (kube-scheduler's per-node question), or why there are none."""
    row = state.index.get(node)
    if row is None:
        return f"node {node} is not known"
    if not _passing(state, req, np.array([row], dtype=np.int64), fixed_only=True)[0]:
        return f"node {node} cannot take the pod whatever is evicted"
    ws = Workspace(state)
    units = [u for u in candidates if u.priority < req.priority and _holds_on(state, u, row)]
    found = search_node(ws, req, row, units, limits or SearchLimits(), order)
    return found if found is not None else f"evicting every lower-priority pod on {node} does not make room"


def _holds_on(state: ClusterState, unit: Unit, row: int) -> bool:
    return any(a in state.by_node[row] for a in unit.allocations)


def _choose_one(
    ws: Workspace,
    req: PodRequest,
    index: CandidateIndex,
    eligible: BOOL,
    rows: npt.NDArray[np.int64],
    limits: SearchLimits,
    order: VictimOrder,
) -> PreemptionDecision:
    st = ws.state
    rows = rows[_passing(st, req, rows, fixed_only=True)]
    if rows.size == 0:
        return PreemptionDecision((), (), "no node can take the pod whatever is evicted", needed=False)
    fits_now = rows[_passing(st, req, rows, fixed_only=False)]
    if fits_now.size:
        node = st.nodes[int(fits_now[0])].name
        return PreemptionDecision(
            (node,), (), f"fits on {fits_now.size} node(s) without preemption", needed=False
        )
    allowed = np.zeros(st.n_nodes, dtype=bool)
    allowed[rows] = True
    ranked, bounds = index.rows_and_bounds(st, req, allowed, eligible, order)
    best: NodeVictims | None = None
    searched = 0
    for r, bound in zip(ranked.tolist(), bounds, strict=True):
        if searched >= limits.max_nodes:
            break
        if best is not None and bound >= best.key:
            break  # rows are in bound order: no later one can do better
        searched += 1
        found = search_node(ws, req, r, index.units_on(r, eligible), limits, order)
        if found is not None and (best is None or (found.key, found.row) < (best.key, best.row)):
            best = found
    if best is None:
        return PreemptionDecision(
            (),
            (),
            f"evicting lower-priority pods makes room on none of {searched} node(s) searched",
            nodes_searched=searched,
        )
    node = st.nodes[best.row].name
    why = f"{len(best.victims)} victim unit(s) on {node}, best of {searched} node(s) searched"
    return PreemptionDecision((node,), best.victims, why, key=best.key, nodes_searched=searched)


def choose_victims(
    state: ClusterState,
    preemptor: PodRequest | Sequence[PodRequest],
    candidates: Sequence[Unit] | CandidateIndex,
    *,
    limits: SearchLimits | None = None,
    nodes: Collection[str] | None = None,
    order: VictimOrder = VictimOrder.LOWEST_PRIORITY_FIRST,
) -> PreemptionDecision:
    """The node and the victims for `preemptor` (a pod, or a gang's members), among `nodes`
    (None: all), least by `order`. `state` is not changed; it must not hold the
    preemptor's own allocations (give them back first, as `ClusterState.without` does).
    `candidates` may be a `CandidateIndex` built on `state` (kept for several decisions)."""
    limits = limits or SearchLimits()
    index = candidates if isinstance(candidates, CandidateIndex) else CandidateIndex(state, candidates)
    members = [preemptor] if isinstance(preemptor, PodRequest) else list(preemptor)
    if nodes is None:
        rows = np.arange(state.n_nodes, dtype=np.int64)
    else:
        rows = np.array(sorted(state.index[n] for n in nodes if n in state.index), dtype=np.int64)
    ws = Workspace(state)
    if len(members) == 1:
        return _choose_one(ws, members[0], index, index.eligible(members[0]), rows, limits, order)
    return _choose_gang(ws, members, index, rows, limits, order)


def _choose_gang(
    ws: Workspace,
    members: list[PodRequest],
    index: CandidateIndex,
    rows: npt.NDArray[np.int64],
    limits: SearchLimits,
    order: VictimOrder,
) -> PreemptionDecision:
    """Member by member: each one's victims evicted and the member placed before the next."""
    st = ws.state
    engine = PlacementEngine(st, "default")
    chosen: list[Unit] = []
    placed: list[str] = []
    searched = 0
    gone: set[str] = set()
    for req in members:
        eligible = index.eligible(req) & np.array([u.id not in gone for u in index.units], dtype=bool)
        one = _choose_one(ws, req, index, eligible, rows, limits, order)
        searched += one.nodes_searched
        if one.node is None:
            return PreemptionDecision(
                (), (), f"gang member {req.name or len(placed)}: {one.reason}", nodes_searched=searched
            )
        row = st.index[one.node]
        for u in one.victims:
            for r in {st.allocations[a].node_index for a in u.allocations if a in st.allocations}:
                ws.give(r, u.allocations, 1)
        gone.update(u.id for u in one.victims)
        chosen.extend(one.victims)
        selection = engine.select_gpus(req, row)
        if isinstance(selection, Unschedulable):
            return PreemptionDecision(
                (), (), f"gang member {req.name or len(placed)}: {selection.reason}", nodes_searched=searched
            )
        ws.take(row, req, selection[0])
        placed.append(one.node)
    key = set_key(chosen, order)
    needed = bool(chosen)
    why = (
        f"{len(chosen)} victim unit(s) for {len(members)} gang members"
        if needed
        else "the gang fits without preemption"
    )
    return PreemptionDecision(
        tuple(placed), tuple(chosen), why, needed=needed, key=key, nodes_searched=searched
    )
