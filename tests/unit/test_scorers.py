"""Scorers: each one's direction on a crafted cluster, and the [0, 1] range on random states."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from node_factory import NodeFactory

from neuronetes.engine import PlacementEngine, Policy, WorkloadProfile
from neuronetes.engine.profile import leftover_waste
from neuronetes.engine.scorers import SCORERS, ScoreContext
from neuronetes.inventory import ClusterState
from neuronetes.model import GpuGrant, GpuHealth, Locality, NodeSpec, PodRequest

pytestmark = pytest.mark.unit

PENALTIES = {"scarcity"}


def only(name: str) -> Policy:
    return Policy(f"only-{name}", {name: 1.0}, "bestfit")


def engine_for(
    nodes: list[NodeSpec], scorer: str, profile: WorkloadProfile | None = None, seed: int = 0
) -> PlacementEngine:
    return PlacementEngine(ClusterState(nodes), only(scorer), profile=profile, seed=seed)


def scores(engine: PlacementEngine, req: PodRequest) -> dict[str, float]:
    """Best score per feasible node, by name."""
    ev = engine.evaluate(req)
    return {engine.state.nodes[int(i)].name: float(s) for i, s in zip(ev.rows, ev.node_scores, strict=True)}


def raw(engine: PlacementEngine, scorer: str, req: PodRequest) -> np.ndarray:
    """The scorer's own output on the feasible rows (unmasked; per GPU for one-GPU shares)."""
    rows = engine.evaluate(req).rows
    return SCORERS[scorer].fn(engine._context(req, rows))


def hold(engine: PlacementEngine, node: str, gpus: dict[int, int], cpu: int = 0, name: str = "") -> None:
    st_ = engine.state
    grants = [GpuGrant(j, milli, 0) for j, milli in gpus.items()]
    st_.allocate(name or f"hold-{node}-{len(st_.allocations)}", st_.index[node], cpu, 0, grants)


def test_scorer_table_names_match() -> None:
    assert all(name == s.name for name, s in SCORERS.items())
    # Volatile: depends on more than the scored rows (randomness; cluster-wide host counts).
    assert {n for n, s in SCORERS.items() if s.volatile} == {"random", "scarcity", "pinned_reserve"}


# ---- paper baselines -------------------------------------------------------------------------
def test_bestfit_prefers_the_fuller_node(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.t4("empty"), nodes.t4("fuller"), nodes.t4("fullest")], "bestfit")
    hold(engine, "fuller", {0: 1000}, cpu=16_000)
    hold(engine, "fullest", {0: 1000, 1: 1000}, cpu=32_000)
    req = PodRequest("p", cpu_milli=4000, gpus=1)
    s = scores(engine, req)
    assert s["fullest"] > s["fuller"] > s["empty"]
    # The paper's formula: 1 − ½·cpu_left/128 cores − ½·gpu_left/8 GPUs, truncated to 1/100.
    expected = math.trunc(100 * (1 - 0.5 * (64_000 - 32_000 - 4000) / 128_000 - 0.5 * 1000 / 8000)) / 100
    assert s["fullest"] == pytest.approx(expected)
    placement = engine.place(req)
    assert placement is not None and placement.node == "fullest"


def test_packing_prefers_a_partially_used_gpu_for_a_share(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.t4("idle"), nodes.t4("shared"), nodes.t4("used")], "packing")
    hold(engine, "shared", {2: 500})  # GPU 2 half used
    hold(engine, "used", {0: 1000})  # a whole GPU used, the rest free
    req = PodRequest("p", gpus=1, gpu_milli=300)
    s = scores(engine, req)
    # Case 1 (shared GPU): 100 − 50/10 = 95; case 2 (free GPU on a used node): 50 − 1 = 49;
    # case 3 (idle node): max(33 − 4, 4) = 29.
    assert s == pytest.approx({"shared": 0.95, "used": 0.49, "idle": 0.29})
    placement = engine.place(req)
    assert placement is not None and placement.node == "shared"
    # A CPU-only pod has no GPU preference.
    assert set(scores(engine, PodRequest("cpu", cpu_milli=1000)).values()) == {0.0}


