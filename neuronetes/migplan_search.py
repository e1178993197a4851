"""The searches behind `neuronetes.migplan`: what one GPU can still hold, and the plans over many GPUs.

Everything here works on *count vectors*: instances per profile name, in the order of the GPU's
catalog (`MigCatalog.names`). A GPU's possible additions are the count vectors of the valid layouts
that contain its kept instances, minus those instances; the set is closed downwards (removing an
instance from a valid layout leaves a valid layout), so it is described by its maximal vectors, and
"what this GPU can serve of the remaining demand" is ``min(v, available)`` over those maximal ``v``.

Three planners over a `Board` (the GPUs and the demand classes), each returning one count vector per
GPU (what it serves):

* `greedy`: fill the GPUs already in use, then open idle GPUs one at a time, each time the one
  whose best option serves the most, then `drain` opened GPUs whose work fits elsewhere;
* `templates`: today's peers: a GPU with running instances serves only from its idle instances, an
  idle GPU takes the one mig-parted template (``all-<profile>``, ``all-balanced``) serving the most;
* `exact`: depth-first search over the GPUs with memoised remaining demand; exact in (demand
  served, GPUs used) and bounded by a state budget (``None`` once the budget is spent).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from operator import add, mul, sub

import numpy as np
import numpy.typing as npt

from neuronetes.mig import MigCatalog, catalog_for
from neuronetes.mig_profiles import COMPUTE_SLICES, MEMORY_SLICES, MigProfile, PlacedInstance

__all__ = [
    "Assignment",
    "Board",
    "GpuSlot",
    "Vector",
    "assign",
    "exact",
    "greedy",
    "improve",
    "key",
    "maximal_additions",
    "place",
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
def _names(model: str) -> dict[str, int]:
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


class _Mover:
    """Moves items between GPUs for `improve`, counting feasibility checks against a budget.

    `closing` is a GPU nothing may go to; with `may_open` false, nothing goes to an unused GPU.
    """

    def __init__(self, board: Board, assignment: Assignment, budget: int) -> None:
        self.gpus = board.gpus
        self.assignment = assignment
        self.vectors = [list(vector_of(g, row)) for g, row in zip(self.gpus, assignment, strict=True)]
        self.budget = budget
        self.closing = -1
        self.may_open = True
        self.homes: dict[int, list[int]] = {}  # per class: GPUs with room for one more (a cache)

    def used(self, g: int) -> bool:
        return self.gpus[g].in_use or any(self.vectors[g])

    def hosts(self, k: int) -> list[int]:
        """GPUs that may take an item of class `k`, used ones first."""
        return sorted(
            (
                g
                for g in range(len(self.gpus))
                if self.gpus[g].profile_of(k) >= 0 and g != self.closing and (self.may_open or self.used(g))
            ),
            key=lambda g: (not self.used(g), g),
        )

    def fits(self, g: int, change: Sequence[tuple[int, int]]) -> bool:
        self.budget -= 1
        trial = self.vectors[g][:]
        for k, delta in change:
            trial[self.gpus[g].profile_of(k)] += delta
        return self.gpus[g].fits(tuple(trial))

    def move(self, g: int, k: int, delta: int) -> None:
        self.vectors[g][self.gpus[g].profile_of(k)] += delta
        self.assignment[g][k] += delta

    def rehome(self, g: int, k: int) -> int | None:
        """A GPU other than `g` with room for one more item of class `k`."""
        if k not in self.homes:
            self.homes[k] = [h for h in self.hosts(k) if self.fits(h, [(k, 1)])]
        return next((h for h in self.homes[k] if h != g and self.fits(h, [(k, 1)])), None)

    def place(self, k: int) -> bool:
        """Put one more item of class `k` somewhere, moving one or two others if need be."""
        hosts = self.hosts(k)
        for g in hosts:
            if self.fits(g, [(k, 1)]):
                self.move(g, k, 1)
                self.homes.clear()
                return True
        for size in (1, 2):
            for g in hosts:
                present = [m for m, n in enumerate(self.assignment[g]) if n and m != k]
                for out in itertools.combinations_with_replacement(present, size):
                    if self.budget <= 0:
                        return False
                    if any(self.assignment[g][m] < out.count(m) for m in out):
                        continue
                    if not self.fits(g, [(k, 1), *((m, -1) for m in out)]):
                        continue
                    moved: list[tuple[int, int]] = []
                    for m in out:
                        h = self.rehome(g, m)
                        if h is None:
                            break
                        self.move(h, m, 1)
                        moved.append((h, m))
                    if len(moved) == len(out):
                        for m in out:
                            self.move(g, m, -1)
                        self.move(g, k, 1)
                        self.homes.clear()
                        return True
                    for h, m in moved:
                        self.move(h, m, -1)
        return False


def improve(board: Board, assignment: Assignment, budget: int) -> None:
    """Serve more, then use fewer GPUs.

    Serve more: put each unserved item on a GPU where it fits, or where it fits once one or two
    items of other classes move to other GPUs (used GPUs tried first). Use fewer: empty each opened
    idle GPU (fewest items first) by placing its items on the other used GPUs the same way, and
    keep the result only when all of them found a place.

    Bounded: at most `budget` feasibility checks in all, and a class that found no place is not
    tried again (its other items would fail the same way).
    """
    mover = _Mover(board, assignment, budget)
    remaining = [d - sum(row[k] for row in assignment) for k, d in enumerate(board.demand)]
    for k in board.scarce:
        while remaining[k] > 0 and mover.budget > 0 and mover.place(k):
            remaining[k] -= 1
    mover.may_open = False
    opened = [g for g, gpu in enumerate(board.gpus) if not gpu.in_use and any(assignment[g])]
    for g in sorted(opened, key=lambda g: (sum(assignment[g]), g)):
        if mover.budget <= 0:
            break
        saved = [row[:] for row in assignment], [v[:] for v in mover.vectors]
        items = [k for k, n in enumerate(assignment[g]) for _ in range(n)]
        for k in items:
            mover.move(g, k, -1)
        mover.closing, mover.homes = g, {}
        emptied = all(mover.place(k) for k in items)
        mover.closing, mover.homes = -1, {}
        if not emptied:
            for row, old in zip(assignment, saved[0], strict=True):
                row[:] = old
            mover.vectors = saved[1]


Plan = list[Vector]
Score = bool
"""How the greedy ranks what a GPU would serve: ``True`` memory slices filled first, then items;
``False`` items first, then memory slices. Ties go to the vector creating the fewest instances."""

SCORES: tuple[Score, ...] = (True, False)

_Memo = dict[tuple[str, Vector, Vector], tuple[tuple[int, int, int], Vector]]


def _best(
    gpu: GpuSlot, remaining: Sequence[int], slots_first: Score, base: Vector, memo: _Memo
) -> tuple[tuple[int, int, int], Vector]:
    """What `gpu`, already serving `base`, should serve with `remaining` as well, and its key (the
    score, then fewest instances created); `memo` (one per score) remembers it by shape and demand.
    Ties go to the first of `gpu.maximal`, as a loop over them would."""
    avail = tuple(map(add, gpu.available(remaining), base))
    memo_key = (gpu.shape, avail, base)
    if memo_key in memo:
        return memo[memo_key]
    sizes = np.array(gpu.sizes, dtype=np.int64)
    vectors = gpu.array
    if any(base):
        vectors = vectors[(vectors >= np.array(base)).all(axis=1)]
    capped = np.minimum(vectors, np.array(avail))
    slots, count = capped @ sizes, capped.sum(axis=1)
    created = np.maximum(capped - np.array(gpu.idle), 0).sum(axis=1)
    first, second = (slots, count) if slots_first else (count, slots)
    keys = first * 1_000_000 + second * 1_000 - created
    base_slots, base_count = sum(map(mul, base, gpu.sizes)), sum(base)
    head = (base_slots, base_count) if slots_first else (base_count, base_slots)
    best: tuple[tuple[int, int, int], Vector] = ((*head, -gpu.created(base)), base)
    if len(keys):
        i = int(np.argmax(keys))
        if int(keys[i]) > best[0][0] * 1_000_000 + best[0][1] * 1_000 + best[0][2]:
            key = (int(first[i]), int(second[i]), -int(created[i]))
            best = (key, tuple(int(x) for x in capped[i]))
    memo[memo_key] = best
    return best


def greedy(board: Board, score: Score, tiers: Sequence[frozenset[int]], memo: _Memo) -> Plan:
    """Per tier of demand classes (each tier adds classes to the last): fill the GPUs already used
    (in use, or opened by an earlier tier; fullest first), then open idle GPUs best-first; at the
    end, `drain`. `memo` may be shared by the calls with the same `score`.

    Each round evaluates one GPU per shape (the one of that shape that would create the fewest
    instances for the chosen vector is opened), so a round costs at most (shapes x maximal vectors).
    """
    plan: Plan = [(0,) * len(g.catalog.profiles) for g in board.gpus]
    left = list(board.demand)
    closed: dict[str, list[int]] = {}
    for i, g in enumerate(board.gpus):
        if not g.in_use:
            closed.setdefault(g.shape, []).append(i)
    for tier in tiers:
        remaining = [n if k in tier else 0 for k, n in enumerate(left)]
        used = [i for i, g in enumerate(board.gpus) if g.in_use or any(plan[i])]
        for i in sorted(used, key=lambda i: sum(board.gpus[i].maximal[0])):
            served = _best(board.gpus[i], remaining, score, plan[i], memo)[1]
            board.gpus[i].take(tuple(map(sub, served, plan[i])), remaining)
            plan[i] = served
        while any(remaining) and closed:
            _, served, shape = max(
                (*_best(board.gpus[members[0]], remaining, score, plan[members[0]], memo), shape)
                for shape, members in closed.items()
            )
            if not any(served):
                break
            members = closed[shape]
            i = min(members, key=lambda j: (board.gpus[j].created(served), j))
            members.remove(i)
            if not members:
                del closed[shape]
            plan[i] = served
            board.gpus[i].take(served, remaining)
        left = [n if k in tier else left[k] for k, n in enumerate(remaining)]
    drain(board, plan)
    return plan


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


def drain(board: Board, plan: Plan) -> None:
    """Close opened idle GPUs whose served instances all fit on other used GPUs (fewest served first).

    Bounded: each opened GPU is tried once, each of its instances against each used GPU once.
    """
    used = [i for i, g in enumerate(board.gpus) if g.in_use or any(plan[i])]
    for i in sorted((i for i in used if not board.gpus[i].in_use), key=lambda i: sum(plan[i])):
        gpu = board.gpus[i]
        trial = {j: list(plan[j]) for j in used if j != i}
        moved = True
        for pi, count in enumerate(plan[i]):
            name = gpu.catalog.profiles[pi].name
            for _ in range(count):
                moved = False
                for j, vec in trial.items():
                    other = board.gpus[j]
                    pj = _names(other.catalog.gpu_model).get(name, -1)
                    if pj < 0 or not set(gpu.classes[pi]) <= set(other.classes[pj]):
                        continue
                    vec[pj] += 1
                    if other.fits(tuple(vec)):
                        moved = True
                        break
                    vec[pj] -= 1
                if not moved:
                    break
            if not moved:
                break
        if moved:
            for j, vec in trial.items():
                plan[j] = tuple(vec)
            plan[i] = (0,) * len(plan[i])
            used.remove(i)


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
