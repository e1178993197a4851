"""GPUSlice binding (pure): which GPU a slice reserves, what is already taken, who uses a slice."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from neuronetes import contracts as c
from neuronetes.api.models import GpuAllocation, GPUNode, GPUSlice, GPUSliceSpec, GPUSliceStatus, decode
from neuronetes.model import GpuSpec, NodeSpec
from neuronetes_operator.mig_slices import (
    MigInstanceChoice,
    choose_mig_instance,
    mig_held,
    mig_instances_seen,
    mig_reserved,
    reported_instances,
    waits_for_mig_instance,
)
from neuronetes_operator.slices import choose_gpu, gpu_use, pods_using, reserved

pytestmark = pytest.mark.unit


def node(name: str, gpus: int = 2, memory_mib: int = 16384, mig: bool = False) -> NodeSpec:
    return NodeSpec(
        name=name,
        cpu_milli=32000,
        memory_mib=65536,
        gpus=tuple(
            GpuSpec(
                index=i,
                uuid=c.simulated_gpu_uuid(name, i),
                model="T4",
                memory_mib=memory_mib,
                mig_enabled=mig,
            )
            for i in range(gpus)
        ),
    )


def bound(name: str, memory: str, compute: int, uuid: str) -> GPUSlice:
    return GPUSlice(
        metadata={"name": name},
        spec=GPUSliceSpec(memory=memory, compute_percent=compute, qos_class="Guaranteed"),
        status=GPUSliceStatus(phase="Bound", node="n", gpu_uuids=[uuid]),
    )


def assigned_pod(
    name: str, node_name: str, index: int, compute: int, memory: int, **ann: str
) -> dict[str, Any]:
    gpu = c.GpuAssignment(
        uuid=c.simulated_gpu_uuid(node_name, index), index=index, memory_mib=memory, compute_percent=compute
    )
    doc = c.Assignment(
        version=1,
        node=node_name,
        containers={"m": c.ContainerAssignment(gpus=(gpu,), priority=0, qos=c.QoS.GUARANTEED)},
    )
    return {
        "metadata": {
            "name": name,
            "annotations": {c.ANNOTATION_ASSIGNED_GPUS: c.encode_assignment(doc), **ann},
        }
    }


def test_best_fit_takes_the_fullest_gpu_that_still_fits() -> None:
    n = node("n")
    use = gpu_use([bound("a", "8Gi", 30, n.gpus[1].uuid)], [])
    choice = choose_gpu(GPUSliceSpec(memory="4Gi", compute_percent=20), [n], use)
    assert choice is not None and choice.index == 1


def test_memory_and_compute_are_never_oversubscribed() -> None:
    n = node("n", gpus=1)
    use = gpu_use([bound("a", "12Gi", 50, n.gpus[0].uuid)], [])
    assert choose_gpu(GPUSliceSpec(memory="8Gi", compute_percent=10), [n], use) is None
    assert choose_gpu(GPUSliceSpec(memory="1Gi", compute_percent=60), [n], use) is None
    assert choose_gpu(GPUSliceSpec(memory="4Gi", compute_percent=50), [n], use) is not None


def test_whole_gpu_pods_and_mig_gpus_are_not_used() -> None:
    n = node("n", gpus=1)
    whole = assigned_pod("w", "n", 0, 100, 16384)
    assert choose_gpu(GPUSliceSpec(memory="1Gi", compute_percent=1), [n], gpu_use([], [whole])) is None
    assert choose_gpu(GPUSliceSpec(memory="1Gi"), [node("m", mig=True)], {}) is None


def test_shared_pods_count_but_pods_inside_a_slice_do_not() -> None:
    n = node("n", gpus=1)
    shared = assigned_pod("s", "n", 0, 40, 8192)
    inside = assigned_pod("i", "n", 0, 10, 1024, **{"neuronetes.io/slice": "a"})
    use = gpu_use([bound("a", "1Gi", 10, n.gpus[0].uuid)], [shared, inside])
    assert use[n.gpus[0].uuid].compute_percent == 50 and not use[n.gpus[0].uuid].exclusive
    assert choose_gpu(GPUSliceSpec(memory="6Gi", compute_percent=50), [n], use) is not None
    assert choose_gpu(GPUSliceSpec(memory="6Gi", compute_percent=51), [n], use) is None
    # A pod naming a slice that is not Bound, or reaching beyond its slice's GPU, counts in full.
    stray = assigned_pod("x", "n", 0, 30, 1024, **{"neuronetes.io/slice": "missing"})
    assert gpu_use([], [stray])[n.gpus[0].uuid].compute_percent == 30


def test_node_name_and_gpu_uuid_pin_the_choice() -> None:
    a, b = node("a"), node("b")
    pinned = choose_gpu(GPUSliceSpec(memory="1Gi", node_name="b", gpu_uuid=b.gpus[1].uuid), [a, b], {})
    assert pinned is not None and (pinned.node, pinned.index) == ("b", 1)


def test_pods_using_a_slice() -> None:
    pods: list[dict[str, Any]] = [
        {"metadata": {"name": "x", "annotations": {"neuronetes.io/slice": "s"}}},
        {
            "metadata": {"name": "y", "annotations": {"neuronetes.io/slice": "s"}},
            "status": {"phase": "Succeeded"},
        },
        {"metadata": {"name": "z", "annotations": {"neuronetes.io/slice": "t"}}},
    ]
    assert pods_using("s", pods) == ["x"]


def test_the_recorded_reservation_is_what_counts_and_binding_records_it() -> None:
    uuid = c.simulated_gpu_uuid("n", 0)
    recorded = GPUSlice(
        metadata={"name": "r"},
        spec=GPUSliceSpec(memory="1Gi", compute_percent=10),  # a spec edited after binding
        status=GPUSliceStatus(
            phase="Bound",
            node="n",
            gpu_uuids=[uuid],
            memory_mib=8192,
            compute_percent=70,
            qos_class="Guaranteed",
        ),
    )
    use = gpu_use([recorded], [])[uuid]
    assert (use.memory_mib, use.compute_percent) == (8192, 70)
    spec = GPUSliceSpec(memory="10Gi", compute_percent=30, qos_class="Guaranteed")
    assert reserved(spec) == {"memoryMiB": 10240, "computePercent": 30, "qosClass": "Guaranteed"}


# ---- MIG slices: the idle reported instance ----------------------------------------------------

A100_LAYOUT = [("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3), ("3g.20gb", 4)]


def mig_node(name: str, gpus: int = 2, *, schedulable: bool = True) -> tuple[NodeSpec, GPUNode]:
    """A MIG node and its agent's GPUNode: every GPU laid out as `A100_LAYOUT`."""
    spec = NodeSpec(
        name=name,
        cpu_milli=32000,
        memory_mib=65536,
        schedulable=schedulable,
        gpus=tuple(
            GpuSpec(
                index=i,
                uuid=c.simulated_gpu_uuid(name, i),
                model="A100-SXM4-40GB",
                memory_mib=40960,
                mig_enabled=True,
                mig_instances=tuple(A100_LAYOUT),
            )
            for i in range(gpus)
        ),
    )
    status = {
        "gpus": [
            {
                "index": i,
                "uuid": c.simulated_gpu_uuid(name, i),
                "model": "A100-SXM4-40GB",
                "migMode": "Enabled",
                "migInstances": [
                    {"profile": p, "start": s, "uuid": f"MIG-{name}-{i}-{s}"} for p, s in A100_LAYOUT
                ],
            }
            for i in range(gpus)
        ]
    }
    return spec, decode({"metadata": {"name": name}, "spec": {}, "status": status}, GPUNode)


