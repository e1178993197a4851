"""ClusterState: all-or-nothing allocation, release, TTL assumptions, generations, and the
acceptance property that no sequence of place/release/expire ever oversubscribes anything."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from node_factory import NodeFactory

from neuronetes import mig
from neuronetes.engine import POLICIES, PlacementEngine, WorkloadProfile
from neuronetes.inventory import ClusterState, OversubscriptionError, UnknownAllocationError
from neuronetes.model import GpuGrant, GpuHealth, Locality, PodRequest

pytestmark = pytest.mark.unit

ARRAYS = ("cpu_free", "mem_free", "gpu_milli_free", "gpu_mem_free", "gen")


def snapshot(state: ClusterState) -> dict[str, Any]:
    snap: dict[str, Any] = {name: getattr(state, name).copy() for name in ARRAYS}
    snap["allocations"] = dict(state.allocations)
    snap["by_node"] = [set(s) for s in state.by_node]
    snap["mig"] = dict(state.mig_layouts)
    return snap


def assert_same(state: ClusterState, snap: dict[str, Any]) -> None:
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(state, name), snap[name], err_msg=name)
    assert state.allocations == snap["allocations"]
    assert state.by_node == snap["by_node"]
    assert state.mig_layouts == snap["mig"]


def assert_sound(state: ClusterState) -> None:
    """Invariants plus the bounds: 0 <= free <= capacity for every counter."""
    state.check_invariants()
    assert (state.cpu_free >= 0).all() and (state.cpu_free <= state.cpu_cap).all()
    assert (state.mem_free >= 0).all() and (state.mem_free <= state.mem_cap).all()
    assert (state.gpu_milli_free >= 0).all() and (state.gpu_milli_free <= state.gpu_milli_cap).all()
    assert (state.gpu_mem_free >= 0).all() and (state.gpu_mem_free <= state.gpu_mem_cap).all()
    # MIG layouts hold exactly the instances the allocations granted.
    for (i, j), layout in state.mig_layouts.items():
        granted = sorted(
            (g.mig_start, g.mig_profile)
            for a in state.allocations.values()
            if a.node_index == i
            for g in a.grants
            if g.gpu_index == j and g.mig_profile is not None
        )
        placed = sorted((inst.start, inst.profile.name) for inst in layout)
        assert granted == placed, f"MIG layout of node {i} GPU {j} drifted"


@pytest.fixture
def cluster(nodes: NodeFactory) -> ClusterState:
    return ClusterState([nodes.dgx("dgx"), nodes.t4("t4"), nodes.mig("mig", n_gpus=2)])


# ---- allocate / release ------------------------------------------------------------------------
def test_fresh_state_is_all_free(cluster: ClusterState) -> None:
    assert cluster.max_gpus == 8
    np.testing.assert_array_equal(cluster.gpu_count, [8, 4, 2])
    assert cluster.total_gpu_milli() == 14_000
    assert cluster.allocated_gpu_milli() == 0
    # Padded slots of the narrower nodes do not exist and hold nothing.
    assert not cluster.gpu_exists[1, 4:].any() and cluster.gpu_milli_cap[1, 4:].sum() == 0
    assert_sound(cluster)


def test_allocate_release_round_trip_restores_arrays(cluster: ClusterState) -> None:
    before = snapshot(cluster)
    grants = [GpuGrant(0, 1000, 81920), GpuGrant(3, 250, 1000)]
    alloc = cluster.allocate("pod-a", 0, 4000, 16_000, grants)
    assert alloc.node_index == 0 and alloc.expires_at is None
    assert cluster.cpu_free[0] == 124_000 and cluster.mem_free[0] == 1_008_000
    assert cluster.gpu_milli_free[0, 0] == 0 and cluster.gpu_milli_free[0, 3] == 750
    assert cluster.gpu_mem_free[0, 3] == 81920 - 1000
    assert cluster.allocated_gpu_milli() == 1250
    assert cluster.by_node[0] == {"pod-a"}
    assert_sound(cluster)

    assert cluster.release("pod-a") == alloc
    after = snapshot(cluster)
    for name in ("cpu_free", "mem_free", "gpu_milli_free", "gpu_mem_free"):
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert cluster.allocations == {} and cluster.by_node[0] == set()
    assert_sound(cluster)


def test_without_gives_a_scratch_copy_and_leaves_the_state_alone(cluster: ClusterState) -> None:
    cluster.allocate("pod-a", 0, 4000, 16_000, [GpuGrant(0, 1000, 81920)])
    cluster.allocate("pod-b", 0, 1000, 1000, [GpuGrant(1, 500, 1000)])
    before = snapshot(cluster)
    gen = cluster.gen.copy()
    scratch = cluster.without("pod-a")
    assert scratch.cpu_free[0] == cluster.cpu_free[0] + 4000
    assert scratch.gpu_milli_free[0, 0] == 1000 and cluster.gpu_milli_free[0, 0] == 0
    assert set(scratch.allocations) == {"pod-b"} and scratch.by_node[0] == {"pod-b"}
    assert_same(cluster, before)
    np.testing.assert_array_equal(cluster.gen, gen)
    assert_sound(scratch)
    with pytest.raises(UnknownAllocationError):
        cluster.without("nobody")


def test_a_read_copy_does_not_see_later_changes(cluster: ClusterState) -> None:
    """The extender decides preemption on a copy outside its lock while filters go on."""
    cluster.allocate("pod-a", 0, 4000, 16_000, [GpuGrant(0, 1000, 81920)])
    copy = cluster.read_copy()
    before = snapshot(copy)
    cluster.allocate("pod-b", 0, 1000, 1000, [GpuGrant(1, 500, 1000)])
    cluster.release("pod-a")
    assert_same(copy, before)
    assert set(copy.allocations) == {"pod-a"} and copy.by_node[0] == {"pod-a"}
    assert_sound(copy)


@pytest.mark.parametrize(
    ("cpu", "mem", "grants", "message"),
    [
        (128_001, 0, [], "insufficient cpu"),
        (0, 1_024_001, [], "insufficient memory"),
        (0, 0, [GpuGrant(2, 1001, 0)], "insufficient GPU compute"),
        (0, 0, [GpuGrant(2, 100, 81921)], "insufficient GPU memory"),
        (0, 0, [GpuGrant(8, 100, 0)], "has no GPU 8"),
        (0, 0, [GpuGrant(-1, 100, 0)], "has no GPU -1"),
        (-1, 0, [], "negative"),
        (0, 0, [GpuGrant(1, -5, 0)], "negative GPU grant"),
        # all-or-nothing: the first grant fits, the second does not; neither is applied.
        (1000, 1000, [GpuGrant(0, 1000, 0), GpuGrant(1, 1000, 90_000)], "insufficient GPU memory"),
        (1000, 1000, [GpuGrant(0, 500, 0), GpuGrant(0, 500, 0)], "granted twice"),
    ],
)
def test_allocate_beyond_capacity_raises_and_changes_nothing(
    cluster: ClusterState, cpu: int, mem: int, grants: list[GpuGrant], message: str
) -> None:
    cluster.allocate("existing", 0, 1000, 1000, [GpuGrant(5, 300, 300)])
    before = snapshot(cluster)
    with pytest.raises(OversubscriptionError, match=message):
        cluster.allocate("new", 0, cpu, mem, grants)
    assert_same(cluster, before)
    assert_sound(cluster)


def test_allocate_beyond_what_is_left_after_earlier_allocations(cluster: ClusterState) -> None:
    cluster.allocate("a", 1, 60_000, 0, [GpuGrant(0, 700, 10_000)])
    before = snapshot(cluster)
    for cpu, grant in [(4_001, GpuGrant(1, 10, 0)), (0, GpuGrant(0, 301, 0)), (0, GpuGrant(0, 1, 5110))]:
        with pytest.raises(OversubscriptionError):
            cluster.allocate("b", 1, cpu, 0, [grant])
        assert_same(cluster, before)
    # Exactly what is left fits.
    cluster.allocate("b", 1, 4_000, 0, [GpuGrant(0, 300, 5109)])
    assert cluster.cpu_free[1] == 0 and cluster.gpu_milli_free[1, 0] == 0 and cluster.gpu_mem_free[1, 0] == 0
    assert_sound(cluster)


def test_bad_node_index_raises(cluster: ClusterState) -> None:
    for i in (-1, 3):
        with pytest.raises(OversubscriptionError, match="out of range"):
            cluster.allocate("x", i, 0, 0, [])
    assert cluster.allocations == {}


def test_duplicate_allocation_id_raises(cluster: ClusterState) -> None:
    cluster.allocate("dup", 0, 1000, 0, [])
    before = snapshot(cluster)
    with pytest.raises(OversubscriptionError, match="already exists"):
        cluster.allocate("dup", 1, 1000, 0, [])
    assert_same(cluster, before)


def test_double_release_raises_unknown_allocation(cluster: ClusterState) -> None:
    cluster.allocate("a", 0, 1000, 0, [GpuGrant(0, 1000, 0)])
    cluster.release("a")
    before = snapshot(cluster)
    with pytest.raises(UnknownAllocationError):
        cluster.release("a")
    with pytest.raises(UnknownAllocationError):
        cluster.release("never-existed")
    with pytest.raises(UnknownAllocationError):
        cluster.confirm("a")
    assert_same(cluster, before)
    assert_sound(cluster)


def test_cannot_give_a_non_mig_grant_on_a_mig_gpu_or_a_mig_grant_on_a_plain_gpu(
    cluster: ClusterState,
) -> None:
    before = snapshot(cluster)
    with pytest.raises(OversubscriptionError, match="MIG-partitioned"):
        cluster.allocate("a", 2, 0, 0, [GpuGrant(0, 100, 0)])
    with pytest.raises(OversubscriptionError, match="not in MIG mode"):
        cluster.allocate("b", 0, 0, 0, [GpuGrant(0, 0, 0, "1g.10gb", 0)])
    assert_same(cluster, before)


def test_mig_allocation_round_trip_and_slot_conflicts(cluster: ClusterState) -> None:
    empty = cluster.mig_layouts[(2, 1)]
    cluster.allocate("big", 2, 1000, 0, [GpuGrant(1, 0, 0, "4g.20gb", 0)])
    assert cluster.mig_layouts[(2, 1)].counts() == {"4g.20gb": 1}
    before = snapshot(cluster)
    # Slot 0 is taken, 7g needs the whole GPU: both rejected, nothing changes.
    for grant in (GpuGrant(1, 0, 0, "1g.5gb", 0), GpuGrant(1, 0, 0, "7g.40gb", 0)):
        with pytest.raises(OversubscriptionError):
            cluster.allocate("small", 2, 0, 0, [grant])
        assert_same(cluster, before)
    cluster.allocate("small", 2, 0, 0, [GpuGrant(1, 0, 0, "1g.5gb", 4)])
    assert_sound(cluster)
    cluster.release("big")
    cluster.release("small")
    assert cluster.mig_layouts[(2, 1)] == empty
    assert_sound(cluster)


def test_mig_grant_without_start_slot_can_be_released(cluster: ClusterState) -> None:
    """`allocate` places a MIG grant without `mig_start` at its first fitting slot; the
    allocation must remember that slot, or `release` cannot remove the instance."""
    alloc = cluster.allocate("a", 2, 1000, 0, [GpuGrant(0, 0, 0, "1g.5gb", None)])
    assert alloc.grants[0].mig_start == 0
    cluster.allocate("b", 2, 0, 0, [GpuGrant(0, 0, 0, "1g.5gb", None)])
    assert cluster.allocations["b"].grants[0].mig_start == 1
    assert_sound(cluster)
    cluster.release("a")
    cluster.release("b")
    assert len(cluster.mig_layouts[(2, 0)]) == 0
    assert cluster.cpu_free[2] == cluster.cpu_cap[2]
    assert_sound(cluster)


def test_unknown_mig_profile_is_an_oversubscription_error(cluster: ClusterState) -> None:
    before = snapshot(cluster)
    with pytest.raises(OversubscriptionError):
        cluster.allocate("a", 2, 0, 0, [GpuGrant(0, 0, 0, "9g.99gb", 0)])
    assert_same(cluster, before)


# ---- TTL assumptions -------------------------------------------------------------------------
def test_assumed_allocation_expires_and_confirmed_one_stays(cluster: ClusterState) -> None:
    now = 1_000.0
    cluster.allocate("assumed", 0, 1000, 0, [GpuGrant(0, 1000, 0)], expires_at=now + 30)
    cluster.allocate("confirmed", 0, 1000, 0, [GpuGrant(1, 1000, 0)], expires_at=now + 30)
    cluster.allocate("committed", 0, 1000, 0, [GpuGrant(2, 1000, 0)])
    confirmed = cluster.confirm("confirmed")
    assert confirmed.expires_at is None
    assert cluster.confirm("committed").expires_at is None  # confirming a committed one is a no-op

    assert cluster.expire(now + 29.9) == []
    assert set(cluster.allocations) == {"assumed", "confirmed", "committed"}
    expired = cluster.expire(now + 30)  # a deadline equal to now has passed
    assert [a.id for a in expired] == ["assumed"]
    assert set(cluster.allocations) == {"confirmed", "committed"}
    assert cluster.gpu_milli_free[0, 0] == 1000 and cluster.gpu_milli_free[0, 1] == 0
    assert cluster.expire(now + 10_000) == []
    assert_sound(cluster)


def test_engine_commit_with_ttl_uses_the_monotonic_clock(nodes: NodeFactory) -> None:
    state = ClusterState([nodes.t4("t4")])
    engine = PlacementEngine(state, "bestfit")
    placement = engine.place(PodRequest("p", cpu_milli=1000, gpus=1))
    assert placement is not None
    t0 = time.monotonic()
    alloc = engine.commit(placement, "p", ttl=60.0)
    assert alloc.expires_at is not None and t0 + 59 <= alloc.expires_at <= time.monotonic() + 60
    assert state.expire() == []  # not yet
    assert [a.id for a in state.expire(alloc.expires_at + 0.001)] == ["p"]
    assert state.allocated_gpu_milli() == 0


# ---- generations and health --------------------------------------------------------------------
def test_generation_changes_only_for_the_touched_node(cluster: ClusterState) -> None:
    def step(action: Callable[[], object], node: int) -> None:
        before = cluster.gen.copy()
        action()
        changed = np.nonzero(cluster.gen != before)[0].tolist()
        assert changed == [node]
        assert cluster.gen[node] > before.max()

    step(lambda: cluster.allocate("a", 1, 1000, 0, [GpuGrant(0, 500, 0)]), 1)
    step(lambda: cluster.allocate("b", 0, 1000, 0, []), 0)
    step(lambda: cluster.release("a"), 1)
    step(lambda: cluster.set_gpu_health(2, 1, GpuHealth.DEGRADED), 2)
    step(lambda: cluster.set_node_schedulable(0, False), 0)
    cluster.allocate("c", 1, 0, 0, [], expires_at=5.0)
    step(lambda: cluster.expire(6.0), 1)

    # Failures, confirm and read-only views never touch generations.
    before = cluster.gen.copy()
    with pytest.raises(OversubscriptionError):
        cluster.allocate("d", 1, 10**9, 0, [])
    cluster.allocate("e", 1, 0, 0, [], expires_at=100.0)
    before = cluster.gen.copy()
    cluster.confirm("e")
    cluster.usable_gpus()
    cluster.fully_free()
    assert cluster.expire(50.0) == []
    np.testing.assert_array_equal(cluster.gen, before)


@pytest.mark.parametrize(
    ("health", "usable"),
    [(h, h.schedulable) for h in GpuHealth],
)
def test_gpu_health_controls_usable_gpus(nodes: NodeFactory, health: GpuHealth, usable: bool) -> None:
    state = ClusterState([nodes.t4("t4")])
    state.set_gpu_health(0, 2, health)
    assert state.usable_gpus()[0, :4].tolist() == [True, True, usable, True]
    assert state.fully_free()[0, 2] == usable
    assert state.gpu_health[0][2] is health
    state.set_gpu_health(0, 2, GpuHealth.AVAILABLE)
    assert state.usable_gpus()[0].all()


def test_offline_gpu_from_spec_and_unschedulable_node(nodes: NodeFactory) -> None:
    state = ClusterState(
        [nodes.t4("a", health={1: GpuHealth.OFFLINE}), nodes.t4("b", schedulable=False), nodes.mig("m")]
    )
    usable = state.usable_gpus()
    assert usable[0].tolist() == [True, False, True, True]
    assert not usable[1].any()  # an unschedulable node offers no GPU
    assert not usable[2].any()  # MIG GPUs never take a plain grant
    rows = np.array([1, 0])
    np.testing.assert_array_equal(state.usable_gpus(rows), usable[rows])
    np.testing.assert_array_equal(state.fully_free(rows), state.fully_free()[rows])
    state.set_node_schedulable(1, True)
    assert state.usable_gpus()[1].all()


def test_node_names_must_be_unique_and_fit_the_gpu_width(nodes: NodeFactory) -> None:
    with pytest.raises(ValueError, match="unique"):
        ClusterState([nodes.t4("a"), nodes.t4("a")])
    with pytest.raises(ValueError, match="more than"):
        ClusterState([nodes.dgx("a")], max_gpus_per_node=4)
    empty = ClusterState([nodes.cpu("c")])
    assert empty.max_gpus == 1 and not empty.gpu_exists.any() and empty.total_gpu_milli() == 0


def test_check_invariants_detects_drift(cluster: ClusterState) -> None:
    cluster.allocate("a", 0, 1000, 0, [GpuGrant(0, 500, 0)])
    cluster.gpu_milli_free[0, 0] += 1
    with pytest.raises(AssertionError, match="drift"):
        cluster.check_invariants()


# ---- property: direct random allocations are all-or-nothing ----------------------------------------
grant_st = st.builds(
    GpuGrant,
    gpu_index=st.integers(-1, 8),
    milli=st.integers(-10, 1100),
    memory_mib=st.sampled_from([0, 0, 1000, 15109, 16_000, 40_000, 81920, 90_000]),
)
mig_grant_st = st.builds(
    GpuGrant,
    gpu_index=st.integers(0, 1),
    milli=st.just(0),
    memory_mib=st.just(0),
    mig_profile=st.sampled_from(mig.catalog_for("A100-40GB").names),
    mig_start=st.one_of(st.none(), st.integers(0, 7)),
)
alloc_st = st.tuples(
    st.integers(0, 2),
    st.integers(0, 70_000),
    st.integers(0, 300_000),
    st.lists(grant_st, max_size=4),
)
mig_alloc_st = st.tuples(
    st.just(2), st.integers(0, 70_000), st.integers(0, 300_000), st.lists(mig_grant_st, max_size=2)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.one_of(alloc_st, mig_alloc_st), st.booleans()), min_size=1, max_size=25))
def test_random_direct_allocations_are_all_or_nothing(
    nodes: NodeFactory, steps: list[tuple[tuple[int, int, int, list[GpuGrant]], bool]]
) -> None:
    state = ClusterState([nodes.dgx("dgx"), nodes.t4("t4"), nodes.mig("mig", n_gpus=2)])
    for k, ((node, cpu, mem, grants), release_one) in enumerate(steps):
        before = snapshot(state)
        try:
            state.allocate(f"a{k}", node, cpu, mem, grants)
        except OversubscriptionError:
            assert_same(state, before)
        assert_sound(state)
        if release_one and state.allocations:
            state.release(sorted(state.allocations)[0])
            assert_sound(state)
    for alloc_id in list(state.allocations):
        state.release(alloc_id)
    assert_sound(state)
    np.testing.assert_array_equal(state.gpu_milli_free, state.gpu_milli_cap)
    np.testing.assert_array_equal(state.cpu_free, state.cpu_cap)
    assert all(len(layout) == 0 for layout in state.mig_layouts.values())


# ---- acceptance: no sequence of place/release/expire oversubscribes a GPU -------------------------
MIG_PROFILES = mig.catalog_for("A100-40GB").names

request_st = st.one_of(
    st.builds(
        PodRequest,
        cpu_milli=st.one_of(st.integers(0, 16_000), st.integers(0, 70_000)),
        memory_mib=st.one_of(st.integers(0, 32_000), st.integers(0, 300_000)),
        gpus=st.one_of(st.integers(0, 2), st.integers(0, 8)),
        gpu_milli=st.one_of(st.just(1000), st.integers(1, 1000)),
        gpu_memory_mib=st.one_of(st.just(0), st.integers(0, 16_000), st.integers(0, 90_000)),
        locality=st.sampled_from(list(Locality)),
        min_bandwidth_gbps=st.sampled_from([0.0, 0.0, 300.0, 700.0]),
    ),
    st.builds(
        PodRequest,
        cpu_milli=st.integers(0, 8000),
        gpus=st.just(1),
        mig_profile=st.sampled_from(MIG_PROFILES),
    ),
)


def test_no_sequence_of_place_release_expire_oversubscribes(nodes: NodeFactory) -> None:
    cluster_nodes = [
        nodes.dgx("dgx2", groups=2),
        nodes.dgx("dgx1", groups=1, cpu_milli=32_000),
        nodes.t4("t4"),
        nodes.t4("t4-small", n_gpus=2, cpu_milli=8_000, memory_mib=32_000),
        nodes.mig("mig", n_gpus=2),
        nodes.cpu("cpu"),
    ]
    profile = WorkloadProfile.from_requests(
        [PodRequest(cpu_milli=4000, gpus=1, gpu_milli=500)] * 3
        + [PodRequest(cpu_milli=8000, gpus=2)] * 2
        + [PodRequest(cpu_milli=2000)]
    )

    class PlaceReleaseMachine(RuleBasedStateMachine):
        allocs = Bundle("allocs")

        def __init__(self) -> None:
            super().__init__()
            self.state = ClusterState(cluster_nodes)
            self.engine = PlacementEngine(self.state, "default", profile=profile)
            self.n = 0
            self.clock = 0.0  # offset added to the monotonic clock for expiry

        @initialize(policy=st.sampled_from(sorted(POLICIES)))
        def choose_policy(self, policy: str) -> None:
            self.engine = PlacementEngine(self.state, policy, profile=profile)

        @rule(target=allocs, req=request_st, ttl=st.one_of(st.none(), st.sampled_from([1.0, 100.0])))
        def place(self, req: PodRequest, ttl: float | None) -> str | MultipleResults[str]:
            placement = self.engine.place(req)
            if placement is None:
                return multiple()
            self.n += 1
            alloc_id = f"p{self.n}"
            # The engine never proposes what the inventory would refuse.
            self.engine.commit(placement, alloc_id, ttl=ttl)
            assert len(placement.grants) == req.gpus
            assert len(set(placement.gpu_indices)) == req.gpus
            return alloc_id

        @rule(alloc_id=consumes(allocs))
        def release(self, alloc_id: str) -> None:
            if alloc_id not in self.state.allocations:
                return  # already expired
            self.engine.release(alloc_id)
            with pytest.raises(UnknownAllocationError):
                self.engine.release(alloc_id)

        @rule(advance=st.sampled_from([0.0, 2.0, 1000.0]))
        def expire(self, advance: float) -> None:
            self.clock += advance
            before = set(self.state.allocations)
            gone = self.state.expire(time.monotonic() + self.clock)
            assert all(a.expires_at is not None for a in gone)
            assert set(self.state.allocations) == before - {a.id for a in gone}

        @rule(alloc_id=allocs)
        def confirm(self, alloc_id: str) -> None:
            if alloc_id in self.state.allocations:
                assert self.state.confirm(alloc_id).expires_at is None

        @rule(
            node=st.integers(0, len(cluster_nodes) - 1),
            gpu=st.integers(0, 7),
            health=st.sampled_from(list(GpuHealth)),
        )
        def set_health(self, node: int, gpu: int, health: GpuHealth) -> None:
            if gpu < self.state.gpu_count[node]:
                self.state.set_gpu_health(node, gpu, health)

        @invariant()
        def never_oversubscribed(self) -> None:
            assert_sound(self.state)

        def teardown(self) -> None:
            for alloc_id in list(self.state.allocations):
                self.state.release(alloc_id)
            assert_sound(self.state)
            np.testing.assert_array_equal(self.state.gpu_milli_free, self.state.gpu_milli_cap)
            np.testing.assert_array_equal(self.state.gpu_mem_free, self.state.gpu_mem_cap)

    run_state_machine_as_test(
        PlaceReleaseMachine,
        settings=settings(
            max_examples=50,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
