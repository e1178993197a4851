"""Feeding the MIG layout planner and shaping its plan for the two apply paths (pure, no API access).

The operator's MIG layout controller reads the pending pods, the GPUNodes and the Nodes, and asks
this module:

* `neuronetes.migdemand`: the pending demand (pods, MIG GPUSlices) and who is told when it is unserved.
* `gpu_states`: each MIG GPU of a GPUNode as a `GpuMigState`: its layout from ``status.gpus``, the
  instances holding an allocation (``status.gpus[].allocations[].migInstance``) or a Bound MIG
  GPUSlice (`neuronetes.migdemand.slice_held_instances`) as in use, when the
  controller last re-laid it out. GPUs that must not change are passed as re-laid out just now, so
  the planner's hysteresis keeps them as they are and serves only from their idle instances.
* `node_relayouts`: the planner's changed GPUs grouped per node, for the apply path of each node
  (`apply_path`): the GPUNode ``spec.migLayout`` entries with exact placements for NeuroNetes' agent
  (`agent_layout_entries`), or a mig-parted ``mig-configs`` entry for NVIDIA's mig-manager
  (`mig_parted_entry`, `mig_parted_config_name`, `merge_mig_parted_configs`).

Guarantees, on top of the planner's (docs/mig.md): an instance with an allocation is never
destroyed or moved; on a mig-manager node a GPU with any instance in use is never changed (mig-parted
re-creates a whole GPU's instances); a node whose previous relayout is still being applied is not
changed again; a GPU that is not schedulable (Degraded, Resetting, Offline) is not changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec
import msgspec.yaml

from neuronetes import contracts as c
from neuronetes.mig import MigLayout, catalog_for, is_mig_capable
from neuronetes.mig_profiles import MigPlacementError, UnsupportedGpuError
from neuronetes.migplan import GpuLayoutPlan, GpuMigState, MigPlan

__all__ = [
    "LABEL_MIG_APPLY",
    "MIG_MANAGER_CONFIG_LABEL",
    "MIG_MANAGER_STATE_LABEL",
    "ApplyPath",
    "NodeRelayout",
    "agent_layout_entries",
    "apply_path",
    "current_layout",
    "gpu_key",
    "gpu_states",
    "merge_mig_parted_configs",
    "mig_parted_config_name",
    "mig_parted_entry",
    "node_relayouts",
]

LABEL_MIG_APPLY: Final = f"{c.GROUP}/mig-apply"
"""Node label choosing how a node's MIG layouts are applied: ``agent``, ``mig-manager`` or ``none``."""
MIG_MANAGER_CONFIG_LABEL: Final = "nvidia.com/mig.config"
MIG_MANAGER_STATE_LABEL: Final = "nvidia.com/mig.config.state"
MIG_PARTED_CONFIG_PREFIX: Final = "neuronetes-"

ApplyPath = Literal["agent", "mig-manager", "none"]
_HEALTHY: Final = frozenset({"Available", "Allocated", "InUse", None})


def apply_path(labels: Mapping[str, str]) -> ApplyPath:
    """How a node's MIG layouts are applied: its ``neuronetes.io/mig-apply`` label when it says
    ``agent``, ``mig-manager`` or ``none``; else ``mig-manager`` when the node carries
    ``nvidia.com/mig.config`` (mig-manager owns it; the agent only reports it), else ``agent``."""
    chosen = labels.get(LABEL_MIG_APPLY, "")
    if chosen in ("agent", "mig-manager", "none"):
        return chosen  # type: ignore[return-value]
    return "mig-manager" if MIG_MANAGER_CONFIG_LABEL in labels else "agent"


def gpu_key(node: str, index: int) -> str:
    """The planner's name of a node's GPU."""
    return f"{node}/{index}"


# ---- current layouts -----------------------------------------------------------------------------


def _layout(model: str, instances: Sequence[Mapping[str, Any]]) -> MigLayout:
    layout = catalog_for(model).empty_layout()
    for inst in instances:
        layout = layout.place_at(str(inst["profile"]), int(inst["start"]))
    return layout


