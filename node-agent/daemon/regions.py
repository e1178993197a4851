"""Per-container shim regions for the pods assigned GPUs on this node.

For every container of a pod bound here with an assignment, the agent writes the container's
region (`neuronetes.agent.region.create_region`: limits, compute shares, priority, QoS, pod and
container names) at ``<root>/<pod-uid>/<container>/region`` before the container starts, so the
NRI plugin can mount it (docs/contracts.md "The shim's shared region"); regions of pods that are
gone are removed. A region that cannot be written is reported, never replaced by a weaker one:
the NRI plugin then refuses the container.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from neuronetes import contracts as c
from neuronetes.agent import region as shim

from . import hostpids
from .devices import Inventory

__all__ = ["RegionKeeper", "SliceReading"]

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

    def path(self, pod_uid: str, container: str) -> Path:
        return self.root / pod_uid / container / "region"

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
                target = self.path(uid, container)
                if target.exists():
                    continue
                try:
                    devices = [self._device(g, inventory) for g in grant.gpus]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shim.create_region(
                        target,
                        devices,
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

    def read(self, pod_uid: str, container: str) -> list[SliceReading]:
        """The container's devices from its region (empty when there is none or it is invalid)."""
        try:
            with shim.open_region(self.path(pod_uid, container), writable=False) as r:
                view = r.snapshot()
        except (OSError, shim.RegionError):
            return []
        paused = bool(view.container.control & shim.CTL_PAUSED)
        return [
            SliceReading(
                uuid=d.uuid.decode(errors="replace"),
                memory_limit_bytes=d.memory_limit_bytes,
                memory_used_bytes=d.memory_used_bytes,
                compute_share_percent=d.compute_share_percent,
                kernel_ns_total=d.kernel_ns_total,
                throttled_ns_total=d.throttled_ns_total,
                oom_refusals_total=d.oom_refusals_total,
                paused=paused,
            )
            for d in list(view.devices)[: view.container.device_count]
        ]

    def registered_host_pids(self, pod_uid: str, container: str) -> set[int]:
        """The host PIDs the agent registered in the container's ACTIVE slots: its processes that
        run the shim (NVML reconciliation, `daemon.reconcile`).

        Raises:
            RegionError, OSError: the container has no valid region.
        """
        with shim.open_region(self.path(pod_uid, container), writable=False) as r:
            view = r.snapshot()
        return {int(s.host_pid) for s in view.procs if s.state == shim.SLOT_ACTIVE and s.host_pid > 0}

    def tend(
        self,
        pod_uid: str,
        container: str,
        cgroup_procs: Path | None,
        driver_holds: Callable[[int], bool],
        proc_root: Path = Path("/proc"),
    ) -> list[int]:
        """Register the container's host PIDs (only when its cgroup's `cgroup.procs` is known:
        the agent never guesses it) and reclaim its dead processes' slots; returns the freed slots.

        Raises:
            RegionError, OSError: no valid region, or its lock was not taken in time.
        """
        with shim.open_region(self.path(pod_uid, container)) as region:
            if cgroup_procs is not None:
                hostpids.register_host_pids(region, cgroup_procs, proc_root)
            return hostpids.reclaim_dead(region, hostpids.process_alive(proc_root), driver_holds)

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
