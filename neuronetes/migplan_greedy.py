"""The greedy side of the MIG layout planner: `greedy` with its `drain` pass, and `improve`.

`neuronetes.migplan_search` has the count vectors, the GPUs as the searches see them and the exact
and template planners; `neuronetes.migplan` runs them all and keeps the best plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from operator import add, mul, sub

import numpy as np

from neuronetes.migplan_search import Assignment, Board, GpuSlot, Plan, Vector, profile_index, vector_of

__all__ = ["SCORES", "Score", "greedy", "improve"]


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
                    pj = profile_index(other.catalog.gpu_model).get(name, -1)
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
