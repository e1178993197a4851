"""Checks of NeuroNetes objects that need the MIG catalog, GPU models or the time-zone database.

The CRD schemas and their CEL rules refuse everything that can be said there (the API server's
message names the field); these are the rest, run by the admission webhook on CREATE and UPDATE.
Each check is a small named function in `AGENTPOOL_CHECKS` / `GPUSLICE_CHECKS`; each returns
messages that start with the field and say what to do. docs/webhook.md lists them.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from neuronetes.api.gpus import type_problem
from neuronetes.api.models import AgentPool, AgentPoolSpec, GPUSlice, GPUSliceSpec, PodTemplate, decode
from neuronetes.api.units import (
    MAX_GPU_MEMORY_GB,
    MAX_NVLINK_GBPS,
    bandwidth_gbps,
    gpu_memory_class_labels,
    nominal_nvlink_gbps,
    slice_memory_mib,
)
from neuronetes.mig import MigCatalog, catalogs, normalize_profile_name
from neuronetes.quantity import QuantityError, QuantityLike

from . import CONVERT_LOCK
from .admission import POD_CHECKS
from .pods import PoolTemplate, gang_name
from .policy import resolve

__all__ = ["AGENTPOOL_CHECKS", "GPUSLICE_CHECKS", "MAX_POOL_NAME", "review_object"]

MAX_POOL_NAME: Final = 50
"""Pods are named ``<pool>-<g>-<m>`` and gangs ``<pool>-<g>`` (a label value, at most 63)."""
MAX_LABEL_VALUE: Final = 63


def _catalogs_for_type(gpu_type: str | None) -> list[MigCatalog]:
    """The MIG catalogs of GPUs of `gpu_type` (all of them when unset); matched as the extender does:
    case-insensitively as a prefix of the model (A100 matches A100-40GB and A100-80GB)."""
    if gpu_type is None:
        return list(catalogs())
    t = gpu_type.upper().removeprefix("NVIDIA ").replace(" ", "-")
    return [
        cat
        for cat in catalogs()
        if cat.gpu_model.upper().startswith(t) or t.startswith(cat.gpu_model.upper())
    ]


def _mig_profile(where: str, profile: str | None, gpu_type: str | None) -> list[str]:
    if profile is None:
        return []
    name = normalize_profile_name(profile)
    offered = [cat for cat in catalogs() if name in cat.names]
    if not offered:
        known = sorted({n for cat in catalogs() for n in cat.names})
        return [f"{where}: {profile!r} is offered by no MIG-capable GPU; use one of {', '.join(known)}"]
    fitting = _catalogs_for_type(gpu_type)
    if not fitting:
        return [
            f"spec.gpuRequirements.type: {gpu_type!r} has no MIG support; unset migProfile or use A100/H100"
        ]
    if not any(name in cat.names for cat in fitting):
        theirs = sorted({n for cat in fitting for n in cat.names})
        return [f"{where}: {gpu_type} GPUs do not offer {profile!r}; they offer {', '.join(theirs)}"]
    return []


def _memory_bound(where: str, q: QuantityLike | None, *, exact: bool) -> list[str]:
    if q is None:
        return []
    try:
        too_big = slice_memory_mib(q) > MAX_GPU_MEMORY_GB * 1024 if exact else not gpu_memory_class_labels(q)
    except (QuantityError, ValueError, OverflowError) as exc:
        return [f"{where}: {q!r} is not a usable quantity ({exc}); write e.g. 40Gi"]
    if too_big:
        return [f"{where}: {q!r} is more memory than any GPU has (at most {MAX_GPU_MEMORY_GB}Gi)"]
    return []


def check_pool_type(spec: AgentPoolSpec) -> list[str]:
    """A type that names no GPU family NeuroNetes knows would match no node's
    ``neuronetes.io/gpu-type``: the pool's pods would stay Pending forever."""
    gpu_type = spec.gpu_requirements.type
    problem = None if gpu_type is None else type_problem(gpu_type)
    return [] if problem is None else [f"spec.gpuRequirements.type: {problem}"]


def check_pool_memory(spec: AgentPoolSpec) -> list[str]:
    return _memory_bound("spec.gpuRequirements.memory", spec.gpu_requirements.memory, exact=False)


def check_pool_mig(spec: AgentPoolSpec) -> list[str]:
    return _mig_profile("spec.migProfile", spec.mig_profile, spec.gpu_requirements.type)


def check_pool_bandwidth(spec: AgentPoolSpec) -> list[str]:
    req = spec.gpu_requirements
    bw = req.topology.min_bandwidth
    if bw is None:
        return []
    where = "spec.gpuRequirements.topology.minBandwidth"
    try:
        gbps = bandwidth_gbps(bw)
    except (QuantityError, ValueError, OverflowError) as exc:
        return [f"{where}: {bw!r} is not a usable quantity ({exc}); write e.g. 600Gi"]
    if gbps > MAX_NVLINK_GBPS:
        return [f"{where}: {bw!r} ({gbps:g} GB/s) is more than any GPU's NVLink ({MAX_NVLINK_GBPS:g} GB/s)"]
    if req.type is not None:
        nominal = nominal_nvlink_gbps(req.type)
        if nominal == 0.0:
            return [
                f"{where}: {req.type} GPUs have no NVLink; unset minBandwidth or choose an NVLink GPU type"
            ]
        if gbps > nominal:
            return [f"{where}: {bw!r} ({gbps:g} GB/s) is more than {req.type} NVLink ({nominal:g} GB/s)"]
    return []


