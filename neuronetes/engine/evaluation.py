"""What an evaluation of one request over the cluster yields: the feasible rows and their
scores, one reason per rejected node, and the reads made of them (the 0..MAX_SCORE scale of
prioritize, the best rows after a placement)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from neuronetes.engine.filters import FILTERS

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

FEASIBLE = -1
"""The reason code of a node no filter rejected."""
MAX_SCORE = 10
"""Prioritize scores are 0..MAX_SCORE (kube-scheduler's ``MaxExtenderPriority``)."""


@dataclass(frozen=True)
class Evaluation:
    """Feasible rows with their scores, and one categorical reason per rejected node."""

    rows: I64
    node_scores: F64  # best score per feasible row
    gpu_scores: F64 | None  # [R, G] when the request takes a share of one GPU
    reasons: npt.NDArray[np.int16]  # per node

    def reason_text(self, node_index: int) -> str:
        code = int(self.reasons[node_index])
        return "" if code == FEASIBLE else FILTERS[code].reason

    def best_rows(self, k: int, exclude: int = -1) -> list[int]:
        """Up to `k` feasible node rows, best score first, leaving node row `exclude` out: with
        k = 1 the best (the lowest row among equals), e.g. the runner-up of a placement."""
        keep = np.nonzero(self.rows != exclude)[0]
        k = min(k, keep.size)
        if k <= 0:
            return []
        scores = self.node_scores[keep]
        if k == 1:
            return [int(self.rows[keep[int(np.argmax(scores))]])]
        best = np.argpartition(-scores, k - 1)[:k] if k < keep.size else np.arange(keep.size)
        best = best[np.argsort(-scores[best], kind="stable")]
        return [int(i) for i in self.rows[keep[best]].tolist()]


def scale_scores(ev: Evaluation, rows: I64) -> I64:
    """The one 0..MAX_SCORE normaliser: per row of `rows` (-1: unknown node), the engine's score
    mapped linearly so that the best feasible node of the cluster gets MAX_SCORE and the worst 0
    (all MAX_SCORE when they are equal); infeasible and unknown nodes get 0."""
    out = np.zeros(rows.size, dtype=np.int64)
    finite = np.isfinite(ev.node_scores)
    if not finite.any():
        return out
    values = ev.node_scores[finite]
    lo, hi = float(values.min()), float(values.max())
    full = np.full(ev.reasons.size, np.nan)
    full[ev.rows[finite]] = values
    known = rows >= 0
    mine = full[rows[known]]
    scaled = (
        np.full(mine.shape, float(MAX_SCORE))
        if hi - lo <= 0
        else np.round(MAX_SCORE * (mine - lo) / (hi - lo))
    )
    out[known] = np.where(np.isnan(mine), 0, scaled).astype(np.int64)
    return out


__all__ = ["FEASIBLE", "MAX_SCORE", "Evaluation", "scale_scores"]
