"""The ledger of bound pods: what each bound pod holds on its node, written by the extender.

A pod's allocation is recorded once: from the extender's own bind (exactly the GPUs it held for
the pod), or, for a pod the cache first sees already bound (a restarted extender, or a pod bound
without us), from the pod as it is then, counted conservatively: never less than its
``neuronetes.io/assigned-gpus`` annotation claims on each GPU and never less than its request
needs (GPUs the annotation does not name are picked by the engine). After that the annotation
is not read again: a tenant who patches it after bind frees nothing (the change is logged and
counted in `ignored_changes`). The entry goes when the pod finishes or is deleted.

A bound pod outranks holds: when its resources are taken by holds, the holds give way (the API
server is the truth); when they are taken by another bound pod, it is a double booking, counted
in `conflicts` and left out rather than oversubscribing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from neuronetes import contracts as c
from neuronetes.engine import Unschedulable
from neuronetes.inventory import OversubscriptionError
from neuronetes.model import MILLI_PER_GPU, GpuGrant

from .holds import HoldBook
from .pods import PodInfo
from .snapshot import Snapshot

__all__ = ["Ledger", "allocate_evicting", "claimed_gpus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Entry:
    node: str
    grants: tuple[GpuGrant, ...]
    assignment: c.Assignment | None  # the annotation as it was when the entry was made


@dataclass(frozen=True, slots=True)
class GpuClaim:
    """What an assignment claims on one GPU (the largest slice any of its containers got)."""

    uuid: str
    mig_profile: str | None
    mig_start: int | None
    milli: int
    memory_mib: int


def claimed_gpus(assignment: c.Assignment) -> list[GpuClaim]:
    """Distinct GPUs (or MIG instances) the assignment's containers use, with their claims."""
    seen: dict[tuple[str, int | None], GpuClaim] = {}
    for container in assignment.containers.values():
        for gpu in container.gpus:
            key = (gpu.uuid, gpu.mig_start)
            milli = gpu.compute_percent * (MILLI_PER_GPU // 100)
            old = seen.get(key)
            if old is not None:
                milli, memory = max(milli, old.milli), max(gpu.memory_mib, old.memory_mib)
            else:
                memory = gpu.memory_mib
            seen[key] = GpuClaim(gpu.uuid, gpu.mig_profile, gpu.mig_start, milli, memory)
    return list(seen.values())


class Ledger:
    """Bound pods' allocations (``pod/<id>``) in the snapshot's state (not thread-safe alone)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._sig: dict[str, tuple[object, ...]] = {}
        self.unaccounted: set[str] = set()
        self.conflicts = 0
        self.ignored_changes = 0

    def reset(self) -> None:
        """A rebuilt state holds nothing yet (the entries stay: they are replayed)."""
        self._sig.clear()
        self.unaccounted.clear()

    def record_bind(
        self, pod_id: str, node: str, grants: tuple[GpuGrant, ...], assignment: c.Assignment | None
    ) -> None:
        """The extender bound the pod with exactly these GPUs."""
        self._entries[pod_id] = _Entry(node, grants, assignment)
        self._sig.pop(pod_id, None)  # account it again, from this entry

    def remove(self, snap: Snapshot, pod_id: str) -> None:
        alloc_id = "pod/" + pod_id
        if alloc_id in snap.state.allocations:
            snap.state.release(alloc_id)
        self._entries.pop(pod_id, None)
        self._sig.pop(pod_id, None)
        self.unaccounted.discard(pod_id)

    def account(
        self,
        snap: Snapshot,
        holds: HoldBook,
        info: PodInfo,
        fulfil: Callable[[str], None],
        *,
        in_slice: bool = False,
    ) -> None:
        """Make the state hold exactly what `info` holds (state current); `fulfil(pod_id)` ends
        the pod's hold once it is bound. `in_slice`: a pod first seen bound runs inside the
        GPUSlice it names (`slices.slice_covers`): only its CPU and memory are charged."""
        st = snap.state
        alloc_id = "pod/" + info.id
        i = st.index.get(info.node) if info.holds_resources else None
        if i is None:  # finished, pending, or on a node not (yet) known: holds nothing here
            if alloc_id in st.allocations:
                st.release(alloc_id)
            self._sig.pop(info.id, None)
            self.unaccounted.discard(info.id)
            if not info.holds_resources:
                self._entries.pop(info.id, None)
            return
        # What decides the allocation; status-only updates (most pod events) change none of it.
        signature: tuple[object, ...] = (
            info.node,
            info.cpu_milli,
            info.memory_mib,
            info.gpu,
            info.assignment,
        )
        previous = self._sig.get(info.id)
        if previous == signature and (alloc_id in st.allocations or info.id in self.unaccounted):
            return  # unchanged (a conflict is retried when the pod or the node set changes)
        entry = self._entries.get(info.id)
        if entry is not None and entry.node != info.node:
            entry = None
        if entry is not None and previous is not None and previous[4] != info.assignment != entry.assignment:
            self.ignored_changes += 1
            log.warning(
                "pod %s: %s changed after its allocation was recorded; ignored (the gpus stay counted)",
                info.key,
                c.ANNOTATION_ASSIGNED_GPUS,
            )
        if alloc_id in st.allocations:
            st.release(alloc_id)
        self._sig.pop(info.id, None)
        fulfil(info.id)  # bound: its hold (if any) is fulfilled
        # Inside its slice, unless the assignment changed since the entry was made (then the entry
        # stands: a patched annotation frees nothing).
        inside = in_slice and (entry is None or entry.assignment == info.assignment)
        if inside:
            grants: tuple[GpuGrant, ...] | None = ()
            self._entries[info.id] = _Entry(info.node, (), info.assignment)
        elif entry is not None:
            grants = entry.grants
        else:
            grants = self._conservative_grants(snap, info, i)
            if grants is not None:
                self._entries[info.id] = _Entry(info.node, grants, info.assignment)
        if grants is None:
            self.unaccounted.add(info.id)
            log.warning("pod %s on %s: its GPUs cannot be told; they are not counted", info.key, info.node)
            grants = ()
        self._sig[info.id] = signature
        if not allocate_evicting(snap, holds, alloc_id, i, info.cpu_milli, info.memory_mib, grants):
            self.conflicts += 1
            self.unaccounted.add(info.id)
            log.error(
                "pod %s is bound to %s but its resources are not free there (double booking?); "
                "it is not counted",
                info.key,
                info.node,
            )
            return
        if grants or info.gpu is None or inside or (entry is not None and info.slice):
            self.unaccounted.discard(info.id)

    @staticmethod
    def _conservative_grants(snap: Snapshot, info: PodInfo, i: int) -> tuple[GpuGrant, ...] | None:
        """The GPUs a pod first seen bound holds on node row `i` (None: cannot be told)."""
        gpu = info.gpu
        if gpu is None:
            return ()
        st = snap.state
        req = gpu.request
        grants: list[GpuGrant] = []
        assignment = info.assignment
        if assignment is not None and assignment.node == info.node:
            by_uuid = {g.uuid: g.index for g in st.nodes[i].gpus}
            claims = claimed_gpus(assignment)
            for claim in claims:
                j = by_uuid.get(claim.uuid)
                if j is None:
                    continue
                if claim.mig_profile is not None:
                    grants.append(GpuGrant(j, 0, 0, claim.mig_profile, claim.mig_start))
                    continue
                milli_cap, mem_cap = int(st.gpu_milli_cap[i, j]), int(st.gpu_mem_cap[i, j])
                milli = max(req.gpu_milli, claim.milli)
                if req.exclusive or milli >= milli_cap:
                    grants.append(GpuGrant(j, milli_cap, mem_cap))
                else:
                    grants.append(GpuGrant(j, milli, min(mem_cap, max(req.gpu_memory_mib, claim.memory_mib))))
            if len(grants) != len(claims) or len(grants) != req.gpus:
                log.warning(
                    "pod %s: assignment on %s does not match the node's GPUs or the pod's request; "
                    "counting what it claims and what its request needs",
                    info.key,
                    info.node,
                )
        elif info.assignment_error:
            log.warning("pod %s: unreadable assignment (%s)", info.key, info.assignment_error)
        missing = req.gpus - len(grants)
        if missing <= 0:
            return tuple(grants)
        # Bound without (enough of) an assignment: hold what the engine would give it there.
        allowed = np.ones(st.max_gpus, dtype=bool)
        allowed[[g.gpu_index for g in grants]] = False
        chosen = snap.engine.select_gpus(replace(req, gpus=missing), i, allowed_gpus=allowed)
        if isinstance(chosen, Unschedulable):
            return tuple(grants) if grants else None
        return (*grants, *chosen[0])


def allocate_evicting(
    snap: Snapshot,
    holds: HoldBook,
    alloc_id: str,
    i: int,
    cpu: int,
    memory: int,
    grants: tuple[GpuGrant, ...],
) -> bool:
    """Allocate for what the API server says is bound (a pod, a Bound GPUSlice); holds on the
    node give way to it (latest deadline first). False: taken by something else bound."""
    st = snap.state
    victims = sorted((h for h in holds if st.index.get(h.node) == i), key=lambda h: -h.expires_at)
    while True:
        try:
            st.allocate(alloc_id, i, cpu, memory, grants)
            return True
        except OversubscriptionError:
            if not victims:
                return False
            victim = victims.pop(0)
            log.info("hold %s on %s gives way to a bound pod", victim.alloc_id, victim.node)
            holds.drop(st, victim.alloc_id, freed=False)
