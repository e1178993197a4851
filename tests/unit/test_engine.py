"""PlacementEngine: decisions, the per-shape score cache, GPU selection, prioritize, policies."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from node_factory import NodeFactory

from neuronetes.engine import (
    POLICIES,
    PlacementEngine,
    Policy,
    Separation,
    Unschedulable,
    WorkloadProfile,
    get_policy,
    scale_scores,
    separate,
)
from neuronetes.engine.core import Selection
from neuronetes.engine.select import select_bestfit, select_first, select_random, select_topology
from neuronetes.inventory import ClusterState, OversubscriptionError
from neuronetes.model import GpuGrant, GpuHealth, Locality, NodeSpec, PodRequest

pytestmark = pytest.mark.unit


def selected(result: Selection | Unschedulable) -> Selection:
    """The GPUs `select_gpus` chose and why, where it found some."""
    assert not isinstance(result, Unschedulable), result.reason
    return result


def hold(state: ClusterState, node: str, gpus: dict[int, int], cpu: int = 0) -> str:
    alloc_id = f"hold-{node}-{len(state.allocations)}"
    state.allocate(alloc_id, state.index[node], cpu, 0, [GpuGrant(j, m, 0) for j, m in gpus.items()])
    return alloc_id


def mixed_cluster(nodes: NodeFactory) -> list[NodeSpec]:
    return [
        nodes.dgx("dgx-a", groups=2, price_per_hour=30.0, zone="z1", cached_models=frozenset({"llama"})),
        nodes.dgx("dgx-b", groups=1, cpu_milli=64_000, price_per_hour=25.0, zone="z2"),
        nodes.t4("t4-a", zone="z1", price_per_hour=2.0),
        nodes.t4("t4-b", cpu_milli=16_000, zone="z2", price_per_hour=2.0),
        nodes.t4("t4-c", n_gpus=2, cpu_milli=24_000, price_per_hour=1.0, spot=True),
        nodes.mig("mig", n_gpus=2),
        nodes.cpu("cpu"),
    ]


def random_request(rng: random.Random, k: int) -> PodRequest:
    kind = rng.random()
    if kind < 0.15:
        return PodRequest(f"c{k}", cpu_milli=rng.choice([1000, 2000, 8000]), memory_mib=rng.choice([0, 4096]))
    if kind < 0.5:
        return PodRequest(
            f"s{k}",
            cpu_milli=rng.choice([1000, 4000]),
            gpus=1,
            gpu_milli=rng.choice([100, 250, 300, 500, 700]),
            gpu_memory_mib=rng.choice([0, 0, 2000]),
        )
    if kind < 0.6:
        return PodRequest(
            f"m{k}", cpu_milli=1000, gpus=1, mig_profile=rng.choice(["1g.5gb", "2g.10gb", "3g.20gb"])
        )
    if kind < 0.7:
        return PodRequest(f"ms{k}", cpu_milli=2000, gpus=2, gpu_milli=rng.choice([300, 500]))
    return PodRequest(
        f"w{k}",
        cpu_milli=rng.choice([2000, 8000, 16_000]),
        gpus=rng.choice([1, 1, 2, 4, 8]),
        gpu_models=rng.choice([(), (), ("A100",), ("T4",)]),
        locality=rng.choice([Locality.ANY, Locality.NVLINK, Locality.SAME_SOCKET]),
        model_name=rng.choice([None, "llama"]),
        preferred_zones=rng.choice([(), ("z1",)]),
    )


# ---- basic decisions -------------------------------------------------------------------------------
def test_place_returns_none_when_nothing_fits(nodes: NodeFactory) -> None:
    engine = PlacementEngine(ClusterState([nodes.t4("t4"), nodes.cpu("cpu")]))
    assert engine.place(PodRequest("p", gpus=5)) is None
    assert engine.place(PodRequest("p", cpu_milli=65_000)) is None
    assert engine.place(PodRequest("p", gpus=1, gpu_models=("A100",))) is None
    assert engine.state.allocations == {}  # deciding holds nothing
    empty = PlacementEngine(ClusterState([]))
    assert empty.place(PodRequest("p")) is None


def test_commit_consumes_capacity_until_an_exclusive_request_no_longer_fits(nodes: NodeFactory) -> None:
    engine = PlacementEngine(ClusterState([nodes.t4("t4")]))
    req = PodRequest("p", cpu_milli=1000, gpus=2)
    seen: set[int] = set()
    for k in range(2):
        placement = engine.place(req)
        assert placement is not None
        assert placement.node == "t4" and len(placement.grants) == 2
        assert all(g.milli == 1000 and g.memory_mib == 15109 for g in placement.grants)
        assert not seen & set(placement.gpu_indices)
        seen |= set(placement.gpu_indices)
        engine.commit(placement, f"p{k}")
    assert seen == {0, 1, 2, 3}
    assert engine.place(req) is None
    assert engine.reasons(req) == {"t4": "insufficient free gpus"}
    assert engine.place(PodRequest("cpu", cpu_milli=1000)) is not None  # CPU is still there
    freed = {g.gpu_index for g in engine.release("p0").grants}
    again = engine.place(req)
    assert again is not None and set(again.gpu_indices) == freed


def test_placement_carries_score_and_reason(nodes: NodeFactory) -> None:
    engine = PlacementEngine(ClusterState([nodes.t4("t4")]), "bestfit")
    cpu_only = engine.place(PodRequest("p", cpu_milli=100))
    assert cpu_only is not None and cpu_only.grants == () and cpu_only.reason == "no gpus requested"
    share = engine.place(PodRequest("p", gpus=1, gpu_milli=250, gpu_memory_mib=1000))
    assert share is not None
    assert share.grants == (GpuGrant(share.gpu_indices[0], 250, 1000),)
    assert share.score == pytest.approx(engine.evaluate(share.request).node_scores.max())


# ---- the score cache --------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["default", "fgd", "bestfit", "packing", "clustering", "dotprod"])
def test_cached_decisions_equal_a_fresh_engines(nodes: NodeFactory, policy: str) -> None:
    rng = random.Random(f"cache-{policy}")
    state = ClusterState(mixed_cluster(nodes))
    profile = WorkloadProfile.from_requests(random_request(random.Random(1), k) for k in range(200))
    cached = PlacementEngine(state, policy, profile=profile)
    live: list[str] = []
    decisions = 0
    for k in range(150):
        if live and rng.random() < 0.3:
            cached.release(live.pop(rng.randrange(len(live))))
            continue
        req = random_request(rng, k)
        fresh = PlacementEngine(state, policy, profile=profile)
        a, b = cached.place(req), fresh.place(req)
        if a is None or b is None:
            assert a is b, (k, req, a, b)
            continue
        assert (a.node_index, a.grants, a.reason) == (b.node_index, b.grants, b.reason), (k, req)
        assert a.score == pytest.approx(b.score, abs=1e-12)
        np.testing.assert_array_equal(cached.evaluate(req).reasons, fresh.evaluate(req).reasons)
        cached.commit(a, req.name)
        live.append(req.name)
        decisions += 1
    assert decisions > 40
    state.check_invariants()


def test_pods_pinned_to_different_models_share_one_cache_entry(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("t4"), nodes.dgx("a100"), nodes.t4("t4-off"), nodes.cpu("cpu")])
    state.set_node_schedulable(state.index["t4-off"], False)
    engine = PlacementEngine(state, "default")
    pinned = [PodRequest("any", gpus=1), PodRequest("t", gpus=1, gpu_models=("T4",))]
    pinned.append(PodRequest("a", gpus=1, gpu_models=("A100",)))
    where = [engine.place(r) for r in pinned]
    assert len(engine._cache) == 1
    assert [p.node if p else None for p in where] == ["t4", "t4", "a100"]
    # The first filter to reject still names the node: unschedulable before a model mismatch.
    assert engine.reasons(pinned[2]) == {
        "t4": "gpu model mismatch",
        "t4-off": "node unschedulable",
        "cpu": "gpu model mismatch",
    }
    assert engine.reasons(pinned[0]) == {
        "t4-off": "node unschedulable",
        "cpu": "node has fewer gpus than requested",
    }


def test_cache_notices_health_and_schedulability_changes(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("a"), nodes.t4("b")])
    engine = PlacementEngine(state, "bestfit")
    req = PodRequest("p", gpus=4)
    assert engine.reasons(req) == {}
    state.set_node_schedulable(0, False)
    assert engine.reasons(req) == {"a": "node unschedulable"}
    state.set_gpu_health(1, 0, GpuHealth.RESETTING)
    assert engine.reasons(req) == {"a": "node unschedulable", "b": "gpu offline"}
    assert engine.place(req) is None


def test_set_profile_drops_cached_scores(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("n", n_gpus=2)])
    hold(state, "n", {1: 300})
    engine = PlacementEngine(state, "fgd")
    req = PodRequest("p", gpus=1, gpu_milli=500)
    # No profile: fragmentation is zero everywhere, both GPUs score the same.
    flat = engine.evaluate(req).gpu_scores
    assert flat is not None and flat[0, 0] == flat[0, 1]
    engine.set_profile(WorkloadProfile.from_requests([PodRequest(gpus=1, gpu_milli=500)]))
    shaped = engine.evaluate(req).gpu_scores
    assert shaped is not None and shaped[0, 0] > shaped[0, 1]


# ---- GPU selection ------------------------------------------------------------------------------------
def test_exclusive_four_gpus_go_to_the_free_nvlink_group(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    hold(state, "dgx", {1: 1000})
    engine = PlacementEngine(state, "default")
    placement = engine.place(PodRequest("p", gpus=4))
    assert placement is not None
    assert placement.gpu_indices == (4, 5, 6, 7)
    assert "nvlink" in placement.reason
    grants, why = selected(engine.select_gpus(PodRequest("p", gpus=4), 0))
    assert [g.gpu_index for g in grants] == [4, 5, 6, 7] and "nvlink" in why


def test_two_gpus_come_from_the_tightest_nvlink_group(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    hold(state, "dgx", {1: 1000})  # group 0: 3 free, group 1: 4 free
    engine = PlacementEngine(state, "default")
    grants, why = selected(engine.select_gpus(PodRequest("p", gpus=2), 0))
    assert [g.gpu_index for g in grants] == [0, 2]
    assert why == "one nvlink group (nvlink group 0)"
    one, why1 = selected(engine.select_gpus(PodRequest("p", gpus=1), 0))
    assert [g.gpu_index for g in one] == [0] and "tightest" in why1
    # When no group (NVLink, NUMA or socket) holds them all, the GPUs are spread.
    hold(state, "dgx", {0: 1000, 4: 1000, 5: 1000})  # free: 2, 3, 6, 7
    spread, why3 = selected(engine.select_gpus(PodRequest("p", gpus=3), 0))
    assert [g.gpu_index for g in spread] == [2, 3, 6] and "spread" in why3


def test_select_topology_falls_back_to_numa_then_socket(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("t4", n_gpus=4)])  # no NVLink; NUMA/socket 0: {0,1}, 1: {2,3}
    free = np.array([True, False, True, True])
    idx, why = select_topology(state, 0, free, 2)
    assert idx == [2, 3] and why == "one numa node (numa node 1)"
    idx, why = select_topology(state, 0, free, 3)
    assert idx == [0, 2, 3] and why.startswith("spread")


def test_plain_selectors() -> None:
    free = np.array([False, True, True, False, True])
    left = np.array([1000, 700, 300, 0, 500])
    assert select_first(free, 2) == ([1, 2], "lowest-index free gpus")
    assert select_bestfit(free, left, 2) == ([2, 4], "tightest-fitting gpus")
    picked, _ = select_random(free, 2, np.random.default_rng(0))
    assert len(picked) == 2 and set(picked) <= {1, 2, 4} and picked == sorted(picked)


def test_shared_multi_gpu_request_takes_the_tightest_gpus(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("t4")])
    hold(state, "t4", {0: 200, 1: 600, 2: 500})  # free 800, 400, 500, 1000
    engine = PlacementEngine(state, "bestfit")
    placement = engine.place(PodRequest("p", gpus=2, gpu_milli=400))
    assert placement is not None and placement.gpu_indices == (1, 2)
    assert all(g.milli == 400 for g in placement.grants)


def test_one_gpu_share_takes_the_gpu_with_the_best_score(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("n", n_gpus=2)])
    hold(state, "n", {1: 300})
    engine = PlacementEngine(
        state, "fgd", profile=WorkloadProfile.from_requests([PodRequest(gpus=1, gpu_milli=500)])
    )
    placement = engine.place(PodRequest("p", gpus=1, gpu_milli=500))
    assert (
        placement is not None
        and placement.gpu_indices == (0,)
        and placement.reason == "gpu with the best score"
    )


def test_a_mig_request_gets_only_an_idle_instance_the_gpu_has_when_its_agent_reported_them(
    nodes: NodeFactory,
) -> None:
    """A GPU whose instances the agent reported (GPUNode status): a MIG pod gets one of those, idle,
    at its own start slot, never a placement the catalog allows but the GPU does not have; a GPU
    without a report (no list) still places anywhere."""
    node = nodes.mig("mig", n_gpus=2)
    reported = (("1g.5gb", 2), ("1g.5gb", 3), ("2g.10gb", 0), ("3g.20gb", 4))
    node = replace(node, gpus=(replace(node.gpus[0], mig_instances=reported), node.gpus[1]))
    state = ClusterState([node])
    engine = PlacementEngine(state, "default")

    def grant(profile: str) -> tuple[int, int | None] | None:
        placement = engine.place(PodRequest(profile, cpu_milli=100, gpus=1, mig_profile=profile))
        if placement is None:
            return None
        engine.commit(placement, f"{profile}-{len(state.allocations)}")
        (g,) = placement.grants
        return g.gpu_index, g.mig_start

    assert grant("3g.20gb") == (0, 4)  # the GPU's one 3g.20gb; GPU 1 (no report) would offer slot 0
    assert grant("2g.10gb") == (0, 0)
    assert grant("1g.5gb") == (0, 2) and grant("1g.5gb") == (0, 3)
    # GPU 0 has no more idle instance of these: GPU 1 (placed on demand) takes the next ones.
    assert grant("3g.20gb") == (1, 0)
    assert grant("1g.10gb") == (1, 4)  # GPU 0 has no 1g.10gb at all
    state.check_invariants()
    # A grant naming an instance GPU 0 does not have is refused, and changes nothing.
    with pytest.raises(OversubscriptionError, match=r"no 1g\.10gb instance at slot 6"):
        state.allocate("bad", 0, 0, 0, [GpuGrant(0, 0, 0, "1g.10gb", 6)])
    state.check_invariants()


def test_mig_request_gets_a_grant_with_profile_and_slot(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("t4"), nodes.mig("mig", n_gpus=2)])
    engine = PlacementEngine(state, "default")
    req = PodRequest("m", cpu_milli=1000, gpus=1, mig_profile="3g.20gb")
    starts = []
    for k in range(4):  # two 3g.20gb per A100-40GB, two GPUs
        placement = engine.place(req)
        assert placement is not None, k
        assert placement.node == "mig"
        (grant,) = placement.grants
        assert grant.mig_profile == "3g.20gb" and grant.mig_start in (0, 4)
        assert grant.milli == 0 and grant.memory_mib == 0
        assert placement.reason == f"mig 3g.20gb on gpu {grant.gpu_index} slot {grant.mig_start}"
        starts.append((grant.gpu_index, grant.mig_start))
        engine.commit(placement, f"m{k}")
    assert sorted(starts) == [(0, 0), (0, 4), (1, 0), (1, 4)]
    assert engine.place(req) is None
    assert state.mig_layouts[(1, 1)].counts() == {"3g.20gb": 2}
    state.check_invariants()
    engine.release("m0")
    again = engine.place(req)
    assert again is not None and (again.grants[0].gpu_index, again.grants[0].mig_start) == starts[0]
    refused = engine.select_gpus(req, 0)  # the T4 node has no MIG GPU: a typed status, no exception
    assert isinstance(refused, Unschedulable) and "no MIG slot" in refused.reason


# ---- GPU selection honours locality and the policy's GPU selector (former bugs) ----------------------
@pytest.mark.parametrize("policy", ["bestfit", "fgd", "packing"])
def test_exclusive_gpu_selection_honours_nvlink_locality(nodes: NodeFactory, policy: str) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    hold(state, "dgx", {1: 1000})  # the filter passes (group 1 has 4 free), but GPUs 0,2,3,4 do not
    engine = PlacementEngine(state, policy)
    placement = engine.place(PodRequest("p", gpus=4, locality=Locality.NVLINK))
    assert placement is not None and placement.gpu_indices == (4, 5, 6, 7)


@pytest.mark.parametrize("policy", ["default", "fgd"])
def test_min_bandwidth_without_locality_keeps_gpus_in_one_nvlink_group(
    nodes: NodeFactory, policy: str
) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    hold(state, "dgx", {1: 1000})  # lowest-index free GPUs 0,2,3,4 would span both NVLink groups
    engine = PlacementEngine(state, policy)
    placement = engine.place(PodRequest("p", gpus=4, min_bandwidth_gbps=300))
    assert placement is not None and placement.gpu_indices == (4, 5, 6, 7)


@pytest.mark.parametrize("policy", ["default", "bestfit"])
def test_shared_gpu_selection_honours_nvlink_locality(nodes: NodeFactory, policy: str) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    hold(state, "dgx", {0: 500, 4: 500})  # GPUs 0 and 4 are the tightest fits, in different groups
    engine = PlacementEngine(state, policy)
    placement = engine.place(PodRequest("p", gpus=2, gpu_milli=500, locality=Locality.NVLINK))
    assert placement is not None
    groups = {int(state.gpu_nvlink_group[0, j]) for j in placement.gpu_indices}
    assert len(groups) == 1


@pytest.mark.parametrize("policy", ["bestfit", "packing", "clustering", "dotprod"])
def test_one_gpu_share_uses_the_policys_gpu_selector_between_equal_scores(
    nodes: NodeFactory, policy: str
) -> None:
    state = ClusterState([nodes.t4("t4")])
    hold(state, "t4", {2: 500})
    engine = PlacementEngine(state, policy)
    assert engine.policy.gpu_selector == "bestfit"
    placement = engine.place(PodRequest("p", gpus=1, gpu_milli=300))
    assert placement is not None and placement.gpu_indices == (2,)  # packing's score assumes GPU 2


def test_same_socket_request_stays_in_one_socket_even_when_an_nvlink_group_spans_both(
    nodes: NodeFactory,
) -> None:
    state = ClusterState([nodes.dgx("dgx", groups=1)])  # one NVLink group; sockets {0-3}, {4-7}
    hold(state, "dgx", {0: 1000})  # socket 0: 3 free, socket 1: 4 free
    engine = PlacementEngine(state, "default")
    placement = engine.place(PodRequest("p", gpus=4, locality=Locality.SAME_SOCKET))
    assert placement is not None and placement.gpu_indices == (4, 5, 6, 7)


def test_one_gpu_share_under_the_first_selector_keeps_the_lowest_index(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("t4")])
    hold(state, "t4", {2: 500})
    engine = PlacementEngine(state, "fgd")  # no profile: every GPU scores the same
    assert engine.policy.gpu_selector == "first"
    placement = engine.place(PodRequest("p", gpus=1, gpu_milli=300))
    assert placement is not None and placement.gpu_indices == (0,)
    assert placement.reason == "lowest-index gpu among 4 with the best score"


def test_one_gpu_share_under_the_random_selector_spreads_over_equal_gpus(nodes: NodeFactory) -> None:
    chosen: set[int] = set()
    for seed in range(20):
        state = ClusterState([nodes.t4("t4")])
        pol = Policy("bestfit-randomgpu", {"bestfit": 1.0}, "random")
        placement = PlacementEngine(state, pol, seed=seed).place(PodRequest("p", gpus=1, gpu_milli=300))
        assert placement is not None
        chosen.update(placement.gpu_indices)
    assert len(chosen) > 1


def test_select_gpus_refuses_when_the_allowed_gpus_cannot_hold_the_request(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("dgx")])
    engine = PlacementEngine(state, "bestfit")
    group0 = np.arange(8) < 4
    grants, _ = selected(engine.select_gpus(PodRequest("p", gpus=1, gpu_milli=300), 0, allowed_gpus=~group0))
    assert [g.gpu_index for g in grants] == [4]
    refused = engine.select_gpus(PodRequest("p", gpus=5), 0, allowed_gpus=group0)
    assert isinstance(refused, Unschedulable) and "cannot supply" in refused.reason
    # GPUs 3 and 4 hold two shares, but not inside one NVLink group.
    across = (np.arange(8) == 3) | (np.arange(8) == 4)
    share = PodRequest("p", gpus=2, gpu_milli=300)
    assert [g.gpu_index for g in selected(engine.select_gpus(share, 0, allowed_gpus=across))[0]] == [3, 4]
    refused = engine.select_gpus(replace(share, locality=Locality.NVLINK), 0, allowed_gpus=across)
    assert isinstance(refused, Unschedulable) and "cannot supply" in refused.reason


# ---- prioritize, tie breaks, policies ---------------------------------------------------------------
def test_prioritize_maps_scores_to_0_10(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("empty"), nodes.t4("half"), nodes.t4("full"), nodes.t4("most")])
    hold(state, "half", {0: 1000, 1: 1000})
    hold(state, "most", {0: 1000, 1: 1000, 2: 1000})
    hold(state, "full", {j: 1000 for j in range(4)})
    engine = PlacementEngine(state, "bestfit")
    req = PodRequest("p", gpus=1)
    out = engine.prioritize(req, [0, 1, 2, 3])
    assert all(isinstance(x, int) and 0 <= x <= 10 for x in out)
    assert out[3] == 10  # "most" is the best fit
    assert out[0] == 0  # the worst feasible node maps to 0 …
    assert out[2] == 0  # … and so does the infeasible one
    assert 0 < out[1] < 10
    assert engine.prioritize(req, [3, 1]) == [out[3], out[1]]
    # One feasible node (or all equal): every feasible node gets 10.
    assert engine.prioritize(PodRequest("p", gpus=4), [0, 1, 2, 3]) == [10, 0, 0, 0]
    assert engine.prioritize(PodRequest("p", gpus=5), [0, 1]) == [0, 0]


def test_tie_break_first_picks_the_lowest_index(nodes: NodeFactory) -> None:
    specs = [nodes.t4(f"n{k}") for k in range(5)]
    for policy in ("bestfit", "fgd", "default", "packing"):
        engine = PlacementEngine(ClusterState(specs), policy)
        assert engine.policy.tie_break == "first"
        placement = engine.place(PodRequest("p", gpus=1))
        assert placement is not None and placement.node_index == 0, policy
        # Ties among a subset: the lowest candidate index wins.
        placement = engine.place(PodRequest("p", gpus=1), candidates=[4, 2, 3])
        assert placement is not None and placement.node_index == 2, policy


def test_tie_break_random_spreads_over_equal_nodes(nodes: NodeFactory) -> None:
    specs = [nodes.t4(f"n{k}") for k in range(5)]
    pol = Policy("bestfit-random", {"bestfit": 1.0}, "bestfit", tie_break="random")
    chosen: set[int] = set()
    for seed in range(20):
        placement = PlacementEngine(ClusterState(specs), pol, seed=seed).place(PodRequest("p", gpus=1))
        assert placement is not None
        chosen.add(placement.node_index)
    assert len(chosen) > 1


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_places_a_small_trace_end_to_end(nodes: NodeFactory, policy: str) -> None:
    rng = random.Random(policy)
    state = ClusterState(mixed_cluster(nodes))
    trace = [random_request(rng, k) for k in range(80)]
    engine = PlacementEngine(state, policy, profile=WorkloadProfile.from_requests(trace), seed=3)
    placed = 0
    for req in trace:
        placement = engine.place(req)
        if placement is None:
            continue
        # The decision respects every filter: the chosen node is feasible for the request.
        assert placement.node not in engine.reasons(req)
        engine.commit(placement, req.name)
        placed += 1
        state.check_invariants()
    assert placed >= 20
    assert state.allocated_gpu_milli() > 0


def test_policy_validation_and_overrides() -> None:
    with pytest.raises(ValueError, match="unknown scorers"):
        Policy("bad", {"nope": 1.0})
    with pytest.raises(ValueError, match="non-negative"):
        Policy("bad", {"bestfit": -1.0})
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("nope")
    assert get_policy("fgd") is POLICIES["fgd"]
    merged = POLICIES["default"].with_weights({"cost": 0.5, "fgd": 0})
    assert merged.weights["cost"] == 0.5 and "fgd" not in merged.weights
    assert merged.gpu_selector == "topology"
    assert POLICIES["default"].weights["fgd"] == 100.0  # the original is untouched


def test_engine_weights_override(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("dear", price_per_hour=5.0), nodes.t4("cheap", price_per_hour=1.0)])
    engine = PlacementEngine(state, "bestfit", weights={"cost": 1.0})
    assert dict(engine.policy.weights) == {"bestfit": 1.0, "cost": 1.0}
    placement = engine.place(PodRequest("p", gpus=1))
    assert placement is not None and placement.node == "cheap"
    engine.set_weights({"cost": 0})
    assert dict(engine.policy.weights) == {"bestfit": 1.0}
    placement = engine.place(PodRequest("p", gpus=1))
    assert placement is not None and placement.node == "dear"  # tie: first node


# ---- explanations and the one normaliser (issue 9) ------------------------------------------------------
def test_explain_breaks_a_nodes_score_down_by_term(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("a"), nodes.t4("b")])
    engine = PlacementEngine(state, "default")
    req = PodRequest("p", gpus=2)
    terms = engine.explain(req, 0)
    assert set(terms) == set(engine.policy.weights)
    assert sum(terms.values()) == pytest.approx(float(engine.evaluate(req, [0]).node_scores[0]))
    assert engine.explain(PodRequest("big", gpus=8), 1) == {}  # infeasible: nothing to explain
    share = PodRequest("s", gpus=1, gpu_milli=300, gpu_memory_mib=1024)
    assert sum(engine.explain(share, 1).values()) == pytest.approx(
        float(engine.evaluate(share, [1]).node_scores[0])
    )


def test_separate_lists_only_the_terms_that_differ_from_the_runner_up() -> None:
    names = ("neutral", "topology", "cost", "packing")
    weighted = np.array(
        [
            [1.0, 0.875, 0.5, 0.0],  # chosen
            [1.0, 0.25, 0.25, 0.125],  # the runner-up: the best total of the others
            [1.0, 0.0, 0.125, 0.0],
        ]
    )
    found = separate(names, weighted, 0)
    assert found.runner_up == 1
    # Largest difference first; a term the chosen node lost on is negative; the term equal on
    # every candidate is not there.
    assert found.terms == (("topology", 0.625), ("cost", 0.25), ("packing", -0.125))
    assert found.margin == pytest.approx(0.75)
    assert separate(names, weighted[:1], 0) == Separation(None, 0.0, ())  # no other candidate
    assert separate(names, weighted[[0, 0]], 1) == Separation(0, 0.0, ())  # a tie: no term differs
    jitter = weighted[[0, 0]] + np.array([[0.0] * 4, [0.0, 1e-14, 0.0, 0.0]])
    assert separate(names, jitter, 0).terms == ()  # last-bit differences are equality


def without_nvlink(node: NodeSpec, name: str) -> NodeSpec:
    """`node` under another name, its GPUs on PCIe only (nothing else differs)."""
    gpus = tuple(
        replace(g, uuid=f"GPU-{name}-{g.index}", nvlink_group=-1, nvlink_bandwidth_gbps=0.0, nvlink_peers=())
        for g in node.gpus
    )
    return replace(node, name=name, gpus=gpus)


def test_two_nodes_that_differ_only_in_nvlink_are_separated_by_topology(nodes: NodeFactory) -> None:
    nvlink = nodes.dgx("nvlink", groups=1)
    state = ClusterState([without_nvlink(nvlink, "pcie"), nvlink, nodes.t4("small")])
    engine = PlacementEngine(state, "default")
    req = PodRequest("p", gpus=4)
    ev = engine.evaluate(req)
    placement = engine.place_evaluated(req, ev)
    assert placement is not None and placement.node == "nvlink"
    runner_up = ev.best_rows(1, exclude=placement.node_index)
    assert runner_up == [state.index["pcie"]]
    found = engine.separation(req, placement.node_index, runner_up)
    assert found is not None and found.runner_up == state.index["pcie"]
    [(term, value)] = found.terms  # every other term is equal on the two nodes
    assert term == "topology" and value > 0 and found.margin == pytest.approx(value)
    scores = dict(zip(ev.rows.tolist(), ev.node_scores.tolist(), strict=True))
    assert found.margin == pytest.approx(scores[placement.node_index] - scores[runner_up[0]])
    # A rival that no longer passes the filters leaves no runner-up; a chosen node that does not, nothing.
    full = hold(state, "pcie", dict.fromkeys(range(8), 1000))
    assert engine.separation(req, placement.node_index, runner_up) == Separation(None, 0.0, ())
    state.release(full)
    assert engine.separation(PodRequest("big", gpus=8), state.index["small"], runner_up) is None


def test_best_rows_are_the_best_scores_without_the_excluded_node(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("a"), nodes.dgx("b"), nodes.t4("c"), nodes.cpu("d")])
    engine = PlacementEngine(state, "default")
    ev = engine.evaluate(PodRequest("p", gpus=1))
    ranked = [int(ev.rows[k]) for k in np.argsort(-ev.node_scores, kind="stable")]
    assert ev.best_rows(3) == ranked and ev.best_rows(1) == ranked[:1]
    assert ev.best_rows(5, exclude=ranked[0]) == ranked[1:]
    assert ev.best_rows(0) == [] and state.index["d"] not in ev.best_rows(4)


def test_scale_scores_maps_to_0_10_and_zeroes_unknown_and_infeasible_rows(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.dgx("a"), nodes.t4("b"), nodes.cpu("c")])
    engine = PlacementEngine(state, "default")
    ev = engine.evaluate(PodRequest("p", gpus=1))
    out = scale_scores(ev, np.array([0, 1, 2, -1]))
    assert out.max() == 10 and out[2] == 0 and out[3] == 0
    assert engine.prioritize(PodRequest("p", gpus=1), [0, 1, 2]) == out[:3].tolist()


# ---- the candidate limit (fastScheduling.maxNodesToScore) -------------------------------------------
def test_the_candidate_limit_scores_successive_windows_of_feasible_nodes_deterministically(
    nodes: NodeFactory,
) -> None:
    specs = [nodes.t4(f"n{k:02d}") for k in range(10)]
    full = PlacementEngine(ClusterState(specs))
    req = PodRequest("p", gpus=1)
    everyone = full.evaluate(req)
    assert everyone.rows.tolist() == list(range(10))

    def windows(engine: PlacementEngine) -> list[list[int]]:
        return [engine.evaluate(replace(req, max_nodes_to_score=4)).rows.tolist() for _ in range(4)]

    limited = PlacementEngine(ClusterState(specs))
    seen = windows(limited)
    # kube-scheduler's rotation: each decision starts past the last node the previous one took.
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 8, 9], [2, 3, 4, 5]]
    assert windows(PlacementEngine(ClusterState(specs))) == seen  # deterministic
    # The nodes taken score what they score without the limit; every node's reason is kept.
    last = limited.evaluate(replace(req, max_nodes_to_score=4))
    np.testing.assert_array_equal(last.node_scores, everyone.node_scores[last.rows])
    assert last.reasons.size == 10
    # A limit at or above the feasible count changes nothing; infeasible nodes are never taken.
    assert limited.evaluate(replace(req, max_nodes_to_score=10)).rows.tolist() == list(range(10))
    for k in range(0, 10, 2):
        limited.state.allocate(f"busy{k}", k, 0, 0, [GpuGrant(j, 1000, 0) for j in range(4)])
    assert set(limited.evaluate(replace(req, max_nodes_to_score=3)).rows.tolist()) <= {1, 3, 5, 7, 9}


def test_an_unlimited_decision_after_a_limited_one_scores_every_node(nodes: NodeFactory) -> None:
    specs = [nodes.t4(f"n{k}") for k in range(6)]
    engine = PlacementEngine(ClusterState(specs))
    req = PodRequest("p", gpus=1)
    engine.evaluate(replace(req, max_nodes_to_score=2))  # filters refreshed, only 2 rows scored
    after = engine.evaluate(req)
    fresh = PlacementEngine(ClusterState(specs)).evaluate(req)
    np.testing.assert_array_equal(after.rows, fresh.rows)
    np.testing.assert_array_equal(after.node_scores, fresh.node_scores)
