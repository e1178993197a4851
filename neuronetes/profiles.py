"""Named GPU node topologies, as data, and the Node labels, capacity and manifests made from them.

Core, because the node agent (its simulated GPU backend; the labels and capacity it publishes), the
operator (the simulated nodes' taint its local settings tolerate) and the dev cluster all read it.
A profile is one kind of machine (a DGX A100, a 4×T4 PCIe box, …). `TopologyProfile.node_spec`
turns it into the `neuronetes.model.NodeSpec` the placement engine reads, and `node_manifest`
turns any `NodeSpec` into the Kubernetes Node object the NeuroNetes agent would advertise for it
(the node labels of docs/contracts.md, price/spot/zone labels, GPU resources in capacity), so the
engine, the unit tests and the simulated cluster describe the same hardware.

Node capacity (the agent's contract, docs/contracts.md):

- ``neuronetes.io/gpu``: GPUs that can be granted whole or shared, i.e. GPUs *not* in MIG mode
  (a GPU in MIG mode can only be handed out as MIG instances; the engine's `usable_gpus` agrees);
- ``neuronetes.io/gpu-memory``: MiB of GPU memory over those GPUs;
- ``neuronetes.io/gpu-compute``: 100 per such GPU (percent of one GPU);
- ``neuronetes.io/mig-<profile>``: MIG instances of the node's configured layout (``+me`` is
  spelled ``.me``, as resource names allow no ``+``).

The ``neuronetes.io/mig-config`` label carries the node's MIG layout as instance totals over all
its GPUs in the label-safe spelling of `neuronetes.mig.format_mig_config` (``1g.5gb-16_2g.10gb-8``):
the spelling ``1g.5gb:7,2g.10gb:3`` is not a valid label value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from neuronetes import mig
from neuronetes.api.units import GPU_MEMORY_CLASSES_GB, gpu_memory_satisfies
from neuronetes.contracts import (
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY,
    LABEL_GPU_TOPOLOGY,
    LABEL_GPU_TYPE,
    LABEL_MIG_CAPABLE,
    LABEL_MIG_CONFIG,
    LABEL_PRICE_PER_HOUR,
    LABEL_REGION,
    LABEL_SPOT,
    LABEL_ZONE,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_MIG_PREFIX,
    simulated_gpu_uuid,
)
from neuronetes.model import GpuSpec, NodeSpec

__all__ = [
    "KWOK_ANNOTATION",
    "KWOK_TAINT",
    "LABEL_PROFILE",
    "PROFILES",
    "REGION",
    "ZONES",
    "TopologyProfile",
    "gpu_type_label",
    "mig_resource_name",
    "node_labels",
    "node_manifest",
    "node_resources",
    "parse_node_counts",
    "profile",
]

KWOK_ANNOTATION: Final = ("kwok.x-k8s.io/node", "fake")
"""Nodes carrying this annotation are run by kwok (the dev cluster starts kwok with this selector)."""
KWOK_TAINT: Final[dict[str, str]] = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
"""Pods that may land on simulated nodes tolerate this taint."""
LABEL_PROFILE: Final = "node.kubernetes.io/instance-type"
"""The standard instance-type label holds the profile name of a simulated node."""

REGION: Final = "local-1"
ZONES: Final = ("local-1a", "local-1b", "local-1c")

_PODS_PER_NODE: Final = 110


@dataclass(frozen=True, slots=True)
class TopologyProfile:
    """One kind of GPU machine.

    GPUs are spread evenly over `sockets` sockets and `numa_nodes` NUMA nodes in index order
    (GPUs 0-3 on socket 0 and 4-7 on socket 1 for 8 GPUs and 2 sockets). `nvlink_groups` equal
    groups of GPUs are fully connected by NVLink (1 = one NVSwitch domain); 0 means PCIe only.
    `mig_per_gpu` is the MIG layout of every GPU (None: MIG disabled).
    """

    name: str
    description: str
    gpu_model: str
    gpu_count: int
    gpu_memory_mib: int
    cpu_milli: int
    memory_mib: int
    price_per_hour: float
    spot_price_per_hour: float
    sockets: int = 2
    numa_nodes: int = 2
    pcie_gen: int = 4
    nvlink_groups: int = 0
    nvlink_bandwidth_gbps: float = 0.0
    mig_per_gpu: Mapping[str, int] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.gpu_count and self.nvlink_groups and self.gpu_count % self.nvlink_groups:
            raise ValueError(f"profile {self.name}: {self.gpu_count} GPUs in {self.nvlink_groups} groups")
        if self.mig_per_gpu is not None:
            # Raises when the layout does not fit one GPU of this model.
            mig.catalog_for(self.gpu_model).layout_from_counts(self.mig_per_gpu)

    def gpus(self, node_name: str) -> tuple[GpuSpec, ...]:
        """The GPUs of one node of this profile (UUIDs: `neuronetes.contracts.simulated_gpu_uuid`, the
        same the extender derives for a node without a GPUNode object)."""
        n = self.gpu_count
        out: list[GpuSpec] = []
        for j in range(n):
            group = j * self.nvlink_groups // n if self.nvlink_groups else -1
            peers = (
                tuple(k for k in range(n) if k != j and k * self.nvlink_groups // n == group)
                if self.nvlink_groups
                else ()
            )
            out.append(
                GpuSpec(
                    index=j,
                    uuid=simulated_gpu_uuid(node_name, j),
                    model=self.gpu_model,
                    memory_mib=self.gpu_memory_mib,
                    numa_node=j * self.numa_nodes // n,
                    socket=j * self.sockets // n,
                    pcie_gen=self.pcie_gen,
                    nvlink_group=group,
                    nvlink_bandwidth_gbps=self.nvlink_bandwidth_gbps if self.nvlink_groups else 0.0,
                    nvlink_peers=peers,
                    mig_enabled=self.mig_per_gpu is not None,
                )
            )
        return tuple(out)

    def node_spec(
        self,
        name: str,
        *,
        zone: str = ZONES[0],
        region: str = REGION,
        spot: bool = False,
        labels: Mapping[str, str] | None = None,
    ) -> NodeSpec:
        """A node of this profile, as the placement engine sees it."""
        extra = {LABEL_PROFILE: self.name}
        if self.mig_per_gpu is not None:
            totals = {p: c * self.gpu_count for p, c in self.mig_per_gpu.items()}
            extra[LABEL_MIG_CONFIG] = mig.format_mig_config(totals, label_safe=True)
        extra.update(labels or {})
        return NodeSpec(
            name=name,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpus=self.gpus(name),
            labels=extra,
            price_per_hour=self.spot_price_per_hour if spot else self.price_per_hour,
            spot=spot,
            zone=zone,
            region=region,
        )


# Prices: on-demand list prices of comparable cloud instances (USD/hour), spot ≈ 40 % of that.
PROFILES: Final[dict[str, TopologyProfile]] = {
    p.name: p
    for p in (
        TopologyProfile(
            name="dgx-a100-80gb",
            description="DGX A100 80GB: 8× A100-SXM4-80GB on NVSwitch (600 GB/s), 2 sockets, 2 NUMA nodes",
            gpu_model="A100-SXM4-80GB",
            gpu_count=8,
            gpu_memory_mib=81920,
            cpu_milli=256_000,
            memory_mib=2 * 1024 * 1024,
            price_per_hour=40.97,
            spot_price_per_hour=16.39,
            nvlink_groups=1,
            nvlink_bandwidth_gbps=600.0,
        ),
        TopologyProfile(
            name="dgx-h100",
            description="DGX H100: 8× H100-SXM5-80GB on NVSwitch (900 GB/s), 2 sockets, 2 NUMA nodes, PCIe 5",
            gpu_model="H100-SXM5-80GB",
            gpu_count=8,
            gpu_memory_mib=81559,
            cpu_milli=224_000,
            memory_mib=2 * 1024 * 1024,
            price_per_hour=98.32,
            spot_price_per_hour=39.33,
            pcie_gen=5,
            nvlink_groups=1,
            nvlink_bandwidth_gbps=900.0,
        ),
        TopologyProfile(
            name="t4x4-pcie",
            description="4× T4 16GB on PCIe 3, no NVLink, 2 sockets (GPUs 0-1 and 2-3), 2 NUMA nodes",
            gpu_model="T4",
            gpu_count=4,
            gpu_memory_mib=15360,
            cpu_milli=48_000,
            memory_mib=192 * 1024,
            price_per_hour=3.91,
            spot_price_per_hour=1.56,
            pcie_gen=3,
        ),
        TopologyProfile(
            name="a100-40gb-mig",
            description=(
                "8× A100-SXM4-40GB on NVSwitch (600 GB/s), MIG enabled on every GPU with the "
                "balanced layout 1g.5gb×2 + 2g.10gb + 3g.20gb"
            ),
            gpu_model="A100-SXM4-40GB",
            gpu_count=8,
            gpu_memory_mib=40960,
            cpu_milli=96_000,
            memory_mib=1152 * 1024,
            price_per_hour=32.77,
            spot_price_per_hour=13.11,
            nvlink_groups=1,
            nvlink_bandwidth_gbps=600.0,
            mig_per_gpu={"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2},
        ),
        TopologyProfile(
            name="cpu-only",
            description="a CPU node without GPUs (32 cores, 128 GiB)",
            gpu_model="",
            gpu_count=0,
            gpu_memory_mib=0,
            cpu_milli=32_000,
            memory_mib=128 * 1024,
            price_per_hour=1.53,
            spot_price_per_hour=0.61,
        ),
    )
}


def profile(name: str) -> TopologyProfile:
    """The profile called `name` (ValueError naming the choices otherwise)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown node profile {name!r}; choose from {', '.join(PROFILES)}") from None


