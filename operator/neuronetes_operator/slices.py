"""GPUSlice: choose the GPU a Pending slice reserves, and when a deleted slice may go. Pure.

A slice is a claim on part of one GPU that exists before and between the pods that use it
(docs/gpuslice.md). The operator binds a Pending slice to one GPU: the GPU must have the slice's
memory free, and its compute share too, counting every Bound slice (`status.gpuUUIDs`) and every
bound pod's assignment (`neuronetes.io/assigned-gpus`) on it. Slices are bound one at a time
(`SliceController` holds one lock), so two slices never take the same free capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.api.models import GPUSlice, GPUSliceSpec
from neuronetes.api.units import slice_memory_mib
from neuronetes.model import NodeSpec

from .admission import ANNOTATION_SLICE

__all__ = ["FINALIZER", "GpuUse", "SliceChoice", "choose_gpu", "gpu_use", "pods_using", "reserved"]

FINALIZER: Final = f"{c.GROUP}/slice-protection"
"""Kept on a GPUSlice until no pod uses it, so its reservation outlives deletion requests."""


@dataclass
class GpuUse:
    """What is already taken on one GPU."""

    memory_mib: int = 0
    compute_percent: int = 0
    exclusive: bool = False  # a whole-GPU pod or a MIG instance holds it
    holders: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SliceChoice:
    node: str
    uuid: str
    index: int


def reserved(spec: GPUSliceSpec) -> dict[str, Any]:
    """The status fields that record what a Bound slice reserves (what the extender counts)."""
    return {
        "memoryMiB": slice_memory_mib(spec.memory),
        "computePercent": spec.compute_percent,
        "qosClass": spec.qos_class,
    }


def gpu_use(slices: Iterable[GPUSlice], pods: Iterable[Mapping[str, Any]]) -> dict[str, GpuUse]:
    """Per GPU UUID, the memory and compute Bound slices and bound pods hold.

    A pod that names a Bound slice and uses only the slice's GPU runs inside the slice's
    reservation and is not counted again (the extender's rule, `neuronetes_extender.slices`).
    """
    use: dict[str, GpuUse] = {}
    slice_gpu: dict[tuple[str, str], str] = {}  # (namespace, name) of a Bound slice -> its GPU
    for s in slices:
        st = s.status
        if st is None or st.phase not in ("Bound", "Active") or not st.gpu_uuids or s.spec.mig_profile:
            continue  # a MIG slice holds an instance, no share (`mig_slices`)
        slice_gpu[(str(s.metadata.get("namespace") or ""), str(s.metadata.get("name")))] = st.gpu_uuids[0]
        for uuid in st.gpu_uuids:
            u = use.setdefault(uuid, GpuUse())
            # The recorded reservation; a slice bound before it was recorded: its (immutable) spec.
            u.memory_mib += st.memory_mib or slice_memory_mib(s.spec.memory)
            u.compute_percent += st.compute_percent or s.spec.compute_percent
            u.holders.append(f"GPUSlice {s.metadata.get('name')}")
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        raw = annotations.get(c.ANNOTATION_ASSIGNED_GPUS)
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if not raw or finished:
            continue
        try:
            doc = c.decode_assignment(raw)
        except c.AssignmentError:
            continue
        seen: dict[str, c.GpuAssignment] = {}
        for ctr in doc.containers.values():
            for g in ctr.gpus:
                prev = seen.get(g.uuid)
                if prev is None or g.memory_mib > prev.memory_mib:
                    seen[g.uuid] = g
        named = (str(meta.get("namespace") or ""), str(annotations.get(ANNOTATION_SLICE, "")))
        if named in slice_gpu and set(seen) == {slice_gpu[named]}:
            continue  # inside its slice
        for uuid, g in seen.items():
            u = use.setdefault(uuid, GpuUse())
            if g.mig_profile is not None or not _shared(doc):
                u.exclusive = True
            u.memory_mib += g.memory_mib
            u.compute_percent += g.compute_percent
            u.holders.append(f"pod {meta.get('name')}")
    return use


def _shared(doc: c.Assignment) -> bool:
    """Whether the assignment is a shared slice (one GPU, less than all of it) rather than whole GPUs."""
    gpus = [g for ctr in doc.containers.values() for g in ctr.gpus]
    return len({g.uuid for g in gpus}) == 1 and any(g.compute_percent < 100 for g in gpus)


def choose_gpu(
    spec: GPUSliceSpec, nodes: Sequence[NodeSpec], use: Mapping[str, GpuUse]
) -> SliceChoice | None:
    """The GPU a slice of `spec` reserves: best fit (least memory left over) among GPUs with room.

    Honours ``spec.nodeName`` / ``spec.gpuUUID``; skips GPUs in MIG mode, unschedulable nodes and
    GPUs a whole-GPU pod holds. Memory is never oversubscribed; compute shares add up to at most
    100 % of a GPU (the reservation a Guaranteed slice is promised; others are never placed on a
    GPU whose shares are spoken for either, so a Guaranteed slice's share stays free).
    """
    need_mem = slice_memory_mib(spec.memory)
    best: tuple[int, SliceChoice] | None = None
    for node in nodes:
        if not node.schedulable or (spec.node_name and node.name != spec.node_name):
            continue
        for gpu in node.gpus:
            if gpu.mig_enabled or not gpu.health.schedulable or (spec.gpu_uuid and gpu.uuid != spec.gpu_uuid):
                continue
            u = use.get(gpu.uuid, GpuUse())
            free_mem = gpu.memory_mib - u.memory_mib
            if u.exclusive or free_mem < need_mem or u.compute_percent + spec.compute_percent > 100:
                continue
            left = free_mem - need_mem
            if best is None or left < best[0]:
                best = (left, SliceChoice(node.name, gpu.uuid, gpu.index))
    return best[1] if best else None


def pods_using(name: str, pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Pods (not finished) naming the slice `name` in their ``neuronetes.io/slice`` annotation."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("annotations") or {}).get(ANNOTATION_SLICE) != name:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        out.append(str(meta.get("name")))
    return sorted(out)
