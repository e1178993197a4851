"""The workload's shape distribution: what pods are likely to arrive next.

Fragmentation is only meaningful against the pods that will want the free capacity (FGD,
ATC'23). A `WorkloadProfile` is a histogram of request shapes (the extender builds one from
pods it has seen, the simulator from the trace); scorers see its typical part: the most
frequent shapes until `coverage` of all pods, each weighted by its frequency.

Measured and rejected (openb, 3 seeds): weighting shapes by their GPU demand instead of their
count, and a 99 % instead of 95 % coverage, both left more GPUs unallocated.

A shape's model list is part of it (pods pinned to GPU models; `PinnedDemand` and `LargeShapes`
see every list, rare ones included). The 95 % cut counts each list on its own, so a pinned
variant is typical only when it is common itself. Measured and rejected: cutting by resource
shape and keeping every model list of the chosen shapes (openb, 20 % of pods pinned, seed 42:
`fgd` 6.34 → 8.39 % unallocated, `default` without `pinned_reserve` 6.60 → 6.57). Counting the
free capacity of T4 nodes as fragment for every G2-pinned pod rewards spending T4 capacity,
exactly what the T4-pinned pods need later; guarding it is `pinned_reserve`'s job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from neuronetes.engine.filters import model_matches
from neuronetes.model import MILLI_PER_GPU, PodRequest


@dataclass(frozen=True, slots=True)
class TypicalShape:
    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only pods
    gpus: int
    gpu_models: tuple[str, ...] = ()  # models the shape may use; empty: any

    @property
    def resources(self) -> TypicalShape:
        """The shape without its model list."""
        return TypicalShape(self.cpu_milli, self.gpu_milli, self.gpus) if self.gpu_models else self


@dataclass(frozen=True)
class WorkloadProfile:
    """Shapes with how many pods of each were seen."""

    shapes: tuple[TypicalShape, ...]
    counts: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.counts):
            raise ValueError("one count per shape")

    @classmethod
    def empty(cls) -> WorkloadProfile:
        return cls((), ())

    @classmethod
    def from_requests(cls, requests: Iterable[PodRequest]) -> WorkloadProfile:
        counts: Counter[TypicalShape] = Counter()
        for r in requests:
            milli = r.gpu_milli if r.gpus > 0 else 0
            counts[TypicalShape(r.cpu_milli, milli, r.gpus, tuple(sorted(set(r.gpu_models))))] += 1
        ordered = sorted(
            counts.items(), key=lambda kv: (-kv[1], kv[0].cpu_milli, kv[0].gpu_milli, kv[0].gpus)
        )
        return cls(tuple(s for s, _ in ordered), tuple(float(n) for _, n in ordered))

    def typical(self, coverage: float = 0.95) -> list[tuple[TypicalShape, float]]:
        """The most frequent shapes covering `coverage` of all pods, weights summing to 1.

        A shape includes its model list, as in the FGD paper's simulator: a pinned variant of a
        common shape is typical only if it is common itself.
        """
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        total = sum(self.counts)
        chosen: list[int] = []
        covered = 0.0
        for k, n in enumerate(self.counts):  # the histogram is ordered most frequent first
            if covered >= coverage * total:
                break
            chosen.append(k)
            covered += n
        return [(self.shapes[k], self.counts[k] / covered) for k in chosen]

    def arrays(self, models: tuple[str, ...], coverage: float = 0.95) -> ProfileArrays:
        total = sum(self.counts) or 1.0
        one_gpu = [
            (s.gpu_milli, n / total)
            for s, n in zip(self.shapes, self.counts, strict=True)
            if s.gpus == 1 and s.gpu_milli > 0
        ]
        return ProfileArrays.build(
            self.typical(coverage),
            models,
            leftover_waste(one_gpu),
            self.cpu_per_gpu_milli(),
            PinnedDemand.build(self, models),
        )

    def cpu_per_gpu_milli(self) -> float:
        """Milli-CPU that GPU pods ask per milli-GPU, over every shape seen (0: no GPU pods).

        The workload's aggregate ratio: a node whose free CPU is below this × its free GPU
        capacity will run out of CPU before its GPUs fill (`score_cpu_strand`).
        """
        return _cpu_per_gpu_milli(zip(self.shapes, self.counts, strict=True))


@dataclass(frozen=True)
class PinnedDemand:
    """How much of the GPU demand may only use some of the cluster's GPU models.

    One entry per distinct set S of models that pinned pods accept: `share[s]` is the share of
    all GPU demand (milli-GPU, every shape seen, rare ones included) whose models all lie in S
    — pods pinned to one model of S count for S too (Hall's condition: S's nodes must hold the
    demand of every pod that can go nowhere else). Sets that admit every model are left out.
    """

    sets: npt.NDArray[np.bool_]  # [set, model_id]
    share: npt.NDArray[np.float64]  # [set]

    @classmethod
    def build(cls, profile: WorkloadProfile, models: tuple[str, ...]) -> PinnedDemand:
        width = max(len(models), 1)
        gpu_models = [m for m in models if m] or list(models)
        everything = np.array([m in gpu_models for m in models] or [False], dtype=bool)
        demand: dict[bytes, tuple[npt.NDArray[np.bool_], float]] = {}
        total = 0.0
        for s, n in zip(profile.shapes, profile.counts, strict=True):
            milli = n * s.gpus * s.gpu_milli
            total += milli
            if not s.gpu_models or milli == 0:
                continue
            a = model_access(s.gpu_models, models)
            if (a >= everything).all():
                continue
            key = a.tobytes()
            demand[key] = (a, demand.get(key, (a, 0.0))[1] + milli)
        sets = list(demand.values())
        share = [sum(d for b, d in sets if not (b & ~a).any()) / total if total > 0 else 0.0 for a, _ in sets]
        return cls(
            sets=np.array([a for a, _ in sets], dtype=bool).reshape(len(sets), width),
            share=np.array(share, dtype=np.float64),
        )

    @classmethod
    def none(cls) -> PinnedDemand:
        return cls(np.zeros((0, 0), dtype=bool), np.zeros(0))


@dataclass(frozen=True)
class ProfileArrays:
    """Typical shapes as arrays aligned with a cluster's GPU model table.

    Shapes that differ only in their model lists share one column: `access[m, t]` is the share
    of shape t's weight that may run on model m (1 when no pod of t is pinned). A node's
    fragmentation against t is the access-weighted mix of what it is for the pods that may use
    its model and all of its free capacity for those that may not — the same sum as one column
    per model list, at the cost of one column.
    """

    cpu: npt.NDArray[np.int64]
    milli: npt.NDArray[np.int64]
    gpus: npt.NDArray[np.int64]
    weight: npt.NDArray[np.float64]
    access: npt.NDArray[np.float64]  # [model_id, shape]: share of the shape that may use the model
    leftover_waste: npt.NDArray[np.float64]
    """[0..1000]: expected milli-GPU a GPU with that much free ends up wasting (see below);
    from every single-GPU shape seen, rare ones included: they are what fills small leftovers."""
    cpu_per_gpu_milli: float = 0.0
    """Milli-CPU GPU pods ask per milli-GPU (`WorkloadProfile.cpu_per_gpu_milli`); 0: unknown."""
    pinned: PinnedDemand = field(default_factory=PinnedDemand.none)
    """GPU demand that only some models may take (`score_pinned_reserve`), from every shape seen."""

    @classmethod
    def build(
        cls,
        typical: list[tuple[TypicalShape, float]],
        models: tuple[str, ...],
        waste: npt.NDArray[np.float64] | None = None,
        cpu_per_gpu_milli: float | None = None,
        pinned: PinnedDemand | None = None,
    ) -> ProfileArrays:
        """`waste` and `cpu_per_gpu_milli` default to those of the typical shapes, `pinned` to none."""
        columns: dict[TypicalShape, int] = {}
        for shape, _ in typical:
            columns.setdefault(shape.resources, len(columns))
        weight = np.zeros(len(columns))
        access = np.zeros((max(len(models), 1), len(columns)))
        for shape, w in typical:
            k = columns[shape.resources]
            weight[k] += w
            access[:, k] += w * model_access(shape.gpu_models, models)
        access /= np.where(weight > 0, weight, 1.0)
        return cls(
            leftover_waste=waste
            if waste is not None
            else leftover_waste([(s.gpu_milli, w) for s, w in typical if s.gpus == 1 and s.gpu_milli > 0]),
            cpu=np.array([s.cpu_milli for s in columns], dtype=np.int64),
            milli=np.array([s.gpu_milli for s in columns], dtype=np.int64),
            gpus=np.array([s.gpus for s in columns], dtype=np.int64),
            weight=weight,
            access=access,
            cpu_per_gpu_milli=cpu_per_gpu_milli
            if cpu_per_gpu_milli is not None
            else _cpu_per_gpu_milli(typical),
            pinned=pinned if pinned is not None else PinnedDemand.none(),
        )


def model_access(wanted: tuple[str, ...], models: tuple[str, ...]) -> npt.NDArray[np.bool_]:
    """[M]: which of the cluster's models a pod asking for `wanted` may use (empty: all)."""
    if not wanted:
        return np.ones(max(len(models), 1), dtype=bool)
    return np.array([model_matches(m, wanted) for m in models] or [False], dtype=bool)


