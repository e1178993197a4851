"""Gang reservations: the GPUs held for every member of a pod group until all of them bind.

kube-scheduler has no gang support an extender can use (no Permit phase for extenders), so the
extender does it itself (docs/contracts.md "Gang labels"):

1. At the first member's filter the whole group is planned at once (`plan_gang`: every member
   or none, honouring the group's locality) and each member's GPUs are held in a *slot* with the
   group's TTL. The first member claims a slot; later members claim the free slot of their shape.
2. A member's bind waits at a *barrier* until every member has reached bind (or is bound), then
   all Bindings are posted. If the TTL ends first, the waiting binds fail, so kube-scheduler
   frees what it assumed for them, and the slots' GPUs are free again.
3. The reservation is written to the API as a ``GangReservation`` (spec: the plan; status: the
   progress), so a restarted extender restores its slots before it reports ready.

This module holds the data and its translation to and from the ``GangReservation`` object;
the decisions are `GpuCache`'s (under its lock) and the API writes `ReservationStore`'s.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from neuronetes import contracts as c
from neuronetes.api import models as m
from neuronetes.model import MILLI_PER_GPU, GpuGrant, Locality, NodeSpec, PodRequest

__all__ = [
    "ANNOTATION_RESERVATION_ID",
    "GangGroup",
    "GangSlot",
    "GangSpec",
    "RestoredGang",
    "decode_reservation",
    "encode_reservation",
    "gang_assignment",
    "reservation_name",
    "same_shape",
]

ANNOTATION_RESERVATION_ID: Final = c.ANNOTATION_RESERVATION_ID
"""Marks which in-memory reservation a ``GangReservation`` object describes (one object per group
is reused, so a late DELETED event of an older reservation must not release a newer one)."""
ANNOTATION_POD_RESOURCES: Final = f"{c.GROUP}/member-resources"
"""CPU milli and memory MiB per member slot ("cpu:mem,cpu:mem,…"), kept for a restart: the CRD's
member entries carry the GPUs only."""
_NAME_OK: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class GangSpec:
    """What the extender knows of a group when it reserves it."""

    size: int
    ttl_seconds: float


@dataclass(slots=True)
class GangSlot:
    """One member's place in a reservation: its node and GPUs, and who claimed it."""

    index: int
    alloc_id: str  # the hold's allocation id: ``group/<namespace>/<group>/<index>``
    request: PodRequest
    node: str
    grants: tuple[GpuGrant, ...]
    pod: str = ""  # identity of the member pod that claimed the slot ("" while free)
    pod_name: str = ""
    pod_uid: str = ""
    bound: bool = False


@dataclass(slots=True)
class GangGroup:
    """A live reservation of one group (namespaced: ``id`` is ``namespace/name``)."""

    id: str
    namespace: str
    name: str
    size: int
    locality: Locality
    expires_at: float  # the cache's clock
    expires_wall: float  # wall clock (what the API object says)
    slots: list[GangSlot]
    reservation_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    arrived: set[str] = field(default_factory=set)  # member pods waiting at the bind barrier
    open: bool = False  # the barrier opened: every member reached bind
    phase: str = "Reserved"

    @property
    def prebound(self) -> int:
        """Members bound before this reservation was made (it holds slots for the rest)."""
        return self.size - len(self.slots)

    @property
    def ready_members(self) -> int:
        """Members bound (before or through this reservation) or waiting at the barrier."""
        return self.prebound + sum(1 for s in self.slots if s.bound or (s.pod and s.pod in self.arrived))

    @property
    def bound_members(self) -> int:
        return sum(1 for s in self.slots if s.bound)


@dataclass(frozen=True, slots=True)
class RestoredGang:
    """A reservation read back from the API (a restarted extender's starting point)."""

    namespace: str
    name: str
    size: int
    locality: Locality
    expires_wall: float
    slots: tuple[GangSlot, ...]
    reservation_id: str
    phase: str


def gang_assignment(group: GangGroup | None) -> c.GangAssignment | None:
    """What a member's assignment records of its gang (None: no gang, or a name too long)."""
    if group is None:
        return None
    try:
        return msgspec.convert({"name": group.name, "size": group.size}, c.GangAssignment)
    except msgspec.ValidationError:
        return None  # e.g. a Volcano group name longer than a label value: not recorded


def _amounts(r: PodRequest) -> tuple[object, ...]:
    return (r.cpu_milli, r.memory_mib, r.gpus, r.gpu_milli, r.gpu_memory_mib, r.mig_profile)


def same_shape(a: PodRequest, b: PodRequest) -> bool:
    """Whether a pod asking `b` may take a slot planned for `a`: the same resources.

    (Placement constraints are the group's: the slot was planned with a member's, and a restored
    slot only knows the amounts.)
    """
    return _amounts(a) == _amounts(b)


def reservation_name(group: str) -> str:
    """The ``GangReservation`` object name of `group` (a DNS subdomain, stable per group)."""
    base = group.lower().replace("_", "-").replace(".", "-")[:50].strip("-")
    digest = hashlib.sha256(group.encode()).hexdigest()[:8]
    name = f"{base}-{digest}" if base and _NAME_OK.fullmatch(base) else f"gang-{digest}"
    return name


