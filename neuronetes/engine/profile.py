"""The workload's shape distribution: what pods are likely to arrive next.

Fragmentation is only meaningful against the pods that will want the free capacity (FGD,
ATC'23). A `WorkloadProfile` is a histogram of request shapes (the extender builds one from
pods it has seen, the simulator from the trace); scorers see its typical part: the most
frequent shapes until `coverage` of all pods, each weighted by its frequency.

Measured and rejected (openb, 3 seeds): weighting shapes by their GPU demand instead of their
count, and a 99 % instead of 95 % coverage, both left more GPUs unallocated.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from neuronetes.model import PodRequest


@dataclass(frozen=True, slots=True)
class TypicalShape:
    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only pods
    gpus: int
    gpu_models: tuple[str, ...] = ()


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
        """The most frequent shapes covering `coverage` of all pods, weights summing to 1."""
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
        return ProfileArrays.build(self.typical(coverage), models)


@dataclass(frozen=True)
class ProfileArrays:
    """Typical shapes as arrays aligned with a cluster's GPU model table."""

    cpu: npt.NDArray[np.int64]
    milli: npt.NDArray[np.int64]
    gpus: npt.NDArray[np.int64]
    weight: npt.NDArray[np.float64]
    access: npt.NDArray[np.bool_]  # [model_id, shape]: may this shape run on this model?

    @classmethod
    def build(cls, typical: list[tuple[TypicalShape, float]], models: tuple[str, ...]) -> ProfileArrays:
        from neuronetes.engine.filters import model_matches

        access = np.ones((max(len(models), 1), len(typical)), dtype=bool)
        for k, (shape, _) in enumerate(typical):
            if shape.gpu_models:
                for m, model in enumerate(models):
                    access[m, k] = model_matches(model, shape.gpu_models)
        return cls(
            cpu=np.array([s.cpu_milli for s, _ in typical], dtype=np.int64),
            milli=np.array([s.gpu_milli for s, _ in typical], dtype=np.int64),
            gpus=np.array([s.gpus for s, _ in typical], dtype=np.int64),
            weight=np.array([w for _, w in typical], dtype=np.float64),
            access=access,
        )
