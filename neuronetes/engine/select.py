"""Choosing GPUs inside the chosen node, and saying why.

Order of preference for several whole GPUs (seed 002): one NVLink group, then one NUMA node,
then one socket, then anything. Among groups that can hold the request the tightest one wins,
so whole NVLink groups stay free for the next large request.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from neuronetes.inventory import ClusterState

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
