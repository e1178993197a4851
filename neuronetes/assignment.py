"""Wire <-> core translation for GPU pods: pod spec -> `PodRequest`, engine `Placement` -> annotation.

Two directions, both pure:

* `pod_gpu_request` reads the NeuroNetes extended resources of a pod spec (a dict, as the API
  server sends it) per container and combines them the way Kubernetes combines container
  requests into a pod's effective request, giving the `PodRequest` the engine places plus
  each container's own ask.
* `build_assignment` turns the engine's decision for that pod (`Placement`: a node and
  `GpuGrant`s) into the per-container `neuronetes.contracts.Assignment` the extender writes
  into the Binding (`neuronetes.io/assigned-gpus`).

Wire semantics (docs/contracts.md "Resources"): a container asks either for whole GPUs
(`neuronetes.io/gpu: N`), or for a slice of one GPU (`neuronetes.io/gpu-memory: MiB` together
with `neuronetes.io/gpu-compute: percent`), or for one MIG instance
(`neuronetes.io/mig-<profile>: 1`); never two of these at once, and all containers of a pod ask
for the same kind. Every value is what the container consumes in total, so the node-level
totals the agent advertises are charged exactly what the pod uses.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.mig import (
    UnsupportedGpuError,
    catalog_for,
    catalogs,
    is_valid_profile_name,
    normalize_profile_name,
)
from neuronetes.model import MILLI_PER_GPU, GpuGrant, Locality, NodeSpec, Placement, PodRequest
from neuronetes.quantity import QuantityError, parse_quantity, to_mib, to_milli

__all__ = [
    "ContainerGpuRequest",
    "ContainerRole",
    "GpuKind",
    "PodGpuRequest",
    "ResourceRequestError",
    "build_assignment",
    "effective_request",
    "gang_of",
    "pod_gpu_request",
    "visible_devices_annotations",
]

_KNOWN_SCALARS: Final = (c.RESOURCE_GPU, c.RESOURCE_GPU_MEMORY, c.RESOURCE_GPU_COMPUTE)
_CPU: Final = "cpu"
_MEMORY: Final = "memory"
_POSITIVE_INT: Final = re.compile(r"[1-9][0-9]{0,8}")


class ResourceRequestError(ValueError):
    """A pod's NeuroNetes resource request that cannot be served as written."""


class ContainerRole(enum.StrEnum):
    """How a container runs relative to the others (what decides how requests combine)."""

    INIT = "init"  # runs to completion before the next init container and the app containers
    SIDECAR = "sidecar"  # an init container with restartPolicy: Always: runs beside the app
    APP = "app"


class GpuKind(enum.StrEnum):
    """What a container (and hence its pod) asks for."""

    WHOLE = "whole"  # neuronetes.io/gpu: N exclusive GPUs
    SHARED = "shared"  # gpu-memory + gpu-compute: a slice of one GPU
    MIG = "mig"  # neuronetes.io/mig-<profile>: one MIG instance


@dataclass(frozen=True, slots=True)
class ContainerGpuRequest:
    """One container's own NeuroNetes ask (`request.name` is the container name)."""

    name: str
    role: ContainerRole
    kind: GpuKind
    request: PodRequest


@dataclass(frozen=True, slots=True)
class PodGpuRequest:
    """A pod's GPU ask: the effective request the engine places, and each container's share of it.

    `containers` lists only the containers that ask for NeuroNetes resources, init containers
    (sidecars included) first, each group in spec order — the order `build_assignment` hands
    out GPUs in.
    """

    request: PodRequest
    kind: GpuKind
    containers: tuple[ContainerGpuRequest, ...]


@dataclass(frozen=True, slots=True)
class _Ask:
    """Parsed resources of one container."""

    name: str
    role: ContainerRole
    cpu_milli: int
    memory_mib: int
    gpu: int
    gpu_memory_mib: int
    gpu_compute: int
    mig: dict[str, int]  # canonical profile -> instances

    @property
    def kind(self) -> GpuKind | None:
        if self.mig:
            return GpuKind.MIG
        if self.gpu:
            return GpuKind.WHOLE
        if self.gpu_memory_mib or self.gpu_compute:
            return GpuKind.SHARED
        return None


