"""The MIG layout planner: new per-GPU MIG layouts that serve pending MIG demand.

Input: the pending demand (`MigDemand`: one GPU instance of a profile, possibly only on one GPU
model) and every MIG GPU's current layout (`GpuMigState`: the `MigLayout`, the instances that have
a running client or an allocation, when the GPU was last re-laid out). Output (`MigPlan`): per GPU a
target layout with the instances to create and to destroy, and per demand item the GPU instance that
serves it or one line saying why none can.

Guarantees:

* An instance with a running client or an allocation is never destroyed or moved: every target
  layout contains it at its slot. Only idle instances are destroyed, only free slots filled.
* Every target layout is valid for the GPU's model (`neuronetes.mig` catalogs: A100-40GB,
  A100-80GB, H100-80GB, H200; start slots, overlaps, per-profile maxima, compute, one ``+me``).
* Hysteresis: a GPU re-laid out less than ``min_relayout_interval_s`` ago (default 600 s) is not
  changed; it serves only from its idle instances. Any create or destroy counts as a relayout.
* Objective, in order: serve the most demand items; use the fewest GPUs (a GPU is used when it has
  an instance in use or serves an item: filling free slots of GPUs already in use comes before
  opening an idle one); create and destroy the fewest instances.
* The plan is never worse on (served, GPUs used) than the template planner of today's peers
  (`strategy="templates"`: a whole-GPU mig-parted template per idle GPU, first fit), which is one
  of the candidates.

Search (`strategy="best"`): the greedy planner of `neuronetes.migplan_greedy` with two scores
(memory slices first with model-restricted demand first, items first), its drain pass, and on the
better of the two the improvement pass (serve more by moving one or two items, then close opened
GPUs whose items fit elsewhere); on at most 16 GPUs, when that plan may not be optimal, the exact
search (exact in demand served and GPUs used) while it stays within ``exact_budget`` memoised
states; the template planner (`neuronetes.migplan_search`); the best of them wins.

Cost is bounded whatever the input (G GPUs, C demand classes): the exact search stops at its state
budget; the greedy opens at most one GPU per round, so at most G rounds of at most G evaluations
over at most 44 count vectors; the drain tries each opened GPU once against each used GPU; the
improvement pass stops after ``IMPROVE_BUDGET`` feasibility checks; choosing a target layout tries
at most 2^7 subsets of a GPU's idle instances.

The planner only plans. Applying a target layout (the node agent through NVML, or NVIDIA's
mig-manager through its ``mig-configs`` ConfigMap) is the caller's (docs/mig.md).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

from neuronetes.mig import MigCatalog, MigLayout, catalog_for, catalogs, normalize_profile_name
from neuronetes.mig_profiles import PlacedInstance, UnsupportedGpuError
from neuronetes.migplan_greedy import SCORES, greedy, improve
from neuronetes.migplan_search import (
    Assignment,
    Board,
    GpuSlot,
    Vector,
    assign,
    exact,
    key,
    maximal_additions,
    place,
    templates,
)

__all__ = [
    "DEFAULT_EXACT_BUDGET",
    "DEFAULT_MIN_RELAYOUT_INTERVAL_S",
    "DemandPlacement",
    "GpuLayoutPlan",
    "GpuMigState",
    "MigDemand",
    "MigPlan",
    "plan_mig_layouts",
]

DEFAULT_MIN_RELAYOUT_INTERVAL_S = 600.0
DEFAULT_EXACT_BUDGET = 500
"""Memoised states the exact search may visit inside `plan_mig_layouts` before it gives way."""
IMPROVE_BUDGET = 5_000
"""Feasibility checks the improvement pass may spend after each greedy plan."""

Strategy = Literal["best", "greedy", "templates", "exact"]


@dataclass(frozen=True, slots=True)
class MigDemand:
    """One pending GPU instance: `key` names it (a pod), `gpu_model` (a catalog model or a prefix
    such as ``"A100"``) restricts where it may go. `nodes` (None: any) and `gpu_uuid` (None: any)
    say on which nodes' GPUs, and on which GPU, the claim may run: `plan_mig_layouts` plans on the
    GPUs it is given and leaves them to its caller (`neuronetes.migdemand.plan_mig_demand` plans
    each such group on its own GPUs)."""

    key: str
    profile: str
    gpu_model: str | None = None
    nodes: frozenset[str] | None = None
    gpu_uuid: str | None = None


@dataclass(frozen=True, slots=True)
class GpuMigState:
    """One MIG GPU now: `in_use` holds the start slots of its instances with a running client or an
    allocation; `last_relayout_s` is when it was last re-laid out (the clock of ``now_s``)."""

    gpu: str
    layout: MigLayout
    in_use: frozenset[int] = frozenset()
    last_relayout_s: float | None = None


@dataclass(frozen=True, slots=True)
class GpuLayoutPlan:
    """A GPU's target layout and the instances to create and destroy to reach it; `in_use` are its
    instances with a client or an allocation, kept in place."""

    gpu: str
    current: MigLayout
    target: MigLayout
    create: tuple[PlacedInstance, ...]
    destroy: tuple[PlacedInstance, ...]
    in_use: tuple[PlacedInstance, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether the GPU is re-laid out."""
        return bool(self.create or self.destroy)


