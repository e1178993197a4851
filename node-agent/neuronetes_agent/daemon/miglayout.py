"""MIG layouts asked for in ``GPUNode.spec.migLayout``: what differs from the GPUs' current layout.

The agent applies a layout one GPU at a time, after the GPU's users are gone (it evicts them, as
for a fault needing a reset); meanwhile the GPU takes no new work. A node whose MIG configuration
NVIDIA's mig-manager owns (node label ``nvidia.com/mig.config``) is only reported, never changed.

`targets_from_spec` and `changes` decide; `MigLayouts` carries a node's layout out round by round
and keeps its ``status.migConfigState``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .devices import Discovery, GpuDevice, Inventory
from .events import NodeEvents
from .eviction import Evictor
from .nodestate import NodeState

__all__ = ["MIG_MANAGER_LABEL", "MigLayouts", "MigTarget", "changes", "targets_from_spec"]

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


@dataclass(eq=False, slots=True)
class MigLayouts:
    """One node's ``spec.migLayout`` carried out (called with the node's lock held).

    `state` is the ``status.migConfigState``: ``None``, ``Pending``, ``Applying``, ``Applied`` or
    ``Failed`` (retried when the spec's generation changes).
    """

    node: NodeState
    backend: Discovery
    events: NodeEvents
    evictor: Evictor
    targets: dict[int, MigTarget] = field(default_factory=dict, init=False)
    # NVIDIA's mig-manager owns the node's MIG configuration (its layout is only reported)
    external: bool = field(default=False, init=False)
    state: str = field(default="None", init=False)
    # GPU UUID -> its layout, to apply (kept off new work)
    pending: dict[str, MigTarget] = field(default_factory=dict, init=False)
    _failed_generation: int = field(default=-1, init=False)

    def plan(self) -> None:
        """Compare the GPUs with ``spec.migLayout``: the GPUs to reconfigure (kept off new work,
        DEGRADED) and the layout state."""
        inventory = self.node.inventory
        assert inventory is not None
        self.pending = {}
        if not self.targets or self.external:
            self.state = "None"  # nothing asked, or NVIDIA's mig-manager owns the node: report only
            return
        missing = set(self.targets) - {g.index for g in inventory.gpus}
        if missing:
            self._fail(f"spec.migLayout names GPU index {sorted(missing)} the node does not have")
            return
        pending = changes(inventory, self.targets)
        if not pending:
            if self.state != "Applied":
                self.events.record("Normal", "MIGApplied", "MIG layout applied")
            self.state = "Applied"
        elif self.state != "Failed" or self._failed_generation != self.node.generation:
            self.pending = pending  # a failed layout is retried when the spec changes
            self.state = "Pending"

    def apply(self) -> bool:
        """Evict the users of each GPU to reconfigure; reconfigure the GPUs without users. True
        when a GPU was reconfigured (the inventory must be read again)."""
        usage = self.node.usage()
        applied = False
        for uuid, target in self.pending.items():
            if usage[uuid].assigned:
                self.evictor.evict_users(uuid, f"GPU {uuid}: MIG layout change", time.monotonic())
                continue
            self.state = "Applying"
            error = self.backend.apply_mig(uuid, target.enabled, target.counts)
            if error is not None:
                self._fail(f"GPU {target.index}: {error}")
                break
            applied = True
        return applied

    def _fail(self, message: str) -> None:
        if self.state != "Failed" or self._failed_generation != self.node.generation:
            self.events.record("Warning", "MIGFailed", message)
        self.state = "Failed"
        self._failed_generation = self.node.generation
