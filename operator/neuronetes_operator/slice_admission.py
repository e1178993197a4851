"""Admission of a pod that names a GPUSlice: the pod asks for exactly the slice's share.

A pod with ``neuronetes.io/slice: <name>`` (docs/gpuslice.md) that asks for no NeuroNetes resource
gets the slice's ``neuronetes.io/gpu-memory`` (MiB) and ``neuronetes.io/gpu-compute`` (%) as limits
of its first container, so kube-scheduler's and the kubelet's node totals count the share too; one
that asks for a shared slice must ask for exactly the slice's share; whole GPUs or a MIG instance
next to a slice are refused. The slice must exist in the pod's namespace and not be being deleted.
A pod naming a MIG slice (``spec.migProfile``) gets one ``neuronetes.io/mig-<profile>`` as a limit,
or must ask for exactly that. The share is the one the operator recorded in the slice's status when
it bound it, else the slice's spec (immutable).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.api.units import slice_memory_mib
from neuronetes.assignment import GpuKind, ResourceRequestError, pod_gpu_request
from neuronetes.mig import normalize_profile_name
from neuronetes.model import MILLI_PER_GPU
from neuronetes.quantity import QuantityError

from .apiread import api_reader, gpuslice_path

__all__ = [
    "SliceReadError",
    "SliceReader",
    "SliceReview",
    "api_slice_reader",
    "review_slice_pod",
    "slice_share",
]

_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_WHERE: Final = f"metadata.annotations[{c.ANNOTATION_SLICE}]"
_KINDS: Final = {GpuKind.WHOLE: "whole GPUs", GpuKind.MIG: "a MIG instance", GpuKind.SHARED: "a shared slice"}


class SliceReadError(Exception):
    """The GPUSlice could not be read (the API server is unreachable, or access is denied)."""


SliceReader = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) → the GPUSlice object, None when there is none; raises `SliceReadError`."""


@dataclass
class SliceReview:
    """Refusals (empty: allowed), the JSON patch, and the pod as patched (for the other checks)."""

    refusals: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    pod: Mapping[str, Any] = field(default_factory=dict)


def slice_share(obj: Mapping[str, Any]) -> tuple[int, int]:
    """(MiB, percent) a GPUSlice object reserves: its recorded status, else its spec.

    Raises:
        ValueError: the spec's memory is not a quantity (the CRD refuses such a slice).
    """
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    memory, percent = status.get("memoryMiB"), status.get("computePercent")
    if isinstance(memory, int) and isinstance(percent, int):
        return memory, percent
    try:
        return slice_memory_mib(spec["memory"]), int(spec.get("computePercent", 100))
    except (QuantityError, TypeError, KeyError) as exc:
        raise ValueError(str(exc)) from None


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _copy_share(pod: Mapping[str, Any], memory: int, percent: int) -> SliceReview:
    """Patch the first container to ask for (memory MiB, percent %) as limits."""
    return _copy_limits(pod, {c.RESOURCE_GPU_MEMORY: str(memory), c.RESOURCE_GPU_COMPUTE: str(percent)})


def _copy_limits(pod: Mapping[str, Any], share: Mapping[str, str]) -> SliceReview:
    """Patch the first container to ask for `share` as limits."""
    out = copy.deepcopy(dict(pod))
    ctr = out["spec"]["containers"][0]
    base = "/spec/containers/0/resources"
    resources = ctr.get("resources")
    if not isinstance(resources, Mapping):
        patch = [{"op": "add", "path": base, "value": {"limits": share}}]
        ctr["resources"] = {"limits": dict(share)}
    elif not isinstance(resources.get("limits"), Mapping):
        patch = [{"op": "add", "path": f"{base}/limits", "value": share}]
        ctr["resources"]["limits"] = dict(share)
    else:
        patch = [{"op": "add", "path": f"{base}/limits/{_escape(k)}", "value": v} for k, v in share.items()]
        ctr["resources"]["limits"].update(share)
    return SliceReview(patch=patch, pod=out)