def check_pool_time_zone(spec: AgentPoolSpec) -> list[str]:
    carbon = spec.scheduling.carbon_aware if spec.scheduling else None
    shifting = carbon.time_shifting if carbon else None
    if shifting is None:
        return []
    try:
        zoneinfo.ZoneInfo(shifting.time_zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return [
            f"spec.scheduling.carbonAware.timeShifting.timeZone: {shifting.time_zone!r} is not an IANA time "
            "zone; use a name such as Europe/Paris or UTC"
        ]
    return []


def check_pool_template(spec: AgentPoolSpec) -> list[str]:
    """The template's owned fields, then the pod checks on the pod the pool would create; the same
    for ``costOptimization.fallbackTemplate`` (the pods that serve the fallback model)."""
    out = _check_template(spec, spec.template, "spec.template", None)
    cost = spec.scheduling.cost_optimization if spec.scheduling else None
    if cost is not None and cost.fallback_template is not None:
        path = "spec.scheduling.costOptimization.fallbackTemplate"
        out += _check_template(spec, cost.fallback_template, path, cost.fallback_model)
    return out


def _check_template(
    spec: AgentPoolSpec, template: PodTemplate | None, path: str, model: str | None
) -> list[str]:
    out = []
    tspec = template.spec if template and template.spec else {}
    for key, what in (
        ("nodeName", "the NeuroNetes scheduler places the pool's pods (use a nodeSelector)"),
        ("schedulerName", "the operator sets neuronetes-scheduler"),
        ("priority", "use spec.scheduling.priorityTier (the cluster admin's tiers)"),
        ("priorityClassName", "use spec.scheduling.priorityTier (the cluster admin's tiers)"),
    ):
        if key in tspec:
            out.append(f"{path}.spec.{key}: must not be set; {what}")
    for i, ctr in enumerate(tspec.get("containers") or []):
        for part in ("limits", "requests"):
            for res in ((ctr or {}).get("resources") or {}).get(part) or {}:
                if str(res).startswith("neuronetes.io/") or res == "nvidia.com/gpu":
                    out.append(
                        f"{path}.spec.containers[{i}].resources.{part}[{res}]: must not be set; the "
                        "operator derives GPU resources from spec.gpuRequirements and spec.migProfile"
                    )
    if out:
        return out
    fake = {
        "metadata": {"name": "pool", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000000"}
    }
    # One pod, whatever the replica count: the pool's pods share this template and differ only in
    # name and gang labels, which no pod check reads (their lengths: `check_pool_names`). A pool
    # scaled to zero still has a template: its pod is checked the same.
    resolved = resolve(spec)
    pool_template = PoolTemplate(fake, spec, resolved, model=model)
    pod = pool_template.pod("pool-0-0" if resolved.gang_size else "pool-0", 0 if resolved.gang_size else None)
    pod["spec"].pop("schedulerName", None)
    for check in POD_CHECKS.values():
        out.extend(f"{path} ({m})" for m in check(pod))
    return out


def check_pool_names(name: str, spec: AgentPoolSpec) -> list[str]:
    """The longest name and gang label the pool's pods get, from the counts alone (no pod built):
    the last pod ``<pool>-<i>`` or ``<pool>-<g>-<m>``, the last gang's label ``<pool>-<g>``."""
    if len(name) > MAX_POOL_NAME:
        return [
            f"metadata.name: at most {MAX_POOL_NAME} characters for an AgentPool (its pods are named "
            "<pool>-<gang>-<member>); choose a shorter name"
        ]
    resolved = resolve(spec)
    if not resolved.gang_size or not resolved.gangs:
        return []
    label = gang_name(name, resolved.gangs - 1)
    if len(label) > MAX_LABEL_VALUE:
        return [
            f"metadata.name: the pool's last gang would be labelled {label!r} ({len(label)} characters), "
            f"longer than a label value may be ({MAX_LABEL_VALUE}); choose a shorter name or fewer gangs"
        ]
    return []


AGENTPOOL_CHECKS: Final[dict[str, Callable[[AgentPoolSpec], list[str]]]] = {
    "gpu-type": check_pool_type,
    "memory": check_pool_memory,
    "mig-profile": check_pool_mig,
    "bandwidth": check_pool_bandwidth,
    "time-zone": check_pool_time_zone,
    "template": check_pool_template,
}
"""Every AgentPool check, by name, in the order they run."""


def check_slice_memory(spec: GPUSliceSpec) -> list[str]:
    return _memory_bound("spec.memory", spec.memory, exact=True)


def check_slice_mig(spec: GPUSliceSpec) -> list[str]:
    return _mig_profile("spec.migProfile", spec.mig_profile, None)


GPUSLICE_CHECKS: Final[dict[str, Callable[[GPUSliceSpec], list[str]]]] = {
    "memory": check_slice_memory,
    "mig-profile": check_slice_mig,
}


def review_object(obj: Mapping[str, Any]) -> list[str]:
    """Refusals for an AgentPool, GPUSlice or ToolBinding (empty: allowed); thread-safe.

    Its cost does not grow with the pool's replica count: one pod is built and checked
    (`check_pool_template`), the names by rule (`check_pool_names`). The global `CONVERT_LOCK` is
    held only while the object is decoded.
    """
    kind = obj.get("kind")
    name = str((obj.get("metadata") or {}).get("name") or "")
    try:
        if kind == "AgentPool":
            with CONVERT_LOCK:
                spec = decode(obj, AgentPool).spec
            out = check_pool_names(name, spec)
            for pool_check in AGENTPOOL_CHECKS.values():
                out.extend(pool_check(spec))
            return out
        if kind == "GPUSlice":
            with CONVERT_LOCK:
                slice_spec = decode(obj, GPUSlice).spec
            return [m for slice_check in GPUSLICE_CHECKS.values() for m in slice_check(slice_spec)]
    except msgspec.ValidationError as exc:
        return [f"{exc} (the object does not match its CRD schema)"]
    return []
