"""What the agent writes to Kubernetes for one node: GPU labels, capacity, the GPUNode status.

Pure functions of the discovered inventory and the GPUs' states. Labels and capacity go through the
same definitions the simulated nodes use (`neuronetes.profiles.node_labels` and
`node_resources`, docs/contracts.md "Node labels" and "Node capacity"), so a node the agent serves
and a node the dev cluster describes agree exactly; capacity counts only GPUs that can take new
work (schedulable state, not cordoned).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes import mig
from neuronetes.model import GpuHealth, GpuSpec, NodeSpec
from neuronetes.profiles import node_labels, node_resources

from .devices import GpuDevice, Inventory

__all__ = ["GPU_LABEL_KEYS", "Allocation", "gpu_capacity", "gpu_labels", "gpunode_status"]

GPU_LABEL_KEYS: Final = (
    c.LABEL_GPU_TYPE,
    c.LABEL_GPU_MEMORY,
    c.LABEL_GPU_COUNT,
    c.LABEL_GPU_TOPOLOGY,
    c.LABEL_MIG_CAPABLE,
    c.LABEL_MIG_CONFIG,
)
"""The node labels the agent owns (others on the node are left alone)."""

Allocation = dict[str, Any]
"""One GPUNode ``status.gpus[].allocations[]`` entry (CRD field names)."""


def _node_spec(node: str, gpus: Iterable[GpuDevice]) -> NodeSpec:
    gpus = list(gpus)
    labels: dict[str, str] = {}
    totals: dict[str, int] = {}
    for g in gpus:
        for d in g.mig_devices:
            totals[d.profile] = totals.get(d.profile, 0) + 1
    if totals:
        # The catalog's order (largest profile first), as the node profiles spell the label.
        order = {p.name: k for k, p in enumerate(mig.catalog_for(gpus[0].model))}
        ordered = sorted(totals.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
        labels[c.LABEL_MIG_CONFIG] = mig.format_mig_config(ordered, label_safe=True)
    specs = tuple(
        GpuSpec(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            memory_mib=g.memory_mib,
            nvlink_group=g.nvlink_group,
            mig_enabled=g.mig_enabled,
        )
        for g in gpus
    )
    return NodeSpec(name=node, cpu_milli=0, memory_mib=0, gpus=specs, labels=labels)


def gpu_labels(node: str, inventory: Inventory) -> dict[str, str | None]:
    """The GPU labels of the node (None: remove the label, e.g. mig-config without MIG)."""
    full = node_labels(_node_spec(node, inventory.gpus)) if inventory.gpus else {}
    return {k: full.get(k) for k in GPU_LABEL_KEYS}


def gpu_capacity(node: str, inventory: Inventory, usable: set[str]) -> dict[str, str]:
    """The NeuroNetes resources of the node, counting the GPUs whose UUID is in `usable`.

    Every resource the inventory could offer is present (0 when no usable GPU offers it), so a
    GPU going offline lowers the figure instead of leaving a stale one behind.
    """
    everything = node_resources(_node_spec(node, inventory.gpus)) if inventory.gpus else {}
    healthy = [g for g in inventory.gpus if g.uuid in usable]
    offered = node_resources(_node_spec(node, healthy)) if healthy else {}
    return {k: offered.get(k, "0") for k in everything if k.startswith(c.RESOURCE_PREFIX)}


def _gpu_status(
    g: GpuDevice, state: GpuHealth, reason: str, allocations: list[Allocation], cached_models: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uuid": g.uuid,
        "index": g.index,
        "model": g.model,
        "memoryMiB": g.memory_mib,
        "migMode": ("Enabled" if g.mig_enabled else "Disabled") if g.mig_capable else "Unsupported",
        "numaNode": g.numa_node,
        "socket": g.socket,
        "pcieGen": g.pcie_gen,
        "nvlinkGroup": g.nvlink_group,
        "nvlinkPeers": list(g.nvlink_peers),
        "nvlinkBandwidthGBps": g.nvlink_bandwidth_gbps,
        "health": state.value,
        "healthReason": reason[:1024],
        "cachedModels": cached_models,
        "allocations": allocations[:64],
    }
    if g.mig_enabled:
        out["migInstances"] = [
            {
                "profile": d.profile,
                "uuid": d.uuid,
                "start": d.start,
                "size": d.size,
                "gpuInstanceId": d.gpu_instance_id,
                "computeInstanceId": d.compute_instance_id,
                "memoryMiB": d.memory_mib,
            }
            for d in g.mig_devices
        ]
    return out


def gpunode_status(
    inventory: Inventory,
    states: Mapping[str, tuple[GpuHealth, str]],
    allocations: Mapping[str, list[Allocation]],
    *,
    agent_version: str,
    generation: int,
    heartbeat: datetime,
    nvml_ok: bool,
    mig_state: str = "None",
    cached_models: Iterable[str] = (),
) -> dict[str, Any]:
    """The GPUNode ``status`` (every field of the CRD; timestamps RFC 3339 UTC). The node's cached
    models (`modelcache`) are listed on every GPU: the cache is the node's, any GPU may load them."""
    models = list(cached_models)
    gpus = [
        _gpu_status(
            g, *states.get(g.uuid, (GpuHealth.AVAILABLE, "")), list(allocations.get(g.uuid, ())), list(models)
        )
        for g in inventory.gpus
    ]
    healthy = sum(1 for g in inventory.gpus if states.get(g.uuid, (GpuHealth.AVAILABLE, ""))[0].schedulable)
    stamp = heartbeat.strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = nvml_ok and healthy == len(inventory.gpus)
    return {
        "model": inventory.gpus[0].model if inventory.gpus else "",
        "gpuCount": len(inventory.gpus),
        "healthyGPUs": healthy,
        "driverVersion": inventory.driver_version,
        "cudaVersion": inventory.cuda_version,
        "agentVersion": agent_version,
        "migConfigState": mig_state,
        "lastHeartbeatTime": stamp,
        "gpus": gpus,
        "observedGeneration": generation,
        "conditions": [
            _condition("NVMLAvailable", nvml_ok, "Responding" if nvml_ok else "NotResponding", generation),
            _condition(
                "Ready",
                ready,
                "AllGPUsHealthy" if ready else "GPUsUnhealthy",
                generation,
                f"{healthy} of {len(inventory.gpus)} GPUs schedulable",
            ),
        ],
    }


def _condition(kind: str, ok: bool, reason: str, generation: int, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "observedGeneration": generation,
        "reason": reason,
        "message": message,
    }
