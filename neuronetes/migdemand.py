"""The pending MIG demand the layout planner serves, and whose it is (pure, no API access).

Two kinds of claims ask for a MIG instance that may not exist yet:

* a pending, unbound pod asking for ``neuronetes.io/mig-<profile>`` (a pool's ``migProfile``
  replicas are such pods), restricted to the GPU family of the pod's required
  ``neuronetes.io/gpu-type`` when it names exactly one, and to the nodes it may run on (its
  nodeSelector, required node affinity and tolerations of the nodes' NoSchedule / NoExecute taints,
  `neuronetes.nodeselect.pod_fits_node`) — unless it names a GPUSlice: it then runs inside its
  slice's instance, and the slice is the demand;
* a Pending MIG GPUSlice (``spec.migProfile``): one instance of its profile. An unpinned one is
  demand like a pod's (`pending_mig_demand`); one pinned by ``nodeName`` (and ``gpuUUID``, a GPU's)
  may run on its node (its GPU) only (`pinned_slice_demand`). A slice pinned to a MIG instance's own
  UUID is not planned for: that instance exists or never will, and one the slice controller holds
  back for its namespace's quota (condition ``Bound`` reason ``QuotaExceeded``) is not planned for
  either: it may not bind, so no instance is made for it.

`pending_mig_demand` gives one `MigDemand` per instance, oldest claim first; a demand key is the
pod's ``namespace/name`` (``#k`` for its k-th instance) or ``GPUSlice:namespace/name``
(`demand_owner` reads it back). `slice_held_instances` names the instances Bound MIG slices hold:
the controller passes them as in use, so they are never destroyed or moved. `plan_mig_demand` plans
the demand restricted to some nodes (or a GPU) group by group on those GPUs only, then the rest on
every GPU, and gives the one plan of all passes: no GPU is re-laid out by two passes, and no idle
instance serves two items.
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
from neuronetes.nodeselect import pod_fits_node

__all__ = [
    "SLICE_KEY_PREFIX",
    "admitted_nodes",
    "demand_owner",
    "pending_mig_demand",
    "pinned_slice_demand",
    "plan_mig_demand",
    "pod_mig_demand",
    "slice_held_instances",
    "slice_instance",
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


def admitted_nodes(
    spec: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]] | None
) -> frozenset[str] | None:
    """The names of the Node objects (JSON) the pod spec may run on (`pod_fits_node`); None when
    it may run on all of them, or no nodes are given (nothing restricts it)."""
    if nodes is None:
        return None
    fits = frozenset(str(n["metadata"]["name"]) for n in nodes if pod_fits_node(spec, n))
    return None if len(fits) == len(nodes) else fits


def pod_mig_demand(
    pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]] | None = None
) -> list[MigDemand]:
    """The MIG instances one pod asks for (requests, else limits, summed over its containers), each
    restricted to the `nodes` (Node objects) the pod may run on (`admitted_nodes`)."""
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
    if not wanted:
        return []
    model, where = _gpu_type(spec), admitted_nodes(spec, nodes)
    return [
        MigDemand(f"{key}#{k}" if n > 1 else key, profile, model, where)
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


def pinned_slice_demand(slices: Iterable[Mapping[str, Any]]) -> list[MigDemand]:
    """The Pending, not-deleting MIG GPUSlice objects pinned by ``nodeName`` (and a GPU's
    ``gpuUUID``), one instance each restricted to its node (and GPU), oldest first. One pinned to a
    MIG instance's own UUID (``MIG-…``) is left out: no relayout makes that instance."""
    out: list[tuple[str, str, MigDemand]] = []
    for obj in slices:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        node, gpu = spec.get("nodeName"), spec.get("gpuUUID")
        if not node or str(gpu or "").startswith("MIG-"):
            continue
        unpinned = {**obj, "spec": {k: v for k, v in spec.items() if k not in ("nodeName", "gpuUUID")}}
        for item in slice_mig_demand(unpinned):
            pinned = replace(item, nodes=frozenset({str(node)}), gpu_uuid=str(gpu) if gpu else None)
            out.append((meta.get("creationTimestamp") or "", meta.get("name", ""), pinned))
    return [d for *_, d in sorted(out, key=lambda t: (t[0], t[1]))]


Where = tuple[frozenset[str] | None, str | None]
"""Where a group of demand may run: its nodes (None: any) and the UUID of its GPU (None: any)."""


def _pass_order(where: Where) -> tuple[bool, bool, int, tuple[str, ...], str]:
    """Passes in a fixed order: pinned to a GPU first, then the fewest nodes; any node last."""
    nodes, gpu = where
    anywhere = nodes is None and gpu is None
    return (anywhere, gpu is None, len(nodes or ()), tuple(sorted(nodes or ())), gpu or "")


def _restricted_reason(reason: str, where: Where) -> str:
    """An unserved item's reason, saying which GPUs it was planned on."""
    nodes, gpu = where
    if nodes is not None and not nodes:
        return (
            "no node with MIG GPUs here admits it (its nodeSelector, required node affinity or tolerations)"
        )
    names = sorted(nodes or ())
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    on = f"GPU {gpu}" + (f" of node {listed}" if names else "") if gpu else f"node(s) {listed}"
    return f"{reason} (it may run on {on} only)"