def test_clustering_prefers_a_node_hosting_the_same_gpu_shape(nodes: NodeFactory) -> None:
    engine = engine_for(
        [nodes.t4("empty"), nodes.t4("same"), nodes.t4("other"), nodes.t4("mixed")], "clustering"
    )
    hold(engine, "same", {0: 500})
    hold(engine, "other", {0: 1000})
    hold(engine, "mixed", {0: 500})
    hold(engine, "mixed", {1: 1000})
    req = PodRequest("p", gpus=1, gpu_milli=500)
    s = scores(engine, req)
    # 25·(8000 − free)/8000 plus 75 (only this shape), 50 (also others), 25 (empty), 0 (others only):
    # same 25·4500/8000 + 75 = 89.06, mixed 25·5500/8000 + 50 = 67.19, empty 12.5 + 25, other 15.6.
    assert s == pytest.approx({"same": 0.89, "mixed": 0.67, "empty": 0.37, "other": 0.15})
    assert max(s, key=s.__getitem__) == "same"


def test_dotprod_is_within_unit_interval_and_prefers_alignment(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.t4("gpu-rich"), nodes.t4("cpu-poor", cpu_milli=8000)], "dotprod")
    for req in (
        PodRequest("cpu", cpu_milli=4000),
        PodRequest("whole", cpu_milli=4000, gpus=2),
        PodRequest("share", cpu_milli=4000, gpus=1, gpu_milli=250),
        PodRequest("shares", cpu_milli=4000, gpus=3, gpu_milli=250),
    ):
        s = scores(engine, req)
        assert set(s) == {"gpu-rich", "cpu-poor"}
        assert all(0.0 <= v <= 1.0 for v in s.values()), (req, s)
        # The node with less free CPU has the smaller dot product, hence the higher score.
        assert s["cpu-poor"] >= s["gpu-rich"]


def test_fgd_prefers_the_gpu_whose_leftover_stays_usable(nodes: NodeFactory) -> None:
    """Profile: only 1-GPU × 500 pods. Node GPU 0 is free (1000), GPU 1 has 700 free.

    Placing 500 on GPU 0 leaves [500, 700]: both still hold a 500 pod, fragmentation 0 → 0.
    Placing it on GPU 1 leaves [1000, 200]: 200 is now fragment, Δ = +200.
    FGD scores sigmoid(−Δ/1000): 0.5 and 1/(1 + e^0.2) = 0.4502 → truncated 0.50 and 0.45.
    (Best fit would take GPU 1, the tighter one.)
    """
    profile = WorkloadProfile.from_requests([PodRequest(gpus=1, gpu_milli=500)] * 3)
    engine = engine_for([nodes.t4("n", n_gpus=2)], "fgd", profile)
    hold(engine, "n", {1: 300})
    req = PodRequest("p", gpus=1, gpu_milli=500)
    ev = engine.evaluate(req)
    assert ev.gpu_scores is not None
    row = ev.gpu_scores[0]
    assert row[0] == pytest.approx(0.50)
    assert row[1] == pytest.approx(0.45)
    assert np.isneginf(row[2:]).all()  # padded slots can never be chosen
    placement = engine.place(req)
    assert placement is not None and placement.gpu_indices == (0,)
    # With a profile of 200-milli pods the 200 left on GPU 1 stays usable: now both are Δ 0.
    small = WorkloadProfile.from_requests([PodRequest(gpus=1, gpu_milli=200)])
    engine.set_profile(small)
    gpu_scores = engine.evaluate(req).gpu_scores
    assert gpu_scores is not None
    row = gpu_scores[0]
    assert row[0] == row[1] == pytest.approx(0.5)


def test_fgd_between_nodes_keeps_whole_gpus_for_whole_gpu_pods(nodes: NodeFactory) -> None:
    """Profile: 1-GPU whole pods. Node "frag" has GPU 0 at 400 free; "whole" has both GPUs free.

    A 400 share on "frag" GPU 0 turns its 400 (already fragment) into 0: Δ = −400 (score
    sigmoid(0.4) = 0.5986 → 0.59). On "whole" it leaves 600 that no whole-GPU pod can use: Δ = +600
    (sigmoid(−0.6) = 0.354 → 0.35).
    """
    profile = WorkloadProfile.from_requests([PodRequest(gpus=1)] * 5)
    engine = engine_for([nodes.t4("whole", n_gpus=2), nodes.t4("frag", n_gpus=2)], "fgd", profile)
    hold(engine, "frag", {0: 600})
    s = scores(engine, PodRequest("p", gpus=1, gpu_milli=400))
    assert s == pytest.approx({"frag": 0.59, "whole": 0.35})


