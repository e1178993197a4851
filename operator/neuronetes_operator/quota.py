"""GPUSlices and pods together against a namespace's ResourceQuota. Pure.

The API server's ResourceQuota counts pods only: a pod asking for ``neuronetes.io/gpu-memory`` (MiB)
or ``neuronetes.io/gpu-compute`` (%) is counted in ``requests.neuronetes.io/gpu-memory`` /
``requests.neuronetes.io/gpu-compute``, a GPUSlice not at all. NeuroNetes counts both
(docs/gpuslice.md "Quota"):

    used = Σ GPUSlices that hold or wait for a reservation (`slice_counts`: Pending or Bound,
           not MIG) of their share (`slice_admission.slice_share`)
         + Σ pods that count (not finished) of their requests, except pods that name such a
           slice (they run inside it: the webhook copied the slice's share into them)

and the webhook refuses a slice (or a pod) that would take ``used`` past a quota's ``hard``. The
slice controller checks again just before binding, counting Bound slices only (a Pending slice
waits its turn), so two slices admitted at the same instant cannot both bind past the quota.
Only quotas without ``scopes``/``scopeSelector`` are considered (scopes select pods).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.quantity import QuantityError, parse_quantity

from .slice_admission import slice_share

__all__ = [
    "QUOTA_KEYS",
    "Excess",
    "excesses",
    "pod_counts",
    "pod_demand",
    "quota_relevant",
    "slice_counts",
    "slice_demand",
    "usage",
]

QUOTA_KEYS: Final = {
    f"requests.{c.RESOURCE_GPU_MEMORY}": (c.RESOURCE_GPU_MEMORY, "MiB"),
    f"requests.{c.RESOURCE_GPU_COMPUTE}": (c.RESOURCE_GPU_COMPUTE, "%"),
}
"""ResourceQuota ``hard`` keys NeuroNetes counts slices against: key → (resource, unit)."""
RESOURCES: Final = tuple(resource for resource, _ in QUOTA_KEYS.values())


def _number(q: Any) -> Fraction | None:
    try:
        return parse_quantity(q)
    except (QuantityError, TypeError, ValueError):
        return None


def show(x: Fraction) -> str:
    """A figure for a message: an integer when it is one."""
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def slice_counts(obj: Mapping[str, Any]) -> bool:
    """Whether a GPUSlice holds, or waits for, a reservation: Pending (or no phase yet) or
    Bound/Active, not MIG (a MIG instance is no gpu-memory/gpu-compute share), and not a Pending
    one being deleted (it goes at once)."""
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    if phase not in ("Pending", "Bound", "Active") or (obj.get("spec") or {}).get("migProfile"):
        return False
    return not ((obj.get("metadata") or {}).get("deletionTimestamp") and phase == "Pending")


def slice_demand(obj: Mapping[str, Any]) -> dict[str, Fraction]:
    """What a GPUSlice counts: its share (recorded status, else spec); nothing if unreadable."""
    try:
        memory, percent = slice_share(obj)
    except ValueError:
        return {}
    return {c.RESOURCE_GPU_MEMORY: Fraction(memory), c.RESOURCE_GPU_COMPUTE: Fraction(percent)}


def _request(ctr: Mapping[str, Any], resource: str) -> Fraction:
    resources = ctr.get("resources") or {}
    for part in ("requests", "limits"):  # an extended resource's request defaults to its limit
        value = (resources.get(part) or {}).get(resource)
        if value is not None:
            return _number(value) or Fraction(0)
    return Fraction(0)


def pod_demand(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """The pod's effective request of each counted resource, as the quota counts it: the app
    containers and sidecars (restartable init containers) together, or an init container (with
    the sidecars started before it) if that is more."""
    spec = pod.get("spec") or {}
    out: dict[str, Fraction] = {}
    for resource in RESOURCES:
        sidecars = Fraction(0)
        init_peak = Fraction(0)
        for ctr in spec.get("initContainers") or []:
            ask = _request(ctr, resource)
            if ctr.get("restartPolicy") == "Always":
                sidecars += ask
            else:
                init_peak = max(init_peak, sidecars + ask)
        app = sum((_request(ctr, resource) for ctr in spec.get("containers") or []), Fraction(0))
        total = max(app + sidecars, init_peak)
        if total:
            out[resource] = total
    return out


def pod_counts(pod: Mapping[str, Any], now: datetime | None = None) -> bool:
    """Whether the quota counts a pod: not Succeeded or Failed, and not past its deletion grace."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    meta = pod.get("metadata") or {}
    stamp, grace = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
    if stamp and grace is not None:
        try:
            when = datetime.fromisoformat(str(stamp))
        except ValueError:
            return True
        return (now or datetime.now(UTC)) <= when + timedelta(seconds=int(grace))
    return True


def usage(
    slices: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    bound_only: bool = False,
    now: datetime | None = None,
) -> dict[str, Fraction]:
    """``used`` of the module docstring over one namespace's `slices` and `pods` (`bound_only`:
    count Bound slices only — the slice controller's check before binding; pods naming any
    counting slice are still left out, they run inside it)."""
    total = dict.fromkeys(RESOURCES, Fraction(0))
    counting = [s for s in slices if slice_counts(s)]
    inside = {str((s.get("metadata") or {}).get("name")) for s in counting}
    for s in counting:
        if bound_only and (s.get("status") or {}).get("phase") not in ("Bound", "Active"):
            continue
        for resource, amount in slice_demand(s).items():
            total[resource] += amount
    for pod in pods:
        named = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_SLICE)
        if named in inside or not pod_counts(pod, now):
            continue
        for resource, amount in pod_demand(pod).items():
            total[resource] += amount
    return total


def quota_relevant(quotas: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The quotas that limit a counted resource and select every object (no scopes)."""
    out = []
    for quota in quotas:
        spec = quota.get("spec") or {}
        if spec.get("scopes") or spec.get("scopeSelector"):
            continue
        if any(key in (spec.get("hard") or {}) for key in QUOTA_KEYS):
            out.append(quota)
    return out


@dataclass(frozen=True, slots=True)
class Excess:
    """One quota a new claim would exceed."""

    quota: str
    key: str
    resource: str
    used: Fraction
    hard: Fraction
    asked: Fraction

    def describe(self) -> str:
        unit = QUOTA_KEYS[self.key][1]
        return (
            f"{show(self.asked)} {unit} of {self.resource} would exceed ResourceQuota {self.quota} "
            f"({self.key}: used {show(self.used)}, hard {show(self.hard)}; GPUSlices Pending or Bound and "
            "pods outside a slice count together)"
        )


def excesses(
    quotas: Iterable[Mapping[str, Any]], used: Mapping[str, Fraction], asked: Mapping[str, Fraction]
) -> list[Excess]:
    """Each (quota, resource) that ``used + asked`` would exceed; a resource not asked for never
    does (a namespace already over its quota still frees room by deleting)."""
    out = []
    for quota in quota_relevant(quotas):
        name = str((quota.get("metadata") or {}).get("name"))
        hard_of = (quota.get("spec") or {}).get("hard") or {}
        for key, (resource, _) in QUOTA_KEYS.items():
            want = asked.get(resource, Fraction(0))
            hard = _number(hard_of.get(key)) if key in hard_of else None
            if hard is None or not want:
                continue
            have = used.get(resource, Fraction(0))
            if have + want > hard:
                out.append(Excess(name, key, resource, have, hard, want))
    return out
