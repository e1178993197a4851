"""Per-container shim regions for the pods assigned GPUs on this node.

For every container of a pod bound here with an assignment, the agent writes the container's
region (`neuronetes_agent.region.create_region`: the control file with limits, compute shares,
priority, QoS, pod and container names, and the container's state file) in
``<root>/<pod-uid>/<container>/`` before the container starts, so the NRI plugin can mount it
(docs/contracts.md "The shim's shared region"); regions of pods that are gone are removed. A
region that cannot be written is reported, never replaced by a weaker one: the NRI plugin then
refuses the container.

The state file is the container's: every reading of it (`read`, `registered_host_pids`, `tend`)
is a bounded copy validated field by field, and a region whose state is not usable yields nothing
for that container — an empty reading, and `RegionError` from `registered_host_pids` and `tend`
(which the callers report) — never another exception, a wait, or a write outside that container's
control file.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from neuronetes import contracts as c
from neuronetes_agent import region as shim

from . import hostpids
from .devices import Inventory

__all__ = ["RegionKeeper", "SliceReading"]

_CONTROL: Final[str] = shim.CONTROL_NAME
_STATE: Final[str] = shim.STATE_NAME

_QOS = {
    c.QoS.GUARANTEED: shim.QOS_GUARANTEED,
    c.QoS.BURSTABLE: shim.QOS_BURSTABLE,
    c.QoS.BEST_EFFORT: shim.QOS_BEST_EFFORT,
}


@dataclass(frozen=True, slots=True)
class SliceReading:
    """One device of one container's region, as the shim last wrote it."""

    uuid: str
    memory_limit_bytes: int
    memory_used_bytes: int
    compute_share_percent: int
    kernel_ns_total: int
    throttled_ns_total: int
    oom_refusals_total: int
    paused: bool


