"""GPUSlices in the extender's cache: a Bound slice reserves its share (read from its status), a pod
naming it lands inside it without being charged again, and the books stay whole (docs/gpuslice.md)."""

from __future__ import annotations

import copy
import time
from typing import Any

import msgspec
import pytest
from extender_support import OpenWatch, bound_with, mig_pod, node_objects, planned, shared_pod, synced_cache

from neuronetes import contracts as c
from neuronetes_extender.cache import GPUSLICES, GpuCache
from neuronetes_extender.feeds import gpuslice_reflector
from neuronetes_extender.kube import KubeError
from neuronetes_extender.pods import PodInfo
from neuronetes_extender.slices import slice_of
from neuronetes_extender.watch import CustomObject
from neuronetes_extender.wire import Node, Pod

pytestmark = pytest.mark.unit

NODE, OTHER = "nt4x4-pcie-0", "nt4x4-pcie-1"
FULL = (1000, 15360)  # a T4 with nothing on it: (milli-GPU free, MiB free)
KEY = "default/chat"


def gpu(j: int, node: str = NODE) -> str:
    return c.simulated_gpu_uuid(node, j)


def slice_object(
    name: str = "chat", *, phase: str = "Bound", node: str = NODE, j: int = 0, **status: Any
) -> CustomObject:
    """A GPUSlice as served; its spec says 100 % and 1Gi: only the status may be counted."""
    obj = {
        "metadata": {"name": name, "namespace": "default", "uid": "u-" + name},
        "spec": {"memory": "1Gi", "computePercent": 100, "qosClass": "BestEffort"},
        "status": {
            "phase": phase,
            "node": node,
            "gpuUUIDs": [gpu(j, node)],
            "memoryMiB": 6144,
            "computePercent": 60,
            "qosClass": "Guaranteed",
            **status,
        },
    }
    return msgspec.convert(obj, CustomObject)


def put(cache: GpuCache, obj: CustomObject) -> None:
    cache.put_slice(f"{obj.metadata.namespace}/{obj.metadata.name}", slice_of(obj))


def slice_pod(name: str, memory: int = 6144, compute: int = 60, slice_name: str = "chat") -> dict[str, Any]:
    pod = shared_pod(name, memory, compute)
    pod["metadata"].setdefault("annotations", {})[c.ANNOTATION_SLICE] = slice_name
    return pod


def info(pod: dict[str, Any]) -> PodInfo:
    return PodInfo.from_pod(msgspec.convert(pod, Pod))


def two_nodes() -> GpuCache:
    return synced_cache(node_objects({"t4x4-pcie": 2}))


def test_a_bound_slice_reserves_its_status_share_before_any_pod() -> None:
    cache = two_nodes()
    put(cache, slice_object())
    usage = cache.gpu_usage(NODE)
    assert usage is not None and usage[0] == (400, 15360 - 6144) and usage[1:] == [FULL] * 3
    # Another shared pod of 50 % cannot take GPU 0 any more (its compute is 60 % spoken for).
    other = info(shared_pod("other", 1024, 50))
    decision = cache.filter(other, [NODE])
    assert decision.hold is not None and [g.gpu_index for g in decision.hold.grants] != [0]
    cache.check_invariants()


@pytest.mark.parametrize(
    ("status", "counted"),
    [
        ({}, True),
        ({"phase": "Active"}, True),
        ({"phase": "Pending"}, False),
        ({"phase": "Released"}, False),
        ({"memoryMiB": None}, False),  # a Bound slice whose status does not say its size
        ({"computePercent": 0}, False),
        ({"qosClass": "Gold"}, False),
        ({"gpuUUIDs": []}, False),
    ],
)
def test_only_a_complete_bound_status_reserves(status: dict[str, Any], counted: bool) -> None:
    cache = two_nodes()
    obj = slice_object()
    assert obj.status is not None
    obj.status.update(status)
    obj.status = {k: v for k, v in obj.status.items() if v is not None}
    put(cache, obj)
    usage = cache.gpu_usage(NODE)
    assert usage is not None and (usage[0] != FULL) is counted


def test_a_pod_naming_the_slice_lands_inside_it_and_is_not_charged_again() -> None:
    cache = two_nodes()
    put(cache, slice_object(j=2))
    pod = slice_pod("user")
    decision = cache.filter(info(pod), [OTHER, NODE])
    assert decision.feasible == (NODE,) and decision.hold is not None and decision.hold.grants == ()
    assert "reserved on node" in decision.failed[OTHER]
    user = info(pod)
    plan = planned(cache.prepare_bind(user.id, NODE, user))
    assert plan.assignment is not None
    (ctr,) = plan.assignment.containers.values()
    (g,) = ctr.gpus
    assert (g.uuid, g.memory_mib, g.compute_percent, ctr.qos) == (gpu(2), 6144, 60, c.QoS.GUARANTEED)
    before = cache.gpu_usage(NODE)
    cache.bind_done(plan, ok=True)
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"] = NODE
    bound["metadata"]["annotations"].update(plan.annotations)
    cache.upsert_pod(msgspec.convert(bound, Pod))  # the watch reports the binding
    assert cache.gpu_usage(NODE) == before
    assert before is not None and before[2] == (400, 15360 - 6144)
    cache.check_invariants()
    # Deleting the pod keeps the reservation; deleting the slice releases it.
    cache.delete_pod(msgspec.convert(bound, Pod))
    assert cache.gpu_usage(NODE) == before
    cache.put_slice(KEY, None)
    assert cache.gpu_usage(NODE) == [FULL] * 4
    cache.check_invariants()


