"""GPU-aware preemption end to end: the extender's preemption controller evicts the victims it
chose per GPU, holds the node, and the real kube-scheduler binds the preemptor there.

One T4 node (4 GPUs of 15,360 MiB) holds four low-priority pods of 8,000 MiB and 40 % compute,
one per GPU. A high-priority pod asks for 12,000 MiB: the node has 29,440 MiB free in total but no
GPU with 12,000, so only the extender can tell it does not fit, and only a per-GPU choice frees
room with one victim. kube-scheduler's own preemption, which sees node totals, finds that no
victim is needed and evicts nobody (its FailedScheduling Event says so); after
``preemption.minPendingSeconds`` (10 s) the extender evicts the one pod whose GPU then has room,
and the preemptor binds on that GPU. Three of the four pods run under a PodDisruptionBudget that
allows no disruption: the extender, which watches PDBs, evicts the fourth, and no eviction is
refused on the way. The extender runs as its own process (`ExtenderProcess`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from extender_harness import ExtenderProcess
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes.devcluster import ExtenderConfig

pytestmark = pytest.mark.e2e

NS = "preemption-e2e"
SUITE = ("neuronetes.io/e2e-suite", "preemption")
LOW, HIGH = "nn-e2e-preemption-low", "nn-e2e-preemption-high"
VICTIM_MIB, PREEMPTOR_MIB = 8_000, 12_000


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": "PreemptLowerPriority",
    }


GUARD = ("preemption-e2e/guarded", "yes")


def pod(name: str, mib: int, priority_class_name: str, *, guarded: bool = False) -> str:
    """A shared-GPU pod of `mib` MiB and 40 % of a GPU's compute (two fit a GPU's compute)."""
    limits = {c.RESOURCE_GPU_MEMORY: mib, c.RESOURCE_GPU_COMPUTE: 40}
    body = manifest(name, limits, namespace=NS, node_selector=dict([SUITE]))
    body["spec"]["priorityClassName"] = priority_class_name
    if guarded:
        body["metadata"].setdefault("labels", {}).update(dict([GUARD]))
    return json.dumps(body)


def no_disruption_budget() -> str:
    """A PDB over the guarded pods that allows none of them to go."""
    return json.dumps(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded", "namespace": NS},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": dict([GUARD])}},
        }
    )


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


@pytest.fixture(scope="module")
def node(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = Path(tmp_path_factory.mktemp("preemption"))
    ext = ExtenderProcess(cluster.extender_kubeconfig, work)
    ext.start()
    cluster.set_extender(ExtenderConfig(url=ext.url, weight=20))
    cluster.kubectl("create", "namespace", NS)
    for name, value in ((LOW, 100), (HIGH, 1000)):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(priority_class(name, value)))
    (name,) = cluster.add_nodes("t4x4-pcie", 1, "preempt-t4", labels=dict([SUITE]))
    # An empty node the pods' selector excludes: room the preemptor may not take (the controller
    # must free a node kube-scheduler offers, not find "room" here).
    decoy = cluster.add_nodes("t4x4-pcie", 1, "preempt-decoy")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        cluster.kubectl("delete", "node", name, *decoy, "--wait=false", check=False)
        cluster.kubectl("delete", "gpunode", name, *decoy, "--wait=false", check=False)
        cluster.kubectl("delete", "priorityclass", LOW, HIGH, "--wait=false", check=False)
        cluster.set_extender(ExtenderConfig.from_env())
        ext.stop()
        print(f"--- extender log ---\n{ext.tail(40)}")


def assigned_gpus(p: dict[str, Any]) -> set[int]:
    raw = (p["metadata"].get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
    if not raw:
        return set()
    doc = c.decode_assignment(raw)
    return {g.index for ctr in doc.containers.values() for g in ctr.gpus}


def test_the_scheduler_preempts_one_pod_on_one_gpu_not_by_node_totals(cluster: E2ECluster, node: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=no_disruption_budget())
    for i in range(4):
        cluster.kubectl("apply", "-f", "-", input=pod(f"low-{i}", VICTIM_MIB, LOW, guarded=i < 3))

    def low_bound() -> dict[str, set[int]] | None:
        pods = get_json(cluster, "pods", "-n", NS)["items"]
        gpus = {p["metadata"]["name"]: assigned_gpus(p) for p in pods if p["spec"].get("nodeName") == node}
        return gpus if len(gpus) == 4 and all(gpus.values()) else None

    placed = wait_until(low_bound, timeout=60, what="four low-priority pods bound")
    assert sorted(g for gpus in placed.values() for g in gpus) == [0, 1, 2, 3]  # one per GPU

    cluster.kubectl("apply", "-f", "-", input=pod("high", PREEMPTOR_MIB, HIGH))

    def preemptor_bound() -> dict[str, Any] | None:
        high = get_json(cluster, "pod", "high", "-n", NS)
        return high if high["spec"].get("nodeName") == node and assigned_gpus(high) else None

    high = wait_until(preemptor_bound, timeout=120, what="the preemptor bound")
    left = {
        p["metadata"]["name"]: assigned_gpus(p)
        for p in get_json(cluster, "pods", "-n", NS)["items"]
        if p["metadata"]["name"].startswith("low-") and not p["metadata"].get("deletionTimestamp")
    }
    gone = sorted(set(placed) - set(left))
    assert gone == ["low-3"], f"victims: {gone}"  # one pod, on one GPU, the one no PDB guards
    assert assigned_gpus(high) == placed[gone[0]]  # the preemptor runs where its victim ran
    events = get_json(cluster, "events", "-n", NS)["items"]
    said = {(e["reason"], e["involvedObject"]["name"]) for e in events}
    assert ("Preempted", gone[0]) in said and ("Preempting", "high") in said
    assert not any(reason == "PreemptionBlocked" for reason, _ in said)  # no eviction refused
    # kube-scheduler's own preemption judged by node totals: no victim needed (so it evicted none).
    assert any(
        e["reason"] == "FailedScheduling" and "expected at least one victim" in e.get("message", "")
        for e in events
        if e["involvedObject"]["name"] == "high"
    )
