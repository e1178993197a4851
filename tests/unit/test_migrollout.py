"""The MIG layout controller's pure part (`neuronetes.migrollout`): pending demand from pods, the
planner's input from GPUNodes (running instances, hysteresis, frozen nodes), the plan per node, the
agent's spec entries and mig-parted's config."""

from __future__ import annotations

from typing import Any

import msgspec.yaml
import pytest

from neuronetes import contracts as c
from neuronetes.mig import catalog_for
from neuronetes.migdemand import (
    demand_owner,
    pending_mig_demand,
    pinned_slice_demand,
    plan_mig_demand,
    slice_held_instances,
    unserved_by_claim,
)
from neuronetes.migplan import GpuMigState, MigPlan, plan_mig_layouts
from neuronetes.migrollout import (
    LABEL_MIG_APPLY,
    agent_layout_entries,
    apply_path,
    gpu_states,
    merge_mig_parted_configs,
    mig_parted_config_name,
    mig_parted_entry,
    node_relayouts,
)
from neuronetes.nodeselect import pod_fits_node

pytestmark = pytest.mark.unit

NOW = 1_000_000.0
FULL = [("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3), ("3g.20gb", 4)]  # the a100-40gb-mig profile's GPU


def pod(
    name: str,
    resources: dict[str, str],
    *,
    node: str = "",
    created: str = "2024-01-01T00:00:00Z",
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
        "spec": {"nodeName": node, "containers": [{"name": "m", "resources": {"limits": resources}}], **spec},
        "status": {"phase": "Pending"},
    }


def gpunode(
    name: str, gpus: list[list[tuple[str, int]]], busy: dict[int, set[int]] | None = None, **extra: Any
) -> dict[str, Any]:
    out = []
    for index, instances in enumerate(gpus):
        uuids = {s: f"MIG-{name}-{index}-{s}" for _, s in instances}
        out.append(
            {
                "index": index,
                "model": "A100-SXM4-40GB",
                "migMode": "Enabled",
                "health": "Available",
                "migInstances": [{"profile": p, "start": s, "uuid": uuids[s]} for p, s in instances],
                "allocations": [
                    {"namespace": "ml", "pod": f"user-{s}", "migInstance": uuids[s]}
                    for s in (busy or {}).get(index, ())
                ],
                **extra,
            }
        )
    return {"metadata": {"name": name, "generation": 1}, "spec": {}, "status": {"gpus": out}}


def test_pending_demand_reads_mig_requests_of_unbound_pods_oldest_first() -> None:
    pods = [
        pod("late", {c.mig_resource_name("1g.10gb"): "2"}, created="2024-01-02T00:00:00Z"),
        pod("early", {c.mig_resource_name("1g.5gb+me"): "1", "cpu": "1"}),
        pod("bound", {c.mig_resource_name("1g.10gb"): "1"}, node="n1"),
        pod("whole", {c.RESOURCE_GPU: "1"}),
        pod(
            "typed",
            {c.mig_resource_name("3g.40gb"): "1"},
            created="2024-01-03T00:00:00Z",
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": c.LABEL_GPU_TYPE, "operator": "In", "values": ["H100"]}
                                ]
                            }
                        ]
                    }
                }
            },
        ),
    ]
    items, left = pending_mig_demand(pods, 10)
    assert [(d.key, d.profile, d.gpu_model) for d in items] == [
        ("ml/early", "1g.5gb+me", None),
        ("ml/late#0", "1g.10gb", None),
        ("ml/late#1", "1g.10gb", None),
        ("ml/typed", "3g.40gb", "H100"),
    ]
    assert left == 0
    assert pending_mig_demand(pods, 2) == (items[:2], 2)


def test_apply_path_follows_the_label_then_mig_managers_own_label() -> None:
    assert apply_path({}) == "agent"
    assert apply_path({"nvidia.com/mig.config": "all-balanced"}) == "mig-manager"
    assert apply_path({"nvidia.com/mig.config": "x", LABEL_MIG_APPLY: "agent"}) == "agent"
    assert apply_path({LABEL_MIG_APPLY: "none"}) == "none"
    assert apply_path({LABEL_MIG_APPLY: "bogus"}) == "agent"


