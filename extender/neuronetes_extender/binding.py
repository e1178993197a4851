"""The bind decision and its outcome, over the cache's books: what a Binding must carry
(`prepare_bind`) and what its result changes (`bind_done`).

A bind never moves live state to explain itself: the score terms are worked out on a scratch
copy of the state with the pod's own hold given back (`ClusterState.without`), the node as the
filter saw it. A refusal is a typed answer (`BindRefused`); `CacheInvariantError` is a bug.
Each function is called with the cache's lock held.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from neuronetes import contracts as c
from neuronetes.assignment import build_assignment, visible_devices_annotations
from neuronetes.engine import PlacementEngine
from neuronetes.model import Placement

from .books import CacheBooks
from .decisions import TOP_TERMS, explain, short, versus
from .gangs import gang_assignment
from .holds import pod_of_hold
from .nodefit import node_fit_reason
from .pods import PodInfo
from .results import IN_GANG, BindPlan, BindRefused, CacheInvariantError, Explanation, Hold
from .slices import gpu_index, slice_request_mismatch
from .snapshot import REASON_UNKNOWN_NODE, Snapshot
from .store import ClusterStore
from .wire import Pod

__all__ = ["bind_done", "explain_held", "plan_bind", "prepare_bind"]

log = logging.getLogger(__name__)


def explain_held(snap: Snapshot, hold: Hold, placement: Placement) -> Explanation:
    """The held placement explained with the terms that set its node apart from the runner-up,
    the node seen as the filter saw it: on a scratch copy of the state with the hold's own
    resources given back (the live state is only read). A gang member's slot has no runner-up of
    its own: the gang was placed as a whole."""
    engine = snap.engine
    if hold.alloc_id in snap.state.allocations:
        engine = PlacementEngine(snap.state.without(hold.alloc_id), engine.policy, engine.profile)
    held = hold.explanation or explain(engine, placement, runner_up=None, alone=IN_GANG)
    return held.scored(versus(engine, placement, held.runner_up), TOP_TERMS)


def _node_rules_refusal(store: ClusterStore, info: PodInfo, node: str) -> BindRefused | None:
    """Why `node` fails the pod's nodeSelector, required node affinity or taints (None: passes)."""
    facts = store.facts.get(node)
    if facts is None:
        return BindRefused(f"{node}: node not known to the extender")
    why = node_fit_reason(facts, info.node_selector, info.affinity, info.tolerations)
    return None if why is None else BindRefused(short(f"pod {info.key}: {why}"))


def prepare_bind(books: CacheBooks, pod_id: str, node: str, pod: PodInfo | None) -> BindPlan | BindRefused:
    """`plan_bind`; the store then expects the pod bound (a watch event of the pod before the
    Binding's answer must not undo the bind)."""
    plan = plan_bind(books, pod_id, node, pod)
    if isinstance(plan, BindPlan) and not plan.already_bound:
        known = books.store.pods.get(pod_id) or pod
        if known is not None:
            books.store.expect_bound(known.bound_to(plan.node, plan.assignment, plan.annotations))
    return plan