def current_layout(gpu: Mapping[str, Any]) -> MigLayout | None:
    """A GPU's layout from its ``status.gpus`` entry; None when it cannot be read."""
    try:
        return _layout(str(gpu.get("model") or ""), gpu.get("migInstances") or [])
    except (MigPlacementError, UnsupportedGpuError, KeyError, ValueError, TypeError):
        return None


def gpu_states(
    gpunode: Mapping[str, Any],
    path: ApplyPath,
    last_relayout: Mapping[int, float],
    now_s: float,
    *,
    frozen: bool = False,
    mode_change: bool = False,
    held: frozenset[tuple[str, int]] = frozenset(),
) -> tuple[list[GpuMigState], list[str]]:
    """The node's MIG GPUs for the planner, and one line per GPU left out. `frozen` (a relayout of
    the node still being applied, or a path that cannot change it) keeps every GPU as it stands.
    With `mode_change` (mig-manager path only: it switches the mode), a MIG-capable GPU with MIG off
    and no allocation at all is offered as an empty MIG GPU; using it is a mode change
    (`NodeRelayout.mode_change`: the node is cordoned while it is applied). `held` names instances
    in use besides the reported allocations, as (GPU UUID, start slot): Bound MIG GPUSlices'."""
    node = gpunode["metadata"]["name"]
    out: list[GpuMigState] = []
    skipped: list[str] = []
    for gpu in (gpunode.get("status") or {}).get("gpus") or ():
        index, model = int(gpu["index"]), str(gpu.get("model") or "")
        if not is_mig_capable(model):
            continue
        if gpu.get("migMode") != "Enabled":
            idle = not gpu.get("allocations") and gpu.get("health") in ("Available", None)
            if (
                mode_change
                and path == "mig-manager"
                and not frozen
                and gpu.get("migMode") == "Disabled"
                and idle
            ):
                out.append(
                    GpuMigState(gpu_key(node, index), catalog_for(model).empty_layout(), frozenset(), None)
                )
            continue
        instances = gpu.get("migInstances") or []
        if any(i.get("start") is None for i in instances):
            skipped.append(f"{gpu_key(node, index)}: instances without start slots")
            continue
        try:
            layout = _layout(model, instances)
        except (MigPlacementError, UnsupportedGpuError, KeyError, ValueError) as exc:
            skipped.append(f"{gpu_key(node, index)}: {exc}")
            continue
        allocated = {str(a.get("migInstance")) for a in gpu.get("allocations") or () if a.get("migInstance")}
        in_use = frozenset(
            int(i["start"])
            for i in instances
            if i.get("uuid") in allocated or (gpu.get("uuid"), int(i["start"])) in held
        )
        hold = (
            frozen
            or path == "none"
            or gpu.get("health") not in _HEALTHY
            or (path == "mig-manager" and bool(in_use))  # mig-parted re-creates the whole GPU
        )
        last = now_s if hold else last_relayout.get(index)
        out.append(GpuMigState(gpu_key(node, index), layout, in_use, last))
    return out, skipped


# ---- the plan per node ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeRelayout:
    """A node's changed GPUs (by index) and what they serve."""

    node: str
    path: ApplyPath
    gpus: Mapping[int, GpuLayoutPlan]
    serves: tuple[str, ...] = field(default=())
    mode_change: frozenset[int] = frozenset()  # GPUs whose MIG mode goes from off to on

    def summary(self) -> str:
        """One line: each GPU's change."""
        parts = []
        for index, g in sorted(self.gpus.items()):
            made = ", ".join(f"{i.profile.name}@{i.start}" for i in g.create) or "nothing"
            gone = ", ".join(f"{i.profile.name}@{i.start}" for i in g.destroy) or "nothing"
            parts.append(f"GPU {index}: create {made}; destroy {gone}")
        return "; ".join(parts)


