"""What one tenant cannot take from the others, against the real API server: priority and GPU quota.

The operator and two webhook replicas run as processes (`neuronetes.devcluster.localstack.LocalStack`)
with priority tiers of their own: ``high`` granted to namespaces labelled ``tenancy-e2e/tier=gold``
(read from the Namespace by the webhook), ``critical`` to none, ``default`` to all.

- Priorities (docs/agentpool.md "Priority tiers"): a pool asking for more than its namespace's
  tiers is refused naming the field, a pod naming a tier's PriorityClass likewise, and the operator
  creates no PriorityClass: pods get the tiers' classes, which the cluster admin's chart creates.
- Quota (docs/gpuslice.md "Quota"): GPUSlices, Pending or Bound, count against the namespace's
  ``requests.neuronetes.io/gpu-memory`` with the pods outside them, each share once; a slice past
  it is refused naming the quota and its used/hard figures, and slices admitted at the same
  instant never bind past it (the slice controller checks again and leaves one Pending, saying why).
  A MIG slice counts one instance of its profile against ``requests.neuronetes.io/mig-<profile>``
  the same way, with the MIG pods outside a slice.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from e2e_cluster import E2ECluster, wait_until
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes.devcluster.localstack import LocalStack
from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.tiers import DEFAULT_TIERS, NamespaceSelector, priority_classes

pytestmark = pytest.mark.e2e

TIN, GOLD, QUOTA, RACE, MIGQ = "tiers-tin", "tiers-gold", "quota-e2e", "quota-race", "quota-mig"
GOLD_LABEL = {"tenancy-e2e/tier": "gold"}
TIERS = tuple(
    msgspec.structs.replace(t, namespace_selector=NamespaceSelector(match_labels=GOLD_LABEL))
    if t.name == "high"
    else t
    for t in DEFAULT_TIERS
)
MEM = c.RESOURCE_GPU_MEMORY
MIG3 = c.mig_resource_name("3g.20gb")


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    settings = {**dev_operator_settings(), "resyncSeconds": 2}  # a Pending slice is looked at again soon
    local = LocalStack(
        cluster.kubeconfig,
        Path(tmp_path_factory.mktemp("tenancy")),
        cluster.kubectl,
        settings=settings,
        tiers=TIERS,
    )
    try:
        local.start()
        for ns in (TIN, GOLD, QUOTA, RACE, MIGQ):
            cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", GOLD, *(f"{k}={v}" for k, v in GOLD_LABEL.items()))
        yield local
    finally:
        for ns in (TIN, GOLD, QUOTA, RACE, MIGQ):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        local.stop()
        for proc in (local.operator, *local.webhooks):
            print(f"--- {proc.name} log ---\n{proc.tail(15)}")


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


def create(cluster: E2ECluster, obj: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", "-f", "-", *extra, input=json.dumps(obj), check=False)


# ---- priorities ---------------------------------------------------------------------------------


def pool(name: str, ns: str, scheduling: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 1, "minReplicas": 1, "scheduling": scheduling},
    }


def plain_pod(name: str, ns: str, priority_class: str) -> dict[str, Any]:
    """A pod asking for no GPU, naming `priority_class`."""
    pod = manifest(name, namespace=ns, scheduler="default-scheduler")
    pod["spec"]["priorityClassName"] = priority_class
    return pod


def pool_pod(cluster: E2ECluster, ns: str, name: str) -> dict[str, Any]:
    def made() -> dict[str, Any] | None:
        items = get_json(cluster, "pods", "-n", ns, "-l", f"neuronetes.io/pool={name}")["items"]
        return items[0] if items else None

    return wait_until(made, timeout=60, what=f"the operator's pod of pool {name}")


def test_a_pool_above_its_namespaces_tiers_is_refused_naming_the_field_and_no_priority_class_is_minted(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    refused = create(cluster, pool("greedy", TIN, {"priority": 5000, "preemption": {"enabled": True}}))
    assert refused.returncode != 0 and "denied the request" in refused.stderr, refused.stderr
    assert (
        "spec.scheduling.priority: 5000 maps to priority tier high (value 1000), which namespace tiers-tin "
        "may not use; it may use default (0)"
    ) in refused.stderr
    refused = create(cluster, pool("named", TIN, {"priorityTier": "critical"}))
    assert "spec.scheduling.priorityTier: the pool asks for priority tier critical" in refused.stderr
    # The same tier where the namespace's label grants it, and a modest priority anywhere.
    assert (
        create(cluster, pool("granted", GOLD, {"priority": 1000, "preemption": {"enabled": True}})).returncode
        == 0
    )
    assert create(cluster, pool("modest", TIN, {"priority": 500})).returncode == 0
    granted, modest = pool_pod(cluster, GOLD, "granted"), pool_pod(cluster, TIN, "modest")
    assert (granted["spec"]["priorityClassName"], granted["spec"]["priority"]) == ("neuronetes-high", 1000)
    assert (modest["spec"]["priorityClassName"], modest["spec"]["priority"]) == ("neuronetes-default", 0)
    # A pod cannot take a tier directly either, nor a class an operator before tiers created (as
    # one left behind by an upgrade).
    legacy = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "neuronetes-p1000"},
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps({**legacy, "value": 1000}))
    try:
        for klass in ("neuronetes-high", "neuronetes-p1000"):
            refused = create(cluster, plain_pod("direct", TIN, klass), "--dry-run=server")
            assert f"spec.priorityClassName: {klass}" in refused.stderr, refused.stderr
    finally:
        cluster.kubectl("delete", "priorityclass", "neuronetes-p1000")
    assert create(cluster, plain_pod("direct", GOLD, "neuronetes-high"), "--dry-run=server").returncode == 0
    # Every neuronetes-* PriorityClass is a tier's (the chart's; here LocalStack's): none minted.
    theirs = {
        o["metadata"]["name"]: (o["value"], o.get("preemptionPolicy"))
        for o in get_json(cluster, "priorityclasses")["items"]
        if o["metadata"]["name"].startswith("neuronetes-")
    }
    assert theirs == {
        o["metadata"]["name"]: (o["value"], o["preemptionPolicy"]) for o in priority_classes(TIERS)
    }
    minted = get_json(cluster, "priorityclasses", "-l", "app.kubernetes.io/managed-by=neuronetes-operator")
    assert minted["items"] == []


# ---- quota --------------------------------------------------------------------------------------


def quota(cluster: E2ECluster, ns: str, memory: int) -> None:
    apply_quota(cluster, ns, {f"requests.{MEM}": str(memory), f"requests.{c.RESOURCE_GPU_COMPUTE}": "400"})


def apply_quota(cluster: E2ECluster, ns: str, hard: dict[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": ns}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({**body, "spec": {"hard": hard}}))
    wait_until(  # the API server's own pod check needs the quota controller's status first
        lambda: get_json(cluster, "resourcequota", "gpu", "-n", ns).get("status", {}).get("hard") == hard,
        timeout=30,
        what=f"ResourceQuota {ns}/gpu computed",
    )


def gpu_slice(name: str, ns: str, node: str, memory: str = "10Gi") -> dict[str, Any]:
    return {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "GPUSlice",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"memory": memory, "computePercent": 30, "nodeName": node},
    }


def shared_pod(name: str, ns: str, memory: int = 0, slice_name: str = "") -> dict[str, Any]:
    """A pod asking for `memory` MiB and 10 % of a shared GPU, or naming `slice_name` (and nothing)."""
    limits = {MEM: memory, c.RESOURCE_GPU_COMPUTE: 10} if memory else None
    return manifest(
        name, limits, namespace=ns, annotations={c.ANNOTATION_SLICE: slice_name} if slice_name else None
    )


def phase_of(cluster: E2ECluster, ns: str, name: str) -> tuple[str, dict[str, Any]]:
    s = get_json(cluster, "gpuslice", name, "-n", ns)
    st = s.get("status") or {}
    return st.get("phase", ""), {cd["type"]: cd for cd in st.get("conditions") or []}.get("Bound", {})


def wait_phase(cluster: E2ECluster, ns: str, name: str, phase: str, reason: str = "") -> dict[str, Any]:
    def there() -> dict[str, Any] | None:
        got, cond = phase_of(cluster, ns, name)
        return cond if got == phase and (not reason or cond.get("reason") == reason) else None

    return wait_until(there, timeout=60, what=f"GPUSlice {ns}/{name} {phase} {reason}")


def held(cluster: E2ECluster, ns: str) -> int:
    """MiB the namespace holds, from the API: Bound slices' reservations and pods outside a slice."""
    slices = get_json(cluster, "gpuslices", "-n", ns)["items"]
    bound = [s for s in slices if (s.get("status") or {}).get("phase") == "Bound"]
    names = {s["metadata"]["name"] for s in slices}
    total = sum(s["status"]["memoryMiB"] for s in bound)
    for pod in get_json(cluster, "pods", "-n", ns)["items"]:
        if (pod["metadata"].get("annotations") or {}).get(c.ANNOTATION_SLICE) in names:
            continue
        if pod["status"].get("phase") not in ("Succeeded", "Failed"):
            total += sum(
                int((ct.get("resources") or {}).get("limits", {}).get(MEM, 0))
                for ct in pod["spec"]["containers"]
            )
    return int(total)