@dataclass(frozen=True, slots=True)
class DemandPlacement:
    """Where one demand item goes (`gpu`, `instance`), or `reason` why it cannot be served."""

    demand: MigDemand
    gpu: str | None = None
    instance: PlacedInstance | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class MigPlan:
    """The plan: `gpus` in input order, `placements` in demand order, `problems` (inputs ignored,
    one line each), `search` (which search's plan won)."""

    gpus: tuple[GpuLayoutPlan, ...]
    placements: tuple[DemandPlacement, ...]
    problems: tuple[str, ...]
    search: str

    @property
    def served(self) -> int:
        return sum(p.instance is not None for p in self.placements)

    @property
    def unserved(self) -> tuple[DemandPlacement, ...]:
        return tuple(p for p in self.placements if p.instance is None)

    @property
    def gpus_used(self) -> int:
        """GPUs with an instance in use after the plan (running, allocated or newly served)."""
        serving = {p.gpu for p in self.placements if p.gpu is not None}
        return sum(1 for g in self.gpus if g.gpu in serving or g.in_use)

    @property
    def changes(self) -> int:
        """Instances created plus instances destroyed."""
        return sum(len(g.create) + len(g.destroy) for g in self.gpus)


def _eligible_models(restriction: str | None) -> frozenset[str] | None:
    """The catalog models a restriction admits (``None``: all): a model's own spelling, or a prefix
    (``"A100"``: both A100s). Either way the admitted sets nest or are disjoint."""
    if restriction is None:
        return None
    try:
        return frozenset({catalog_for(restriction).gpu_model})
    except UnsupportedGpuError:
        text = restriction.upper().removeprefix("NVIDIA ").replace(" ", "-")
        return frozenset(c.gpu_model for c in catalogs() if c.gpu_model.upper().startswith(text))


@dataclass(frozen=True, slots=True)
class _Class:
    """Demand items alike: one profile name, one set of admitted models."""

    profile: str
    models: frozenset[str] | None
    label: str  # the model restriction as the demand spelled it

    def admits(self, catalog: MigCatalog) -> bool:
        return self.profile in _names_of(catalog.gpu_model) and (
            self.models is None or catalog.gpu_model in self.models
        )


@cache
def _names_of(model: str) -> frozenset[str]:
    return frozenset(catalog_for(model).names)


def _checked_gpus(gpus: Sequence[GpuMigState]) -> tuple[list[tuple[GpuMigState, frozenset[int]]], list[str]]:
    """The GPUs to plan with the starts of their instances in use; duplicates and unknown starts are
    problems (a start in use that holds no instance is dropped)."""
    problems: list[str] = []
    seen: set[str] = set()
    kept: list[tuple[GpuMigState, frozenset[int]]] = []
    for state in gpus:
        if state.gpu in seen:
            problems.append(f"GPU {state.gpu!r} is listed twice; the later entry is ignored")
            continue
        seen.add(state.gpu)
        starts = {inst.start for inst in state.layout}
        unknown = sorted(state.in_use - starts)
        if unknown:
            problems.append(f"GPU {state.gpu!r}: no instance starts at slot(s) {unknown} marked in use")
        kept.append((state, state.in_use & frozenset(starts)))
    return kept, problems


