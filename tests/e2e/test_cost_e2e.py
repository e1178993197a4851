"""Cost budgets on the local control plane: node prices from labels and from the price table's
ConfigMap, ``maxCostPerHour`` holding replicas back with the condition, the Event and
``status.cost``; an unknown price never counted as free (docs/cost.md).

The operator (``neuronetes operator run``), the webhooks and the extender run as processes
(`neuronetes.devcluster.localstack.LocalStack`, `extender_harness.ExtenderProcess`); the nodes are
kwok nodes of this module alone (label ``cost-e2e``), which each pool selects, so the budget's
projection (the dearest node a pool's pods may land on) is over them only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from extender_harness import ExtenderProcess
from operator_stack import operator_stack

from neuronetes import contracts as c
from neuronetes.devcluster.access import EXTENDER_NAMESPACE, EXTENDER_SERVICE_ACCOUNT
from neuronetes.devcluster.localstack import LocalStack
from neuronetes.pricing import PRICE_TABLE_KEY
from neuronetes.profiles import profile
from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.pods import LABEL_POOL

pytestmark = pytest.mark.e2e

NS = "cost-e2e"
TABLE = "price-table"
SELECT = "cost-e2e"  # the node label each pool selects: labelled or table
INSTANCE = "p4d.24xlarge"
stack_extender: list[ExtenderProcess] = []  # the module's extender, for its log


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


def set_table(cluster: E2ECluster, text: str) -> None:
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": TABLE, "namespace": NS},
        "data": {PRICE_TABLE_KEY: text},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(configmap))


def extender_table_access() -> dict[str, Any]:
    meta = {"name": "neuronetes:scheduler", "namespace": NS}
    rule = {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [TABLE],
        "verbs": ["get", "list", "watch"],
    }
    subject = {"kind": "ServiceAccount", "name": EXTENDER_SERVICE_ACCOUNT, "namespace": EXTENDER_NAMESPACE}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": [rule]}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": meta["name"]},
        "subjects": [subject],
    }
    return {"apiVersion": "v1", "kind": "List", "items": [role, binding]}


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    work = Path(tmp_path_factory.mktemp("cost"))

    def prepare() -> None:
        set_table(cluster, "{}")  # no entries yet: the table node's price is unknown
        # What the chart grants the extender (files/rbac.yaml): this one ConfigMap, by name.
        cluster.kubectl("apply", "-f", "-", input=json.dumps(extender_table_access()))

    settings = {**dev_operator_settings(), "priceTable": f"{NS}/{TABLE}", "resyncSeconds": 5}
    table = ["--price-table", f"{NS}/{TABLE}"]
    with operator_stack(
        cluster, work, NS, settings=settings, extender_args=table, prepare=prepare, replicas=1
    ) as up:
        # Two nodes priced by their label (16/h for 8 GPUs: 2/h a GPU); one by the table alone.
        up.add_nodes(
            "dgx-a100-80gb", 2, "cost-labelled", labels={SELECT: "labelled", c.LABEL_PRICE_PER_HOUR: "16.00"}
        )
        by_table = profile("dgx-a100-80gb").node_spec(
            "cost-table-0",
            labels={
                SELECT: "table",
                "node.kubernetes.io/instance-type": INSTANCE,
                "karpenter.sh/capacity-type": "on-demand",
            },
        )
        up.nodes += cluster.dev.create_nodes([replace(by_table, price_per_hour=None)])
        up.local.start()
        stack_extender.append(up.extender)
        try:
            yield up.local
        finally:
            stack_extender.clear()


def apply_pool(
    cluster: E2ECluster, name: str, *, replicas: int, gpus: int, select: str, budget: float
) -> None:
    pool = {
        "apiVersion": c.API_VERSION,
        "kind": "AgentPool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "minReplicas": 1,
            "gpuRequirements": {"type": "A100", "count": gpus},
            "scheduling": {"costOptimization": {"maxCostPerHour": budget}},
            "template": {
                "spec": {
                    "nodeSelector": {SELECT: select},
                    "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
                }
            },
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pool))


def status(cluster: E2ECluster, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "agentpool", name, "-n", NS).get("status") or {})


def budget_condition(st: dict[str, Any]) -> dict[str, Any] | None:
    return next((cd for cd in st.get("conditions") or [] if cd["type"] == "CostBudgetExceeded"), None)


def live_pods(cluster: E2ECluster, name: str) -> list[str]:
    items = get_json(cluster, "pods", "-n", NS, "-l", f"{LABEL_POOL}={name}")["items"]
    return sorted(p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp"))


def events(cluster: E2ECluster, name: str) -> list[dict[str, Any]]:
    found = get_json(cluster, "events", "-n", NS, "--field-selector", f"involvedObject.name={name}")["items"]
    return sorted(found, key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]))


def settled(cluster: E2ECluster, name: str, *, ready: int, reason: str, cost: float) -> dict[str, Any]:
    """The pool's status once `ready` replicas are Ready, its budget condition says `reason` and its
    running cost is `cost`."""

    def check() -> dict[str, Any] | None:
        st = status(cluster, name)
        cd = budget_condition(st)
        current = (st.get("cost") or {}).get("currentPerHour")
        ok = (
            st.get("readyReplicas") == ready and cd is not None and cd["reason"] == reason and current == cost
        )
        return st if ok else None

    return wait_until(check, timeout=120, what=f"pool {name}: {ready} ready, {reason}, {cost}/h")


def test_a_pool_under_its_budget_gets_every_replica(cluster: E2ECluster, stack: LocalStack) -> None:
    apply_pool(cluster, "under", replicas=3, gpus=1, select="labelled", budget=10)
    st = settled(cluster, "under", ready=3, reason="WithinBudget", cost=6.0)
    assert st["cost"] == {"currentPerHour": 6.0, "projectedPerHour": 6.0, "budgetPerHour": 10.0}
    assert st["costPerHour"] == 6.0
    cd = budget_condition(st)
    assert cd is not None and cd["status"] == "False"
    assert cd["message"] == "3 of 3 replicas; running 6.00/h, projected 6.00/h of a budget of 10.00/h"
    assert live_pods(cluster, "under") == ["under-0", "under-1", "under-2"]
    policy = next(p for p in st["policies"] if p["name"] == "costOptimization")
    assert "maxCostPerHour 10: replicas beyond the budget are not created" in policy["effect"]


def test_a_pool_over_its_budget_gets_what_fits_says_so_and_gets_the_rest_when_the_budget_grows(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    # 2 GPUs a replica on 2/h GPUs: 4/h each; a budget of 10 holds two (8/h), not a third (12/h).
    apply_pool(cluster, "over", replicas=4, gpus=2, select="labelled", budget=10)
    st = settled(cluster, "over", ready=2, reason="BudgetReached", cost=8.0)
    assert live_pods(cluster, "over") == ["over-0", "over-1"]
    assert st["cost"] == {"currentPerHour": 8.0, "projectedPerHour": 8.0, "budgetPerHour": 10.0}
    assert st["desired"] == 4 and st["replicas"] == 2
    cd = budget_condition(st)
    assert cd is not None and cd["status"] == "True"
    message = (
        "2 of 4 replicas fit the budget (the next would cost 4.00/h); "
        "running 8.00/h, projected 8.00/h of a budget of 10.00/h"
    )
    assert cd["message"] == message
    said = [e for e in events(cluster, "over") if e["reason"] == "BudgetReached"]
    assert said and said[0]["type"] == "Warning"
    assert "2 of 4 replicas fit the budget (the next would cost 4.00/h)" in said[0]["message"]
    # More budget: the rest is created; the Event says the budget holds everything again.
    cluster.kubectl(
        "patch", "agentpool", "over", "-n", NS, "--type=merge",
        "-p", json.dumps({"spec": {"scheduling": {"costOptimization": {"maxCostPerHour": 16}}}}),
    )  # fmt: skip
    st = settled(cluster, "over", ready=4, reason="WithinBudget", cost=16.0)
    assert live_pods(cluster, "over") == ["over-0", "over-1", "over-2", "over-3"]
    within = wait_until(
        lambda: [e for e in events(cluster, "over") if e["reason"] == "WithinBudget"],
        what="a WithinBudget Event",
    )
    # Said when the budget let go, as the new pods were being placed: their cost is projected.
    assert within[0]["type"] == "Normal" and within[0]["message"].startswith("4 of 4 replicas; running ")
    assert within[0]["message"].endswith("projected 16.00/h of a budget of 16.00/h")


def test_a_price_table_entry_prices_a_node_without_a_label_and_a_change_is_picked_up(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    # The table has no entry for the node's instance type: its price is unknown, not free, and a
    # pool with a budget creates nothing that could land there.
    apply_pool(cluster, "tabled", replicas=2, gpus=1, select="table", budget=100)

    def held() -> dict[str, Any] | None:
        st = status(cluster, "tabled")
        cd = budget_condition(st)
        return st if cd is not None and cd["reason"] == "UnknownPrices" else None

    st = wait_until(held, timeout=60, what="the pool held back for an unknown price")
    assert (st["cost"].get("unknownPriceReplicas"), live_pods(cluster, "tabled")) == (2, [])
    cd = budget_condition(st)
    assert cd is not None and "cost-table-0" in cd["message"] and c.LABEL_PRICE_PER_HOUR in cd["message"]
    assert any(e["reason"] == "UnknownPrices" and e["type"] == "Warning" for e in events(cluster, "tabled"))

    set_table(cluster, f"{INSTANCE}:\n  on-demand: 32.00\n  spot: 12.80\n")  # 4/h a GPU
    st = settled(cluster, "tabled", ready=2, reason="WithinBudget", cost=8.0)
    assert "unknownPriceReplicas" not in st["cost"]

    # A bad table is one Event naming the entry on the ConfigMap; the last good one stays.
    set_table(cluster, f"{INSTANCE}:\n  on-demand: lots\n")
    said = wait_until(
        lambda: [e for e in events(cluster, TABLE) if e["reason"] == "InvalidPriceTable"],
        what="an InvalidPriceTable Event",
    )
    assert said[0]["type"] == "Warning" and said[0]["involvedObject"]["kind"] == "ConfigMap"
    assert f"entry {INSTANCE}/on-demand: 'lots' is not a price" in said[0]["message"]
    assert (status(cluster, "tabled").get("cost") or {}).get("currentPerHour") == 8.0

    # A new price is picked up without a restart: the running cost follows.
    set_table(cluster, f"{INSTANCE}:\n  on-demand: 48.00\n")  # 6/h a GPU
    settled(cluster, "tabled", ready=2, reason="WithinBudget", cost=12.0)


def test_the_extender_reads_the_table_by_name_alone_and_follows_a_change(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    (ext,) = stack_extender
    user = f"system:serviceaccount:{EXTENDER_NAMESPACE}:{EXTENDER_SERVICE_ACCOUNT}"

    def may(*what: str) -> bool:
        done = cluster.kubectl("auth", "can-i", *what, "-n", NS, "--as", user, check=False)
        return done.stdout.strip() == "yes"

    # Least privilege: the price table and nothing else of the namespace's ConfigMaps.
    assert may("watch", f"configmaps/{TABLE}") and may("get", f"configmaps/{TABLE}")
    assert not may("list", "configmaps") and not may("get", "configmaps/another")
    set_table(cluster, f"{INSTANCE}:\n  on-demand: 48.00\ng5.48xlarge:\n  on-demand: 16.29\n  spot: 5.8\n")

    def in_force() -> bool:
        return f"price table {NS}/{TABLE}: 3 price(s) in force" in ext.log.read_text()

    wait_until(in_force, timeout=30, what="the extender's price table to follow the ConfigMap")
    assert "403" not in ext.log.read_text()
