"""The cluster's GPUs as the cluster commands show them, built from API objects.

A GPU's use is read from the pods' `neuronetes.io/assigned-gpus` annotations (what the extender
decided and bound, the same books kube-scheduler's pods are charged to), its health, cordon and
offline state from its GPUNode. A node's fragmentation is the placement engine's own measure
(FGD): the free GPU share that the cluster's GPU pod shapes (pending and placed, the workload
profile) could not use, computed by `neuronetes.engine.frag.node_fragmentation`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from neuronetes import contracts as c
from neuronetes import mig
from neuronetes.assignment import pod_gpu_request
from neuronetes.engine.frag import node_fragmentation
from neuronetes.engine.profile import WorkloadProfile
from neuronetes.model import MILLI_PER_GPU, PodRequest
from neuronetes.quantity import to_milli

from .kube import offline_gpus

__all__ = ["GpuView", "NodeView", "cluster_views", "gpu_requests", "pod_is_live"]

SCHEDULABLE_HEALTH: Final = frozenset({"Available", "Allocated", "InUse"})
TERMINAL: Final = frozenset({"Succeeded", "Failed"})


@dataclass(slots=True)
class GpuView:
    node: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    health: str
    reason: str
    cordoned: bool
    offline: bool
    milli: int = 0  # compute share given out, milli-GPU
    memory_used_mib: int = 0
    users: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return self.health in SCHEDULABLE_HEALTH and not self.cordoned and not self.offline

    @property
    def free_milli(self) -> int:
        return max(0, MILLI_PER_GPU - self.milli) if self.usable else 0

    def document(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "health": self.health,
            "healthReason": self.reason,
            "cordoned": self.cordoned,
            "offline": self.offline,
            "allocatedMilli": self.milli,
            "freeMilli": self.free_milli,
            "memoryMiB": self.memory_mib,
            "memoryAllocatedMiB": self.memory_used_mib,
            "pods": self.users,
        }


@dataclass(slots=True)
class NodeView:
    name: str
    model: str
    gpus: list[GpuView]
    ready: str  # the GPUNode's Ready condition: True, False or Unknown
    heartbeat: str
    fragmentation_milli: float = 0.0

    @property
    def allocated_milli(self) -> int:
        return sum(g.milli for g in self.gpus)

    @property
    def free_milli(self) -> int:
        return sum(g.free_milli for g in self.gpus)

    def document(self, with_gpus: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "node": self.name,
            "model": self.model,
            "gpus": len(self.gpus),
            "healthy": sum(g.health in SCHEDULABLE_HEALTH for g in self.gpus),
            "ready": self.ready,
            "lastHeartbeatTime": self.heartbeat,
            "allocatedMilli": self.allocated_milli,
            "freeMilli": self.free_milli,
            "fragmentationMilli": round(self.fragmentation_milli, 1),
        }
        if with_gpus:
            doc["gpuList"] = [g.document() for g in self.gpus]
        return doc


def pod_is_live(pod: Mapping[str, Any]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return status.get("phase") not in TERMINAL and not meta.get("deletionTimestamp")


def gpu_requests(pods: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], PodRequest]]:
    """Every live pod that asks for NeuroNetes GPUs, with its effective request (pods whose
    request cannot be read are left out: the webhook and the extender refuse them)."""
    out = []
    for pod in pods:
        if not pod_is_live(pod):
            continue
        try:
            ask = pod_gpu_request(pod)
        except ValueError:
            continue
        if ask is not None:
            out.append((pod, ask.request))
    return out


def _gpu_use(pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int, list[str]]]:
    """uuid -> (milli-GPU, memory MiB, pods) given out by the assignments of live pods."""
    use: dict[str, list[Any]] = defaultdict(lambda: [0, 0, []])
    for pod in pods:
        meta = pod.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        if raw is None or not pod_is_live(pod) or not (pod.get("spec") or {}).get("nodeName"):
            continue
        try:
            assignment = c.decode_assignment(raw)
        except c.AssignmentError:
            continue
        who = f"{meta.get('namespace')}/{meta.get('name')}"
        seen: set[tuple[str, int | None]] = set()
        for container in assignment.containers.values():
            for g in container.gpus:
                # Containers of one pod that share a GPU (init, then app) do not run at once.
                if (g.uuid, g.mig_start) in seen:
                    continue
                seen.add((g.uuid, g.mig_start))
                entry = use[g.uuid]
                if g.mig_profile is not None:  # an instance: its compute slices, not the whole GPU
                    entry[0] += mig.compute_milli(g.mig_profile)
                else:
                    entry[0] += g.compute_percent * MILLI_PER_GPU // 100
                entry[1] += g.memory_mib
                entry[2].append(who)
    return {k: (int(v[0]), int(v[1]), list(v[2])) for k, v in use.items()}


def _free_cpu(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """node -> allocatable CPU (milli) less the requests of its live pods."""
    free: dict[str, int] = {}
    for node in nodes:
        alloc = (node.get("status") or {}).get("allocatable") or {}
        free[str(node["metadata"]["name"])] = to_milli(alloc.get("cpu", 0))
    for pod in pods:
        where = (pod.get("spec") or {}).get("nodeName")
        if where in free and pod_is_live(pod):
            for ctr in (pod.get("spec") or {}).get("containers") or ():
                cpu = ((ctr.get("resources") or {}).get("requests") or {}).get("cpu")
                free[where] -= to_milli(cpu) if cpu else 0
    return free


def _condition(gpunode: Mapping[str, Any], kind: str) -> str:
    for cond in (gpunode.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return str(cond.get("status", "Unknown"))
    return "Unknown"


def cluster_views(
    gpunodes: list[dict[str, Any]], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> list[NodeView]:
    """One view per GPUNode, its GPUs' use and the node's fragmentation filled in."""
    use = _gpu_use(pods)
    views = []
    for obj in gpunodes:
        name = str(obj["metadata"]["name"])
        status = obj.get("status") or {}
        cordoned = set((obj.get("spec") or {}).get("cordonedGPUs") or ())
        offline = offline_gpus(obj)
        gpus = []
        for g in sorted(status.get("gpus") or (), key=lambda g: int(g.get("index", 0))):
            uuid = str(g.get("uuid", ""))
            milli, memory, users = use.get(uuid, (0, 0, []))
            gpus.append(
                GpuView(
                    node=name,
                    index=int(g.get("index", 0)),
                    uuid=uuid,
                    model=str(g.get("model", "")),
                    memory_mib=int(g.get("memoryMiB", 0)),
                    health=str(g.get("health", "Unknown")),
                    reason=str(g.get("healthReason", "")),
                    cordoned=uuid in cordoned,
                    offline=uuid in offline,
                    milli=min(milli, MILLI_PER_GPU),
                    memory_used_mib=memory,
                    users=users,
                )
            )
        views.append(
            NodeView(
                name=name,
                model=str(status.get("model", "")),
                gpus=gpus,
                ready=_condition(obj, "Ready"),
                heartbeat=str(status.get("lastHeartbeatTime", "")),
            )
        )
    _fill_fragmentation(views, _free_cpu(nodes, pods), [r for _, r in gpu_requests(pods)])
    return views


def _fill_fragmentation(
    views: list[NodeView], free_cpu: Mapping[str, int], requests: list[PodRequest]
) -> None:
    """FGD's fragmentation of each node against the profile of the cluster's GPU pods."""
    if not views or not requests:
        return
    models = tuple(sorted({v.model for v in views}))
    width = max(len(v.gpus) for v in views) or 1
    left = np.zeros((len(views), width), dtype=np.int64)
    for r, view in enumerate(views):
        for k, gpu in enumerate(view.gpus):
            left[r, k] = gpu.free_milli
    cpu = np.array([max(0, free_cpu.get(v.name, 0)) for v in views], dtype=np.int64)
    model = np.array([models.index(v.model) for v in views], dtype=np.int64)
    frag = node_fragmentation(left, cpu, model, WorkloadProfile.from_requests(requests).arrays(models))
    for view, value in zip(views, frag.tolist(), strict=True):
        view.fragmentation_milli = float(value)
