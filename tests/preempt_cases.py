"""Random small clusters for GPU-aware preemption, and a brute-force search to judge it by.

Shared by the oracle test (tests/unit/test_preempt_oracle.py) and its longer sweep
(bench/preemption.py). The brute force is independent of the search: it enumerates every subset
of the candidate units on every node, in key order, and checks each with the engine's own
filters on a copy of the state with the subset's allocations given back
(`ClusterState.without`).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import numpy as np

from neuronetes.engine.filters import FILTERS, mig_slot, share_fit
from neuronetes.engine.preempt import (
    PreemptionDecision,
    Unit,
    Victim,
    VictimOrder,
    choose_victims,
    group_units,
    set_key,
)
from neuronetes.inventory import ClusterState
from neuronetes.model import GpuGrant, GpuSpec, Locality, NodeSpec, PodRequest

PRIORITIES = (0, 10, 20, 50)
PREEMPTOR_PRIORITY = 100
MIG_PROFILES = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")


@dataclass
class Case:
    state: ClusterState
    preemptor: PodRequest
    units: list[Unit]
    order: VictimOrder = VictimOrder.LOWEST_PRIORITY_FIRST


def _node(rng: random.Random, k: int) -> NodeSpec:
    n = rng.randint(1, 8)
    mig = rng.random() < 0.2
    model, mem = ("A100-40GB", 40960) if mig or rng.random() < 0.5 else ("A100-80GB", 81920)
    gpus = tuple(
        GpuSpec(
            j, f"n{k}-g{j}", model, mem, nvlink_group=j // 4, nvlink_bandwidth_gbps=300.0, mig_enabled=mig
        )
        for j in range(n)
    )
    cpu = rng.choice([64_000, 64_000, 64_000, 12_000])  # now and then CPU binds too
    return NodeSpec(f"n{k}", cpu, 512_000, gpus)


def _request(rng: random.Random, name: str, mig: bool, priority: int) -> PodRequest:
    cpu = rng.choice([500, 1000, 4000])
    if mig:
        return PodRequest(
            name, cpu_milli=cpu, gpus=1, mig_profile=rng.choice(MIG_PROFILES[:4]), priority=priority
        )
    kind = rng.random()
    if kind < 0.35:
        return PodRequest(name, cpu_milli=cpu, gpus=rng.choice([1, 1, 2]), priority=priority)
    return PodRequest(
        name,
        cpu_milli=cpu,
        gpus=1,
        gpu_milli=rng.choice([100, 250, 300, 500]),
        gpu_memory_mib=rng.choice([0, 8192, 20480]),
        priority=priority,
    )


def _preemptor(rng: random.Random, state: ClusterState) -> PodRequest:
    cpu = rng.choice([1000, 4000, 8000])
    p = PREEMPTOR_PRIORITY
    kind = rng.random()
    if kind < 0.2 and state.gpu_mig.any():
        return PodRequest("vip", cpu_milli=cpu, gpus=1, mig_profile=rng.choice(MIG_PROFILES), priority=p)
    if kind < 0.55:
        k = rng.choice([1, 1, 2, 3, 4])
        loc = Locality.NVLINK if k > 1 and rng.random() < 0.2 else Locality.ANY
        return PodRequest("vip", cpu_milli=cpu, gpus=k, locality=loc, priority=p)
    return PodRequest(
        "vip",
        cpu_milli=cpu,
        gpus=rng.choice([1, 1, 1, 2]),
        gpu_milli=rng.choice([300, 500, 700, 900]),
        gpu_memory_mib=rng.choice([0, 10240, 30720, 61440]),
        priority=p,
    )


def random_grants(
    rng: random.Random, state: ClusterState, row: int, req: PodRequest
) -> list[GpuGrant] | None:
    """Random GPUs on `row` that can take `req` now (None: none can)."""
    if state.cpu_free[row] < req.cpu_milli:
        return None
    if req.mig_profile is not None:
        slot = mig_slot(state, row, req.mig_profile)
        return None if slot is None else [GpuGrant(slot[0], 0, 0, req.mig_profile, slot[1])]
    rows = np.array([row])
    fit = state.fully_free(rows)[0] if req.exclusive else share_fit(state, req, rows)[0]
    free = [int(j) for j in np.nonzero(fit)[0]]
    if len(free) < req.gpus:
        return None
    chosen = sorted(rng.sample(free, req.gpus))
    if req.exclusive:
        return [GpuGrant(j, int(state.gpu_milli_cap[row, j]), int(state.gpu_mem_cap[row, j])) for j in chosen]
    return [GpuGrant(j, req.gpu_milli, req.gpu_memory_mib) for j in chosen]


def random_case(rng: random.Random) -> Case:
    """A loaded cluster of 1-3 nodes (1-8 GPUs each: whole, shared or MIG), lone pods, gangs
    (members on any node), GPUSlices with pods inside, PodDisruptionBudgets (0-2 of them, each
    allowing 0-2 disruptions, covering some pods), a few pods at or above the preemptor's
    priority (never candidates), a preemptor, and the victim order (a quarter fewest-victims)."""
    nodes = [_node(rng, k) for k in range(rng.randint(1, 3))]
    budgets = {f"pdb{b}": rng.randint(0, 2) for b in range(rng.randint(0, 2))}
    state = ClusterState(nodes)
    victims: list[Victim] = []
    slices: set[str] = set()
    for k in range(rng.randint(2, 10)):
        priority = (
            rng.choice((*PRIORITIES, PREEMPTOR_PRIORITY)) if rng.random() < 0.1 else rng.choice(PRIORITIES)
        )
        group, size, in_slice = "", 1, False
        roll = rng.random()
        if roll < 0.12:
            group, size = f"gang{k}", rng.randint(2, 3)
        elif roll < 0.2:
            group, in_slice = f"slice/{k}", True
        for m in range(size):
            node = rng.randrange(len(nodes))
            req = _request(rng, f"p{k}-{m}", bool(state.gpu_mig[node].any()), priority)
            grants = random_grants(rng, state, node, req)
            if grants is None:
                continue
            alloc = group if in_slice else f"pod/p{k}-{m}"
            state.allocate(alloc, node, req.cpu_milli, req.memory_mib, grants)
            common = {
                "priority": priority,
                "start_time": float(rng.randrange(1000)),
                "group": group,
                **_pdb_of(rng, budgets),
                "gpu_seconds_lost": float(rng.randrange(0, 5000, 250)),
            }
            if in_slice:
                slices.add(group)
                victims.append(Victim(group, allocation=alloc, **common))  # type: ignore[arg-type]
                for pod in range(rng.randint(1, 2)):
                    victims.append(Victim(f"{group}-pod{pod}", **common))  # type: ignore[arg-type]
            else:
                victims.append(Victim(f"p{k}-{m}", allocation=alloc, **common))  # type: ignore[arg-type]
    preemptor = _preemptor(rng, state)
    for _ in range(4):  # mostly a pod that does not fit as things are: preemption's question
        if not any(fits_after(state, preemptor, row, []) for row in range(state.n_nodes)):
            break
        preemptor = _preemptor(rng, state)
    order = VictimOrder.FEWEST_VICTIMS if rng.random() < 0.25 else VictimOrder.LOWEST_PRIORITY_FIRST
    return Case(state, preemptor, group_units(victims, counted_once=slices), order)


def _pdb_of(rng: random.Random, budgets: dict[str, int]) -> dict[str, object]:
    """A victim's PDB fields: about a third of the pods are covered by one of `budgets`."""
    if not budgets or rng.random() < 0.65:
        return {}
    name = rng.choice(sorted(budgets))
    return {"pdb": name, "pdb_allowed": budgets[name]}


