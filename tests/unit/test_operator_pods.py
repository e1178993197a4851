"""The operator's pure parts: spec resolution, desired pods, the reconcile plan and the status."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from apitools import seed_examples

from neuronetes import contracts as c
from neuronetes.api.models import AgentPool, AgentPoolSpec, decode
from neuronetes.locality import (
    ANNOTATION_AVOID_NODES,
    ANNOTATION_DATA_LOCALITY_WEIGHT,
    ANNOTATION_DATA_NODES,
    ANNOTATION_DATA_ZONES,
    ANNOTATION_MAX_NODES_TO_SCORE,
    locality_annotations,
    locality_hints,
)
from neuronetes.spot import SPOT_LABELS
from neuronetes_operator.pods import LABEL_CAPACITY, LABEL_POOL, LABEL_TEMPLATE_HASH, desired_pods
from neuronetes_operator.policy import AUTOSCALING_CONTROLLER, resolve, scheduling_request
from neuronetes_operator.reconcile import plan
from neuronetes_operator.status import pool_status

pytestmark = pytest.mark.unit

UID = "11111111-2222-3333-4444-555555555555"


def obj(spec: str, name: str = "p") -> dict[str, Any]:
    return {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": name, "namespace": "ns", "uid": UID, "generation": 3},
        "spec": yaml.safe_load(spec) or {},
    }


def build(spec: str, **kw: Any) -> tuple[dict[str, Any], AgentPoolSpec, Any, list[Any]]:
    o = obj(spec)
    s = decode(o, AgentPool).spec
    r = resolve(s)
    return o, s, r, desired_pods(o, s, r, **kw)


def terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    aff = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return list(aff["nodeSelectorTerms"])


# ---- resolution ---------------------------------------------------------------------------------


def test_spot_block_without_enabled_means_on() -> None:
    spot = next(e for e in seed_examples() if e.name == "agentpool-spot-pool").obj
    r = resolve(decode(spot, AgentPool).spec)
    assert r.spot_allowed
    assert r.policies[0].name == "costOptimization" and r.policies[0].enabled
    off = resolve(
        decode(obj("scheduling: {costOptimization: {enabled: false, spotEnabled: true}}"), AgentPool).spec
    )
    assert not off.spot_allowed and not off.policies[0].enabled


@pytest.mark.parametrize(
    ("spec", "desired", "gang"),
    [
        ("{}", 1, 0),
        ("{minReplicas: 3}", 3, 0),
        ("{replicas: 4, minReplicas: 1, maxReplicas: 5}", 4, 0),
        ("{minReplicas: 10, prewarmPercent: 10}", 11, 0),
        ("{minReplicas: 4, maxReplicas: 4, prewarmPercent: 50}", 4, 0),
        ("{minReplicas: 4, scheduling: {gangScheduling: {enabled: true, minMembers: 4}}}", 4, 4),
        ("{minReplicas: 2, scheduling: {gangScheduling: {enabled: true}}}", 2, 2),
        (
            "{minReplicas: 4, prewarmPercent: 10,"
            " scheduling: {gangScheduling: {enabled: true, minMembers: 4}}}",
            8,
            4,
        ),
        ("{minReplicas: 0}", 0, 0),
    ],
)
def test_desired_replicas(spec: str, desired: int, gang: int) -> None:
    r = resolve(decode(obj(spec), AgentPool).spec)
    assert (r.desired, r.gang_size) == (desired, gang)


def test_policy_blocks_are_shown_never_dropped() -> None:
    r = resolve(
        decode(
            obj(
                "autoscaling: {ttftMs: 100}\nmaxReplicas: 3\nscheduling: {carbonAware: {enabled: true},"
                " cacheAware: {}, dataLocality: {}, fastScheduling: {enabled: true},"
                " preemption: {enabled: true}}"
            ),
            AgentPool,
        ).spec
    )
    names = {p.name: p for p in r.policies}
    assert set(names) == {
        "autoscaling",
        "carbonAware",
        "cacheAware",
        "dataLocality",
        "fastScheduling",
        "preemption",
    }
    assert names["carbonAware"].enabled
    assert names["carbonAware"].effect == "nothing to do (no preferredRegions, no timeShifting)"
    assert names["autoscaling"].effect == AUTOSCALING_CONTROLLER
    assert not names["cacheAware"].enabled
    assert "preempt" in (names["preemption"].effect or "")


# ---- desired pods -------------------------------------------------------------------------------


def test_whole_gpu_pod_carries_resources_type_memory_locality_bandwidth() -> None:
    _, _, _, pods = build(
        "gpuRequirements: {count: 8, type: A100, memory: 80Gi,"
        " topology: {locality: same-node, minBandwidth: 600Gi}}"
    )
    (pod,) = [p.manifest for p in pods]
    assert pod["metadata"]["name"] == "p-0"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {c.RESOURCE_GPU: "8"}
    assert pod["spec"]["schedulerName"] == c.SCHEDULER_NAME
    assert pod["metadata"]["annotations"] == {
        c.ANNOTATION_LOCALITY: "same-node",
        c.ANNOTATION_MIN_BANDWIDTH: "600",
    }
    exprs = {e["key"]: e for e in terms(pod)[0]["matchExpressions"]}
    assert exprs[c.LABEL_GPU_TYPE]["values"] == ["A100"]
    assert exprs[c.LABEL_GPU_MEMORY]["values"][0] == "80Gi"
    # On-demand by default: off every kind of spot node (neuronetes.spot.SPOT_LABELS).
    assert exprs[c.LABEL_SPOT] == {"key": c.LABEL_SPOT, "operator": "NotIn", "values": ["true"]}
    assert exprs["karpenter.sh/capacity-type"]["values"] == ["spot"]
    assert pod["metadata"]["labels"][LABEL_CAPACITY] == "on-demand"
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("AgentPool", UID, True)
    assert pod["metadata"]["labels"][LABEL_POOL] == "p"


def test_mig_pool_asks_for_one_instance_and_no_memory_class() -> None:
    _, _, _, pods = build("migProfile: 1g.5gb\ngpuRequirements: {type: A100, memory: 5Gi}")
    pod = pods[0].manifest
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"neuronetes.io/mig-1g.5gb": "1"}
    assert {e["key"] for e in terms(pod)[0]["matchExpressions"]} == {c.LABEL_GPU_TYPE, *SPOT_LABELS}


def test_gang_pods_are_labelled_and_named_by_gang() -> None:
    _, _, _, pods = build(
        "minReplicas: 8\ngpuRequirements: {count: 2}\n"
        "scheduling: {gangScheduling: {enabled: true, minMembers: 4, scheduleTimeoutSeconds: 60}}"
    )
    assert [p.name for p in pods] == [f"p-{g}-{m}" for g in range(2) for m in range(4)]
    labels = pods[5].manifest["metadata"]["labels"]
    assert (labels[c.LABEL_GANG], labels[c.LABEL_GANG_SIZE]) == ("p-1", "4")
    assert pods[0].manifest["metadata"]["annotations"][c.ANNOTATION_GANG_TIMEOUT] == "60"


def test_the_preemption_policy_reaches_the_extender_on_each_pod() -> None:
    """``fewest-victims`` is written on the pods (the extender orders their victims by it); the
    default and a pool that does not preempt write nothing, so their pods are not rolled."""
    policy = "scheduling: {priority: 100, preemption: {enabled: %s, policy: %s}}"
    _, _, _, fewest = build(policy % ("true", "fewest-victims"))
    assert fewest[0].manifest["metadata"]["annotations"][c.ANNOTATION_PREEMPTION_POLICY] == "fewest-victims"
    for enabled, value in (("true", "lowest-priority-first"), ("false", "fewest-victims")):
        _, _, _, pods = build(policy % (enabled, value))
        assert c.ANNOTATION_PREEMPTION_POLICY not in pods[0].manifest["metadata"]["annotations"]
    # The status says which order acts.
    _, _, resolved, _ = build(policy % ("true", "fewest-victims"))
    effect = next(p.effect for p in resolved.policies if p.name == "preemption") or ""
    assert "then fewest victims, then lowest priority" in effect


def test_template_is_merged_and_its_node_terms_keep_their_own_expressions() -> None:
    tol = [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]
    _, _, _, pods = build(
        "gpuRequirements: {type: H100}\ntemplate:\n  metadata: {labels: {app: chat}}\n  spec:\n"
        "    containers: [{name: server, image: vllm}, {name: sidecar, image: envoy}]\n"
        "    affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms:"
        " [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}}",
        tolerations=tol,
    )
    pod = pods[0].manifest
    assert pod["metadata"]["labels"]["app"] == "chat"
    assert [ctr["name"] for ctr in pod["spec"]["containers"]] == ["server", "sidecar"]
    assert "resources" not in pod["spec"]["containers"][1]
    assert [e["key"] for e in terms(pod)[0]["matchExpressions"]] == ["zone", c.LABEL_GPU_TYPE, *SPOT_LABELS]
    assert pod["spec"]["tolerations"] == tol


def test_template_hash_changes_with_the_spec_only() -> None:
    a = build("gpuRequirements: {count: 1}")[3][0].manifest["metadata"]["labels"][LABEL_TEMPLATE_HASH]
    b = build("gpuRequirements: {count: 1}\nminReplicas: 2")[3][0].manifest["metadata"]["labels"][
        LABEL_TEMPLATE_HASH
    ]
    d = build("gpuRequirements: {count: 2}")[3][0].manifest["metadata"]["labels"][LABEL_TEMPLATE_HASH]
    assert a == b != d


def store_pods(node: str) -> list[dict[str, Any]]:
    return [{"metadata": {}, "spec": {"nodeName": node}, "status": {"phase": "Running"}}]


LOCAL = "minReplicas: 2\ngpuRequirements: {count: 1}\nscheduling: {%s}"


def test_scheduling_annotations_reach_created_pods_and_leave_the_template_hash_alone() -> None:
    # What the controller does before creating pods: the pool's current hints on its template.
    _, spec, _, pods = build(LOCAL % "dataLocality: {vectorStoreAffinity: [service/qdrant]}")
    weight, limit = scheduling_request(spec)
    hints = locality_hints(store_pods("gpu-3"), [], {"gpu-3": "zone-b"})
    pods[0].template.scheduling_annotations = locality_annotations(hints, weight, limit)
    created = [a.pod.manifest for a in plan(pods, []) if a.verb == "create" and a.pod]
    assert len(created) == 2
    for pod in created:
        notes = pod["metadata"]["annotations"]
        assert (notes[ANNOTATION_DATA_NODES], notes[ANNOTATION_DATA_ZONES]) == ("gpu-3", "zone-b")
        assert notes[ANNOTATION_DATA_LOCALITY_WEIGHT] == "medium"
    hashes = {p["metadata"]["labels"][LABEL_TEMPLATE_HASH] for p in created}

    # The store moved, the pool's dataLocality block changed and it turned fastScheduling on: the
    # hash is the one of a pool without any of it, and the running pods are not replaced.
    changed = (
        "dataLocality: {vectorStoreAffinity: [statefulset/milvus], localityWeight: high,"
        " antiAffinity: [redis]}, fastScheduling: {enabled: true, maxNodesToScore: 50}"
    )
    _, spec, _, now = build(LOCAL % changed)
    hints = locality_hints(store_pods("gpu-7"), store_pods("gpu-1"), {})
    now[0].template.scheduling_annotations = locality_annotations(hints, *scheduling_request(spec))
    _, _, _, bare = build("minReplicas: 2\ngpuRequirements: {count: 1}")
    assert {p.manifest["metadata"]["labels"][LABEL_TEMPLATE_HASH] for p in now + bare} == hashes
    assert plan(now, [running(p) for p in created]) == []
    # A pod created now (a scale-up) carries the hints current at its creation.
    fresh = now[0].manifest["metadata"]["annotations"]
    assert fresh[ANNOTATION_DATA_NODES] == "gpu-7" and fresh[ANNOTATION_AVOID_NODES] == "gpu-1"
    assert (fresh[ANNOTATION_DATA_LOCALITY_WEIGHT], fresh[ANNOTATION_MAX_NODES_TO_SCORE]) == ("high", "50")
    assert ANNOTATION_DATA_ZONES not in fresh  # the new store's node has no zone label


# ---- the plan -----------------------------------------------------------------------------------


def running(
    manifest: dict[str, Any], node: str | None = "n1", ready: bool = True, phase: str = "Running"
) -> dict[str, Any]:
    pod = copy.deepcopy(manifest)
    if node:
        pod["spec"]["nodeName"] = node
    pod["status"] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return pod


GANG = (
    "minReplicas: 4\ngpuRequirements: {count: 2}\n"
    "scheduling: {gangScheduling: {enabled: true, minMembers: 4}}"
)


def test_plan_creates_everything_missing() -> None:
    _, _, _, pods = build(GANG)
    actions = plan(pods, [])
    assert [(a.verb, a.name) for a in actions] == [("create", f"p-0-{m}") for m in range(4)]


def test_plan_of_converged_pool_is_empty() -> None:
    _, _, _, pods = build(GANG)
    assert plan(pods, [running(p.manifest) for p in pods]) == []


def test_gang_member_lost_after_binding_deletes_the_whole_gang_and_waits() -> None:
    _, _, _, pods = build(GANG)
    observed = [running(p.manifest) for p in pods[:3]]
    actions = plan(pods, observed)
    assert sorted((a.verb, a.name, a.reason) for a in actions) == [
        ("delete", f"p-0-{m}", "GangBroken") for m in range(3)
    ]
    terminating = [dict(p, metadata={**p["metadata"], "deletionTimestamp": "now"}) for p in observed]
    assert plan(pods, terminating) == []  # nothing is created while old members are still there


def test_failed_gang_member_breaks_the_gang() -> None:
    _, _, _, pods = build(GANG)
    observed = [running(p.manifest) for p in pods]
    observed[1]["status"]["phase"] = "Failed"
    assert {a.name for a in plan(pods, observed) if a.verb == "delete"} == {f"p-0-{m}" for m in range(4)}


def test_gang_half_created_before_binding_is_completed() -> None:
    _, _, _, pods = build(GANG)
    observed = [running(p.manifest, node=None, ready=False) for p in pods[:2]]
    assert [(a.verb, a.name) for a in plan(pods, observed)] == [("create", "p-0-2"), ("create", "p-0-3")]


def test_scale_down_deletes_the_extra_pods() -> None:
    _, _, _, three = build("minReplicas: 3")
    _, _, _, one = build("minReplicas: 1")
    actions = plan(one, [running(p.manifest) for p in three])
    assert sorted((a.verb, a.name, a.reason) for a in actions) == [
        ("delete", "p-1", "ScaledDown"),
        ("delete", "p-2", "ScaledDown"),
    ]


def test_rollout_replaces_one_pod_at_a_time_while_the_rest_is_ready() -> None:
    _, _, _, old = build("minReplicas: 3\ngpuRequirements: {count: 1}")
    _, _, _, new = build("minReplicas: 3\ngpuRequirements: {count: 2}")
    observed = [running(p.manifest) for p in old]
    assert [(a.verb, a.name, a.reason) for a in plan(new, observed)] == [("delete", "p-0", "Outdated")]
    observed[1]["status"]["conditions"][0]["status"] = "False"
    assert plan(new, observed) == []  # another replica is not ready: wait


# ---- status -------------------------------------------------------------------------------------


def test_status_reads_placements_cost_and_conditions() -> None:
    o, _, r, pods = build(GANG + "\nmodel: llama-70b")
    node = "gpu-1"
    uuid = c.simulated_gpu_uuid(node, 0)
    observed = []
    for i, p in enumerate(pods):
        pod = running(p.manifest, node=node)
        gpus = tuple(
            c.GpuAssignment(
                uuid=c.simulated_gpu_uuid(node, 2 * i + k),
                index=2 * i + k,
                memory_mib=81920,
                compute_percent=100,
            )
            for k in range(2)
        )
        doc = c.Assignment(
            version=1,
            node=node,
            containers={"agent": c.ContainerAssignment(gpus=gpus, priority=0, qos=c.QoS.GUARANTEED)},
        )
        pod["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS] = c.encode_assignment(doc)
        observed.append(pod)
    assert uuid
    nodes = {node: {"metadata": {"labels": {c.LABEL_PRICE_PER_HOUR: "40.00", c.LABEL_GPU_COUNT: "8"}}}}
    st = pool_status(o, r, observed, nodes)
    assert (st.phase, st.replicas, st.ready_replicas, st.desired, st.gpus) == ("Ready", 4, 4, 4, 8)
    assert st.cost_per_hour == 40.0
    assert st.placements is not None and st.placements[1].gpus == [2, 3] and st.placements[1].gang == "p-0"
    conds = {cd.type: cd.status for cd in st.conditions or []}
    assert conds == {"Ready": "True", "Progressing": "False", "Degraded": "False", "GangScheduled": "True"}
    assert st.selector == f"{LABEL_POOL}=p" and st.observed_generation == 3
    assert st.active_model == "llama-70b"


def test_status_of_unplaceable_pods_says_why() -> None:
    o, _, r, pods = build("minReplicas: 2")
    stuck = running(pods[0].manifest, node=None, ready=False, phase="Pending")
    stuck["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes: no A100",
        }
    ]
    st = pool_status(o, r, [stuck], {})
    conds = {cd.type: cd for cd in st.conditions or []}
    assert conds["Degraded"].status == "True" and "no A100" in (conds["Degraded"].message or "")
    assert st.phase == "Scaling"


def test_a_gang_the_scheduler_cannot_place_says_so() -> None:
    o, _, r, pods = build(GANG)
    observed = []
    for p in pods:
        pod = running(p.manifest, node=None, ready=False, phase="Pending")
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "no node holds 8 GPUs",
            }
        ]
        observed.append(pod)
    st = pool_status(o, r, observed, {})
    gang = next(cd for cd in st.conditions or [] if cd.type == "GangScheduled")
    assert (gang.status, gang.reason) == ("False", "GangUnplaceable")
    assert "no node holds 8 GPUs" in (gang.message or "")


def test_cache_aware_pool_pods_carry_model_and_weight() -> None:
    on = "model: org/llama-8b\nscheduling: {cacheAware: {enabled: true, cacheHitWeight: 0.35}}"
    _, _, resolved, pods = build(on)
    annotations = pods[0].manifest["metadata"]["annotations"]
    assert annotations[c.ANNOTATION_MODEL] == "org/llama-8b"
    assert annotations[c.ANNOTATION_CACHE_HIT_WEIGHT] == "0.35"
    (state,) = [p for p in resolved.policies if p.name == "cacheAware"]
    assert state.enabled and "weight 0.35" in (state.effect or "")
    _, _, resolved, pods = build("model: org/llama-8b\nscheduling: {cacheAware: {enabled: false}}")
    assert c.ANNOTATION_CACHE_HIT_WEIGHT not in pods[0].manifest["metadata"]["annotations"]
    assert c.ANNOTATION_MODEL not in pods[0].manifest["metadata"]["annotations"]
