"""The vectorised fragmentation measures against plain-Python reference implementations."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuronetes.engine import frag
from neuronetes.engine.profile import PinnedDemand, ProfileArrays, TypicalShape, WorkloadProfile
from neuronetes.model import PodRequest

pytestmark = pytest.mark.unit

MODELS = ("A100-SXM4-80GB", "T4", "V100M32")
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- references, straight from the definitions ---------------------------------------------------
Typical = list[tuple[TypicalShape, float]]
# Free milli-GPU per GPU [R, G], free CPU [R] and GPU model index [R] of some nodes.
NodeRows = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


def _may_use(shape: TypicalShape, model: int) -> bool:
    return not shape.gpu_models or MODELS[model] in shape.gpu_models


def ref_node_frag(left: list[int], cpu: int, model: int, typical: Typical) -> float:
    """FGD (ATC'23): per typical shape t with weight w —
    CPU-only t: w·(all free);  t fits (enough GPUs with free >= t.milli, CPU, model): w·(free on
    GPUs with free < t.milli);  otherwise w·(all free). One term per model list, unmerged."""
    total = sum(left)
    out = 0.0
    for shape, w in typical:
        milli, gpus, cpu_t = shape.gpu_milli, shape.gpus, shape.cpu_milli
        if milli == 0:
            out += w * total
            continue
        big_enough = sum(1 for x in left if x >= milli)
        if big_enough >= gpus and cpu >= cpu_t and _may_use(shape, model):
            out += w * sum(x for x in left if x < milli)
        else:
            out += w * total
    return out


def ref_capacity_frag(left: list[int], cpu: int, model: int, typical: Typical) -> float:
    """Per shape: instances = min(⌊Σ_g ⌊free_g/milli⌋ / gpus⌋, ⌊cpu/cpu_t⌋); usable = instances·gpus·milli
    (at most all free); fragment = free − usable. CPU-only or inaccessible shapes: all free."""
    total = sum(left)
    out = 0.0
    for shape, w in typical:
        milli, gpus, cpu_t = shape.gpu_milli, shape.gpus, shape.cpu_milli
        if milli == 0 or not _may_use(shape, model):
            out += w * total
            continue
        by_gpu = sum(x // milli for x in left) // gpus
        by_cpu = cpu // cpu_t if cpu_t > 0 else by_gpu
        usable = min(min(by_gpu, by_cpu) * gpus * milli, total)
        out += w * (total - usable)
    return out


# ---- strategies ------------------------------------------------------------------------------------
MODEL_LISTS = [(), ("T4",), ("A100-SXM4-80GB",), ("T4", "V100M32")]
free_st = st.one_of(
    st.sampled_from([0, 0, 1000, 1000, 1000, 500, 250, 750, 100, 900]),
    st.integers(0, 1000),
)
shape_st = st.one_of(
    st.builds(
        TypicalShape,
        cpu_milli=st.sampled_from([0, 1000, 4000, 8000, 16_000]),
        gpu_milli=st.one_of(st.sampled_from([100, 250, 500, 1000]), st.integers(1, 1000)),
        gpus=st.integers(1, 4),
        gpu_models=st.sampled_from(MODEL_LISTS),
    ),
    st.builds(
        TypicalShape, cpu_milli=st.sampled_from([0, 2000, 8000]), gpu_milli=st.just(0), gpus=st.just(0)
    ),
)


@dataclass(frozen=True)
class Drawn:
    """Typical shapes as drawn (one entry per model list) and the arrays built from them."""

    typical: Typical
    arrays: ProfileArrays


@st.composite
def profiles(draw: st.DrawFn) -> Drawn:
    base = draw(st.lists(shape_st, min_size=1, max_size=5, unique_by=lambda s: s.resources))
    shapes: list[TypicalShape] = []
    for s in base:  # some shapes also come pinned to other model lists: they share one column
        lists = draw(st.lists(st.sampled_from(MODEL_LISTS), min_size=0, max_size=2, unique=True))
        shapes += [s] + [replace(s, gpu_models=m) for m in lists if m != s.gpu_models and s.gpus]
    counts = draw(st.lists(st.integers(1, 20), min_size=len(shapes), max_size=len(shapes)))
    total = sum(counts)
    typical = [(s, c / total) for s, c in zip(shapes, counts, strict=True)]
    return Drawn(typical, ProfileArrays.build(typical, MODELS))


@st.composite
def node_rows(draw: st.DrawFn, min_full: int = 0) -> NodeRows:
    """left[R, G], cpu[R], model[R]; every row has at least `min_full` fully free GPUs."""
    r = draw(st.integers(1, 4))
    g = draw(st.integers(max(1, min_full), 8))
    left = []
    for _ in range(r):
        row = draw(st.lists(free_st, min_size=g, max_size=g))
        for j in range(min_full):
            row[j] = 1000
        left.append(row)
    cpu = draw(st.lists(st.integers(0, 64).map(lambda c: c * 1000), min_size=r, max_size=r))
    model = draw(st.lists(st.integers(0, len(MODELS) - 1), min_size=r, max_size=r))
    return np.array(left, dtype=np.int64), np.array(cpu, dtype=np.int64), np.array(model, dtype=np.int64)


# ---- properties ----------------------------------------------------------------------------------
@SETTINGS
@given(rows=node_rows(), p=profiles())
def test_node_fragmentation_matches_reference(rows: NodeRows, p: Drawn) -> None:
    left, cpu, model = rows
    got = frag.node_fragmentation(left, cpu, model, p.arrays)
    want = [ref_node_frag(left[i].tolist(), int(cpu[i]), int(model[i]), p.typical) for i in range(len(left))]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)
    # Fragmentation never exceeds the free capacity (weights sum to 1).
    assert (got <= left.sum(axis=1) + 1e-6).all() and (got >= -1e-9).all()


@SETTINGS
@given(data=st.data(), p=profiles())
def test_fragmentation_after_whole_gpus_matches_reference(data: st.DataObject, p: Drawn) -> None:
    n = data.draw(st.integers(1, 4), label="n_gpus")
    left, cpu, model = data.draw(node_rows(min_full=n), label="rows")
    cpu_req = data.draw(st.sampled_from([0, 1000, 4000]), label="cpu_req")
    got = frag.fragmentation_after_whole_gpus(left, cpu, model, p.arrays, n, cpu_req)
    want = []
    for i in range(left.shape[0]):
        after = left[i].tolist()
        full = [j for j, x in enumerate(after) if x == 1000][:n]  # which ones does not matter
        for j in full:
            after[j] = 0
        want.append(ref_node_frag(after, int(cpu[i]) - cpu_req, int(model[i]), p.typical))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)


# Each vectorised "after a share on GPU g" function against its reference applied to the node
# with that GPU reduced.
AFTER_SHARE = {
    "fgd": (frag.fragmentation_after_share, ref_node_frag),
    "capacity": (frag.capacity_fragmentation_after_share, ref_capacity_frag),
}


@pytest.mark.parametrize("kind", sorted(AFTER_SHARE))
@SETTINGS
@given(
    rows=node_rows(), p=profiles(), milli=st.one_of(st.sampled_from([100, 500, 1000]), st.integers(1, 1000))
)
def test_after_share_matches_reference_on_every_gpu_that_fits(
    kind: str, rows: NodeRows, p: Drawn, milli: int
) -> None:
    fast, reference = AFTER_SHARE[kind]
    left, cpu, model = rows
    cpu_req = 1000
    got = fast(left, cpu, model, p.arrays, milli, cpu_req)
    assert got.shape == left.shape
    for i in range(left.shape[0]):
        for j in range(left.shape[1]):
            if left[i, j] < milli:
                continue  # documented as meaningless; callers mask it
            after = left[i].tolist()
            after[j] -= milli
            want = reference(after, int(cpu[i]) - cpu_req, int(model[i]), p.typical)
            assert got[i, j] == pytest.approx(want, rel=1e-9, abs=1e-6), (kind, i, j)


@SETTINGS
@given(rows=node_rows(), p=profiles())
def test_capacity_fragmentation_matches_reference(rows: NodeRows, p: Drawn) -> None:
    left, cpu, model = rows
    got = frag.capacity_fragmentation(left, cpu, model, p.arrays)
    want = [ref_capacity_frag(x.tolist(), int(cpu[i]), int(model[i]), p.typical) for i, x in enumerate(left)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)
    # Any leading batch shape gives the same numbers.
    batched = frag.capacity_fragmentation(left[None, :, :], cpu[None, :], model[None, :], p.arrays)
    np.testing.assert_allclose(batched[0], got)
    assert (got <= left.sum(axis=1) + 1e-6).all() and (got >= -1e-9).all()


# ---- hand-worked examples from the docstrings ------------------------------------------------------
def arrays(*shapes: tuple[TypicalShape, float]) -> ProfileArrays:
    return ProfileArrays.build(list(shapes), MODELS)


def test_a_gpu_with_0_9_free_holds_one_half_pod() -> None:
    p = arrays((TypicalShape(0, 500, 1), 1.0))
    left = np.array([[900]])
    one = np.array([0])
    assert frag.capacity_fragmentation(left, one, one, p)[0] == pytest.approx(400)
    assert frag.node_fragmentation(left, one, one, p)[0] == 0  # FGD only asks "does one fit"


def test_an_8_gpu_node_with_cpu_for_three_pods_strands_five_gpus() -> None:
    p = arrays((TypicalShape(12_000, 1000, 1), 1.0))
    left = np.full((1, 8), 1000)
    cpu = np.array([36_000])
    model = np.array([0])
    assert frag.capacity_fragmentation(left, cpu, model, p)[0] == pytest.approx(5000)
    assert frag.node_fragmentation(left, cpu, model, p)[0] == 0


def test_cpu_only_shapes_count_all_free_gpu_and_inaccessible_models_too() -> None:
    p = arrays((TypicalShape(1000, 0, 0), 0.25), (TypicalShape(0, 1000, 1, ("A100",)), 0.75))
    left = np.array([[1000, 300], [1000, 300]])
    cpu = np.array([8000, 8000])
    model = np.array([MODELS.index("A100-SXM4-80GB"), MODELS.index("T4")])
    # A100 row: CPU-only shape → 1300·0.25; A100 shape fits → 300·0.75.
    # T4 row: the A100 shape cannot run there → 1300·0.75.
    np.testing.assert_allclose(frag.node_fragmentation(left, cpu, model, p), [325 + 225, 1300])
    np.testing.assert_allclose(frag.capacity_fragmentation(left, cpu, model, p), [325 + 225, 1300])


def test_empty_profile_means_no_fragmentation() -> None:
    p = WorkloadProfile.empty().arrays(MODELS)
    left = np.array([[1000, 200]])
    cpu = np.array([1000])
    model = np.array([0])
    assert frag.node_fragmentation(left, cpu, model, p).tolist() == [0.0]
    assert frag.fragmentation_after_whole_gpus(left, cpu, model, p, 1, 0).tolist() == [0.0]
    assert frag.fragmentation_after_share(left, cpu, model, p, 100, 0).tolist() == [[0.0, 0.0]]
    assert frag.capacity_fragmentation(left, cpu, model, p).tolist() == [0.0]


# ---- the profile itself ------------------------------------------------------------------------------
def test_profile_from_requests_orders_by_frequency_and_typical_covers() -> None:
    reqs = (
        [PodRequest("a", cpu_milli=1000, gpus=1, gpu_milli=500)] * 6
        + [PodRequest("b", cpu_milli=2000)] * 3
        + [PodRequest("c", gpus=2, gpu_models=("T4", "A100", "T4"))] * 1
    )
    profile = WorkloadProfile.from_requests(reqs)
    assert profile.shapes == (
        TypicalShape(1000, 500, 1),
        TypicalShape(2000, 0, 0),  # CPU-only pods have no GPU milli
        TypicalShape(0, 1000, 2, ("A100", "T4")),  # models sorted and deduplicated
    )
    assert profile.counts == (6.0, 3.0, 1.0)
    assert profile.typical(0.6) == [(profile.shapes[0], 1.0)]
    assert profile.typical(0.9) == [(profile.shapes[0], 6 / 9), (profile.shapes[1], 3 / 9)]
    assert [w for _, w in profile.typical(1.0)] == pytest.approx([0.6, 0.3, 0.1])
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError):
            profile.typical(bad)
    arr = profile.arrays(MODELS, 1.0)
    assert arr.access.shape == (len(MODELS), 3)
    assert arr.access[:, 2].tolist() == [True, True, False]  # A100 and T4 but not V100M32
    with pytest.raises(ValueError):
        WorkloadProfile((TypicalShape(0, 0, 0),), ())


# ---- GPU models ------------------------------------------------------------------------------------
def test_a_node_of_a_model_no_typical_shape_may_use_is_all_fragment() -> None:
    p = WorkloadProfile.from_requests(
        [PodRequest("a", cpu_milli=1000, gpus=1, gpu_milli=500, gpu_models=("A100",))] * 3
        + [PodRequest("t", cpu_milli=1000, gpus=1, gpu_models=("T4",))] * 2
        + [PodRequest("c", cpu_milli=1000)]
    ).arrays(MODELS, 1.0)
    left = np.array([[1000, 300], [1000, 300]])
    cpu = np.array([8000, 8000])
    model = np.array([MODELS.index("V100M32"), MODELS.index("T4")])
    for measure in (frag.node_fragmentation, frag.capacity_fragmentation):
        got = measure(left, cpu, model, p)
        assert got[0] == pytest.approx(1300)  # V100M32: nobody may use it
        # T4: the T4 shape (weight 2/6) uses the free GPU, leaving 300 as fragment.
        assert got[1] == pytest.approx(1300 * 4 / 6 + 300 * 2 / 6)


def test_shapes_differing_only_in_models_share_one_column() -> None:
    reqs = (
        [PodRequest("u", cpu_milli=1000, gpus=1, gpu_milli=500)] * 6
        + [PodRequest("t", cpu_milli=1000, gpus=1, gpu_milli=500, gpu_models=("T4",))] * 3
        + [PodRequest("l", cpu_milli=1000, gpus=1, gpu_milli=500, gpu_models=("T4", "V100M32"))] * 1
    )
    p = WorkloadProfile.from_requests(reqs).arrays(MODELS, 1.0)
    assert p.milli.tolist() == [500] and p.weight.tolist() == pytest.approx([1.0])
    # Share of the shape that may use each model: A100 6/10, T4 10/10, V100M32 7/10.
    assert p.access[:, 0].tolist() == pytest.approx([0.6, 1.0, 0.7])


def test_pinned_demand_counts_every_pod_confined_to_a_set() -> None:
    reqs = (
        [PodRequest("u", gpus=1)] * 5
        + [PodRequest("t", gpus=2, gpu_models=("T4",))] * 1  # 2 GPUs
        + [PodRequest("l", gpus=1, gpu_milli=500, gpu_models=("T4", "V100M32"))] * 2  # 1 GPU
        + [PodRequest("a", gpus=1, gpu_models=("A100", "T4", "V100M32"))]  # every model: unpinned
        + [PodRequest("c", cpu_milli=1000)] * 4
    )
    pinned = PinnedDemand.build(WorkloadProfile.from_requests(reqs), MODELS)
    got = {
        tuple(m for m, x in zip(MODELS, s, strict=True) if x): f
        for s, f in zip(pinned.sets, pinned.share, strict=True)
    }
    # 9 GPUs asked in all; {T4}: 2; {T4, V100M32}: its own 1 and T4's 2 (Hall's condition).
    assert got == pytest.approx({("T4",): 2 / 9, ("T4", "V100M32"): 3 / 9})
    assert PinnedDemand.build(WorkloadProfile.from_requests([PodRequest(gpus=1)]), MODELS).share.size == 0
