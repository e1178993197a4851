"""Admission against a namespace's ResourceQuota, GPUSlices and pods counted together (`quota`).

- A GPUSlice CREATE (``objects.neuronetes.io``) whose share would take ``used`` past a quota's
  ``requests.neuronetes.io/gpu-memory`` or ``requests.neuronetes.io/gpu-compute`` — a MIG slice's
  instance past ``requests.neuronetes.io/mig-<profile>`` — is refused, the message naming the field
  (``spec.memory``, ``spec.computePercent``, ``spec.migProfile``), the quota and its used/hard
  figures. Its spec is immutable, so UPDATEs (the operator's finalizer) are not counted again.
- A pod CREATE (``pods.neuronetes.io``) asking for gpu-memory, gpu-compute or a MIG instance
  without naming a slice is refused the same way: the API server's own quota check counts pods
  only, so without this a pod could take what the namespace's slices hold. A pod naming a slice
  runs inside it and is not counted again.

The webhook lists the namespace's ResourceQuotas (and, when one limits these resources, its
GPUSlices and pods) with its own credentials; when it cannot, it refuses (fail closed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from neuronetes import contracts as c

from .apiread import ObjectLister, api_lister
from .quota import excesses, pod_demand, quota_relevant, slice_counts, slice_demand, usage

__all__ = ["QuotaReadError", "api_quota_lister", "review_pod_quota", "review_slice_quota"]


class QuotaReadError(Exception):
    """The namespace's quotas, slices or pods could not be listed."""


def _check(
    namespace: str, asked: Mapping[str, Any], lister: ObjectLister | None, field_of: Mapping[str, str]
) -> list[str]:
    if not any(asked.values()):
        return []
    where = next(field_of[r] for r, want in asked.items() if want)
    if lister is None:
        return [
            f"{where}: this webhook cannot read ResourceQuotas (no API credentials: an in-cluster "
            "service account or $KUBECONFIG); ask the cluster admin"
        ]
    try:
        quotas = quota_relevant(lister("resourcequotas", namespace))
        if not quotas:
            return []
        used = usage(lister("gpuslices", namespace), lister("pods", namespace))
    except QuotaReadError as exc:
        return [f"{where}: the quota of namespace {namespace} could not be read ({exc}); retry"]
    return [f"{field_of[e.resource]}: {e.describe()}" for e in excesses(quotas, used, asked)]


def review_slice_quota(obj: Mapping[str, Any], namespace: str, lister: ObjectLister | None) -> list[str]:
    """Refusals of a new GPUSlice for the namespace's quota (empty: allowed)."""
    if not slice_counts(obj):
        return []
    demand = slice_demand(obj)
    fields = {c.RESOURCE_GPU_MEMORY: "spec.memory", c.RESOURCE_GPU_COMPUTE: "spec.computePercent"}
    return _check(namespace, demand, lister, {r: fields.get(r, "spec.migProfile") for r in demand})


def _field(pod: Mapping[str, Any], resource: str) -> str:
    """The first container field asking for `resource` (for the message)."""
    spec = pod.get("spec") or {}
    for part in ("containers", "initContainers"):
        for i, ctr in enumerate(spec.get(part) or []):
            for kind in ("limits", "requests"):  # what the author wrote; the API server copies it
                if resource in ((ctr.get("resources") or {}).get(kind) or {}):
                    return f"spec.{part}[{i}].resources.{kind}[{resource}]"
    return "spec.containers"


def review_pod_quota(pod: Mapping[str, Any], namespace: str, lister: ObjectLister | None) -> list[str]:
    """Refusals of a new pod for the namespace's quota (empty: allowed); a pod naming a slice runs
    inside it and is not counted."""
    if c.ANNOTATION_SLICE in ((pod.get("metadata") or {}).get("annotations") or {}):
        return []
    demand = pod_demand(pod)
    return _check(namespace, demand, lister, {r: _field(pod, r) for r in demand})


def api_quota_lister(timeout_s: float = 2.0) -> ObjectLister | None:
    """An `ObjectLister` over the API server (None: no credentials; slices, and pods asking for
    gpu-memory, gpu-compute or a MIG instance, are then refused)."""
    return api_lister(QuotaReadError, timeout_s)
