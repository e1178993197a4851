"""The pending MIG demand the layout planner serves, and whose it is (pure, no API access).

Two kinds of claims ask for a MIG instance that may not exist yet:

* a pending, unbound pod asking for ``neuronetes.io/mig-<profile>`` (a pool's ``migProfile``
  replicas are such pods), restricted to the GPU family of the pod's required
  ``neuronetes.io/gpu-type`` when it names exactly one — unless it names a GPUSlice: it then runs
  inside its slice's instance, and the slice is the demand;
* a Pending MIG GPUSlice (``spec.migProfile``): one instance of its profile. An unpinned one is
  demand like a pod's (`pending_mig_demand`); one pinned by ``nodeName`` (and ``gpuUUID``, a GPU's)
  is planned on its node's GPUs only (`pinned_slice_demand`, `plan_mig_demand`). A slice pinned to
  a MIG instance's own UUID is not planned for: that instance exists or never will, and one the
  slice controller holds back for its namespace's quota (condition ``Bound`` reason
  ``QuotaExceeded``) is not planned for either: it may not bind, so no instance is made for it.

`pending_mig_demand` gives one `MigDemand` per instance, oldest claim first; a demand key is the
pod's ``namespace/name`` (``#k`` for its k-th instance) or ``GPUSlice:namespace/name``
(`demand_owner` reads it back). `slice_held_instances` names the instances Bound MIG slices hold:
the controller passes them as in use, so they are never destroyed or moved. `plan_mig_demand` plans
the pinned demand on its GPUs first, then the rest on every GPU with the pinned passes' changed GPUs
held as they are, and gives the one plan of all passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, Literal

from neuronetes import contracts as c
from neuronetes.mig import normalize_profile_name
from neuronetes.migplan import (
    DEFAULT_MIN_RELAYOUT_INTERVAL_S,
    DemandPlacement,
    GpuLayoutPlan,
    GpuMigState,
    MigDemand,
    MigPlan,
    plan_mig_layouts,
)

__all__ = [
    "SLICE_KEY_PREFIX",
    "demand_owner",
    "pending_mig_demand",
    "pinned_slice_demand",
    "plan_mig_demand",
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
    """The one MIG instance a Pending, unpinned, not-deleting MIG GPUSlice object asks for, unless
    its namespace's quota holds it back (its ``Bound`` condition's reason is ``QuotaExceeded``)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    profile = spec.get("migProfile")
    phase = status.get("phase") or "Pending"
    held_back = any(
        cd.get("type") == "Bound" and cd.get("reason") == "QuotaExceeded"
        for cd in status.get("conditions") or []
    )
    if (
        not profile
        or phase != "Pending"
        or held_back
        or meta.get("deletionTimestamp")
        or spec.get("nodeName")
        or spec.get("gpuUUID")
    ):
        return []
    key = f"{SLICE_KEY_PREFIX}{meta.get('namespace', '')}/{meta.get('name', '')}"
    return [MigDemand(key, normalize_profile_name(str(profile)))]


Pin = tuple[str, str | None]
"""A pinned slice's node, and the UUID of the GPU it is pinned to (None: any GPU of the node)."""


def pinned_slice_demand(slices: Iterable[Mapping[str, Any]]) -> dict[Pin, list[MigDemand]]:
    """The Pending, not-deleting MIG GPUSlice objects pinned by ``nodeName`` (and a GPU's
    ``gpuUUID``), one instance each, by pin (oldest first in each). One pinned to a MIG instance's
    own UUID (``MIG-…``) is left out: no relayout makes that instance."""
    out: dict[Pin, list[tuple[str, str, MigDemand]]] = {}
    for obj in slices:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        node, gpu = spec.get("nodeName"), spec.get("gpuUUID")
        if not node or str(gpu or "").startswith("MIG-"):
            continue
        unpinned = {**obj, "spec": {k: v for k, v in spec.items() if k not in ("nodeName", "gpuUUID")}}
        for item in slice_mig_demand(unpinned):
            stamp = (meta.get("creationTimestamp") or "", meta.get("name", ""))
            out.setdefault((str(node), str(gpu) if gpu else None), []).append((*stamp, item))
    return {pin: [d for *_, d in sorted(items, key=lambda t: (t[0], t[1]))] for pin, items in out.items()}


def plan_mig_demand(
    demand: Sequence[MigDemand],
    pinned: Mapping[Pin, Sequence[MigDemand]],
    states: Sequence[GpuMigState],
    gpu_uuids: Mapping[str, str],
    *,
    now_s: float,
    min_relayout_interval_s: float = DEFAULT_MIN_RELAYOUT_INTERVAL_S,
) -> MigPlan:
    """One plan for the pinned demand and the rest. Each pin (in order) is planned on its GPUs only
    (`states` of its node, of its GPU when pinned to one: `gpu_uuids` maps a state's GPU to its
    UUID); the GPUs a pass changes are then passed on as re-laid out just now, so no later pass
    changes them again. The rest of the demand is planned last on every GPU. The result lists each
    GPU once (the pass that changed it, else the last) and every pass's placements."""
    current = list(states)
    changed: dict[str, GpuLayoutPlan] = {}
    placements: list[DemandPlacement] = []
    problems: list[str] = []
    for (node, gpu), items in sorted(pinned.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        mine = [
            s
            for s in current
            if s.gpu.rpartition("/")[0] == node and (gpu is None or gpu_uuids.get(s.gpu) == gpu)
        ]
        part = plan_mig_layouts(items, mine, now_s=now_s, min_relayout_interval_s=min_relayout_interval_s)
        placements.extend(part.placements)
        problems.extend(part.problems)
        changed.update({g.gpu: g for g in part.gpus if g.changed})
        current = [replace(s, last_relayout_s=now_s) if s.gpu in changed else s for s in current]
    main = plan_mig_layouts(demand, current, now_s=now_s, min_relayout_interval_s=min_relayout_interval_s)
    gpus = tuple(changed.get(g.gpu, g) for g in main.gpus)
    return MigPlan(gpus, (*placements, *main.placements), (*problems, *main.problems), main.search)


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