def test_capacity_frag_penalises_using_the_cpu_typical_pods_need(nodes: NodeFactory) -> None:
    """Profile: pods of 4 cores + 1 GPU. "tight" (5 cores) holds one such pod; "roomy" holds 4.

    A 2-core CPU-only pod on "tight" leaves 3 cores: no typical pod fits, the stranded GPU capacity
    goes 3000 → 4000 (Δ = +1000, score ½ − 1000/16000 = 0.4375). On "roomy" nothing changes (0.5).
    """
    profile = WorkloadProfile.from_requests([PodRequest(cpu_milli=4000, gpus=1)] * 4)
    engine = engine_for([nodes.t4("tight", cpu_milli=5000), nodes.t4("roomy")], "capacity_frag", profile)
    s = scores(engine, PodRequest("cpu", cpu_milli=2000))
    assert s == pytest.approx({"tight": 0.4375, "roomy": 0.5})
    placement = engine.place(PodRequest("cpu", cpu_milli=2000))
    assert placement is not None and placement.node == "roomy"


def test_capacity_frag_per_gpu_prefers_filling_a_gpu_exactly(nodes: NodeFactory) -> None:
    profile = WorkloadProfile.from_requests([PodRequest(gpus=1, gpu_milli=500)] * 2)
    engine = engine_for([nodes.t4("n", n_gpus=2)], "capacity_frag", profile)
    hold(engine, "n", {1: 300})  # GPU 1: 700 free = one 500 pod + 200 fragment
    ev = engine.evaluate(PodRequest("p", gpus=1, gpu_milli=500))
    assert ev.gpu_scores is not None
    # On GPU 0: 1000 → 500, instances 3 → 2, fragment 200 → 200 (Δ 0, 0.5).
    # On GPU 1: 700 → 200, instances 3 → 2, fragment 200 → 200 (Δ 0, 0.5) — but a 700 share:
    assert ev.gpu_scores[0, 0] == pytest.approx(0.5) and ev.gpu_scores[0, 1] == pytest.approx(0.5)
    ev7 = engine.evaluate(PodRequest("p", gpus=1, gpu_milli=700))
    assert ev7.gpu_scores is not None
    # 700 on GPU 1 empties it (fragment 200 → 0 on it, total 1000 free usable): Δ −200 → 0.5125.
    # 700 on GPU 0 leaves 300 + 700: fragment 300+200 = 500, Δ +300 → 0.48125.
    assert ev7.gpu_scores[0, 1] == pytest.approx(0.5 + 200 / 16000)
    assert ev7.gpu_scores[0, 0] == pytest.approx(0.5 - 300 / 16000)


# ---- NeuroNetes terms --------------------------------------------------------------------------
def test_leftover_waste_is_the_bellman_recursion() -> None:
    """Shapes 600 (p=¾) and 400 (p=¼): a 400 leftover is filled exactly, a 200 one never."""
    waste = leftover_waste([(600, 0.75), (400, 0.25)])
    assert waste[0] == 0 and waste[200] == 200 and waste[399] == 399
    assert waste[400] == 0  # only 400 fits: 400 → 0
    assert waste[600] == pytest.approx(0.75 * 0 + 0.25 * 200)  # 600 → 0, or 400 → 200 left
    assert waste[1000] == pytest.approx(0.75 * waste[400] + 0.25 * waste[600])
    assert (waste[:400] == np.arange(400)).all()


