"""Engine output -> the `neuronetes.io/assigned-gpus` document: which container gets which GPU.

The second direction of `neuronetes.assignment` (re-exported there): `build_assignment` turns
the engine's `Placement` for a pod (a node and its `GpuGrant`s) into the per-container
`neuronetes.contracts.Assignment` the extender writes into the Binding, handing GPUs out the
way the containers run; `visible_devices_annotations` is its fallback for nodes without NRI.
"""

from __future__ import annotations

from neuronetes import contracts as c
from neuronetes.container_request import ContainerRole, GpuKind, PodGpuRequest
from neuronetes.mig import UnsupportedGpuError, catalog_for
from neuronetes.model import MILLI_PER_GPU, GpuGrant, NodeSpec, Placement

__all__ = ["build_assignment", "visible_devices_annotations"]


def _gpu_entry(node: NodeSpec, grant: GpuGrant, *, memory_mib: int, compute_percent: int) -> c.GpuAssignment:
    gpu = node.gpus[grant.gpu_index]
    return c.GpuAssignment(
        uuid=gpu.uuid,
        index=gpu.index,
        memory_mib=memory_mib,
        compute_percent=compute_percent,
        mig_profile=grant.mig_profile,
        mig_start=grant.mig_start,
    )


def _mig_memory_mib(node: NodeSpec, grant: GpuGrant) -> int:
    if grant.mig_profile is None:
        raise ValueError(f"gpu {grant.gpu_index}: not a MIG grant")
    try:
        return catalog_for(node.gpus[grant.gpu_index].model).profile(grant.mig_profile).memory_mib
    except (UnsupportedGpuError, KeyError) as exc:
        if grant.memory_mib > 0:
            return grant.memory_mib
        raise ValueError(f"cannot size MIG instance {grant.mig_profile}: {exc}") from None


def build_assignment(
    placement: Placement,
    node: NodeSpec,
    pod: PodGpuRequest,
    *,
    qos: c.QoS = c.QoS.GUARANTEED,
    priority: int | None = None,
    gang: c.GangAssignment | None = None,
    pod_uid: str | None = None,
) -> c.Assignment:
    """The `neuronetes.io/assigned-gpus` document for the engine's placement of `pod` on `node`.

    GPUs are handed out the way the containers run: sidecars take GPUs in declaration order
    and keep them; an init container takes the GPUs after the sidecars declared before it
    (it runs beside those, then exits); app containers take the GPUs after all sidecars. A
    shared slice's containers all get the one granted GPU, each with its own memory limit and
    compute share; a MIG instance goes to every container that asked for it (only one of them
    can be running at a time, `pod_gpu_request` checked that).

    Args:
        placement: the engine's decision for `pod.request` (its `node` must be `node.name`).
        node: the node's spec; GPU UUIDs come from ``node.gpus[i].uuid``.
        pod: what `pod_gpu_request` read from the pod.
        qos: the QoS class every container's slice gets.
        priority: default: the request's priority (the pod's ``spec.priority``).
        gang: the gang the pod was placed with, if any.
        pod_uid: the pod's UID, recorded so the agent can refuse a copied annotation.

    Raises:
        ValueError: the placement does not match the node or the request.
        neuronetes.contracts.AssignmentError: the result would not validate (e.g. a GPU UUID that
            is not NVML's format, as in hand-written fixtures).
    """
    if placement.node != node.name:
        raise ValueError(f"placement is on node {placement.node!r}, not {node.name!r}")
    grants = placement.grants
    for grant in grants:
        if not 0 <= grant.gpu_index < len(node.gpus):
            raise ValueError(
                f"grant for GPU {grant.gpu_index}, but node {node.name!r} has {len(node.gpus)} GPUs"
            )
    if len(grants) != pod.request.gpus:
        raise ValueError(f"placement grants {len(grants)} GPUs, the pod needs {pod.request.gpus}")
    prio = pod.request.priority if priority is None else priority

    containers: dict[str, c.ContainerAssignment] = {}
    if pod.kind is GpuKind.WHOLE:
        if any(g.mig_profile is not None for g in grants):
            raise ValueError("a whole-GPU request was granted a MIG instance")
        entries = [
            _gpu_entry(
                node, g, memory_mib=g.memory_mib or node.gpus[g.gpu_index].memory_mib, compute_percent=100
            )
            for g in grants
        ]
        sidecar_end = sum(r.request.gpus for r in pod.containers if r.role is ContainerRole.SIDECAR)
        sidecars = 0
        apps = sidecar_end
        for r in pod.containers:
            n = r.request.gpus
            if r.role is ContainerRole.SIDECAR:
                start, sidecars = sidecars, sidecars + n
            elif r.role is ContainerRole.INIT:
                start = sidecars
            else:
                start, apps = apps, apps + n
            if start + n > len(entries):
                raise ValueError(
                    f"container {r.name!r} needs GPUs {start}..{start + n - 1}, only {len(entries)} granted"
                )
            containers[r.name] = c.ContainerAssignment(
                gpus=tuple(entries[start : start + n]), priority=prio, qos=qos
            )
    elif pod.kind is GpuKind.SHARED:
        (grant,) = grants
        if grant.mig_profile is not None:
            raise ValueError("a shared-slice request was granted a MIG instance")
        for r in pod.containers:
            milli, memory = r.request.gpu_milli, r.request.gpu_memory_mib
            if milli % (MILLI_PER_GPU // 100):
                raise ValueError(f"container {r.name!r}: compute {milli} milli-GPU is not a whole percent")
            if (grant.milli and milli > grant.milli) or (grant.memory_mib and memory > grant.memory_mib):
                raise ValueError(f"container {r.name!r} asks for more than the pod's grant {grant}")
            entry = _gpu_entry(
                node, grant, memory_mib=memory, compute_percent=milli // (MILLI_PER_GPU // 100)
            )
            containers[r.name] = c.ContainerAssignment(gpus=(entry,), priority=prio, qos=qos)
    else:
        (grant,) = grants
        if grant.mig_profile != pod.request.mig_profile or grant.mig_start is None:
            raise ValueError(f"request for MIG {pod.request.mig_profile} was granted {grant}")
        entry = _gpu_entry(node, grant, memory_mib=_mig_memory_mib(node, grant), compute_percent=100)
        for r in pod.containers:
            containers[r.name] = c.ContainerAssignment(gpus=(entry,), priority=prio, qos=qos)

    assignment = c.Assignment(
        version=c.ASSIGNMENT_SCHEMA_VERSION, node=node.name, containers=containers, gang=gang, pod_uid=pod_uid
    )
    c.encode_assignment(assignment)  # validates: never hand out a document the node would refuse
    return assignment


def visible_devices_annotations(assignment: c.Assignment) -> dict[str, str]:
    """The fallback annotations for nodes without NRI: per container, its GPU UUIDs, comma-separated.

    A pod's ``NVIDIA_VISIBLE_DEVICES`` env then comes from
    ``fieldRef: metadata.annotations['neuronetes.io/visible-devices-<container>']``. Containers with
    a MIG instance (whose ``MIG-…`` UUID only the node knows) and names too long for an annotation
    key are left out: on a fallback node they get no GPU.
    """
    out: dict[str, str] = {}
    for name, container in assignment.containers.items():
        key = c.ANNOTATION_VISIBLE_DEVICES_PREFIX + name
        if len(key) - len(c.RESOURCE_PREFIX) > 63 or any(g.mig_profile for g in container.gpus):
            continue
        out[key] = ",".join(dict.fromkeys(g.uuid for g in container.gpus))
    return out
