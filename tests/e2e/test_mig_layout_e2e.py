"""The operator's MIG layout controller on the real local control plane (docs/mig.md, "Applying a plan").

A simulated A100-40GB MIG node (every GPU laid out ``3g.20gb + 2g.10gb + 1g.5gb×2``) is served by the
fleet agent and labelled ``neuronetes.io/mig-apply=agent``; the operator (a real process, a one-second
tick) sees a pending pod asking for a ``4g.20gb`` no current layout offers, writes the node's
``spec.migLayout`` placements, the agent re-lays out the GPU instance by instance, and the pod binds —
on the GPU where another pod runs on a ``3g.20gb``, whose instance stays as it is. Demand no GPU can
serve is told on the pod as an Event. A MIG GPUSlice whose profile no instance serves is planned
for the same way and bound to the new instance; a pod naming it gets exactly that instance, and a
second slice cannot take it until the first is deleted. A pod selecting a second agent node is
not served by an idle instance of the first: the second node is re-laid out and it binds there.
Then a node labelled for NVIDIA's
mig-manager: the test plays mig-manager (reads the mig-parted ConfigMap entry and
``nvidia.com/mig.config``, reports the new layout as the agent would, sets
``nvidia.com/mig.config.state=success``) and the relayout is Applied.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec.yaml
import pytest
from e2e_cluster import E2ECluster, pinned_pod, stop_process, wait_until
from operator_stack import OperatorStack, operator_stack

from neuronetes import contracts as c
from neuronetes.mig import catalog_for
from neuronetes.mig_layout import first_layout
from neuronetes.migrollout import LABEL_MIG_APPLY, MIG_MANAGER_CONFIG_LABEL, MIG_MANAGER_STATE_LABEL
from neuronetes_agent.daemon.fleet import start_fleet_agent
from neuronetes_agent.daemon.simulated import simulated_mig_uuid
from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.settings import MIG_PARTED_CONFIG_MAP

pytestmark = pytest.mark.e2e

NS = "mig-layouts-e2e"
SUITE = ("neuronetes.io/e2e-suite", "mig-layouts")
CONFIG_MAP = MIG_PARTED_CONFIG_MAP  # mig-manager's ConfigMap, in the module's namespace


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The operator with a one-second MIG layout tick, the extender, one MIG node the fleet agent serves."""
    work = Path(tmp_path_factory.mktemp("mig-layouts"))
    settings = {
        **dev_operator_settings(),
        "migLayouts": {
            "intervalSeconds": 1,
            "applyTimeoutSeconds": 60,
            "migManagerConfigMap": f"{NS}/{CONFIG_MAP}",
        },
    }
    with operator_stack(cluster, work, NS, settings=settings, log_lines=40) as up:
        (node,) = up.add_nodes(
            "a100-40gb-mig", 1, "migl-agent", labels={SUITE[0]: SUITE[1], LABEL_MIG_APPLY: "agent"}
        )
        log = work / "agent.log"
        agent = start_fleet_agent(
            cluster.kubeconfig, f"{SUITE[0]}={SUITE[1]}", log, extra_args=["--interval", "0.5"]
        )
        try:
            published = wait_until(
                lambda: published_gpunode(cluster, node), timeout=60, what="the agent's GPUNode"
            )
            up.local.start()
            yield {"up": up, "node": node, "first_status": copy.deepcopy(published["status"])}
        finally:
            stop_process(agent)
            print(f"--- agent log ---\n{log.read_text()[-3000:]}")


def published_gpunode(cluster: E2ECluster, name: str) -> dict[str, Any] | None:
    """The node's GPUNode once the agent published its GPUs."""
    found = cluster.kubectl("get", "-o", "json", "gpunode", name, check=False)
    obj = json.loads(found.stdout) if found.returncode == 0 else {}
    return dict(obj) if (obj.get("status") or {}).get("gpus") else None


def gpunode(cluster: E2ECluster, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "gpunode", name))


def mig_plan(cluster: E2ECluster, name: str) -> dict[str, Any]:
    return dict((gpunode(cluster, name).get("status") or {}).get("migPlan") or {})


def mig_pod(name: str, node: str, profile: str) -> dict[str, Any]:
    return pinned_pod(name, NS, node, {c.mig_resource_name(profile): "1"})


