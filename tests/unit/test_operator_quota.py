"""GPUSlices count against the namespace's ResourceQuota, with pods, each share once.

A slice Pending or Bound holds (or waits for) its share — a MIG slice one instance of its profile,
as ``neuronetes.io/mig-<profile>`` like its pods; a pod naming a slice runs inside it and is not
counted again (docs/gpuslice.md "Quota"). The webhook refuses a slice or a pod past a quota,
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
from neuronetes.migdemand import slice_mig_demand
from neuronetes_operator.quota import excesses, pod_demand, usage
from neuronetes_operator.quota_admission import QuotaReadError, review_pod_quota, review_slice_quota
from neuronetes_operator.slice_controller import SliceController
from neuronetes_operator.webhook import ClusterReads, admission_response

pytestmark = pytest.mark.unit

MEM, CPT = c.RESOURCE_GPU_MEMORY, c.RESOURCE_GPU_COMPUTE
MIG3, MIG1 = c.mig_resource_name("3g.20gb"), c.mig_resource_name("1g.10gb")
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


def mig_pod(name: str, resource: str = MIG3, slice_name: str = "", phase: str = "Running") -> dict[str, Any]:
    """A pod asking for one MIG instance (`resource`), naming `slice_name` or none, in `phase`."""
    annotations = {c.ANNOTATION_SLICE: slice_name} if slice_name else None
    return {
        **manifest(name, {resource: 1}, namespace=NS, annotations=annotations),
        "status": {"phase": phase},
    }


def quota(name: str = "gpu", scoped: bool = False, **hard: str) -> dict[str, Any]:
    keys = {
        "memory": f"requests.{MEM}",
        "compute": f"requests.{CPT}",
        "cpu": "requests.cpu",
        "mig3": f"requests.{MIG3}",
        "mig1": f"requests.{MIG1}",
    }
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
    assert usage(slices, pods) == {
        MEM: Fraction(8192 + 10240 + 1024 + 2048),
        CPT: Fraction(20 + 30 + 10 + 5),
        MIG1: Fraction(1),  # the Pending MIG slice: one instance of its profile, no share
    }
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


def test_a_mig_slice_counts_one_instance_of_its_profile_and_a_pod_inside_it_is_not_counted_again() -> None:
    bound = gpu_slice("bound", phase="Bound", migProfile="3g.20gb")
    bound["status"].update(migProfile="3g.20gb", migStart=4, memoryMiB=20096, computePercent=100)
    going = gpu_slice("going", phase="Bound", migProfile="3g.20gb")
    going["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"  # the finalizer still holds it
    slices = [
        bound,
        gpu_slice("waiting", migProfile="3g.20gb"),  # no status yet: Pending, waits for an instance
        going,
        gpu_slice("small", phase="Pending", migProfile="1g.10gb"),
        gpu_slice("released", phase="Released", migProfile="3g.20gb"),
        gpu_slice("failed", phase="Failed", migProfile="3g.20gb"),
    ]
    pods = [
        mig_pod("inside", slice_name="bound"),
        mig_pod("inside-waiting", slice_name="waiting"),
        mig_pod("outside"),
        mig_pod("outside-small", MIG1),
        mig_pod("done", phase="Succeeded"),
        mig_pod("named-gone", slice_name="released"),
    ]
    assert usage(slices, pods) == {
        MEM: Fraction(0),
        CPT: Fraction(0),
        MIG3: Fraction(3 + 2),  # bound, waiting, going; the pods outside and in the released slice
        MIG1: Fraction(1 + 1),  # small; outside-small
    }
    assert usage(slices, pods, bound_only=True) == {
        MEM: Fraction(0),
        CPT: Fraction(0),
        MIG3: Fraction(2 + 2),
        MIG1: Fraction(1),
    }


def test_a_pods_mig_request_counts_per_profile_and_a_mig_quota_limits_only_its_profile() -> None:
    p = mig_pod("p")
    p["spec"]["containers"].append({"name": "b", "resources": {"limits": {MIG3: "1", MIG1: "2"}}})
    assert pod_demand(p) == {MIG3: Fraction(2), MIG1: Fraction(2)}
    used = {MIG3: Fraction(1)}
    assert excesses([quota(mig1="1"), quota(scoped=True, mig3="1")], used, {MIG3: Fraction(1)}) == []
    (over,) = excesses([quota(memory="20480", mig3="1")], used, {MIG3: Fraction(1)})
    assert (over.key, over.resource, over.used, over.hard) == (
        f"requests.{MIG3}",
        MIG3,
        Fraction(1),
        Fraction(1),
    )


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


def test_a_mig_slice_past_its_profiles_quota_is_refused_naming_spec_mig_profile() -> None:
    ns = Namespace([quota(mig3="1", memory="20480")], [], [])
    reads = ClusterReads(quotas=ns)
    first = gpu_slice("a", migProfile="3g.20gb")
    assert admission_response("/objects", slice_review(first), reads=reads)["response"]["allowed"]
    ns.objects["gpuslices"].append(first)  # admitted: Pending, waits for an instance, counted
    refused = admission_response("/objects", slice_review(gpu_slice("b", migProfile="3g.20gb")), reads=reads)
    assert refused["response"]["status"]["message"] == (
        f"spec.migProfile: 1 instance of {MIG3} would exceed ResourceQuota gpu (requests.{MIG3}: used 1, "
        "hard 1; GPUSlices Pending or Bound and pods outside a slice count together)"
    )
    # Another profile is not limited by this quota; neither is a shared slice by the MIG entry.
    assert review_slice_quota(gpu_slice("c", migProfile="1g.10gb"), NS, ns) == []
    assert review_slice_quota(gpu_slice("d"), NS, ns) == []


def test_a_mig_pod_outside_a_slice_shares_the_quota_with_mig_slices_and_one_inside_is_not_counted() -> None:
    ns = Namespace([quota(mig3="2")], [gpu_slice("a", phase="Bound", migProfile="3g.20gb")], [])
    assert review_pod_quota(mig_pod("inside", slice_name="a"), NS, ns) == []
    assert review_pod_quota(mig_pod("outside"), NS, ns) == []
    ns.objects["pods"] += [mig_pod("inside", slice_name="a"), mig_pod("outside")]
    (refusal,) = review_pod_quota(mig_pod("third"), NS, ns)
    assert refusal == (
        f"spec.containers[0].resources.limits[{MIG3}]: 1 instance of {MIG3} would exceed ResourceQuota gpu "
        f"(requests.{MIG3}: used 2, hard 2; GPUSlices Pending or Bound and pods outside a slice count "
        "together)"
    )
    (refusal,) = review_slice_quota(gpu_slice("b", migProfile="3g.20gb"), NS, ns)
    assert "used 2, hard 2" in refusal  # the pod inside `a` is not counted again


def test_without_reads_or_when_they_fail_slices_and_shared_or_mig_pods_are_refused() -> None:
    (refusal,) = review_slice_quota(gpu_slice("a"), NS, None)
    assert refusal.startswith("spec.memory: this webhook cannot read ResourceQuotas")

    def broken(plural: str, namespace: str) -> list[Mapping[str, Any]]:
        raise QuotaReadError("HTTP 403 Forbidden")

    (refusal,) = review_pod_quota(pod("p", 1024, 10), NS, broken)
    assert "could not be read (HTTP 403 Forbidden)" in refusal
    assert review_pod_quota(pod("whole"), NS, None) == []  # asks for no share: nothing to count
    (refusal,) = review_slice_quota(gpu_slice("m", migProfile="1g.10gb"), NS, None)
    assert refusal.startswith("spec.migProfile: this webhook cannot read ResourceQuotas")
    (refusal,) = review_pod_quota(mig_pod("m"), NS, broken)
    assert refusal.startswith(f"spec.containers[0].resources.limits[{MIG3}]: the quota of namespace {NS}")


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


def controller(
    quotas: list[dict[str, Any]], slices: list[dict[str, Any]], events: list[tuple[str, str, str]]
) -> tuple[SliceController, FakeCore, FakeCustom]:
    """A slice controller over a fake namespace that reports no GPU (the quota is checked first),
    recording its events as (slice, reason, message)."""
    ctl = SliceController(
        client.ApiClient(),
        lambda obj, kind, reason, msg: events.append((obj["metadata"]["name"], reason, msg)),
    )
    ctl.core = core = FakeCore(quotas, [])
    ctl.custom = custom = FakeCustom(slices)
    ctl._inventory = lambda: ([], [], [], {})  # type: ignore[method-assign]
    return ctl, core, custom


def test_of_two_slices_admitted_at_once_past_the_quota_the_second_stays_pending_saying_why() -> None:
    # Both were admitted (each saw only the Bound one); the quota has room for one more.
    slices = [gpu_slice("held", phase="Bound"), gpu_slice("first"), gpu_slice("second")]
    slices[0]["status"].update(memoryMiB=10240, computePercent=30, gpuUUIDs=["GPU-1"], node="n")
    events: list[tuple[str, str, str]] = []
    ctl, _, fake = controller([quota(memory="20480")], slices, events)
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


def test_a_mig_slice_past_its_profiles_quota_stays_pending_saying_why_and_asks_for_no_instance() -> None:
    slices = [gpu_slice("held", phase="Bound", migProfile="3g.20gb"), gpu_slice("late", migProfile="3g.20gb")]
    slices[0]["status"].update(migProfile="3g.20gb", migStart=0, gpuUUIDs=["GPU-1"], node="n")
    events: list[tuple[str, str, str]] = []
    ctl, core, fake = controller([quota(mig3="2")], slices, events)
    ctl.reconcile(NS, "late")
    assert fake.status["late"]["conditions"][-1]["reason"] == "NoMigInstance"  # within the quota
    core.quotas = [quota(mig3="1")]  # the quota shrinks
    ctl.reconcile(NS, "late")
    cond = fake.status["late"]["conditions"][-1]
    assert (fake.status["late"]["phase"], cond["status"], cond["reason"]) == (
        "Pending",
        "False",
        "QuotaExceeded",
    )
    assert cond["message"] == (
        f"binding the slice: 1 instance of {MIG3} would exceed ResourceQuota gpu (requests.{MIG3}: used 1, "
        "hard 1; GPUSlices Pending or Bound and pods outside a slice count together); it stays Pending "
        "until the namespace has room"
    )
    assert [e[:2] for e in events] == [("late", "QuotaExceeded")]
    assert slice_mig_demand(fake.slices["late"]) == []  # the layout controller makes no instance for it