def _passed_on(state: GpuMigState, planned: GpuLayoutPlan, claimed: set[int], now_s: float) -> GpuMigState:
    """The GPU as the next pass sees it: re-laid out just now (its target layout, so a later pass
    leaves it as it is) when this pass changed it, and the instances this pass serves from in use."""
    if planned.changed:
        return GpuMigState(state.gpu, planned.target, state.in_use | claimed, now_s)
    return replace(state, in_use=state.in_use | claimed) if claimed else state


def plan_mig_demand(
    demand: Sequence[MigDemand],
    states: Sequence[GpuMigState],
    gpu_uuids: Mapping[str, str],
    *,
    now_s: float,
    min_relayout_interval_s: float = DEFAULT_MIN_RELAYOUT_INTERVAL_S,
) -> MigPlan:
    """One plan for demand restricted to some nodes or a GPU (`MigDemand.nodes`, ``gpu_uuid``) and
    the rest. The items alike in where they may run are planned together on those GPUs only
    (`states` named ``node/index``, `gpu_uuids` maps a state's GPU to its UUID), one group at a time
    (`_pass_order`), the demand that may run anywhere last on every GPU. Each pass hands the next
    the GPUs it changed as re-laid out just now (so no later pass changes them again) and the
    instances it serves from as in use (so no later pass counts them again). The result lists each
    GPU once (the plan of the pass that changed it, else of the last), its instances in use as
    `states` said, and the placements in demand order."""
    groups: dict[Where, list[int]] = {}
    for i, item in enumerate(demand):
        groups.setdefault((item.nodes, item.gpu_uuid), []).append(i)
    groups.setdefault((None, None), [])  # the last pass, over every GPU, gives every GPU's plan
    current = list(states)
    changed: dict[str, GpuLayoutPlan] = {}
    placed: dict[int, DemandPlacement] = {}
    problems: list[str] = []
    last: MigPlan | None = None
    for where in sorted(groups, key=_pass_order):
        nodes, gpu = where
        mine = [
            s
            for s in current
            if (nodes is None or s.gpu.rpartition("/")[0] in nodes)
            and (gpu is None or gpu_uuids.get(s.gpu) == gpu)
        ]
        items = groups[where]
        part = plan_mig_layouts(
            [demand[i] for i in items], mine, now_s=now_s, min_relayout_interval_s=min_relayout_interval_s
        )
        problems.extend(p for p in part.problems if p not in problems)
        claimed: dict[str, set[int]] = {}
        for i, p in zip(items, part.placements, strict=True):
            if p.gpu is not None and p.instance is not None:
                claimed.setdefault(p.gpu, set()).add(p.instance.start)
            elif where != (None, None):
                p = replace(p, reason=_restricted_reason(p.reason, where))
            placed[i] = p
        planned = {g.gpu: g for g in part.gpus}
        changed.update({g.gpu: g for g in part.gpus if g.changed and g.gpu not in changed})
        current = [
            _passed_on(s, planned[s.gpu], claimed.get(s.gpu, set()), now_s) if s.gpu in planned else s
            for s in current
        ]
        last = part
    assert last is not None  # the pass over every GPU always runs
    in_use = {s.gpu: s.in_use for s in reversed(states)}  # a GPU listed twice: its first entry
    gpus = tuple(
        replace(g, in_use=tuple(inst for inst in g.current if inst.start in in_use.get(g.gpu, frozenset())))
        for g in (changed.get(g.gpu, g) for g in last.gpus)
    )
    return MigPlan(gpus, tuple(placed[i] for i in range(len(demand))), tuple(problems), last.search)


def pending_mig_demand(
    pods: Iterable[Mapping[str, Any]],
    limit: int,
    slices: Iterable[Mapping[str, Any]] = (),
    nodes: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[list[MigDemand], int]:
    """The demand of pending, unbound, not-deleting pods that name no GPUSlice (each item restricted
    to those of `nodes`, Node objects, the pod may run on: `pod_mig_demand`) and of Pending, unpinned
    MIG slices (`slice_mig_demand`), oldest first, at most `limit` items; and how many were left out."""
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
        waiting.append((meta.get("creationTimestamp") or "", meta.get("name", ""), pod_mig_demand(p, nodes)))
    for s in slices:
        meta = s.get("metadata") or {}
        waiting.append((meta.get("creationTimestamp") or "", meta.get("name", ""), slice_mig_demand(s)))
    waiting.sort(key=lambda w: (w[0], w[1]))
    items = [d for _, _, found in waiting for d in found]
    return items[:limit], max(0, len(items) - limit)


def slice_instance(phase: object, gpu_uuids: object, mig_start: object) -> tuple[str, int] | None:
    """The MIG instance, as (GPU UUID, start slot), a GPUSlice whose status says `phase`,
    `gpu_uuids` and `mig_start` holds: one Bound (or Active) with both recorded, else None."""
    if phase not in ("Bound", "Active") or not isinstance(gpu_uuids, list | tuple) or not gpu_uuids:
        return None
    if not isinstance(mig_start, int) or isinstance(mig_start, bool):
        return None
    return str(gpu_uuids[0]), mig_start


def slice_held_instances(slices: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, int]]:
    """The MIG instances Bound (or Active) MIG GPUSlice objects hold, as (GPU UUID, start slot),
    from what the operator recorded in their status (``gpuUUIDs[0]``, ``migStart``)."""
    held = (
        slice_instance(st.get("phase"), st.get("gpuUUIDs"), st.get("migStart"))
        for st in (s.get("status") or {} for s in slices)
    )
    return frozenset(h for h in held if h is not None)


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