def fits_after(state: ClusterState, req: PodRequest, row: int, units: list[Unit]) -> bool:
    """The engine's filters for `req` on `row` with `units`' allocations given back."""
    for u in units:
        for alloc in u.allocations:
            if alloc in state.allocations:
                state = state.without(alloc)
    rows = np.array([row], dtype=np.int64)
    return all(bool(flt.fn(state, req, rows)[0]) for flt in FILTERS)


def brute_force(case: Case) -> tuple[int, tuple[Unit, ...]] | None:
    """The least (key, node row) feasible set over every subset of every node's candidates."""
    st, req = case.state, case.preemptor
    best: tuple[tuple[object, ...], int, tuple[Unit, ...]] | None = None
    for row in range(st.n_nodes):
        here = [
            u
            for u in case.units
            if u.priority < req.priority and any(a in st.by_node[row] for a in u.allocations)
        ]
        if not fits_after(st, req, row, here):
            continue  # even all of them do not make room
        subsets = [c for n in range(len(here) + 1) for c in itertools.combinations(here, n)]
        subsets.sort(key=lambda sub: set_key(sub, case.order))
        for subset in subsets:
            if best is not None and (set_key(subset, case.order), row) >= (best[0], best[1]):
                break
            if fits_after(st, req, row, list(subset)):
                best = (set_key(subset, case.order), row, subset)
                break
    return None if best is None else (best[1], best[2])


@dataclass
class Verdict:
    needed: bool
    agrees: bool
    minimal: bool
    feasible: bool


def judge(case: Case, decision: PreemptionDecision | None = None) -> Verdict:
    """The search's decision against the brute force: same node and set; every victim needed."""
    decision = decision or choose_victims(case.state, case.preemptor, case.units, order=case.order)
    brute = brute_force(case)
    st, req = case.state, case.preemptor
    if brute is None:
        return Verdict(True, decision.node is None, True, True)
    row, expected = brute
    if not expected:
        return Verdict(False, not decision.victims and decision.node is not None, True, True)
    if decision.node is None:
        return Verdict(True, False, True, False)
    chosen_row = st.index[decision.node]
    chosen = list(decision.victims)
    feasible = fits_after(st, req, chosen_row, chosen)
    minimal = all(not fits_after(st, req, chosen_row, [v for v in chosen if v is not u]) for u in chosen)
    agrees = chosen_row == row and {u.id for u in chosen} == {u.id for u in expected}
    return Verdict(True, agrees, minimal, feasible)
