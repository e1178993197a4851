"""The gang manager: plan, claim, barrier and release of gang reservations (restoring them
from the API is `gang_restore`'s job; a lone pod's hold is the `HoldBook`'s).

Shaped like scheduler-plugins' coscheduling ``core.Manager``. At a member's filter the whole
group is planned at once by the pure `plan_gang` and committed here as one hold per member
slot (`HoldBook`), all with the group's deadline; members claim the slot of their shape; each
member's bind arrives at the barrier (`arrive`, non-blocking: it answers open / wait / failed)
and the barrier opens when every member is there. A reservation ends bound, released, failed
or expired (its slots' holds expire together: the hold TTL is the only clock). Every change is
told to `on_change` (the `GangReservation` writer) and `barrier_listener` (binds waiting on the
group), both called under the cache's lock: they must not block. Not thread-safe on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from neuronetes.engine.gang import plan_gang
from neuronetes.model import Locality, NodeSpec, Placement, PodRequest

from .gangs import GangGroup, GangSlot, GangSpec, same_shape
from .holds import HoldBook, owned_by
from .pods import PodInfo
from .results import BarrierState, BindPlan, CacheInvariantError, Explanation, FilterDecision, Hold
from .snapshot import REASON_UNKNOWN_NODE, NodeLookup, Snapshot, violated_locality
from .store import ClusterStore

__all__ = ["GangListener", "GangManager"]

log = logging.getLogger(__name__)

GangListener = Callable[[GangGroup, dict[str, NodeSpec], bool], None]
"""Told (under the cache's lock: it must not block) of every change of a gang reservation:
the group, the node specs, and whether the reservation has ended (its phase says how)."""
REASON_ENDED = "gang reservation ended before every member reached bind (expired or released)"


class GangManager:
    def __init__(self, snap: Snapshot, store: ClusterStore, holds: HoldBook) -> None:
        self._snap = snap
        self._store = store
        self._holds = holds
        self.groups: dict[str, GangGroup] = {}
        self.on_change: GangListener | None = None
        self.barrier_listener: Callable[[str], None] | None = None
        self._failing: str | None = None  # set by `fail_waiting`: no barrier opens any more

    # ---- notifications -------------------------------------------------------------------------
    def emit(self, group: GangGroup, ended: bool = False) -> None:
        """Tell the listeners `group` changed (`ended`: its reservation is over)."""
        listener = self.on_change
        if listener is not None:
            try:
                listener(group, self._store.specs, ended)
            except Exception:  # a listener's failure must not break a decision
                log.exception("gang %s: reservation listener failed", group.id)
        self._poke(group.id)

    def _poke(self, group_id: str) -> None:
        listener = self.barrier_listener
        if listener is not None:
            try:
                listener(group_id)
            except Exception:
                log.exception("gang %s: barrier listener failed", group_id)

    # ---- lifecycle -----------------------------------------------------------------------------
    def end(self, group: GangGroup, phase: str, *, emit: bool = True) -> int:
        """Release every unbound slot of `group` and forget it; returns how many were held."""
        if self.groups.get(group.id) is group:
            del self.groups[group.id]
        held = 0
        for slot in group.slots:
            if not slot.bound and slot.alloc_id in self._holds:
                self._holds.drop(self._snap.state, slot.alloc_id)
                held += 1
        group.phase = phase
        if emit:
            self.emit(group, ended=True)
        else:
            self._poke(group.id)
        return held

    def expire(self, hold: Hold) -> bool:
        """`hold`'s TTL passed: if it is a slot of a live group, the whole reservation expires."""
        group = self.groups.get(hold.group) if hold.group else None
        if group is None:
            return False
        log.info(
            "gang %s: reservation expired with %d of %d members at bind",
            group.id,
            group.ready_members,
            group.size,
        )
        self.end(group, "Expired")
        return True

    def plan(
        self,
        group_id: str,
        namespace: str,
        name: str,
        size: int,
        members: Sequence[PodRequest],
        locality: Locality,
        ttl: float,
        candidates: Sequence[int] | None = None,
    ) -> GangGroup | None:
        """Plan every member at once (`plan_gang`) and hold each slot, or nothing."""
        snap = self._snap
        plan = plan_gang(snap.engine, members, locality, candidates=candidates)
        if plan is None:
            return None
        expires = snap.now() + ttl
        group = GangGroup(
            id=group_id,
            namespace=namespace,
            name=name,
            size=size,
            locality=locality,
            expires_at=expires,
            expires_wall=time.time() + ttl,
            slots=[],
        )
        for k, placement in enumerate(plan.placements):
            req = placement.request
            alloc = snap.state.allocate(
                f"group/{group_id}/{k}", placement.node_index, req.cpu_milli, req.memory_mib, placement.grants
            )  # the plan was made on this very state: it fits (OversubscriptionError is a bug)
            hold = Hold(
                alloc_id=alloc.id,
                pod="",
                node=placement.node,
                request=req,
                gpu=None,
                grants=alloc.grants,
                expires_at=expires,
                score=placement.score,
                reason=placement.reason,
                group=group_id,
            )
            self._holds.put(hold)
            group.slots.append(GangSlot(k, alloc.id, members[k], placement.node, alloc.grants))
        self.groups[group_id] = group
        self.emit(group)
        return group

    def leave_slot_of(self, hold: Hold, *, bound: bool) -> bool:
        """If `hold` is a slot of a live group, its pod leaves it (`leave_slot`); False: it is
        not (a lone pod's hold, the `HoldBook`'s to drop)."""
        if not hold.group or hold.group not in self.groups:
            return False
        self.leave_slot(hold, bound=bound)
        return True

    def claim(self, group: GangGroup, slot: GangSlot, pod: PodInfo) -> Hold:
        """`pod` takes `slot` (its hold now carries the pod's identity and GPU request)."""
        old = self._holds.of(pod.id)
        if old is not None and old.alloc_id != slot.alloc_id and not self.leave_slot_of(old, bound=False):
            self._holds.drop(self._snap.state, old.alloc_id)  # a lone hold the pod had before
        held = self._holds.get(slot.alloc_id)
        if held is None:
            raise CacheInvariantError(f"gang {group.id}: slot {slot.alloc_id} has no hold")
        hold = replace(held, request=pod.request, **owned_by(pod))
        self._holds.put(hold)
        slot.pod, slot.pod_name, slot.pod_uid = pod.id, pod.name, pod.uid
        self.emit(group)
        return hold

    def leave_slot(self, hold: Hold, *, bound: bool) -> None:
        """A member's slot: bound (its GPUs are the pod's now), or handed back to the group."""
        group = self.groups[hold.group]
        slot = next(s for s in group.slots if s.alloc_id == hold.alloc_id)
        group.arrived.discard(hold.pod)
        if bound:
            slot.bound = True
            self._holds.drop(self._snap.state, hold.alloc_id, freed=False)
            if all(s.bound for s in group.slots):
                log.info("gang %s: all %d members bound", group.id, group.size)
                self.end(group, "Bound")
                return
        else:
            self._holds.detach(hold)
            self._holds.put(
                replace(
                    hold, pod="", request=slot.request, gpu=None, uid="", namespace="", name="", priority=0
                )
            )
            slot.pod = slot.pod_name = slot.pod_uid = ""
        self.emit(group)

    def reserve(
        self, group_id: str, members: Sequence[PodRequest], locality: Locality, ttl: float | None
    ) -> tuple[Hold, ...] | None:
        """Hold GPUs for every member of `group_id` at once, or for none (a known reservation of
        the group is released first; `ttl` defaults to the assume TTL)."""
        existing = self.groups.get(group_id)
        if existing is not None:
            self.end(existing, "Released")
        namespace, _, name = group_id.rpartition("/")
        ttl = self._snap.settings.assume_ttl_seconds if ttl is None else ttl
        planned = self.plan(group_id, namespace, name, len(members), members, locality, ttl)
        if planned is None:
            return None
        return tuple(h for s in planned.slots if (h := self._holds.get(s.alloc_id)) is not None)

    def release(self, group_id: str, reservation_id: str | None = None) -> int:
        group = self.groups.get(group_id)
        if group is None or (reservation_id is not None and group.reservation_id != reservation_id):
            return 0
        return self.end(group, "Released")

    # ---- a member's filter ---------------------------------------------------------------------
    def filter_member(self, pod: PodInfo, lookup: NodeLookup, spec: GangSpec) -> FilterDecision | None:
        """A gang member's filter: its slot in the group's reservation (None: place it alone)."""
        gang, group_id = pod.gang, pod.gang_id
        if gang is None or group_id is None:
            return None
        group = self.groups.get(group_id)
        if group is not None and any(not s.bound and s.alloc_id not in self._holds for s in group.slots):
            log.info("gang %s: a reserved slot was lost (node change or eviction); planning again", group_id)
            self.end(group, "Released")
            group = None
        if group is None:
            mates = [p for p in self._store.pods.values() if p.gang_id == group_id and p.id != pod.id]
            bound = sum(1 for p in mates if p.holds_resources and p.gpu is not None)
            needed = spec.size - bound
            if needed <= 0:
                return None  # the gang is complete: an extra member is placed like any pod
            waiting = sorted(
                (p for p in mates if p.pending_gpu and p.gpu is not None and not p.gpu_error),
                key=lambda p: p.name,
            )
            members = [pod.request, *(p.request for p in waiting[: needed - 1])]
            members += [pod.request] * (needed - len(members))
            locality = pod.request.locality
            candidates = lookup.candidates.tolist()
            group = self.plan(
                group_id, pod.namespace, gang.name, spec.size, members, locality, spec.ttl_seconds, candidates
            )
            if group is None:
                where = "" if locality is Locality.ANY else f" {locality.value}"
                reason = f"gang {gang.name}: no room for all {needed} members{where}"
                return FilterDecision((), lookup.reject_all(reason, REASON_UNKNOWN_NODE), {}, None)
        slot = next((s for s in group.slots if s.pod == pod.id and not s.bound), None)
        if slot is None:
            free = [s for s in group.slots if not s.pod and not s.bound]
            slot = next((s for s in free if same_shape(s.request, pod.request)), None)
            if slot is None:
                reason = (
                    f"gang {gang.name}: no reserved member slot has this pod's resources"
                    if free
                    else f"gang {gang.name}: all {len(group.slots)} reserved member slots are taken"
                )
                return FilterDecision((), lookup.reject_all(reason, REASON_UNKNOWN_NODE), {}, None)
            hold = self.claim(group, slot, pod)
        else:
            held = self._holds.get(slot.alloc_id)
            if held is None:
                raise CacheInvariantError(f"gang {group.id}: slot {slot.alloc_id} has no hold")
            hold = held
        st = self._snap.state
        row = st.index.get(slot.node, -1)
        if row < 0 or not bool((lookup.candidates == row).any()):
            reason = (
                f"gang {gang.name}: this member's gpus are reserved on {slot.node}, not among these nodes"
            )
            return FilterDecision((), lookup.reject_all(reason, REASON_UNKNOWN_NODE), {}, None)
        reason = f"gang {gang.name}: gpus reserved on {slot.node}"
        placement = Placement(hold.request, slot.node, row, hold.grants, hold.score, hold.reason)
        explanation = Explanation(
            slot.node,
            tuple(g.gpu_index for g in hold.grants),
            tuple(st.nodes[row].gpus[g.gpu_index].uuid for g in hold.grants),
            f"gang {gang.name} ({group.size} members): {hold.reason}",
        )
        return FilterDecision(
            (slot.node,),
            lookup.reject_all(reason, REASON_UNKNOWN_NODE, keep=row),
            {},
            hold,
            violated_locality(st, placement),
            explanation,
        )

    # ---- the bind barrier ----------------------------------------------------------------------
    def arrive(self, plan: BindPlan) -> BarrierState:
        """`plan`'s member is at bind: open, wait or failed (idempotent; never blocks)."""
        group = self.groups.get(plan.group)
        if group is None or group.reservation_id != plan.reservation_id:
            return BarrierState("failed", REASON_ENDED, 0, 0, 0.0)
        slot = next((s for s in group.slots if s.pod == plan.pod), None)
        if slot is None or (not slot.bound and slot.alloc_id not in self._holds):
            reason = f"gang {group.name}: this member's reserved gpus were released"
            return BarrierState("failed", reason, group.ready_members, group.size, group.expires_at)
        if self._failing is not None and not group.open:
            return BarrierState("failed", self._failing, group.ready_members, group.size, group.expires_at)
        arrived = plan.pod not in group.arrived and not slot.bound
        if arrived:
            group.arrived.add(plan.pod)
        if group.open or group.ready_members >= group.size:
            if not group.open:
                self._open_barrier(group)
            return BarrierState("open", "", group.ready_members, group.size, group.expires_at)
        if arrived:
            self.emit(group)
        reason = (
            f"gang {group.name}: {group.ready_members} of {group.size} members at bind; waiting for the rest"
        )
        return BarrierState("wait", reason, group.ready_members, group.size, group.expires_at)

    def _open_barrier(self, group: GangGroup) -> None:
        """Every member reached bind: the Bindings go out; holds last the assume TTL from now."""
        group.open = True
        group.phase = "Binding"
        deadline = self._snap.now() + self._snap.settings.assume_ttl_seconds
        if deadline > group.expires_at:
            group.expires_wall += deadline - group.expires_at
            group.expires_at = deadline
        for slot in group.slots:
            if slot.alloc_id in self._holds:
                self._holds.renew(slot.alloc_id, group.expires_at)
        log.info("gang %s: all %d members at bind, binding", group.id, group.size)
        self.emit(group)

    def fail_waiting(self, reason: str) -> None:
        """From now on no barrier opens: every member waiting (or arriving) is told `reason`."""
        self._failing = reason
        for group_id in [g.id for g in self.groups.values() if not g.open]:
            self._poke(group_id)