def mig_spec(profile: str = "1g.5gb", **pins: str) -> GPUSliceSpec:
    return GPUSliceSpec(memory="5Gi", mig_profile=profile, **pins)  # type: ignore[arg-type]


def mig_pod(node_name: str, index: int, profile: str, start: int) -> dict[str, Any]:
    gpu = c.GpuAssignment(
        uuid=c.simulated_gpu_uuid(node_name, index),
        index=index,
        memory_mib=4864,
        compute_percent=100,
        mig_profile=profile,
        mig_start=start,
    )
    doc = c.Assignment(
        version=1,
        node=node_name,
        containers={"m": c.ContainerAssignment(gpus=(gpu,), priority=0, qos=c.QoS.GUARANTEED)},
    )
    return {"metadata": {"name": "p", "annotations": {c.ANNOTATION_ASSIGNED_GPUS: c.encode_assignment(doc)}}}


def instances(*nodes: tuple[NodeSpec, GPUNode]) -> list[MigInstanceChoice]:
    return reported_instances([n for n, _ in nodes], {n.name: g for n, g in nodes})


def test_a_mig_slice_takes_the_first_idle_reported_instance_of_its_profile() -> None:
    found = instances(mig_node("b"), mig_node("a"))
    got = choose_mig_instance(mig_spec(), found, frozenset())
    assert got is not None
    assert (got.node, got.gpu_index, got.profile, got.start, got.uuid) == ("a", 0, "1g.5gb", 2, "MIG-a-0-2")
    assert choose_mig_instance(mig_spec("4g.20gb"), found, frozenset()) is None  # no such instance
    fields = mig_reserved(mig_spec(), got, "A100-SXM4-40GB")
    assert fields["migStart"] == 2 and fields["migInstanceUUID"] == "MIG-a-0-2"
    assert fields["gpuUUIDs"] == [c.simulated_gpu_uuid("a", 0)] and fields["memoryMiB"] == 4864