def _slot(
    state: GpuMigState,
    in_use: frozenset[int],
    classes: list[_Class],
    by_profile: dict[str, list[int]],
    frozen: bool,
) -> GpuSlot:
    """The GPU as the searches see it; `by_profile` lists the classes of each profile name, the
    scarcest first."""
    catalog = state.layout.catalog
    busy = frozenset(inst for inst in state.layout if inst.start in in_use)
    idle_instances = [inst for inst in state.layout if inst.start not in in_use]
    idle_counts = Counter(inst.profile.name for inst in idle_instances)
    idle: Vector = tuple(idle_counts[name] for name in catalog.names)
    maximal = (idle,) if frozen else maximal_additions(catalog.gpu_model, busy)
    by_name = tuple(
        tuple(k for k in by_profile.get(name, ()) if classes[k].admits(catalog)) for name in catalog.names
    )
    # Idle GPUs free to be re-laid out differ only in the instances they would reuse (a tie-break).
    layout_key = (
        "idle"
        if not busy and not frozen
        else ",".join(f"{i.profile.name}@{i.start}{'*' if i in busy else ''}" for i in state.layout)
    )
    return GpuSlot(
        catalog, maximal, idle, bool(busy), frozen, by_name, f"{catalog.gpu_model}|{layout_key}|{frozen}"
    )


def _surely_best(board: Board, candidates: list[tuple[str, Assignment]]) -> bool:
    """Whether a candidate serves everything without opening a GPU (no plan can do better)."""
    floor = (-sum(board.demand), sum(1 for g in board.gpus if g.in_use))
    return any(key(board, a)[:2] == floor for _, a in candidates)


def _target(
    state: GpuMigState, in_use: frozenset[int], want: Counter[str]
) -> tuple[MigLayout, list[PlacedInstance]]:
    """The layout holding the instances in use and `want` more idle ones per name with the fewest
    instances created plus destroyed (keeping idle instances where they fit), and the idle instances
    that serve `want`."""
    busy = [inst for inst in state.layout if inst.start in in_use]
    idle = [inst for inst in state.layout if inst.start not in in_use]
    candidates = []
    for r in range(len(idle), -1, -1):
        for keep in itertools.combinations(idle, r):
            kept = Counter(inst.profile.name for inst in keep)
            created = sum(max(0, n - kept[name]) for name, n in want.items())
            candidates.append((created + len(idle) - r, -r, keep))
    candidates.sort(key=lambda c: (c[0], c[1]))
    catalog = state.layout.catalog
    for _, _, keep in candidates:
        kept = Counter(inst.profile.name for inst in keep)
        missing = [catalog.profile(name) for name, n in want.items() for _ in range(max(0, n - kept[name]))]
        added = place((*busy, *keep), missing)
        if added is not None:
            serving: list[PlacedInstance] = []
            for name, n in want.items():
                ours = [i for i in keep if i.profile.name == name] + [
                    i for i in added if i.profile.name == name
                ]
                serving += ours[:n]
            return MigLayout(catalog, (*busy, *keep, *added)), serving
    raise AssertionError("a served vector always fits once every idle instance is destroyed")


def _why_unserved(cls: _Class, slots: list[GpuSlot], interval_s: float) -> str:
    """One line: why no GPU serves an item of `cls`."""
    where = f"{cls.label} GPU" if cls.label else "GPU"
    if not any(cls.profile in c.names for c in catalogs()):
        return f"{cls.profile!r} is a MIG profile of no modelled GPU"
    offering = [s for s in slots if cls.admits(s.catalog)]
    if not offering:
        return f"no {where} here offers MIG profile {cls.profile}"
    pi = {id(s): s.catalog.names.index(cls.profile) for s in offering}
    frozen = sum(1 for s in offering if s.frozen)
    walled = sum(
        1 for s in offering if not s.frozen and s.in_use and not any(v[pi[id(s)]] for v in s.maximal)
    )
    full = len(offering) - frozen - walled
    parts = [
        f"{frozen} re-laid out less than {interval_s:g} s ago" if frozen else "",
        f"{walled} without room beside running instances" if walled else "",
        f"{full} full with other demand" if full else "",
    ]
    return f"no room for {cls.profile} on the {len(offering)} {where}(s) offering it: " + ", ".join(
        p for p in parts if p
    )