def test_a_pod_waits_for_its_slice_and_is_nudged_when_it_binds() -> None:
    cache = two_nodes()
    raw = slice_pod("early")
    pod = info(raw)
    cache.upsert_pod(msgspec.convert(raw, Pod))
    waiting = cache.filter(pod, [NODE, OTHER])
    assert waiting.feasible == () and not waiting.unresolvable
    assert "not Bound" in waiting.failed[NODE]
    put(cache, slice_object(node=OTHER))
    assert cache.take_nudges() == [("default", "early")]
    assert cache.filter(pod, [NODE, OTHER]).feasible == (OTHER,)


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (slice_pod("bigger", memory=8192), "ask for the slice's share"),
        (slice_pod("faster", compute=70), "ask for the slice's share"),
    ],
)
def test_a_pod_asking_for_another_share_than_its_slice_is_refused_for_good(
    pod: dict[str, Any], why: str
) -> None:
    cache = two_nodes()
    put(cache, slice_object())
    decision = cache.filter(info(pod), [NODE, OTHER])
    assert decision.feasible == () and why in decision.unresolvable[NODE]


def test_a_slice_pod_without_a_gpu_request_is_refused() -> None:
    cache = two_nodes()
    put(cache, slice_object())
    pod = shared_pod("bare", 1, 1)
    pod["spec"]["containers"][0]["resources"] = {}
    pod["metadata"]["annotations"] = {c.ANNOTATION_SLICE: "chat"}
    decision = cache.filter(info(pod), [NODE])
    assert "does not ask for a shared slice" in decision.unresolvable[NODE]


def test_after_a_restart_a_bound_pod_inside_its_slice_is_counted_once() -> None:
    cache = GpuCache()
    cache.replace_nodes([msgspec.convert(n, Node) for n in node_objects({"t4x4-pcie": 1})])
    inside = bound_with(slice_pod("inside"), NODE, {1: (6144, 60)})
    inside["metadata"]["annotations"][c.ANNOTATION_SLICE] = "chat"
    cache.replace_pods([msgspec.convert(inside, Pod)])  # pods listed before the slices
    cache.replace_slices([s for s in [slice_of(slice_object(j=1))] if s is not None])
    usage = cache.gpu_usage(NODE)
    assert usage is not None and usage[1] == (400, 15360 - 6144)
    cache.check_invariants()


def test_a_pod_reaching_beyond_its_slice_is_charged_in_full() -> None:
    cache = two_nodes()
    put(cache, slice_object(j=1))
    beyond = bound_with(slice_pod("beyond"), NODE, {3: (6144, 60)})  # another GPU than the slice's
    beyond["metadata"]["annotations"][c.ANNOTATION_SLICE] = "chat"
    cache.upsert_pod(msgspec.convert(beyond, Pod))
    usage = cache.gpu_usage(NODE)
    assert usage is not None and usage[1] == usage[3] == (400, 15360 - 6144)


def test_a_slice_on_a_share_a_bound_pod_holds_is_a_conflict_never_an_oversubscription() -> None:
    cache = two_nodes()
    taken = bound_with(shared_pod("taken", 12000, 50), NODE, {0: (12000, 50)})
    cache.upsert_pod(msgspec.convert(taken, Pod))
    put(cache, slice_object())  # 6144 MiB more than the 3360 left on GPU 0
    assert cache.stats().conflicts == 1
    usage = cache.gpu_usage(NODE)
    assert usage is not None and usage[0] == (500, 15360 - 12000)
    cache.check_invariants()


def test_pods_of_a_slice_that_overlaps_a_bound_pod_wait() -> None:
    cache = two_nodes()
    taken = bound_with(shared_pod("taken", 12000, 50), NODE, {0: (12000, 50)})
    cache.upsert_pod(msgspec.convert(taken, Pod))
    put(cache, slice_object())
    decision = cache.filter(info(slice_pod("user")), [NODE])
    assert decision.feasible == () and "held by a bound pod" in decision.failed[NODE]
    cache.delete_pod(msgspec.convert(taken, Pod))  # the slice is charged once the pod is gone
    assert cache.filter(info(slice_pod("user")), [NODE]).feasible == (NODE,)


