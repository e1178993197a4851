"""Gang placement: all members committed or none, same-node and NVLink locality, competing gangs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from node_factory import NodeFactory

from neuronetes.engine import POLICIES, PlacementEngine, gang
from neuronetes.engine.gang import GangPlan, commit_gang
from neuronetes.inventory import ClusterState, OversubscriptionError
from neuronetes.model import GpuGrant, Locality, PodRequest

pytestmark = pytest.mark.unit

FREE = ("cpu_free", "mem_free", "gpu_milli_free", "gpu_mem_free")


def snapshot(state: ClusterState) -> dict[str, Any]:
    snap: dict[str, Any] = {k: getattr(state, k).copy() for k in FREE}
    snap["allocations"] = dict(state.allocations)
    snap["mig"] = dict(state.mig_layouts)
    return snap


def assert_same(state: ClusterState, snap: dict[str, Any]) -> None:
    for k in FREE:
        np.testing.assert_array_equal(getattr(state, k), snap[k], err_msg=k)
    assert state.allocations == snap["allocations"]
    assert state.mig_layouts == snap["mig"]


def held_by(state: ClusterState, prefix: str) -> list[str]:
    return sorted(a for a in state.allocations if a.startswith(prefix + "/"))


def nvlink_groups(state: ClusterState, plan: GangPlan) -> set[tuple[int, int]]:
    return {
        (p.node_index, int(state.gpu_nvlink_group[p.node_index, j]))
        for p in plan.placements
        for j in p.gpu_indices
    }


@dataclass(frozen=True)
class Committed(GangPlan):
    """A plan as `commit_gang` held it (the ids of its allocations)."""

    alloc_ids: tuple[str, ...] = ()


def plan_gang(
    engine: PlacementEngine,
    members: list[PodRequest],
    locality: Locality = Locality.ANY,
    prefix: str = "gang",
    ttl: float | None = None,
) -> Committed | None:
    """`gang.plan_gang` (pure: the state is checked unchanged) then `commit_gang`."""
    before = snapshot(engine.state)
    plan = gang.plan_gang(engine, members, locality)
    assert_same(engine.state, before)
    if plan is None:
        return None
    return Committed(plan.placements, commit_gang(engine, plan, prefix, ttl))


def workers(n: int, gpus: int, cpu: int = 1000, **kw: Any) -> list[PodRequest]:
    return [PodRequest(f"w{k}", cpu_milli=cpu, gpus=gpus, **kw) for k in range(n)]


# ---- all or nothing ----------------------------------------------------------------------------------
@pytest.mark.parametrize("locality", list(Locality))
def test_a_gang_whose_last_member_cannot_fit_leaves_nothing_behind(
    nodes: NodeFactory, locality: Locality
) -> None:
    state = ClusterState([nodes.t4("t4"), nodes.cpu("cpu")])
    state.allocate("other", 0, 1000, 0, [GpuGrant(0, 200, 0)])
    engine = PlacementEngine(state, "default")
    before = snapshot(state)
    # Four 0.6-GPU shares fit the four T4s; the fifth finds no GPU with 0.6 free once they are placed.
    members = [PodRequest(f"s{k}", cpu_milli=1000, gpus=1, gpu_milli=600) for k in range(5)]
    assert plan_gang(engine, members, locality, "g") is None
    assert_same(state, before)
    assert held_by(state, "g") == []
    state.check_invariants()
    if locality in (Locality.ANY, Locality.SAME_NODE):
        plan = plan_gang(engine, members[:4], locality, "g")
        assert plan is not None and plan.nodes == {"t4"}
        assert sorted(j for p in plan.placements for j in p.gpu_indices) == [0, 1, 2, 3]
        state.check_invariants()


def test_a_gang_rolls_back_committed_members_when_a_later_one_fails(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("a"), nodes.dgx("b")])
    engine = PlacementEngine(state, "bestfit")
    before = snapshot(state)
    # Members are placed largest first, so the CPU-only member comes last and fails after the
    # GPU members were committed.
    members = [*workers(2, 4), PodRequest("driver", cpu_milli=200_000)]
    assert plan_gang(engine, members, Locality.ANY, "g") is None
    assert_same(state, before)
    plan = plan_gang(engine, [*workers(2, 4), PodRequest("driver", cpu_milli=100_000)], Locality.ANY, "g")
    assert plan is not None and len(plan.alloc_ids) == 3


def test_a_gang_larger_than_the_cluster_is_refused_whole(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("a"), nodes.dgx("b")])
    engine = PlacementEngine(state, "bestfit")
    before = snapshot(state)
    assert plan_gang(engine, workers(5, 4), Locality.ANY, "g") is None  # 20 GPUs > 16
    assert_same(state, before)
    plan = plan_gang(engine, workers(4, 4), Locality.ANY, "g")
    assert plan is not None and plan.nodes == {"a", "b"}
    assert state.allocated_gpu_milli() == 16_000


def test_plan_ids_follow_member_order_and_ttl_applies_to_all(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    engine = PlacementEngine(state, "default")
    members = [PodRequest("small", gpus=1), PodRequest("large", gpus=4), PodRequest("cpu", cpu_milli=500)]
    plan = plan_gang(engine, members, Locality.SAME_NODE, "job-1", ttl=30.0)
    assert plan is not None
    assert plan.alloc_ids == ("job-1/0", "job-1/1", "job-1/2")
    assert [p.request for p in plan.placements] == members
    assert [len(p.grants) for p in plan.placements] == [1, 4, 0]
    assert all(state.allocations[a].expires_at is not None for a in plan.alloc_ids)
    assert len({j for p in plan.placements for j in p.gpu_indices}) == 5
    expired = state.expire(time.monotonic() + 31.0)
    assert sorted(a.id for a in expired) == list(plan.alloc_ids)
    assert state.allocations == {}


def test_empty_gang_is_an_error(nodes: NodeFactory) -> None:
    engine = PlacementEngine(ClusterState([nodes.t4("t4")]))
    with pytest.raises(ValueError):
        plan_gang(engine, [], Locality.ANY, "g")


def test_an_alloc_id_clash_rolls_the_whole_gang_back(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    engine = PlacementEngine(state, "default")
    state.allocate("g/1", 0, 0, 0, [])  # the second member's id is taken
    before = snapshot(state)
    # Planning is pure; committing is all or nothing and says why (never "no fit").
    with pytest.raises(OversubscriptionError, match="already exists"):
        plan_gang(engine, workers(3, 1), Locality.ANY, "g")
    assert_same(state, before)


# ---- locality -------------------------------------------------------------------------------------------
def test_same_node_puts_every_member_on_one_node(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("busy"), nodes.dgx("roomy"), nodes.t4("t4")])
    state.allocate("other", 0, 0, 0, [GpuGrant(j, 1000, 0) for j in range(4)])  # "busy": 4 free
    for policy in ("default", "bestfit", "fgd"):
        engine = PlacementEngine(state, policy)
        plan = plan_gang(engine, workers(3, 2), Locality.SAME_NODE, f"g-{policy}")
        assert plan is not None, policy
        assert plan.nodes == {"roomy"}, policy
        for a in plan.alloc_ids:
            engine.release(a)
    # With no locality bestfit packs the tightest nodes first and the gang spreads.
    engine = PlacementEngine(state, "bestfit")
    spread = plan_gang(engine, workers(3, 2), Locality.ANY, "g-any")
    assert spread is not None and len(spread.nodes) > 1


def test_same_node_fails_when_no_single_node_holds_the_gang(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("a"), nodes.t4("b")])
    engine = PlacementEngine(state, "default")
    before = snapshot(state)
    assert plan_gang(engine, workers(3, 2), Locality.SAME_NODE, "g") is None  # 6 GPUs, 4 per node
    assert_same(state, before)
    assert plan_gang(engine, workers(3, 2), Locality.ANY, "g") is not None


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_nvlink_gang_keeps_all_gpus_in_one_nvlink_group(nodes: NodeFactory, policy: str) -> None:
    state = ClusterState([nodes.dgx("dgx"), nodes.t4("pcie", n_gpus=8)])
    state.allocate("other", 0, 0, 0, [GpuGrant(1, 1000, 0)])  # group 0: 3 free, group 1: 4 free
    engine = PlacementEngine(state, policy, seed=1)
    plan = plan_gang(engine, workers(2, 2), Locality.NVLINK, "g")
    assert plan is not None
    assert plan.nodes == {"dgx"}
    assert nvlink_groups(state, plan) == {(0, 1)}
    assert sorted(j for p in plan.placements for j in p.gpu_indices) == [4, 5, 6, 7]
    state.check_invariants()
    # A second such gang no longer fits anywhere (3 free in group 0; the PCIe node has no NVLink).
    before = snapshot(state)
    assert plan_gang(engine, workers(2, 2), Locality.NVLINK, "h") is None
    assert_same(state, before)
    # Three GPUs still fit in group 0.
    small = plan_gang(engine, [PodRequest("a", gpus=2), PodRequest("b", gpus=1)], Locality.NVLINK, "s")
    assert small is not None and nvlink_groups(state, small) == {(0, 0)}


def test_nvlink_gang_tries_the_next_node_when_the_first_cannot_hold_it(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("split"), nodes.dgx("whole", groups=1)])
    state.allocate("other", 0, 0, 0, [GpuGrant(0, 1000, 0), GpuGrant(4, 1000, 0)])
    engine = PlacementEngine(state, "default")
    plan = plan_gang(engine, workers(3, 2), Locality.NVLINK, "g")
    assert plan is not None and plan.nodes == {"whole"}
    assert len(nvlink_groups(state, plan)) == 1


def test_nvlink_gang_with_a_cpu_only_launcher_keeps_gpus_in_one_group(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    state.allocate("other", 0, 0, 0, [GpuGrant(1, 1000, 0)])
    engine = PlacementEngine(state, "default")
    plan = plan_gang(engine, [*workers(2, 2), PodRequest("launcher", cpu_milli=1000)], Locality.NVLINK, "g")
    assert plan is not None
    assert len(nvlink_groups(state, plan)) == 1


def test_nvlink_gang_of_shared_members_keeps_gpus_in_one_group(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    state.allocate("other", 0, 0, 0, [GpuGrant(0, 600, 0), GpuGrant(4, 600, 0)])
    engine = PlacementEngine(state, "default")
    members = [PodRequest(f"s{k}", gpus=1, gpu_milli=400) for k in range(2)]
    plan = plan_gang(engine, members, Locality.NVLINK, "g")
    assert plan is not None
    assert len(nvlink_groups(state, plan)) == 1


def test_nvlink_gang_respects_every_members_gpu_models(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("a100"), nodes.dgx("h100", model="H100-SXM5-80GB")])
    engine = PlacementEngine(state, "default")
    members = [PodRequest("any", gpus=2), PodRequest("h100-only", gpus=2, gpu_models=("H100",))]
    plan = plan_gang(engine, members, Locality.NVLINK, "g")
    assert plan is not None and plan.nodes == {"h100"}


def test_nvlink_gang_of_shared_members_moves_to_a_group_that_holds_them_all(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    # Group 0 is the tightest (GPUs 0-2 with 0.5 free each) but cannot hold the 0.6 share.
    state.allocate("other", 0, 0, 0, [GpuGrant(0, 500, 0), GpuGrant(1, 500, 0), GpuGrant(2, 500, 0)])
    state.allocate("full", 0, 0, 0, [GpuGrant(3, 1000, 0)])
    engine = PlacementEngine(state, "bestfit")
    members = [PodRequest("a", gpus=1, gpu_milli=400), PodRequest("b", gpus=1, gpu_milli=600)]
    plan = plan_gang(engine, members, Locality.NVLINK, "g")
    assert plan is not None
    assert nvlink_groups(state, plan) == {(0, 1)}
    state.check_invariants()


@pytest.mark.parametrize("locality", [Locality.NVLINK, Locality.SAME_SOCKET])
def test_a_gang_mixing_whole_shared_and_cpu_only_members_stays_in_one_group(
    nodes: NodeFactory, locality: Locality
) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    state.allocate("other", 0, 0, 0, [GpuGrant(0, 1000, 0)])  # group/socket 0: 3 free, 1: 4 free
    engine = PlacementEngine(state, "default")
    members = [
        PodRequest("launcher", cpu_milli=1000),
        PodRequest("w0", gpus=2),
        PodRequest("s0", gpus=1, gpu_milli=300),
        PodRequest("s1", gpus=1, gpu_milli=300),
    ]
    plan = plan_gang(engine, members, locality, "g")
    assert plan is not None and [len(p.grants) for p in plan.placements] == [0, 2, 1, 1]
    assert len(nvlink_groups(state, plan)) == 1
    # Too much for any one group: nothing is held.
    before = snapshot(state)
    assert plan_gang(engine, [*workers(2, 2), PodRequest("s", gpus=1, gpu_milli=300)], locality, "h") is None
    assert_same(state, before)


# ---- competing gangs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("locality", "n", "gpus"),
    [
        (Locality.ANY, 3, 4),  # 12 + 12 GPUs on 16
        (Locality.SAME_NODE, 2, 3),  # 6 + 6 on one node of 8 (the T4 node has 4)
        (Locality.NVLINK, 2, 2),  # 4 + 4 in one group of 4 (the other group has 3 free)
    ],
)
def test_two_gangs_competing_for_the_same_nodes_never_end_partial(
    nodes: NodeFactory, locality: Locality, n: int, gpus: int
) -> None:
    specs = [nodes.dgx("a"), nodes.dgx("b")] if locality is Locality.ANY else [nodes.dgx("a"), nodes.t4("t4")]
    state = ClusterState(specs)
    if locality is Locality.NVLINK:
        state.allocate("other", 0, 0, 0, [GpuGrant(4, 1000, 0)])
    engine = PlacementEngine(state, "default")
    plan_a = plan_gang(engine, workers(n, gpus), locality, "A")
    assert plan_a is not None and held_by(state, "A") == [f"A/{k}" for k in range(n)]
    before = snapshot(state)
    plan_b = plan_gang(engine, workers(n, gpus), locality, "B")
    # B gets nothing (it cannot fit beside A), A keeps everything, and nothing is left half-held.
    assert plan_b is None
    assert held_by(state, "B") == []
    assert_same(state, before)
    state.check_invariants()
    # Once A finishes, B fits: nothing was left locked.
    for alloc_id in plan_a.alloc_ids:
        engine.release(alloc_id)
    plan_b = plan_gang(engine, workers(n, gpus), locality, "B")
    assert plan_b is not None and len(held_by(state, "B")) == n
    state.check_invariants()


def test_many_competing_gangs_each_all_or_nothing(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("a"), nodes.dgx("b"), nodes.t4("c")])
    engine = PlacementEngine(state, "default")
    sizes = [(3, 2), (2, 4), (4, 1), (1, 8), (2, 2), (5, 1), (2, 4)]
    outcomes = []
    for g, (n, gpus) in enumerate(sizes):
        plan = plan_gang(engine, workers(n, gpus), Locality.ANY, f"G{g}")
        held = held_by(state, f"G{g}")
        assert len(held) == (n if plan is not None else 0)
        outcomes.append(plan is not None)
        state.check_invariants()
    assert any(outcomes) and not all(outcomes)
    assert state.allocated_gpu_milli() == sum(
        n * gpus * 1000 for (n, gpus), ok in zip(sizes, outcomes, strict=True) if ok
    )


# ---- one GPU model per gang (issue 9) -------------------------------------------------------------------
def test_plan_gang_is_pure(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("a"), nodes.t4("t4")])
    engine = PlacementEngine(state, "default")
    before = snapshot(state)
    plan = gang.plan_gang(engine, workers(3, 2), Locality.ANY)
    assert plan is not None and len(plan.placements) == 3
    assert_same(state, before)  # nothing held until the caller commits


def test_a_gang_without_locality_keeps_to_one_gpu_model(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("t4"), nodes.dgx("dgx")])
    engine = PlacementEngine(state, "bestfit")
    plan = gang.plan_gang(engine, workers(4, 2), Locality.ANY)
    assert plan is not None and plan.nodes == {"dgx"}
    small = gang.plan_gang(engine, workers(2, 1), Locality.ANY)
    assert small is not None and len({p.node for p in small.placements}) == 1
    # 12 GPUs fit only across both models: refused rather than split across them.
    assert gang.plan_gang(engine, workers(6, 2), Locality.ANY) is None
    # Members that name both models themselves may span them.
    both = tuple(sorted({s.gpu_model for s in state.nodes}))
    spread = gang.plan_gang(engine, workers(6, 2, gpu_models=both), Locality.ANY)
    assert spread is not None and spread.nodes == {"t4", "dgx"}