def test_running_instances_are_kept_and_the_plan_serves_the_pod_on_the_agent_path() -> None:
    node = gpunode("n1", [FULL, FULL], busy={0: {0, 2, 3, 4}, 1: {4}})
    states, skipped = gpu_states(node, "agent", {}, NOW)
    assert not skipped and [s.in_use for s in states] == [frozenset({0, 2, 3, 4}), frozenset({4})]
    demand, _ = pending_mig_demand([pod("p", {c.mig_resource_name("1g.10gb"): "1"})], 10)
    plan = plan_mig_layouts(demand, states, now_s=NOW)
    assert plan.served == 1 and plan.placements[0].gpu == "n1/1"
    (relayout,) = node_relayouts(plan, {"n1": "agent"})
    assert relayout.node == "n1" and list(relayout.gpus) == [1] and relayout.serves == ("ml/p",)
    target = relayout.gpus[1].target
    assert (catalog_for("A100-40GB").profile("3g.20gb"), 4) in [(i.profile, i.start) for i in target]
    entries = agent_layout_entries(
        [{"gpuIndex": 0, "instances": [{"profile": "1g.5gb", "count": 7}]}], relayout
    )
    assert entries[0] == {"gpuIndex": 0, "instances": [{"profile": "1g.5gb", "count": 7}]}
    assert entries[1]["gpuIndex"] == 1 and {"profile": "3g.20gb", "start": 4} in entries[1]["placements"]
    assert sum(1 for p in entries[1]["placements"] if p["profile"] == "1g.10gb") == 1


def test_hysteresis_frozen_nodes_unhealthy_gpus_and_busy_mig_manager_gpus_stay_as_they_are() -> None:
    demand, _ = pending_mig_demand([pod("p", {c.mig_resource_name("1g.10gb"): "1"})], 10)
    node = gpunode("n1", [FULL])
    recent = {0: NOW - 300}
    assert plan_mig_layouts(demand, gpu_states(node, "agent", recent, NOW)[0], now_s=NOW).served == 0
    older = {0: NOW - 601}
    assert plan_mig_layouts(demand, gpu_states(node, "agent", older, NOW)[0], now_s=NOW).served == 1
    assert plan_mig_layouts(demand, gpu_states(node, "agent", {}, NOW, frozen=True)[0], now_s=NOW).served == 0
    assert plan_mig_layouts(demand, gpu_states(node, "none", {}, NOW)[0], now_s=NOW).served == 0
    sick = gpunode("n2", [FULL], health="Degraded")
    assert plan_mig_layouts(demand, gpu_states(sick, "agent", {}, NOW)[0], now_s=NOW).served == 0
    # mig-parted re-creates a whole GPU: one instance in use keeps the GPU out on that path only.
    used = gpunode("n3", [FULL], busy={0: {4}})
    assert plan_mig_layouts(demand, gpu_states(used, "agent", {}, NOW)[0], now_s=NOW).served == 1
    assert plan_mig_layouts(demand, gpu_states(used, "mig-manager", {}, NOW)[0], now_s=NOW).served == 0


def test_unserved_demand_is_named_per_pod_with_the_planners_distinct_reasons() -> None:
    pods = [
        pod("two", {c.mig_resource_name("3g.20gb"): "2"}),
        pod("alien", {c.mig_resource_name("7g.80gb"): "1"}),
        pod("fits", {c.mig_resource_name("1g.5gb"): "1"}),
    ]
    demand, _ = pending_mig_demand(pods, 10)
    node = gpunode("n1", [FULL], busy={0: {4}})  # the one 3g.20gb is in use
    plan = plan_mig_layouts(demand, gpu_states(node, "agent", {}, NOW)[0], now_s=NOW)
    unserved = unserved_by_claim(plan)
    assert list(unserved) == ["ml/alien", "ml/two"]  # demand order: oldest, then by name
    assert len(unserved["ml/two"]) == 1 and "3g.20gb" in unserved["ml/two"][0]
    assert unserved["ml/alien"] == ["no GPU here offers MIG profile 7g.80gb"]


