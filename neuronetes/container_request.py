"""One container's NeuroNetes resources, read from its spec and checked on their own.

The first half of `neuronetes.assignment`'s reading of a pod (wire semantics there and in
docs/contracts.md "Resources"): `read_container` turns one container's ``resources`` into a
`ContainerAsk` and refuses what no pod may ask for (requests != limits, a non-integer amount,
an unknown ``neuronetes.io/*`` resource or MIG profile, two kinds of GPU in one container, a
shared slice without its memory or compute). How the containers of a pod combine is
`neuronetes.assignment.pod_gpu_request`'s; the types it returns live here, so that
`neuronetes.assigned_gpus` (the other direction) reads them without importing the pod reader.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.mig import catalogs, is_valid_profile_name, normalize_profile_name
from neuronetes.model import PodRequest
from neuronetes.quantity import QuantityError, parse_quantity, to_mib, to_milli

__all__ = [
    "ContainerAsk",
    "ContainerGpuRequest",
    "ContainerRole",
    "GpuKind",
    "PodGpuRequest",
    "ResourceRequestError",
    "as_mapping",
    "read_container",
]

_KNOWN_SCALARS: Final = (c.RESOURCE_GPU, c.RESOURCE_GPU_MEMORY, c.RESOURCE_GPU_COMPUTE)
_CPU: Final = "cpu"
_MEMORY: Final = "memory"


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
class ContainerAsk:
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


def as_mapping(value: object, where: str) -> Mapping[str, Any]:
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


def read_container(spec: Mapping[str, Any], role: ContainerRole) -> ContainerAsk:
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ResourceRequestError(f"a {role.value} container has no name")
    resources = as_mapping(spec.get("resources"), _where(name, "resources"))
    requests = as_mapping(resources.get("requests"), _where(name, "resources.requests"))
    limits = as_mapping(resources.get("limits"), _where(name, "resources.limits"))

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

    ask = ContainerAsk(
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


def _check_container(ask: ContainerAsk) -> None:
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
