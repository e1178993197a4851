"""What the token autoscaler reads: a pool's metrics at one instant, its replica counts, its bounds.

Pure values: the caller (the operator's controller, a simulator, a test) reads the serving engine's
metrics and the pods, and hands them in; time is the caller's clock too (``PoolSignals.now``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

__all__ = ["METRIC_NAMES", "Bounds", "PoolSignals", "ReplicaCounts"]


@dataclass(frozen=True, slots=True)
class PoolSignals:
    """One reading of a pool's metrics; ``None`` is a metric the caller could not read."""

    now: float
    """Seconds on one clock for the whole run (the caller's)."""
    tokens_in_queue: float | None
    """Prompt tokens of the queued (waiting) requests, pool-wide."""
    prefill_tokens_per_second: float | None
    """The pool's measured prefill throughput (prompt tokens per second, all ready replicas)."""
    waiting_requests: float | None
    """Requests waiting for a slot (``vllm:num_requests_waiting``, summed over replicas)."""
    running_requests: float | None
    """Requests being served (summed over replicas)."""
    kv_cache_usage: float | None
    """0..1: the KV-cache use of the fullest ready replica."""
    request_rate: float | None
    """Requests arriving per second over the last window (0: none arrived)."""
    stale: tuple[str, ...] = ()
    """Names of the metrics (these fields' names) missing or older than the staleness bound."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.now):
            raise ValueError(f"now must be a finite number of seconds, not {self.now!r}")
        for name in METRIC_NAMES:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 or None, not {value!r}")
        unknown = sorted(set(self.stale) - set(METRIC_NAMES))
        if unknown:
            raise ValueError(f"stale names {unknown} are not metrics; the metrics are {list(METRIC_NAMES)}")

    def fresh(self, name: str) -> float | None:
        """The metric ``name`` when it was read and is not stale, else ``None``."""
        if name in self.stale:
            return None
        value: float | None = getattr(self, name)
        return value


METRIC_NAMES: tuple[str, ...] = tuple(f.name for f in fields(PoolSignals) if f.name not in ("now", "stale"))
"""The metric fields of `PoolSignals`, the names ``stale`` may list."""


@dataclass(frozen=True, slots=True)
class ReplicaCounts:
    """The pool's replicas by state. ``starting`` and ``unschedulable`` are disjoint: a Pending pod
    the cluster cannot place counts as unschedulable only."""

    desired: int
    """spec.replicas now."""
    ready: int
    """Ready replicas (they serve, and produced the measured throughput)."""
    starting: int
    """Created, not Ready yet (a cold start in flight); they count as supply arriving."""
    unschedulable: int
    """Pending that the cluster cannot place (PodScheduled=False, reason Unschedulable)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{f.name} must be an integer >= 0, not {value!r}")


@dataclass(frozen=True, slots=True)
class Bounds:
    """spec.minReplicas and spec.maxReplicas."""

    min_replicas: int
    max_replicas: int

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"min_replicas must be >= 0, not {self.min_replicas}")
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})"
            )

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))