@functools.cache
def _known_profiles() -> frozenset[str]:
    return frozenset(name for catalog in catalogs() for name in catalog.names)


def _where(container: str, resource: str | None = None) -> str:
    return f"container {container!r}" + (f": {resource}" if resource else "")


def _integer(value: object, where: str) -> int:
    """An extended-resource quantity as a non-negative integer (Kubernetes' rule for them)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ResourceRequestError(f"{where}: {value!r} is not a quantity")
    try:
        q = parse_quantity(value)
    except (QuantityError, ValueError) as exc:
        raise ResourceRequestError(f"{where}: {value!r} is not a quantity ({exc})") from None
    if q.denominator != 1:
        raise ResourceRequestError(
            f"{where}: {value!r} is not an integer; extended resources are whole numbers"
        )
    if q < 0:
        raise ResourceRequestError(f"{where}: {value!r} is negative")
    return int(q)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ResourceRequestError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _standard(requests: Mapping[str, Any], limits: Mapping[str, Any], key: str, where: str) -> Fraction:
    # Kubernetes defaults a missing request to the limit.
    value = requests.get(key, limits.get(key))
    if value is None:
        return Fraction(0)
    try:
        return parse_quantity(value)
    except (QuantityError, ValueError, TypeError) as exc:
        raise ResourceRequestError(f"{_where(where, key)}: {value!r} is not a quantity ({exc})") from None


def _parse_container(spec: Mapping[str, Any], role: ContainerRole) -> _Ask:
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ResourceRequestError(f"a {role.value} container has no name")
    resources = _mapping(spec.get("resources"), _where(name, "resources"))
    requests = _mapping(resources.get("requests"), _where(name, "resources.requests"))
    limits = _mapping(resources.get("limits"), _where(name, "resources.limits"))

    ours: dict[str, int] = {}
    for key in sorted({*requests, *limits}):
        if not isinstance(key, str) or not key.startswith(c.RESOURCE_PREFIX):
            continue
        where = _where(name, key)
        if key not in limits:
            raise ResourceRequestError(
                f"{where}: set in requests but not in limits; extended resources are asked with limits "
                "(requests, if given, must equal them)"
            )
        limit = _integer(limits[key], f"{where} (limits)")
        if key in requests:
            request = _integer(requests[key], f"{where} (requests)")
            if request != limit:
                raise ResourceRequestError(
                    f"{where}: requests ({request}) != limits ({limit}); "
                    "extended resources need requests == limits"
                )
        ours[key] = limit

    mig: dict[str, int] = {}
    for key, value in ours.items():
        if key in _KNOWN_SCALARS:
            continue
        if key.startswith(c.RESOURCE_MIG_PREFIX):
            profile = normalize_profile_name(key)
            if not is_valid_profile_name(profile) or profile not in _known_profiles():
                raise ResourceRequestError(
                    f"{_where(name, key)}: {key[len(c.RESOURCE_MIG_PREFIX) :]!r} is not a MIG profile of any "
                    "modelled GPU (e.g. neuronetes.io/mig-1g.5gb, neuronetes.io/mig-1g.10gb.me)"
                )
            if value:
                mig[profile] = mig.get(profile, 0) + value
            continue
        known = ", ".join((*_KNOWN_SCALARS, c.RESOURCE_MIG_PREFIX + "<profile>"))
        raise ResourceRequestError(f"{_where(name, key)}: unknown NeuroNetes resource (known: {known})")

    foreign = [k for k in (*requests, *limits) if k in c.FOREIGN_GPU_RESOURCES]
    if foreign and any(ours.values()):
        raise ResourceRequestError(
            f"{_where(name, foreign[0])}: NeuroNetes pods never ask for {foreign[0]}; "
            "ask with neuronetes.io/* resources only"
        )

    ask = _Ask(
        name=name,
        role=role,
        cpu_milli=to_milli(_standard(requests, limits, _CPU, name)),
        memory_mib=to_mib(_standard(requests, limits, _MEMORY, name)),
        gpu=ours.get(c.RESOURCE_GPU, 0),
        gpu_memory_mib=ours.get(c.RESOURCE_GPU_MEMORY, 0),
        gpu_compute=ours.get(c.RESOURCE_GPU_COMPUTE, 0),
        mig=mig,
    )
    _check_container(ask)
    return ask


def _check_container(ask: _Ask) -> None:
    where = _where(ask.name)
    shared = bool(ask.gpu_memory_mib or ask.gpu_compute)
    if ask.mig and ask.gpu:
        raise ResourceRequestError(
            f"{where}: mixes MIG instances with whole GPUs ({c.RESOURCE_GPU}); ask for one"
        )
    if ask.mig and shared:
        raise ResourceRequestError(
            f"{where}: mixes MIG instances with a shared slice (gpu-memory/gpu-compute); ask for one"
        )
    if len(ask.mig) > 1:
        raise ResourceRequestError(f"{where}: asks for several MIG profiles ({', '.join(sorted(ask.mig))})")
    if any(n > 1 for n in ask.mig.values()):
        raise ResourceRequestError(f"{where}: asks for more than one MIG instance; a pod gets at most one")
    if ask.gpu and shared:
        raise ResourceRequestError(
            f"{where}: {c.RESOURCE_GPU} asks for whole GPUs and cannot be combined with "
            f"{c.RESOURCE_GPU_MEMORY}/{c.RESOURCE_GPU_COMPUTE}; a shared slice of one GPU is asked with "
            "those two alone"
        )
    if shared and not (ask.gpu_memory_mib and ask.gpu_compute):
        missing = c.RESOURCE_GPU_COMPUTE if ask.gpu_memory_mib else c.RESOURCE_GPU_MEMORY
        raise ResourceRequestError(
            f"{where}: a shared GPU slice needs both {c.RESOURCE_GPU_MEMORY} (MiB) and "
            f"{c.RESOURCE_GPU_COMPUTE} (percent); {missing} is missing"
        )
    if ask.gpu_compute > 100:
        raise ResourceRequestError(
            f"{where}: {c.RESOURCE_GPU_COMPUTE} {ask.gpu_compute} is more than one GPU (100); "
            f"ask for whole GPUs with {c.RESOURCE_GPU}"
        )
    if ask.gpu_memory_mib > c.MAX_GPU_MEMORY_MIB:
        raise ResourceRequestError(f"{where}: {c.RESOURCE_GPU_MEMORY} {ask.gpu_memory_mib} MiB is not a GPU")
    if ask.gpu > c.MAX_GPUS_PER_CONTAINER:
        raise ResourceRequestError(f"{where}: {c.RESOURCE_GPU} {ask.gpu} is more than any node has")


def effective_request(amounts: Iterable[tuple[ContainerRole, int]]) -> int:
    """Kubernetes' effective pod request of one resource (k8s.io/component-helpers PodRequests).

    `amounts`: each container's role and amount, init containers (sidecars included) in spec
    order. App containers and sidecars run together, so they add up; an init container runs
    beside the sidecars declared before it; the pod needs the largest of those moments. (The
    pod's ``spec.overhead`` comes on top; the caller adds it.) The one place this rule lives.
    """
    app = 0
    sidecars = 0
    init_peak = 0
    for role, amount in amounts:
        if role is ContainerRole.APP:
            app += amount
        elif role is ContainerRole.SIDECAR:
            app += amount
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, amount + sidecars)
    return max(app, init_peak)


def _effective(asks: Sequence[_Ask], value: Callable[[_Ask], int]) -> int:
    return effective_request((a.role, value(a)) for a in asks)


def _container_request(ask: _Ask, priority: int) -> PodRequest:
    kind = ask.kind
    base: dict[str, Any] = {
        "name": ask.name,
        "cpu_milli": ask.cpu_milli,
        "memory_mib": ask.memory_mib,
        "priority": priority,
    }
    if kind is GpuKind.WHOLE:
        return PodRequest(**base, gpus=ask.gpu)
    if kind is GpuKind.SHARED:
        return PodRequest(
            **base,
            gpus=1,
            gpu_milli=ask.gpu_compute * (MILLI_PER_GPU // 100),
            gpu_memory_mib=ask.gpu_memory_mib,
        )
    (profile,) = ask.mig
    return PodRequest(**base, gpus=1, mig_profile=profile)


def _topology(pod: Mapping[str, Any]) -> tuple[Locality, float]:
    """The locality and minimum NVLink bandwidth a Pod object's annotations ask for."""
    if "spec" not in pod or "containers" in pod:
        return Locality.ANY, 0.0
    meta = _mapping(pod.get("metadata"), "metadata")
    annotations = _mapping(meta.get("annotations"), "metadata.annotations")
    raw = annotations.get(c.ANNOTATION_LOCALITY)
    try:
        locality = Locality.parse(raw if isinstance(raw, str) else None)
    except ValueError as exc:
        raise ResourceRequestError(f"annotation {c.ANNOTATION_LOCALITY}: {exc}") from None
    if raw is not None and not isinstance(raw, str):
        raise ResourceRequestError(f"annotation {c.ANNOTATION_LOCALITY}: {raw!r} is not a string")
    bandwidth = 0.0
    raw_bw = annotations.get(c.ANNOTATION_MIN_BANDWIDTH)
    if raw_bw is not None:
        try:
            bandwidth = float(raw_bw)
        except (TypeError, ValueError):
            bandwidth = -1.0
        if not (0.0 <= bandwidth < 1e6) or bandwidth != bandwidth:
            raise ResourceRequestError(
                f"annotation {c.ANNOTATION_MIN_BANDWIDTH}: {raw_bw!r} is not a non-negative number of GB/s"
            )
    return locality, bandwidth


def _pod_parts(pod: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    if "spec" in pod and "containers" not in pod:
        spec = _mapping(pod["spec"], "spec")
        meta = _mapping(pod.get("metadata"), "metadata")
        namespace, name = meta.get("namespace") or "", meta.get("name") or meta.get("generateName") or ""
        return spec, f"{namespace}/{name}" if namespace else str(name)
    return pod, ""


def pod_gpu_request(pod: Mapping[str, Any], *, name: str | None = None) -> PodGpuRequest | None:
    """The NeuroNetes GPU request of a pod (or of a bare pod spec); None when it asks for none.

    Args:
        pod: a Pod object (``{"metadata": …, "spec": …}``) or its ``spec``, as JSON-decoded dicts.
        name: the request's name (default: ``namespace/name`` of a Pod object, else ``""``).

    Returns:
        The effective request the engine places (`PodGpuRequest.request`, with the pod's CPU and
        memory and ``spec.priority``) and each GPU-asking container's own request.

    Raises:
        ResourceRequestError: requests != limits, a non-integer or negative amount, an unknown
            ``neuronetes.io/*`` resource, a MIG profile that does not exist, whole GPUs mixed with
            MIG or with a shared slice (in a container or across the pod), a shared slice missing
            its memory or compute, concurrent slices adding up to more than one GPU, more than
            one MIG instance, ``nvidia.com/gpu`` next to NeuroNetes resources, two containers of
            one name. The message names the container and the resource.
    """
    spec, default_name = _pod_parts(pod)
    request_name = default_name if name is None else name
    priority = spec.get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ResourceRequestError(f"spec.priority: {priority!r} is not an integer")

    asks: list[_Ask] = []
    for field, app in (("initContainers", False), ("containers", True)):
        items = spec.get(field) or []
        if not isinstance(items, Sequence) or isinstance(items, str | bytes):
            raise ResourceRequestError(f"spec.{field}: expected a list")
        for item in items:
            container = _mapping(item, f"spec.{field}[]")
            if app:
                role = ContainerRole.APP
            elif container.get("restartPolicy") == "Always":
                role = ContainerRole.SIDECAR
            else:
                role = ContainerRole.INIT
            ask = _parse_container(container, role)
            if any(a.name == ask.name for a in asks):
                raise ResourceRequestError(
                    f"container name {ask.name!r} is used twice (containers and initContainers share "
                    "one namespace); each container needs its own name for its gpu assignment"
                )
            asks.append(ask)

    gpu_asks = [a for a in asks if a.kind is not None]
    if not gpu_asks:
        return None
    kinds = {a.kind for a in gpu_asks if a.kind is not None}
    if len(kinds) > 1:
        first_of: dict[GpuKind, str] = {}
        for a in gpu_asks:
            if a.kind is not None:
                first_of.setdefault(a.kind, a.name)
        detail = ", ".join(f"{name!r} asks for {kind_.value}" for kind_, name in first_of.items())
        raise ResourceRequestError(
            f"the containers of one pod must ask for the same kind of GPU resource (whole GPUs, a shared "
            f"slice or a MIG instance): {detail}"
        )
    (kind,) = kinds

    cpu = _effective(asks, lambda a: a.cpu_milli)
    memory = _effective(asks, lambda a: a.memory_mib)
    locality, bandwidth = _topology(pod)
    base: dict[str, Any] = {
        "name": request_name,
        "cpu_milli": cpu,
        "memory_mib": memory,
        "priority": priority,
        "locality": locality,
        "min_bandwidth_gbps": bandwidth,
    }
    if kind is GpuKind.WHOLE:
        effective = PodRequest(**base, gpus=_effective(asks, lambda a: a.gpu))
    elif kind is GpuKind.SHARED:
        compute = _effective(asks, lambda a: a.gpu_compute)
        if compute > 100:
            raise ResourceRequestError(
                f"the shared slices of containers that run at the same time add up to {compute}% of one GPU; "
                f"a pod's slices share one GPU (at most 100%), ask for whole GPUs with {c.RESOURCE_GPU}"
            )
        effective = PodRequest(
            **base,
            gpus=1,
            gpu_milli=compute * (MILLI_PER_GPU // 100),
            gpu_memory_mib=_effective(asks, lambda a: a.gpu_memory_mib),
        )
    else:
        profiles = sorted({p for a in gpu_asks for p in a.mig})
        if len(profiles) > 1:
            raise ResourceRequestError(
                f"the pod's containers ask for different MIG profiles: {', '.join(profiles)}"
            )
        instances = _effective(asks, lambda a: sum(a.mig.values()))
        if instances > 1:
            raise ResourceRequestError(
                f"the pod's containers would hold {instances} MIG instances at once; a pod gets at most one"
            )
        effective = PodRequest(**base, gpus=1, mig_profile=profiles[0])

    containers = tuple(
        ContainerGpuRequest(a.name, a.role, kind, _container_request(a, priority)) for a in gpu_asks
    )
    return PodGpuRequest(effective, kind, containers)


# ---- engine output -> assignment ---------------------------------------------------------------


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


def gang_of(pod: Mapping[str, Any]) -> tuple[str, str, int | None] | None:
    """The gang a pod belongs to: ``(key, name, size)`` or None.

    Keys, first match wins: the label `neuronetes.io/gang` (size from the label
    `neuronetes.io/gang-size`), the scheduler-plugins label `scheduling.x-k8s.io/pod-group`,
    the Volcano annotation `scheduling.k8s.io/group-name` (for the last two the size is the
    PodGroup object's ``minMember``: `size` is None).

    Raises:
        ResourceRequestError: `neuronetes.io/gang-size` is not a positive integer.
    """
    meta = _mapping(pod.get("metadata"), "metadata")
    labels = _mapping(meta.get("labels"), "metadata.labels")
    annotations = _mapping(meta.get("annotations"), "metadata.annotations")
    for key in c.GANG_KEYS:
        source = annotations if key == c.ANNOTATION_GROUP_NAME_VOLCANO else labels
        name = source.get(key)
        if not name:
            continue
        size: int | None = None
        if key == c.LABEL_GANG:
            raw = labels.get(c.LABEL_GANG_SIZE)
            if raw is not None:
                if not (isinstance(raw, str) and _POSITIVE_INT.fullmatch(raw)):
                    raise ResourceRequestError(
                        f"label {c.LABEL_GANG_SIZE}: {raw!r} is not a positive integer"
                    )
                size = int(raw)
        return key, str(name), size
    return None
