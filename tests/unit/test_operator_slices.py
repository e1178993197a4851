"""GPUSlice binding (pure): which GPU a slice reserves, what is already taken, who uses a slice."""

from __future__ import annotations

from typing import Any

import pytest

from neuronetes import contracts as c
from neuronetes.api.models import GPUSlice, GPUSliceSpec, GPUSliceStatus
from neuronetes.model import GpuSpec, NodeSpec
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
