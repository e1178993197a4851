"""Kubernetes' own gang scheduling (1.36, alpha) and ours: a pod in a native gang gets no barrier of ours.

In the pinned API server (1.36) a pod joins a native gang through ``spec.schedulingGroup.podGroupName``
(a ``PodGroup`` of ``scheduling.k8s.io/v1alpha2`` whose ``spec.schedulingPolicy.gang.minCount``
kube-scheduler's GangScheduling plugin waits for). The field is kept only with the
``GenericWorkload`` feature gate on; the PodGroup API needs ``--runtime-config`` for
``scheduling.k8s.io/v1alpha2``; kube-scheduler's gang plugin needs ``GangScheduling``. 1.36 has no
``spec.workloadRef`` (1.35's field). See docs/architecture.md ("Native gangs").

Two pods carry our gang labels for a gang of FOUR, but belong to a native PodGroup of two: they
bind (kube-scheduler's Permit is their barrier, the extender adds none and writes no
GangReservation). Two pods with the same labels and no native group wait at our barrier.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_cluster import own_cluster, wait_until
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes.devcluster import POLICIES_DIR, DevCluster

pytestmark = pytest.mark.e2e

NAMESPACE = "native-gang"
GATES = {"GenericWorkload": True, "GangScheduling": True}
RUNTIME_CONFIG = "--runtime-config=scheduling.k8s.io/v1alpha2=true"


@pytest.fixture(scope="module")
def native(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    with own_cluster(
        request,
        f"native-gang-e2e-{os.getpid()}",
        run_extender=True,
        feature_gates=GATES,
        apiserver_args=[RUNTIME_CONFIG],
        policies_dir=POLICIES_DIR,
        nodes=[("dgx-a100-80gb", 2)],
    ) as dev:
        yield dev


def member(name: str, group: str, native_group: str | None) -> dict[str, Any]:
    labels = {c.LABEL_GANG: group, c.LABEL_GANG_SIZE: "4"}
    pod = manifest(name, {c.RESOURCE_GPU: 2}, namespace=NAMESPACE, labels=labels)
    if native_group:
        pod["spec"]["schedulingGroup"] = {"podGroupName": native_group}
    return pod


def test_the_1_36_pod_field_is_scheduling_group(native: DevCluster) -> None:
    schema = native.api().request("GET", "/openapi/v3/api/v1")["components"]["schemas"]
    fields = schema["io.k8s.api.core.v1.PodSpec"]["properties"]
    assert "schedulingGroup" in fields and "workloadRef" not in fields
    group = schema["io.k8s.api.core.v1.PodSchedulingGroup"]["properties"]
    assert set(group) == {"podGroupName"}


def test_pods_of_a_native_gang_get_no_barrier_of_ours(native: DevCluster) -> None:
    api = native.api()
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    api.request(
        "POST",
        f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{NAMESPACE}/podgroups",
        {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "metadata": {"name": "pair"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
        },
    )
    pods = [member(f"native-{k}", "mixed", "pair") for k in range(2)]
    pods += [member(f"ours-{k}", "ours", None) for k in range(2)]
    for pod in pods:
        api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    def listing() -> dict[str, dict[str, Any]]:
        items = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        return {p["metadata"]["name"]: p for p in items}

    def natives_running() -> bool:
        got = listing()
        return all(got[f"native-{k}"]["status"].get("phase") == "Running" for k in range(2))

    wait_until(natives_running, timeout=60, what="the native gang's pods Running")
    got = listing()
    for k in range(2):
        pod = got[f"native-{k}"]
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "pair"}  # the gate kept the field
        doc = c.decode_assignment(pod["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS])
        assert doc.gang is None and len(doc.containers["main"].gpus) == 2
    time.sleep(2)  # our own gang of the same shape is still held at the barrier meanwhile
    got = listing()
    assert all(not got[f"ours-{k}"]["spec"].get("nodeName") for k in range(2))
    reservations = api.request("GET", f"/apis/{c.API_VERSION}/namespaces/{NAMESPACE}/gangreservations")
    groups = {r["spec"]["groupName"] for r in reservations["items"]}
    assert groups == {"ours"}, json.dumps(groups)
