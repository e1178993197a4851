"""GPUSlices in the GPU cache: a Bound slice is a reservation on one GPU, and the pods that name it
run inside it (docs/gpuslice.md).

What a slice reserves is read from its **status** only: ``status.node``, ``status.gpuUUIDs[0]``,
``status.memoryMiB``, ``status.computePercent`` and ``status.qosClass``, written by the operator
when it binds the slice (tenants may write a slice's spec, never its status subresource). A slice
whose phase is ``Bound`` or ``Active`` is charged on its GPU as ``slice/<namespace>/<name>`` until
its phase leaves those (``Released``) or the object is gone, also while a deletion waits on the
operator's finalizer. A pod naming the slice is placed on the slice's node, gets the slice's GPU
and share in its assignment, and is charged only its CPU and memory. A MIG slice (``status.migProfile``
and ``migStart``) holds its MIG instance the same way, and its pod gets exactly that instance.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.inventory import ClusterState
from neuronetes.model import MILLI_PER_GPU, GpuGrant

from .holds import HoldBook
from .ledger import allocate_evicting, claimed_gpus
from .pods import PodInfo
from .snapshot import Snapshot
from .watch import CustomObject

__all__ = [
    "BOUND_PHASES",
    "GPUSLICES",
    "SliceBook",
    "SliceInfo",
    "slice_covers",
    "slice_of",
    "slice_request_mismatch",
]

log = logging.getLogger(__name__)

GPUSLICES: Final = "gpuslices"
BOUND_PHASES: Final = frozenset({"Bound", "Active"})
_MAX_MIB: Final = c.MAX_GPU_MEMORY_MIB
_QOS: Final = frozenset(q.value for q in c.QoS)


@dataclass(frozen=True, slots=True)
class SliceInfo:
    """What one Bound slice reserves, as its status says."""

    namespace: str
    name: str
    node: str
    gpu_uuid: str
    memory_mib: int
    compute_percent: int
    qos: c.QoS
    mig_profile: str | None = None  # a MIG slice: the instance of this profile at `mig_start`
    mig_start: int | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def alloc_id(self) -> str:
        return "slice/" + self.key

    @property
    def milli(self) -> int:
        return self.compute_percent * (MILLI_PER_GPU // 100)

    def grant(self, j: int) -> GpuGrant:
        """What the slice holds on its GPU (column `j`): its MIG instance, else its share."""
        if self.mig_profile is not None:
            return GpuGrant(j, 0, 0, self.mig_profile, self.mig_start)
        return GpuGrant(j, self.milli, self.memory_mib)


def _int(value: Any, low: int, high: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high else None


def slice_of(obj: CustomObject) -> SliceInfo | None:
    """The reservation of a GPUSlice object (None: it reserves nothing now). A Bound slice whose
    status lacks a field is logged and reserves nothing until the operator completes it."""
    status = obj.status or {}
    if status.get("phase") not in BOUND_PHASES:
        return None
    meta = obj.metadata
    node, uuids = status.get("node"), status.get("gpuUUIDs")
    memory = _int(status.get("memoryMiB"), 1, _MAX_MIB)
    percent = _int(status.get("computePercent"), 1, 100)
    qos = status.get("qosClass")
    profile, start = status.get("migProfile"), _int(status.get("migStart"), 0, 7)
    placed = (
        isinstance(node, str) and node and isinstance(uuids, list) and uuids and isinstance(uuids[0], str)
    )
    if placed and qos in _QOS:
        gpu = str(uuids[0])  # type: ignore[index]
        if profile is None and memory is not None and percent is not None:
            return SliceInfo(meta.namespace, meta.name, str(node), gpu, memory, percent, c.QoS(qos))
        if isinstance(profile, str) and start is not None:  # a MIG slice: the instance, isolated
            return SliceInfo(
                meta.namespace, meta.name, str(node), gpu, memory or 0, 100, c.QoS(qos), profile, start
            )
    log.warning(
        "GPUSlice %s/%s is %s but its status does not say what it reserves; not counted",
        meta.namespace,
        meta.name,
        status.get("phase"),
    )
    return None


def slice_request_mismatch(pod: PodInfo, sl: SliceInfo) -> str | None:
    """Why `pod` cannot run inside `sl` as it asks (None: it asks for exactly the slice's share)."""
    where = f"pod {pod.key} names GPUSlice {sl.name}"
    if pod.gang is not None:
        return f"{where} and a gang ({pod.gang.name}); a gang member cannot run inside a slice"
    gpu = pod.gpu
    if sl.mig_profile is not None:
        if gpu is None or gpu.request.mig_profile != sl.mig_profile or gpu.request.gpus != 1:
            return (
                f"{where}, a MIG {sl.mig_profile} instance, but does not ask for exactly one "
                f"{c.mig_resource_name(sl.mig_profile)}; the webhook sets it from the slice: recreate "
                "the pod without NeuroNetes resources"
            )
        return None
    if gpu is None or gpu.request.mig_profile is not None or gpu.request.exclusive:
        return (
            f"{where} but does not ask for a shared slice "
            f"({c.RESOURCE_GPU_MEMORY}/{c.RESOURCE_GPU_COMPUTE}); "
            "the webhook sets them from the slice: recreate the pod without NeuroNetes resources"
        )
    req = gpu.request
    if req.gpu_memory_mib != sl.memory_mib or req.gpu_milli != sl.milli:
        return (
            f"{where}: it asks for {req.gpu_memory_mib} MiB and {req.gpu_milli * 100 // MILLI_PER_GPU}% "
            f"but the slice holds {sl.memory_mib} MiB and {sl.compute_percent}%; ask for the slice's share"
        )
    return None


def slice_covers(pod: PodInfo, slices: Mapping[str, SliceInfo]) -> bool:
    """Whether the bound `pod`'s GPUs lie inside the slice it names: its assignment claims only the
    slice's GPU, on the slice's node, within the slice's share (then the pod is not charged for
    GPUs again). A pod whose assignment reaches beyond is charged as any pod."""
    sl = slices.get(pod.slice_key) if pod.slice else None
    doc = pod.assignment
    if sl is None or doc is None or doc.node != pod.node or sl.node != pod.node:
        return False
    claims = claimed_gpus(doc)
    if sl.mig_profile is not None:
        return [(cl.uuid, cl.mig_profile, cl.mig_start) for cl in claims] == [
            (sl.gpu_uuid, sl.mig_profile, sl.mig_start)
        ]
    return bool(claims) and all(
        cl.uuid == sl.gpu_uuid
        and cl.mig_profile is None
        and cl.milli <= sl.milli
        and cl.memory_mib <= sl.memory_mib
        for cl in claims
    )


def gpu_index(state: ClusterState, row: int, uuid: str) -> int | None:
    """The column of GPU `uuid` on node row `row` (None: the node has no such GPU)."""
    for gpu in state.nodes[row].gpus:
        if gpu.uuid == uuid:
            return gpu.index
    return None


class SliceBook:
    """The Bound slices' allocations in the snapshot's state (not thread-safe on its own)."""

    def __init__(self) -> None:
        self.unaccounted: set[str] = set()
        self.conflicts = 0

    def retry(self, snap: Snapshot, holds: HoldBook, slices: Mapping[str, SliceInfo]) -> None:
        """Charge the slices left out for a conflict again (something bound on their node went)."""
        for key in sorted(self.unaccounted):
            sl = slices.get(key)
            if sl is None:
                self.unaccounted.discard(key)
            elif sl.alloc_id not in snap.state.allocations:
                self.account(snap, holds, sl, again=True)

    def account(self, snap: Snapshot, holds: HoldBook, sl: SliceInfo, *, again: bool = False) -> None:
        """Charge `sl` on its GPU (the state holds none of it yet); holds there give way."""
        st = snap.state
        self.unaccounted.discard(sl.key)
        i = st.index.get(sl.node)
        if i is None:
            return  # its node is not (yet) known: nothing to place there
        j = gpu_index(st, i, sl.gpu_uuid)
        grant = None if j is None else sl.grant(j)
        if grant is None or not allocate_evicting(snap, holds, sl.alloc_id, i, 0, 0, (grant,)):
            self.unaccounted.add(sl.key)
            if again:
                return
            self.conflicts += 1
            log.error(
                "GPUSlice %s is Bound to %s GPU %s but that share (or MIG instance) is not free there "
                "(or no such GPU or instance); "
                "it is not counted",
                sl.key,
                sl.node,
                sl.gpu_uuid,
            )