def test_leftover_waste_counts_rare_fillers_as_unlikely() -> None:
    """A leftover only rare pods fit is mostly wasted; one common pods fit is filled."""
    shapes = [(1000, 0.50), (800, 0.48), (150, 0.02)]  # 150 pods: 2 % of single-GPU pods
    optimistic = leftover_waste(shapes, reliable_share=0)
    waste = leftover_waste(shapes, reliable_share=0.1)
    assert optimistic[200] == pytest.approx(50)  # the recursion alone: a 150 pod surely comes
    filled = 0.02 / 0.1
    assert waste[200] == pytest.approx(filled * 50 + (1 - filled) * 200)
    assert waste[149] == 149 and waste[0] == 0
    # Half of single-GPU pods fit in 800 free (≥ 0.1): that leftover is filled for sure.
    assert waste[800] == pytest.approx((0.48 * waste[0] + 0.02 * waste[650]) / 0.50)
    # Rare fillers: 200 free is expected to waste more than 50 free, which nothing can fill.
    assert waste[200] > waste[50] == 50
    with pytest.raises(ValueError):
        leftover_waste(shapes, reliable_share=-1)


def test_share_waste_prefers_the_gpu_whose_leftover_is_filled(nodes: NodeFactory) -> None:
    """Profile of 600 and 400 shares: a 400 pod fits exactly into a GPU with 400 free."""
    profile = WorkloadProfile.from_requests(
        [PodRequest(gpus=1, gpu_milli=600)] * 3 + [PodRequest(gpus=1, gpu_milli=400)]
    )
    engine = engine_for([nodes.t4("n", n_gpus=2)], "share_waste", profile)
    hold(engine, "n", {1: 600})  # GPU 1 has 400 free
    ev = engine.evaluate(PodRequest("p", gpus=1, gpu_milli=400))
    assert ev.gpu_scores is not None
    assert ev.gpu_scores[0, 1] > ev.gpu_scores[0, 0]
    placement = engine.place(PodRequest("p", gpus=1, gpu_milli=400))
    assert placement is not None and placement.gpu_indices == (1,)
    # Not a one-GPU share: neutral.
    assert (raw(engine, "share_waste", PodRequest("w", gpus=1)) == 1.0).all()


def test_cpu_strand_keeps_cpu_where_gpus_need_it(nodes: NodeFactory) -> None:
    """GPU pods ask 8 cores per GPU: a 32-core 4-GPU node has no CPU to spare, a 64-core one does."""
    profile = WorkloadProfile.from_requests([PodRequest(cpu_milli=8000, gpus=1)] * 4)
    assert profile.cpu_per_gpu_milli() == pytest.approx(8.0)
    engine = engine_for([nodes.t4("lean", cpu_milli=32_000), nodes.t4("rich")], "cpu_strand", profile)
    # 1 GPU + 16 cores on lean: 3 GPUs left with 16 cores, which feed 2 of them → 1 GPU stranded.
    s = scores(engine, PodRequest("p", cpu_milli=16_000, gpus=1))
    assert s == pytest.approx({"lean": 0.5 - 1000 / 16000, "rich": 0.5})
    placement = engine.place(PodRequest("p", cpu_milli=16_000, gpus=1))
    assert placement is not None and placement.node == "rich"
    # A CPU-only pod strands two of lean's GPUs; a pod within the ratio strands nothing.
    assert scores(engine, PodRequest("c", cpu_milli=16_000)) == pytest.approx(
        {"lean": 0.5 - 2000 / 16000, "rich": 0.5}
    )
    assert set(scores(engine, PodRequest("q", cpu_milli=4000, gpus=1)).values()) == {0.5}
    # No GPU pods in the profile: neutral.
    plain = engine_for(
        [nodes.t4("n")], "cpu_strand", WorkloadProfile.from_requests([PodRequest(cpu_milli=1)])
    )
    assert set(scores(plain, PodRequest("p", cpu_milli=16_000, gpus=1)).values()) == {1.0}


def test_scarcity_guards_the_last_hosts_of_a_large_shape(nodes: NodeFactory) -> None:
    """8-GPU pods asking 120 cores fit only the big node; small pods go elsewhere."""
    big = nodes.dgx("big", cpu_milli=128_000)
    small = [nodes.dgx(f"s{k}", cpu_milli=96_000) for k in range(3)]
    profile = WorkloadProfile.from_requests(
        [PodRequest(cpu_milli=120_000, gpus=8)] + [PodRequest(cpu_milli=8000, gpus=1)] * 20
    )
    engine = engine_for([big, *small], "scarcity", profile)
    s = scores(engine, PodRequest("p", cpu_milli=8000, gpus=1))
    assert s["big"] < s["s0"] == s["s1"] == s["s2"] == 1.0
    placement = engine.place(PodRequest("p", cpu_milli=8000, gpus=1))
    assert placement is not None and placement.node != "big"
    # No large shape in the workload: neutral everywhere.
    plain = engine_for([big, *small], "scarcity", WorkloadProfile.from_requests([PodRequest(gpus=1)]))
    assert set(scores(plain, PodRequest("p", gpus=1)).values()) == {1.0}


