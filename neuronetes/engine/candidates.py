"""The candidate victims of preemption as arrays, so that a decision over thousands of nodes
finds the nodes worth searching with a few NumPy passes instead of a Python loop over every pod.

`CandidateIndex` flattens the units (`neuronetes.engine.victims.Unit`) once: each unit's
priority and key parts, each (unit, node) pair, each GPU grant. It reads the allocations of the
state it is built on: build it again when they change (a caller deciding for several pending
pods against one snapshot builds it once). `rows_and_bounds` answers, for one preemptor, which
nodes could make room by evicting their lower-priority units and the least key any set there
could have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from neuronetes.engine.victims import SetKey, Unit, VictimOrder
from neuronetes.inventory import ClusterState
from neuronetes.model import PodRequest

__all__ = ["CandidateIndex"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]

_NONE: Final = -(2**62)
_BLOCKED: Final = 2**62


class CandidateIndex:
    """Units flattened against one state's allocations (see the module's docstring)."""

    def __init__(self, state: ClusterState, units: Sequence[Unit]) -> None:
        self.state = state
        self.units = list(units)
        self.priority: I64 = np.array([u.priority for u in self.units], dtype=np.int64)
        self.psum: I64 = np.array([u.priority_sum for u in self.units], dtype=np.int64)
        self.count: I64 = np.array([u.count for u in self.units], dtype=np.int64)
        self.start: F64 = np.array([u.start_time for u in self.units], dtype=np.float64)
        self.lost: F64 = np.array([u.gpu_seconds_lost for u in self.units], dtype=np.float64)
        # A unit's own PDB violations bound those of any set holding it (a set only adds pods).
        self.pdb: I64 = np.array(
            [sum(max(0, n - allowed) for _, n, allowed in u.pdbs) if u.pdbs else 0 for u in self.units],
            dtype=np.int64,
        )
        pair_unit: list[int] = []
        pair_row: list[int] = []
        grant: list[tuple[int, int, int, int, int]] = []  # unit, row, gpu, milli, memory
        allocations = state.allocations
        for k, u in enumerate(self.units):
            rows: set[int] = set()
            for alloc_id in u.allocations:
                a = allocations.get(alloc_id)
                if a is None:
                    continue
                rows.add(a.node_index)
                grant.extend((k, a.node_index, g.gpu_index, g.milli, g.memory_mib) for g in a.grants)
            for r in rows:
                pair_unit.append(k)
                pair_row.append(r)
        order = np.lexsort((np.array(pair_unit, dtype=np.int64), np.array(pair_row, dtype=np.int64)))
        self.pair_unit: I64 = np.array(pair_unit, dtype=np.int64)[order]
        self.pair_row: I64 = np.array(pair_row, dtype=np.int64)[order]
        g = np.array(grant, dtype=np.int64).reshape(-1, 5)
        self.g_unit, self.g_row, self.g_gpu, self.g_milli, self.g_mem = (g[:, c] for c in range(5))

    def units_on(self, row: int, eligible: BOOL) -> list[Unit]:
        """The eligible units holding something on `row`."""
        lo, hi = np.searchsorted(self.pair_row, [row, row + 1])
        return [self.units[int(k)] for k in self.pair_unit[lo:hi] if eligible[k]]

    def eligible(self, req: PodRequest) -> BOOL:
        """The units `req` may evict: those of lower priority."""
        return self.priority < req.priority

    def rows_and_bounds(
        self,
        st: ClusterState,
        req: PodRequest,
        allowed: BOOL,
        eligible: BOOL,
        order: VictimOrder = VictimOrder.LOWEST_PRIORITY_FIRST,
    ) -> tuple[I64, list[SetKey]]:
        """For `req`: the `allowed` rows where evicting every `eligible` unit could make room on
        enough GPUs (free capacity as in `st`, a copy of the index's state that may have changed
        since), least bound first, and each row's bound (no set of its units that makes room has
        a lower key).

        The bound's highest priority is, for whole GPUs, the k-th least of the GPUs' highest unit
        priorities (all units on k GPUs must go; a GPU held in part by a non-candidate can never
        be freed), otherwise the row's least unit priority; its other parts are the row's least
        PDB violations, priority sum, count and GPU-seconds and its latest start, each over single
        units, each in `order`'s place (each part a lower bound, so the whole is one)."""
        pair_ok = eligible[self.pair_unit] & allowed[self.pair_row]
        rows_u, units_u = self.pair_row[pair_ok], self.pair_unit[pair_ok]
        n = st.n_nodes
        has = np.zeros(n, dtype=bool)
        has[rows_u] = True
        least_prio = _least(n, rows_u, self.priority[units_u])
        gm = eligible[self.g_unit]
        where = (self.g_row[gm], self.g_gpu[gm])
        shape = (n, st.max_gpus)
        freeable_milli, freeable_mem = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
        np.add.at(freeable_milli, where, self.g_milli[gm])
        np.add.at(freeable_mem, where, self.g_mem[gm])
        usable = st.usable_gpus()
        top = least_prio
        if req.mig_profile is not None:
            has &= (st.gpu_mig & st.gpu_healthy).any(axis=1)
        elif req.exclusive:
            gpu_top = np.full(shape, _NONE, dtype=np.int64)
            np.maximum.at(gpu_top, where, self.priority[self.g_unit[gm]])
            used_milli = st.gpu_milli_cap - st.gpu_milli_free
            used_mem = st.gpu_mem_cap - st.gpu_mem_free
            blocked = ~usable | (freeable_milli < used_milli) | (freeable_mem < used_mem)
            idle = (used_milli == 0) & (used_mem == 0)
            per_gpu = np.where(blocked, _BLOCKED, np.where(idle, _NONE, gpu_top))
            if req.gpus > st.max_gpus:
                has[:] = False
            else:
                top = np.partition(per_gpu, req.gpus - 1, axis=1)[:, req.gpus - 1]
                has &= top < _BLOCKED
                top = top.astype(np.float64)
        elif req.gpus > 0:
            room = usable & (st.gpu_milli_free + freeable_milli >= req.gpu_milli)
            room &= st.gpu_mem_free + freeable_mem >= req.gpu_memory_mib
            has &= room.sum(axis=1) >= req.gpus
        rows = np.nonzero(has)[0]
        psum = _least(n, rows_u, self.psum[units_u])
        count = _least(n, rows_u, self.count[units_u])
        lost = _least(n, rows_u, self.lost[units_u])
        late = -_least(n, rows_u, -self.start[units_u])
        pdb = _least(n, rows_u, self.pdb[units_u])
        fewest = order is VictimOrder.FEWEST_VICTIMS
        head = (count, top, psum) if fewest else (top, psum, count)
        ranked = np.lexsort(
            (rows, lost[rows], -late[rows], head[2][rows], head[1][rows], head[0][rows], pdb[rows])
        )
        rows = rows[ranked]
        bounds: list[SetKey] = [
            (
                int(pdb[r]),
                int(head[0][r]),
                int(head[1][r]),
                int(head[2][r]),
                float(-late[r]),
                float(lost[r]),
                (),
            )
            for r in rows.tolist()
        ]
        return rows, bounds


def _least(n: int, rows: I64, values: I64 | F64) -> F64:
    """Per row, the least of `values` at `rows` (+inf where there is none), as floats (exact
    for the integers here: priority sums stay far below 2^53)."""
    out: F64 = np.full(n, np.inf)
    np.minimum.at(out, rows, values.astype(np.float64))
    return out
