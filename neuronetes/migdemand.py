"""The pending MIG demand the layout planner serves, and whose it is (pure, no API access).

Two kinds of claims ask for a MIG instance that may not exist yet:

* a pending, unbound pod asking for ``neuronetes.io/mig-<profile>`` (a pool's ``migProfile``
  replicas are such pods), restricted to the GPU family of the pod's required
  ``neuronetes.io/gpu-type`` when it names exactly one — unless it names a GPUSlice: it then runs
  inside its slice's instance, and the slice is the demand;
* a Pending MIG GPUSlice (``spec.migProfile``) without ``nodeName``/``gpuUUID`` pins: one instance of
  its profile. A pinned slice binds to an idle instance where it is pinned; the planner has no node
  restriction, so it is not planned for (docs/mig.md, "Not yet").

`pending_mig_demand` gives one `MigDemand` per instance, oldest claim first; a demand key is the
pod's ``namespace/name`` (``#k`` for its k-th instance) or ``GPUSlice:namespace/name``
(`demand_owner` reads it back). `slice_held_instances` names the instances Bound MIG slices hold:
the controller passes them as in use, so they are never destroyed or moved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

from neuronetes import contracts as c
from neuronetes.mig import normalize_profile_name
from neuronetes.migplan import MigDemand, MigPlan

__all__ = [
    "SLICE_KEY_PREFIX",
    "demand_owner",
    "pending_mig_demand",
    "pod_mig_demand",
    "slice_held_instances",
    "slice_mig_demand",
    "unserved_by_claim",
]

SLICE_KEY_PREFIX: Final = "GPUSlice:"
"""Demand keys of MIG GPUSlices start with this (a pod's key is its ``namespace/name``)."""


def _profile_of_resource(name: str) -> str | None:
    if not name.startswith(c.RESOURCE_MIG_PREFIX):
        return None
    profile = name.removeprefix(c.RESOURCE_MIG_PREFIX)
    if profile.endswith(".me"):
        profile = profile.removesuffix(".me") + "+me"
    return normalize_profile_name(profile)


def _gpu_type(spec: Mapping[str, Any]) -> str | None:
    """The one GPU family the pod requires (``neuronetes.io/gpu-type``), else None."""
    values: set[str] = set()
    selector = spec.get("nodeSelector") or {}
    if c.LABEL_GPU_TYPE in selector:
        values.add(str(selector[c.LABEL_GPU_TYPE]).upper())
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or ():
        for expr in term.get("matchExpressions") or ():
            if expr.get("key") == c.LABEL_GPU_TYPE and expr.get("operator") == "In":
                values.update(str(v).upper() for v in expr.get("values") or ())
    return values.pop() if len(values) == 1 else None


def pod_mig_demand(pod: Mapping[str, Any]) -> list[MigDemand]:
    """The MIG instances one pod asks for (requests, else limits, summed over its containers)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    wanted: dict[str, int] = {}
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, quantity in asked.items():
            profile = _profile_of_resource(name)
            if profile is not None:
                try:
                    wanted[profile] = wanted.get(profile, 0) + max(0, int(str(quantity)))
                except ValueError:
                    continue  # not a whole number: the API server refuses such extended resources
    model = _gpu_type(spec)
    return [
        MigDemand(f"{key}#{k}" if n > 1 else key, profile, model)
        for profile, n in sorted(wanted.items())
        for k in range(n)
    ]


def slice_mig_demand(obj: Mapping[str, Any]) -> list[MigDemand]:
    """The one MIG instance a Pending, unpinned, not-deleting MIG GPUSlice object asks for."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    profile = spec.get("migProfile")
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    if (
        not profile
        or phase != "Pending"
        or meta.get("deletionTimestamp")
        or spec.get("nodeName")
        or spec.get("gpuUUID")
    ):
        return []
    key = f"{SLICE_KEY_PREFIX}{meta.get('namespace', '')}/{meta.get('name', '')}"
    return [MigDemand(key, normalize_profile_name(str(profile)))]


def pending_mig_demand(
    pods: Iterable[Mapping[str, Any]], limit: int, slices: Iterable[Mapping[str, Any]] = ()
) -> tuple[list[MigDemand], int]:
    """The demand of pending, unbound, not-deleting pods that name no GPUSlice and of Pending MIG
    slices (`slice_mig_demand`), oldest first, at most `limit` items; and how many were left out."""
    waiting: list[tuple[str, str, list[MigDemand]]] = []
    for p in pods:
        meta = p.get("metadata") or {}
        if (
            (p.get("spec") or {}).get("nodeName")
            or (p.get("status") or {}).get("phase", "Pending") != "Pending"
            or meta.get("deletionTimestamp")
            or c.ANNOTATION_SLICE in (meta.get("annotations") or {})  # inside its slice's instance
        ):
            continue
        waiting.append((meta.get("creationTimestamp") or "", meta.get("name", ""), pod_mig_demand(p)))
    for s in slices:
        meta = s.get("metadata") or {}
        waiting.append((meta.get("creationTimestamp") or "", meta.get("name", ""), slice_mig_demand(s)))
    waiting.sort(key=lambda w: (w[0], w[1]))
    items = [d for _, _, found in waiting for d in found]
    return items[:limit], max(0, len(items) - limit)


def slice_held_instances(slices: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, int]]:
    """The MIG instances Bound (or Active) MIG GPUSlice objects hold, as (GPU UUID, start slot),
    from what the operator recorded in their status (``gpuUUIDs[0]``, ``migStart``)."""
    held: set[tuple[str, int]] = set()
    for s in slices:
        st = s.get("status") or {}
        uuids, start = st.get("gpuUUIDs") or [], st.get("migStart")
        if st.get("phase") in ("Bound", "Active") and uuids and isinstance(start, int):
            held.add((str(uuids[0]), start))
    return frozenset(held)


def demand_owner(key: str) -> tuple[Literal["Pod", "GPUSlice"], str, str]:
    """(kind, namespace, name) of the claim a demand key (or `unserved_by_claim` key) names."""
    kind: Literal["Pod", "GPUSlice"] = "Pod"
    if key.startswith(SLICE_KEY_PREFIX):
        kind, key = "GPUSlice", key.removeprefix(SLICE_KEY_PREFIX)
    namespace, _, name = key.partition("#")[0].partition("/")
    return kind, namespace, name


def unserved_by_claim(plan: MigPlan) -> dict[str, list[str]]:
    """The claims (a pod's ``namespace/name``, a slice's ``GPUSlice:namespace/name``; in demand
    order) with demand the plan leaves unserved, each with the planner's distinct reasons."""
    out: dict[str, list[str]] = {}
    for p in plan.placements:
        if p.gpu is None:
            reasons = out.setdefault(p.demand.key.partition("#")[0], [])
            if p.reason not in reasons:
                reasons.append(p.reason)
    return out
