"""Free GPU capacity against what is waiting for it: the fragmentation and pending-gang gauges.

*Fragmented* capacity is unallocated GPU compute that none of the pending pods' shapes could use
as the cluster stands: a GPU counts for a shape when it has the shape's compute and memory free
(all of it for a whole-GPU shape), its node's model is one the shape accepts, and its node has
at least as many such GPUs as the shape asks for. With nothing pending, nothing is fragmented
(no demand is going unmet). MIG-partitioned, unhealthy and cordoned GPUs are not unallocated
capacity at all (no new non-MIG grant may use them), and MIG shapes are not measured here.

Pending gangs are groups with at least one member waiting for a placement; each has a timeout
(its ``neuronetes.io/gang-timeout-seconds``, else the settings' ``gangTTLSeconds``). The tracker
remembers when the extender first saw each one pending, so the gauge of gangs pending past their
timeout counts from then (an extender restart starts the clock again).

Measured at scrape time under the cache's lock: one pass over the pods and a few vectorised
NumPy passes per distinct pending shape (at most `MAX_SHAPES`), so a scrape stays cheap however
many pods wait. docs/observability.md describes the gauges.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import numpy as np

from neuronetes.engine.filters import model_matches
from neuronetes.inventory import ClusterState
from neuronetes.model import MILLI_PER_GPU, PodRequest

from .pods import PodInfo

__all__ = ["MAX_SHAPES", "Demand", "PendingGangClock", "measure_demand"]

MAX_SHAPES: Final = 64
"""Distinct pending shapes measured per scrape (most frequent first); the rest are left out."""


@dataclass(frozen=True, slots=True)
class Demand:
    gpus_allocated: float  # GPUs' worth of compute granted (binds and holds), MIG-partitioned GPUs excluded
    gpus_unallocated: float  # GPUs' worth of free compute on usable GPUs
    gpus_fragmented: float  # the part of it no pending shape can use
    pending_gangs: dict[str, float]  # gang id (namespace/name) -> its timeout, seconds


def _shape_key(req: PodRequest) -> tuple[int, int, int, bool, tuple[str, ...]]:
    return (req.gpus, req.gpu_milli, req.gpu_memory_mib, req.exclusive, tuple(sorted(req.gpu_models)))


def _pending_shapes(pods: Iterable[PodInfo]) -> list[PodRequest]:
    counts: dict[tuple[int, int, int, bool, tuple[str, ...]], tuple[int, PodRequest]] = {}
    for pod in pods:
        req = pod.request
        if req.gpus == 0 or req.mig_profile is not None:
            continue
        key = _shape_key(req)
        seen = counts.get(key)
        counts[key] = (1 if seen is None else seen[0] + 1, req)
    ranked = sorted(counts.values(), key=lambda item: -item[0])
    return [req for _, req in ranked[:MAX_SHAPES]]


def _usable_for(state: ClusterState, usable: np.ndarray, req: PodRequest) -> np.ndarray:
    """GPUs `req` could take now, on nodes where it would fit ([N, G] booleans)."""
    if req.exclusive:
        ok = state.fully_free()
    else:
        ok = usable & (state.gpu_milli_free >= req.gpu_milli) & (state.gpu_mem_free >= req.gpu_memory_mib)
    if req.gpu_models:
        allowed = np.array([model_matches(m, req.gpu_models) for m in state.models], dtype=bool)
        ok = ok & allowed[state.model_id][:, None]
    fits = ok.sum(axis=1) >= req.gpus
    return ok & fits[:, None]  # type: ignore[no-any-return]


def measure_demand(state: ClusterState, pods: Iterable[PodInfo], default_gang_timeout: float) -> Demand:
    """Unallocated and fragmented GPU capacity, and the pending gangs (call under the cache lock)."""
    pending = [p for p in pods if p.pending_gpu and p.gpu is not None]
    usable = state.usable_gpus()
    left = np.where(usable, state.gpu_milli_free, 0)
    unallocated = float(left.sum()) / MILLI_PER_GPU
    whole = state.gpu_exists & ~state.gpu_mig
    allocated = float(np.where(whole, state.gpu_milli_cap - state.gpu_milli_free, 0).sum()) / MILLI_PER_GPU
    shapes = _pending_shapes(pending)
    if shapes:
        wanted = np.zeros_like(usable)
        for req in shapes:
            wanted |= _usable_for(state, usable, req)
        fragmented = float(np.where(wanted, 0, left).sum()) / MILLI_PER_GPU
    else:
        fragmented = 0.0
    gangs: dict[str, float] = {}
    for pod in pending:
        if pod.gang is not None and pod.gang_id is not None:
            timeout = pod.gang.timeout_s or default_gang_timeout
            gangs[pod.gang_id] = max(timeout, gangs.get(pod.gang_id, 0.0))
    return Demand(allocated, unallocated, fragmented, gangs)


class PendingGangClock:
    """When each pending gang was first seen pending; counts those pending past their timeout."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()

    def past_timeout(self, pending_gangs: dict[str, float]) -> int:
        """Note the gangs pending now (forgetting the rest); return how many waited too long."""
        now = self._clock()
        with self._lock:
            self._since = {g: self._since.get(g, now) for g in pending_gangs}
            return sum(1 for g, timeout in pending_gangs.items() if now - self._since[g] > timeout)
