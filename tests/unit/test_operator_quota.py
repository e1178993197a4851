"""GPUSlices count against the namespace's ResourceQuota, with pods, each share once.

A slice Pending or Bound holds (or waits for) its share; a pod naming a slice runs inside it and is
not counted again (docs/gpuslice.md "Quota"). The webhook refuses a slice or a pod past a quota,
naming the quota and its used/hard figures; the slice controller checks again before binding.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import pytest
from kubernetes import client
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes_operator.quota import excesses, pod_demand, usage
from neuronetes_operator.quota_admission import QuotaReadError, review_pod_quota, review_slice_quota
from neuronetes_operator.slice_controller import SliceController
from neuronetes_operator.webhook import ClusterReads, admission_response

pytestmark = pytest.mark.unit

MEM, CPT = c.RESOURCE_GPU_MEMORY, c.RESOURCE_GPU_COMPUTE
NS = "team-a"


def gpu_slice(
    name: str, memory: str = "10Gi", percent: int = 30, phase: str | None = None, **extra: Any
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "GPUSlice",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"memory": memory, "computePercent": percent, **extra},
    }
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def pod(
    name: str, memory: int = 0, percent: int = 0, slice_name: str = "", phase: str = "Running"
) -> dict[str, Any]:
    """A pod asking for (memory MiB, percent %) of a shared GPU, or naming `slice_name`, in `phase`."""
    limits = {MEM: memory, CPT: percent} if memory else None
    annotations = {c.ANNOTATION_SLICE: slice_name} if slice_name else None
    return {**manifest(name, limits, namespace=NS, annotations=annotations), "status": {"phase": phase}}


def quota(name: str = "gpu", scoped: bool = False, **hard: str) -> dict[str, Any]:
    keys = {"memory": f"requests.{MEM}", "compute": f"requests.{CPT}", "cpu": "requests.cpu"}
    spec: dict[str, Any] = {"hard": {keys[k]: v for k, v in hard.items()}}
    if scoped:
        spec["scopes"] = ["BestEffort"]
    return {"metadata": {"name": name, "namespace": NS}, "spec": spec}


class Namespace:
    """A fake namespace for the webhook's lister: its quotas, slices and pods."""

    def __init__(
        self, quotas: list[dict[str, Any]], slices: list[dict[str, Any]], pods: list[dict[str, Any]]
    ):
        self.objects = {"resourcequotas": quotas, "gpuslices": slices, "pods": pods}

    def __call__(self, plural: str, namespace: str) -> list[Mapping[str, Any]]:
        assert namespace == NS
        return list(self.objects[plural])


def slice_review(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {"request": {"uid": "u", "operation": operation, "namespace": NS, "object": obj}}


# ---- what counts --------------------------------------------------------------------------------


def test_pending_and_bound_slices_count_and_pods_inside_them_do_not() -> None:
    slices = [
        gpu_slice("bound", phase="Bound"),
        gpu_slice("pending"),  # no status yet: Pending
        gpu_slice("released", phase="Released"),
        gpu_slice("failed", phase="Failed"),
        gpu_slice("mig", migProfile="1g.10gb"),
        {
            **gpu_slice("going"),
            "metadata": {**gpu_slice("going")["metadata"], "deletionTimestamp": "2030-01-01T00:00:00Z"},
        },
    ]
    slices[0]["status"].update(memoryMiB=8192, computePercent=20)  # the recorded reservation wins
    pods = [
        pod("inside", 8192, 20, slice_name="bound"),
        pod("waiting-inside", 10240, 30, slice_name="pending"),
        pod("outside", 1024, 10),
        pod("done", 4096, 40, phase="Succeeded"),
        pod("named-gone", 2048, 5, slice_name="released"),
    ]
    assert usage(slices, pods) == {MEM: Fraction(8192 + 10240 + 1024 + 2048), CPT: Fraction(20 + 30 + 10 + 5)}
    assert usage(slices, pods, bound_only=True) == {
        MEM: Fraction(8192 + 1024 + 2048),
        CPT: Fraction(20 + 10 + 5),
    }


def test_a_pods_request_is_the_one_the_quota_counts() -> None:
    p = pod("p", 1000, 10)
    p["spec"]["containers"].append(
        {"name": "b", "resources": {"requests": {MEM: "500"}, "limits": {MEM: "500"}}}
    )
    p["spec"]["initContainers"] = [
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"limits": {MEM: "100"}}},
        {"name": "setup", "resources": {"limits": {MEM: "4000", CPT: "5"}}},
    ]
    assert pod_demand(p) == {MEM: Fraction(4100), CPT: Fraction(10)}  # init 4000 + the sidecar before it
    assert pod_demand(pod("whole")) == {}


