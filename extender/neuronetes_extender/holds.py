"""Assume and forget: the holds the cache keeps for filtered pods and gang slots, with one TTL.

A hold is recorded at a filter (or a gang plan) and allocated in the snapshot's `ClusterState`
at once, so the next decision sees its GPUs taken (kube-scheduler's assume). It ends when its
pod binds (it becomes the pod's allocation in the `Ledger`), when it is released, or when its
`expires_at` passes: the only expiry mechanism of the cache (a gang's slots carry the group's
deadline; `ClusterState`'s own allocation expiry is not used). Releasing GPUs marks the book
`freed`, so the pods the filter rejected meanwhile are nudged to try again.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from neuronetes.inventory import ClusterState, OversubscriptionError

from .pods import PodInfo
from .results import Hold

__all__ = ["HoldBook", "owned_by", "pod_of_hold"]


def owned_by(pod: PodInfo) -> dict[str, Any]:
    """The fields of a `Hold` that say whose it is."""
    return {
        "pod": pod.id,
        "gpu": pod.gpu,
        "uid": pod.uid,
        "namespace": pod.namespace,
        "name": pod.name,
        "priority": pod.priority,
    }


def pod_of_hold(pod_id: str, hold: Hold) -> PodInfo:
    """The pending pod a hold was made for, rebuilt from the hold (the watch has not shown it)."""
    req = hold.request
    return PodInfo(
        id=pod_id,
        uid=hold.uid,
        namespace=hold.namespace,
        name=hold.name,
        node="",
        phase="Pending",
        deleting=False,
        priority=hold.priority,
        cpu_milli=req.cpu_milli,
        memory_mib=req.memory_mib,
        gpu=hold.gpu,
        gpu_error="",
        assignment=None,
        assignment_error="",
        resource_version="",
    )


class HoldBook:
    """Every live hold by allocation id, and each pod's hold (not thread-safe on its own)."""

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}
        self._of: dict[str, str] = {}  # pod identity -> alloc id of its hold
        self.rejected: dict[str, tuple[str, str]] = {}  # pod id -> (namespace, name): no node found
        self.freed = False  # GPUs were released since the last nudge: rejected pods may fit now
        # (expires_at, alloc id) of every hold put or renewed, soonest first; entries a later put,
        # renewal or release made stale are skipped when popped. Every decision asks `due`, and
        # scanning every hold for it was a tenth of a filter's CPU with a backlog of binds
        # outstanding (`bench/e2e_throughput.py --profile-extender`: "filter: decision").
        self._expiries: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._holds)

    def __iter__(self) -> Iterator[Hold]:
        return iter(list(self._holds.values()))

    def __contains__(self, alloc_id: str) -> bool:
        return alloc_id in self._holds

    def get(self, alloc_id: str | None) -> Hold | None:
        return None if alloc_id is None else self._holds.get(alloc_id)

    def alloc_of(self, pod_id: str) -> str | None:
        return self._of.get(pod_id)

    def of(self, pod_id: str) -> Hold | None:
        return self.get(self._of.get(pod_id))

    def put(self, hold: Hold) -> None:
        """Record (or update) `hold` without touching the state; its pod (if any) owns it."""
        self._holds[hold.alloc_id] = hold
        self._expire_at(hold)
        if hold.pod:
            self._of[hold.pod] = hold.alloc_id

    def detach(self, hold: Hold) -> None:
        """`hold`'s pod no longer owns it (a gang slot handed back)."""
        if hold.pod and self._of.get(hold.pod) == hold.alloc_id:
            del self._of[hold.pod]

    def renew(self, alloc_id: str, expires_at: float) -> Hold:
        hold = replace(self._holds[alloc_id], expires_at=expires_at)
        self._holds[alloc_id] = hold
        self._expire_at(hold)
        return hold

    def _expire_at(self, hold: Hold) -> None:
        heapq.heappush(self._expiries, (hold.expires_at, hold.alloc_id))
        if len(self._expiries) > 2 * len(self._holds) + 64:  # mostly stale: rebuild
            self._expiries = [(h.expires_at, h.alloc_id) for h in self._holds.values()]
            heapq.heapify(self._expiries)

    @staticmethod
    def allocate(state: ClusterState, hold: Hold) -> bool:
        """Take `hold`'s resources in `state`; False when they are not free (or its node is gone)."""
        i = state.index.get(hold.node)
        if i is None:
            return False
        req = hold.request
        try:
            state.allocate(hold.alloc_id, i, req.cpu_milli, req.memory_mib, hold.grants)
        except OversubscriptionError:
            return False
        return True

    def forget(self, alloc_id: str) -> Hold | None:
        """Drop the record only (the caller rebuilds or already released the allocation)."""
        hold = self._holds.pop(alloc_id, None)
        if hold is not None:
            self.detach(hold)
        return hold

    def drop(self, state: ClusterState, alloc_id: str, *, freed: bool = True) -> Hold | None:
        """Forget `alloc_id` and give its resources back; `freed`: others may use them now (not
        so when the pod bound: then they are the pod's)."""
        hold = self.forget(alloc_id)
        if alloc_id in state.allocations:
            state.release(alloc_id)
            if freed:
                self.freed = True
        return hold

    def due(self, now: float) -> list[Hold]:
        """Holds whose TTL has passed, soonest first (again at the next call while they stay)."""
        expiries = self._expiries
        due: dict[str, Hold] = {}
        while expiries and expiries[0][0] <= now:
            at, alloc_id = heapq.heappop(expiries)
            hold = self._holds.get(alloc_id)
            if hold is not None and hold.expires_at == at:
                due[alloc_id] = hold
        for hold in due.values():
            heapq.heappush(expiries, (hold.expires_at, hold.alloc_id))
        return list(due.values())
