"""MIG layouts asked for in ``GPUNode.spec.migLayout``: what differs from the GPUs' current layout.

The agent applies a layout one GPU at a time, after the GPU's users are gone (it evicts them, as
for a fault needing a reset); meanwhile the GPU takes no new work. A node whose MIG configuration
NVIDIA's mig-manager owns (node label ``nvidia.com/mig.config``) is only reported, never changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .devices import GpuDevice, Inventory

__all__ = ["MIG_MANAGER_LABEL", "MigTarget", "changes", "targets_from_spec"]

MIG_MANAGER_LABEL: Final = "nvidia.com/mig.config"


@dataclass(frozen=True, slots=True)
class MigTarget:
    """The layout one GPU should have."""

    index: int
    enabled: bool
    counts: Mapping[str, int]  # profile -> instances (empty with MIG off)


def targets_from_spec(spec: Mapping[str, Any]) -> dict[int, MigTarget]:
    """``spec.migLayout`` (CRD-validated) as targets by GPU index."""
    out: dict[int, MigTarget] = {}
    for entry in spec.get("migLayout") or ():
        enabled = bool(entry.get("migEnabled", True))
        counts = {i["profile"]: int(i["count"]) for i in entry.get("instances") or ()} if enabled else {}
        out[int(entry["gpuIndex"])] = MigTarget(int(entry["gpuIndex"]), enabled, counts)
    return out


def _current(gpu: GpuDevice) -> tuple[bool, dict[str, int]]:
    counts: dict[str, int] = {}
    for d in gpu.mig_devices:
        counts[d.profile] = counts.get(d.profile, 0) + 1
    return gpu.mig_enabled, counts


def changes(inventory: Inventory, targets: Mapping[int, MigTarget]) -> dict[str, MigTarget]:
    """GPU UUID -> target, for the GPUs whose layout differs from their target (a target for an
    index the node does not have is reported by the caller)."""
    out: dict[str, MigTarget] = {}
    for gpu in inventory.gpus:
        target = targets.get(gpu.index)
        if target is not None and _current(gpu) != (target.enabled, dict(target.counts)):
            out[gpu.uuid] = target
    return out
