"""GPUSlices and pods together against a namespace's ResourceQuota. Pure.

The API server's ResourceQuota counts pods only: a pod asking for ``neuronetes.io/gpu-memory`` (MiB),
``neuronetes.io/gpu-compute`` (%) or a MIG instance ``neuronetes.io/mig-<profile>`` is counted in
``requests.neuronetes.io/gpu-memory`` / ``requests.neuronetes.io/gpu-compute`` /
``requests.neuronetes.io/mig-<profile>``, a GPUSlice not at all. NeuroNetes counts both
(docs/gpuslice.md "Quota"):

    used = Σ GPUSlices that hold or wait for a reservation (`slice_counts`: Pending or Bound) of
           what they reserve (`slice_demand`: a shared slice its share, a MIG slice one instance
           of its profile)
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
    "quota_resource",
    "slice_counts",
    "slice_demand",
    "usage",
]

QUOTA_KEYS: Final = {
    f"requests.{c.RESOURCE_GPU_MEMORY}": (c.RESOURCE_GPU_MEMORY, "MiB"),
    f"requests.{c.RESOURCE_GPU_COMPUTE}": (c.RESOURCE_GPU_COMPUTE, "%"),
}
"""ResourceQuota ``hard`` keys of the shared resources NeuroNetes counts: key → (resource, unit).
Besides these, every ``requests.neuronetes.io/mig-<profile>`` counts (`quota_resource`)."""
RESOURCES: Final = tuple(resource for resource, _ in QUOTA_KEYS.values())
_MIG_KEY_PREFIX: Final = f"requests.{c.RESOURCE_MIG_PREFIX}"


def quota_resource(key: str) -> str | None:
    """The resource a ResourceQuota ``hard`` key limits, when NeuroNetes counts it (None: not)."""
    if key in QUOTA_KEYS:
        return QUOTA_KEYS[key][0]
    if key.startswith(_MIG_KEY_PREFIX) and len(key) > len(_MIG_KEY_PREFIX):
        return key.removeprefix("requests.")
    return None


def _amount(resource: str, x: Fraction) -> str:
    """An amount of `resource` in its unit, for a message: ``10240 MiB``, ``30 %``, ``1 instance``."""
    for counted, unit in QUOTA_KEYS.values():
        if counted == resource:
            return f"{show(x)} {unit}"
    return f"{show(x)} instance{'' if x == 1 else 's'}"


def _number(q: Any) -> Fraction | None:
    try:
        return parse_quantity(q)
    except (QuantityError, TypeError, ValueError):
        return None


def show(x: Fraction) -> str:
    """A figure for a message: an integer when it is one."""
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def slice_counts(obj: Mapping[str, Any]) -> bool:
    """Whether a GPUSlice holds, or waits for, a reservation (a share or a MIG instance): Pending
    (or no phase yet) or Bound/Active, and not a Pending one being deleted (it goes at once)."""
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    if phase not in ("Pending", "Bound", "Active"):
        return False
    return not ((obj.get("metadata") or {}).get("deletionTimestamp") and phase == "Pending")


def slice_demand(obj: Mapping[str, Any]) -> dict[str, Fraction]:
    """What a GPUSlice counts: a MIG slice one instance of its profile (``neuronetes.io/mig-<profile>``,
    the resource its pods ask for), a shared slice its share (recorded status, else spec); nothing
    if unreadable."""
    profile = (obj.get("status") or {}).get("migProfile") or (obj.get("spec") or {}).get("migProfile")
    if profile:
        try:
            return {c.mig_resource_name(str(profile)): Fraction(1)}
        except ValueError:
            return {}
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
    """The pod's effective request of each counted resource (gpu-memory, gpu-compute and each MIG
    profile it asks for), as the quota counts it: the app containers and sidecars (restartable
    init containers) together, or an init container (with the sidecars started before it) if that
    is more."""
    spec = pod.get("spec") or {}
    out: dict[str, Fraction] = {}
    named = {
        str(key)
        for ctr in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        for part in ("requests", "limits")
        for key in ((ctr.get("resources") or {}).get(part) or {})
    }
    for resource in [
        *RESOURCES,
        *sorted(r for r in named if r not in RESOURCES and quota_resource(f"requests.{r}")),
    ]:
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
        for resource, count in slice_demand(s).items():
            total[resource] = total.get(resource, Fraction(0)) + count
    for pod in pods:
        named = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_SLICE)
        if named in inside or not pod_counts(pod, now):
            continue
        for resource, count in pod_demand(pod).items():
            total[resource] = total.get(resource, Fraction(0)) + count
    return total


def quota_relevant(quotas: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The quotas that limit a counted resource and select every object (no scopes)."""
    out = []
    for quota in quotas:
        spec = quota.get("spec") or {}
        if spec.get("scopes") or spec.get("scopeSelector"):
            continue
        if any(quota_resource(str(key)) for key in spec.get("hard") or {}):
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
        return (
            f"{_amount(self.resource, self.asked)} of {self.resource} would exceed "
            f"ResourceQuota {self.quota} "
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
        others = sorted(str(k) for k in hard_of if str(k) not in QUOTA_KEYS)  # MIG profiles, cpu, …
        for key in [*(k for k in QUOTA_KEYS if k in hard_of), *others]:
            resource = quota_resource(key)
            want = asked.get(resource, Fraction(0)) if resource else Fraction(0)
            hard = _number(hard_of[key])
            if resource is None or hard is None or not want:
                continue
            have = used.get(resource, Fraction(0))
            if have + want > hard:
                out.append(Excess(name, key, resource, have, hard, want))
    return out