def parse_node_counts(items: Sequence[str]) -> list[tuple[str, int]]:
    """``["dgx-h100=2", "t4x4-pcie"]`` → ``[("dgx-h100", 2), ("t4x4-pcie", 1)]`` (profiles checked)."""
    out: list[tuple[str, int]] = []
    for item in items:
        name, sep, count = item.partition("=")
        name = name.strip()
        profile(name)  # ValueError naming the profiles
        try:
            n = int(count) if sep else 1
        except ValueError:
            raise ValueError(f"--nodes {item!r}: COUNT must be an integer") from None
        if n < 0:
            raise ValueError(f"--nodes {item!r}: COUNT must be >= 0")
        out.append((name, n))
    return out


def gpu_type_label(model: str) -> str:
    """The ``neuronetes.io/gpu-type`` label value: the GPU family (``A100-SXM4-80GB`` → ``A100``)."""
    text = re.sub(r"^NVIDIA[\s-]+", "", model.strip(), flags=re.IGNORECASE)
    return re.split(r"[\s_-]+", text, maxsplit=1)[0].upper() if text else ""


def _gib_label(mib: int) -> str:
    """GPU memory as the node label carries it: the GPU's memory *class* (neuronetes.api.units), the
    largest nominal size whose requests it satisfies (81559 MiB → ``80Gi``, T4's 15360 → ``16Gi``)."""
    fitting = [c for c in GPU_MEMORY_CLASSES_GB if gpu_memory_satisfies(f"{c}Gi", mib)]
    return f"{fitting[-1]}Gi" if fitting else f"{max(1, round(mib / 1024))}Gi"