def plan_mig_layouts(
    demand: Sequence[MigDemand],
    gpus: Sequence[GpuMigState],
    *,
    now_s: float,
    min_relayout_interval_s: float = DEFAULT_MIN_RELAYOUT_INTERVAL_S,
    strategy: Strategy = "best",
    exact_budget: int = DEFAULT_EXACT_BUDGET,
) -> MigPlan:
    """Plan per-GPU MIG layouts serving `demand` (the module docstring states the guarantees).

    `strategy` picks the search: ``"best"`` (the product), or one alone for comparison:
    ``"greedy"``, ``"templates"`` (today's peers), ``"exact"`` (with `exact_budget` states; past it
    the plan is the greedy one and `MigPlan.search` says ``"greedy"``). With ``"best"``, the exact
    search runs on at most 16 GPUs, and only when the greedy plan leaves demand unserved or opens a
    GPU.
    """
    checked, problems = _checked_gpus(gpus)
    classes: list[_Class] = []
    class_of: list[int] = []
    for item in demand:
        cls = _Class(
            normalize_profile_name(item.profile), _eligible_models(item.gpu_model), item.gpu_model or ""
        )
        if cls not in classes:
            classes.append(cls)
        class_of.append(classes.index(cls))
    counts = Counter(class_of)
    eligible = [sum(1 for state, _ in checked if c.admits(state.layout.catalog)) for c in classes]
    frozen = [
        s.last_relayout_s is not None and now_s - s.last_relayout_s < min_relayout_interval_s
        for s, _ in checked
    ]
    scarce = tuple(sorted(range(len(classes)), key=lambda k: (eligible[k], k)))
    by_profile: dict[str, list[int]] = {}
    for k in scarce:
        by_profile.setdefault(classes[k].profile, []).append(k)
    slots = [_slot(s, u, classes, by_profile, f) for (s, u), f in zip(checked, frozen, strict=True)]
    board = Board(tuple(slots), tuple(counts[k] for k in range(len(classes))), scarce)

    candidates: list[tuple[str, Assignment]] = []
    if strategy in ("best", "greedy") or strategy == "exact":
        everything = frozenset(range(len(classes)))
        restricted = frozenset(k for k, c in enumerate(classes) if c.models is not None)
        tierings = [[everything]] + ([[restricted, everything]] if restricted else [])
        # Two runs: memory slices first (the scarce classes first when some are restricted), items first.
        greedy_plans = [
            assign(board, greedy(board, score, tiers, {}))
            for score, tiers in ((SCORES[0], tierings[-1]), (SCORES[1], tierings[0]))
        ]
        best_greedy = min(greedy_plans, key=lambda a: key(board, a))
        improve(board, best_greedy, IMPROVE_BUDGET)
        candidates.append(("greedy", best_greedy))
    if strategy == "exact" or (
        strategy == "best" and len(slots) <= 16 and not _surely_best(board, candidates)
    ):
        found = exact(board, exact_budget)
        if found is not None:
            candidates.insert(0, ("exact", assign(board, found)))
    if strategy in ("best", "templates"):
        candidates.append(("templates", assign(board, templates(board))))
    search, assignment = min(candidates, key=lambda c: key(board, c[1]))

    # Items to GPUs, in demand order within each class.
    waiting = [[i for i, k in enumerate(class_of) if k == c] for c in range(len(classes))]
    served_by: dict[int, tuple[int, str]] = {}
    wants: list[Counter[str]] = [Counter() for _ in slots]
    for g, row in enumerate(assignment):
        for k, n in enumerate(row):
            for _ in range(n):
                served_by[waiting[k].pop(0)] = (g, classes[k].profile)
                wants[g][classes[k].profile] += 1

    plans: list[GpuLayoutPlan] = []
    serving: list[dict[str, list[PlacedInstance]]] = []
    for (state, in_use), want in zip(checked, wants, strict=True):
        busy = tuple(inst for inst in state.layout if inst.start in in_use)
        target, instances = _target(state, in_use, want) if want else (state.layout, [])
        by_name: dict[str, list[PlacedInstance]] = {}
        for inst in instances:
            by_name.setdefault(inst.profile.name, []).append(inst)
        serving.append(by_name)
        create = tuple(i for i in target if i not in state.layout.instances)
        destroy = tuple(i for i in state.layout if i not in target.instances)
        plans.append(GpuLayoutPlan(state.gpu, state.layout, target, create, destroy, busy))

    placements: list[DemandPlacement] = []
    reasons: dict[int, str] = {}
    for i, item in enumerate(demand):
        if i in served_by:
            g, name = served_by[i]
            placements.append(DemandPlacement(item, plans[g].gpu, serving[g][name].pop(0)))
        else:
            k = class_of[i]
            if k not in reasons:
                reasons[k] = _why_unserved(classes[k], slots, min_relayout_interval_s)
            placements.append(DemandPlacement(item, reason=reasons[k]))
    return MigPlan(tuple(plans), tuple(placements), tuple(problems), search)
