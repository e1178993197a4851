"""MIG layouts asked for in ``GPUNode.spec.migLayout``: what differs from the GPUs' current layout.

Two kinds of entry:

* **counts** (``instances`` only): the agent applies the layout one GPU at a time, after the GPU's
  users are gone (it evicts them, as for a fault needing a reset); meanwhile the GPU takes no new
  work. The mode may change (``migEnabled``).
* **placements** (``placements``: each instance's profile and start slot, as the operator's MIG
  layout controller writes them): the agent destroys the instances not in the target and creates
  the missing ones at their start slots, instance by instance, with the GPU in service. It never
  evicts anyone and never destroys an instance that holds an allocation or a process: such an
  instance keeps the layout ``Pending`` (``MIGInstanceBusy`` Event) until it is free or the spec
  changes. The MIG mode is never changed on this path.

A node whose MIG configuration NVIDIA's mig-manager owns (node label ``nvidia.com/mig.config``) is
only reported, never changed.

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

__all__ = ["MIG_MANAGER_LABEL", "MigLayouts", "MigTarget", "changes", "instance_changes", "targets_from_spec"]

MIG_MANAGER_LABEL: Final = "nvidia.com/mig.config"


@dataclass(frozen=True, slots=True)
class MigTarget:
    """The layout one GPU should have."""

    index: int
    enabled: bool
    counts: Mapping[str, int]  # profile -> instances (empty with MIG off)
    # every instance's (profile, start slot): applied instance by instance, the GPU in service
    placements: frozenset[tuple[str, int]] | None = None


def targets_from_spec(spec: Mapping[str, Any]) -> dict[int, MigTarget]:
    """``spec.migLayout`` (CRD-validated) as targets by GPU index."""
    out: dict[int, MigTarget] = {}
    for entry in spec.get("migLayout") or ():
        enabled = bool(entry.get("migEnabled", True))
        counts = {i["profile"]: int(i["count"]) for i in entry.get("instances") or ()} if enabled else {}
        placed = entry.get("placements")
        placements = (
            frozenset((str(i["profile"]), int(i["start"])) for i in placed) if placed is not None else None
        )
        if placements is not None:
            counts = {}
            for profile, _ in placements:
                counts[profile] = counts.get(profile, 0) + 1
        out[int(entry["gpuIndex"])] = MigTarget(int(entry["gpuIndex"]), enabled, counts, placements)
    return out


def instance_changes(
    gpu: GpuDevice, target: MigTarget
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """The (profile, start) instances to destroy and to create to bring `gpu` to a placements
    target, each in start order."""
    assert target.placements is not None
    now = {(d.profile, d.start) for d in gpu.mig_devices}
    return tuple(sorted(now - target.placements, key=lambda i: i[1])), tuple(
        sorted(target.placements - now, key=lambda i: i[1])
    )


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
        if target is None:
            continue
        if target.placements is not None:
            if not gpu.mig_enabled or any(instance_changes(gpu, target)):
                out[gpu.uuid] = target
        elif _current(gpu) != (target.enabled, dict(target.counts)):
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
    # GPU UUID -> its placements target, applied instance by instance (the GPU stays in service)
    relayouts: dict[str, MigTarget] = field(default_factory=dict, init=False)
    _busy_reported: set[tuple[str, str, int]] = field(default_factory=set, init=False)
    _failed_generation: int = field(default=-1, init=False)

    def plan(self) -> None:
        """Compare the GPUs with ``spec.migLayout``: the GPUs to reconfigure (kept off new work,
        DEGRADED) and the layout state."""
        inventory = self.node.inventory
        assert inventory is not None
        self.pending = {}
        self.relayouts = {}
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
            # a failed layout is retried when the spec changes
            self.pending = {u: t for u, t in pending.items() if t.placements is None}
            self.relayouts = {u: t for u, t in pending.items() if t.placements is not None}
            if self.state != "Applying":
                self.state = "Pending"

    def apply(self) -> bool:
        """Evict the users of each GPU to reconfigure; reconfigure the GPUs without users; re-lay
        out the GPUs with a placements target where no instance to destroy is in use. True when a
        GPU was reconfigured (the inventory must be read again)."""
        usage = self.node.usage()
        applied = self._relayout()
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

    def _busy_starts(self, uuid: str) -> set[int]:
        """Start slots of the GPU's instances that hold an allocation."""
        return {
            int(entry["migStart"])
            for pod in self.node.pods.values()
            for entry in pod.allocations.get(uuid, ())
            if entry.get("migStart") is not None
        }

    def _relayout(self) -> bool:
        inventory = self.node.inventory
        assert inventory is not None
        applied = False
        for uuid, target in self.relayouts.items():
            gpu = inventory.by_uuid(uuid)
            if gpu is None:
                continue
            if not gpu.mig_enabled:
                self._fail(
                    f"GPU {target.index}: MIG mode is off; the agent never changes it for a placements layout"
                )
                return applied
            destroy, create = instance_changes(gpu, target)
            busy = self._busy_starts(uuid)
            blocked = [(p, s) for p, s in destroy if s in busy]
            if blocked:
                for profile, start in blocked:
                    if (uuid, profile, start) not in self._busy_reported:
                        self._busy_reported.add((uuid, profile, start))
                        self.events.record(
                            "Normal",
                            "MIGInstanceBusy",
                            f"GPU {target.index}: MIG instance {profile}@{start} holds an allocation; "
                            "waiting for it to end (it is never destroyed in use)",
                        )
                continue
            self.state = "Applying"
            error = self.backend.relayout_mig(uuid, destroy, create)
            if error is not None:
                self._fail(f"GPU {target.index}: {error}")
                return applied
            made = ", ".join(f"{p}@{s}" for p, s in create) or "nothing"
            gone = ", ".join(f"{p}@{s}" for p, s in destroy) or "nothing"
            self.events.record(
                "Normal", "MIGRelayout", f"GPU {target.index}: created {made}; destroyed {gone}"
            )
            applied = True
        return applied