class RegionKeeper:
    """Creates and removes the regions under `root` (``/run/neuronetes/containers`` on a node)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def directory(self, pod_uid: str, container: str) -> Path:
        """The container's region directory (its ``control`` and ``state`` files)."""
        return self.root / pod_uid / container

    def control_path(self, pod_uid: str, container: str) -> Path:
        return self.directory(pod_uid, container) / _CONTROL

    def state_path(self, pod_uid: str, container: str) -> Path:
        return self.directory(pod_uid, container) / _STATE

    def sync(
        self,
        pods: Mapping[str, tuple[str, str, c.Assignment]],
        inventory: Inventory,
        keep: Collection[str] = frozenset(),
    ) -> list[str]:
        """Make the regions match `pods` (pod UID -> (namespace, name, assignment)), keeping those
        of the pods in `keep` (gone from the API server, but a container of theirs still runs);
        returns one message per region that could not be written."""
        errors: list[str] = []
        for uid, (namespace, name, assignment) in pods.items():
            for container, grant in assignment.containers.items():
                target = self.directory(uid, container)
                if (target / _CONTROL).exists():  # written last: the pair is complete
                    continue
                try:
                    devices = [self._device(g, inventory) for g in grant.gpus]
                    # Admitted at creation: the extender placed the pod, the node ledger recorded
                    # it and the NRI plugin checks both before the container starts, so the shim's
                    # first context need not wait (the workstation daemon admits from its queue).
                    shim.create_region(
                        target,
                        devices,
                        admitted=True,
                        priority=grant.priority,
                        qos=_QOS[grant.qos],
                        pod_uid=uid,
                        namespace=namespace,
                        container_name=container,
                    ).close()
                except (KeyError, ValueError, OSError, shim.RegionError) as exc:
                    errors.append(f"{namespace}/{name} container {container}: region not created: {exc}")
        if self.root.is_dir():
            for stale in self.root.iterdir():
                if stale.name not in pods and stale.name not in keep:
                    shutil.rmtree(stale, ignore_errors=True)
        return errors

    def _snapshot(self, pod_uid: str, container: str) -> tuple[shim.NnControl, shim.NnState] | None:
        """The agent's control file and a validated copy of the container's state file, or None
        when either is missing or not usable (`Region.read_state`)."""
        try:
            with shim.open_region(self.directory(pod_uid, container), writable=False) as r:
                return r.snapshot_control(), r.read_state()
        except (OSError, shim.RegionError):
            return None

    def read(self, pod_uid: str, container: str) -> list[SliceReading]:
        """The container's devices from its region (empty when there is none or it is invalid):
        limits and shares from the agent's control file, usage and counters from a validated copy
        of the container's state file."""
        pair = self._snapshot(pod_uid, container)
        if pair is None:
            return []
        control, state = pair
        paused = bool(control.container.control & shim.CTL_PAUSED)
        return [
            SliceReading(
                uuid=control.devices[i].uuid.decode(errors="replace"),
                memory_limit_bytes=control.devices[i].memory_limit_bytes,
                memory_used_bytes=state.devices[i].memory_used_bytes,
                compute_share_percent=control.devices[i].compute_share_percent,
                kernel_ns_total=state.devices[i].kernel_ns_total,
                throttled_ns_total=state.devices[i].throttled_ns_total,
                oom_refusals_total=state.devices[i].oom_refusals_total,
                paused=paused,
            )
            for i in range(min(control.container.device_count, shim.MAX_DEVICES))
        ]

    def registered_host_pids(self, pod_uid: str, container: str) -> set[int]:
        """The host PIDs of the container's ACTIVE slots: its processes that run the shim (NVML
        reconciliation, `daemon.reconcile`). Each one the agent itself found in the container's
        cgroup and registered in its control file for the slot's current claim; a PID in the state
        file is never taken.

        Raises:
            RegionError, OSError: the container has no valid region — either file missing or failing
                validation (a state file its tenant corrupted registers nobody).
        """
        with shim.open_region(self.directory(pod_uid, container), writable=False) as r:
            control, state = r.snapshot_control(), r.read_state()
        return hostpids.registered(control, state)

    def tend(
        self,
        pod_uid: str,
        container: str,
        cgroup_procs: Path | None,
        driver_holds: Callable[[int], bool],
        proc_root: Path = Path("/proc"),
    ) -> list[int]:
        """Register the container's host PIDs (only when its cgroup's `cgroup.procs` is known:
        the agent never guesses it) and order the reclaim of its dead processes' slots; returns the
        slots ordered reclaimed this round (the shim frees them at its next lock).

        Takes no lock and reads the state file once, into a validated private copy: nothing the
        container writes can make it wait, or act outside this container's control file.

        Raises:
            RegionError, OSError: no valid region, or its state file is not usable.
        """
        with shim.open_region(self.directory(pod_uid, container)) as region:
            state = region.read_state()
            if cgroup_procs is not None:
                hostpids.register_host_pids(region, state, cgroup_procs, proc_root)
            return hostpids.reclaim_dead(region, state, hostpids.process_alive(proc_root), driver_holds)

    @staticmethod
    def _device(g: c.GpuAssignment, inventory: Inventory) -> shim.DeviceLimit:
        gpu = inventory.by_uuid(g.uuid)
        if gpu is None:
            raise KeyError(f"GPU {g.uuid} is not on this node")
        if g.mig_start is None:
            return shim.DeviceLimit.from_mib(
                g.uuid,
                g.memory_mib,
                gpu.memory_mib,
                compute_share_percent=g.compute_percent,
                host_index=gpu.index,
            )
        inst = next(
            (d for d in gpu.mig_devices if d.start == g.mig_start and d.profile == g.mig_profile), None
        )
        if inst is None:
            raise KeyError(f"GPU {g.uuid} has no MIG instance {g.mig_profile} at slot {g.mig_start}")
        return shim.DeviceLimit.from_mib(
            inst.uuid,
            min(g.memory_mib, inst.memory_mib),
            inst.memory_mib,
            host_index=gpu.index,
            mig_start=inst.start,
        )