def test_mode_change_offers_idle_mig_off_gpus_on_mig_manager_nodes_only() -> None:
    node = gpunode("n1", [[]], migMode="Disabled")
    demand, _ = pending_mig_demand([pod("p", {c.mig_resource_name("1g.10gb"): "1"})], 10)
    assert gpu_states(node, "mig-manager", {}, NOW)[0] == []
    assert gpu_states(node, "agent", {}, NOW, mode_change=True)[0] == []
    states, _ = gpu_states(node, "mig-manager", {}, NOW, mode_change=True)
    plan = plan_mig_layouts(demand, states, now_s=NOW)
    (relayout,) = node_relayouts(plan, {"n1": "mig-manager"}, ["n1/0"])
    assert relayout.mode_change == frozenset({0})


def test_mig_parted_config_groups_devices_and_keeps_other_configs() -> None:
    catalog = catalog_for("A100-40GB")
    balanced = catalog.layout_from_counts({"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2})
    sevens = catalog.layout_from_counts({"1g.5gb": 7})
    entry = mig_parted_entry({0: balanced, 1: sevens, 2: balanced})
    assert entry == [
        {"devices": [0, 2], "mig-enabled": True, "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
    ]
    name = mig_parted_config_name(entry)
    assert name.startswith("neuronetes-") and len(name) == 23 and name == mig_parted_config_name(list(entry))
    assert mig_parted_config_name(entry[:1]) != name
    existing = (
        "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n"
        "  neuronetes-000000000000: []\n  neuronetes-111111111111: []\n"
    )
    doc = msgspec.yaml.decode(merge_mig_parted_configs(existing, name, entry, {"neuronetes-111111111111"}))
    assert doc["version"] == "v1"
    assert set(doc["mig-configs"]) == {"all-disabled", "neuronetes-111111111111", name}
    assert doc["mig-configs"][name] == entry
    fresh = msgspec.yaml.decode(merge_mig_parted_configs(None, name, entry, ()))
    assert fresh == {"version": "v1", "mig-configs": {name: entry}}
    with pytest.raises(ValueError, match="not a mapping"):
        merge_mig_parted_configs("- a list\n", name, entry, ())


def mig_slice(
    name: str, profile: str, *, phase: str | None = None, created: str = "2024-01-01T12:00:00Z", **more: Any
) -> dict[str, Any]:
    status = more.pop("status", {"phase": phase} if phase else {})
    return {
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
        "spec": {"memory": "10Gi", "migProfile": profile, **more},
        "status": status,
    }


def test_pending_mig_slices_are_demand_with_the_pods_and_pods_inside_a_slice_or_over_quota_are_not() -> None:
    pods = [
        pod("early", {c.mig_resource_name("1g.5gb"): "1"}),
        pod("inside", {c.mig_resource_name("1g.10gb"): "1"}, created="2024-01-01T06:00:00Z"),
        pod("late", {c.mig_resource_name("2g.10gb"): "1"}, created="2024-01-02T00:00:00Z"),
    ]
    pods[1]["metadata"]["annotations"] = {c.ANNOTATION_SLICE: "claim"}  # runs in its slice's instance
    slices = [
        mig_slice("claim", "1g.10gb"),
        mig_slice("fresh", "3g.20gb", phase="Pending", created="2024-01-01T18:00:00Z"),
        mig_slice("bound", "1g.5gb", phase="Bound"),
        mig_slice("pinned", "1g.5gb", nodeName="n1"),
        {**mig_slice("going", "1g.5gb"), "metadata": {"name": "going", "deletionTimestamp": "x"}},
        {"metadata": {"name": "shared", "namespace": "ml"}, "spec": {"memory": "1Gi"}},
        mig_slice(  # held back by its namespace's quota: no instance is made for it
            "over-quota",
            "1g.5gb",
            status={"phase": "Pending", "conditions": [{"type": "Bound", "reason": "QuotaExceeded"}]},
        ),
    ]
    items, left = pending_mig_demand(pods, 10, slices)
    assert [(d.key, d.profile) for d in items] == [
        ("ml/early", "1g.5gb"),
        ("GPUSlice:ml/claim", "1g.10gb"),
        ("GPUSlice:ml/fresh", "3g.20gb"),
        ("ml/late", "2g.10gb"),
    ]
    assert left == 0
    assert [demand_owner(d.key) for d in items[:2]] == [("Pod", "ml", "early"), ("GPUSlice", "ml", "claim")]


def test_instances_bound_mig_slices_hold_are_in_use_and_never_re_laid_out() -> None:
    node = gpunode("n1", [FULL])
    node["status"]["gpus"][0]["uuid"] = "GPU-n1-0"
    held = slice_held_instances(
        [
            mig_slice("holds", "3g.20gb", status={"phase": "Bound", "gpuUUIDs": ["GPU-n1-0"], "migStart": 4}),
            mig_slice("waits", "2g.10gb", phase="Pending"),
        ]
    )
    assert held == frozenset({("GPU-n1-0", 4)})
    (state,), _ = gpu_states(node, "agent", {}, NOW, held=held)
    assert state.in_use == frozenset({4})
    demand, _ = pending_mig_demand([], 10, [mig_slice("wants", "4g.20gb")])
    plan = plan_mig_layouts(demand, [state], now_s=NOW)
    (g,) = plan.gpus
    assert plan.served == 1 and all(i.start != 4 for i in g.destroy), g
    assert (catalog_for("A100-40GB").profile("3g.20gb"), 4) in [(i.profile, i.start) for i in g.target]
    assert unserved_by_claim(plan) == {}


def test_pinned_mig_slices_are_planned_on_their_node_or_gpu_and_the_rest_elsewhere() -> None:
    n1, n2 = gpunode("n1", [FULL]), gpunode("n2", [FULL, FULL])
    for node in (n1, n2):
        for gpu in node["status"]["gpus"]:
            gpu["uuid"] = f"GPU-{node['metadata']['name']}-{gpu['index']}"
    slices = [
        mig_slice("on-n2", "4g.20gb", nodeName="n2"),
        mig_slice("on-gpu", "4g.20gb", nodeName="n2", gpuUUID="GPU-n2-1", created="2024-01-01T13:00:00Z"),
        mig_slice("on-instance", "4g.20gb", nodeName="n2", gpuUUID="MIG-n2-0-4"),
        mig_slice("bound", "4g.20gb", nodeName="n2", phase="Bound"),
    ]
    pinned = pinned_slice_demand(slices)
    assert [(d.key, d.nodes, d.gpu_uuid) for d in pinned] == [
        ("GPUSlice:ml/on-n2", frozenset({"n2"}), None),
        ("GPUSlice:ml/on-gpu", frozenset({"n2"}), "GPU-n2-1"),
    ]
    demand, _ = pending_mig_demand([pod("p", {c.mig_resource_name("4g.20gb"): "1"})], 10, slices)
    assert [d.key for d in demand] == ["ml/p"]  # pinned slices are not among the pending demand
    states = [s for node in (n1, n2) for s in gpu_states(node, "agent", {}, NOW)[0]]
    uuids = {f"{n}/{i}": f"GPU-{n}-{i}" for n, i in (("n1", 0), ("n2", 0), ("n2", 1))}
    plan = plan_mig_demand([*pinned, *demand], states, uuids, now_s=NOW)
    served = {p.demand.key: p.gpu for p in plan.placements}
    assert served == {"GPUSlice:ml/on-n2": "n2/0", "GPUSlice:ml/on-gpu": "n2/1", "ml/p": "n1/0"}
    assert [g.gpu for g in plan.gpus if g.changed] == ["n1/0", "n2/0", "n2/1"]
    assert all("4g.20gb" in g.target.counts() for g in plan.gpus)
    assert unserved_by_claim(plan) == {}


def k8s_node(name: str, *taints: str, **labels: str) -> dict[str, Any]:
    """A Node object: `taints` as ``key=value:Effect``."""
    parsed = []
    for text in taints:
        pair, _, effect = text.partition(":")
        key, _, value = pair.partition("=")
        parsed.append(
            {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}
        )
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"taints": parsed},
    }


def plan_for(pods: list[dict[str, Any]], nodes: list[dict[str, Any]], states: list[GpuMigState]) -> MigPlan:
    demand, _ = pending_mig_demand(pods, 10, (), nodes)
    return plan_mig_demand(demand, states, {}, now_s=NOW)


def test_pods_fit_nodes_by_selector_affinity_and_tolerations_of_blocking_taints() -> None:
    tainted = k8s_node("t", "dedicated=infer:NoSchedule", "spot:NoExecute", "soft=x:PreferNoSchedule")
    both = [
        {"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists"},
    ]
    assert pod_fits_node({"tolerations": both}, tainted)
    assert pod_fits_node({"tolerations": [{"operator": "Exists"}]}, tainted)  # tolerates every taint
    assert not pod_fits_node({"tolerations": both[:1]}, tainted)
    wrong_value = [{**both[0], "value": "train"}, both[1]]
    assert not pod_fits_node({"tolerations": wrong_value}, tainted)
    wrong_effect = [{**both[0], "effect": "NoExecute"}, both[1]]
    assert not pod_fits_node({"tolerations": wrong_effect}, tainted)
    assert pod_fits_node({}, k8s_node("soft", "soft=x:PreferNoSchedule"))  # only lowers the score
    zone_b = k8s_node("b", zone="b")
    assert pod_fits_node({"nodeSelector": {"zone": "b"}}, zone_b)
    assert not pod_fits_node({"nodeSelector": {"zone": "a"}}, zone_b)


def test_a_pod_selecting_a_node_is_not_served_by_an_idle_instance_elsewhere_and_its_node_is_re_laid_out() -> (
    None
):
    nodes = [k8s_node("n1", zone="a"), k8s_node("n2", zone="b")]
    # n1's 3g.20gb is idle (its 2g.10gb in use); n2's 3g.20gb is in use, its other slots idle.
    states = [
        *gpu_states(gpunode("n1", [FULL], busy={0: {0}}), "agent", {}, NOW)[0],
        *gpu_states(gpunode("n2", [FULL], busy={0: {4}}), "agent", {}, NOW)[0],
    ]
    anywhere = pod("anywhere", {c.mig_resource_name("3g.20gb"): "1"})
    plan = plan_for([anywhere], nodes, states)
    assert [p.gpu for p in plan.placements] == ["n1/0"] and not any(g.changed for g in plan.gpus)

    selective = pod("in-b", {c.mig_resource_name("3g.20gb"): "1"}, nodeSelector={"zone": "b"})
    (item,), _ = pending_mig_demand([selective], 10, (), nodes)
    assert item.nodes == frozenset({"n2"})
    plan = plan_for([selective], nodes, states)
    (placed,) = plan.placements
    assert (placed.gpu, placed.instance and placed.instance.start) == ("n2/0", 0)
    assert [g.gpu for g in plan.gpus if g.changed] == ["n2/0"]
    (n2,) = [g for g in plan.gpus if g.gpu == "n2/0"]
    assert {(i.profile.name, i.start) for i in n2.target} == {("3g.20gb", 0), ("3g.20gb", 4)}
    assert [(i.profile.name, i.start) for i in n2.in_use] == [("3g.20gb", 4)]

    nowhere = pod("in-c", {c.mig_resource_name("3g.20gb"): "1"}, nodeSelector={"zone": "c"})
    plan = plan_for([nowhere], nodes, states)
    assert unserved_by_claim(plan) == {
        "ml/in-c": [
            "no node with MIG GPUs here admits it (its nodeSelector, required node affinity or tolerations)"
        ]
    }


def test_a_pod_not_tolerating_a_nodes_taint_is_planned_elsewhere_and_one_tolerating_it_may_use_it() -> None:
    nodes = [k8s_node("n1", "dedicated=infer:NoSchedule"), k8s_node("n2")]
    states = [
        *gpu_states(gpunode("n1", [FULL], busy={0: {0}}), "agent", {}, NOW)[0],
        *gpu_states(gpunode("n2", [FULL], busy={0: {4}}), "agent", {}, NOW)[0],
    ]
    plain = pod("plain", {c.mig_resource_name("3g.20gb"): "1"})
    plan = plan_for([plain], nodes, states)
    assert [p.gpu for p in plan.placements] == ["n2/0"]
    assert [g.gpu for g in plan.gpus if g.changed] == ["n2/0"]

    toleration = {"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}
    tolerating = pod("tolerating", {c.mig_resource_name("3g.20gb"): "1"}, tolerations=[toleration])
    (item,), _ = pending_mig_demand([tolerating], 10, (), nodes)
    assert item.nodes is None  # it may run on every node: no restriction
    plan = plan_for([tolerating], nodes, states)
    assert [p.gpu for p in plan.placements] == ["n1/0"] and not any(g.changed for g in plan.gpus)


def test_two_restricted_groups_never_re_lay_out_the_same_gpu() -> None:
    nodes = [k8s_node("n1", zone="a", tier="x"), k8s_node("n2", zone="b", tier="x")]
    states = [
        *gpu_states(gpunode("n1", [FULL], busy={0: {4}}), "agent", {}, NOW)[0],
        *gpu_states(gpunode("n2", [FULL]), "agent", {}, NOW)[0],
    ]
    only_n2 = pod("only-n2", {c.mig_resource_name("4g.20gb"): "1"}, nodeSelector={"zone": "b"})
    # n1's GPU has an instance in use, so only n2's GPU can make a 7g.40gb: the group of one node,
    # planned first, has re-laid it out for its 4g.20gb.
    either = pod(
        "either",
        {c.mig_resource_name("7g.40gb"): "1"},
        nodeSelector={"tier": "x"},
        created="2023-12-31T00:00:00Z",
    )
    plan = plan_for([either, only_n2], [*nodes, k8s_node("n3")], states)
    assert [g.gpu for g in plan.gpus if g.changed] == ["n2/0"]
    (n2,) = [g for g in plan.gpus if g.gpu == "n2/0"]
    assert "4g.20gb" in n2.target.counts() and "7g.40gb" not in n2.target.counts()
    assert {p.demand.key: p.gpu for p in plan.placements} == {"ml/either": None, "ml/only-n2": "n2/0"}
    (reason,) = unserved_by_claim(plan)["ml/either"]
    assert "re-laid out less than" in reason and reason.endswith("(it may run on node(s) n1, n2 only)")


def test_one_idle_instance_never_serves_two_items_across_passes() -> None:
    nodes = [k8s_node("n1", zone="a")]
    wants = {c.mig_resource_name("3g.20gb"): "1"}
    pinned = pod("pinned", wants, nodeSelector={"zone": "a"})
    anywhere = pod("anywhere", wants, created="2024-01-02T00:00:00Z")
    # Re-laid out a moment ago: n1's GPU serves from its one idle 3g.20gb only.
    recent = gpu_states(gpunode("n1", [FULL]), "agent", {0: NOW - 1}, NOW)[0]
    plan = plan_for([pinned, anywhere], [*nodes, k8s_node("n2")], recent)
    assert [(p.demand.key, p.gpu) for p in plan.placements] == [("ml/pinned", "n1/0"), ("ml/anywhere", None)]
    # Free to change: the later pass keeps the instance the first serves from and makes another.
    free = gpu_states(gpunode("n1", [FULL]), "agent", {}, NOW)[0]
    plan = plan_for([pinned, anywhere], [*nodes, k8s_node("n2")], free)
    starts = {p.demand.key: p.instance and p.instance.start for p in plan.placements}
    assert starts == {"ml/pinned": 4, "ml/anywhere": 0}
    (g,) = plan.gpus
    assert {(i.profile.name, i.start) for i in g.target} == {("3g.20gb", 0), ("3g.20gb", 4)}
    assert g.in_use == ()  # nothing ran there before the plan
