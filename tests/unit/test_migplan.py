"""The MIG layout planner: NVIDIA's placement rules per catalog, running instances never touched,
hysteresis, unservable demand explained, never worse than the template planner of today's peers,
and equal to a brute-force optimum on small cases (bench/mig_planner.py has the figures)."""

from __future__ import annotations

import itertools
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from neuronetes.mig import MigCatalog, MigLayout, PlacedInstance, catalog_for, catalogs
from neuronetes.mig_layout import first_layout
from neuronetes.migplan import GpuMigState, MigDemand, MigPlan, plan_mig_layouts

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from mig_planner import random_layout

pytestmark = pytest.mark.unit

NOW = 100_000.0
MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200")


def by_index(catalog: MigCatalog, *indices: int) -> list[str]:
    """Profile names by position in the catalog (0: 7g ... 4: the two-slice 1g, 5: 1g, 6: 1g+me)."""
    return [catalog.profiles[i].name for i in indices]


def demand_of(*profiles: str, model: str | None = None) -> list[MigDemand]:
    return [MigDemand(f"pod-{i}", p, model) for i, p in enumerate(profiles)]


def placed(plan: MigPlan) -> list[tuple[str, str, int]]:
    return [(p.gpu or "", p.instance.profile.name, p.instance.start) for p in plan.placements if p.instance]


# -- placement rules, per catalog ------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_a_4g_needs_slots_0_to_3_and_a_3g_goes_to_slot_4(model: str) -> None:
    catalog = catalog_for(model)
    four, three, one = by_index(catalog, 1, 2, 5)
    running = GpuMigState("gpu-0", catalog.empty_layout().place_at(one, 0), frozenset({0}))
    plan = plan_mig_layouts(demand_of(four, three), [running], now_s=NOW)
    assert placed(plan) == [("gpu-0", three, 4)]
    (refused,) = plan.unserved
    assert refused.demand.profile == four
    assert "without room beside running instances" in refused.reason
    assert plan.gpus[0].create == (PlacedInstance(catalog.profile(three), 4),)
    assert plan.gpus[0].destroy == ()


@pytest.mark.parametrize("model", MODELS)
def test_a_mix_that_first_fit_from_slot_0_misses_is_found(model: str) -> None:
    # 3g + 2g + two 1g fit one GPU only with the 3g at slot 4 (first fit from slot 0 strands a 1g).
    catalog = catalog_for(model)
    three, two, one = by_index(catalog, 2, 3, 5)
    gpu = GpuMigState("gpu-0", catalog.empty_layout())
    plan = plan_mig_layouts(demand_of(three, two, one, one), [gpu], now_s=NOW)
    assert plan.served == 4 and plan.gpus_used == 1
    target = plan.gpus[0].target
    assert PlacedInstance(catalog.profile(three), 4) in target.instances
    for inst in target:
        assert inst.start in inst.profile.starts


