"""The searches behind `neuronetes.migplan`: what one GPU can still hold, and the plans over many GPUs.

Everything here works on *count vectors*: instances per profile name, in the order of the GPU's
catalog (`MigCatalog.names`). A GPU's possible additions are the count vectors of the full layouts
(valid, nothing more fits) that contain its running instances, minus those instances. What it can
add is closed downwards (removing an instance from a valid layout leaves a valid layout), so it is
described by its maximal vectors, and "what this GPU can serve of the remaining demand" is
``min(v, available)`` over those maximal ``v``.

Beside the greedy planner (`neuronetes.migplan_greedy`), two planners over a `Board` (the GPUs and
the demand classes), each returning one count vector per GPU (what it serves):

* `templates`: today's peers: a GPU with running instances serves only from its idle instances, an
  idle GPU takes the one mig-parted template (``all-<profile>``, ``all-balanced``) serving the most;
* `exact`: depth-first search over the GPUs with memoised remaining demand; exact in (demand
  served, GPUs used) and bounded by a state budget (``None`` once the budget is spent).

`assign` turns such vectors into items per demand class, `key` ranks the result, and `place` finds
start slots for the instances a GPU must create.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import numpy.typing as npt

from neuronetes.mig import MigCatalog, catalog_for
from neuronetes.mig_profiles import COMPUTE_SLICES, MEMORY_SLICES, MigProfile, PlacedInstance

__all__ = [
    "Assignment",
    "Board",
    "GpuSlot",
    "Plan",
    "Vector",
    "assign",
    "exact",
    "key",
    "maximal_additions",
    "place",
    "profile_index",
    "templates",
    "vector_of",
]

Vector = tuple[int, ...]
"""Instances per profile name, in the catalog's order."""


@cache
def _full_layouts(model: str) -> tuple[tuple[int, Vector], ...]:
    """Every full layout of a GPU of `model` (valid, and no instance can be added), as (placement
    bits, count vector); a layout's possible additions are dominated by those of the full layouts
    that contain it.

    A placement's bit is ``1 << (profile_index * MEMORY_SLICES + start)``. Validity is a property of
    the set (start slots, no overlap, per-profile maximum, one ``+me``, compute), so a depth-first
    walk adding placements in increasing index order visits each valid set once.
    """
    catalog = catalog_for(model)
    placements = [
        (pi * MEMORY_SLICES + start, pi, sum(1 << s for s in p.slots(start)), p)
        for pi, p in enumerate(catalog.profiles)
        for start in p.starts
    ]
    found: list[tuple[int, Vector]] = []

    def walk(first: int, chosen: int, mask: int, compute: int, counts: list[int], me: bool) -> None:
        full = not any(
            not slots & mask
            and compute + profile.compute_slices <= COMPUTE_SLICES
            and counts[pi] < profile.max_instances
            and not (profile.media_extensions and me)
            for _, pi, slots, profile in placements
        )
        if full:
            found.append((chosen, tuple(counts)))
        for i in range(first, len(placements)):
            index, pi, slots, profile = placements[i]
            if slots & mask or compute + profile.compute_slices > COMPUTE_SLICES:
                continue
            if counts[pi] >= profile.max_instances or (profile.media_extensions and me):
                continue
            counts[pi] += 1
            walk(
                i + 1,
                chosen | 1 << index,
                mask | slots,
                compute + profile.compute_slices,
                counts,
                me or profile.media_extensions,
            )
            counts[pi] -= 1

    walk(0, 0, 0, 0, [0] * len(catalog.profiles), False)
    return tuple(found)


def _maximal(vectors: set[Vector]) -> tuple[Vector, ...]:
    """The vectors no other vector of the set dominates, largest total first."""
    ordered = sorted(vectors, key=lambda v: -sum(v))
    kept: list[Vector] = []
    for v in ordered:
        if not any(all(a >= b for a, b in zip(k, v, strict=True)) for k in kept):
            kept.append(v)
    return tuple(kept)