def test_only_unscoped_quotas_of_these_resources_limit_and_only_what_is_asked() -> None:
    used = {MEM: Fraction(20480), CPT: Fraction(0)}
    asked = {MEM: Fraction(1), CPT: Fraction(1)}
    assert excesses([quota(cpu="4"), quota(scoped=True, memory="1")], used, asked) == []
    (over,) = excesses([quota(memory="20480", compute="100")], used, asked)
    assert (over.quota, over.key, over.used, over.hard) == (
        "gpu",
        f"requests.{MEM}",
        Fraction(20480),
        Fraction(20480),
    )
    # The resource counts MiB: a hard of 20Ki is 20480 (MiB), not 20 GiB of them.
    assert [o.hard for o in excesses([quota(memory="20Ki")], used, asked)] == [20480]
    assert excesses([quota(memory="20Ki")], used, {CPT: Fraction(50)}) == []  # memory not asked for


# ---- admission ----------------------------------------------------------------------------------


def test_two_10gi_slices_fit_a_20gi_quota_and_a_third_is_refused_naming_the_quota() -> None:
    ns = Namespace([quota(memory="20480", compute="400")], [], [])
    reads = ClusterReads(quotas=ns)
    for name in ("a", "b"):
        assert admission_response("/objects", slice_review(gpu_slice(name)), reads=reads)["response"][
            "allowed"
        ]
        ns.objects["gpuslices"].append(gpu_slice(name))  # admitted: Pending, counted
    refused = admission_response("/objects", slice_review(gpu_slice("c")), reads=reads)["response"]
    assert refused["status"]["message"] == (
        f"spec.memory: 10240 MiB of {MEM} would exceed ResourceQuota gpu (requests.{MEM}: used 20480, hard "
        "20480; GPUSlices Pending or Bound and pods outside a slice count together)"
    )
    # The operator's own UPDATEs (its finalizer) are not counted again: the spec is immutable.
    assert admission_response("/objects", slice_review(gpu_slice("a"), "UPDATE"), reads=reads)["response"][
        "allowed"
    ]


def test_pods_and_slices_share_the_quota_and_a_pod_inside_a_slice_is_not_counted_twice() -> None:
    ns = Namespace([quota(memory="20480")], [gpu_slice("a", phase="Bound"), gpu_slice("b")], [])
    assert review_pod_quota(pod("inside", 10240, 30, slice_name="a"), NS, ns) == []
    (refusal,) = review_pod_quota(pod("outside", 1024, 10), NS, ns)
    assert refusal.startswith(f"spec.containers[0].resources.limits[{MEM}]: 1024 MiB of {MEM} would exceed")
    ns.objects["gpuslices"].pop()
    ns.objects["pods"].append(pod("inside", 10240, 30, slice_name="a"))
    assert review_pod_quota(pod("outside", 1024, 10), NS, ns) == []
    (refusal,) = review_slice_quota(gpu_slice("c", memory="10241Mi"), NS, ns)
    assert "used 10240, hard 20480" in refusal  # the pod inside `a` is not counted again


