"""Data locality on the local control plane: the operator reads a pool's vector stores (a Service,
a StatefulSet) and the pods of its anti-affinity label sets through the API, writes their nodes on
the pods it creates, and the extender places the pods beside the store / away from the avoided
pods (docs/locality.md); when the store moves, running pods stay and new pods follow it.

Every node is a kwok node of one equal profile, so that without the hints nothing tells them
apart and the extender takes the first in name order: the store and the avoided pods are put on
other nodes than that. The store's and the avoided pods are plain CPU pods pinned by ``nodeName``
(kwok runs them); the pools' pods are placed by kube-scheduler and the extender.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from operator_stack import operator_stack

from neuronetes import contracts as c
from neuronetes.devcluster.localstack import LocalStack
from neuronetes.locality import (
    ANNOTATION_AVOID_NODES,
    ANNOTATION_DATA_LOCALITY_WEIGHT,
    ANNOTATION_DATA_NODES,
    ANNOTATION_DATA_ZONES,
)
from neuronetes.profiles import KWOK_TAINT
from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.pods import LABEL_POOL

pytestmark = pytest.mark.e2e

NS = "locality-e2e"
GROUP_LABEL = "neuronetes.test/locality-e2e"  # each test's pools select their own group of nodes
STORE_NODES = "store"
AVOID_NODES = "avoid"
nodes_of: dict[str, list[str]] = {}


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    work = Path(tmp_path_factory.mktemp("locality"))
    settings = {**dev_operator_settings(), "resyncSeconds": 5}
    with operator_stack(cluster, work, NS, settings=settings, replicas=1) as up:
        for group in (STORE_NODES, AVOID_NODES):
            # One zone: the zone term would otherwise also favour the store's zone peers.
            nodes_of[group] = up.add_nodes(
                "t4x4-pcie", 3, f"loc-{group}", zones=["zone-a"], labels={GROUP_LABEL: group}
            )
        up.local.start()
        try:
            yield up.local
        finally:
            nodes_of.clear()


def pinned_pod_spec(node: str) -> dict[str, Any]:
    """A CPU pod's spec on `node` (kwok runs it; it asks for nothing the pools' pods need)."""
    return {
        "nodeName": node,
        "tolerations": [dict(KWOK_TAINT, operator="Equal")],
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
    }


def apply(cluster: E2ECluster, *objects: dict[str, Any]) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(listed))


def apply_pool(
    cluster: E2ECluster, name: str, group: str, replicas: int, locality: dict[str, Any], gpus: int = 1
) -> None:
    pool = {
        "apiVersion": c.API_VERSION,
        "kind": "AgentPool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "minReplicas": 1,
            "gpuRequirements": {"count": gpus},
            "scheduling": {"dataLocality": locality},
            "template": {
                "spec": {
                    "nodeSelector": {GROUP_LABEL: group},
                    "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
                }
            },
        },
    }
    apply(cluster, pool)


def running(cluster: E2ECluster, selector: str, count: int) -> list[dict[str, Any]] | None:
    """The pods `selector` matches once `count` of them run on a node, else None."""
    items = get_json(cluster, "pods", "-n", NS, "-l", selector)["items"]
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    ok = len(live) == count and all(
        p["spec"].get("nodeName") and p["status"].get("phase") == "Running" for p in live
    )
    return live if ok else None


def wait_running(cluster: E2ECluster, selector: str, count: int) -> list[dict[str, Any]]:
    return wait_until(lambda: running(cluster, selector, count), timeout=60, what=f"{count} pods {selector}")


def test_a_pool_with_vector_store_affinity_lands_beside_its_store(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    store_node = nodes_of[STORE_NODES][-1]  # not the first: the one taken without hints
    labels = {"app": "vectors"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "vectors"},
        "spec": {"selector": labels, "ports": [{"port": 6333}]},
    }
    store: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "vectors"},
        "spec": {
            "serviceName": "vectors",
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pinned_pod_spec(store_node)},
        },
    }
    apply(cluster, service, store)
    wait_running(cluster, "app=vectors", 1)

    # Through the Service, and through the StatefulSet: the same pods, the same node; the two pools
    # fill its 4 GPUs.
    apply_pool(cluster, "near", STORE_NODES, 2, {"vectorStoreAffinity": ["service/vectors"]})
    apply_pool(cluster, "near-set", STORE_NODES, 1, {"vectorStoreAffinity": ["statefulset/vectors"]}, gpus=2)
    near = wait_running(cluster, f"{LABEL_POOL}=near", 2)
    near_set = wait_running(cluster, f"{LABEL_POOL}=near-set", 1)
    for pod in near + near_set:
        assert pod["spec"]["nodeName"] == store_node, f"{pod['metadata']['name']} not beside the store"
        notes = pod["metadata"]["annotations"]
        assert notes[ANNOTATION_DATA_NODES] == store_node, notes
        assert notes[ANNOTATION_DATA_ZONES] == "zone-a" and notes[ANNOTATION_DATA_LOCALITY_WEIGHT] == "medium"
        assert ANNOTATION_AVOID_NODES not in notes

    # The store moves: the running pods stay where they are; a pod created now follows the store
    # (to the middle node: the two with free GPUs are equal, the first taken without hints).
    moved_to = nodes_of[STORE_NODES][1]
    store["spec"]["template"]["spec"] = pinned_pod_spec(moved_to)
    apply(cluster, store)
    wait_until(
        lambda: [p for p in running(cluster, "app=vectors", 1) or [] if p["spec"]["nodeName"] == moved_to],
        timeout=60,
        what="the store's pod on its new node",
    )
    cluster.kubectl("patch", "agentpool", "near", "-n", NS, "--type=merge", "-p", '{"spec":{"replicas":3}}')
    after = {p["metadata"]["name"]: p for p in wait_running(cluster, f"{LABEL_POOL}=near", 3)}
    for pod in near:
        kept = after[pod["metadata"]["name"]]
        assert (kept["metadata"]["uid"], kept["spec"]["nodeName"]) == (pod["metadata"]["uid"], store_node)
    (new,) = [p for name, p in after.items() if name not in {q["metadata"]["name"] for q in near}]
    assert new["spec"]["nodeName"] == moved_to
    assert new["metadata"]["annotations"][ANNOTATION_DATA_NODES] == moved_to


def test_a_pool_with_anti_affinity_avoids_the_nodes_of_matching_pods(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    first, second, free = nodes_of[AVOID_NODES]
    cache = {"app": "redis", "tier": "cache"}
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"redis-{i}", "labels": cache},
            "spec": pinned_pod_spec(node),
        }
        for i, node in enumerate((first, second))
    ]
    # Labelled app=redis only: not of the set (every pair must match), its node stays free.
    partial = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "redis-other", "labels": {"app": "redis"}},
        "spec": pinned_pod_spec(free),
    }
    apply(cluster, *pods, partial)
    wait_running(cluster, "app=redis", 3)

    apply_pool(cluster, "away", AVOID_NODES, 1, {"antiAffinity": ["app=redis,tier=cache"]})
    (pod,) = wait_running(cluster, f"{LABEL_POOL}=away", 1)
    assert pod["spec"]["nodeName"] == free
    notes = pod["metadata"]["annotations"]
    assert sorted(notes[ANNOTATION_AVOID_NODES].split(",")) == sorted([first, second]), notes
