"""One node's part of GPU-aware preemption: the victim set that lets a pending pod fit there.

A *unit* is what is evicted at once: one pod, a gang (all its members, on any node), or a
GPUSlice with the pods running inside it. Sets of units are ordered by kube-scheduler's keys for
choosing among nodes (`set_key`, order `VictimOrder.LOWEST_PRIORITY_FIRST`): fewest
PodDisruptionBudget violations, lowest highest-victim priority, lowest priority sum (each
priority offset by 2^31, as kube-scheduler does, so that a further victim never lowers it),
fewest victims, latest start of the highest-priority victims, then fewest GPU-seconds lost,
then the unit ids (so that every tie is broken the same way). `VictimOrder.FEWEST_VICTIMS` (an
AgentPool's ``scheduling.preemption.policy: fewest-victims``) moves the victim count right after
the PDB violations, before the priority keys.

A set's PDB violations are kube-scheduler's count: per PodDisruptionBudget, the set's pods it
covers beyond the disruptions it allows now (``status.disruptionsAllowed``), summed. The count
never falls when a unit is added, and neither does any other key, so every key only grows with
the set: the best-first enumeration below pops sets in key order whatever the order chosen.

The search on a node (`search_node`) works per GPU. The pod needs k GPUs (one for a share or a
MIG instance); on each GPU j it could use, the sets of units *on j* whose removal lets one grant
fit on j are enumerated best-first in key order (the key only grows when a unit is added, so the
first feasible set popped is the GPU's least one). Removing a unit frees exactly the grants it
holds, on the GPUs it holds them: a victim given back is given back where it runs, never moved
to another GPU to make the check pass. The node's candidate sets are these per-GPU sets (k = 1)
or the unions over each k GPUs of their best few (k > 1); they are checked in key order against
the whole node (CPU, memory, locality) and the first that fits is made minimal: each victim,
highest key first, is given back if the pod still fits without evicting it.

Guarantees: the result always fits and is minimal (no one victim can be spared). It is the
node's least set by `set_key` when the pod needs one GPU and CPU and memory do not bind; with
k > 1 over shared GPUs, or when CPU or memory needs further victims (added in key order), it may
not be (`tests/unit/test_preempt_oracle.py` measures how often against a brute force).

Bounds (`SearchLimits`): at most `max_units` units per node (the least by key), at most
`max_pops` sets popped per GPU (past it, that GPU's set is kube-scheduler's: all units on it,
then each given back highest-priority first), `options_per_gpu` sets per GPU and
`max_combinations` unions per node. Work per node is then O(GPUs × max_pops + max_combinations).
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import numpy as np

from neuronetes.engine.filters import filter_bandwidth, filter_topology
from neuronetes.inventory import ClusterState
from neuronetes.model import GpuGrant, Locality, PodRequest

__all__ = [
    "PRIORITY_OFFSET",
    "SearchLimits",
    "SetKey",
    "Unit",
    "VictimOrder",
    "Workspace",
    "search_node",
    "set_key",
]

PRIORITY_OFFSET: Final = 2**31
"""Added to each victim's priority in the priority sum (kube-scheduler's MaxInt32 + 1)."""

SetKey = tuple[int, int, int, int, float, float, tuple[str, ...]]
"""(PDB violations, highest priority, priority sum, victims, -earliest start of the
highest-priority victims, GPU-seconds lost, unit ids), lower is better; under
`VictimOrder.FEWEST_VICTIMS` the victims come second: (PDB violations, victims, highest priority,
priority sum, ...)."""


class VictimOrder(StrEnum):
    """How victim sets are ordered (an AgentPool's ``scheduling.preemption.policy``)."""

    LOWEST_PRIORITY_FIRST = "lowest-priority-first"
    """kube-scheduler's order: PDB violations, highest priority, priority sum, victims, start."""
    FEWEST_VICTIMS = "fewest-victims"
    """PDB violations, victims, then kube-scheduler's priority keys: evicts as few pods as it can
    even when they have a higher (still lower than the preemptor's) priority."""


_NO_VICTIM: Final = -(2**63)


@dataclass(frozen=True, slots=True)
class Unit:
    """What is evicted at once: a pod, a gang's members, or a GPUSlice with its pods."""

    id: str
    pods: tuple[str, ...]
    allocations: tuple[str, ...]
    """The allocations (ids in the `ClusterState`) it frees, on whatever nodes they are."""
    priority: int
    """The highest priority among its pods."""
    priority_sum: int
    """Σ (priority + `PRIORITY_OFFSET`) over the victims it counts as."""
    count: int
    """Victims it counts as (a gang: its members; a slice with its pods: one)."""
    pdbs: tuple[tuple[str, int, int], ...] = ()
    """Per PodDisruptionBudget covering some of its pods: (the PDB's key, how many of its pods it
    covers, the disruptions it allows now)."""
    start_time: float = 0.0
    """The earliest start among its highest-priority pods (seconds, any epoch)."""
    gpu_seconds_lost: float = 0.0


def pdb_violations(units: Iterable[Unit]) -> int:
    """Pods of `units` that their PodDisruptionBudgets do not allow to go now, all together
    (per PDB: the pods it covers beyond its allowed disruptions)."""
    taken: dict[str, int] = {}
    allowed: dict[str, int] = {}
    for u in units:
        for name, pods, allows in u.pdbs:
            taken[name] = taken.get(name, 0) + pods
            allowed[name] = allows
    return sum(max(0, n - allowed[name]) for name, n in taken.items())


def set_key(units: Iterable[Unit], order: VictimOrder = VictimOrder.LOWEST_PRIORITY_FIRST) -> SetKey:
    """The order key of a victim set under `order` (the empty set is the least of all)."""
    chosen = list(units)
    if not chosen:
        if order is VictimOrder.FEWEST_VICTIMS:
            return (0, 0, _NO_VICTIM, 0, 0.0, 0.0, ())
        return (0, _NO_VICTIM, 0, 0, 0.0, 0.0, ())
    top = max(u.priority for u in chosen)
    pdb = pdb_violations(chosen) if any(u.pdbs for u in chosen) else 0
    count = sum(u.count for u in chosen)
    psum = sum(u.priority_sum for u in chosen)
    start = -min(u.start_time for u in chosen if u.priority == top)
    lost = round(sum(u.gpu_seconds_lost for u in chosen), 3)
    ids = tuple(sorted(u.id for u in chosen))
    if order is VictimOrder.FEWEST_VICTIMS:
        return (pdb, count, top, psum, start, lost, ids)
    return (pdb, top, psum, count, start, lost, ids)


@dataclass(frozen=True, slots=True)
class SearchLimits:
    """Bounds on the work of one decision (see the module's docstring for what each gives up)."""

    max_nodes: int = 256
    """Nodes searched in full (those where eviction could help, least priority first)."""
    max_units: int = 64
    max_pops: int = 512
    options_per_gpu: int = 4
    max_combinations: int = 2048


class Workspace:
    """A copy of a state's free capacity that checks may change and put back; the allocations
    and the hardware are the state's own, read only. The state itself is never changed."""

    def __init__(self, state: ClusterState) -> None:
        ws = copy.copy(state)
        ws.cpu_free, ws.mem_free = state.cpu_free.copy(), state.mem_free.copy()
        ws.gpu_milli_free, ws.gpu_mem_free = state.gpu_milli_free.copy(), state.gpu_mem_free.copy()
        ws.mig_layouts = dict(state.mig_layouts)
        self.state = ws

    def give(self, row: int, allocations: Iterable[str], sign: int) -> None:
        """Free (`sign` 1) or take back (-1) what `allocations` hold on `row`."""
        st = self.state
        for alloc_id in allocations:
            a = st.allocations[alloc_id]
            if a.node_index != row:
                continue
            st.cpu_free[row] += sign * a.cpu_milli
            st.mem_free[row] += sign * a.memory_mib
            for g in a.grants:
                key = (row, g.gpu_index)
                if g.mig_profile is not None and g.mig_start is not None:
                    layout = st.mig_layouts[key]
                    st.mig_layouts[key] = (
                        layout.remove(g.mig_start)
                        if sign > 0
                        else layout.place_at(g.mig_profile, g.mig_start)
                    )
                elif g.mig_profile is None:
                    st.gpu_milli_free[key] += sign * g.milli
                    st.gpu_mem_free[key] += sign * g.memory_mib

    def take(self, row: int, req: PodRequest, grants: Iterable[GpuGrant]) -> None:
        """Charge `req` with `grants` on `row` (a gang member placed before the next is searched)."""
        st = self.state
        st.cpu_free[row] -= req.cpu_milli
        st.mem_free[row] -= req.memory_mib
        for g in grants:
            key = (row, g.gpu_index)
            if g.mig_profile is not None:
                st.mig_layouts[key] = st.mig_layouts[key].place(g.mig_profile, g.mig_start)
            else:
                st.gpu_milli_free[key] -= g.milli
                st.gpu_mem_free[key] -= g.memory_mib

    def gpu_fits(
        self, req: PodRequest, row: int, j: int, milli: int = 0, mem: int = 0, starts: Iterable[int] = ()
    ) -> bool:
        """Whether one grant of `req` fits on GPU `j` of `row` now, with `milli`, `mem` and the
        MIG instances at `starts` freed on it besides."""
        st = self.state
        if not (st.gpu_exists[row, j] and st.gpu_healthy[row, j]):
            return False
        if req.mig_profile is not None:
            layout = st.mig_layouts.get((row, j))
            if layout is None:
                return False
            for start in starts:
                layout = layout.remove(start)
            try:
                return st.mig_start(row, j, req.mig_profile, layout) is not None
            except KeyError:  # the profile is not in this GPU's catalog
                return False
        if st.gpu_mig[row, j]:
            return False
        milli += int(st.gpu_milli_free[row, j])
        mem += int(st.gpu_mem_free[row, j])
        if req.exclusive:
            return milli == int(st.gpu_milli_cap[row, j]) and mem == int(st.gpu_mem_cap[row, j])
        return milli >= req.gpu_milli and mem >= req.gpu_memory_mib

    def fits(self, req: PodRequest, row: int) -> bool:
        """Whether `req` fits on `row` as it is now (the engine's filters that eviction can
        change: CPU, memory, GPUs, MIG slots, locality; the rest are the caller's)."""
        st = self.state
        if st.cpu_free[row] < req.cpu_milli or st.mem_free[row] < req.memory_mib:
            return False
        if req.gpus == 0:
            return True
        free = sum(1 for j in range(int(st.gpu_count[row])) if self.gpu_fits(req, row, j))
        if free < req.gpus:
            return False
        if req.gpus > 1 and (
            req.locality not in (Locality.ANY, Locality.SAME_NODE) or req.min_bandwidth_gbps > 0
        ):
            rows = np.array([row], dtype=np.int64)
            return bool(filter_topology(st, req, rows)[0] and filter_bandwidth(st, req, rows)[0])
        return True

    def fits_without(self, req: PodRequest, row: int, units: Iterable[Unit]) -> bool:
        """Whether `req` fits on `row` once `units` are evicted (the workspace is put back)."""
        freed = [a for u in units for a in u.allocations]
        self.give(row, freed, 1)
        try:
            return self.fits(req, row)
        finally:
            self.give(row, reversed(freed), -1)


@dataclass(frozen=True, slots=True)
class NodeVictims:
    """The victims chosen on one node, and their key."""

    row: int
    victims: tuple[Unit, ...]
    key: SetKey


Fits = Callable[[frozenset[int]], bool]


def _least_sets(
    n: int, key_of: Callable[[Iterable[int]], SetKey], fits: Fits, want: int, limits: SearchLimits
) -> list[frozenset[int]] | None:
    """Up to `want` minimal subsets of range(n) that fit, least `key_of` first: best-first, each
    set grown only by indices above its last, so sets are popped in key order (a key only
    grows when a unit is added). None: `limits.max_pops` popped before the first was found."""
    found: list[frozenset[int]] = []
    heap: list[tuple[SetKey, int, tuple[int, ...]]] = [(key_of(()), -1, ())]
    pops = 0
    while heap and len(found) < want:
        if pops >= limits.max_pops:
            return found or None
        _, last, members = heapq.heappop(heap)
        pops += 1
        chosen = frozenset(members)
        if any(f <= chosen for f in found):
            continue  # a superset of a set that already fits: never minimal
        if fits(chosen):
            found.append(chosen)
            continue
        for k in range(last + 1, n):
            grown = (*members, k)
            heapq.heappush(heap, (key_of(grown), k, grown))
    return found


def _gpu_sets(
    on_gpu: Sequence[Unit], fits: Fits, exclusive: bool, limits: SearchLimits, order: VictimOrder
) -> list[frozenset[int]]:
    """The least sets (indices into `on_gpu`, the units holding a grant on one GPU, least key
    first), best first, whose removal lets one grant fit on that GPU (`fits`)."""
    everything = frozenset(range(len(on_gpu)))
    if exclusive:  # a whole GPU: everything on it goes
        return [everything] if fits(everything) else []
    found = _least_sets(
        len(on_gpu),
        lambda sub: set_key((on_gpu[x] for x in sub), order),
        fits,
        limits.options_per_gpu,
        limits,
    )
    if found is None:  # past the budget: kube-scheduler's way on this GPU
        greedy = _reprieved(on_gpu, everything, fits, order)
        return [greedy] if greedy is not None else []
    return found


def _reprieved(
    units: Sequence[Unit], chosen: frozenset[int], fits: Fits, order: VictimOrder
) -> frozenset[int] | None:
    """kube-scheduler's reprieve: `chosen` if it fits, less each unit (highest key first) whose
    eviction the fit does not need (None: even `chosen` does not fit)."""
    if not fits(chosen):
        return None
    for k in sorted(chosen, key=lambda x: set_key([units[x]], order), reverse=True):
        if fits(chosen - {k}):
            chosen = chosen - {k}
    return chosen


def _parts(
    st: ClusterState, row: int, units: Sequence[Unit]
) -> list[dict[int, tuple[int, int, tuple[int, ...]]]]:
    """Per unit, what it holds on each GPU of `row`: (milli, memory, MIG instance starts)."""
    out: list[dict[int, tuple[int, int, tuple[int, ...]]]] = []
    for u in units:
        held: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        for alloc_id in u.allocations:
            a = st.allocations.get(alloc_id)
            if a is None or a.node_index != row:
                continue
            for g in a.grants:
                milli, mem, starts = held.get(g.gpu_index, (0, 0, ()))
                if g.mig_profile is not None and g.mig_start is not None:
                    starts = (*starts, g.mig_start)
                elif g.mig_profile is None:
                    milli, mem = milli + g.milli, mem + g.memory_mib
                held[g.gpu_index] = (milli, mem, starts)
        out.append(held)
    return out


def _unions(options: dict[int, list[frozenset[int]]], k: int, limits: SearchLimits) -> list[frozenset[int]]:
    """Candidate sets: each GPU's sets (k = 1), else the unions over each k GPUs of one set each."""
    if k == 1:
        return list({s for sets in options.values() for s in sets})
    out: set[frozenset[int]] = set()
    for gpus in itertools.combinations(sorted(options), k):
        for pick in itertools.product(*(options[j] for j in gpus)):
            out.add(frozenset().union(*pick))
            if len(out) >= limits.max_combinations:
                return list(out)
    return list(out)


def _extended(
    ordered: Sequence[Unit], base: frozenset[int], fits: Fits, limits: SearchLimits, order: VictimOrder
) -> frozenset[int] | None:
    """`base` if it fits, else `base` with the least further units (by the key of the whole)
    that make CPU, memory or locality fit; None: none found within the budget."""
    if fits(base):
        return base
    rest = [k for k in range(len(ordered)) if k not in base]

    def key_of(sub: Iterable[int]) -> SetKey:
        return set_key((ordered[k] for k in base.union(rest[x] for x in sub)), order)

    found = _least_sets(len(rest), key_of, lambda sub: fits(base.union(rest[x] for x in sub)), 1, limits)
    return base.union(rest[x] for x in found[0]) if found else None


def search_node(
    ws: Workspace,
    req: PodRequest,
    row: int,
    units: Sequence[Unit],
    limits: SearchLimits,
    order: VictimOrder = VictimOrder.LOWEST_PRIORITY_FIRST,
) -> NodeVictims | None:
    """The victims among `units` (candidates holding something on `row`) that let `req` fit on
    `row`, least by `order` as the module's rules reach; None: even all of them do not make room."""
    ordered = sorted(units, key=lambda u: set_key([u], order))[: limits.max_units]

    def key_of(chosen: Iterable[int]) -> SetKey:
        return set_key((ordered[k] for k in chosen), order)

    def fits(chosen: Iterable[int]) -> bool:
        return ws.fits_without(req, row, (ordered[k] for k in chosen))

    st = ws.state
    options: dict[int, list[frozenset[int]]] = {}
    wanted = max(req.gpus, 1) if req.mig_profile is None else 1
    if req.gpus > 0:
        parts = _parts(st, row, ordered)
        for j in range(int(st.gpu_count[row])):
            index = [k for k in range(len(ordered)) if j in parts[k]]

            def gpu_fits(chosen: frozenset[int], j: int = j, index: list[int] = index) -> bool:
                held = [parts[index[x]][j] for x in chosen]
                return ws.gpu_fits(
                    req,
                    row,
                    j,
                    sum(h[0] for h in held),
                    sum(h[1] for h in held),
                    [s for h in held for s in h[2]],
                )

            sets = _gpu_sets([ordered[k] for k in index], gpu_fits, req.exclusive, limits, order)
            if sets:
                options[j] = [frozenset(index[x] for x in s) for s in sets]
        if len(options) < wanted:
            return None  # fewer GPUs than it needs can take a grant whatever is evicted
    unions = _unions(options, wanted, limits) if req.gpus > 0 else [frozenset()]
    unions.sort(key=key_of)
    best: frozenset[int] | None = None
    best_key: SetKey | None = None
    for base in unions:  # key order: a base's key bounds every set grown from it
        if best_key is not None and key_of(base) >= best_key:
            break
        found = _extended(ordered, base, fits, limits, order)
        if found is not None:
            found_key = key_of(found)
            if best_key is None or found_key < best_key:
                best, best_key = found, found_key
    if best is None:
        best = _reprieved(ordered, frozenset(range(len(ordered))), fits, order)
        if best is None:
            return None
    best = _reprieved(ordered, best, fits, order)
    assert best is not None
    victims = tuple(sorted((ordered[k] for k in best), key=lambda u: (u.priority, u.id)))
    return NodeVictims(row, victims, set_key(victims, order))