def create(cluster: E2ECluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps(obj))


def pod(cluster: E2ECluster, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "pod", name, "-n", NS))


def bound(cluster: E2ECluster, name: str) -> dict[str, Any] | None:
    p = pod(cluster, name)
    return (
        p
        if p["spec"].get("nodeName") and c.ANNOTATION_ASSIGNED_GPUS in p["metadata"].get("annotations", {})
        else None
    )


def grant(p: dict[str, Any]) -> c.GpuAssignment:
    assignment = c.decode_assignment(p["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS])
    return assignment.containers["main"].gpus[0]


def gpu_of(status: dict[str, Any], uuid: str) -> dict[str, Any]:
    return next(g for g in status["gpus"] if g["uuid"] == uuid)


def events_of(cluster: E2ECluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return list(
        get_json(cluster, "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")[
            "items"
        ]
    )


def test_the_agent_re_lays_out_a_gpu_around_a_running_instance_and_the_pod_binds(
    cluster: E2ECluster, stack: dict[str, Any]
) -> None:
    node = stack["node"]
    create(cluster, mig_pod("holder", node, "3g.20gb"))
    held = grant(wait_until(lambda: bound(cluster, "holder"), timeout=60, what="holder bound"))
    assert held.mig_profile == "3g.20gb" and held.mig_start is not None
    # The extender granted an instance the GPU has (the agent reported its layout): the holder's
    # profile at the grant's start slot.
    busy = next(
        i
        for i in gpu_of(gpunode(cluster, node)["status"], held.uuid)["migInstances"]
        if (i["profile"], i["start"]) == (held.mig_profile, held.mig_start)
    )
    instance = busy["uuid"]
    # The controller sees the instance in use once the agent reports its allocation.
    wait_until(
        lambda: any(
            a.get("migInstance") == instance
            for a in gpu_of(gpunode(cluster, node)["status"], held.uuid).get("allocations") or ()
        ),
        timeout=30,
        what="the holder's allocation reported",
    )
    holder_uid = pod(cluster, "holder")["metadata"]["uid"]

    create(cluster, mig_pod("wants-1g", node, "1g.10gb"))
    plan = wait_until(
        lambda: (p := mig_plan(cluster, node)).get("state") == "Applied" and p,
        timeout=60,
        what="migPlan Applied",
    )
    assert plan["path"] == "agent" and "create 1g.10gb@" in plan["message"], plan
    index = gpu_of(gpunode(cluster, node)["status"], held.uuid)["index"]
    # The GPU already in use is the one re-laid out: idle instances beside the holder's make way
    # for the 1g.10gb, the holder's instance is kept where it is.
    assert [g["index"] for g in plan["gpus"]] == [index]
    (entry,) = [e for e in gpunode(cluster, node)["spec"]["migLayout"] if e["gpuIndex"] == index]
    placements = {(p["profile"], p["start"]) for p in entry["placements"]}
    assert (busy["profile"], busy["start"]) in placements
    assert [p for p, _ in placements].count("1g.10gb") == 1, placements

    placed = grant(wait_until(lambda: bound(cluster, "wants-1g"), timeout=60, what="wants-1g bound"))
    assert (placed.uuid, placed.mig_profile) == (held.uuid, "1g.10gb")
    status = gpunode(cluster, node)["status"]
    instances = {(i["profile"], i["start"]): i["uuid"] for i in gpu_of(status, held.uuid)["migInstances"]}
    assert set(instances) == placements
    assert instances[(busy["profile"], busy["start"])] == instance, "the running instance was kept"
    (made,) = [start for profile, start in placements if profile == "1g.10gb"]
    assert placed.mig_start == made
    holder = pod(cluster, "holder")
    assert holder["metadata"]["uid"] == holder_uid and not holder["metadata"].get("deletionTimestamp")
    reasons = {e["reason"] for e in events_of(cluster, "default", node)}
    assert {"MIGRelayoutPlanned", "MIGRelayoutApplied"} <= reasons, reasons
    assert any(e["reason"] == "MIGRelayoutPlanned" for e in events_of(cluster, NS, "wants-1g"))


def mig_slice(name: str, profile: str, **pins: str) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": "GPUSlice",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"memory": "20Gi", "migProfile": profile, **pins},
    }


def gpuslice(cluster: E2ECluster, name: str) -> dict[str, Any]:
    found = cluster.kubectl("get", "-o", "json", "gpuslice", name, "-n", NS, check=False)
    return dict(json.loads(found.stdout)) if found.returncode == 0 else {}


def slice_reason(obj: dict[str, Any]) -> str:
    conditions = {cd["type"]: cd for cd in (obj.get("status") or {}).get("conditions") or ()}
    return str(conditions.get("Bound", {}).get("reason", ""))


def test_a_mig_slice_no_instance_serves_is_planned_for_bound_and_its_pod_gets_that_instance(
    cluster: E2ECluster, stack: dict[str, Any]
) -> None:
    node = stack["node"]
    # Every GPU is laid out 2g.10gb + 1g.5gb x2 + 3g.20gb: no 7g.40gb instance exists (the
    # mig-manager test below asks for a 4g.20gb: an idle one left here would serve it).
    create(cluster, mig_slice("claim-7g", "7g.40gb"))
    claim = wait_until(
        lambda: (s := gpuslice(cluster, "claim-7g")).get("status", {}).get("phase") == "Bound" and s,
        timeout=90,
        what="claim-7g Bound",
    )["status"]
    assert claim["node"] == node and claim["migProfile"] == "7g.40gb", claim
    gpu_uuid, start = claim["gpuUUIDs"][0], claim["migStart"]
    made = next(
        i
        for i in gpu_of(gpunode(cluster, node)["status"], gpu_uuid)["migInstances"]
        if (i["profile"], i["start"]) == ("7g.40gb", start)
    )
    assert claim["migInstanceUUID"] == made["uuid"]
    reasons = {e["reason"] for e in events_of(cluster, NS, "claim-7g")}
    assert {"MIGRelayoutPlanned", "Bound"} <= reasons, reasons

    # A pod naming the slice asks for nothing: the webhook gives it the slice's profile, and the
    # extender binds it to the slice's node with exactly the slice's instance.
    user = pinned_pod("claim-user", NS, node, {})
    user["metadata"]["annotations"] = {c.ANNOTATION_SLICE: "claim-7g"}
    create(cluster, user)
    placed = grant(wait_until(lambda: bound(cluster, "claim-user"), timeout=60, what="claim-user bound"))
    assert (placed.uuid, placed.mig_profile, placed.mig_start) == (gpu_uuid, "7g.40gb", start)

    # A second slice pinned to that very instance cannot take it while the first holds it.
    create(cluster, mig_slice("second", "7g.40gb", nodeName=node, gpuUUID=made["uuid"]))

    def told_no_instance() -> dict[str, Any] | None:
        s = gpuslice(cluster, "second")
        return s if slice_reason(s) == "NoMigInstance" else None

    second = wait_until(
        told_no_instance,
        timeout=30,
        what="second slice told NoMigInstance",
    )
    assert second["status"]["phase"] == "Pending" and "7g.40gb" in str(second["status"]["conditions"])

    # Deleting the pod and the first slice releases the instance: the second slice binds to it.
    cluster.kubectl("delete", "pod", "claim-user", "-n", NS)
    cluster.kubectl("delete", "gpuslice", "claim-7g", "-n", NS, "--wait=false")
    wait_until(lambda: not gpuslice(cluster, "claim-7g"), timeout=60, what="claim-7g released")
    rebound = wait_until(
        lambda: (s := gpuslice(cluster, "second")).get("status", {}).get("phase") == "Bound" and s,
        timeout=90,
        what="second slice Bound",
    )["status"]
    assert (rebound["gpuUUIDs"][0], rebound["migStart"], rebound["migInstanceUUID"]) == (
        gpu_uuid,
        start,
        made["uuid"],
    )
    cluster.kubectl("delete", "gpuslice", "second", "-n", NS)

    # A slice pinned to the node is planned on that node's GPUs (the holder's pod keeps the one
    # 1g.10gb busy, so a GPU of the node is re-laid out for it).
    create(cluster, mig_slice("pinned", "1g.10gb", nodeName=node))
    pinned = wait_until(
        lambda: (s := gpuslice(cluster, "pinned")).get("status", {}).get("phase") == "Bound" and s,
        timeout=90,
        what="pinned slice Bound",
    )["status"]
    assert (pinned["node"], pinned["migProfile"]) == (node, "1g.10gb"), pinned
    assert (pinned["gpuUUIDs"][0], pinned["migStart"]) != held_1g(cluster)
    cluster.kubectl("delete", "gpuslice", "pinned", "-n", NS)


def idle_instances(cluster: E2ECluster, node: str, profile: str) -> list[str]:
    """UUIDs of the node's reported `profile` instances no allocation names."""
    out = []
    for gpu in gpunode(cluster, node)["status"]["gpus"]:
        taken = {a.get("migInstance") for a in gpu.get("allocations") or ()}
        out += [
            i["uuid"]
            for i in gpu.get("migInstances") or ()
            if i["profile"] == profile and i["uuid"] not in taken
        ]
    return out


def test_a_pod_selecting_a_node_without_an_idle_instance_gets_that_node_re_laid_out(
    cluster: E2ECluster, stack: dict[str, Any]
) -> None:
    up: OperatorStack = stack["up"]
    first = stack["node"]
    # The first node gets an idle 7g.40gb: a pod takes one there (made for it unless one is idle
    # already) and goes.
    create(cluster, mig_pod("7g-first", first, "7g.40gb"))
    wait_until(lambda: bound(cluster, "7g-first"), timeout=90, what="7g-first bound")
    cluster.kubectl("delete", "pod", "7g-first", "-n", NS)
    idle = wait_until(
        lambda: idle_instances(cluster, first, "7g.40gb"),
        timeout=30,
        what="an idle 7g.40gb on the first node",
    )
    (second,) = up.add_nodes(
        "a100-40gb-mig", 1, "migl-second", labels={SUITE[0]: SUITE[1], LABEL_MIG_APPLY: "agent"}
    )
    wait_until(lambda: published_gpunode(cluster, second), timeout=60, what="the second node's GPUNode")
    assert not idle_instances(cluster, second, "7g.40gb")

    # A pod selecting the second node is not served by the first node's idle instance: the second
    # node is re-laid out for it, and it binds there.
    create(cluster, mig_pod("7g-second", second, "7g.40gb"))
    plan = wait_until(
        lambda: (p := mig_plan(cluster, second)).get("state") == "Applied" and p,
        timeout=60,
        what="the second node's migPlan Applied",
    )
    assert "create 7g.40gb@0" in plan["message"] and f"{NS}/7g-second" in plan["message"], plan
    placed = grant(wait_until(lambda: bound(cluster, "7g-second"), timeout=60, what="7g-second bound"))
    assert pod(cluster, "7g-second")["spec"]["nodeName"] == second and placed.mig_profile == "7g.40gb"
    assert placed.uuid in {g["uuid"] for g in gpunode(cluster, second)["status"]["gpus"]}
    assert set(idle) <= set(idle_instances(cluster, first, "7g.40gb")), "the first node's stays idle"
    cluster.kubectl("delete", "pod", "7g-second", "-n", NS)
    cluster.kubectl("label", "node", second, f"{LABEL_MIG_APPLY}=none", "--overwrite")


def held_1g(cluster: E2ECluster) -> tuple[str, int]:
    """The 1g.10gb instance the first test's pod holds: (GPU UUID, start slot)."""
    g = grant(pod(cluster, "wants-1g"))
    assert g.mig_start is not None
    return g.uuid, g.mig_start


def test_demand_no_gpu_can_serve_is_told_on_the_pod(cluster: E2ECluster, stack: dict[str, Any]) -> None:
    create(cluster, mig_pod("wants-h100", stack["node"], "7g.80gb"))
    event = wait_until(
        lambda: next(
            (e for e in events_of(cluster, NS, "wants-h100") if e["reason"] == "MIGDemandUnserved"), None
        ),
        timeout=30,
        what="MIGDemandUnserved Event",
    )
    assert event["type"] == "Warning" and "7g.80gb" in event["message"], event
    cluster.kubectl("delete", "pod", "wants-h100", "-n", NS, "--wait=false")


def test_mig_manager_applies_the_config_the_controller_writes(
    cluster: E2ECluster, stack: dict[str, Any]
) -> None:
    up: OperatorStack = stack["up"]
    # The agent's node takes no part: only the mig-manager node can serve the new demand.
    cluster.kubectl("label", "node", stack["node"], f"{LABEL_MIG_APPLY}=none", "--overwrite")
    (node,) = up.add_nodes("a100-40gb-mig", 1, "migl-mm", labels={LABEL_MIG_APPLY: "mig-manager"})
    # No agent serves this node: the test reports its GPUs as the agent would (the first node's
    # inventory under this node's UUIDs), and plays mig-manager below.
    status = copy.deepcopy(stack["first_status"])
    for gpu in status["gpus"]:
        gpu["uuid"] = c.simulated_gpu_uuid(node, gpu["index"])
        gpu["allocations"] = []
        for inst in gpu["migInstances"]:
            inst["uuid"] = simulated_mig_uuid(gpu["uuid"], inst["start"], inst["profile"])
    create(cluster, {"apiVersion": c.API_VERSION, "kind": "GPUNode", "metadata": {"name": node}, "spec": {}})
    patch_status(cluster, "gpunode", node, {"status": status})

    create(cluster, mig_pod("mm-4g", node, "4g.20gb"))
    plan = wait_until(
        lambda: (p := mig_plan(cluster, node)).get("state") == "Applying" and p,
        timeout=60,
        what="migPlan Applying",
    )
    assert plan["path"] == "mig-manager" and not plan["cordoned"], plan
    config = plan["migConfig"]
    labels = get_json(cluster, "node", node)["metadata"]["labels"]
    assert labels[MIG_MANAGER_CONFIG_LABEL] == config and labels[MIG_MANAGER_STATE_LABEL] == "pending"
    cm = get_json(cluster, "configmap", CONFIG_MAP, "-n", NS)
    entry = msgspec.yaml.decode(cm["data"]["config.yaml"])["mig-configs"][config]
    (index,) = [g["index"] for g in plan["gpus"]]
    layouts = {d: item["mig-devices"] for item in entry for d in item["devices"]}
    assert sorted(layouts) == list(range(8)), "every GPU of the node is in the config"
    assert "4g.20gb" in layouts[index]
    assert all(layouts[k] == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1} for k in layouts if k != index)

    # mig-manager applies the config: the GPU's new instances are reported, then the state label.
    catalog = catalog_for(status["gpus"][index]["model"])
    profiles = [catalog.profile(p) for p, n in sorted(layouts[index].items()) for _ in range(n)]
    layout = first_layout(catalog.empty_layout(), sorted(profiles, key=lambda p: -p.memory_slices))
    assert layout is not None
    gpu = status["gpus"][index]
    gpu["migInstances"] = [
        {
            "profile": i.profile.name,
            "uuid": simulated_mig_uuid(gpu["uuid"], i.start, i.profile.name),
            "start": i.start,
            "size": i.profile.memory_slices,
            "gpuInstanceId": k + 1,
            "computeInstanceId": 0,
            "memoryMiB": i.profile.memory_mib,
        }
        for k, i in enumerate(layout)
    ]
    patch_status(cluster, "gpunode", node, {"status": {"gpus": status["gpus"]}})
    capacity = {c.mig_resource_name(p): str(n) for p, n in {"4g.20gb": 1}.items()}
    patch_status(cluster, "node", node, {"status": {"capacity": capacity, "allocatable": capacity}})
    cluster.kubectl("label", "node", node, f"{MIG_MANAGER_STATE_LABEL}=success", "--overwrite")

    done = wait_until(
        lambda: (p := mig_plan(cluster, node)).get("state") != "Applying" and p,
        timeout=30,
        what="migPlan settled",
    )
    assert done["state"] == "Applied" and f"mig-manager applied {config}" in done["message"], done
    placed = grant(wait_until(lambda: bound(cluster, "mm-4g"), timeout=60, what="mm-4g bound"))
    assert (placed.uuid, placed.mig_profile) == (gpu["uuid"], "4g.20gb")


def patch_status(cluster: E2ECluster, kind: str, name: str, patch: dict[str, Any]) -> None:
    cluster.kubectl("patch", kind, name, "--subresource=status", "--type=merge", "-p", json.dumps(patch))