def plan_bind(books: CacheBooks, pod_id: str, node: str, pod: PodInfo | None) -> BindPlan | BindRefused:
    """The Binding's annotations for `pod_id` on `node`: only what this extender decided.

    A GPU pod binds only where its live hold (from this extender's filter) is, with exactly
    those GPUs; the hold is re-stamped with a full TTL so it cannot expire while the Binding is
    posted. Every pod binds only if the node passes its nodeSelector, required node affinity and
    taints (kube-scheduler checked them for what it filtered; a request that did not come from it
    did not). Pods of other schedulers are never bound. `pod`: the pod as the caller obtained it
    (from the cache or the API); the cache's own record, when it has one now, wins.
    """
    snap, store, holds = books.snap, books.store, books.holds
    known = store.pods.get(pod_id)
    if known is not None and known.node:
        if known.node != node:
            return BindRefused(f"pod {known.key} is already bound to {known.node}")
        return BindPlan(pod_id, node, {}, None, known.assignment, already_bound=True)
    info = known or pod  # the cache's record is the newest: the watch may have moved on since
    if info is None:
        return BindRefused(f"pod {pod_id} is not known to the extender")
    allowed = snap.settings.bind_scheduler_names
    if info.scheduler_name not in allowed:
        return BindRefused(
            f"pod {info.key}: schedulerName {info.scheduler_name!r} is not "
            f"{' or '.join(allowed)}; not ours to bind"
        )
    if info.gpu_error:
        return BindRefused(short(f"invalid gpu request: {info.gpu_error}"))
    if info.gpu is None and not info.slice:
        refused = _node_rules_refusal(store, info, node)
        return refused if refused is not None else BindPlan(pod_id, node, {}, None)
    hold = holds.of(pod_id)
    if hold is None:
        return BindRefused(
            f"pod {info.key}: no gpus held for it on {node} (this extender did not filter it there, "
            "or the hold expired); it is scheduled again"
        )
    group = books.gangs.groups.get(hold.group) if hold.group else None
    if hold.node != node:
        if group is not None:
            return BindRefused(f"gang {group.name}: this member's gpus are reserved on {hold.node}")
        return BindRefused(f"pod {info.key}: its gpus are held on {hold.node}, not on {node}")
    i = snap.state.index.get(node)
    if i is None:
        if group is None:
            holds.drop(snap.state, hold.alloc_id)
        return BindRefused(f"{node}: {REASON_UNKNOWN_NODE}")
    refused = _node_rules_refusal(store, info, node)  # a filter reached without kube-scheduler's checks
    if refused is not None:
        return refused
    if group is None:
        hold = holds.renew(hold.alloc_id, snap.now() + snap.settings.assume_ttl_seconds)
    if hold.gpu is None:
        raise CacheInvariantError(f"hold {hold.alloc_id} of pod {pod_id} carries no gpu request")
    placement = Placement(hold.request, node, i, hold.grants, hold.score, hold.reason)
    qos = c.QoS.GUARANTEED
    if info.slice:
        inside = _inside_slice(books, info, hold, placement)
        if isinstance(inside, BindRefused):
            return inside
        placement, qos = inside
    try:
        assignment = build_assignment(
            placement,
            snap.state.nodes[i],
            hold.gpu,
            qos=qos,
            pod_uid=info.assignment_uid,
            gang=gang_assignment(group),
        )
    except ValueError as exc:  # the pod's request cannot be expressed on these GPUs: an answer
        if group is None:
            holds.drop(snap.state, hold.alloc_id)
        return BindRefused(short(f"cannot build the gpu assignment: {exc}"))
    annotations = {c.ANNOTATION_ASSIGNED_GPUS: c.encode_assignment(assignment)}
    if snap.settings.visible_devices_annotations:
        annotations.update(visible_devices_annotations(assignment))
    explanation = hold.explanation if info.slice else explain_held(snap, hold, placement)
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


def _inside_slice(
    books: CacheBooks, info: PodInfo, hold: Hold, placement: Placement
) -> tuple[Placement, c.QoS] | BindRefused:
    """The placement of a pod that names a GPUSlice: the slice's GPU with the slice's share (the
    hold took only CPU and memory), and the slice's QoS class."""
    st = books.snap.state
    sl = books.store.slices.get(info.slice_key)
    if sl is None or sl.node != placement.node:
        books.holds.drop(st, hold.alloc_id)
        return BindRefused(f"pod {info.key}: GPUSlice {info.slice} is no longer Bound on {placement.node}")
    why = slice_request_mismatch(info, sl)
    j = gpu_index(st, placement.node_index, sl.gpu_uuid)
    if why is not None or j is None:
        books.holds.drop(st, hold.alloc_id)
        return BindRefused(short(why or f"{placement.node} has no GPU {sl.gpu_uuid}"))
    return replace(placement, grants=(sl.grant(j),)), sl.qos


def bind_done(books: CacheBooks, plan: BindPlan, *, ok: bool, ambiguous: bool, pod: Pod | None) -> None:
    """Record a bind's outcome.

    On success the hold becomes the pod's allocation in the ledger (the watch will report the
    same pod; that is a no-op). On a definite failure the hold is released; on an ambiguous
    one (timeout, server error) it stays until the watch tells or the TTL ends.
    """
    books.store.bind_settled(plan.pod)
    hold = books.holds.get(plan.alloc_id)
    if not ok:
        if hold is not None and not ambiguous:
            group = books.gangs.groups.get(hold.group) if hold.group else None
            if group is not None:
                # After the barrier: a partial gang. The operator recreates the group.
                log.warning("gang %s: binding %s failed after the barrier", group.id, plan.pod)
                books.gangs.end(group, "Failed")
            else:
                books.holds.drop(books.snap.state, hold.alloc_id)
        return
    if hold is not None:
        books.ledger.record_bind(plan.pod, plan.node, hold.grants, plan.assignment)
    if pod is not None:
        books.upsert(PodInfo.from_pod(pod))
        return
    info = books.store.pods.get(plan.pod)
    if info is None and hold is not None:  # fetched at bind, not yet seen by the watch
        info = pod_of_hold(plan.pod, hold)
    if info is not None:
        books.upsert(info.bound_to(plan.node, plan.assignment, plan.annotations))
