"""The cluster's GPU inventory as vectorised arrays, and the allocations held against it.

`ClusterState` is the one place capacity is counted. Every change goes through `allocate` /
`release`, which check capacity first and raise `OversubscriptionError` rather than ever
letting a GPU, CPU or memory counter go negative: oversubscription is impossible by
construction. Each node carries a generation number that changes whenever its free capacity
changes, so callers (the engine's score cache) can recompute only the rows that moved.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from neuronetes import mig
from neuronetes.model import MILLI_PER_GPU, GpuGrant, GpuHealth, NodeSpec

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]


class OversubscriptionError(RuntimeError):
    """An allocation would exceed what a node or GPU holds."""


class StateInvariantError(AssertionError):
    """The state's counters disagree with its allocations (a bug; raised even under ``python -O``)."""


class UnknownAllocationError(KeyError):
    """Release or confirm of an allocation id the inventory does not hold."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """Resources held on one node by one pod (or one assumed placement)."""

    id: str
    node_index: int
    cpu_milli: int
    memory_mib: int
    grants: tuple[GpuGrant, ...]
    expires_at: float | None = None
    """Monotonic deadline for an assumed placement; None once committed."""


class ClusterState:
    """Node and GPU capacity in NumPy arrays (node axis first, GPU axis second).

    GPU arrays are padded to the widest node; padded slots have `gpu_exists` False and zero
    capacity, so no filter or scorer can pick them.
    """

    def __init__(self, nodes: Sequence[NodeSpec], max_gpus_per_node: int | None = None) -> None:
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        self.index: dict[str, int] = {name: i for i, name in enumerate(names)}
        n = len(self.nodes)
        g = (
            max_gpus_per_node
            if max_gpus_per_node is not None
            else max((len(x.gpus) for x in nodes), default=0)
        )
        g = max(g, 1)
        self.n_nodes, self.max_gpus = n, g

        self.cpu_cap: I64 = np.array([x.cpu_milli for x in nodes], dtype=np.int64).reshape(n)
        self.mem_cap: I64 = np.array([x.memory_mib for x in nodes], dtype=np.int64).reshape(n)
        self.cpu_free: I64 = self.cpu_cap.copy()
        self.mem_free: I64 = self.mem_cap.copy()
        self.gpu_count: I64 = np.array([len(x.gpus) for x in nodes], dtype=np.int64).reshape(n)
        self.node_schedulable: BOOL = np.array([x.schedulable for x in nodes], dtype=bool).reshape(n)
        # An unknown price is NaN: it passes no max-price filter, and the cost scorer ranks it with
        # the most expensive known price (`neuronetes.engine.scorers.score_cost`).
        self.price_per_hour: F64 = np.array(
            [np.nan if x.price_per_hour is None else x.price_per_hour for x in nodes], dtype=np.float64
        ).reshape(n)
        known = self.price_per_hour[~np.isnan(self.price_per_hour)]
        self.price_top: float | None = float(known.max()) if known.size else None
        """The highest known price (None: no node has one)."""
        self.spot: BOOL = np.array([x.spot for x in nodes], dtype=bool).reshape(n)

        self.models: tuple[str, ...] = tuple(sorted({x.gpu_model for x in nodes}))
        model_ids = {m: i for i, m in enumerate(self.models)}
        self.model_id: I64 = np.array([model_ids[x.gpu_model] for x in nodes], dtype=np.int64).reshape(n)
        self.zones: tuple[str, ...] = tuple(sorted({x.zone for x in nodes}))
        zone_ids = {z: i for i, z in enumerate(self.zones)}
        self.zone_id: I64 = np.array([zone_ids[x.zone] for x in nodes], dtype=np.int64).reshape(n)

        shape = (n, g)
        self.gpu_exists: BOOL = np.zeros(shape, dtype=bool)
        self.gpu_healthy: BOOL = np.zeros(shape, dtype=bool)
        self.gpu_mig: BOOL = np.zeros(shape, dtype=bool)
        self.gpu_mem_cap: I64 = np.zeros(shape, dtype=np.int64)
        self.gpu_numa: I64 = np.full(shape, -1, dtype=np.int64)
        self.gpu_socket: I64 = np.full(shape, -1, dtype=np.int64)
        self.gpu_nvlink_group: I64 = np.full(shape, -1, dtype=np.int64)
        self.gpu_nvlink_bw: F64 = np.zeros(shape, dtype=np.float64)
        self.gpu_pcie_gen: I64 = np.zeros(shape, dtype=np.int64)
        for i, node in enumerate(nodes):
            if len(node.gpus) > g:
                raise ValueError(f"node {node.name} has {len(node.gpus)} GPUs, more than {g}")
            for j, gpu in enumerate(node.gpus):
                self.gpu_exists[i, j] = True
                self.gpu_healthy[i, j] = gpu.health.schedulable
                self.gpu_mig[i, j] = gpu.mig_enabled
                self.gpu_mem_cap[i, j] = gpu.memory_mib
                self.gpu_numa[i, j] = gpu.numa_node
                self.gpu_socket[i, j] = gpu.socket
                self.gpu_nvlink_group[i, j] = gpu.nvlink_group
                self.gpu_nvlink_bw[i, j] = gpu.nvlink_bandwidth_gbps
                self.gpu_pcie_gen[i, j] = gpu.pcie_gen
        # Compute is counted in milli-GPU; a GPU is "fully free" when both counters are at capacity.
        self.gpu_milli_cap: I64 = np.where(self.gpu_exists, MILLI_PER_GPU, 0).astype(np.int64)
        self.gpu_milli_free: I64 = self.gpu_milli_cap.copy()
        self.gpu_mem_free: I64 = self.gpu_mem_cap.copy()
        self.gpu_health: list[list[GpuHealth]] = [[gpu.health for gpu in node.gpus] for node in nodes]

        self.mig_layouts: dict[tuple[int, int], mig.MigLayout] = {}
        self.mig_instances: dict[tuple[int, int], frozenset[tuple[str, int]]] = {}
        """The instances a MIG GPU has (profile, start), where its agent reported them: grants go
        only there. A GPU absent here places instances anywhere its catalog allows."""
        for i, node in enumerate(nodes):
            for j, gpu in enumerate(node.gpus):
                if gpu.mig_enabled:
                    self.mig_layouts[(i, j)] = mig.MigLayout(mig.catalog_for(gpu.model))
                    if gpu.mig_instances is not None:
                        self.mig_instances[(i, j)] = frozenset(gpu.mig_instances)

        self.gen: I64 = np.zeros(n, dtype=np.int64)
        self._generation = 0
        self.allocations: dict[str, Allocation] = {}
        self.by_node: list[set[str]] = [set() for _ in range(n)]

    # ---- derived views -------------------------------------------------------------------
    def usable_gpus(self, rows: I64 | None = None) -> BOOL:
        """GPUs that may take a new non-MIG grant: present, healthy, not MIG-partitioned."""
        if rows is None:
            return self.gpu_exists & self.gpu_healthy & ~self.gpu_mig & self.node_schedulable[:, None]
        return (
            self.gpu_exists[rows]
            & self.gpu_healthy[rows]
            & ~self.gpu_mig[rows]
            & self.node_schedulable[rows, None]
        )

    def fully_free(self, rows: I64 | None = None) -> BOOL:
        """Usable GPUs with all of their compute and memory free."""
        if rows is None:
            return (  # type: ignore[no-any-return]
                self.usable_gpus()
                & (self.gpu_milli_free == self.gpu_milli_cap)
                & (self.gpu_mem_free == self.gpu_mem_cap)
            )
        return (  # type: ignore[no-any-return]
            self.usable_gpus(rows)
            & (self.gpu_milli_free[rows] == self.gpu_milli_cap[rows])
            & (self.gpu_mem_free[rows] == self.gpu_mem_cap[rows])
        )

    def gpu_milli_free_total(self) -> int:
        return int(np.where(self.gpu_exists, self.gpu_milli_free, 0).sum())

    def total_gpu_milli(self) -> int:
        return int(self.gpu_milli_cap.sum())

    def allocated_gpu_milli(self) -> int:
        return self.total_gpu_milli() - self.gpu_milli_free_total()

    # ---- changes ---------------------------------------------------------------------------
    def _touch(self, node_index: int) -> None:
        self._generation += 1
        self.gen[node_index] = self._generation

    def allocate(
        self,
        alloc_id: str,
        node_index: int,
        cpu_milli: int,
        memory_mib: int,
        grants: Iterable[GpuGrant],
        expires_at: float | None = None,
    ) -> Allocation:
        """Hold resources on a node; all-or-nothing, never beyond capacity."""
        grants = tuple(grants)
        if alloc_id in self.allocations:
            raise OversubscriptionError(f"allocation {alloc_id!r} already exists")
        if not 0 <= node_index < self.n_nodes:
            raise OversubscriptionError(f"node index {node_index} out of range")
        name = self.nodes[node_index].name
        if cpu_milli < 0 or memory_mib < 0:
            raise OversubscriptionError(f"{alloc_id}: negative request")
        if cpu_milli > self.cpu_free[node_index]:
            raise OversubscriptionError(f"{alloc_id}: insufficient cpu on {name}")
        if memory_mib > self.mem_free[node_index]:
            raise OversubscriptionError(f"{alloc_id}: insufficient memory on {name}")
        seen: set[int] = set()
        new_layouts: dict[tuple[int, int], mig.MigLayout] = {}
        recorded: list[GpuGrant] = []  # the grants as held (MIG grants with their start slot)
        for grant in grants:
            j = grant.gpu_index
            if j in seen:
                raise OversubscriptionError(f"{alloc_id}: GPU {j} granted twice")
            seen.add(j)
            if not 0 <= j < self.max_gpus or not self.gpu_exists[node_index, j]:
                raise OversubscriptionError(f"{alloc_id}: {name} has no GPU {j}")
            if grant.milli < 0 or grant.memory_mib < 0:
                raise OversubscriptionError(f"{alloc_id}: negative GPU grant")
            if grant.mig_profile is not None:
                layout = self.mig_layouts.get((node_index, j))
                if layout is None:
                    raise OversubscriptionError(f"{alloc_id}: GPU {j} on {name} is not in MIG mode")
                try:
                    start = grant.mig_start
                    if start is None:
                        start = self.mig_start(node_index, j, grant.mig_profile, layout)
                        if start is None:
                            raise mig.MigPlacementError(f"no {grant.mig_profile} free on GPU {j} of {name}")
                    elif not self._mig_instance_exists(node_index, j, grant.mig_profile, start):
                        raise mig.MigPlacementError(
                            f"GPU {j} of {name} has no {grant.mig_profile} instance at slot {start}"
                        )
                    placed = layout.place(grant.mig_profile, start)
                except (mig.MigPlacementError, KeyError) as exc:  # KeyError: unknown profile
                    raise OversubscriptionError(f"{alloc_id}: {exc}") from exc
                new_layouts[(node_index, j)] = placed
                if grant.mig_start is None:  # placed at the first fitting slot: remember which
                    grant = replace(grant, mig_start=start)
                recorded.append(grant)
                continue
            recorded.append(grant)
            if self.gpu_mig[node_index, j]:
                raise OversubscriptionError(f"{alloc_id}: GPU {j} on {name} is MIG-partitioned")
            if grant.milli > self.gpu_milli_free[node_index, j]:
                raise OversubscriptionError(f"{alloc_id}: insufficient GPU compute on {name} GPU {j}")
            if grant.memory_mib > self.gpu_mem_free[node_index, j]:
                raise OversubscriptionError(f"{alloc_id}: insufficient GPU memory on {name} GPU {j}")
        # All checks passed: apply.
        self.cpu_free[node_index] -= cpu_milli
        self.mem_free[node_index] -= memory_mib
        for grant in grants:
            if grant.mig_profile is None:
                self.gpu_milli_free[node_index, grant.gpu_index] -= grant.milli
                self.gpu_mem_free[node_index, grant.gpu_index] -= grant.memory_mib
        self.mig_layouts.update(new_layouts)
        alloc = Allocation(alloc_id, node_index, cpu_milli, memory_mib, tuple(recorded), expires_at)
        self.allocations[alloc_id] = alloc
        self.by_node[node_index].add(alloc_id)
        self._touch(node_index)
        return alloc

    def release(self, alloc_id: str) -> Allocation:
        """Return an allocation's resources; unknown ids raise (a double release is a bug)."""
        alloc = self.allocations.pop(alloc_id, None)
        if alloc is None:
            raise UnknownAllocationError(alloc_id)
        i = alloc.node_index
        self.by_node[i].discard(alloc_id)
        self.cpu_free[i] += alloc.cpu_milli
        self.mem_free[i] += alloc.memory_mib
        for grant in alloc.grants:
            if grant.mig_profile is not None:
                layout = self.mig_layouts[(i, grant.gpu_index)]
                if grant.mig_start is None:
                    raise StateInvariantError(f"{alloc_id}: MIG grant recorded without its start slot")
                self.mig_layouts[(i, grant.gpu_index)] = layout.remove(grant.mig_start)
            else:
                self.gpu_milli_free[i, grant.gpu_index] += grant.milli
                self.gpu_mem_free[i, grant.gpu_index] += grant.memory_mib
        self._touch(i)
        return alloc

    def without(self, alloc_id: str) -> ClusterState:
        """A scratch copy of this state with `alloc_id` given back (this state is not changed):
        for a read that must see a node as it was before an allocation, such as a bind's
        explanation. What a release writes is copied (the free-capacity arrays, the MIG layouts,
        the allocation book and the allocation's node's set); the rest is shared, read-only."""
        alloc = self.allocations.get(alloc_id)
        if alloc is None:
            raise UnknownAllocationError(alloc_id)
        scratch = self._scratch(sets=(alloc.node_index,))
        scratch.release(alloc_id)
        return scratch

    def read_copy(self) -> ClusterState:
        """A copy to read while this state goes on changing (e.g. outside the lock that guards
        it): nothing `allocate`, `release` or `expire` later does here shows in the copy."""
        return self._scratch(sets=range(self.n_nodes))

    def mig_start(
        self, node_index: int, j: int, profile: str, layout: mig.MigLayout | None = None
    ) -> int | None:
        """The first start slot where a grant of `profile` fits on GPU `j` of the node now (in
        `layout`, else the GPU's current one): on a GPU whose instances were reported, the start of
        an idle instance of that profile; else any start the catalog allows. None: none.

        Raises:
            KeyError: `profile` is not in the GPU's catalog.
        """
        if layout is None:
            layout = self.mig_layouts[(node_index, j)]
        starts = layout.valid_starts(profile)
        reported = self.mig_instances.get((node_index, j))
        if reported is not None:
            starts = tuple(s for s in starts if (profile, s) in reported)
        return starts[0] if starts else None

    def _mig_instance_exists(self, node_index: int, j: int, profile: str, start: int) -> bool:
        reported = self.mig_instances.get((node_index, j))
        return reported is None or (profile, start) in reported

    def _scratch(self, *, sets: Iterable[int]) -> ClusterState:
        """A copy sharing the read-only parts (node specs, capacities): what an allocation or a
        release writes is copied (the free-capacity arrays, the generations, the MIG layouts, the
        allocation book), and the allocation sets of the nodes `sets`."""
        scratch = copy.copy(self)
        scratch.cpu_free, scratch.mem_free = self.cpu_free.copy(), self.mem_free.copy()
        scratch.gpu_milli_free, scratch.gpu_mem_free = self.gpu_milli_free.copy(), self.gpu_mem_free.copy()
        scratch.gen = self.gen.copy()
        scratch.mig_layouts = dict(self.mig_layouts)
        scratch.allocations = dict(self.allocations)
        scratch.by_node = list(self.by_node)
        for i in sets:
            scratch.by_node[i] = set(self.by_node[i])
        return scratch

    def confirm(self, alloc_id: str) -> Allocation:
        """Turn an assumed (TTL) allocation into a committed one."""
        alloc = self.allocations.get(alloc_id)
        if alloc is None:
            raise UnknownAllocationError(alloc_id)
        if alloc.expires_at is not None:
            alloc = Allocation(
                alloc.id, alloc.node_index, alloc.cpu_milli, alloc.memory_mib, alloc.grants, None
            )
            self.allocations[alloc_id] = alloc
        return alloc

    def expire(self, now: float | None = None) -> list[Allocation]:
        """Release every assumed allocation whose TTL has passed."""
        now = time.monotonic() if now is None else now
        stale = [a.id for a in self.allocations.values() if a.expires_at is not None and a.expires_at <= now]
        return [self.release(a) for a in stale]

    def set_gpu_health(self, node_index: int, gpu_index: int, health: GpuHealth) -> None:
        self.gpu_health[node_index][gpu_index] = health
        self.gpu_healthy[node_index, gpu_index] = health.schedulable
        self._touch(node_index)

    def set_node_schedulable(self, node_index: int, schedulable: bool) -> None:
        self.node_schedulable[node_index] = schedulable
        self._touch(node_index)

    # ---- checks ----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Recount every counter from the allocations; raise `StateInvariantError` on any drift."""
        cpu = self.cpu_cap.copy()
        mem = self.mem_cap.copy()
        milli = self.gpu_milli_cap.copy()
        gmem = self.gpu_mem_cap.copy()
        for a in self.allocations.values():
            cpu[a.node_index] -= a.cpu_milli
            mem[a.node_index] -= a.memory_mib
            for grant in a.grants:
                if grant.mig_profile is None:
                    milli[a.node_index, grant.gpu_index] -= grant.milli
                    gmem[a.node_index, grant.gpu_index] -= grant.memory_mib
        checks = (
            ((cpu >= 0).all() and (mem >= 0).all(), "cpu/memory oversubscribed"),
            ((milli >= 0).all() and (gmem >= 0).all(), "GPU oversubscribed"),
            (np.array_equal(cpu, self.cpu_free) and np.array_equal(mem, self.mem_free), "cpu/memory drift"),
            (np.array_equal(milli, self.gpu_milli_free), "GPU compute drift"),
            (np.array_equal(gmem, self.gpu_mem_free), "GPU memory drift"),
        )
        for ok, what in checks:
            if not ok:
                raise StateInvariantError(what)