def test_scarcity_counts_only_hosts_of_the_models_a_large_shape_may_use(nodes: NodeFactory) -> None:
    """8-GPU pods pinned to H100: the one H100 node is their only host, though A100s are as big."""
    h100 = nodes.dgx("h100", model="H100-SXM5-80GB")
    a100 = [nodes.dgx(f"a{k}") for k in range(3)]
    pinned = [PodRequest(cpu_milli=8000, gpus=8, gpu_models=("H100",))]
    profile = WorkloadProfile.from_requests(pinned + [PodRequest(cpu_milli=8000, gpus=1)] * 20)
    engine = engine_for([h100, *a100], "scarcity", profile)
    s = scores(engine, PodRequest("p", cpu_milli=8000, gpus=1))
    assert s["h100"] < s["a0"] == s["a1"] == s["a2"] == 1.0
    placement = engine.place(PodRequest("p", cpu_milli=8000, gpus=1))
    assert placement is not None and placement.node != "h100"
    # Unpinned, the same pods have four hosts: losing the H100 costs as much as losing an A100.
    plain = WorkloadProfile.from_requests(
        [PodRequest(cpu_milli=8000, gpus=8)] + [PodRequest(cpu_milli=8000, gpus=1)] * 20
    )
    assert (
        len(set(scores(engine_for([h100, *a100], "scarcity", plain), PodRequest("p", gpus=1)).values())) == 1
    )


def test_pinned_reserve_keeps_a_scarce_models_nodes_for_pinned_demand(nodes: NodeFactory) -> None:
    """Two T4 nodes (8 GPUs) and four A100 nodes (32): 30 % of GPU demand may only use T4.

    Pinned pods will claim 30 % of the 40 free GPUs, 12, and T4 holds 8: a shortfall of 4. An
    unpinned GPU on T4 deepens it by 0.7 GPU (T4 loses 1, the need falls by 0.3); on an A100 it
    shrinks by 0.3. Scores: 0.5 − 700/16000 and 0.5 + 300/16000.
    """
    specs = [nodes.t4("t0"), nodes.t4("t1")] + [nodes.dgx(f"a{k}") for k in range(4)]
    pods = [PodRequest(cpu_milli=1000, gpus=1, gpu_models=("T4",))] * 3 + [
        PodRequest(cpu_milli=1000, gpus=1)
    ] * 7
    engine = engine_for(specs, "pinned_reserve", WorkloadProfile.from_requests(pods))
    s = scores(engine, PodRequest("p", cpu_milli=1000, gpus=1))
    assert s["t0"] == s["t1"] == pytest.approx(0.5 - 700 / 16000)
    assert all(s[f"a{k}"] == pytest.approx(0.5 + 300 / 16000) for k in range(4))
    placement = engine.place(PodRequest("p", cpu_milli=1000, gpus=1))
    assert placement is not None and placement.node.startswith("a")
    # A pod that lists T4 and A100 goes to the A100s too; one pinned to T4 sees one score.
    listed = engine.place(PodRequest("l", cpu_milli=1000, gpus=1, gpu_models=("T4", "A100")))
    assert listed is not None and listed.node.startswith("a")
    assert len(set(scores(engine, PodRequest("t", gpus=1, gpu_models=("T4",))).values())) == 1
    # T4 still holds more than its pinned share (5 %: 2 of 40 GPUs): no steering at all.
    few = [PodRequest(cpu_milli=1000, gpus=1, gpu_models=("T4",))] + [PodRequest(cpu_milli=1000, gpus=1)] * 19
    loose = engine_for(specs, "pinned_reserve", WorkloadProfile.from_requests(few))
    assert set(scores(loose, PodRequest("p", cpu_milli=1000, gpus=1)).values()) == {0.5}
    # No pinned pods, or a CPU-only request: neutral.
    plain = engine_for(specs, "pinned_reserve", WorkloadProfile.from_requests([PodRequest(gpus=1)]))
    assert set(scores(plain, PodRequest("p", gpus=1)).values()) == {1.0}
    assert set(scores(engine, PodRequest("c", cpu_milli=1000)).values()) == {1.0}