def _cpu_per_gpu_milli(shapes: Iterable[tuple[TypicalShape, float]]) -> float:
    cpu = gpu = 0.0
    for s, n in shapes:
        if s.gpus > 0 and s.gpu_milli > 0:
            cpu += n * s.cpu_milli
            gpu += n * s.gpus * s.gpu_milli
    return cpu / gpu if gpu > 0 else 0.0


RELIABLE_FILL_SHARE = 0.1
"""Share of single-GPU pods that must fit into a leftover for it to be as good as filled.

A leftover competes with every other leftover of its size for the pods that fit it. When such
pods are rare (openb: 0.05–0.16 GPU pods are 2 % of single-GPU pods, against 1,400 GPUs left
with 0.19 by 0.81-GPU pods), most of those leftovers are never filled. Measured on openb
(10 seeds, gpushare40): any value from 0.02 to 0.5 beats the plain recursion (0); 0.1 — one
pod in ten fits — is a round value in the best part of that range, not a fitted optimum.
"""


def leftover_waste(
    one_gpu_shapes: list[tuple[int, float]], reliable_share: float = RELIABLE_FILL_SHARE
) -> npt.NDArray[np.float64]:
    """Expected final waste of a GPU with L milli free, for L in 0..1000 (a Bellman recursion).

    If no single-GPU shape fits in L, all of L is wasted. Otherwise the next pod to land on this
    GPU is one of the shapes that fit, in proportion to their frequency, and the waste is that
    of what it leaves. Whole-GPU pods count as the 1000-milli shape, so a GPU kept whole is worth
    keeping whole. This looks past FGD's one step: a 0.81 pod's 0.19 leftover is waste unless
    0.16 pods are common; two 0.47 pods on one GPU waste 0.06.

    Whether the leftover is filled at all depends on how common the pods that fit it are: with
    `F` the share of single-GPU pods that fit, it is filled with probability
    min(1, F / `reliable_share`) and otherwise wasted whole. Without this the recursion treats a
    leftover only rare pods fit as if one were sure to come (0 keeps that optimistic form).
    """
    if reliable_share < 0:
        raise ValueError(f"reliable_share must be >= 0, got {reliable_share}")
    waste = np.zeros(MILLI_PER_GPU + 1)
    if not one_gpu_shapes:
        waste[:] = np.arange(MILLI_PER_GPU + 1)
        return waste
    milli = np.array([m for m, _ in one_gpu_shapes], dtype=np.int64)
    freq = np.array([w for _, w in one_gpu_shapes], dtype=np.float64)
    total = float(freq.sum())
    for left in range(MILLI_PER_GPU + 1):
        fits = milli <= left
        if not fits.any():
            waste[left] = left
            continue
        fitting = float(freq[fits].sum())
        filled = 1.0 if reliable_share == 0 else min(1.0, fitting / total / reliable_share)
        after = float(freq[fits] @ waste[left - milli[fits]]) / fitting
        waste[left] = filled * after + (1.0 - filled) * left
    return waste


