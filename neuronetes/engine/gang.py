"""Gang placement: every member of a group placed, or none.

`plan_gang` is pure: it places the members one after the other on the engine's state (each
sees the ones before), then gives every tentative allocation back and returns the plan; the
caller commits it (`commit_gang`, or the extender's gang manager as holds) before anything
else touches the state, so a partial gang never exists and two gangs competing for the same
nodes cannot deadlock: whichever is planned and committed first takes all it needs or
nothing, and the other sees the result. Without a topology locality the members share one GPU
model (a job split across a T4 box and an A100 runs at the T4's pace): the models are tried in
the engine's preference order, unless the members name several acceptable models themselves
(`PodRequest.gpu_models`), which then bound the choice. Topology locality for a
gang means all members on one node (`same-node`), and for `same-socket` / `nvlink` also all of
their GPUs inside one socket / one NVLink group: the group is chosen first, whole-GPU members
split one block of it, shared-GPU members are placed inside the rest of it. CPU-only members
take no GPUs, and MIG members an instance anywhere on the node (MIG has no NVLink peers).
Every member must pass its own filters on the chosen node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from neuronetes.engine import select
from neuronetes.engine.core import FEASIBLE, PlacementEngine, Unschedulable
from neuronetes.engine.filters import share_fit
from neuronetes.inventory import OversubscriptionError
from neuronetes.model import GpuGrant, Locality, Placement, PodRequest

BOOL = npt.NDArray[np.bool_]
_TENTATIVE = "gang-plan"  # allocation ids of the members while a plan is being made


@dataclass(frozen=True)
class GangPlan:
    placements: tuple[Placement, ...]  # in member order

    @property
    def nodes(self) -> set[str]:
        return {p.node for p in self.placements}


class _Abort(Exception):
    pass


def plan_gang(
    engine: PlacementEngine,
    members: Sequence[PodRequest],
    locality: Locality = Locality.ANY,
    candidates: Sequence[int] | None = None,
) -> GangPlan | None:
    """A placement for every one of `members`, or None; the engine's state is left as it was.

    `candidates` (node rows) limits where members may go (default: every node). A member's
    candidate limit (`PodRequest.max_nodes_to_score`) is not applied: a gang's search needs every
    node that could hold it.
    """
    if not members:
        raise ValueError("a gang needs at least one member")
    if any(m.max_nodes_to_score for m in members):
        members = [replace(m, max_nodes_to_score=0) for m in members]
    if locality is Locality.ANY:
        for rows in _one_model_candidates(engine, members, candidates):
            plan = _place_all(engine, members, node=None, candidates=rows)
            if plan is not None:
                return plan
        return None
    allowed = None if candidates is None else set(candidates)
    for node in _candidate_nodes(engine, members, locality):
        if allowed is not None and node not in allowed:
            continue
        for group in _groups(engine, members, node, locality):
            plan = _place_all(engine, members, node, group, locality)
            if plan is not None:
                return plan
    return None


def commit_gang(
    engine: PlacementEngine, plan: GangPlan, alloc_prefix: str, ttl: float | None = None
) -> tuple[str, ...]:
    """Hold every member of `plan` (ids `{alloc_prefix}/{i}`), all or none; returns the ids.

    Raises:
        OversubscriptionError: the state changed since the plan was made (or an id is taken);
            nothing of the plan is held then.
    """
    ids = tuple(f"{alloc_prefix}/{i}" for i in range(len(plan.placements)))
    done: list[str] = []
    try:
        for p, alloc_id in zip(plan.placements, ids, strict=True):
            engine.commit(p, alloc_id, ttl)
            done.append(alloc_id)
    except OversubscriptionError:
        for alloc_id in done:
            engine.release(alloc_id)
        raise
    return ids


def _one_model_candidates(
    engine: PlacementEngine, members: Sequence[PodRequest], candidates: Sequence[int] | None
) -> list[Sequence[int] | None]:
    """The node sets a gang without locality is tried on: one per GPU model, the model whose
    best node the engine scores highest first; the given `candidates` alone when the members
    take no GPUs or name several acceptable models themselves."""
    gpu_members = [m for m in members if m.gpus > 0]
    named = {model for m in gpu_members for model in m.gpu_models}
    if not gpu_members or len(named) > 1:
        return [candidates]
    st = engine.state
    ev = engine.evaluate(max(gpu_members, key=lambda m: m.gpu_milli_total), candidates)
    if ev.rows.size == 0:
        return []
    best: dict[int, float] = {}
    for row, score in zip(ev.rows.tolist(), ev.node_scores.tolist(), strict=True):
        model = int(st.model_id[row])
        best[model] = max(best.get(model, -np.inf), score)
    rows = np.arange(st.n_nodes) if candidates is None else np.asarray(candidates, dtype=np.int64)
    ranked = sorted(best, key=lambda model: (-best[model], st.models[model]))
    return [rows[st.model_id[rows] == model].tolist() for model in ranked]


def _combined(members: Sequence[PodRequest], locality: Locality) -> PodRequest:
    """The whole gang as one request on one node, so filters check it in one pass.

    CPU and memory are summed; the GPUs are what the gang needs at least: the whole-GPU
    members' GPUs together, else the largest shared member's share count (CPU-only and MIG
    members add none). Each member's own constraints are checked in `_candidate_nodes`.
    """
    first = members[0]
    whole = sum(m.gpus for m in members if m.exclusive)
    shared = [m for m in members if m.shared]
    if whole:
        gpus, milli, memory = whole, 1000, 0
    elif shared:
        gpus = max(m.gpus for m in shared)
        milli = min(m.gpu_milli for m in shared)
        memory = min(m.gpu_memory_mib for m in shared)
    else:
        gpus, milli, memory = 0, 1000, 0
    return PodRequest(
        name="gang",
        cpu_milli=sum(m.cpu_milli for m in members),
        memory_mib=sum(m.memory_mib for m in members),
        gpus=gpus,
        gpu_milli=milli,
        gpu_memory_mib=memory,
        gpu_models=first.gpu_models,
        locality=locality,
        min_bandwidth_gbps=max(m.min_bandwidth_gbps for m in members),
        model_name=first.model_name,
        model_cache_names=first.model_cache_names,
        model_cache_weight=first.model_cache_weight,
        preferred_zones=first.preferred_zones,
        preferred_nodes=first.preferred_nodes,
        avoid_nodes=first.avoid_nodes,
        weight_scale=first.weight_scale,
        max_price_per_hour=first.max_price_per_hour,
        spot_allowed=all(m.spot_allowed for m in members),
    )


def _candidate_nodes(engine: PlacementEngine, members: Sequence[PodRequest], locality: Locality) -> list[int]:
    """Nodes feasible for the combined gang and for every member on its own, best first."""
    ev = engine.evaluate(_combined(members, locality))
    ok = ev.reasons == FEASIBLE
    for shape in dict.fromkeys(m.shape() for m in members):
        # No candidates: only the per-node reasons are wanted, no (volatile) scores.
        ok &= engine.evaluate(shape, candidates=()).reasons == FEASIBLE
    order = np.argsort(-ev.node_scores, kind="stable")
    return [int(ev.rows[k]) for k in order if ok[ev.rows[k]]]


def _groups(
    engine: PlacementEngine, members: Sequence[PodRequest], node: int, locality: Locality
) -> list[BOOL | None]:
    """The GPU sets the gang may draw from on `node`: one per socket / NVLink group that could
    hold it, tightest first; `None` (the whole node) for `same-node` or a gang without GPUs."""
    whole = sum(m.gpus for m in members if m.exclusive)
    shared = [m for m in members if m.shared]
    if locality not in (Locality.NVLINK, Locality.SAME_SOCKET) or (whole == 0 and not shared):
        return [None]
    st = engine.state
    rows = np.array([node])
    avail = st.fully_free(rows)[0]
    for m in shared:
        avail = avail | share_fit(st, m, rows)[0]
    need = whole + max((m.gpus for m in shared), default=0)
    bandwidth = max(m.min_bandwidth_gbps for m in members)
    return list(select.locality_groups(st, node, avail, need, locality, bandwidth))


def _place_all(
    engine: PlacementEngine,
    members: Sequence[PodRequest],
    node: int | None,
    group: BOOL | None = None,
    locality: Locality = Locality.ANY,
    candidates: Sequence[int] | None = None,
) -> GangPlan | None:
    """Every member placed in turn (each tentatively held so the next sees it), then all
    tentative holds given back; None when one member does not fit."""
    st = engine.state
    placed: dict[int, tuple[Placement, str]] = {}
    try:
        block: list[int] = []
        rest = group
        if group is not None and node is not None:
            whole = sum(m.gpus for m in members if m.exclusive)
            block, _ = select.select_first(st.fully_free(np.array([node]))[0] & group, whole)
            if len(block) < whole:
                raise _Abort
            rest = group.copy()
            rest[block] = False
        # Largest members first: they are the hardest to fit.
        for i in sorted(range(len(members)), key=lambda k: -members[k].gpu_milli_total):
            member = members[i]
            p: Placement | None
            if node is None:
                p = engine.place(member, candidates=candidates)
            elif rest is not None and member.exclusive:
                take, block = block[: member.gpus], block[member.gpus :]
                grants = tuple(GpuGrant(j, 1000, int(st.gpu_mem_cap[node, j])) for j in take)
                p = Placement(
                    member, st.nodes[node].name, node, grants, 0.0, f"gang block ({locality.value})"
                )
            elif rest is not None and member.shared:
                p = _place_in(engine, member, node, rest)
            else:
                p = engine.place(member, candidates=[node])
            if p is None:
                raise _Abort
            alloc_id = f"{_TENTATIVE}/{i}"
            engine.commit(p, alloc_id)
            placed[i] = (p, alloc_id)
    except _Abort:
        return None
    finally:
        for _, alloc_id in placed.values():
            engine.release(alloc_id)
    return GangPlan(tuple(placed[i][0] for i in range(len(members))))


def _place_in(
    engine: PlacementEngine, member: PodRequest, node: int, allowed: BOOL | None
) -> Placement | None:
    """`member` on `node` with its GPUs among `allowed` (None when they cannot hold it)."""
    ev = engine.evaluate(member, candidates=[node])
    if ev.rows.size == 0:
        return None
    row = ev.gpu_scores[0] if ev.gpu_scores is not None else None
    chosen = engine.select_gpus(member, node, row, allowed_gpus=allowed)
    if isinstance(chosen, Unschedulable):
        return None
    grants, why = chosen
    return Placement(
        member, engine.state.nodes[node].name, node, tuple(grants), float(ev.node_scores[0]), why
    )


__all__ = ["GangPlan", "commit_gang", "plan_gang"]