def test_instances_held_by_pods_slices_or_allocations_are_not_idle_and_none_left_is_none() -> None:
    a = mig_node("a", gpus=1)
    held_by_slice = GPUSlice(
        metadata={"name": "s"},
        spec=mig_spec(),
        status=GPUSliceStatus(phase="Bound", node="a", gpu_uuids=[c.simulated_gpu_uuid("a", 0)], mig_start=2),
    )
    held = mig_held([held_by_slice], [mig_pod("a", 0, "1g.5gb", 3)], [a[1]])
    assert held == {(c.simulated_gpu_uuid("a", 0), 2), (c.simulated_gpu_uuid("a", 0), 3)}
    assert choose_mig_instance(mig_spec(), instances(a), held) is None  # both 1g.5gb taken
    got = choose_mig_instance(mig_spec("3g.20gb"), instances(a), held)
    assert got is not None and got.start == 4
    # An allocation the agent reported holds its instance too (a pod bound outside the extender).
    status = a[1].status
    assert status is not None and status.gpus
    busy = msgspec.structs.replace(
        status.gpus[0], allocations=[GpuAllocation(namespace="ml", pod="q", mig_instance="MIG-a-0-4")]
    )
    gn = msgspec.structs.replace(a[1], status=msgspec.structs.replace(status, gpus=[busy]))
    assert choose_mig_instance(mig_spec("3g.20gb"), instances(a), mig_held([], [], [gn])) is None


def test_a_mig_slice_honours_its_pins_and_skips_unschedulable_nodes() -> None:
    found = instances(mig_node("a"), mig_node("b"), mig_node("c", schedulable=False))
    assert {i.node for i in found} == {"a", "b"}
    on_b = choose_mig_instance(mig_spec(node_name="b"), found, frozenset())
    assert on_b is not None and (on_b.node, on_b.gpu_index, on_b.start) == ("b", 0, 2)
    gpu = c.simulated_gpu_uuid("b", 1)
    on_gpu = choose_mig_instance(mig_spec(node_name="b", gpu_uuid=gpu), found, frozenset())
    assert on_gpu is not None and (on_gpu.gpu_uuid, on_gpu.start) == (gpu, 2)
    one = choose_mig_instance(mig_spec(node_name="b", gpu_uuid="MIG-b-1-3"), found, frozenset())
    assert one is not None and one.uuid == "MIG-b-1-3"
    assert (
        choose_mig_instance(mig_spec(node_name="b", gpu_uuid="MIG-b-1-3"), found, frozenset({(gpu, 3)}))
        is None
    )
    assert choose_mig_instance(mig_spec(node_name="c"), found, frozenset()) is None


def test_only_a_change_of_mig_instances_or_their_holders_requeues_pending_mig_slices() -> None:
    _, gn = mig_node("a", gpus=1)
    raw = msgspec.to_builtins(gn)
    seen = mig_instances_seen(raw)
    heartbeat = copy.deepcopy(raw)
    heartbeat["status"]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
    assert mig_instances_seen(heartbeat) == seen
    relaid = copy.deepcopy(raw)
    relaid["status"]["gpus"][0]["migInstances"][0] = {"profile": "1g.10gb", "start": 0, "uuid": "MIG-new"}
    assert mig_instances_seen(relaid) != seen
    freed = copy.deepcopy(raw)
    freed["status"]["gpus"][0]["allocations"] = [{"namespace": "ml", "pod": "p", "migInstance": "MIG-a-0-4"}]
    assert mig_instances_seen(freed) != seen
    pending = {"metadata": {"name": "s"}, "spec": {"migProfile": "1g.5gb"}, "status": {"phase": "Pending"}}
    assert waits_for_mig_instance(pending) and waits_for_mig_instance({**pending, "status": {}})
    assert not waits_for_mig_instance({**pending, "status": {"phase": "Bound"}})
    assert not waits_for_mig_instance({**pending, "spec": {"memory": "1Gi"}})
    assert not waits_for_mig_instance({**pending, "metadata": {"deletionTimestamp": "x"}})
