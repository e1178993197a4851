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
from collections.abc import Mapping
from pathlib import Path

from neuronetes import contracts as c
from neuronetes.agent import region as shim

from .devices import Inventory

__all__ = ["RegionKeeper"]

_QOS = {
    c.QoS.GUARANTEED: shim.QOS_GUARANTEED,
    c.QoS.BURSTABLE: shim.QOS_BURSTABLE,
    c.QoS.BEST_EFFORT: shim.QOS_BEST_EFFORT,
}


class RegionKeeper:
    """Creates and removes the regions under `root` (``/run/neuronetes/containers`` on a node)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, pod_uid: str, container: str) -> Path:
        return self.root / pod_uid / container / "region"

    def sync(self, pods: Mapping[str, tuple[str, str, c.Assignment]], inventory: Inventory) -> list[str]:
        """Make the regions match `pods` (pod UID -> (namespace, name, assignment)); returns one
        message per region that could not be written."""
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
                if stale.name not in pods:
                    shutil.rmtree(stale, ignore_errors=True)
        return errors

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
