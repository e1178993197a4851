"""The operator's cost budget (`neuronetes_operator.budget`): current and projected cost, the
replicas ``maxCostPerHour`` keeps, gangs whole, unknown prices never free, the condition."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from neuronetes import contracts as c
from neuronetes.api.models import AgentPool, decode
from neuronetes.pricing import parse_price_table
from neuronetes_operator.budget import PoolPrices, cost_status, plan_budget
from neuronetes_operator.pods import desired_pods
from neuronetes_operator.policy import resolve
from neuronetes_operator.reconcile import plan
from neuronetes_operator.status import budget_condition, pool_status

pytestmark = pytest.mark.unit


def pool(spec: str) -> tuple[dict[str, Any], Any, list[Any]]:
    o = {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 2},
        "spec": yaml.safe_load(spec),
    }
    s = decode(o, AgentPool).spec
    r = resolve(s)
    return o, r, desired_pods(o, s, r)


def node(gpu_type: str, gpus: int, price: str | None = None, **labels: str) -> dict[str, Any]:
    out = {c.LABEL_GPU_TYPE: gpu_type, c.LABEL_GPU_COUNT: str(gpus), c.LABEL_SPOT: "false", **labels}
    if price is not None:
        out[c.LABEL_PRICE_PER_HOUR] = price
    return {"metadata": {"labels": out}}


def bound(manifest: dict[str, Any], node_name: str | None) -> dict[str, Any]:
    pod = copy.deepcopy(manifest)
    if node_name:
        pod["spec"]["nodeName"] = node_name
    pod["status"] = {"phase": "Running" if node_name else "Pending", "conditions": []}
    return pod


ONE_GPU = "replicas: 4\ngpuRequirements: {type: A100, count: 1}\n"
NODES = {
    "a100-cheap": node("A100", 8, "40.00"),
    "a100-dear": node("A100", 8, "80.00"),
    "t4": node("T4", 4, "400.00"),  # never admitted: the pool's pods ask for A100s
}


def test_the_projection_is_the_dearest_admitted_node_and_bound_pods_cost_their_share() -> None:
    _, _, want = pool(ONE_GPU)
    prices = PoolPrices(NODES, template_spec=want[0].template.spec)
    assert prices.projection.per_pod == pytest.approx(10.0)  # 80 × 1/8, not the T4's 100
    assert prices.projection.admitted == 2
    assert prices.bound(bound(want[0].manifest, "a100-cheap")) == pytest.approx(5.0)


def test_without_a_budget_every_replica_is_kept_and_the_status_shows_both_costs() -> None:
    o, r, want = pool(ONE_GPU)
    prices = PoolPrices(NODES, template_spec=want[0].template.spec)
    pods = [bound(want[0].manifest, "a100-cheap"), bound(want[1].manifest, None)]
    kept = plan_budget(want, pods, prices, None)
    assert len(kept.kept) == 4 and budget_condition(kept, cost_status(kept, pods, prices), 2) is None
    cost = cost_status(kept, pods, prices)
    assert (cost.current_per_hour, cost.projected_per_hour, cost.budget_per_hour) == (5.0, 15.0, None)
    st = pool_status(o, r, pods, NODES, cost=cost)
    assert st.cost_per_hour == 5.0 and st.cost == cost


def test_a_budget_keeps_only_the_replicas_that_fit_and_says_so_with_the_figures() -> None:
    o, r, want = pool(ONE_GPU + "scheduling: {costOptimization: {maxCostPerHour: 25}}")
    prices = PoolPrices(NODES, template_spec=want[0].template.spec)
    # Two bound on the cheap node (5/h each); the others would cost up to 10/h each.
    pods = [bound(want[0].manifest, "a100-cheap"), bound(want[1].manifest, "a100-cheap")]
    kept = plan_budget(want, pods, prices, 25.0)
    assert [d.name for d in kept.kept] == ["p-0", "p-1", "p-2"]  # 5 + 5 + 10 = 20; a 4th: 30 > 25
    assert kept.dropped == {"p-3"} and kept.held_for_cost == 1 and kept.next_cost == pytest.approx(10.0)
    assert [a.name for a in plan(kept.kept, pods)] == ["p-2"]  # p-3 is not created
    cost = cost_status(kept, pods, prices)
    assert (cost.current_per_hour, cost.projected_per_hour, cost.budget_per_hour) == (10.0, 10.0, 25.0)
    cond = budget_condition(kept, cost, 2)
    assert cond is not None and (cond.type, cond.status, cond.reason) == (
        "CostBudgetExceeded",
        "True",
        "BudgetReached",
    )
    assert cond.message == (
        "3 of 4 replicas fit the budget (the next would cost 10.00/h); "
        "running 10.00/h, projected 10.00/h of a budget of 25.00/h"
    )
    st = pool_status(o, r, pods, NODES, cost=cost, budget=kept)
    assert any(cd.type == "CostBudgetExceeded" and cd.status == "True" for cd in st.conditions or [])


def test_a_pool_under_its_budget_keeps_everything() -> None:
    _, _, want = pool(ONE_GPU)
    prices = PoolPrices(NODES, template_spec=want[0].template.spec)
    kept = plan_budget(want, [], prices, 40.0)
    assert len(kept.kept) == 4 and not kept.dropped
    cond = budget_condition(kept, cost_status(kept, [], prices), 2)
    assert cond is not None and (cond.status, cond.reason) == ("False", "WithinBudget")


def test_a_price_that_rose_removes_the_last_running_replicas_first() -> None:
    _, _, want = pool(ONE_GPU)
    pods = [bound(d.manifest, "a100-dear") for d in want]  # 4 × 10/h
    prices = PoolPrices(NODES, template_spec=want[0].template.spec)
    kept = plan_budget(want, pods, prices, 25.0)
    assert kept.dropped == {"p-2", "p-3"}
    deletions = [(a.verb, a.name) for a in plan(kept.kept, pods)]
    assert deletions == [("delete", "p-2"), ("delete", "p-3")]


def test_gangs_are_kept_whole_or_not_at_all() -> None:
    spec = (
        "replicas: 8\ngpuRequirements: {type: A100, count: 2}\n"
        "scheduling: {gangScheduling: {enabled: true, minMembers: 4}, costOptimization: {maxCostPerHour: 70}}"
    )
    _, r, want = pool(spec)
    assert r.gang_size == 4
    prices = PoolPrices(NODES, template_spec=want[0].template.spec)  # 20/h a member at most
    kept = plan_budget(want, [], prices, 70.0)  # one gang: 80 > 70
    assert kept.kept == [] and kept.held_for_cost == 8
    kept = plan_budget(want, [], prices, 120.0)  # one gang (80), not a half of the second
    assert [d.name for d in kept.kept] == ["p-0-0", "p-0-1", "p-0-2", "p-0-3"]


def test_an_unknown_price_is_never_free_under_a_budget() -> None:
    _, _, want = pool(ONE_GPU)
    nodes = {**NODES, "a100-unpriced": node("A100", 8)}
    prices = PoolPrices(nodes, template_spec=want[0].template.spec)
    assert prices.projection.per_pod is None and prices.projection.unpriced == ("a100-unpriced",)
    kept = plan_budget(want, [], prices, 1000.0)
    assert kept.kept == [] and kept.held_for_unknown == 4
    cost = cost_status(kept, [], prices)
    assert cost.unknown_price_replicas == 4
    cond = budget_condition(kept, cost, 2)
    assert cond is not None and (cond.status, cond.reason) == ("True", "UnknownPrices")
    assert "a100-unpriced" in (cond.message or "") and c.LABEL_PRICE_PER_HOUR in (cond.message or "")
    # A price table entry for its instance type makes it known.
    nodes["a100-unpriced"]["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "p4de.24xlarge"
    table = parse_price_table("p4de.24xlarge: {on-demand: 40.96}")
    priced = PoolPrices(nodes, table, want[0].template.spec)
    assert priced.projection.per_pod == pytest.approx(10.0)
    assert len(plan_budget(want, [], priced, 1000.0).kept) == 4


def test_a_replica_running_where_the_price_is_unknown_is_kept_but_no_new_one_is_made() -> None:
    _, _, want = pool(ONE_GPU)
    nodes = {**NODES, "a100-unpriced": node("A100", 8)}
    pods = [bound(want[0].manifest, "a100-unpriced")]
    prices = PoolPrices(nodes, template_spec={"nodeSelector": {c.LABEL_GPU_TYPE: "A100"}})
    kept = plan_budget(want, pods, prices, 1000.0)
    assert [d.name for d in kept.kept] == ["p-0"] and kept.unknown_running == 1
    cost = cost_status(kept, pods, prices)
    assert cost.current_per_hour == 0.0 and cost.unknown_price_replicas == 4  # 1 bound + 3 held
    cond = budget_condition(kept, cost, 2)
    assert cond is not None and "run on nodes of unknown price" in (cond.message or "")


def test_a_pod_that_fits_no_node_has_an_unknown_cost() -> None:
    _, _, want = pool("replicas: 1\ngpuRequirements: {type: H100, count: 1}\n")
    prices = PoolPrices(NODES, template_spec=want[0].template.spec)
    assert prices.projection.per_pod is None and prices.projection.admitted == 0
    kept = plan_budget(want, [], prices, 100.0)
    cond = budget_condition(kept, cost_status(kept, [], prices), 2)
    assert cond is not None and "no node admits the pods" in (cond.message or "")


def test_the_policy_effect_says_the_budget_acts() -> None:
    _, r, _ = pool(ONE_GPU + "scheduling: {costOptimization: {maxCostPerHour: 25}}")
    (cost,) = [p for p in r.policies if p.name == "costOptimization"]
    assert cost.enabled and "maxCostPerHour 25: replicas beyond the budget are not created" in (
        cost.effect or ""
    )
    assert "budget" not in (cost.effect or "").split("maxCostPerHour 25: ")[1].split(";", 1)[1]
    _, off, _ = pool(ONE_GPU + "scheduling: {costOptimization: {enabled: false, maxCostPerHour: 25}}")
    assert "maxCostPerHour" not in (off.policies[0].effect or "")


SPOT_POOL = (
    "replicas: 2\ngpuRequirements: {type: A100, count: 1}\n"
    "scheduling: {costOptimization: {spotEnabled: true, maxCostPerHour: 20}}\n"
)
SPOT_NODES = {
    "od": node("A100", 8, "80.00"),  # 10/h a pod
    "spot": node("A100", 8, None, **{"karpenter.sh/capacity-type": "spot", c.LABEL_SPOT: "true"}),
}


def test_spot_capable_and_on_demand_pods_are_projected_by_the_nodes_their_variant_admits() -> None:
    _, _, want = pool(SPOT_POOL)
    template = want[0].template
    prices = PoolPrices(
        {**SPOT_NODES, "spot": node("A100", 8, "160.00", **{"karpenter.sh/capacity-type": "spot"})},
        template_spec=template.spec,
        on_demand_spec=template.on_demand_spec,
    )
    # A spot-capable pod may land on any A100 node: the dearest; an on-demand one on "od" only.
    assert prices.cost(None, spot=True) == pytest.approx(20.0)
    assert prices.cost(None, spot=False) == pytest.approx(10.0)
    assert prices.cost(bound(want[0].manifest, None)) == pytest.approx(10.0)  # labelled on-demand
    # An unpriced spot node leaves a spot-capable pod's cost unknown, never an on-demand one's.
    unpriced = PoolPrices(SPOT_NODES, template_spec=template.spec, on_demand_spec=template.on_demand_spec)
    assert unpriced.cost(None, spot=True) is None
    assert unpriced.cost(None, spot=False) == pytest.approx(10.0)


def test_a_replica_being_replaced_counts_once_and_its_replacement_is_not_held_back() -> None:
    _, _, want = pool(SPOT_POOL)
    template = want[0].template
    spot_priced = {**SPOT_NODES, "spot": node("A100", 8, "40.00", **{"karpenter.sh/capacity-type": "spot"})}
    prices = PoolPrices(spot_priced, template_spec=template.spec, on_demand_spec=template.on_demand_spec)
    old = bound(want[0].manifest, "spot")  # 5/h, under an interruption notice
    replacement = bound(template.pod(want[0].alternate, None, spot=False), None)  # on-demand: 10/h
    other = bound(want[1].manifest, "od")  # 10/h
    got = plan_budget(want, [old, replacement, other], prices, budget=20.0)
    # The replica costs the dearer of its two pods (10), not both (15): 10 + 10 fits 20.
    assert [d.name for d in got.kept] == [d.name for d in want] and not got.dropped
    assert got.within == pytest.approx(20.0)
    # The plan keeps both pods of the replica (the spot plan deletes the old one when the new is Ready).
    assert not [a for a in plan(got.kept, [old, replacement, other]) if a.verb == "delete"]