def _rfc3339(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode_reservation(group: GangGroup, specs: dict[str, NodeSpec]) -> dict[str, Any]:
    """The ``GangReservation`` object (spec and status) describing `group`."""
    members: list[dict[str, Any]] = []
    resources: list[str] = []
    for slot in group.slots:
        req = slot.request
        spec = specs.get(slot.node)
        uuids = {g.index: g.uuid for g in spec.gpus} if spec is not None else {}
        member: dict[str, Any] = {
            "name": slot.pod_name or f"slot-{slot.index}",
            "node": slot.node,
            "bound": slot.bound,
        }
        if slot.pod_uid:
            member["podUID"] = slot.pod_uid
        if slot.grants:
            member["gpuIndices"] = [g.gpu_index for g in slot.grants]
            if all(g.gpu_index in uuids for g in slot.grants):
                member["gpuUUIDs"] = [uuids[g.gpu_index] for g in slot.grants]
        if req.mig_profile is not None:
            member["migProfile"] = req.mig_profile
            starts = [g.mig_start for g in slot.grants if g.mig_start is not None]
            if starts:
                member["migStart"] = starts[0]
        elif req.shared:
            member["memoryMiB"] = req.gpu_memory_mib
            member["computePercent"] = max(1, req.gpu_milli * 100 // MILLI_PER_GPU)
        else:
            member["memoryMiB"] = 0
        members.append(member)
        resources.append(f"{req.cpu_milli}:{req.memory_mib}")
    return {
        "apiVersion": c.API_VERSION,
        "kind": "GangReservation",
        "metadata": {
            "name": reservation_name(group.name),
            "namespace": group.namespace,
            "annotations": {
                ANNOTATION_RESERVATION_ID: group.reservation_id,
                c.ANNOTATION_LOCALITY: group.locality.value,  # kept for a restart
                ANNOTATION_POD_RESOURCES: ",".join(resources),
            },
        },
        "spec": {
            "groupName": group.name,
            "size": group.size,
            "expiresAt": _rfc3339(group.expires_wall),
            "members": members,
        },
        "status": {"phase": group.phase, "boundMembers": group.bound_members},
    }


class ReservationDecodeError(ValueError):
    """A ``GangReservation`` object that cannot be restored."""


def decode_reservation(obj: dict[str, Any]) -> RestoredGang:
    """A `RestoredGang` from a ``GangReservation`` object written by `encode_reservation`.

    Raises:
        ReservationDecodeError: not valid against the CRD's schema, or missing what a restart
            needs (the member resources annotation).
    """
    try:
        res = m.decode(obj, m.GangReservation)
    except msgspec.ValidationError as exc:
        raise ReservationDecodeError(str(exc)) from None
    meta = res.metadata
    annotations = meta.get("annotations") or {}
    namespace = str(meta.get("namespace") or "")
    try:
        locality = Locality.parse(annotations.get(c.ANNOTATION_LOCALITY))
        resources = [
            tuple(int(x) for x in part.split(":"))
            for part in annotations[ANNOTATION_POD_RESOURCES].split(",")
        ]
    except (KeyError, ValueError) as exc:
        raise ReservationDecodeError(f"{meta.get('name')}: unreadable annotations: {exc}") from None
    members = res.spec.members or []
    if len(resources) != len(members):
        raise ReservationDecodeError(
            f"{meta.get('name')}: {len(members)} members, {len(resources)} resources"
        )
    slots: list[GangSlot] = []
    group_id = f"{namespace}/{res.spec.group_name}"
    for i, (member, (cpu, memory)) in enumerate(zip(members, resources, strict=True)):
        indices = list(member.gpu_indices or [])
        if member.mig_profile is not None:
            req = PodRequest(cpu_milli=cpu, memory_mib=memory, gpus=1, mig_profile=member.mig_profile)
            grants = tuple(GpuGrant(j, 0, 0, member.mig_profile, member.mig_start) for j in indices)
        elif member.memory_mib:
            milli = member.compute_percent * (MILLI_PER_GPU // 100)
            req = PodRequest(
                cpu_milli=cpu,
                memory_mib=memory,
                gpus=len(indices),
                gpu_milli=milli,
                gpu_memory_mib=member.memory_mib,
            )
            grants = tuple(GpuGrant(j, milli, member.memory_mib) for j in indices)
        else:
            req = PodRequest(cpu_milli=cpu, memory_mib=memory, gpus=len(indices))
            grants = tuple(GpuGrant(j, MILLI_PER_GPU, 0) for j in indices)  # memory: filled by the cache
        slot_name = member.name if not member.name.startswith("slot-") else ""
        slots.append(
            GangSlot(
                index=i,
                alloc_id=f"group/{group_id}/{i}",
                request=req,
                node=member.node,
                grants=grants,
                pod_name=slot_name,
                pod_uid=member.pod_uid or "",
                bound=member.bound,
            )
        )
    wall = res.spec.expires_at.timestamp()
    return RestoredGang(
        namespace=namespace,
        name=res.spec.group_name,
        size=res.spec.size,
        locality=locality,
        expires_wall=wall,
        slots=tuple(slots),
        reservation_id=str(annotations.get(ANNOTATION_RESERVATION_ID) or ""),
        phase=(res.status.phase if res.status is not None and res.status.phase else "Reserved"),
    )
