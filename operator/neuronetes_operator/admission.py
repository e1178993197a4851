"""Pod admission: what the webhook refuses and the one thing it sets. Pure: pod in, verdict out.

Every check is a small named function in `POD_CHECKS`; each returns the refusals it finds, as
messages that start with the field and say what to do. `review_pod` runs them all and, for a pod
it admits, returns the JSON patch that sets ``schedulerName: neuronetes-scheduler``.
docs/webhook.md lists the checks; docs/threat-model.md says why each exists.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.assignment import ResourceRequestError, pod_gpu_request
from neuronetes.carbon.release import ANNOTATION_DEADLINE, ANNOTATION_EXPECTED_RUNTIME
from neuronetes.locality import LOCALITY_ANNOTATIONS

__all__ = [
    "ANNOTATION_SLICE",
    "POD_CHECKS",
    "TENANT_ANNOTATIONS",
    "PodVerdict",
    "annotation_changes",
    "asks_for_gpus",
    "forbidden_host_path",
    "normalise_host_path",
    "protect_host_paths",
    "review_pod",
]

ANNOTATION_SLICE: Final = c.ANNOTATION_SLICE
"""A pod names the GPUSlice it uses (same namespace) with this annotation (docs/gpuslice.md)."""
TENANT_ANNOTATIONS: Final = frozenset(
    {
        c.ANNOTATION_LOCALITY,
        c.ANNOTATION_MIN_BANDWIDTH,
        c.ANNOTATION_GANG_TIMEOUT,
        c.ANNOTATION_MODEL,
        c.ANNOTATION_CACHE_HIT_WEIGHT,
        c.ANNOTATION_PREEMPTION_POLICY,
        ANNOTATION_SLICE,
        ANNOTATION_DEADLINE,
        ANNOTATION_EXPECTED_RUNTIME,
        *LOCALITY_ANNOTATIONS,
    }
)
"""The ``neuronetes.io/*`` annotations a tenant (or the operator) may set: requests, not decisions."""
DANGEROUS_CAPABILITIES: Final = frozenset({"SYS_ADMIN", "SYS_PTRACE", "SYS_RAWIO", "ALL"})
# A byte-like suffix on a MiB count: 16Gi, 40G, 1Ti (10k stays allowed: it is 10000 MiB).
_SUFFIXED: Final = re.compile(r"^\s*[0-9.]+\s*([KMGTPE]i|[GTPE])\s*$")


@dataclass
class PodVerdict:
    """The webhook's answer for one pod: refusals (empty: allowed) and the patch to apply."""

    refusals: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.refusals


def normalise_host_path(path: str) -> str:
    """`path` as the node's directory it names, textually: absolute, one ``/`` between parts, no
    ``.`` part, ``..`` taken textually (above ``/`` stays at ``/``), no trailing ``/``, aliases
    (`contracts.HOST_PATH_ALIASES`: /var/run is /run) replaced. Symlinks on the node are not
    resolved: the API server cannot see them."""
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    out = "/" + "/".join(parts)
    for alias, real in c.HOST_PATH_ALIASES.items():
        if out == alias or out.startswith(alias + "/"):
            out = real + out[len(alias) :]
    return out


def _inside(path: str, parent: str) -> bool:
    """`path` is `parent` or lies inside it (both normalised)."""
    return path == parent or posixpath.commonpath((path, parent)) == parent


_protected_host_paths: dict[str, str] = {
    normalise_host_path(p): why for p, why in c.TENANT_FORBIDDEN_HOST_PATHS.items()
}


def protect_host_paths(
    paths: Iterable[str], why: str = "a NeuroNetes agent directory on this cluster's nodes"
) -> None:
    """Also refuse hostPaths overlapping `paths`, in this process (``webhook serve
    --protected-host-path``: the chart passes the agent's host directories as configured)."""
    for path in paths:
        _protected_host_paths.setdefault(normalise_host_path(path), why)


def forbidden_host_path(path: str) -> str | None:
    """Why a pod may not mount `path` from the host: it is, lies inside or contains a protected host
    path (`contracts.TENANT_FORBIDDEN_HOST_PATHS` and `protect_host_paths`), both normalised
    (`normalise_host_path`); None when it may. Names the deepest protected path that holds `path`,
    else the first one `path` holds."""
    if ".." in path.split("/"):
        # The node resolves `..` after any symlink before it; the API server refuses it too.
        return f"{path!r} has a '..' part, which may lead anywhere on the node"
    wanted = normalise_host_path(path)
    holding = sorted((p for p in _protected_host_paths if _inside(wanted, p)), key=len)
    if holding:
        where = holding[-1]
        relation = "is" if wanted == where else "lies inside"
    else:
        held = sorted(p for p in _protected_host_paths if _inside(p, wanted))
        if not held:
            return None
        where, relation = held[0], "contains"
    shown = f"{path!r}" if wanted == path else f"{path!r} ({wanted})"
    return f"{shown} {relation} {where} ({_protected_host_paths[where]})"


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for i, ctr in enumerate(spec.get(kind) or []):
            if isinstance(ctr, Mapping):
                yield f"spec.{kind}[{i}]", ctr


def asks_for_gpus(pod: Mapping[str, Any]) -> bool:
    """Whether any container asks for a ``neuronetes.io/*`` resource or the pod names a slice."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    if ANNOTATION_SLICE in annotations:
        return True
    for _, ctr in _containers(pod.get("spec") or {}):
        resources = ctr.get("resources") or {}
        for part in ("limits", "requests"):
            if any(str(k).startswith(c.RESOURCE_PREFIX) for k in resources.get(part) or {}):
                return True
    return False


# ---- the checks ---------------------------------------------------------------------------------


def check_memory_unit(pod: Mapping[str, Any]) -> list[str]:
    """``neuronetes.io/gpu-memory`` is MiB: a suffixed value (16Gi) is almost surely a unit slip."""
    out = []
    for where, ctr in _containers(pod.get("spec") or {}):
        resources = ctr.get("resources") or {}
        for part in ("limits", "requests"):
            value = (resources.get(part) or {}).get(c.RESOURCE_GPU_MEMORY)
            if isinstance(value, str) and _SUFFIXED.match(value):
                out.append(
                    f"{where}.resources.{part}[{c.RESOURCE_GPU_MEMORY}]: {value!r} has a unit suffix, "
                    "but the resource counts MiB; write the number of MiB (16Gi is 16384)"
                )
    return out


def check_request(pod: Mapping[str, Any]) -> list[str]:
    """What `pod_gpu_request` refuses: mixed kinds, requests != limits, unknown resources, ..."""
    try:
        pod_gpu_request(pod)
    except ResourceRequestError as exc:
        return [f"spec.containers: {exc}"]
    return []


def check_node_name(pod: Mapping[str, Any]) -> list[str]:
    if (pod.get("spec") or {}).get("nodeName"):
        return ["spec.nodeName: must not be set on a GPU pod; the NeuroNetes scheduler places it (remove it)"]
    return []


def check_scheduler_name(pod: Mapping[str, Any]) -> list[str]:
    name = (pod.get("spec") or {}).get("schedulerName")
    if name not in (None, "", "default-scheduler", c.SCHEDULER_NAME):
        return [f"spec.schedulerName: {name!r} would skip the NeuroNetes scheduler; remove it"]
    return []


def check_privilege(pod: Mapping[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    out = [
        f"spec.{key}: a GPU pod must not share the host's {what}; remove it"
        for key, what in (("hostPID", "process namespace"), ("hostIPC", "IPC namespace"))
        if spec.get(key)
    ]
    for where, ctr in _containers(spec):
        sc = ctr.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{where}.securityContext.privileged: a GPU pod must not be privileged; remove it")
        added = {
            str(cap).upper().removeprefix("CAP_") for cap in (sc.get("capabilities") or {}).get("add") or []
        }
        for cap in sorted(added & DANGEROUS_CAPABILITIES):
            out.append(
                f"{where}.securityContext.capabilities.add: {cap} is not allowed on a GPU pod; remove it"
            )
    for i, vol in enumerate(spec.get("volumes") or []):
        host_path = vol.get("hostPath") if isinstance(vol, Mapping) else None
        if not isinstance(host_path, Mapping):
            continue
        path = str(host_path.get("path") or "")
        why = forbidden_host_path(path) if path else None
        if why is not None:
            out.append(
                f"spec.volumes[{i}].hostPath.path: {why}; a GPU pod may not mount it: remove the volume"
            )
    return out


def _forbidden_env(name: str) -> bool:
    return name in c.TENANT_FORBIDDEN_ENV_NAMES or name.startswith(c.TENANT_FORBIDDEN_ENV_PREFIXES)


def check_env(pod: Mapping[str, Any]) -> list[str]:
    out = []
    for where, ctr in _containers(pod.get("spec") or {}):
        for j, env in enumerate(ctr.get("env") or []):
            name = str(env.get("name", "")) if isinstance(env, Mapping) else ""
            if _forbidden_env(name):
                out.append(
                    f"{where}.env[{j}]: {name} is set by NeuroNetes from the GPU assignment, not by the pod; "
                    "remove it (CUDA_VISIBLE_DEVICES may narrow what is visible)"
                )
    return out


def check_annotations(pod: Mapping[str, Any]) -> list[str]:
    annotations = pod.get("metadata", {}).get("annotations") or {}
    out = []
    for key in sorted(annotations):
        if key.startswith(c.TENANT_FORBIDDEN_ANNOTATION_PREFIXES) and key not in TENANT_ANNOTATIONS:
            out.append(
                f"metadata.annotations[{key}]: set only by NeuroNetes (the scheduler's GPU decision) or the "
                f"container runtime; remove it (a pod may set {', '.join(sorted(TENANT_ANNOTATIONS))})"
            )
    return out


def check_foreign_gpus(pod: Mapping[str, Any]) -> list[str]:
    out = []
    for where, ctr in _containers(pod.get("spec") or {}):
        resources = ctr.get("resources") or {}
        for part in ("limits", "requests"):
            for key in resources.get(part) or {}:
                if key in c.FOREIGN_GPU_RESOURCES:
                    out.append(
                        f"{where}.resources.{part}[{key}]: a NeuroNetes GPU pod asks with neuronetes.io/* "
                        "resources only; remove it"
                    )
    return out


def annotation_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Refusals for an UPDATE that adds, changes or removes ``neuronetes.io/*`` or ``cdi.k8s.io/*``
    annotations: pod annotations are mutable, and the node reads the assignment again whenever a
    container is (re)created, so only trusted identities (the caller decides) may touch them."""
    before = (old.get("metadata") or {}).get("annotations") or {}
    after = (new.get("metadata") or {}).get("annotations") or {}
    changed = sorted(
        k
        for k in {*before, *after}
        if k.startswith(c.TENANT_FORBIDDEN_ANNOTATION_PREFIXES) and before.get(k) != after.get(k)
    )
    return [
        f"metadata.annotations[{k}]: NeuroNetes annotations of an existing pod are changed only by "
        "NeuroNetes; recreate the pod to ask for something else"
        for k in changed
    ]


POD_CHECKS: Final[dict[str, Callable[[Mapping[str, Any]], list[str]]]] = {
    "memory-unit": check_memory_unit,
    "request": check_request,
    "foreign-gpus": check_foreign_gpus,
    "node-name": check_node_name,
    "scheduler-name": check_scheduler_name,
    "privilege": check_privilege,
    "env": check_env,
    "annotations": check_annotations,
}
"""Every pod check, by name, in the order they run."""


def review_pod(pod: Mapping[str, Any]) -> PodVerdict:
    """The verdict for a pod that asks for NeuroNetes GPUs (callers scope with `asks_for_gpus`)."""
    verdict = PodVerdict()
    for check in POD_CHECKS.values():
        found = check(pod)
        if check is check_request and verdict.refusals:
            continue  # the unit slip above already explains the request's refusal
        verdict.refusals.extend(found)
    if verdict.allowed and (pod.get("spec") or {}).get("schedulerName") != c.SCHEDULER_NAME:
        verdict.patch.append({"op": "add", "path": "/spec/schedulerName", "value": c.SCHEDULER_NAME})
    return verdict
