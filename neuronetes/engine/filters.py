"""Filters: small named predicates over node rows, one job each, registered in one table.

Each filter returns a boolean mask over the rows it is given. The engine runs them in table
order and reports, for every rejected node, the reason of the first filter that rejected it,
so a pod's events stay one short categorical line per node even at 5,000 nodes. A filter says
itself whether its rejection is unresolvable (no eviction can help), which the extender reports
to kube-scheduler's preemption.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from neuronetes.inventory import ClusterState
from neuronetes.model import Locality, PodRequest

BOOL = npt.NDArray[np.bool_]
I64 = npt.NDArray[np.int64]
FilterFn = Callable[[ClusterState, PodRequest, I64], BOOL]


@dataclass(frozen=True, slots=True)
class Filter:
    name: str
    reason: str
    fn: FilterFn
    unresolvable: bool = False
    """Whether evicting pods can never make the node pass (a fixed property of the node, such as
    its GPU model or count): kube-scheduler's ``UnschedulableAndUnresolvable``, so preemption
    skips the node."""


def share_fit(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    """[R, G]: GPUs that can take one shared grant of this request."""
    return (
        state.usable_gpus(rows)
        & (state.gpu_milli_free[rows] >= req.gpu_milli)
        & (state.gpu_mem_free[rows] >= req.gpu_memory_mib)
    )


def group_free_counts(groups: I64, free: BOOL) -> I64:
    """Largest number of free GPUs sharing one group id, per row (ids < 0 are no group)."""
    g = groups.shape[1]
    ids = np.arange(g)
    member = (groups[:, :, None] == ids) & free[:, :, None]  # [R, G, group]
    return member.sum(axis=1).max(axis=1, initial=0)  # type: ignore[no-any-return]


def filter_schedulable(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    return state.node_schedulable[rows]


def filter_gpu_model(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    if req.gpus == 0 or not req.gpu_models:
        return np.ones(rows.size, dtype=bool)
    allowed = np.array([model_matches(m, req.gpu_models) for m in state.models], dtype=bool)
    return allowed[state.model_id[rows]]


def model_matches(model: str, wanted: tuple[str, ...]) -> bool:
    # "A100" asks for any A100 ("A100-SXM4-80GB"); an exact trace code ("V100M32") matches itself.
    m = model.upper()
    return any(
        m == w.upper() or m.startswith(w.upper() + "-") or m.startswith(w.upper() + " ") for w in wanted
    )


def filter_cpu(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    return state.cpu_free[rows] >= req.cpu_milli


def filter_memory(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    return state.mem_free[rows] >= req.memory_mib


def filter_gpu_count(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    if req.gpus == 0:
        return np.ones(rows.size, dtype=bool)
    return state.gpu_exists[rows].sum(axis=1) >= req.gpus  # type: ignore[no-any-return]


def filter_gpu_health(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    if req.gpus == 0:
        return np.ones(rows.size, dtype=bool)
    usable = state.gpu_exists[rows] & state.gpu_healthy[rows]
    return usable.sum(axis=1) >= req.gpus  # type: ignore[no-any-return]


def filter_whole_gpus(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    if not req.exclusive or req.mig_profile is not None:  # a MIG instance never takes a whole GPU
        return np.ones(rows.size, dtype=bool)
    return state.fully_free(rows).sum(axis=1) >= req.gpus  # type: ignore[no-any-return]


def filter_gpu_memory(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    if not req.shared:
        return np.ones(rows.size, dtype=bool)
    usable = state.usable_gpus(rows)
    return ((state.gpu_mem_free[rows] >= req.gpu_memory_mib) & usable).sum(axis=1) >= req.gpus  # type: ignore[no-any-return]


def filter_gpu_compute(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    if not req.shared:
        return np.ones(rows.size, dtype=bool)
    return share_fit(state, req, rows).sum(axis=1) >= req.gpus  # type: ignore[no-any-return]


def filter_topology(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    if req.gpus <= 1 or req.locality in (Locality.ANY, Locality.SAME_NODE):
        return np.ones(rows.size, dtype=bool)
    free = state.fully_free(rows) if req.exclusive else share_fit(state, req, rows)
    groups = state.gpu_nvlink_group[rows] if req.locality is Locality.NVLINK else state.gpu_socket[rows]
    return group_free_counts(groups, free) >= req.gpus


def filter_bandwidth(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    if req.gpus <= 1 or req.min_bandwidth_gbps <= 0:
        return np.ones(rows.size, dtype=bool)
    free = state.fully_free(rows) if req.exclusive else share_fit(state, req, rows)
    fast = free & (state.gpu_nvlink_bw[rows] >= req.min_bandwidth_gbps) & (state.gpu_nvlink_group[rows] >= 0)
    return group_free_counts(state.gpu_nvlink_group[rows], fast) >= req.gpus


def filter_mig(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    if req.mig_profile is None:
        return np.ones(rows.size, dtype=bool)
    ok = np.zeros(rows.size, dtype=bool)
    mig_rows = np.nonzero((state.gpu_mig[rows] & state.gpu_healthy[rows]).any(axis=1))[0]
    for k in mig_rows:  # MIG GPUs are few; placement is a slot-rule check per GPU
        i = int(rows[k])
        ok[k] = mig_slot(state, i, req.mig_profile) is not None
    return ok


def mig_slot(state: ClusterState, node_index: int, profile: str) -> tuple[int, int] | None:
    """First (gpu, start slot) on a node where `profile` can still be placed."""
    for j in range(state.max_gpus):
        if not (state.gpu_mig[node_index, j] and state.gpu_healthy[node_index, j]):
            continue
        try:
            start = state.mig_start(node_index, j, profile)
        except KeyError:
            continue  # profile unknown for this GPU's model; another GPU may offer it
        if start is not None:
            return j, start
    return None


def filter_price(state: ClusterState, req: PodRequest, rows: I64) -> BOOL:
    ok = np.ones(rows.size, dtype=bool)
    if req.max_price_per_hour is not None:
        ok &= state.price_per_hour[rows] <= req.max_price_per_hour
    if not req.spot_allowed:
        ok &= ~state.spot[rows]
    return ok


FILTERS: tuple[Filter, ...] = (
    Filter("NodeSchedulable", "node unschedulable", filter_schedulable, unresolvable=True),
    Filter("GpuModel", "gpu model mismatch", filter_gpu_model, unresolvable=True),
    Filter("GpuCount", "node has fewer gpus than requested", filter_gpu_count, unresolvable=True),
    Filter("GpuHealth", "gpu offline", filter_gpu_health, unresolvable=True),
    Filter("Cpu", "insufficient cpu", filter_cpu),
    Filter("Memory", "insufficient memory", filter_memory),
    Filter("MigSlot", "no slot for mig profile", filter_mig),
    Filter("WholeGpus", "insufficient free gpus", filter_whole_gpus),
    Filter("GpuMemory", "insufficient gpu memory on any GPU", filter_gpu_memory),
    Filter("GpuCompute", "insufficient gpu compute on any GPU", filter_gpu_compute),
    Filter("Topology", "no gpu group with enough free gpus", filter_topology),
    Filter("Bandwidth", "nvlink bandwidth below minBandwidth", filter_bandwidth),
    Filter("Price", "node price or spot not allowed", filter_price, unresolvable=True),
)
"""Cheapest and most selective first: later filters only see rows earlier ones passed."""