@dataclass(frozen=True)
class LargeShapes:
    """Multi-GPU whole-GPU shapes from the *whole* histogram, rare ones included.

    Rare large pods are invisible to a 95 % cut, yet each needs a node few others can offer
    (an 8-GPU pod asking 120 cores fits only the 128-core 8-GPU nodes); `score_scarcity`
    guards the nodes that can still host them. A large shape pinned to GPU models is its own
    entry: only nodes of its models can host it.
    """

    gpus: npt.NDArray[np.int64]
    cpu: npt.NDArray[np.int64]
    freq: npt.NDArray[np.float64]
    gpu_models: tuple[tuple[str, ...], ...] = ()  # per shape; empty: any model
    _access: dict[tuple[str, ...], npt.NDArray[np.bool_]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def build(cls, profile: WorkloadProfile) -> LargeShapes:
        total = sum(profile.counts) or 1.0
        large = [
            (s, n / total)
            for s, n in zip(profile.shapes, profile.counts, strict=True)
            if s.gpus >= 2 and s.gpu_milli >= MILLI_PER_GPU
        ]
        return cls(
            gpus=np.array([s.gpus for s, _ in large], dtype=np.int64),
            cpu=np.array([s.cpu_milli for s, _ in large], dtype=np.int64),
            freq=np.array([f for _, f in large], dtype=np.float64),
            gpu_models=tuple(s.gpu_models for s, _ in large),
        )

    def access(self, models: tuple[str, ...]) -> npt.NDArray[np.bool_]:
        """[model_id, shape]: may the shape run on the model (computed once per model table)."""
        got = self._access.get(models)
        if got is None:
            cols = [model_access(m, models) for m in self.gpu_models]
            got = np.stack(cols, axis=1) if cols else np.ones((max(len(models), 1), 0), dtype=bool)
            self._access[models] = got
        return got
