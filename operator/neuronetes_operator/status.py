"""An AgentPool's status from its pods and their nodes. Pure: objects in, status out.

Placements come from each bound pod's ``neuronetes.io/assigned-gpus`` (the extender's decision,
read with the strict contract decoder); the cost is each bound pod's share of its node's price
(`neuronetes_operator.budget`, prices from `neuronetes.pricing`): price × (the pod's GPUs / the
node's ``neuronetes.io/gpu-count``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from neuronetes import contracts as c
from neuronetes.api.models import AgentPoolStatus, Condition, CostStatus, Placement, SpotStatus
from neuronetes.spot import is_spot_node

from .budget import (
    BUDGET_REACHED,
    COST_BUDGET_EXCEEDED,
    UNKNOWN_PRICES,
    BudgetPlan,
    PoolPrices,
    money,
    pod_gpus,
)
from .fallback import ModelChoice
from .pods import LABEL_POOL
from .policy import ResolvedPool
from .reconcile import is_ready, is_terminating

__all__ = [
    "AUTOSCALER_CONDITIONS",
    "CARRIED_CONDITIONS",
    "COST_BUDGET_EXCEEDED",
    "NO_MATCHING_NODES",
    "budget_condition",
    "make_condition",
    "pod_gpus",
    "pool_status",
    "type_condition",
]

AUTOSCALER_CONDITIONS = ("AutoscalerConflict", "MetricsStale")
"""Condition types the autoscaling controller owns (`neuronetes_operator.autoscaler`): a status
written here carries them over as they are."""
CARRIED_CONDITIONS = AUTOSCALER_CONDITIONS
"""Condition types other controllers set on the pool: carried over as they are unless this
status computes them itself."""


def _placement(pod: Mapping[str, Any]) -> Placement:
    meta = pod["metadata"]
    node = pod.get("spec", {}).get("nodeName")
    gpus: list[int] | None = None
    raw = (meta.get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
    if raw:
        try:
            doc = c.decode_assignment(raw)
            gpus = sorted({g.index for ctr in doc.containers.values() for g in ctr.gpus})
        except c.AssignmentError:
            gpus = None
    return Placement(
        pod=meta["name"], node=node, gpus=gpus, gang=(meta.get("labels") or {}).get(c.LABEL_GANG)
    )


def make_condition(kind: str, ok: bool, reason: str, message: str, generation: int) -> Condition:
    return Condition(
        type=kind,
        status="True" if ok else "False",
        reason=reason,
        message=message,
        observed_generation=generation,
    )


def _unschedulable(pod: Mapping[str, Any]) -> str | None:
    for cd in pod.get("status", {}).get("conditions") or []:
        if (
            cd.get("type") == "PodScheduled"
            and cd.get("status") == "False"
            and cd.get("reason") == "Unschedulable"
        ):
            return str(cd.get("message") or "unschedulable")
    return None


def labels_of(pods: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, str]:
    for p in pods:
        if p["metadata"]["name"] == name:
            return p["metadata"].get("labels") or {}
    return {}


def _merge_times(new: list[Condition], old: Sequence[Mapping[str, Any]], now: datetime) -> list[Condition]:
    """Keep lastTransitionTime of conditions whose status did not change."""
    before = {cd.get("type"): cd for cd in old}
    out = []
    for cd in new:
        prev = before.get(cd.type)
        since = now
        if prev is not None and prev.get("status") == cd.status and prev.get("lastTransitionTime"):
            since = datetime.fromisoformat(str(prev["lastTransitionTime"]))
        out.append(Condition(**{**_fields(cd), "last_transition_time": since}))
    return out


def _fields(cd: Condition) -> dict[str, Any]:
    return {f: getattr(cd, f) for f in cd.__struct_fields__}


"""The condition (and Event reasons) of a pool whose ``maxCostPerHour`` holds replicas back."""
_SHOWN_NODES = 3


def budget_condition(plan: BudgetPlan, cost: CostStatus, generation: int) -> Condition | None:
    """``CostBudgetExceeded``: True while the budget holds replicas back (reason ``BudgetReached``,
    or ``UnknownPrices`` when only prices nobody knows do), False (``WithinBudget``) otherwise;
    None for a pool without a budget. The message carries the figures."""
    if plan.budget is None:
        return None
    figures = (
        f"running {money(cost.current_per_hour)}, projected {money(cost.projected_per_hour)} "
        f"of a budget of {money(plan.budget)}"
    )
    kept = len(plan.kept)
    if plan.held_for_cost:
        next_cost = "" if plan.next_cost is None else f" (the next would cost {money(plan.next_cost)})"
        message = f"{kept} of {plan.wanted} replicas fit the budget{next_cost}; {figures}"
        if plan.held_for_unknown:
            message += f"; {plan.held_for_unknown} more held back for unknown prices"
        return make_condition(COST_BUDGET_EXCEEDED, True, BUDGET_REACHED, message, generation)
    if plan.held_for_unknown:
        if plan.unknown_running:
            why = f"{plan.unknown_running} replica(s) run on nodes of unknown price: the total is unknown"
        elif plan.unpriced:
            shown = ", ".join(plan.unpriced[:_SHOWN_NODES])
            more = len(plan.unpriced) - _SHOWN_NODES
            if more > 0:
                shown += f" and {more} more"
            why = (
                f"the pods may land on node(s) of unknown price ({shown}): "
                f"label them {c.LABEL_PRICE_PER_HOUR} or add their instance type to the price table"
            )
        else:
            why = "no node admits the pods, so what they would cost is unknown"
        message = (
            f"{kept} of {plan.wanted} replicas kept; {plan.held_for_unknown} held back: {why}; {figures}"
        )
        return make_condition(COST_BUDGET_EXCEEDED, True, UNKNOWN_PRICES, message, generation)
    return make_condition(
        COST_BUDGET_EXCEEDED,
        False,
        "WithinBudget",
        f"{kept} of {plan.wanted} replicas; {figures}",
        generation,
    )


NO_MATCHING_NODES = "NoMatchingNodes"
"""The condition (and its reason, and the Event's) of a pool whose GPU type no node has."""


def type_condition(gpu_type: str, nodes_of_type: int, generation: int) -> Condition:
    """``NoMatchingNodes``: True while no node's ``neuronetes.io/gpu-type`` is the pool's type (its
    pods would stay Pending with nothing said), False once one is."""
    if nodes_of_type:
        message = f"{nodes_of_type} node(s) have GPUs of type {gpu_type}"
        return make_condition(NO_MATCHING_NODES, False, "NodesMatch", message, generation)
    message = (
        f"no node has GPUs of type {gpu_type} (node label {c.LABEL_GPU_TYPE}): the pool's pods stay "
        "Pending until one joins; check spec.gpuRequirements.type"
    )
    return make_condition(NO_MATCHING_NODES, True, NO_MATCHING_NODES, message, generation)


def pool_status(
    pool: Mapping[str, Any],
    resolved: ResolvedPool,
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    *,
    now: datetime | None = None,
    gang_notes: Mapping[str, str] | None = None,
    backlog: int = 0,
    nodes_of_type: int | None = None,
    spot: SpotStatus | None = None,
    extra_conditions: Sequence[Condition] = (),
    model: ModelChoice | None = None,
    cost: CostStatus | None = None,
    budget: BudgetPlan | None = None,
) -> AgentPoolStatus:
    """The status of `pool` given its pods and the nodes they are bound to (by name).
    `gang_notes`: per gang whose reservation the extender reported failed, what to say about it.
    `backlog`: pod creations and deletions the reconcile left for the next ones (its batch was
    full); the ``Progressing`` condition says so (reason ``Batching``). `nodes_of_type`: how many
    nodes have the GPU type the pool names (None: it names none, or nobody knows): the condition
    ``NoMatchingNodes`` (`type_condition`). `spot`, `extra_conditions`: the spot state and its
    conditions (`neuronetes_operator.spot_plan.spot_state`). `model`: the fallback step's choice
    (`fallback.choose_model`): ``activeModel``, ``fallback`` and the condition ``FallbackActive``.

    `cost`: ``status.cost`` (`neuronetes_operator.budget`),
    without it the cost is the bound pods' share of their nodes' labelled prices; `budget`: what
    ``maxCostPerHour`` kept, the condition ``CostBudgetExceeded`` (`budget_condition`)."""
    now = now or datetime.now(UTC)
    meta = pool["metadata"]
    generation = int(meta.get("generation") or 0)
    live = [p for p in pods if not is_terminating(p)]
    bound = [p for p in live if p.get("spec", {}).get("nodeName")]
    ready = [p for p in live if is_ready(p)]
    failed = [p for p in live if p.get("status", {}).get("phase") == "Failed"]
    stuck = [(p["metadata"]["name"], why) for p in live if (why := _unschedulable(p)) is not None]
    desired = resolved.desired

    conditions = [
        make_condition(
            "Ready",
            len(ready) >= desired,
            "AllReplicasReady" if len(ready) >= desired else "ReplicasNotReady",
            f"{len(ready)} of {desired} replicas ready",
            generation,
        ),
        make_condition(
            "Progressing",
            bool(backlog) or len(live) != desired or len(bound) < desired or len(pods) != len(live),
            "Batching"
            if backlog
            else ("Converging" if len(live) != desired or len(pods) != len(live) else "WaitingForPlacement"),
            f"{len(live)} pods, {len(bound)} bound, {desired} desired"
            + (f"; {backlog} more pod changes wait for the next reconciles (batches)" if backlog else ""),
            generation,
        ),
        make_condition(
            "Degraded",
            bool(failed or stuck),
            "PodsFailed" if failed else ("Unschedulable" if stuck else "AsExpected"),
            (
                f"{len(failed)} pods failed"
                if failed
                else (f"{len(stuck)} pods cannot be placed; {stuck[0][0]}: {stuck[0][1]}" if stuck else "")
            ),
            generation,
        ),
    ]
    if resolved.gang_size:
        whole = 0
        for g in range(resolved.gangs):
            members = [
                p
                for p in bound
                if (p["metadata"].get("labels") or {}).get(c.LABEL_GANG) == f"{meta['name']}-{g}"
            ]
            whole += len(members) == resolved.gang_size
        unplaceable = [why for name, why in stuck if (labels_of(live, name)).get(c.LABEL_GANG)]
        reason, message = (
            "GangsWaiting",
            f"{whole} of {resolved.gangs} gangs of {resolved.gang_size} bound whole",
        )
        if whole == resolved.gangs:
            reason = "AllGangsBound"
        elif gang_notes:
            # The extender reserved a placement that did not hold (Expired/Failed): the operator
            # recreates the gang, backing off (controller._retry_failed_gangs).
            first = sorted(gang_notes)[0]
            reason, message = "GangReservationFailed", f"{message}; {gang_notes[first]}"
        elif unplaceable:
            # The scheduler found no placement for a whole gang; its pods stay queued and are
            # retried with kube-scheduler's backoff (and after the extender's reservation expires).
            reason, message = "GangUnplaceable", f"{message}; the scheduler says: {unplaceable[0]}"
        conditions.append(
            make_condition(
                "GangScheduled", whole == resolved.gangs and resolved.gangs > 0, reason, message, generation
            )
        )
    budget_cond = None if budget is None or cost is None else budget_condition(budget, cost, generation)
    if budget_cond is not None:
        conditions.append(budget_cond)
    gpu_type = ((pool.get("spec") or {}).get("gpuRequirements") or {}).get("type")
    if gpu_type and nodes_of_type is not None:
        conditions.append(type_condition(str(gpu_type), nodes_of_type, generation))
    conditions.extend(extra_conditions)
    if model is not None:
        conditions.append(model.condition)

    if failed:
        phase = "Degraded"
    elif desired and len(ready) >= desired and len(live) == desired:
        phase = "Ready"
    elif len(live) != desired:
        phase = "Scaling"
    elif not bound:
        phase = "Pending"
    elif len(bound) < desired:
        phase = "Scheduling"
    else:
        phase = "Degraded" if stuck else "Scheduling"
    if desired == 0 and not live:
        phase = "Ready"

    old = (pool.get("status") or {}).get("conditions") or []
    return AgentPoolStatus(
        phase=phase,  # type: ignore[arg-type]
        replicas=len(live),
        ready_replicas=len(ready),
        desired=desired,
        spot_replicas=sum(
            1
            for p in bound
            if is_spot_node(nodes.get(p["spec"]["nodeName"], {}).get("metadata", {}).get("labels") or {})
        ),
        gpus=sum(pod_gpus(p) for p in bound),
        cost_per_hour=cost.current_per_hour if cost is not None else _labelled_cost(bound, nodes),
        cost=cost,
        selector=f"{LABEL_POOL}={meta['name']}",
        active_model=(pool.get("spec") or {}).get("model") if model is None else model.model,
        fallback=None if model is None else model.status,
        observed_generation=generation,
        placements=sorted((_placement(p) for p in bound), key=lambda x: x.pod)[:1024],
        policies=list(resolved.policies),
        spot=spot,
        conditions=_merge_times(conditions, old, now) + _carried(old, {cd.type for cd in conditions}),
    )


def _labelled_cost(bound: Sequence[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]]) -> float:
    prices = PoolPrices(nodes)
    return round(sum(x for p in bound if (x := prices.bound(p)) is not None), 4)


def _carried(old: Sequence[Mapping[str, Any]], computed: set[str]) -> list[Condition]:
    out = []
    for cd in old:
        if cd.get("type") in CARRIED_CONDITIONS and cd.get("type") not in computed:
            since = cd.get("lastTransitionTime")
            out.append(
                Condition(
                    type=str(cd["type"]),
                    status=cd.get("status", "Unknown"),
                    observed_generation=cd.get("observedGeneration"),
                    last_transition_time=None if not since else datetime.fromisoformat(str(since)),
                    reason=cd.get("reason"),
                    message=cd.get("message"),
                )
            )
    return out
