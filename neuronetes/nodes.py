"""Node objects → `NodeSpec`: the GPU inventory read from node labels and capacity.

The extender's cache and the operator's GPUSlice binding read nodes the same way, through this
module, so both see the same GPUs and UUIDs. Until a node's agent publishes its `GPUNode` object
(per-GPU UUIDs, NVLink peers, NUMA nodes; `apply_gpunode`), each node's GPUs are built from what
the agent already writes on the Node (the labels of docs/contracts.md "Node labels";
`neuronetes.profiles` writes the same for simulated nodes):

- GPU count: ``neuronetes.io/gpu-count``; of these, the ``neuronetes.io/gpu`` in allocatable are
  whole/shareable GPUs and the rest are in MIG mode (listed after the others) when the node offers
  MIG instances and the model can be MIG; otherwise the rest are drained, offline or unhealthy
  GPUs and left out (a T4 is never in MIG mode);
- memory per GPU: allocatable ``neuronetes.io/gpu-memory`` / ``neuronetes.io/gpu`` (exact MiB), or
  for MIG-only nodes the ``neuronetes.io/gpu-memory`` label (``40Gi``);
- model: NVIDIA GPU feature discovery's ``nvidia.com/gpu.product`` when present, else
  ``<gpu-type>-<memory>GB`` (``A100-80GB``), which the MIG catalog and model filters read;
- topology: ``neuronetes.io/gpu-topology: nvlink`` puts all GPUs in one NVLink domain (an NVSwitch
  node) at the model's nominal bandwidth, ``pcie`` in none; GPUs are split evenly over two
  sockets / NUMA nodes in index order (the common dual-socket layout);
- price from its label, else the price table (`neuronetes.pricing`; unknown: None); spot, zone
  and region from their labels; cordoned nodes are unschedulable;
- GPU UUIDs: `neuronetes.contracts.simulated_gpu_uuid` (deterministic per node and index).

What labels cannot say (bridged NVLink pairs, odd socket layouts) is approximated as above; the
`GPUNode` objects will replace this module's guesses with what NVML reports.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any, Final

import msgspec

from neuronetes import contracts as c
from neuronetes import mig
from neuronetes.api import models as m
from neuronetes.api.units import nominal_nvlink_gbps
from neuronetes.model import GpuHealth, GpuSpec, NodeSpec
from neuronetes.pricing import EMPTY_TABLE, PriceError, PriceTable, node_price
from neuronetes.quantity import QuantityError, parse_quantity, to_mib, to_milli

__all__ = [
    "LABEL_GPU_PRODUCT",
    "NodeSpecError",
    "apply_gpunode",
    "node_spec_from_fields",
    "node_spec_from_object",
    "unusable_node",
]

LABEL_GPU_PRODUCT: Final = "nvidia.com/gpu.product"
"""NVIDIA GPU feature discovery's full model name (``NVIDIA-A100-SXM4-80GB``), used when present."""

_SOCKETS: Final = 2
_PCIE_GEN_BY_FAMILY: Final = {"H100": 5, "H200": 5, "B200": 6, "GB200": 6, "T4": 3, "V100": 3, "P100": 3}
_MAX_GPUS: Final = c.MAX_GPU_INDEX + 1
_MAX_AMOUNT: Final = 2**53  # CPU milli / MiB beyond this are no machine (and would overflow int64 maths)

log = logging.getLogger(__name__)


class NodeSpecError(ValueError):
    """A node whose labels or capacity cannot be read as a GPU inventory."""


