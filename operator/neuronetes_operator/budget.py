"""A pool's cost per hour and its budget (``costOptimization.maxCostPerHour``). Pure.

Prices come from `neuronetes.pricing` (a node's label, else the price table), the same as the
extender's cost scorer reads. docs/cost.md states the rules; in short:

* **Current cost**: the sum over the pool's bound pods of their share of their node's price,
  price × (the pod's GPUs / the node's ``neuronetes.io/gpu-count``), the whole price when the node
  does not say its GPU count. A MIG instance counts as one GPU (an upper bound).
* **Projected cost** of a pod not yet bound: the share it would take of the *most expensive* node
  its required node selection (nodeSelector, required node affinity, the pool's GPU type and
  memory, spot or not) admits among those with GPUs enough, so placing it can never cost more than
  projected. When any admitted node's price is unknown, or no node is admitted, the projection is
  unknown.
* **The budget**: units (a pod, or a whole gang) are kept in order — first those already bound
  whole (the running cost), then the rest in the pool's order — while the sum of their costs stays
  within the budget; the pool's pods outside the kept units are not created, and those existing
  are deleted (a price that rose removes the last units first). A unit whose cost is unknown is
  never created under a budget; one already bound whole is kept (a replica is not deleted for
  want of a price), but while one runs no new unit is created (the total cannot be checked).
* **Spot** (docs/spot.md): a pod about to be created spot-capable is projected at the dearest node
  its selection admits, spot or on-demand; an on-demand one (``NotIn`` every spot label) at the
  dearest on-demand node; an unbound pod by its ``neuronetes.io/capacity`` label. A replica being
  replaced (an interruption notice, a move off spot) is one unit, counted once at the dearer of
  its two pods, so its replacement is never refused for the old pod still running: the
  replacement is `neuronetes_operator.spot_plan`'s, for replicas the budget kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.api.models import CostStatus
from neuronetes.nodeselect import pod_admits_node
from neuronetes.pricing import EMPTY_TABLE, PriceTable, price_of

from .pods import LABEL_CAPACITY, DesiredPod
from .reconcile import is_terminating

COST_BUDGET_EXCEEDED: Final = "CostBudgetExceeded"
"""The pool condition the budget step sets (`status.budget_condition`); the fallback step reads it."""
BUDGET_REACHED: Final = "BudgetReached"
"""Its reason while replicas are held back for what they cost: the cost is known and over budget
(the fallback's ``costExceeded`` trigger)."""
UNKNOWN_PRICES: Final = "UnknownPrices"
"""Its reason while replicas are held back only because what they would cost is unknown: not a
trigger of the fallback model (a smaller model is not known to be cheaper on nodes nobody prices,
and a partial view of the nodes must not roll a pool)."""

__all__ = [
    "BUDGET_REACHED",
    "COST_BUDGET_EXCEEDED",
    "UNKNOWN_PRICES",
    "BudgetPlan",
    "PoolPrices",
    "PrimaryCost",
    "cost_status",
    "money",
    "plan_budget",
    "pod_gpus",
    "primary_cost",
]

_EPSILON: Final = 1e-9  # prices are sums of floats; a unit that fits exactly must fit


def money(x: float) -> str:
    """A price per hour as the conditions and Events say it."""
    return f"{x:.2f}/h"


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs (or MIG instances) the pod's containers ask for."""
    total = 0
    for ctr in pod.get("spec", {}).get("containers") or []:
        limits = (ctr.get("resources") or {}).get("limits") or {}
        for key, value in limits.items():
            if key == c.RESOURCE_GPU or key.startswith(c.RESOURCE_MIG_PREFIX):
                try:
                    total += int(str(value))
                except ValueError:
                    continue
    return total


def _share(price: float, gpus: int, labels: Mapping[str, str]) -> float:
    try:
        count = int(labels.get(c.LABEL_GPU_COUNT, "0"))
    except ValueError:
        count = 0
    return price if count <= 0 else price * min(1.0, gpus / count)


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return node.get("metadata", {}).get("labels") or {}


@dataclass(frozen=True, slots=True)
class Projection:
    """What one pod of the pool not yet bound may cost (None: unknown) and why."""

    per_pod: float | None
    admitted: int
    """Nodes the pod's node selection admits (with GPUs enough)."""
    unpriced: tuple[str, ...] = ()
    """Admitted nodes of unknown price, by name."""


class PoolPrices:
    """The prices one reconcile of one pool reads: its nodes' (by name, labels), the table, and the
    projection of its template's pods."""

    def __init__(
        self,
        nodes: Mapping[str, Mapping[str, Any]],
        table: PriceTable = EMPTY_TABLE,
        template_spec: Mapping[str, Any] | None = None,
        on_demand_spec: Mapping[str, Any] | None = None,
    ) -> None:
        """`template_spec`: the pods' spec as a spot-capable pod has it (no spot requirement);
        `on_demand_spec`: the on-demand variant (`pods.PoolTemplate.on_demand_spec`: ``NotIn`` the
        spot values of every spot label), projected apart: an on-demand pod's cost is that of the
        dearest on-demand node (None: as `template_spec`)."""
        self.nodes = nodes
        self.table = table
        self.projection = Projection(None, 0) if template_spec is None else self._project(template_spec)
        self.on_demand = self.projection if on_demand_spec is None else self._project(on_demand_spec)

    @classmethod
    def of(
        cls, nodes: Mapping[str, Mapping[str, Any]], table: PriceTable, want: Sequence[DesiredPod]
    ) -> PoolPrices:
        """The prices of the pods `want` (their shared template's projections; none: no pods)."""
        template = want[0].template if want else None
        if template is None:
            return cls(nodes, table)
        return cls(nodes, table, template.spec, template.on_demand_spec)

    def bound(self, pod: Mapping[str, Any]) -> float | None:
        """The bound pod's share of its node's price; None when the node or its price is unknown."""
        node = self.nodes.get(pod.get("spec", {}).get("nodeName") or "")
        if node is None:
            return None
        labels = _labels(node)
        price = price_of(labels, self.table)
        return None if price is None else _share(price, pod_gpus(pod), labels)

    def _project(self, spec: Mapping[str, Any]) -> Projection:
        gpus = pod_gpus({"spec": spec})
        highest: float | None = None
        admitted = 0
        unpriced: list[str] = []
        for name, node in sorted(self.nodes.items()):
            labels = _labels(node)
            if not pod_admits_node(spec, labels, name):
                continue
            try:
                count = int(labels.get(c.LABEL_GPU_COUNT, "0"))
            except ValueError:
                count = 0
            if gpus and 0 < count < gpus:
                continue  # too few GPUs to host it
            admitted += 1
            price = price_of(labels, self.table)
            if price is None:
                unpriced.append(name)
                continue
            share = _share(price, gpus, labels)
            highest = share if highest is None else max(highest, share)
        if unpriced or not admitted:
            return Projection(None, admitted, tuple(unpriced))
        return Projection(highest, admitted)

    def cost(self, pod: Mapping[str, Any] | None, *, spot: bool = True) -> float | None:
        """A pool pod's cost: bound, its share; else the projection of its variant (an unbound
        pod's `LABEL_CAPACITY`; not created yet, None: `spot`, whether it will be spot-capable)."""
        if pod is not None and pod.get("spec", {}).get("nodeName"):
            return self.bound(pod)
        if pod is not None:
            spot = (pod.get("metadata", {}).get("labels") or {}).get(LABEL_CAPACITY) != "on-demand"
        return (self.projection if spot else self.on_demand).per_pod


@dataclass(frozen=True, slots=True)
class BudgetPlan:
    """What the budget keeps of what the pool wants, and the figures behind it."""

    kept: list[DesiredPod]
    dropped: frozenset[str] = frozenset()
    """Names of the wanted pods the budget leaves out (deleted when they exist)."""
    budget: float | None = None
    wanted: int = 0
    held_for_cost: int = 0
    """Replicas left out because their cost would exceed the budget."""
    held_for_unknown: int = 0
    """Replicas left out because their cost is unknown (or a running unit's is)."""
    next_cost: float | None = None
    """The cost of the first unit left out for the budget."""
    unpriced: tuple[str, ...] = ()
    unknown_running: int = 0
    """Replicas kept, bound whole to nodes of unknown price."""
    admitted: int = 0
    within: float = 0.0
    """The kept units' cost (known)."""


def _units(want: Sequence[DesiredPod]) -> dict[str, list[DesiredPod]]:
    units: dict[str, list[DesiredPod]] = {}
    for d in want:
        units.setdefault(d.unit, []).append(d)
    return units


def plan_budget(
    want: Sequence[DesiredPod],
    pods: Sequence[Mapping[str, Any]],
    prices: PoolPrices,
    budget: float | None,
) -> BudgetPlan:
    """The pods of `want` the budget keeps (all without a budget), as the module docstring says."""
    projection = prices.projection
    if budget is None:
        return BudgetPlan(list(want), wanted=len(want), admitted=projection.admitted)
    live = {p["metadata"]["name"]: p for p in pods if not is_terminating(p)}
    units = _units(want)

    def pods_of(m: DesiredPod) -> list[Mapping[str, Any]]:
        """The replica's live pods: one, or two while a replacement runs beside the pod it replaces
        (`neuronetes_operator.spot_plan`)."""
        return [live[n] for n in (m.name, m.alternate) if n and n in live]

    def bound(m: DesiredPod) -> bool:
        return any(p.get("spec", {}).get("nodeName") for p in pods_of(m))

    def running(members: list[DesiredPod]) -> bool:
        return all(bound(m) for m in members)

    def member_cost(m: DesiredPod) -> float | None:
        """A replica counts once: while a replacement runs beside the old pod, at the dearer of
        the two (what it costs once the old one goes, or until then)."""
        found = pods_of(m)
        if not found:
            return prices.cost(None, spot=m.spot)
        costs = [prices.cost(p) for p in found]
        return None if any(x is None for x in costs) else max(x for x in costs if x is not None)

    order = [k for k, ms in units.items() if running(ms)] + [k for k, ms in units.items() if not running(ms)]
    kept: set[str] = set()
    total = 0.0
    held_cost = held_unknown = unknown_running = 0
    next_cost: float | None = None
    for key in order:
        members = units[key]
        is_running = running(members)
        costs = [member_cost(m) for m in members]
        if any(x is None for x in costs):
            if is_running:
                kept.add(key)
                unknown_running += len(members)
            else:
                held_unknown += len(members)
            continue
        cost = sum(x for x in costs if x is not None)
        if not is_running and unknown_running:
            held_unknown += len(members)
        elif total + cost <= budget + _EPSILON:
            kept.add(key)
            total += cost
        else:
            held_cost += len(members)
            if next_cost is None:
                next_cost = cost
    keep = [d for key, ms in units.items() if key in kept for d in ms]
    dropped = frozenset(d.name for key, ms in units.items() if key not in kept for d in ms)
    return BudgetPlan(
        keep,
        dropped,
        budget,
        len(want),
        held_cost,
        held_unknown,
        next_cost,
        projection.unpriced,
        unknown_running,
        projection.admitted,
        total,
    )


def cost_status(plan: BudgetPlan, pods: Sequence[Mapping[str, Any]], prices: PoolPrices) -> CostStatus:
    """`status.cost` from the pool's pods now (after this reconcile's changes) and the budget's
    plan; replicas bound to a node of unknown price, or kept without a projection, or held back for
    unknown prices count in ``unknownPriceReplicas``."""
    live = [p for p in pods if not is_terminating(p)]
    kept = {d.name for d in plan.kept}
    current = projected = 0.0
    unknown_bound = 0
    for pod in live:
        bound = bool(pod.get("spec", {}).get("nodeName"))
        cost = prices.cost(pod)
        if bound:
            if cost is None:
                unknown_bound += 1
            else:
                current += cost
        elif pod["metadata"]["name"] in kept and cost is not None:
            projected += cost
    unknown = unknown_bound + plan.held_for_unknown
    unknown += sum(  # pods kept, not bound, and no projection of their cost
        1
        for p in live
        if not p.get("spec", {}).get("nodeName") and p["metadata"]["name"] in kept and prices.cost(p) is None
    )
    return CostStatus(
        current_per_hour=round(current, 4),
        projected_per_hour=round(current + projected, 4),
        budget_per_hour=plan.budget,
        unknown_price_replicas=unknown or None,
    )


@dataclass(frozen=True, slots=True)
class PrimaryCost:
    """What ``spec.model``'s pods would cost at the pool's replicas, each projected as a pod not
    yet bound (`PoolPrices.cost`: the dearest node its selection admits; on-demand unless the pod
    is spot-capable). While the fallback model serves, this, not the fallback's own cost, says
    whether the cost trigger still holds: the pool goes back only to a primary that fits, instead
    of rolling back and over again each ``holdSeconds``."""

    per_hour: float | None
    """None: unknown (a node it may land on has no price, or none admits it)."""
    replicas: int
    budget: float

    @property
    def fits(self) -> bool:
        return self.per_hour is not None and self.per_hour <= self.budget + _EPSILON

    def describe(self, model: str) -> str:
        cost = "an unknown price" if self.per_hour is None else money(self.per_hour)
        verdict = "within" if self.fits else "over"
        budget = money(self.budget)
        return f"{model} would cost {cost} at {self.replicas} replicas, {verdict} maxCostPerHour {budget}"


def primary_cost(want: Sequence[DesiredPod], prices: PoolPrices, budget: float) -> PrimaryCost:
    """`PrimaryCost` of the pods `want` (``spec.model``'s, `pods.desired_pods`) under `prices`
    (their template's projection)."""
    total: float | None = 0.0
    for d in want:
        cost = prices.cost(None, spot=d.spot)
        if cost is None:
            total = None
            break
        total = (total or 0.0) + cost
    return PrimaryCost(None if total is None else round(total, 4), len(want), budget)
