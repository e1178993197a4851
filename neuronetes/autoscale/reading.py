"""What the token autoscaler's decision reads and remembers: one reading with the demand estimated
(`Reading`), the highest value of a sliding window (`WindowMax`, the stabilization window and the
saturated capacity), and whole replicas from a fractional need (`whole_replicas`)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from neuronetes.api.models import MAX_REPLICAS

__all__ = ["CEIL_SLACK", "Reading", "WindowMax", "whole_replicas"]

CEIL_SLACK = 1e-9
"""Taken off a replica count before ``ceil``: 5.000000001 replicas from float rounding is 5."""


@dataclass(frozen=True, slots=True)
class Reading:
    """A reading with the orphaned queue taken out, the capacity resolved and the demand estimated."""

    tokens_in_queue: float | None
    waiting_requests: float | None
    pool_tokens_per_second: float | None
    """The ready replicas' prefill capacity (capacity per replica x ready), else what was measured."""
    tokens_per_second_per_replica: float | None
    """One replica's prefill capacity: measured under saturation, else the spec's prior."""
    expected_ttft_s: float | None
    queue_stuck: bool
    queue_orphaned: bool
    queue_trend: float | None
    """tokens_in_queue's change per second since the previous reading (< 0: draining)."""
    arrival_tokens_per_second: float | None
    """Prompt tokens arriving per second: what was prefilled plus the queue's growth (signed)."""
    arrival_replicas: float | None
    """The replicas that prefill the arrival rate with square-root staffing headroom (unrounded)."""
    demand_growth: float
    """How many replicas the demand will have grown by when a replica ordered now is Ready: its rise
    per second over the last load time x the load time (0 when it did not rise)."""
    demand_rise: float
    """The same extrapolation without the test that the rise was sustained in both halves of the
    window (the queue-growth rule's: a growing queue says the rise is not one burst)."""
    steady_replicas: float | None
    """arrival_replicas, or more when the KV use asks for more: the right-sizing target (unrounded)."""


class WindowMax:
    """The highest value added in the last ``window_s`` seconds.

    A monotonic queue: a value no higher than a newer one can never be the maximum again, so the
    entries left hold strictly decreasing values, however long the run and however often it is asked
    (for replica counts: at most one per count).
    """

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._entries: deque[tuple[float, float]] = deque()

    def add(self, now: float, value: float) -> float:
        while self._entries and self._entries[-1][1] <= value:
            self._entries.pop()
        self._entries.append((now, value))
        return self.highest(now) or value

    def highest(self, now: float) -> float | None:
        """The highest value of the window ending at ``now``, or None when the window is empty."""
        while self._entries and self._entries[0][0] < now - self._window_s:
            self._entries.popleft()
        return self._entries[0][1] if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)


def whole_replicas(need: float) -> int:
    """Whole replicas for ``need`` (bounded first: a near-zero capacity must not overflow an int)."""
    return math.ceil(min(need, MAX_REPLICAS + 1) - CEIL_SLACK)