def node_relayouts(
    plan: MigPlan, paths: Mapping[str, ApplyPath], mig_off: Iterable[str] = ()
) -> list[NodeRelayout]:
    """The plan's changed GPUs grouped by node (nodes in name order), with the demand they serve;
    `mig_off` names the GPUs (`gpu_key`) now in MIG mode off."""
    off = set(mig_off)
    by_node: dict[str, dict[int, GpuLayoutPlan]] = {}
    switching: dict[str, set[int]] = {}
    for g in plan.gpus:
        if g.changed:
            node, _, index = g.gpu.rpartition("/")
            by_node.setdefault(node, {})[int(index)] = g
            if g.gpu in off:
                switching.setdefault(node, set()).add(int(index))
    serving: dict[str, list[str]] = {}
    for p in plan.placements:
        if p.gpu is not None:
            serving.setdefault(p.gpu.rpartition("/")[0], []).append(p.demand.key)
    return [
        NodeRelayout(
            node,
            paths.get(node, "agent"),
            gpus,
            tuple(serving.get(node, ())),
            frozenset(switching.get(node, ())),
        )
        for node, gpus in sorted(by_node.items())
    ]


def _counts(layout: MigLayout) -> list[dict[str, Any]]:
    return [{"profile": p, "count": n} for p, n in sorted(layout.counts().items())]


def agent_layout_entries(
    current: Sequence[Mapping[str, Any]], relayout: NodeRelayout
) -> list[dict[str, Any]]:
    """``spec.migLayout`` for the agent: the entries already there, those of the changed GPUs
    replaced by their target with exact placements (the agent creates and destroys instances at
    those start slots, never one in use)."""
    entries = {int(e["gpuIndex"]): dict(e) for e in current}
    for index, g in relayout.gpus.items():
        entries[index] = {
            "gpuIndex": index,
            "migEnabled": True,
            "instances": _counts(g.target),
            "placements": [{"profile": i.profile.name, "start": i.start} for i in g.target],
        }
    return [entries[k] for k in sorted(entries)]


# ---- NVIDIA mig-manager --------------------------------------------------------------------------


def mig_parted_entry(layouts: Mapping[int, MigLayout]) -> list[dict[str, Any]]:
    """A mig-parted ``mig-configs`` entry giving each listed GPU (index) its instance counts: one
    item per distinct layout, with the devices that take it. mig-parted places the instances
    itself; counts are what its format holds."""
    by_counts: dict[str, list[int]] = {}
    counts_of: dict[str, dict[str, int]] = {}
    for index, layout in sorted(layouts.items()):
        counts = dict(sorted(layout.counts().items()))
        text = json.dumps(counts, sort_keys=True)
        by_counts.setdefault(text, []).append(index)
        counts_of[text] = counts
    return [
        {"devices": devices, "mig-enabled": True, "mig-devices": counts_of[text]}
        for text, devices in by_counts.items()
    ]


def mig_parted_config_name(entry: Sequence[Mapping[str, Any]]) -> str:
    """A config name fixed by its content (a label value: ``neuronetes-`` and 12 hex digits), so a
    new layout is a new ``nvidia.com/mig.config`` value, which is what makes mig-manager act."""
    digest = hashlib.sha256(json.dumps(list(entry), sort_keys=True).encode()).hexdigest()[:12]
    return MIG_PARTED_CONFIG_PREFIX + digest


def merge_mig_parted_configs(
    existing: str | None, name: str, entry: Sequence[Mapping[str, Any]], keep: Iterable[str]
) -> str:
    """The ``config.yaml`` of mig-manager's ConfigMap with `name` set to `entry`: other configs are
    kept, except ``neuronetes-*`` ones not in `keep` (no node's label names them any more).

    Raises:
        ValueError: `existing` is not a mig-parted config (a mapping with ``mig-configs``).
    """
    try:
        doc: Any = msgspec.yaml.decode(existing) if existing else None
    except msgspec.DecodeError as exc:
        raise ValueError(f"the mig-parted config is not YAML: {exc}") from None
    if doc is None:
        doc = {"version": "v1", "mig-configs": {}}
    if not isinstance(doc, dict) or not isinstance(doc.get("mig-configs", {}), dict):
        raise ValueError("the mig-parted config is not a mapping with mig-configs")
    kept = set(keep) | {name}
    configs = {
        k: v
        for k, v in (doc.get("mig-configs") or {}).items()
        if not str(k).startswith(MIG_PARTED_CONFIG_PREFIX) or k in kept
    }
    configs[name] = [dict(item) for item in entry]
    doc["version"] = doc.get("version") or "v1"
    doc["mig-configs"] = configs
    return msgspec.yaml.encode(doc).decode()
