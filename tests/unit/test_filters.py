"""Filters: every filter in FILTERS rejects exactly the node it should, with its own reason."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from node_factory import NodeFactory

from neuronetes.engine import PlacementEngine
from neuronetes.engine.core import FEASIBLE
from neuronetes.engine.filters import FILTERS, group_free_counts, model_matches
from neuronetes.inventory import ClusterState
from neuronetes.model import GpuGrant, GpuHealth, Locality, NodeSpec, PodRequest

pytestmark = pytest.mark.unit

REASON = {f.name: f.reason for f in FILTERS}


def engine_for(nodes: list[NodeSpec], policy: str = "bestfit") -> PlacementEngine:
    return PlacementEngine(ClusterState(nodes), policy)


def hold(engine: PlacementEngine, node: str, gpus: dict[int, tuple[int, int]], cpu: int = 0) -> None:
    """Allocate `milli, memory` on the given GPUs of `node`."""
    st = engine.state
    grants = [GpuGrant(j, milli, mem) for j, (milli, mem) in gpus.items()]
    st.allocate(f"hold-{node}-{len(st.allocations)}", st.index[node], cpu, 0, grants)


# Each scenario returns (engine, milder request, request, {node: filter name}): the request is
# rejected by exactly the named filters; the milder one (None where nothing can pass) fits every
# node, showing the rejection comes from the request and not from the node alone.
ScenarioCase = tuple[PlacementEngine, PodRequest | None, PodRequest, dict[str, str]]
Scenario = Callable[[NodeFactory], ScenarioCase]
SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = fn
        return fn

    return register


@scenario("NodeSchedulable")
def _schedulable(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for(
        [nodes.t4("up"), nodes.t4("cordoned", schedulable=False, cpu_milli=500), nodes.t4("drained")]
    )
    e.state.set_node_schedulable(2, False)
    # Nothing fits an unschedulable node, and its reason wins over later ones (the cordoned
    # node also lacks the CPU asked).
    return (
        e,
        None,
        PodRequest("p", cpu_milli=1000),
        {"cordoned": "NodeSchedulable", "drained": "NodeSchedulable"},
    )


@scenario("GpuModel")
def _gpu_model(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.dgx("a100"), nodes.t4("t4"), nodes.dgx("h100", model="H100-SXM5-80GB")])
    return (
        e,
        PodRequest("any-listed", gpus=1, gpu_models=("T4", "A100", "H100")),
        PodRequest("p", gpus=1, gpu_models=("A100",)),
        {"t4": "GpuModel", "h100": "GpuModel"},
    )


@scenario("GpuCount")
def _gpu_count(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.t4("four"), nodes.dgx("eight")])
    return e, PodRequest("four", gpus=4), PodRequest("p", gpus=8), {"four": "GpuCount"}


@scenario("GpuHealth")
def _gpu_health(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for(
        [nodes.t4("healthy"), nodes.t4("sick", health={0: GpuHealth.OFFLINE, 1: GpuHealth.RESETTING})]
    )
    e.state.set_gpu_health(1, 2, GpuHealth.DEGRADED)  # 1 healthy GPU left on "sick"
    return e, PodRequest("one", gpus=1), PodRequest("p", gpus=2), {"sick": "GpuHealth"}


@scenario("Cpu")
def _cpu(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.t4("big", cpu_milli=16_000), nodes.t4("small", cpu_milli=4_000), nodes.cpu("cpu")])
    hold(e, "cpu", {}, cpu=30_000)  # 2000 left
    return (
        e,
        PodRequest("fits", cpu_milli=2000),
        PodRequest("p", cpu_milli=4001),
        {"small": "Cpu", "cpu": "Cpu"},
    )


@scenario("Memory")
def _memory(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.t4("big", memory_mib=64_000), nodes.t4("small", memory_mib=8_000)])
    return (
        e,
        PodRequest("fits", memory_mib=8_000),
        PodRequest("p", memory_mib=8_001),
        {"small": "Memory"},
    )


@scenario("MigSlot")
def _mig(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.mig("full"), nodes.mig("empty"), nodes.t4("plain")])
    st = e.state
    st.allocate("whole", st.index["full"], 0, 0, [GpuGrant(0, 0, 0, "7g.40gb", 0)])
    return (
        e,
        PodRequest("cpu-only", cpu_milli=1000),  # not a MIG question
        PodRequest("p", gpus=1, mig_profile="1g.5gb"),
        {"full": "MigSlot", "plain": "MigSlot"},
    )


@scenario("WholeGpus")
def _whole(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.t4("free"), nodes.t4("shared")])
    hold(e, "shared", {0: (100, 0), 1: (1, 0), 2: (0, 1)})  # three GPUs not fully free
    return e, PodRequest("share", gpus=2, gpu_milli=900), PodRequest("p", gpus=2), {"shared": "WholeGpus"}


@scenario("GpuMemory")
def _gpu_memory(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.t4("free"), nodes.t4("full-mem")])
    hold(e, "full-mem", {j: (0, 6_000) for j in range(4)})  # 9109 MiB left on each GPU
    return (
        e,
        PodRequest("small", gpus=1, gpu_milli=200, gpu_memory_mib=9_109),
        PodRequest("p", gpus=1, gpu_milli=200, gpu_memory_mib=10_000),
        {"full-mem": "GpuMemory"},
    )


@scenario("GpuCompute")
def _gpu_compute(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.t4("free"), nodes.t4("busy")])
    hold(e, "busy", {j: (500, 0) for j in range(4)})
    return (
        e,
        PodRequest("half", gpus=2, gpu_milli=500),
        PodRequest("p", gpus=2, gpu_milli=600),
        {"busy": "GpuCompute"},
    )


@scenario("Topology")
def _topology(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.dgx("split"), nodes.dgx("one-group-free")])
    hold(e, "split", {0: (1000, 0), 4: (1000, 0)})  # 3 free in each NVLink group
    hold(e, "one-group-free", {1: (1000, 0)})  # group {4-7} has 4 free
    return (
        e,
        PodRequest("any", gpus=4),
        PodRequest("p", gpus=4, locality=Locality.NVLINK),
        {"split": "Topology"},
    )


@scenario("Bandwidth")
def _bandwidth(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for([nodes.dgx("fast", nvlink_bw=600.0), nodes.dgx("slow", nvlink_bw=300.0), nodes.t4("pcie")])
    return (
        e,
        PodRequest("no-minimum", gpus=2),
        PodRequest("p", gpus=2, min_bandwidth_gbps=400.0),
        {"slow": "Bandwidth", "pcie": "Bandwidth"},
    )


@scenario("Price")
def _price(nodes: NodeFactory) -> ScenarioCase:
    e = engine_for(
        [
            nodes.t4("cheap", price_per_hour=1.0),
            nodes.t4("dear", price_per_hour=5.0),
            nodes.t4("spot", price_per_hour=0.5, spot=True),
        ]
    )
    return (
        e,
        PodRequest("ok", max_price_per_hour=5.0),
        PodRequest("p", max_price_per_hour=2.0, spot_allowed=False),
        {"dear": "Price", "spot": "Price"},
    )


def test_every_filter_has_a_scenario() -> None:
    assert set(SCENARIOS) == {f.name for f in FILTERS}
    assert len(REASON) == len(FILTERS)  # names are unique
    assert len(set(REASON.values())) == len(FILTERS)  # and so are reasons


@pytest.mark.parametrize("name", [f.name for f in FILTERS])
def test_filter_rejects_exactly_the_expected_nodes(nodes: NodeFactory, name: str) -> None:
    engine, fits, req, expected = SCENARIOS[name](nodes)
    # A milder request is accepted everywhere: the rejection is about the request, not the node.
    if fits is not None:
        assert engine.reasons(fits) == {}
    assert engine.reasons(req) == {node: REASON[f] for node, f in expected.items()}
    ev = engine.evaluate(req)
    feasible = {engine.state.nodes[int(i)].name for i in ev.rows}
    assert feasible == {n.name for n in engine.state.nodes} - set(expected)
    assert all(ev.reason_text(engine.state.index[n]) == "" for n in feasible)
    placement = engine.place(req)
    assert placement is not None and placement.node in feasible


def test_gpu_model_matching_rules() -> None:
    assert model_matches("A100-SXM4-80GB", ("A100",))
    assert model_matches("a100-sxm4-80gb", ("A100",))  # case-insensitive
    assert model_matches("NVIDIA A100 80GB", ("nvidia a100",))
    assert model_matches("V100M32", ("V100M32",))
    assert not model_matches("V100M32", ("V100",))  # trace codes match exactly
    assert not model_matches("A100-SXM4-80GB", ("A10",))
    assert not model_matches("T4", ("A100", "V100"))
    assert not model_matches("T4", ())


def test_gpu_model_constraint_is_ignored_for_cpu_only_pods(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.t4("t4")])
    assert engine.reasons(PodRequest("p", cpu_milli=1000, gpu_models=("A100",))) == {}
    assert engine.reasons(PodRequest("p", gpus=1, gpu_models=("A100",))) == {"t4": REASON["GpuModel"]}


def test_offline_gpus_count_against_multi_gpu_requests(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.t4("t4")])
    for j in range(3):
        engine.state.set_gpu_health(0, j, GpuHealth.OFFLINE)
    assert engine.reasons(PodRequest("p", gpus=1)) == {}
    assert engine.reasons(PodRequest("p", gpus=2)) == {"t4": REASON["GpuHealth"]}
    placement = engine.place(PodRequest("p", gpus=1))
    assert placement is not None and placement.gpu_indices == (3,)
    engine.state.set_gpu_health(0, 0, GpuHealth.AVAILABLE)
    assert engine.reasons(PodRequest("p", gpus=2)) == {}  # the cache sees the health change


def test_same_socket_locality_on_a_pcie_node(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.t4("split"), nodes.t4("one-socket-free"), nodes.t4("busy")], "default")
    hold(engine, "split", {0: (1000, 0), 2: (1000, 0)})  # one free GPU per socket
    hold(engine, "one-socket-free", {0: (1000, 0)})  # socket 1 (GPUs 2, 3) free
    hold(engine, "busy", {j: (1000, 0) for j in range(3)})
    req = PodRequest("p", gpus=2, locality=Locality.SAME_SOCKET)
    assert engine.reasons(req) == {"split": REASON["Topology"], "busy": REASON["WholeGpus"]}
    placement = engine.place(req)
    assert placement is not None and placement.node == "one-socket-free"
    assert set(placement.gpu_indices) == {2, 3}
    # Locality "any" or "same-node" does not constrain grouping.
    for loc in (Locality.ANY, Locality.SAME_NODE):
        assert engine.reasons(PodRequest("p", gpus=2, locality=loc)) == {"busy": REASON["WholeGpus"]}
    # Nor does it for a single GPU.
    assert engine.reasons(PodRequest("p", gpus=1, locality=Locality.SAME_SOCKET)) == {}
    # A PCIe-only node never satisfies NVLink locality.
    assert (
        engine.reasons(PodRequest("p", gpus=2, locality=Locality.NVLINK))["one-socket-free"]
        == (REASON["Topology"])
    )


def test_topology_for_shared_multi_gpu_requests_counts_gpus_with_room(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.dgx("dgx")])
    hold(engine, "dgx", {0: (600, 0), 1: (600, 0), 4: (600, 0), 5: (600, 0)})
    fits = PodRequest("p", gpus=4, gpu_milli=400, locality=Locality.NVLINK)
    assert engine.reasons(fits) == {}
    too_big = PodRequest("p", gpus=4, gpu_milli=500, locality=Locality.NVLINK)  # only 2 per group
    assert engine.reasons(too_big) == {"dgx": REASON["Topology"]}


def test_bandwidth_requires_the_gpus_in_one_fast_nvlink_group(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.dgx("dgx", nvlink_bw=600.0)])
    hold(engine, "dgx", {0: (1000, 0), 1: (1000, 0), 4: (1000, 0), 5: (1000, 0)})
    assert engine.reasons(PodRequest("p", gpus=2, min_bandwidth_gbps=600.0)) == {}
    assert engine.reasons(PodRequest("p", gpus=3, min_bandwidth_gbps=600.0)) == {"dgx": REASON["Bandwidth"]}
    assert engine.reasons(PodRequest("p", gpus=3)) == {}  # 4 free GPUs, just not in one group
    # A single GPU has no peer to talk to: the minimum does not apply.
    assert engine.reasons(PodRequest("p", gpus=1, min_bandwidth_gbps=10_000.0)) == {}


def test_mig_profile_unknown_for_the_model_is_rejected(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.mig("a100-40"), nodes.mig("a100-80", model="A100-SXM4-80GB")])
    assert engine.reasons(PodRequest("p", gpus=1, mig_profile="1g.10gb+me")) == {"a100-40": REASON["MigSlot"]}
    assert engine.reasons(PodRequest("p", gpus=1, mig_profile="1g.5gb")) == {"a100-80": REASON["MigSlot"]}


def test_mig_slots_run_out(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.mig("mig")])
    req = PodRequest("p", gpus=1, mig_profile="1g.5gb")
    for k in range(7):  # seven 1g.5gb fill an A100-40GB
        placement = engine.place(req)
        assert placement is not None, k
        engine.commit(placement, f"p{k}")
    assert engine.reasons(req) == {"mig": REASON["MigSlot"]}
    assert engine.place(req) is None


def test_mig_filter_skips_offline_mig_gpus(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.mig("mig", n_gpus=2)])
    st = engine.state
    st.allocate("whole", 0, 0, 0, [GpuGrant(0, 0, 0, "7g.40gb", 0)])
    st.set_gpu_health(0, 1, GpuHealth.OFFLINE)
    assert engine.reasons(PodRequest("p", gpus=1, mig_profile="1g.5gb")) == {"mig": REASON["MigSlot"]}


def test_one_reason_per_infeasible_node_and_none_for_feasible(nodes: NodeFactory) -> None:
    """A cluster with one node failing each filter (plus two feasible ones)."""
    specs = [
        nodes.dgx("ok-1", price_per_hour=0.0),
        nodes.dgx("unschedulable", schedulable=False),
        nodes.t4("wrong-model"),
        nodes.dgx("small", n_gpus=2, groups=1),
        nodes.dgx("offline", health=dict.fromkeys(range(7), GpuHealth.OFFLINE)),
        nodes.dgx("low-cpu", cpu_milli=1000),
        nodes.dgx("low-mem", memory_mib=1000),
        nodes.dgx("used"),
        nodes.dgx("split"),
        nodes.dgx("slow", nvlink_bw=100.0),
        nodes.dgx("dear", price_per_hour=100.0),
        nodes.dgx("ok-2", price_per_hour=1.0),
        nodes.dgx("unpriced"),  # an unknown price is not under any maximum
    ]
    engine = engine_for(specs, policy="default")
    hold(engine, "used", {j: (1, 0) for j in range(6)})  # 2 fully free GPUs
    hold(engine, "split", {0: (1000, 0), 1: (1000, 0), 4: (1000, 0), 5: (1000, 0), 6: (1000, 0)})
    req = PodRequest(
        "p",
        cpu_milli=8000,
        memory_mib=64_000,
        gpus=3,
        gpu_models=("A100",),
        locality=Locality.NVLINK,
        min_bandwidth_gbps=400.0,
        max_price_per_hour=10.0,
    )
    expected = {
        "unschedulable": "NodeSchedulable",
        "wrong-model": "GpuModel",
        "small": "GpuCount",
        "offline": "GpuHealth",
        "low-cpu": "Cpu",
        "low-mem": "Memory",
        "used": "WholeGpus",
        "split": "Topology",
        "slow": "Bandwidth",
        "dear": "Price",
        "unpriced": "Price",
    }
    reasons = engine.reasons(req)
    assert reasons == {n: REASON[f] for n, f in expected.items()}
    ev = engine.evaluate(req)
    assert ev.reasons.shape == (len(specs),)
    assert sorted(engine.state.nodes[int(i)].name for i in ev.rows) == ["ok-1", "ok-2"]
    assert (ev.reasons[ev.rows] == FEASIBLE).all()
    assert sum(int(c) != FEASIBLE for c in ev.reasons) == len(expected)
    # Restricting candidates keeps the reasons but narrows the feasible rows.
    ok2 = engine.state.index["ok-2"]
    assert engine.evaluate(req, candidates=[ok2, 1]).rows.tolist() == [ok2]
    placement = engine.place(req, candidates=[ok2])
    assert placement is not None and placement.node == "ok-2"
    assert engine.place(req, candidates=[1, 2]) is None


def test_group_free_counts() -> None:
    groups = np.array([[0, 0, 1, 1, -1, -1], [-1, -1, -1, -1, -1, -1], [2, 2, 2, 0, 0, 0]])
    free = np.array(
        [[True, False, True, True, True, True], [True] * 6, [True, True, False, True, True, True]]
    )
    np.testing.assert_array_equal(group_free_counts(groups, free), [2, 0, 3])


def test_filters_say_themselves_which_rejections_are_unresolvable() -> None:
    # Properties of the node no eviction changes; everything else preemption may resolve.
    unresolvable = {f.name for f in FILTERS if f.unresolvable}
    assert unresolvable == {"NodeSchedulable", "GpuModel", "GpuCount", "GpuHealth", "Price"}