def test_availability_scores_a_tight_fit_higher(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.t4("loose"), nodes.t4("tight")], "availability")
    hold(engine, "tight", {0: 1000, 1: 1000})
    s = scores(engine, PodRequest("p", gpus=2))
    assert s == pytest.approx({"tight": 1.0, "loose": 0.5})
    # Per GPU for a share: 1 − (free − asked)/1000.
    hold(engine, "loose", {3: 800})
    ev = engine.evaluate(PodRequest("p", gpus=1, gpu_milli=200))
    loose = engine.state.index["loose"]
    k = ev.rows.tolist().index(loose)
    assert ev.gpu_scores is not None
    assert ev.gpu_scores[k, :4] == pytest.approx([0.2, 0.2, 0.2, 1.0])
    assert set(scores(engine, PodRequest("cpu", cpu_milli=1)).values()) == {1.0}


def test_topology_prefers_a_node_that_keeps_the_gpus_in_one_nvlink_group(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.dgx("spread"), nodes.dgx("grouped"), nodes.t4("pcie", n_gpus=8)], "topology")
    hold(engine, "spread", {1: 1000, 5: 1000})  # 3 free in each group and each socket
    hold(engine, "grouped", {1: 1000})  # group {4-7} free
    s = scores(engine, PodRequest("p", gpus=4))
    # 0.9 × level (NVLink 1, NUMA 0.66, socket 0.33, spread 0) + 0.1 × PCIe gen / 6.
    assert s["grouped"] == pytest.approx(0.9 + 0.1 * 4 / 6)
    assert s["pcie"] == pytest.approx(0.9 * 0.66 + 0.1 * 3 / 6)  # 4 T4s on one NUMA node
    assert s["spread"] == pytest.approx(0.1 * 4 / 6)
    assert s["grouped"] > s["pcie"] > s["spread"]
    # Single-GPU requests have nothing to group.
    assert set(scores(engine, PodRequest("p", gpus=1)).values()) == {1.0}


def test_model_cache(nodes: NodeFactory) -> None:
    engine = engine_for(
        [
            nodes.t4("warm", cached_models=frozenset({"llama-70b", "bert"})),
            nodes.t4("cold"),
            nodes.t4("other", cached_models=frozenset({"bert"})),
        ],
        "model_cache",
    )
    assert scores(engine, PodRequest("p", gpus=1, model_name="llama-70b")) == {
        "warm": 1.0,
        "cold": 0.0,
        "other": 0.0,
    }
    assert set(scores(engine, PodRequest("p", gpus=1)).values()) == {1.0}
    placement = engine.place(PodRequest("p", gpus=1, model_name="bert"))
    assert placement is not None and placement.node in {"warm", "other"}


def test_model_cache_weight_of_the_request_replaces_the_policys(nodes: NodeFactory) -> None:
    """A pod's own weight (a pool's cacheHitWeight) replaces the policy's model_cache weight in
    the default policy, adds the term to a policy without it, and 0 removes it."""
    specs = [nodes.dgx("cold-a"), nodes.dgx("warm", cached_models=frozenset({"llama"})), nodes.dgx("cold-b")]
    default = PlacementEngine(ClusterState(specs), "default")
    plain = PodRequest("p", gpus=1, model_name="llama")
    heavy = PodRequest("p", gpus=1, model_name="llama", model_cache_weight=0.9)
    off = PodRequest("p", gpus=1, model_name="llama", model_cache_weight=0.0)
    warm = 1
    assert default.explain(plain, warm)["model_cache"] == pytest.approx(0.2)
    assert default.explain(heavy, warm)["model_cache"] == pytest.approx(0.9)
    assert default.explain(heavy, 0)["model_cache"] == 0.0
    assert "model_cache" not in default.explain(off, warm)
    placed = default.place(heavy)
    assert placed is not None and placed.node == "warm"
    # A policy without the term: the request's weight brings it.
    packing = engine_for(specs, "packing")
    assert "model_cache" not in packing.explain(plain, warm)
    assert packing.explain(heavy, warm)["model_cache"] == pytest.approx(0.9)
    placed = packing.place(heavy)
    assert placed is not None and placed.node == "warm"


