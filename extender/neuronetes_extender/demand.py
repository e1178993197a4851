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

Measured at scrape time: under the cache's lock only copies of a few arrays and of the list of
pods (`take_inputs`); the pass over the pods and the NumPy passes, a few per distinct pending
shape (at most `MAX_SHAPES`), run outside it (`measure`), so a scrape never holds up a decision
for long (bench/extender_scrape.py). docs/observability.md describes the gauges.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from neuronetes.engine.filters import model_matches
from neuronetes.inventory import ClusterState
from neuronetes.model import MILLI_PER_GPU

from .pods import PodInfo

__all__ = ["MAX_SHAPES", "Demand", "DemandInputs", "PendingGangClock", "measure", "take_inputs"]

MAX_SHAPES: Final = 64
"""Distinct pending shapes measured per scrape (most frequent first); the rest are left out."""


@dataclass(frozen=True, slots=True)
class Demand:
    gpus_allocated: float  # GPUs' worth of compute granted (binds and holds), MIG-partitioned GPUs excluded
    gpus_unallocated: float  # GPUs' worth of free compute on usable GPUs
    gpus_fragmented: float  # the part of it no pending shape can use
    pending_gangs: dict[str, float]  # gang id (namespace/name) -> its timeout, seconds


ShapeKey = tuple[int, int, int, bool, tuple[str, ...]]  # gpus, milli, memory MiB, exclusive, models


@dataclass(frozen=True, slots=True)
class DemandInputs:
    """What `measure` needs, copied under the cache lock (the measuring happens outside it)."""

    usable: npt.NDArray[np.bool_]  # [N, G] GPUs that may take a new non-MIG grant
    whole_free: npt.NDArray[np.bool_]  # [N, G] usable and entirely free
    milli_free: npt.NDArray[np.int64]
    mem_free: npt.NDArray[np.int64]
    allocated_milli: int  # granted compute on non-MIG GPUs
    models: tuple[str, ...]
    model_id: npt.NDArray[np.int64]  # [N]
    pods: list[PodInfo]  # every pod (`PodInfo` is immutable: the store replaces, never changes one)
    default_gang_timeout: float


def take_inputs(state: ClusterState, pods: Iterable[PodInfo], default_gang_timeout: float) -> DemandInputs:
    """Copy what `measure` reads (call under the cache lock: array copies and a list of the pods)."""
    non_mig = state.gpu_exists & ~state.gpu_mig
    return DemandInputs(
        usable=state.usable_gpus(),
        whole_free=state.fully_free(),
        milli_free=state.gpu_milli_free.copy(),
        mem_free=state.gpu_mem_free.copy(),
        allocated_milli=int(np.where(non_mig, state.gpu_milli_cap - state.gpu_milli_free, 0).sum()),
        models=state.models,
        model_id=state.model_id.copy(),
        pods=list(pods),
        default_gang_timeout=default_gang_timeout,
    )


def _pending(d: DemandInputs) -> tuple[dict[ShapeKey, int], dict[str, float]]:
    """Distinct pending shapes (-> how many pods have each) and pending gangs (-> their timeout)."""
    shapes: dict[ShapeKey, int] = {}
    gangs: dict[str, float] = {}
    for pod in d.pods:
        if pod.gpu is None or not pod.pending_gpu:
            continue
        if pod.gang is not None and (gang_id := pod.gang_id) is not None:
            gangs[gang_id] = max(pod.gang.timeout_s or d.default_gang_timeout, gangs.get(gang_id, 0.0))
        req = pod.gpu.request  # the GPU fields of `pod.request`, without building it
        if req.gpus and req.mig_profile is None:
            key = (req.gpus, req.gpu_milli, req.gpu_memory_mib, req.exclusive, req.gpu_models)
            shapes[key] = shapes.get(key, 0) + 1
    return shapes, gangs


def _usable_for(d: DemandInputs, key: ShapeKey) -> npt.NDArray[np.bool_]:
    """GPUs a pending shape could take now, on nodes where it would fit ([N, G] booleans)."""
    gpus, milli, memory, exclusive, models = key
    ok = d.whole_free if exclusive else d.usable & (d.milli_free >= milli) & (d.mem_free >= memory)
    if models:
        allowed = np.array([model_matches(m, models) for m in d.models], dtype=bool)
        ok = ok & allowed[d.model_id][:, None]
    fits = ok.sum(axis=1) >= gpus
    return ok & fits[:, None]  # type: ignore[no-any-return]


def measure(d: DemandInputs) -> Demand:
    """Allocated, unallocated and fragmented GPU capacity and the pending gangs (outside the lock)."""
    shapes, gangs = _pending(d)
    left = np.where(d.usable, d.milli_free, 0)
    fragmented = 0.0
    if shapes:
        wanted = np.zeros_like(d.usable)
        for key in sorted(shapes, key=lambda k: -shapes[k])[:MAX_SHAPES]:
            wanted |= _usable_for(d, key)
        fragmented = float(np.where(wanted, 0, left).sum()) / MILLI_PER_GPU
    return Demand(d.allocated_milli / MILLI_PER_GPU, float(left.sum()) / MILLI_PER_GPU, fragmented, gangs)


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