@pytest.mark.parametrize("catalog", catalogs(), ids=lambda c: c.gpu_model)
def test_every_profile_lands_on_an_allowed_start_slot(catalog: MigCatalog) -> None:
    for profile in catalog:
        plan = plan_mig_layouts(
            demand_of(*[profile.name] * profile.max_instances),
            [GpuMigState(f"gpu-{i}", catalog.empty_layout()) for i in range(2)],
            now_s=NOW,
        )
        for _, name, start in placed(plan):
            assert start in catalog.profile(name).starts
        # As many as one GPU holds, on one GPU (7 x 1g: the eighth slice is only for bigger profiles).
        per_gpu = min(profile.max_instances, 8 // profile.memory_slices, 7 // profile.compute_slices)
        assert plan.served == profile.max_instances
        assert plan.gpus_used == -(-profile.max_instances // per_gpu)


def test_only_one_media_extension_instance_per_gpu() -> None:
    catalog = catalog_for("A100-40GB")
    gpus = [GpuMigState(f"gpu-{i}", catalog.empty_layout()) for i in range(2)]
    plan = plan_mig_layouts(demand_of("1g.5gb+me", "1g.5gb+me"), gpus, now_s=NOW)
    assert sorted(gpu for gpu, _, _ in placed(plan)) == ["gpu-0", "gpu-1"]


def test_a_demand_restricted_to_a_model_goes_only_there() -> None:
    gpus = [
        GpuMigState("a100", catalog_for("A100-80GB").empty_layout()),
        GpuMigState("h100", catalog_for("H100-80GB").empty_layout()),
    ]
    plan = plan_mig_layouts(demand_of("1g.10gb", "1g.10gb", model="H100-80GB"), gpus, now_s=NOW)
    assert {gpu for gpu, _, _ in placed(plan)} == {"h100"}
    assert plan.gpus_used == 1


# -- never disturbing a running instance (property) ------------------------------------------------


def random_case(rng: random.Random, n_gpus: int, n_demand: int) -> tuple[list[MigDemand], list[GpuMigState]]:
    """GPUs of 1–2 models, partly used, idle with stale layouts, or re-laid out a minute ago."""
    models = rng.sample(MODELS, rng.randint(1, 2))
    gpus = []
    for i in range(n_gpus):
        layout = random_layout(rng, rng.choice(models), rng.randint(0, 4))
        in_use = frozenset(inst.start for inst in layout if rng.random() < 0.5)
        last = NOW - 60.0 if rng.random() < 0.15 else None
        gpus.append(GpuMigState(f"gpu-{i}", layout, in_use, last))
    demand = []
    for i in range(n_demand):
        catalog = catalog_for(rng.choice(models))
        profile = rng.choice(catalog.profiles[1:])  # 7g rarely fits beside anything
        model = catalog.gpu_model if rng.random() < 0.2 else None
        demand.append(MigDemand(f"pod-{i}", profile.name, model))
    return demand, gpus


def check_plan(plan: MigPlan, demand: Sequence[MigDemand], gpus: Sequence[GpuMigState]) -> None:
    """What every plan must hold, whatever the search."""
    by_id = {g.gpu: g for g in gpus}
    assert [g.gpu for g in plan.gpus] == [g.gpu for g in gpus]
    for g in plan.gpus:
        state = by_id[g.gpu]
        running = {inst for inst in state.layout if inst.start in state.in_use}
        assert set(g.in_use) == running
        assert running <= set(g.target.instances), "a running instance was removed or moved"
        assert not running & set(g.destroy)
        assert set(g.target.instances) == (set(state.layout.instances) - set(g.destroy)) | set(g.create)
        assert set(g.destroy) <= set(state.layout.instances) and not set(g.create) & set(
            state.layout.instances
        )
        if state.last_relayout_s is not None and NOW - state.last_relayout_s < 600:
            assert not g.changed, "re-laid out within the hysteresis interval"
    taken: set[tuple[str, PlacedInstance]] = set()
    for p, item in zip(plan.placements, demand, strict=True):
        assert p.demand == item
        if p.instance is None:
            assert p.reason
            continue
        assert p.gpu is not None and not p.reason
        target = next(g for g in plan.gpus if g.gpu == p.gpu)
        assert p.instance in target.target.instances and p.instance not in target.in_use
        assert p.instance.profile.name == item.profile
        if item.gpu_model is not None:
            assert target.target.catalog.gpu_model == item.gpu_model
        assert (p.gpu, p.instance) not in taken, "two demand items on one instance"
        taken.add((p.gpu, p.instance))


def test_running_instances_are_never_disturbed_and_plans_are_consistent() -> None:
    rng = random.Random(2028)
    for _ in range(300):
        demand, gpus = random_case(rng, rng.randint(1, 10), rng.randint(0, 24))
        for strategy in ("best", "templates"):
            plan = plan_mig_layouts(demand, gpus, now_s=NOW, strategy=strategy)
            check_plan(plan, demand, gpus)


# -- hysteresis --------------------------------------------------------------------------------------


def test_a_gpu_re_laid_out_recently_is_left_alone_until_the_interval_passes() -> None:
    catalog = catalog_for("A100-40GB")
    gpu = GpuMigState("gpu-0", catalog.layout_from_counts({"7g.40gb": 1}), last_relayout_s=NOW)
    demand = demand_of("1g.5gb")
    early = plan_mig_layouts(demand, [gpu], now_s=NOW + 599)
    assert early.served == 0 and not early.gpus[0].changed
    assert "re-laid out less than 600 s ago" in early.unserved[0].reason
    later = plan_mig_layouts(demand, [gpu], now_s=NOW + 600)
    assert later.served == 1
    assert later.gpus[0].destroy == tuple(gpu.layout.instances)
    shorter = plan_mig_layouts(demand, [gpu], now_s=NOW + 60, min_relayout_interval_s=30)
    assert shorter.served == 1


def test_a_gpu_within_the_interval_still_serves_from_its_idle_instances() -> None:
    catalog = catalog_for("H100-80GB")
    layout = catalog.layout_from_counts({"3g.40gb": 2})
    gpu = GpuMigState("gpu-0", layout, frozenset({0}), last_relayout_s=NOW)
    plan = plan_mig_layouts(demand_of("3g.40gb", "1g.10gb"), [gpu], now_s=NOW)
    assert placed(plan) == [("gpu-0", "3g.40gb", 4)]
    assert not plan.gpus[0].changed


# -- unservable demand, explained -------------------------------------------------------------------


def test_unservable_demand_says_why() -> None:
    a100 = catalog_for("A100-40GB")
    full = GpuMigState("gpu-0", a100.layout_from_counts({"7g.40gb": 1}), frozenset({0}))
    free = GpuMigState("gpu-1", a100.empty_layout())
    plan = plan_mig_layouts(
        [
            MigDemand("unknown", "9g.99gb"),
            MigDemand("no-h200", "1g.18gb", "H200"),
            MigDemand("wrong-model", "1g.10gb", "H100-80GB"),
            *demand_of(*["3g.20gb"] * 3),
        ],
        [full, free],
        now_s=NOW,
    )
    reasons = {p.demand.key: p.reason for p in plan.unserved}
    assert reasons["unknown"] == "'9g.99gb' is a MIG profile of no modelled GPU"
    assert reasons["no-h200"] == "no H200 GPU here offers MIG profile 1g.18gb"
    assert reasons["wrong-model"] == "no H100-80GB GPU here offers MIG profile 1g.10gb"
    assert plan.served == 2  # two 3g.20gb on the free GPU
    (third,) = (p for p in plan.unserved if p.demand.profile == "3g.20gb")
    assert third.reason == (
        "no room for 3g.20gb on the 2 GPU(s) offering it: "
        "1 without room beside running instances, 1 full with other demand"
    )


def test_bad_inputs_are_problems_not_exceptions() -> None:
    catalog = catalog_for("A100-80GB")
    layout = catalog.layout_from_counts({"1g.10gb": 1})
    gpus = [GpuMigState("gpu-0", layout, frozenset({0, 5})), GpuMigState("gpu-0", catalog.empty_layout())]
    plan = plan_mig_layouts(demand_of("1g.10gb"), gpus, now_s=NOW)
    assert plan.problems == (
        "GPU 'gpu-0': no instance starts at slot(s) [5] marked in use",
        "GPU 'gpu-0' is listed twice; the later entry is ignored",
    )
    assert len(plan.gpus) == 1 and plan.served == 1


# -- quality: never worse than the template planner, equal to the optimum on small cases -------------


def test_never_worse_than_the_first_fit_template_planner() -> None:
    rng = random.Random(7)
    better = 0
    for _ in range(300):
        demand, gpus = random_case(rng, rng.randint(2, 12), rng.randint(1, 30))
        ours = plan_mig_layouts(demand, gpus, now_s=NOW)
        theirs = plan_mig_layouts(demand, gpus, now_s=NOW, strategy="templates")
        assert (-ours.served, ours.gpus_used) <= (-theirs.served, theirs.gpus_used)
        better += (-ours.served, ours.gpus_used) < (-theirs.served, theirs.gpus_used)
    assert better > 100  # and strictly better in many cases


def brute_force(demand: Sequence[MigDemand], gpus: Sequence[GpuMigState]) -> tuple[int, int]:
    """(served, GPUs used) of the best plan: every item to every admitting GPU or nowhere."""
    fits_cache: dict[tuple[int, tuple[str, ...]], bool] = {}

    def fits(g: int, names: tuple[str, ...]) -> bool:
        key = (g, names)
        if key not in fits_cache:
            state = gpus[g]
            running = [inst for inst in state.layout if inst.start in state.in_use]
            if state.last_relayout_s is not None and NOW - state.last_relayout_s < 600:
                idle = Counter(inst.profile.name for inst in state.layout if inst.start not in state.in_use)
                fits_cache[key] = not Counter(names) - idle
            else:
                base = MigLayout(state.layout.catalog, tuple(running))
                wanted = [state.layout.catalog.profile(n) for n in names]
                fits_cache[key] = first_layout(base, wanted) is not None
        return fits_cache[key]

    def admits(g: int, item: MigDemand) -> bool:
        catalog = gpus[g].layout.catalog
        return item.profile in catalog.names and item.gpu_model in (None, catalog.gpu_model)

    choices = [[None, *(g for g in range(len(gpus)) if admits(g, item))] for item in demand]
    best = (0, -sum(1 for g in gpus if g.in_use))
    for assignment in itertools.product(*choices):
        per_gpu: dict[int, list[str]] = {}
        for item, g in zip(demand, assignment, strict=True):
            if g is not None:
                per_gpu.setdefault(g, []).append(item.profile)
        if all(fits(g, tuple(sorted(names))) for g, names in per_gpu.items()):
            used = sum(1 for g, state in enumerate(gpus) if state.in_use or g in per_gpu)
            best = max(best, (sum(map(len, per_gpu.values())), -used))
    return best[0], -best[1]


def test_equal_to_a_brute_force_optimum_on_small_cases() -> None:
    rng = random.Random(11)
    for _ in range(300):
        demand, gpus = random_case(rng, rng.randint(1, 3), rng.randint(1, 6))
        plan = plan_mig_layouts(demand, gpus, now_s=NOW)
        assert (plan.served, plan.gpus_used) == brute_force(demand, gpus), (demand, gpus)
