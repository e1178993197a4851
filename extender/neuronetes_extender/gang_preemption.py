"""Preemption for a pending gang: victims for every member at once, or none.

A gang member the filter rejects ("no room for all N members") is not preempted for alone: one
member's room is no use while the others wait. The gang preempts as one
(`neuronetes.engine.preempt.choose_victims` over all its missing members: each member placed on
the best node for it with the earlier members' victims gone and the earlier members charged,
every member finding room or no victim chosen), and the choice is then checked the way the
gang's own reservation will be made: `plan_gang` (locality included) must place every missing
member on the state with the victims gone, else nothing is evicted. Victims are strictly below
the lowest priority among the members.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from neuronetes.engine import PlacementEngine
from neuronetes.engine.gang import plan_gang
from neuronetes.engine.policy import Policy
from neuronetes.engine.preempt import PreemptionDecision, Unit, VictimOrder, choose_victims
from neuronetes.inventory import ClusterState
from neuronetes.model import PodRequest

from .gangs import GangSpec
from .pods import PodInfo

__all__ = ["decide_for_gang", "missing_members", "pending_members"]


def pending_members(pods: Mapping[str, PodInfo], pod: PodInfo) -> list[PodInfo]:
    """The pending members of `pod`'s gang (`pod` among them), by name; [pod] for a lone pod."""
    gang = pod.gang_id
    if gang is None:
        return [pod]
    mates = [p for p in pods.values() if p.gang_id == gang and p.pending_gpu and not p.gpu_error]
    return sorted(mates, key=lambda p: p.name)


def missing_members(pods: Mapping[str, PodInfo], pod: PodInfo, spec: GangSpec | None) -> list[PodRequest]:
    """What the gang still needs placed, as `GangManager.filter_member` plans it: the pending
    members (the rest of the size in `pod`'s shape), each at the members' lowest priority; []
    when the size is not known or nothing is missing."""
    gang = pod.gang
    size = spec.size if spec is not None else (gang.size if gang is not None else None)
    if gang is None or not size:
        return []
    mates = [p for p in pods.values() if p.gang_id == pod.gang_id and p.id != pod.id]
    bound = sum(1 for p in mates if p.holds_resources and p.gpu is not None)
    needed = size - bound
    if needed <= 0:
        return []
    waiting = [p for p in pending_members(pods, pod) if p.id != pod.id][: needed - 1]
    members = [pod.request, *(p.request for p in waiting)]
    members += [pod.request] * (needed - len(members))
    lowest = min([pod.priority, *(p.priority for p in waiting)])
    return [replace(m, priority=lowest) for m in members]


def decide_for_gang(
    state: ClusterState,
    members: Sequence[PodRequest],
    units: Sequence[Unit],
    *,
    nodes: Collection[str],
    order: VictimOrder,
    policy: Policy | str,
) -> PreemptionDecision:
    """The victims that let every one of `members` fit (see the module's docstring)."""
    decision = choose_victims(state, members, units, nodes=nodes, order=order)
    if not decision.victims:
        return decision
    freed = state.read_copy()
    for alloc in sorted({a for u in decision.victims for a in u.allocations if a in state.allocations}):
        freed.release(alloc)
    rows = sorted(freed.index[n] for n in nodes if n in freed.index)
    if plan_gang(PlacementEngine(freed, policy), members, members[0].locality, candidates=rows) is None:
        return PreemptionDecision(
            (),
            (),
            f"the gang's {len(members)} members would not all be placed together after "
            f"{len(decision.victims)} eviction(s): none is made",
            nodes_searched=decision.nodes_searched,
        )
    return decision
