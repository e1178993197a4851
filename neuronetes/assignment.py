"""Wire <-> core translation for GPU pods: pod spec -> `PodRequest`, engine `Placement` -> annotation.

Two directions, both pure (each in a module of its own, re-exported here so callers import
from this one):

* `pod_gpu_request` reads the NeuroNetes extended resources of a pod spec (a dict, as the API
  server sends it) per container and combines them the way Kubernetes combines container
  requests into a pod's effective request, giving the `PodRequest` the engine places plus
  each container's own ask. One container's resources are read and checked in
  `neuronetes.container_request`; how a pod's containers combine is here.
* `build_assignment` turns the engine's decision for that pod (`Placement`: a node and
  `GpuGrant`s) into the per-container `neuronetes.contracts.Assignment` the extender writes
  into the Binding (`neuronetes.io/assigned-gpus`); it lives in `neuronetes.assigned_gpus`.

Wire semantics (docs/contracts.md "Resources"): a container asks either for whole GPUs
(`neuronetes.io/gpu: N`), or for a slice of one GPU (`neuronetes.io/gpu-memory: MiB` together
with `neuronetes.io/gpu-compute: percent`), or for one MIG instance
(`neuronetes.io/mig-<profile>: 1`); never two of these at once, and all containers of a pod ask
for the same kind. Every value is what the container consumes in total, so the node-level
totals the agent advertises are charged exactly what the pod uses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.assigned_gpus import build_assignment, visible_devices_annotations
from neuronetes.container_request import (
    ContainerAsk,
    ContainerGpuRequest,
    ContainerRole,
    GpuKind,
    PodGpuRequest,
    ResourceRequestError,
    as_mapping,
    read_container,
)
from neuronetes.locality import LocalityError, request_fields
from neuronetes.model import MILLI_PER_GPU, Locality, PodRequest
from neuronetes.modelcache import hit_entries

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

_POSITIVE_INT: Final = re.compile(r"[1-9][0-9]{0,8}")


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


def _effective(asks: Sequence[ContainerAsk], value: Callable[[ContainerAsk], int]) -> int:
    return effective_request((a.role, value(a)) for a in asks)


def _container_request(ask: ContainerAsk, priority: int) -> PodRequest:
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
    meta = as_mapping(pod.get("metadata"), "metadata")
    annotations = as_mapping(meta.get("annotations"), "metadata.annotations")
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


def _model_cache(pod: Mapping[str, Any]) -> tuple[str | None, tuple[str, ...], float | None]:
    """The model, the ``cachedModels`` entries that hold it for the pod (shared or of the pod's
    namespace: `modelcache.hit_entries`) and the model-cache weight a Pod object's annotations ask
    cache-aware scoring for (docs/model-cache.md): None, (), None unless
    `contracts.ANNOTATION_CACHE_HIT_WEIGHT` is set."""
    if "spec" not in pod or "containers" in pod:
        return None, (), None
    meta = as_mapping(pod.get("metadata"), "metadata")
    annotations = as_mapping(meta.get("annotations"), "metadata.annotations")
    raw = annotations.get(c.ANNOTATION_CACHE_HIT_WEIGHT)
    if raw is None:
        return None, (), None
    try:
        weight = float(raw)
    except (TypeError, ValueError):
        weight = -1.0
    if not 0.0 <= weight <= 1.0:
        raise ResourceRequestError(
            f"annotation {c.ANNOTATION_CACHE_HIT_WEIGHT}: {raw!r} is not a number from 0 to 1"
        )
    model = annotations.get(c.ANNOTATION_MODEL)
    if not isinstance(model, str) or not model:
        raise ResourceRequestError(
            f"annotation {c.ANNOTATION_CACHE_HIT_WEIGHT} needs the model in annotation {c.ANNOTATION_MODEL}"
        )
    namespace = meta.get("namespace")
    return model, hit_entries(model, namespace if isinstance(namespace, str) else None), weight


def _locality(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The data-locality and candidate-limit fields a Pod object's annotations ask for
    (`neuronetes.locality.request_fields`); none for a bare spec."""
    if "spec" not in pod or "containers" in pod:
        return {}
    meta = as_mapping(pod.get("metadata"), "metadata")
    try:
        return request_fields(as_mapping(meta.get("annotations"), "metadata.annotations"))
    except LocalityError as exc:
        raise ResourceRequestError(str(exc)) from None


def _pod_parts(pod: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    if "spec" in pod and "containers" not in pod:
        spec = as_mapping(pod["spec"], "spec")
        meta = as_mapping(pod.get("metadata"), "metadata")
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

    asks: list[ContainerAsk] = []
    for field, app in (("initContainers", False), ("containers", True)):
        items = spec.get(field) or []
        if not isinstance(items, Sequence) or isinstance(items, str | bytes):
            raise ResourceRequestError(f"spec.{field}: expected a list")
        for item in items:
            container = as_mapping(item, f"spec.{field}[]")
            if app:
                role = ContainerRole.APP
            elif container.get("restartPolicy") == "Always":
                role = ContainerRole.SIDECAR
            else:
                role = ContainerRole.INIT
            ask = read_container(container, role)
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
    model, cache_names, cache_weight = _model_cache(pod)
    base: dict[str, Any] = {
        "name": request_name,
        "cpu_milli": cpu,
        "memory_mib": memory,
        "priority": priority,
        "locality": locality,
        "min_bandwidth_gbps": bandwidth,
        "model_name": model,
        "model_cache_names": cache_names,
        "model_cache_weight": cache_weight,
        **_locality(pod),
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


def gang_of(pod: Mapping[str, Any]) -> tuple[str, str, int | None] | None:
    """The gang a pod belongs to: ``(key, name, size)`` or None.

    Keys, first match wins: the label `neuronetes.io/gang` (size from the label
    `neuronetes.io/gang-size`), the scheduler-plugins label `scheduling.x-k8s.io/pod-group`,
    the Volcano annotation `scheduling.k8s.io/group-name` (for the last two the size is the
    PodGroup object's ``minMember``: `size` is None).

    Raises:
        ResourceRequestError: `neuronetes.io/gang-size` is not a positive integer.
    """
    meta = as_mapping(pod.get("metadata"), "metadata")
    labels = as_mapping(meta.get("labels"), "metadata.labels")
    annotations = as_mapping(meta.get("annotations"), "metadata.annotations")
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
