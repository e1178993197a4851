"""The pods of a node that hold GPUs, read from their assignment annotations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neuronetes import contracts as c

from .publish import Allocation

__all__ = ["PodUse", "pod_use"]


@dataclass(frozen=True, slots=True)
class PodUse:
    """A pod of the node with a GPU assignment: what it holds on which GPU."""

    namespace: str
    name: str
    uid: str
    running: bool
    allocations: Mapping[str, tuple[Allocation, ...]]  # GPU UUID -> allocations
    assignment: c.Assignment
    annotation: str  # the assignment annotation as the API server has it (the node ledger pins it)


def pod_use(pod: Mapping[str, Any]) -> PodUse | None:
    """The GPUs a pod holds, from its assignment annotation; None without one, or when the pod has
    finished, or for an assignment the node refuses (malformed, for another node, or copied from
    another pod: the NRI plugin does not start such containers, so they hold nothing)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    raw = (meta.get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
    if not raw or status.get("phase") in ("Succeeded", "Failed"):
        return None
    try:
        assignment = c.decode_assignment(raw)
    except c.AssignmentError:
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    if assignment.node != node or (assignment.pod_uid is not None and assignment.pod_uid != meta.get("uid")):
        return None
    allocations: dict[str, list[Allocation]] = {}
    for container, grant in assignment.containers.items():
        for g in grant.gpus:
            entry: Allocation = {
                "namespace": meta.get("namespace", ""),
                "pod": meta.get("name", ""),
                "podUID": meta.get("uid", ""),
                "container": container,
                "memoryMiB": g.memory_mib,
                "computePercent": g.compute_percent,
                "priority": grant.priority,
            }
            if g.mig_profile is not None:
                entry["migProfile"] = g.mig_profile  # resolved to the instance UUID by the node
                entry["migStart"] = g.mig_start
            allocations.setdefault(g.uuid, []).append(entry)
    return PodUse(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        running=status.get("phase") == "Running",
        allocations={k: tuple(v) for k, v in allocations.items()},
        assignment=assignment,
        annotation=raw,
    )
