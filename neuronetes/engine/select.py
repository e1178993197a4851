"""Choosing GPUs inside the chosen node, and saying why.

Order of preference for several whole GPUs: one NVLink group, then one NUMA node,
then one socket, then anything. Among groups that can hold the request the tightest one wins,
so whole NVLink groups stay free for the next large request.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from neuronetes.inventory import ClusterState
from neuronetes.model import Locality

BOOL = npt.NDArray[np.bool_]


def select_first(free: BOOL, k: int) -> tuple[list[int], str]:
    idx = [int(j) for j in np.nonzero(free)[0][:k]]
    return idx, "lowest-index free gpus"


def select_bestfit(free: BOOL, left: npt.NDArray[np.int64], k: int) -> tuple[list[int], str]:
    cand = np.nonzero(free)[0]
    order = cand[np.argsort(left[cand], kind="stable")][:k]
    return [int(j) for j in order], "tightest-fitting gpus"


def select_random(free: BOOL, k: int, rng: np.random.Generator) -> tuple[list[int], str]:
    cand = np.nonzero(free)[0]
    return sorted(int(j) for j in rng.choice(cand, size=k, replace=False)), "random free gpus"


def locality_groups(
    state: ClusterState,
    node: int,
    avail: BOOL,
    k: int,
    locality: Locality,
    min_bandwidth_gbps: float = 0.0,
) -> list[BOOL]:
    """The sets of `avail` GPUs on `node` that `locality` lets k GPUs come from, tightest first.

    `nvlink`: one NVLink group (nvlink_group >= 0, and NVLink bandwidth >= `min_bandwidth_gbps`
    when that is set); `same-socket`: one socket. Only groups with at least k available GPUs
    count; fewest available first, then the lowest group id (as `select_topology` chooses).
    Any other locality: `avail` itself, when it holds k GPUs — unless a minimum bandwidth is
    set, which only NVLink provides, so it groups by NVLink group as the bandwidth filter does.
    """
    if locality is Locality.NVLINK or (min_bandwidth_gbps > 0 and locality is not Locality.SAME_SOCKET):
        groups: npt.NDArray[np.int64] = state.gpu_nvlink_group[node]
        ok = avail & (groups >= 0)
        if min_bandwidth_gbps > 0:
            ok &= state.gpu_nvlink_bw[node] >= min_bandwidth_gbps
    elif locality is Locality.SAME_SOCKET:
        groups = state.gpu_socket[node]
        ok = avail & (groups >= 0)
    else:
        return [avail] if int(avail.sum()) >= k else []
    masks = [ok & (groups == gid) for gid in np.unique(groups[ok])]
    return sorted((m for m in masks if int(m.sum()) >= k), key=lambda m: int(m.sum()))


_LEVELS = (("nvlink group", "gpu_nvlink_group"), ("numa node", "gpu_numa"), ("socket", "gpu_socket"))


def select_topology(state: ClusterState, node: int, free: BOOL, k: int) -> tuple[list[int], str]:
    """k GPUs from the tightest NVLink group / NUMA node / socket that holds them all."""
    cand = np.nonzero(free)[0]
    for label, attr in _LEVELS:
        groups: npt.NDArray[np.int64] = getattr(state, attr)[node]
        best: tuple[int, int] | None = None  # (free in group, group id)
        for gid in sorted({int(groups[j]) for j in cand if groups[j] >= 0}):
            members = [int(j) for j in cand if groups[j] == gid]
            if len(members) >= k and (best is None or len(members) < best[0]):
                best = (len(members), gid)
        if best is not None:
            members = [int(j) for j in cand if groups[j] == best[1]]
            # Inside the group, keep NUMA locality when the group spans NUMA nodes.
            members.sort(key=lambda j: (int(state.gpu_numa[node, j]), j))
            if k == 1:
                return members[:1], f"{label} {best[1]} ({best[0]} free, tightest fit)"
            return members[:k], f"one {label} ({label} {best[1]})"
    picked = sorted(
        cand, key=lambda j: (int(state.gpu_socket[node, j]), int(state.gpu_numa[node, j]), int(j))
    )[:k]
    return [int(j) for j in picked], "spread across sockets (no single group holds them)"