@cache
def maximal_additions(model: str, kept: frozenset[PlacedInstance]) -> tuple[Vector, ...]:
    """The maximal count vectors a GPU of `model` can add beside the instances in `kept`."""
    catalog = catalog_for(model)
    index_of = {p.name: i for i, p in enumerate(catalog.profiles)}
    need = sum(1 << (index_of[inst.profile.name] * MEMORY_SLICES + inst.start) for inst in kept)
    base = [0] * len(catalog.profiles)
    for inst in kept:
        base[index_of[inst.profile.name]] += 1
    return _maximal(
        {
            tuple(c - b for c, b in zip(counts, base, strict=True))
            for chosen, counts in _full_layouts(model)
            if chosen & need == need
        }
    )


@cache
def profile_index(model: str) -> dict[str, int]:
    """Profile index by name."""
    return {p.name: i for i, p in enumerate(catalog_for(model).profiles)}


@cache
def _sizes(model: str) -> Vector:
    return tuple(p.memory_slices for p in catalog_for(model).profiles)


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU as the searches see it.

    Attributes:
        catalog: its model's catalog.
        maximal: the maximal count vectors it may serve (for a GPU within its hysteresis interval,
            only its idle instances' counts).
        idle: its instances without a client, as a count vector (served from these, nothing changes).
        in_use: it has an instance with a client or an allocation (it is used whatever the plan).
        frozen: re-laid out within the hysteresis interval: it serves only from its idle instances.
        classes: per profile index, the demand classes it can serve with that profile, the class
            with the fewest eligible GPUs first (serving the scarcest class first loses nothing
            when the classes' eligible sets nest, as model restrictions by name prefix do).
        shape: equal for GPUs the searches may treat as interchangeable: same model and same
            options (idle GPUs free to be re-laid out differ only in the instances they would reuse).
    """

    catalog: MigCatalog
    maximal: tuple[Vector, ...]
    idle: Vector
    in_use: bool
    frozen: bool
    classes: tuple[tuple[int, ...], ...]
    shape: str
    profile_index: dict[int, int] = field(init=False, repr=False, compare=False)
    fit_cache: dict[Vector, bool] = field(init=False, repr=False, compare=False)
    option_cache: dict[Vector, tuple[Vector, ...]] = field(init=False, repr=False, compare=False)
    array: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {k: pi for pi, ks in enumerate(self.classes) for k in ks}
        object.__setattr__(self, "profile_index", index)
        object.__setattr__(self, "fit_cache", {})
        object.__setattr__(self, "option_cache", {})
        object.__setattr__(
            self, "array", np.array(self.maximal, dtype=np.int64).reshape(len(self.maximal), -1)
        )

    def fits(self, v: Vector) -> bool:
        """Whether it can serve `v` (some maximal vector dominates it)."""
        known = self.fit_cache.get(v)
        if known is None:
            known = bool((self.array >= np.array(v)).all(axis=1).any())
            self.fit_cache[v] = known
        return known

    def available(self, remaining: Sequence[int]) -> Vector:
        """Per profile index, the remaining demand this GPU could serve with that profile."""
        return tuple(sum(remaining[k] for k in ks) for ks in self.classes)

    def options(self, remaining: Sequence[int]) -> tuple[Vector, ...]:
        """The maximal vectors it may serve of `remaining`, capped by what is asked (deduplicated)."""
        avail = self.available(remaining)
        known = self.option_cache.get(avail)
        if known is None:
            known = _maximal({tuple(map(min, v, avail)) for v in self.maximal})
            self.option_cache[avail] = known
        return known

    @property
    def sizes(self) -> Vector:
        """Memory slices per profile index."""
        return _sizes(self.catalog.gpu_model)

    def created(self, served: Vector) -> int:
        """Instances it must create to serve `served` (those its idle instances do not cover)."""
        if not any(self.idle):
            return sum(served)
        return sum(s - i for s, i in zip(served, self.idle, strict=True) if s > i)

    def take(self, served: Vector, remaining: list[int]) -> None:
        """Take `served` from `remaining`, scarcest class first."""
        for pi, count in enumerate(served):
            for k in self.classes[pi]:
                n = min(count, remaining[k])
                remaining[k] -= n
                count -= n

    def profile_of(self, k: int) -> int:
        """The profile index serving class `k` here (-1: this GPU does not admit the class)."""
        return self.profile_index.get(k, -1)


@dataclass(frozen=True, slots=True)
class Board:
    """The GPUs and the demand: `demand[k]` items of class k; `scarce` lists the classes, the one
    with the fewest admitting GPUs first."""

    gpus: tuple[GpuSlot, ...]
    demand: Vector
    scarce: tuple[int, ...]


Assignment = list[list[int]]
"""Items of each class (inner index) that each GPU (outer index) serves."""


def assign(board: Board, plan: Sequence[Vector]) -> Assignment:
    """Turn per-GPU count vectors into items per class: the scarcest class first, GPUs in order (the
    classes' admitting sets nest, so a scarcer class never takes what only a broader one could use)."""
    remaining = list(board.demand)
    out = [[0] * len(board.demand) for _ in board.gpus]
    room = [list(v) for v in plan]
    for k in board.scarce:
        for g, gpu in enumerate(board.gpus):
            pi = gpu.profile_of(k)
            if pi >= 0 and remaining[k] and room[g][pi]:
                n = min(remaining[k], room[g][pi])
                out[g][k] += n
                room[g][pi] -= n
                remaining[k] -= n
    return out


def vector_of(gpu: GpuSlot, row: Sequence[int]) -> Vector:
    """The count vector of the classes a GPU serves."""
    return tuple(sum(row[k] for k in ks) for ks in gpu.classes)


def key(board: Board, assignment: Assignment) -> tuple[int, int, int]:
    """(-served, GPUs used, instances created) of an assignment: the least is the best."""
    served = sum(map(sum, assignment))
    used = sum(1 for gpu, row in zip(board.gpus, assignment, strict=True) if gpu.in_use or any(row))
    created = sum(gpu.created(vector_of(gpu, row)) for gpu, row in zip(board.gpus, assignment, strict=True))
    return (-served, used, created)


def place(fixed: Sequence[PlacedInstance], missing: Sequence[MigProfile]) -> list[PlacedInstance] | None:
    """Start slots for `missing` beside `fixed` (all of one catalog), or ``None`` when they do not fit.

    Depth first over the missing profiles, largest first, on bit masks of the memory slices.
    """
    todo = sorted(missing, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    mask = sum(1 << s for inst in fixed for s in inst.slots)
    compute = sum(inst.profile.compute_slices for inst in fixed)
    counts = Counter(inst.profile.name for inst in fixed)
    me = any(inst.profile.media_extensions for inst in fixed)
    if compute + sum(p.compute_slices for p in todo) > COMPUTE_SLICES:
        return None
    if (me and any(p.media_extensions for p in todo)) or sum(p.media_extensions for p in todo) > 1:
        return None
    if any(counts[p.name] + n > p.max_instances for p, n in Counter(todo).items()):
        return None
    chosen: list[PlacedInstance] = []

    def walk(i: int, mask: int) -> bool:
        if i == len(todo):
            return True
        profile = todo[i]
        # Equal profiles go in increasing start order: each set of starts is tried once.
        low = chosen[-1].start + 1 if i and todo[i - 1] == profile else 0
        for start in profile.starts:
            bits = sum(1 << s for s in profile.slots(start))
            if start < low or bits & mask:
                continue
            chosen.append(PlacedInstance(profile, start))
            if walk(i + 1, mask | bits):
                return True
            chosen.pop()
        return False

    return chosen if walk(0, mask) else None


Plan = list[Vector]
"""One count vector per GPU: what each serves."""


def _template_vectors(catalog: MigCatalog) -> list[Vector]:
    """mig-parted's stock configs for one GPU: ``all-<profile>`` per profile (as many as fit) and
    ``all-balanced`` (two of the smallest, one 2g, one 3g)."""
    size = len(catalog.profiles)
    configs: list[Vector] = []
    for pi, profile in enumerate(catalog.profiles):
        if profile.media_extensions:
            continue
        n = min(
            profile.max_instances,
            MEMORY_SLICES // profile.memory_slices,
            COMPUTE_SLICES // profile.compute_slices,
        )
        configs.append(tuple(n if i == pi else 0 for i in range(size)))
    configs.append((0, 0, 1, 1, 0, 2, 0))
    return configs


def templates(board: Board) -> Plan:
    """Today's peers: one whole-GPU template per idle GPU, first fit, GPUs in order."""
    remaining = list(board.demand)
    plan: Plan = []
    for gpu in board.gpus:
        avail = gpu.available(remaining)
        if gpu.in_use or gpu.frozen:  # a whole-GPU config would remove the running instances
            served = tuple(map(min, gpu.idle, avail))
        else:
            choices = [gpu.idle, *_template_vectors(gpu.catalog)]
            served = max((tuple(map(min, v, avail)) for v in choices), key=sum)
        plan.append(served)
        gpu.take(served, remaining)
    return plan


def exact(board: Board, budget: int) -> Plan | None:
    """The plan that serves the most demand, then uses the fewest GPUs; ``None`` past `budget` states.

    Exact in those two keys: on a GPU that is used, serving a maximal option of the remaining demand
    loses nothing (an instance served later or never can move onto it without using another GPU),
    so only maximal options and "unused" are branched on; interchangeable idle GPUs are opened in
    order. The third key, instances created, is only minimised among those branches.
    """
    order = sorted(range(len(board.gpus)), key=lambda i: (board.gpus[i].shape, i))
    gpus = [board.gpus[i] for i in order]
    # Keys are (-served, used, created): the least is the best.
    memo: dict[tuple[int, Vector, bool], tuple[tuple[int, int, int], tuple[Vector, ...]]] = {}
    spent = 0

    def solve(
        i: int, remaining: Vector, prev_unused: bool
    ) -> tuple[tuple[int, int, int], tuple[Vector, ...]]:
        nonlocal spent
        if i == len(gpus) or not any(remaining):
            return (0, 0, 0), ()
        key = (i, remaining, prev_unused)
        if key in memo:
            return memo[key]
        spent += 1
        if spent > budget:
            raise _BudgetSpent
        gpu = gpus[i]
        same_as_prev = i > 0 and gpus[i - 1].shape == gpu.shape
        choices: list[tuple[tuple[int, int, int], tuple[Vector, ...]]] = []
        zero = (0,) * len(gpu.catalog.profiles)
        if not gpu.in_use:
            total, rest = solve(i + 1, remaining, True)
            choices.append((total, (zero, *rest)))
        if not (prev_unused and same_as_prev and not gpu.in_use):
            for option in gpu.options(remaining):
                if not any(option) and not gpu.in_use:
                    continue
                after = list(remaining)
                gpu.take(option, after)
                (lost, used, created), rest = solve(i + 1, tuple(after), False)
                total = (lost - sum(option), used + (0 if gpu.in_use else 1), created + gpu.created(option))
                choices.append((total, (option, *rest)))
        best = min(choices, key=lambda c: c[0]) if choices else ((0, 0, 0), (zero,))
        memo[key] = best
        return best

    try:
        _, vectors = solve(0, board.demand, False)
    except _BudgetSpent:
        return None
    plan: Plan = [(0,) * len(g.catalog.profiles) for g in board.gpus]
    for position, vector in enumerate(vectors):
        plan[order[position]] = vector
    return plan


class _BudgetSpent(Exception):
    """The exact search's state budget ran out (caught in `exact`)."""
