"""Restoring gang reservations read from the API (a restart, or a standby following the active
extender) into the `GangManager` and the `HoldBook`: one job, apart from the manager's
lifecycle of plan, claim, barrier and release, which it uses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import replace

from .books import CacheBooks
from .gangs import GangGroup, RestoredGang
from .results import Hold

__all__ = ["restore_gangs"]

log = logging.getLogger(__name__)


def restore_gangs(books: CacheBooks, restored: Iterable[RestoredGang]) -> int:
    """Hold the slots of reservations read from the API; idempotent and incremental.

    A group already known with the same reservation id is left alone; one known under
    another id (the other extender planned it again) is replaced without a word to the API;
    a new one is restored: expired ones are ended, slots whose pod is bound count as bound,
    one whose slots no longer fit is released. Returns how many groups were restored.
    """
    count = 0
    snap, gangs = books.snap, books.gangs
    now, wall = snap.now(), time.time()
    for r in restored:
        group_id = f"{r.namespace}/{r.name}"
        if r.phase not in ("Reserved", "Binding"):
            continue
        known = gangs.groups.get(group_id)
        if known is not None:
            if not r.reservation_id or known.reservation_id == r.reservation_id:
                continue
            gangs.end(known, "Released", emit=False)
        remaining = r.expires_wall - wall
        group = GangGroup(
            id=group_id,
            namespace=r.namespace,
            name=r.name,
            size=r.size,
            locality=r.locality,
            expires_at=now + remaining,
            expires_wall=r.expires_wall,
            slots=[replace(s) for s in r.slots],
            phase=r.phase,
            open=r.phase == "Binding",
        )
        if r.reservation_id:
            group.reservation_id = r.reservation_id
        if remaining <= 0:
            gangs.end(group, "Expired")
            continue
        if _restore_slots(books, group):
            count += 1
    return count


def _restore_slots(books: CacheBooks, group: GangGroup) -> bool:
    """Hold `group`'s unbound slots (claimed again by their pending pods); False: it is over
    (no longer fits: released; every member bound: ended)."""
    gangs, holds, store = books.gangs, books.holds, books.store
    gangs.groups[group.id] = group
    pods = store.pods
    by_name = {(p.namespace, p.name): p for p in pods.values() if p.namespace == group.namespace}
    intact = True
    for slot in group.slots:
        pod = pods.get(slot.pod_uid) if slot.pod_uid else None
        if pod is None and slot.pod_name:
            pod = by_name.get((group.namespace, slot.pod_name))
        if pod is not None and pod.holds_resources:
            slot.bound = True
        if slot.bound:
            continue
        spec = store.specs.get(slot.node)
        if spec is not None and slot.request.exclusive:
            mem = {g.index: g.memory_mib for g in spec.gpus}
            slot.grants = tuple(
                replace(g, memory_mib=mem.get(g.gpu_index, g.memory_mib)) for g in slot.grants
            )
        hold = Hold(
            alloc_id=slot.alloc_id,
            pod="",
            node=slot.node,
            request=slot.request,
            gpu=None,
            grants=slot.grants,
            expires_at=group.expires_at,
            reason="restored gang reservation",
            group=group.id,
        )
        holds.put(hold)
        on_known_node = not store.dirty and slot.node in books.snap.state.index
        if on_known_node and not holds.allocate(books.snap.state, hold):
            intact = False
        slot.pod = slot.pod_name = slot.pod_uid = ""
        if pod is not None and pod.pending_gpu and not pod.gpu_error:
            gangs.claim(group, slot, pod)
    if not intact:
        log.warning("gang %s: restored reservation no longer fits; released", group.id)
        gangs.end(group, "Released")
        return False
    if all(s.bound for s in group.slots):
        gangs.end(group, "Bound")
        return False
    log.info("gang %s: reservation restored (%d slots)", group.id, len(group.slots))
    gangs.emit(group)
    return True
