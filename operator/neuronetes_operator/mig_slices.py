"""MIG GPUSlices: the idle MIG instance a Pending slice with ``spec.migProfile`` is bound to. Pure.

A MIG slice claims one MIG instance, as a PVC claims a volume (docs/gpuslice.md). It is bound only
to an instance that exists: one the node's agent reported in its GPUNode (``status.gpus[].migInstances``,
with a start slot) on a schedulable node and a healthy GPU in MIG mode, of the slice's profile, that
no pod (its ``neuronetes.io/assigned-gpus`` or the agent's reported allocation) and no other Bound MIG
slice holds. When none is idle the MIG layout controller counts the slice as demand and re-lays a
GPU out for it; the slice binds once the agent reports the new instance.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuronetes import contracts as c
from neuronetes.api.models import GPUNode, GPUSlice, GPUSliceSpec
from neuronetes.mig import catalog_for, normalize_profile_name
from neuronetes.mig_profiles import UnsupportedGpuError
from neuronetes.migdemand import slice_instance
from neuronetes.model import NodeSpec

__all__ = [
    "MigInstanceChoice",
    "choose_mig_instance",
    "idle_instances_note",
    "mig_held",
    "mig_instances_seen",
    "mig_reserved",
    "reported_instances",
    "waits_for_mig_instance",
]

Held = frozenset[tuple[str, int]]
"""MIG instances taken, as (parent GPU UUID, start slot)."""


@dataclass(frozen=True, slots=True)
class MigInstanceChoice:
    """A reported MIG instance: its node, parent GPU (UUID, index), profile, start slot, own UUID."""

    node: str
    gpu_uuid: str
    gpu_index: int
    profile: str
    start: int
    uuid: str | None = None
    memory_mib: int | None = None


def reported_instances(nodes: Sequence[NodeSpec], gpunodes: Mapping[str, GPUNode]) -> list[MigInstanceChoice]:
    """Every MIG instance an agent reported on a schedulable node's healthy MIG GPU (node name, GPU
    index, start slot order). An instance without a start slot cannot be granted and is left out."""
    out: list[MigInstanceChoice] = []
    for node in sorted(nodes, key=lambda n: n.name):
        gn = gpunodes.get(node.name)
        if not node.schedulable or gn is None or gn.status is None:
            continue
        infos = {g.index: g for g in gn.status.gpus or ()}
        for gpu in node.gpus:
            info = infos.get(gpu.index)
            if not gpu.mig_enabled or not gpu.health.schedulable or info is None:
                continue
            for inst in sorted(info.mig_instances or (), key=lambda i: (i.start is None, i.start or 0)):
                if inst.start is None:
                    continue
                profile = normalize_profile_name(inst.profile)
                out.append(
                    MigInstanceChoice(
                        node.name, gpu.uuid, gpu.index, profile, inst.start, inst.uuid, inst.memory_mib
                    )
                )
    return out


def mig_held(
    slices: Iterable[GPUSlice], pods: Iterable[Mapping[str, Any]], gpunodes: Iterable[GPUNode]
) -> Held:
    """The MIG instances taken: by a Bound MIG slice (its recorded instance), by a pod not finished
    (its assignment's MIG grants), or by an allocation an agent reported (``migInstance``)."""
    held: set[tuple[str, int]] = set()
    for s in slices:
        st = s.status
        taken = None if st is None else slice_instance(st.phase, st.gpu_uuids, st.mig_start)
        if taken is not None:
            held.add(taken)
    for pod in pods:
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        if not raw or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            doc = c.decode_assignment(raw)
        except c.AssignmentError:
            continue
        held.update(
            (g.uuid, g.mig_start)
            for ctr in doc.containers.values()
            for g in ctr.gpus
            if g.mig_start is not None
        )
    for gn in gpunodes:
        for gpu in (gn.status.gpus or ()) if gn.status else ():
            starts = {i.uuid: i.start for i in gpu.mig_instances or () if i.uuid and i.start is not None}
            for alloc in gpu.allocations or ():
                start = starts.get(alloc.mig_instance) if alloc.mig_instance else None
                if start is not None:
                    held.add((gpu.uuid, start))
    return frozenset(held)


def _pinned_out(spec: GPUSliceSpec, inst: MigInstanceChoice) -> bool:
    """Whether the slice's pins rule `inst` out (``gpuUUID`` names the GPU or the instance itself)."""
    if spec.node_name and inst.node != spec.node_name:
        return True
    return bool(spec.gpu_uuid) and spec.gpu_uuid not in (inst.gpu_uuid, inst.uuid)


def choose_mig_instance(
    spec: GPUSliceSpec, instances: Sequence[MigInstanceChoice], held: Held
) -> MigInstanceChoice | None:
    """The instance a MIG slice of `spec` is bound to: the first reported instance (node, GPU, start
    slot order) of the slice's profile that nothing holds, within its ``nodeName``/``gpuUUID`` pins."""
    if spec.mig_profile is None:
        return None
    profile = normalize_profile_name(spec.mig_profile)
    for inst in instances:
        if (
            inst.profile == profile
            and (inst.gpu_uuid, inst.start) not in held
            and not _pinned_out(spec, inst)
        ):
            return inst
    return None


def idle_instances_note(spec: GPUSliceSpec) -> str:
    """The Pending message of a MIG slice no idle instance serves."""
    if spec.gpu_uuid and spec.gpu_uuid.startswith("MIG-"):
        return (
            f"MIG instance {spec.gpu_uuid} on node {spec.node_name} is not an idle {spec.mig_profile}: "
            "not reported, or held by a pod or slice; the slice binds when it is free"
        )
    where = f" on node {spec.node_name}" if spec.node_name else ""
    if spec.gpu_uuid:
        where += f" GPU {spec.gpu_uuid}"
    return (
        f"no idle MIG instance {spec.mig_profile}{where}: none reported, or all held by pods and slices; "
        "the MIG layout controller plans one, and the slice binds once the node's agent reports it"
    )


def mig_reserved(spec: GPUSliceSpec, inst: MigInstanceChoice, gpu_model: str) -> dict[str, Any]:
    """The status fields of a MIG slice Bound to `inst`: the instance (what the extender counts),
    its memory (the reported size, else the catalog's), compute 100 % (the instance is isolated)."""
    memory = inst.memory_mib
    if not memory:
        try:
            memory = catalog_for(gpu_model).profile(inst.profile).memory_mib
        except (UnsupportedGpuError, KeyError):
            memory = None
    fields: dict[str, Any] = {
        "node": inst.node,
        "gpuUUIDs": [inst.gpu_uuid],
        "migProfile": inst.profile,
        "migStart": inst.start,
        "computePercent": 100,
        "qosClass": spec.qos_class,
    }
    if memory:
        fields["memoryMiB"] = memory
    if inst.uuid:
        fields["migInstanceUUID"] = inst.uuid
    return fields


def mig_instances_seen(
    gpunode: Mapping[str, Any],
) -> tuple[tuple[str, tuple[Any, ...], tuple[str, ...]], ...]:
    """What of a GPUNode object decides which MIG instances are idle: per GPU its reported instances
    and the instances its allocations hold. A change (a relayout landed, a pod's instance freed) may
    let a Pending MIG slice bind; heartbeats and other status changes do not change it."""
    out = []
    for gpu in (gpunode.get("status") or {}).get("gpus") or ():
        instances = tuple(
            sorted(
                (str(i.get("profile")), i.get("start") or -1, str(i.get("uuid")))
                for i in gpu.get("migInstances") or ()
            )
        )
        held = tuple(
            sorted(str(a.get("migInstance")) for a in gpu.get("allocations") or () if a.get("migInstance"))
        )
        out.append((str(gpu.get("uuid")), instances, held))
    return tuple(sorted(out))


def waits_for_mig_instance(obj: Mapping[str, Any]) -> bool:
    """Whether a GPUSlice object is a MIG slice not yet bound and not being deleted."""
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    return (
        bool((obj.get("spec") or {}).get("migProfile"))
        and phase == "Pending"
        and not ((obj.get("metadata") or {}).get("deletionTimestamp"))
    )