def test_without_reads_or_when_they_fail_slices_and_shared_pods_are_refused() -> None:
    (refusal,) = review_slice_quota(gpu_slice("a"), NS, None)
    assert refusal.startswith("spec.memory: this webhook cannot read ResourceQuotas")

    def broken(plural: str, namespace: str) -> list[Mapping[str, Any]]:
        raise QuotaReadError("HTTP 403 Forbidden")

    (refusal,) = review_pod_quota(pod("p", 1024, 10), NS, broken)
    assert "could not be read (HTTP 403 Forbidden)" in refusal
    assert review_pod_quota(pod("whole"), NS, None) == []  # asks for no share: nothing to count
    assert review_slice_quota(gpu_slice("m", migProfile="1g.10gb"), NS, None) == []


# ---- the slice controller's check before binding -------------------------------------------------


class _Items:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items


class FakeCore:
    def __init__(self, quotas: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.quotas, self.pods = quotas, pods
        self.events: list[dict[str, Any]] = []

    def list_namespaced_resource_quota(self, namespace: str) -> _Items:
        return _Items(self.quotas)

    def list_namespaced_pod(self, namespace: str) -> _Items:
        return _Items(self.pods)


class FakeCustom:
    def __init__(self, slices: list[dict[str, Any]]) -> None:
        self.slices = {s["metadata"]["name"]: s for s in slices}
        self.status: dict[str, dict[str, Any]] = {}

    def get_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, name: str) -> Any:
        return copy.deepcopy(self.slices[name])

    def list_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str) -> Any:
        return {"items": copy.deepcopy(list(self.slices.values()))}

    def patch_namespaced_custom_object(self, *args: Any) -> None:
        name, patch = args[4], args[5]
        self.slices[name]["metadata"]["finalizers"] = patch["metadata"]["finalizers"]

    def patch_namespaced_custom_object_status(self, *args: Any) -> None:
        name, body = args[4], args[5]
        self.status[name] = body["status"]
        self.slices[name]["status"] = {**(self.slices[name].get("status") or {}), **body["status"]}


def test_of_two_slices_admitted_at_once_past_the_quota_the_second_stays_pending_saying_why() -> None:
    # Both were admitted (each saw only the Bound one); the quota has room for one more.
    slices = [gpu_slice("held", phase="Bound"), gpu_slice("first"), gpu_slice("second")]
    slices[0]["status"].update(memoryMiB=10240, computePercent=30, gpuUUIDs=["GPU-1"], node="n")
    events: list[tuple[str, str, str]] = []
    ctl = SliceController(
        client.ApiClient(),
        lambda obj, kind, reason, msg: events.append((obj["metadata"]["name"], reason, msg)),
    )
    ctl.core = FakeCore([quota(memory="20480")], [])
    ctl.custom = fake = FakeCustom(slices)
    ctl._inventory = lambda: ([], [], [])  # type: ignore[method-assign]  # no GPU: the quota is checked first
    ctl.reconcile(NS, "first")
    assert fake.status["first"]["conditions"][-1]["reason"] == "NoCapacity"  # within the quota
    fake.slices["first"]["status"] = {"phase": "Bound", "memoryMiB": 10240, "computePercent": 30}
    ctl.reconcile(NS, "second")
    cond = fake.status["second"]["conditions"][-1]
    assert (fake.status["second"]["phase"], cond["type"], cond["status"], cond["reason"]) == (
        "Pending",
        "Bound",
        "False",
        "QuotaExceeded",
    )
    assert cond["message"] == (
        f"binding the slice: 10240 MiB of {MEM} would exceed ResourceQuota gpu (requests.{MEM}: used 20480, "
        "hard 20480; GPUSlices Pending or Bound and pods outside a slice count together); it stays Pending "
        "until the namespace has room"
    )
    ctl.reconcile(NS, "second")  # still over: one Warning event, not one per reconcile
    assert [e[:2] for e in events] == [("second", "QuotaExceeded")]