def _price_label(price: float) -> str:
    return f"{price:.2f}"


def mig_resource_name(profile_name: str) -> str:
    """The extended resource of a MIG profile: ``1g.5gb+me`` → ``neuronetes.io/mig-1g.5gb.me``."""
    canonical = mig.normalize_profile_name(profile_name)
    return RESOURCE_MIG_PREFIX + canonical.replace("+", ".")


def _mig_totals(spec: NodeSpec) -> dict[str, int]:
    config = spec.labels.get(LABEL_MIG_CONFIG, "")
    if not config or not any(g.mig_enabled for g in spec.gpus):
        return {}
    catalog = mig.catalog_for(spec.gpu_model)
    return mig.parse_mig_config(config, catalog)


def node_labels(spec: NodeSpec) -> dict[str, str]:
    """The labels the agent writes for this node (GPU labels of docs/contracts.md, price, zone).

    `spec.labels` is applied last, so it may add or override labels.
    """
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        LABEL_SPOT: "true" if spec.spot else "false",
    }
    if spec.price_per_hour is not None:  # an unknown price is no label (docs/cost.md)
        labels[LABEL_PRICE_PER_HOUR] = _price_label(spec.price_per_hour)
    if spec.zone:
        labels[LABEL_ZONE] = spec.zone
    if spec.region:
        labels[LABEL_REGION] = spec.region
    if spec.gpus:
        model = spec.gpu_model
        labels.update(
            {
                LABEL_GPU_TYPE: gpu_type_label(model),
                LABEL_GPU_MEMORY: _gib_label(spec.gpus[0].memory_mib),
                LABEL_GPU_COUNT: str(len(spec.gpus)),
                LABEL_GPU_TOPOLOGY: "nvlink" if any(g.nvlink_group >= 0 for g in spec.gpus) else "pcie",
                LABEL_MIG_CAPABLE: "true" if mig.is_mig_capable(model) else "false",
                # What NVIDIA's GPU feature discovery sets on a GPU node: the chart's agent
                # DaemonSet selects GPU nodes by it.
                "nvidia.com/gpu.present": "true",
            }
        )
    labels.update(spec.labels)
    return labels


def node_resources(spec: NodeSpec) -> dict[str, str]:
    """Capacity (= allocatable) of the node, as Kubernetes quantities."""
    whole = [g for g in spec.gpus if not g.mig_enabled]
    resources = {
        "cpu": f"{spec.cpu_milli}m" if spec.cpu_milli % 1000 else str(spec.cpu_milli // 1000),
        "memory": f"{spec.memory_mib}Mi",
        "pods": str(_PODS_PER_NODE),
        "ephemeral-storage": "1Ti",
    }
    if spec.gpus:
        resources[RESOURCE_GPU] = str(len(whole))
        resources[RESOURCE_GPU_MEMORY] = str(sum(g.memory_mib for g in whole))
        resources[RESOURCE_GPU_COMPUTE] = str(100 * len(whole))
    for name, count in _mig_totals(spec).items():
        resources[mig_resource_name(name)] = str(count)
    return resources


def node_manifest(spec: NodeSpec, *, simulated: bool = True) -> dict[str, Any]:
    """The Node object for `spec`.

    With `simulated` (the default) the node carries kwok's annotation and taint, so kwok runs it
    and only pods tolerating ``kwok.x-k8s.io/node=fake:NoSchedule`` land there.
    """
    resources = node_resources(spec)
    metadata: dict[str, Any] = {"name": spec.name, "labels": node_labels(spec)}
    node_spec: dict[str, Any] = {}
    if simulated:
        metadata["annotations"] = {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]}
        node_spec["taints"] = [dict(KWOK_TAINT)]
    if not spec.schedulable:
        node_spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": node_spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
        },
    }