class _SliceApi:
    """Serves one Bound GPUSlice (or a 404: no CRD) and a watch that stays open."""

    def __init__(self, installed: bool = True) -> None:
        self.installed = installed
        self.stream = OpenWatch()

    def get(self, path: str, query: Any = (), *, timeout: float | None = None) -> bytes:
        if not self.installed:
            raise KubeError(404, "the server could not find the requested resource")
        item = msgspec.to_builtins(slice_object())
        return msgspec.json.encode({"metadata": {"resourceVersion": "1"}, "items": [item]})

    def watch(self, path: str, query: Any, *, read_timeout: float) -> OpenWatch:
        return self.stream


@pytest.mark.parametrize("installed", [True, False], ids=["crd", "no-crd"])
def test_the_cache_is_ready_only_once_the_slices_are_listed(installed: bool) -> None:
    cache = two_nodes()
    cache.require_sync(GPUSLICES)  # as start_reflectors does: a restart never gives a share away
    synced_before_the_list = cache.synced
    assert not synced_before_the_list
    api = _SliceApi(installed)
    reflector = gpuslice_reflector(cache, api)  # type: ignore[arg-type]
    reflector.start()
    try:
        deadline = time.monotonic() + 5
        while not cache.synced and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.synced
        usage = cache.gpu_usage(NODE)
        assert usage is not None and (usage[0] == (400, 15360 - 6144)) is installed
    finally:
        reflector.signal_stop()
        api.stream.close()
        reflector.join(5)


MIG_NODE = "na100-40gb-mig-0"


def mig_slice_object(name: str = "claim", start: int = 4) -> CustomObject:
    """A Bound MIG slice: the 3g.20gb instance at `start` on GPU 0 of the MIG node."""
    status = {
        "phase": "Bound",
        "node": MIG_NODE,
        "gpuUUIDs": [gpu(0, MIG_NODE)],
        "migProfile": "3g.20gb",
        "migStart": start,
        "memoryMiB": 19968,
        "computePercent": 100,
        "qosClass": "Guaranteed",
    }
    obj = {
        "metadata": {"name": name, "namespace": "default", "uid": "u-" + name},
        "spec": {"memory": "20Gi", "migProfile": "3g.20gb"},
        "status": status,
    }
    return msgspec.convert(obj, CustomObject)


def test_a_bound_mig_slice_holds_its_instance_and_its_pod_gets_exactly_that_instance() -> None:
    cache = synced_cache(node_objects({"a100-40gb-mig": 1, "t4x4-pcie": 1}))
    put(cache, mig_slice_object())
    # Another MIG pod never gets the slice's instance.
    for k in range(3):
        other = info(mig_pod(f"other-{k}", "3g.20gb"))
        decision = cache.filter(other, [MIG_NODE])
        assert decision.hold is not None
        (g,) = decision.hold.grants
        assert (g.gpu_index, g.mig_start) != (0, 4)
    # The pod naming the slice lands on the slice's node with the slice's instance, charged nothing more.
    raw = mig_pod("user", "3g.20gb")
    raw["metadata"].setdefault("annotations", {})[c.ANNOTATION_SLICE] = "claim"
    user = info(raw)
    decision = cache.filter(user, [NODE, MIG_NODE])
    assert decision.feasible == (MIG_NODE,) and decision.hold is not None and decision.hold.grants == ()
    plan = planned(cache.prepare_bind(user.id, MIG_NODE, user))
    assert plan.assignment is not None
    (ctr,) = plan.assignment.containers.values()
    (claim,) = ctr.gpus
    assert (claim.uuid, claim.mig_profile, claim.mig_start) == (gpu(0, MIG_NODE), "3g.20gb", 4)
    cache.bind_done(plan, ok=True)
    bound = copy.deepcopy(raw)
    bound["spec"]["nodeName"] = MIG_NODE
    bound["metadata"]["annotations"].update(plan.annotations)
    cache.upsert_pod(msgspec.convert(bound, Pod))
    assert cache.stats().conflicts == 0  # the bound pod runs inside the slice's instance, not beside it
    cache.check_invariants()
    # Deleting the pod, then the slice, leaves the books whole (the allocation goes with the slice).
    cache.delete_pod(msgspec.convert(bound, Pod))
    cache.put_slice("default/claim", None)
    cache.check_invariants()


def test_a_pod_naming_a_mig_slice_must_ask_for_its_profile() -> None:
    cache = synced_cache(node_objects({"a100-40gb-mig": 1}))
    put(cache, mig_slice_object())
    raw = shared_pod("shared", 1024, 10)
    raw["metadata"].setdefault("annotations", {})[c.ANNOTATION_SLICE] = "claim"
    decision = cache.filter(info(raw), [MIG_NODE])
    assert decision.feasible == () and "does not ask for exactly one" in decision.unresolvable[MIG_NODE]


def test_a_mig_slice_status_without_its_start_slot_reserves_nothing() -> None:
    obj = mig_slice_object()
    assert obj.status is not None
    del obj.status["migStart"]
    assert slice_of(obj) is None
    whole = slice_of(mig_slice_object())
    assert whole is not None and (whole.mig_profile, whole.mig_start) == ("3g.20gb", 4)