def test_cost_prefers_cheaper_nodes_and_never_reads_an_unknown_price_as_free(nodes: NodeFactory) -> None:
    engine = engine_for(
        [
            nodes.t4("dear", price_per_hour=4.0),
            nodes.t4("cheap", price_per_hour=1.0),
            nodes.t4("free", price_per_hour=0.0),
            nodes.t4("unknown"),
        ],
        "cost",
    )
    s = scores(engine, PodRequest("p", gpus=1))
    assert s == pytest.approx({"dear": 0.0, "cheap": 0.75, "free": 1.0, "unknown": 0.0})
    unpriced = engine_for([nodes.t4("a"), nodes.t4("b")], "cost")
    assert set(scores(unpriced, PodRequest("p", gpus=1)).values()) == {1.0}
    all_free = engine_for([nodes.t4("a", price_per_hour=0.0), nodes.t4("b")], "cost")
    assert scores(all_free, PodRequest("p", gpus=1)) == {"a": 1.0, "b": 0.0}


def test_data_locality_prefers_the_requested_zones(nodes: NodeFactory) -> None:
    engine = engine_for(
        [nodes.t4("east", zone="us-east-1a"), nodes.t4("west", zone="us-west-2b"), nodes.t4("none")],
        "data_locality",
    )
    s = scores(engine, PodRequest("p", gpus=1, preferred_zones=("us-west-2b",)))
    assert s == {"east": 0.0, "west": 1.0, "none": 0.0}
    both = scores(engine, PodRequest("p", preferred_zones=("us-west-2b", "us-east-1a")))
    assert both == {"east": 1.0, "west": 1.0, "none": 0.0}
    assert set(scores(engine, PodRequest("p", gpus=1)).values()) == {1.0}


def test_data_locality_prefers_the_data_s_nodes_then_their_zones_and_avoids_named_nodes(
    nodes: NodeFactory,
) -> None:
    engine = engine_for(
        [
            nodes.t4("store", zone="a"),
            nodes.t4("beside", zone="a"),
            nodes.t4("far", zone="b"),
            nodes.t4("noisy", zone="a"),
        ],
        "data_locality",
    )
    near = PodRequest("p", gpus=1, preferred_nodes=("store",), preferred_zones=("a",))
    assert scores(engine, near) == {"store": 1.0, "beside": 0.5, "far": 0.0, "noisy": 0.5}
    avoiding = PodRequest(
        "p", gpus=1, preferred_nodes=("store",), preferred_zones=("a",), avoid_nodes=("noisy",)
    )
    assert scores(engine, avoiding) == {"store": 1.0, "beside": 0.5, "far": 0.0, "noisy": 0.0}
    only_avoid = PodRequest("p", gpus=1, avoid_nodes=("noisy", "gone"))  # an unknown name is ignored
    assert scores(engine, only_avoid) == {"store": 1.0, "beside": 1.0, "far": 1.0, "noisy": 0.0}


def test_a_request_s_weight_multiplier_scales_its_term(nodes: NodeFactory) -> None:
    engine = PlacementEngine(
        ClusterState([nodes.t4("store", zone="a"), nodes.t4("far", zone="b")]),
        Policy("split", {"data_locality": 0.1, "cost": 0.15}, "bestfit"),
    )
    base = PodRequest("p", gpus=1, preferred_nodes=("store",))
    for scale in (0.5, 1.0, 2.0):
        req = replace(base, weight_scale=(("data_locality", scale),))
        s = scores(engine, req)
        assert s["store"] - s["far"] == pytest.approx(0.1 * scale)
        assert engine.explain(req, engine.state.index["store"])["data_locality"] == pytest.approx(0.1 * scale)


def test_random_is_volatile_and_within_unit_interval(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.t4(f"n{k}") for k in range(6)], "random", seed=7)
    req = PodRequest("p", gpus=1)
    first = engine.evaluate(req).node_scores
    second = engine.evaluate(req).node_scores  # same state, same cached shape: new draws
    assert not np.array_equal(first, second)
    for s in (first, second):
        assert ((s >= 0) & (s < 1)).all()
    again = engine_for([nodes.t4(f"n{k}") for k in range(6)], "random", seed=7)
    np.testing.assert_array_equal(again.evaluate(req).node_scores, first)  # seeded


