"""The agents' GPUNode objects refine the inventory the extender reads from node labels."""

from __future__ import annotations

from typing import Any

import msgspec
from extender_support import gpu_pod, node_objects, synced_cache

from neuronetes import contracts as c
from neuronetes.api import models as m
from neuronetes.model import GpuHealth
from neuronetes.nodes import apply_gpunode
from neuronetes_extender.pods import PodInfo
from neuronetes_extender.wire import Pod

NODE = "nt4x4-pcie-0"


def gpunode(name: str, gpus: list[dict[str, Any]], cordoned: list[str] | None = None) -> m.GPUNode:
    obj = {
        "apiVersion": c.API_VERSION,
        "kind": "GPUNode",
        "metadata": {"name": name},
        "spec": {"cordonedGPUs": cordoned} if cordoned else {},
        "status": {"gpus": gpus},
    }
    return m.decode(obj, m.GPUNode)


def t4(index: int, **kw: Any) -> dict[str, Any]:
    return {
        "uuid": f"GPU-real-{index}",
        "index": index,
        "model": "Tesla T4",
        "memoryMiB": 15360,
        "numaNode": index // 2,
        "socket": index // 2,
        "health": "Available",
        **kw,
    }


def test_gpunode_replaces_the_label_inventory_and_its_health_counts() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    before = cache.node_spec(NODE)
    assert before is not None and before.gpus[0].uuid == c.simulated_gpu_uuid(NODE, 0)
    cache.upsert_gpunode(
        gpunode(
            NODE, [t4(0, health="Offline"), t4(1), t4(2), t4(3, cachedModels=["llama-3-8b"])], ["GPU-real-2"]
        )
    )
    spec = cache.node_spec(NODE)
    assert spec is not None
    assert [g.uuid for g in spec.gpus] == [f"GPU-real-{k}" for k in range(4)]
    assert [g.health for g in spec.gpus] == [
        GpuHealth.OFFLINE,
        GpuHealth.AVAILABLE,
        GpuHealth.OFFLINE,
        GpuHealth.AVAILABLE,
    ]
    assert spec.cached_models == frozenset({"llama-3-8b"})
    assert spec.cpu_milli == before.cpu_milli  # CPU and memory still come from the Node
    # Only GPUs 1 and 3 are usable now: a 3-GPU pod no longer fits there, a 2-GPU pod does.
    three = PodInfo.from_pod(msgspec.convert(gpu_pod("three", 3), Pod))
    assert cache.filter(three, [NODE]).feasible == ()
    two = PodInfo.from_pod(msgspec.convert(gpu_pod("two", 2), Pod))
    decision = cache.filter(two, [NODE])
    assert decision.hold is not None and sorted(g.gpu_index for g in decision.hold.grants) == [1, 3]
    cache.check_invariants()
    # The agent's object goes away: back to the labels.
    cache.delete_gpunode(NODE)
    spec = cache.node_spec(NODE)
    assert spec is not None and spec.gpus[0].uuid == c.simulated_gpu_uuid(NODE, 0)
    cache.check_invariants()


def test_a_gpunode_without_reported_gpus_changes_nothing() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    before = cache.node_spec(NODE)
    cache.replace_gpunodes([gpunode(NODE, [])])
    assert cache.node_spec(NODE) == before


def test_a_gpunode_s_mig_instances_are_the_ones_mig_pods_get() -> None:
    """The agent's reported instances (profile and start) reach the inventory; one without a start
    slot cannot be matched and is left out; a GPU not in MIG mode has no instance list."""
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    base = cache.node_spec(NODE)
    assert base is not None
    a100 = {"model": "A100-SXM4-40GB", "memoryMiB": 40960}
    spec = apply_gpunode(
        base,
        gpunode(
            NODE,
            [
                t4(
                    0,
                    **a100,
                    migMode="Enabled",
                    migInstances=[
                        {"profile": "3g.20gb", "start": 4},
                        {"profile": "2g.10gb", "start": 0},
                        {"profile": "1g.5gb"},
                    ],
                ),
                t4(1, **a100, migMode="Enabled"),
                t4(2),
            ],
        ),
    )
    assert spec.gpus[0].mig_instances == (("2g.10gb", 0), ("3g.20gb", 4))
    assert spec.gpus[1].mig_enabled and spec.gpus[1].mig_instances is None
    assert spec.gpus[2].mig_instances is None