def test_slices_and_pods_share_the_gpu_quota_and_a_slice_past_it_is_refused_naming_it(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    (node,) = cluster.add_nodes("t4x4-pcie", 1, "tenancy-quota")
    quota(cluster, QUOTA, 20480)  # 20 GiB: the resource counts MiB
    for name in ("a", "b"):
        assert create(cluster, gpu_slice(name, QUOTA, node)).returncode == 0
    refused = create(cluster, gpu_slice("c", QUOTA, node))
    assert refused.returncode != 0 and "denied the request" in refused.stderr
    expect = f"spec.memory: 10240 MiB of {MEM} would exceed ResourceQuota gpu (requests.{MEM}: used 20480"
    assert f"{expect}, hard 20480" in refused.stderr, refused.stderr
    for name in ("a", "b"):
        wait_phase(cluster, QUOTA, name, "Bound")
    # A pod inside slice a is counted once (the slice's share), a pod outside it is refused.
    assert create(cluster, shared_pod("inside", QUOTA, slice_name="a")).returncode == 0
    refused = create(cluster, shared_pod("outside", QUOTA, 1024))
    assert f"1024 MiB of {MEM} would exceed ResourceQuota gpu" in refused.stderr, refused.stderr
    assert held(cluster, QUOTA) == 20480
    # Deleting slice b frees its share for the pod.
    cluster.kubectl("delete", "gpuslice", "b", "-n", QUOTA)
    assert create(cluster, shared_pod("outside", QUOTA, 1024)).returncode == 0
    assert held(cluster, QUOTA) == 10240 + 1024 <= 20480
    refused = create(cluster, gpu_slice("d", QUOTA, node))
    assert f"used {10240 + 1024}, hard 20480" in refused.stderr, refused.stderr


def test_slices_admitted_past_the_quota_stay_pending_saying_why_and_bind_when_it_has_room(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    (node,) = cluster.add_nodes("t4x4-pcie", 1, "tenancy-race")
    quota(cluster, RACE, 20480)
    assert create(cluster, gpu_slice("r0", RACE, node)).returncode == 0
    wait_phase(cluster, RACE, "r0", "Bound")
    # Admitted while there was room, not bound yet (its node does not exist): then the quota shrinks.
    assert create(cluster, gpu_slice("late", RACE, "tenancy-late-0")).returncode == 0
    wait_phase(cluster, RACE, "late", "Pending", "NoCapacity")
    quota(cluster, RACE, 10240)
    cond = wait_phase(cluster, RACE, "late", "Pending", "QuotaExceeded")
    assert "used 10240, hard 10240" in cond["message"] and cond["status"] == "False", cond
    events = get_json(cluster, "events", "-n", RACE, "--field-selector", "involvedObject.name=late")["items"]
    assert any(e["reason"] == "QuotaExceeded" and e["type"] == "Warning" for e in events)
    quota(cluster, RACE, 20480)
    cluster.add_nodes("t4x4-pcie", 1, "tenancy-late")
    wait_phase(cluster, RACE, "late", "Bound")
    assert held(cluster, RACE) == 20480
    cluster.kubectl("delete", "gpuslice", "late", "-n", RACE)
    # Two slices at the same instant with room for one: whatever the webhook replicas admitted,
    # one binds and an admitted other stays Pending (QuotaExceeded); the namespace stays within.
    results: dict[str, subprocess.CompletedProcess[str]] = {}
    threads = [
        threading.Thread(target=lambda n=n: results.__setitem__(n, create(cluster, gpu_slice(n, RACE, node))))
        for n in ("r1", "r2")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admitted = [n for n, r in results.items() if r.returncode == 0]
    assert admitted, {n: r.stderr for n, r in results.items()}

    def settled() -> dict[str, tuple[str, str]] | None:
        got = {n: phase_of(cluster, RACE, n) for n in admitted}
        out = {n: (p, cond.get("reason", "")) for n, (p, cond) in got.items()}
        return (
            out
            if sorted(out.values())
            in ([("Bound", "Reserved")], [("Bound", "Reserved"), ("Pending", "QuotaExceeded")])
            else None
        )

    wait_until(settled, timeout=60, what=f"one of {admitted} Bound, any other Pending for the quota")
    assert held(cluster, RACE) == 20480


def test_mig_slices_count_one_instance_of_their_profile_and_one_past_the_quota_is_refused_or_held_back(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    apply_quota(cluster, MIGQ, {f"requests.{MIG3}": "1"})
    mig_slice = {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "GPUSlice",
        "spec": {"memory": "20Gi", "migProfile": "3g.20gb"},
    }
    assert create(cluster, {**mig_slice, "metadata": {"name": "m1", "namespace": MIGQ}}).returncode == 0
    wait_phase(cluster, MIGQ, "m1", "Pending", "NoMigInstance")  # within the quota, no instance yet
    refused = create(cluster, {**mig_slice, "metadata": {"name": "m2", "namespace": MIGQ}})
    expect = f"spec.migProfile: 1 instance of {MIG3} would exceed ResourceQuota gpu (requests.{MIG3}: used 1"
    assert f"{expect}, hard 1" in refused.stderr, refused.stderr
    # A MIG pod outside a slice shares the quota with the slice; one inside it is not counted again.
    refused = create(cluster, manifest("outside", {MIG3: 1}, namespace=MIGQ))
    assert f"1 instance of {MIG3} would exceed ResourceQuota gpu" in refused.stderr, refused.stderr
    assert create(cluster, shared_pod("inside", MIGQ, slice_name="m1")).returncode == 0
    # The quota shrinks before an instance appears: the slice controller holds the slice back.
    apply_quota(cluster, MIGQ, {f"requests.{MIG3}": "0"})
    cond = wait_phase(cluster, MIGQ, "m1", "Pending", "QuotaExceeded")
    assert f"1 instance of {MIG3}" in cond["message"] and "used 0, hard 0" in cond["message"], cond
    events = get_json(cluster, "events", "-n", MIGQ, "--field-selector", "involvedObject.name=m1")["items"]
    assert any(e["reason"] == "QuotaExceeded" and e["type"] == "Warning" for e in events)