def _quantity(value: object, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise NodeSpecError(f"{what}: {value!r} is not a quantity")
    try:
        return parse_quantity(value)
    except (QuantityError, ValueError, ZeroDivisionError) as exc:
        raise NodeSpecError(f"{what}: {value!r} is not a quantity ({exc})") from None


def _count(value: object, what: str) -> int:
    q = _quantity(value, what)
    if q.denominator != 1 or q < 0:
        raise NodeSpecError(f"{what}: {value!r} is not a non-negative integer")
    return int(q)


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None or raw == "":
        return None
    if not re.fullmatch(r"[0-9]{1,4}", raw):
        raise NodeSpecError(f"label {key}: {raw!r} is not a GPU count")
    return int(raw)


def _memory_label_mib(labels: Mapping[str, str]) -> int:
    raw = labels.get(c.LABEL_GPU_MEMORY)
    if not raw:
        return 0
    return to_mib(_quantity(raw, f"label {c.LABEL_GPU_MEMORY}"))


def _model(labels: Mapping[str, str]) -> str:
    product = labels.get(LABEL_GPU_PRODUCT, "").strip()
    if product:
        return re.sub(r"^NVIDIA[\s-]+", "", product, flags=re.IGNORECASE)
    family = labels.get(c.LABEL_GPU_TYPE, "").strip()
    memory = labels.get(c.LABEL_GPU_MEMORY, "").strip()
    size = re.fullmatch(r"([0-9]+)\s*G(?:i|B)?", memory)
    if family and size:
        return f"{family}-{size.group(1)}GB"
    return family


def _held_back_are_mig(name: str, model: str, resources: Mapping[str, Any], held: int) -> bool:
    """Whether the `held` GPUs the labels count but ``neuronetes.io/gpu`` does not offer are in MIG
    mode. Only when the node offers MIG instances (a ``neuronetes.io/mig-*`` resource, 0 while all
    are taken) and the model can be MIG: otherwise they are GPUs drained, offline or unhealthy (the
    agent offers only usable GPUs), left out without a word, round after round. A node offering
    MIG instances of a model without a MIG catalog is misconfigured: that is worth a warning."""
    if not any(str(key).startswith(c.RESOURCE_MIG_PREFIX) for key in resources):
        return False
    try:
        mig.catalog_for(model)
    except mig.UnsupportedGpuError as exc:
        log.warning("node %s: %d GPU(s) in MIG mode left out: %s", name, held, exc)
        return False
    return True


def _pcie_gen(model: str) -> int:
    upper = model.upper()
    for family, gen in _PCIE_GEN_BY_FAMILY.items():
        if re.search(rf"(?<![A-Z0-9]){family}(?![0-9])", upper):
            return gen
    return 4


def _price(labels: Mapping[str, str], prices: PriceTable) -> float | None:
    try:
        return node_price(labels, prices).per_hour
    except PriceError as exc:
        raise NodeSpecError(str(exc)) from None


class _Meta(msgspec.Struct, kw_only=True):
    name: str = ""
    labels: dict[str, str] | None = None


class _Spec(msgspec.Struct, kw_only=True):
    unschedulable: bool = False


class _Status(msgspec.Struct, kw_only=True):
    capacity: dict[str, str | int | float] | None = None
    allocatable: dict[str, str | int | float] | None = None


class _NodeObject(msgspec.Struct, kw_only=True):
    """The fields of a Node object this module reads (the API's JSON decodes into it)."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)
    status: _Status = msgspec.field(default_factory=_Status)


def node_spec_from_object(node: Mapping[str, Any], prices: PriceTable = EMPTY_TABLE) -> NodeSpec:
    """The engine's view of one Node object as the API's JSON (a mapping); `prices`: the price
    table (`neuronetes.pricing`) for nodes without a price label.

    Raises:
        NodeSpecError: not a Node object, or as `node_spec_from_fields`.
    """
    try:
        obj = msgspec.convert(node, _NodeObject)
    except msgspec.ValidationError as exc:
        raise NodeSpecError(f"not a Node object: {exc}") from None
    status = obj.status
    return node_spec_from_fields(
        obj.metadata.name,
        obj.metadata.labels or {},
        {**(status.capacity or {}), **(status.allocatable or {})},
        unschedulable=obj.spec.unschedulable,
        prices=prices,
    )


def node_spec_from_fields(
    name: str,
    labels: Mapping[str, str],
    resources: Mapping[str, Any],
    *,
    unschedulable: bool,
    prices: PriceTable = EMPTY_TABLE,
) -> NodeSpec:
    """The engine's view of one node from its name, labels, resources (capacity overlaid with
    allocatable) and cordon; its price from its label or `prices` (`neuronetes.pricing.node_price`;
    None when neither knows it).

    Raises:
        NodeSpecError: the node has no name, or a label or capacity value that cannot be read.
    """
    if not name:
        raise NodeSpecError("node without metadata.name")
    labels = dict(labels)

    cpu_milli = to_milli(_quantity(resources.get("cpu", 0), f"node {name}: cpu"))
    memory_mib = to_mib(_quantity(resources.get("memory", 0), f"node {name}: memory"))
    if not (0 <= cpu_milli <= _MAX_AMOUNT and 0 <= memory_mib <= _MAX_AMOUNT):
        raise NodeSpecError(f"node {name}: cpu or memory out of range")

    labelled = _label_int(labels, c.LABEL_GPU_COUNT)
    whole_raw = resources.get(c.RESOURCE_GPU)
    whole = _count(whole_raw, f"node {name}: {c.RESOURCE_GPU}") if whole_raw is not None else None
    if whole is None:
        whole = labelled or 0
    total = max(labelled if labelled is not None else whole, whole)
    if total > _MAX_GPUS:
        raise NodeSpecError(f"node {name}: {total} GPUs, more than {_MAX_GPUS}")
    mig_gpus = total - whole

    model = _model(labels)
    if whole:
        memory_raw = resources.get(c.RESOURCE_GPU_MEMORY)
        total_memory = _count(memory_raw, f"node {name}: {c.RESOURCE_GPU_MEMORY}") if memory_raw else 0
        gpu_memory = total_memory // whole if total_memory else _memory_label_mib(labels)
    else:
        gpu_memory = _memory_label_mib(labels)
    if not 0 <= gpu_memory <= c.MAX_GPU_MEMORY_MIB:
        raise NodeSpecError(f"node {name}: {gpu_memory} MiB per GPU is out of range")
    if mig_gpus and not _held_back_are_mig(name, model, resources, mig_gpus):
        mig_gpus, total = 0, whole

    nvlink = labels.get(c.LABEL_GPU_TOPOLOGY) == "nvlink" and total > 1
    bandwidth = nominal_nvlink_gbps(model) if nvlink else 0.0
    pcie_gen = _pcie_gen(model)
    sockets = _SOCKETS if total >= _SOCKETS else 1
    gpus = tuple(
        GpuSpec(
            index=j,
            uuid=c.simulated_gpu_uuid(name, j),
            model=model,
            memory_mib=gpu_memory,
            numa_node=j * sockets // total,
            socket=j * sockets // total,
            pcie_gen=pcie_gen,
            nvlink_group=0 if nvlink else -1,
            nvlink_bandwidth_gbps=bandwidth,
            nvlink_peers=tuple(k for k in range(total) if k != j) if nvlink else (),
            mig_enabled=j >= whole,
        )
        for j in range(total)
    )
    return NodeSpec(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=gpus,
        labels=labels,
        price_per_hour=_price(labels, prices),
        spot=labels.get(c.LABEL_SPOT, "").lower() == "true",
        zone=labels.get(c.LABEL_ZONE, ""),
        region=labels.get(c.LABEL_REGION, ""),
        schedulable=not unschedulable,
    )


def unusable_node(name: str) -> NodeSpec:
    """A placeholder for a node whose inventory cannot be read: nothing is ever placed on it."""
    return NodeSpec(name=name, cpu_milli=0, memory_mib=0, gpus=(), schedulable=False)


def apply_gpunode(spec: NodeSpec, gpunode: m.GPUNode) -> NodeSpec:
    """`spec` with the GPUs its node agent discovered (the ``GPUNode`` object's status).

    The agent's view (UUIDs, NUMA node, socket, NVLink group and peers, health, cached models)
    replaces what the labels imply; GPUs in ``spec.cordonedGPUs`` count as offline. A GPUNode
    without GPUs in its status (the agent has not reported yet) changes nothing.
    """
    status = gpunode.status
    if status is None or not status.gpus:
        return spec
    cordoned = set(gpunode.spec.cordoned_gpus or ())
    by_index = {g.index: g for g in spec.gpus}
    gpus = []
    cached: set[str] = set(spec.cached_models)
    for info in sorted(status.gpus, key=lambda g: g.index):
        base = by_index.get(info.index)
        model = info.model or (base.model if base is not None else spec.gpu_model)
        health = GpuHealth(info.health) if info.health else GpuHealth.AVAILABLE
        if info.uuid in cordoned:
            health = GpuHealth.OFFLINE
        gpus.append(
            GpuSpec(
                index=info.index,
                uuid=info.uuid,
                model=model,
                memory_mib=info.memory_mib or (base.memory_mib if base is not None else 0),
                numa_node=max(
                    info.numa_node if info.numa_node is not None else (base.numa_node if base else 0), 0
                ),
                socket=info.socket if info.socket is not None else (base.socket if base else 0),
                pcie_gen=info.pcie_gen or (base.pcie_gen if base else 4),
                nvlink_group=info.nvlink_group if info.nvlink_group is not None else -1,
                nvlink_bandwidth_gbps=info.nvlink_bandwidth_gbps or 0.0,
                nvlink_peers=tuple(info.nvlink_peers or ()),
                mig_enabled=info.mig_mode == "Enabled",
                health=health,
                mig_instances=_reported_instances(info),
            )
        )
        cached.update(info.cached_models or ())
    return replace(spec, gpus=tuple(gpus), cached_models=frozenset(cached))


def _reported_instances(info: m.GpuInfo) -> tuple[tuple[str, int], ...] | None:
    """The MIG instances a GPU's agent reported, as (profile, start slot); None when the GPU is not
    in MIG mode or the agent reported no list. An instance without a start slot cannot be matched
    to a grant and is left out (never offered)."""
    if info.mig_mode != "Enabled" or info.mig_instances is None:
        return None
    return tuple(sorted((m.profile, m.start) for m in info.mig_instances if m.start is not None))