def _review_mig_slice_pod(
    pod: Mapping[str, Any], name: str, profile: str, refuse: Callable[[str], SliceReview]
) -> SliceReview:
    """A pod naming a MIG slice asks for nothing (it then gets one ``neuronetes.io/mig-<profile>``)
    or for exactly one instance of the slice's profile."""
    resource = c.mig_resource_name(profile)
    try:
        asked = pod_gpu_request(pod)
    except ResourceRequestError:
        return SliceReview(pod=pod)  # an unreadable request: the request check says why
    if asked is None:
        return _copy_limits(pod, {resource: "1"})
    if asked.kind is not GpuKind.MIG or asked.request.mig_profile != normalize_profile_name(profile):
        return refuse(
            f"the pod names GPUSlice {name}, a MIG {profile} instance, and asks for {_KINDS[asked.kind]} "
            f"of another kind or profile; remove the neuronetes.io/* resources (the webhook sets {resource})"
        )
    if asked.request.gpus != 1:
        return refuse(f"the pod names GPUSlice {name}, one MIG instance, and asks for {asked.request.gpus}")
    return SliceReview(pod=pod)


def review_slice_pod(pod: Mapping[str, Any], namespace: str, read: SliceReader | None) -> SliceReview:
    """The review of a CREATE of `pod` (in `namespace`) that names a slice. A request that
    `pod_gpu_request` refuses is left to the request check (`admission.check_request`)."""
    name = str((pod.get("metadata", {}).get("annotations") or {}).get(c.ANNOTATION_SLICE, ""))

    def refuse(message: str) -> SliceReview:
        return SliceReview(refusals=[f"{_WHERE}: {message}"], pod=pod)

    if not _NAME.match(name):
        return refuse(
            f"{name!r} is not a GPUSlice name (lower-case DNS name); name a slice of this namespace"
        )
    if not (pod.get("spec") or {}).get("containers"):
        return refuse("the pod has no containers to run inside the slice")
    if read is None:
        return refuse(
            "this webhook cannot read GPUSlices (no API credentials: an in-cluster service account or "
            "$KUBECONFIG); ask the cluster admin, or remove the annotation"
        )
    try:
        obj = read(namespace, name)
    except SliceReadError as exc:
        return refuse(f"GPUSlice {name} could not be read ({exc}); retry")
    if obj is None:
        return refuse(f"GPUSlice {name} does not exist in namespace {namespace}; create it first")
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return refuse(f"GPUSlice {name} is being deleted; name another slice")
    profile = (obj.get("spec") or {}).get("migProfile")
    if profile:
        return _review_mig_slice_pod(pod, name, str(profile), refuse)
    try:
        memory, percent = slice_share(obj)
        asked = pod_gpu_request(pod)
    except (ValueError, ResourceRequestError):
        return SliceReview(pod=pod)  # an unreadable request: the request check says why
    if asked is None:
        return _copy_share(pod, memory, percent)
    if asked.kind is not GpuKind.SHARED:
        return refuse(
            f"the pod names GPUSlice {name} and also asks for {_KINDS[asked.kind]}; a pod runs inside "
            "its slice only: remove the neuronetes.io/* resources (the webhook sets them from the slice)"
        )
    req = asked.request
    got = (req.gpu_memory_mib, req.gpu_milli // (MILLI_PER_GPU // 100))
    if got != (memory, percent):
        return refuse(
            f"the pod asks for {got[0]} MiB and {got[1]}% but GPUSlice {name} holds {memory} MiB and "
            f"{percent}%; remove the pod's neuronetes.io/gpu-memory and gpu-compute (the webhook sets "
            "them from the slice) or ask for exactly the slice's share"
        )
    return SliceReview(pod=pod)


def api_slice_reader(timeout_s: float = 3.0) -> SliceReader | None:
    """A `SliceReader` over the API server: in-cluster credentials, else ``$KUBECONFIG`` (None:
    neither is available; pods naming a slice are then refused)."""
    return api_reader(gpuslice_path, SliceReadError, timeout_s)
