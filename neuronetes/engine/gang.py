"""Gang placement: every member of a group placed, or none.

A gang is planned and committed in one step by the single-threaded engine, so a partial gang
never exists and two gangs competing for the same nodes cannot deadlock: whichever is planned
first takes all it needs or nothing, and the other sees the result. Topology locality for a
gang means all members on one node (`same-node`), and for `same-socket` / `nvlink` also all of
their GPUs inside one socket / one NVLink group, chosen as one block and then split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from neuronetes.engine import select
from neuronetes.engine.core import PlacementEngine
from neuronetes.model import GpuGrant, Locality, Placement, PodRequest


@dataclass(frozen=True)
class GangPlan:
    placements: tuple[Placement, ...]  # in member order
    alloc_ids: tuple[str, ...]

    @property
    def nodes(self) -> set[str]:
        return {p.node for p in self.placements}


class _Abort(Exception):
    pass


def plan_gang(
    engine: PlacementEngine,
    members: Sequence[PodRequest],
    locality: Locality = Locality.ANY,
    alloc_prefix: str = "gang",
    ttl: float | None = None,
) -> GangPlan | None:
    """Place and commit all `members` (each with id `{alloc_prefix}/{i}`) or nothing."""
    if not members:
        raise ValueError("a gang needs at least one member")
    if locality is Locality.ANY:
        return _commit_all(engine, members, alloc_prefix, ttl, node=None)
    for node in _candidate_nodes(engine, members, locality):
        plan = _commit_all(engine, members, alloc_prefix, ttl, node=node, locality=locality)
        if plan is not None:
            return plan
    return None


def _combined(members: Sequence[PodRequest], locality: Locality) -> PodRequest:
    """The whole gang as one request on one node, so filters check it in one pass."""
    first = members[0]
    exclusive = all(m.exclusive for m in members)
    return PodRequest(
        name="gang",
        cpu_milli=sum(m.cpu_milli for m in members),
        memory_mib=sum(m.memory_mib for m in members),
        gpus=sum(m.gpus for m in members) if exclusive else first.gpus,
        gpu_milli=first.gpu_milli if not exclusive else 1000,
        gpu_memory_mib=0 if exclusive else first.gpu_memory_mib,
        gpu_models=first.gpu_models,
        locality=locality if exclusive else Locality.ANY,
        min_bandwidth_gbps=max(m.min_bandwidth_gbps for m in members),
        model_name=first.model_name,
        preferred_zones=first.preferred_zones,
        max_price_per_hour=first.max_price_per_hour,
        spot_allowed=all(m.spot_allowed for m in members),
    )


def _candidate_nodes(engine: PlacementEngine, members: Sequence[PodRequest], locality: Locality) -> list[int]:
    ev = engine.evaluate(_combined(members, locality))
    order = np.argsort(-ev.node_scores, kind="stable")
    return [int(ev.rows[k]) for k in order]


def _commit_all(
    engine: PlacementEngine,
    members: Sequence[PodRequest],
    prefix: str,
    ttl: float | None,
    node: int | None,
    locality: Locality = Locality.ANY,
) -> GangPlan | None:
    placed: dict[int, tuple[Placement, str]] = {}
    try:
        block = _group_block(engine, members, node, locality) if node is not None else None
        # Largest members first: they are the hardest to fit.
        for i in sorted(range(len(members)), key=lambda k: -members[k].gpu_milli_total):
            member = members[i]
            if block is not None:
                take, block = block[: member.gpus], block[member.gpus :]
                grants = tuple(GpuGrant(j, 1000, int(engine.state.gpu_mem_cap[node, j])) for j in take)
                assert node is not None
                p: Placement | None = Placement(
                    member, engine.state.nodes[node].name, node, grants, 0.0, f"gang block ({locality.value})"
                )
            else:
                p = engine.place(member, candidates=None if node is None else [node])
            if p is None:
                raise _Abort
            alloc_id = f"{prefix}/{i}"
            engine.commit(p, alloc_id, ttl)
            placed[i] = (p, alloc_id)
    except (_Abort, RuntimeError):
        for _, alloc_id in placed.values():
            engine.release(alloc_id)
        return None
    return GangPlan(
        tuple(placed[i][0] for i in range(len(members))), tuple(placed[i][1] for i in range(len(members)))
    )


def _group_block(
    engine: PlacementEngine, members: Sequence[PodRequest], node: int | None, locality: Locality
) -> list[int] | None:
    """For group localities with whole-GPU members: one block of GPUs inside a single group."""
    if node is None or locality is Locality.SAME_NODE or not all(m.exclusive for m in members):
        return None
    total = sum(m.gpus for m in members)
    st = engine.state
    free = st.fully_free(np.array([node]))[0]
    if locality is Locality.NVLINK:
        fast = free & (st.gpu_nvlink_group[node] >= 0)
        need_bw = max(m.min_bandwidth_gbps for m in members)
        if need_bw > 0:
            fast &= st.gpu_nvlink_bw[node] >= need_bw
        groups = st.gpu_nvlink_group[node]
    else:
        fast, groups = free, st.gpu_socket[node]
    best: list[int] | None = None
    for gid in sorted({int(g) for g in groups[fast]}):
        members_g = [int(j) for j in np.nonzero(fast & (groups == gid))[0]]
        if len(members_g) >= total and (best is None or len(members_g) < len(best)):
            best = members_g
    if best is None:
        raise _Abort
    members_sorted, _ = select.select_first(np.isin(np.arange(st.max_gpus), best), total)
    return members_sorted


__all__ = ["GangPlan", "plan_gang"]