# ---- every scorer stays in [0, 1] on random states ----------------------------------------------
request_st = st.builds(
    PodRequest,
    cpu_milli=st.integers(0, 16_000),
    memory_mib=st.integers(0, 32_000),
    gpus=st.integers(0, 4),
    gpu_milli=st.one_of(st.just(1000), st.integers(1, 1000)),
    gpu_memory_mib=st.one_of(st.just(0), st.integers(0, 20_000)),
    locality=st.sampled_from(list(Locality)),
    model_name=st.sampled_from([None, "bert"]),
    preferred_zones=st.sampled_from([(), ("a",)]),
)
profile_st = st.lists(
    st.builds(
        PodRequest,
        cpu_milli=st.sampled_from([0, 2000, 8000]),
        gpus=st.integers(0, 2),
        gpu_milli=st.sampled_from([100, 250, 500, 1000]),
        gpu_models=st.sampled_from([(), ("T4",), ("A100",)]),
    ),
    max_size=6,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    used=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 7), st.integers(1, 1000), st.integers(0, 40_000)),
        max_size=12,
    ),
    reqs=st.lists(request_st, min_size=1, max_size=4),
    pods=profile_st,
)
def test_every_scorer_stays_in_the_unit_interval(
    nodes: NodeFactory, used: list[tuple[int, int, int, int]], reqs: list[PodRequest], pods: list[PodRequest]
) -> None:
    specs = [
        nodes.dgx("dgx", zone="a", price_per_hour=3.0, cached_models=frozenset({"bert"})),
        nodes.dgx("dgx1", groups=1, zone="b", price_per_hour=2.0),
        nodes.t4("t4", zone="a"),
        nodes.t4("t4s", cpu_milli=16_000, price_per_hour=0.5, spot=True),
    ]
    state = ClusterState(specs)
    for k, (node, gpu, milli, mem) in enumerate(used):
        if gpu < state.gpu_count[node]:
            milli = min(milli, int(state.gpu_milli_free[node, gpu]))
            mem = min(mem, int(state.gpu_mem_free[node, gpu]))
            state.allocate(f"u{k}", node, 500 * (k % 3), 0, [GpuGrant(gpu, milli, mem)])
    profile = WorkloadProfile.from_requests(pods)
    for name in SCORERS:
        engine = PlacementEngine(state, only(name), profile=profile)
        for req in reqs:
            ev = engine.evaluate(req)
            if ev.rows.size == 0:
                continue
            out = SCORERS[name].fn(engine._context(req, ev.rows))
            ctx = engine._context(req, ev.rows)
            assert out.shape[0] == ev.rows.size
            values = out[ctx.gpu_fit] if out.ndim == 2 else out
            assert np.isfinite(values).all(), (name, req)
            # `scarcity` is a penalty: at most 1, unbounded below by design (see its docstring).
            low = -np.inf if name in PENALTIES else 0.0
            assert ((values >= low) & (values <= 1)).all(), (name, req, values)
            assert ((ev.node_scores >= low) & (ev.node_scores <= 1)).all(), (name, req)
            if ev.gpu_scores is not None:
                # One-GPU shares: a score per GPU, −inf exactly where the GPU cannot take it.
                assert ctx.per_gpu
                np.testing.assert_array_equal(np.isneginf(ev.gpu_scores), ~ctx.gpu_fit)
                assert (ev.node_scores == ev.gpu_scores.max(axis=1)).all()


def test_score_context_left_hides_unusable_gpus(nodes: NodeFactory) -> None:
    engine = engine_for([nodes.t4("t4"), nodes.mig("mig")], "bestfit")
    engine.state.set_gpu_health(0, 1, GpuHealth.OFFLINE)
    ctx: ScoreContext = engine._context(PodRequest("p", cpu_milli=1), np.array([0, 1]))
    assert ctx.free_milli[0, :4].tolist() == [1000, 0, 1000, 1000]
    assert ctx.free_milli[1].sum() == 0  # MIG GPUs never count as free milli-GPU
    assert not ctx.per_gpu
