"""Why the chosen node beat the runner-up: the score terms that separate two scored candidates.

A node's score is a sum of weighted terms (`scorers`). The terms that explain a choice are not
the largest ones — a term that is large on every node (a neutral 1 × its weight) decides
nothing — but those by which the chosen node's total differs from the runner-up's, the
candidate that scored best after it. `separate` is pure: it takes the candidates' weighted
terms, as `PlacementEngine.separation` computes them for a few rows, and returns those terms
with their margins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

EQUAL_RTOL: Final = 1e-9
"""Two weighted values closer than this (relative to the larger, at least 1) are equal: the
same term computed on two equal nodes may differ in its last bits."""


@dataclass(frozen=True, slots=True)
class Separation:
    """How the chosen candidate's score compares with the runner-up's.

    `runner_up` is the runner-up's position among the candidates given to `separate` (a node
    row from `PlacementEngine.separation`); None when there was no other candidate. `margin` is
    the chosen total minus the runner-up's (0 without a runner-up, or when no term differs).
    `terms` holds each term that differs, as (term name, chosen value − runner-up value),
    largest difference by magnitude first: a negative one is a term the chosen node lost on.
    Terms equal on both — among them every term equal on every candidate — are left out.
    """

    runner_up: int | None
    margin: float
    terms: tuple[tuple[str, float], ...]


def separate(names: Sequence[str], weighted: F64, chosen: int) -> Separation:
    """The terms that separate candidate `chosen` from the runner-up.

    `weighted` is [candidates, terms]: each candidate's weighted term values, in `names` order.
    The runner-up is the best total among the other candidates (the first among equals).
    """
    values = np.asarray(weighted, dtype=np.float64).reshape(-1, len(names))
    totals = values.sum(axis=1)
    others = np.delete(np.arange(values.shape[0]), chosen)
    if others.size == 0:
        return Separation(None, 0.0, ())
    runner_up = int(others[np.argmax(totals[others])])
    mine, theirs = values[chosen], values[runner_up]
    diff = mine - theirs
    scale = np.maximum(1.0, np.maximum(np.abs(mine), np.abs(theirs)))
    differs = np.nonzero(np.abs(diff) > EQUAL_RTOL * scale)[0].tolist()
    if not differs:
        return Separation(runner_up, 0.0, ())
    order = sorted(differs, key=lambda t: (-abs(float(diff[t])), names[t]))
    margin = float(totals[chosen] - totals[runner_up])
    return Separation(runner_up, margin, tuple((names[t], float(diff[t])) for t in order))


__all__ = ["EQUAL_RTOL", "Separation", "separate"]
