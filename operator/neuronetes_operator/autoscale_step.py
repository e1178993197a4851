"""One pool's autoscaling step, pure: from what was read (pods, metrics, lag asks, conflicts) and the
caller's clock to the replicas to set, ``status.autoscaling``, the conditions and the Events
(`PoolState.step`). `neuronetes_operator.autoscaler` reads and writes around it (docs/autoscaling.md,
"The controller").
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from neuronetes.api.models import Autoscaling
from neuronetes.autoscale import (
    AutoscaleSettings,
    Bounds,
    Decision,
    PoolSignals,
    ReplicaCounts,
    TokenAutoscaler,
)
from neuronetes.autoscale.signals import METRIC_NAMES

from .metrics_source import (
    FIRST_SCRAPE,
    PodCounters,
    Reading,
)
from .status import AUTOSCALER_CONDITIONS

__all__ = [
    "DIGITS",
    "STATUS_REFRESH_S",
    "LagAsk",
    "PoolState",
    "Step",
    "autoscaled",
    "iso_time",
    "live_pods",
    "pod_ready",
    "replica_counts",
    "rotate",
]

CONDITION_CONFLICT, CONDITION_STALE = AUTOSCALER_CONDITIONS
STATUS_REFRESH_S = 30.0
"""status.autoscaling is written when the decision changes, else at most this often (each write
wakes the pool's reconcile)."""
DIGITS = re.compile(r"\d+(\.\d+)?")


# ---- pure --------------------------------------------------------------------------------------------


def rotate(items: Sequence[Any], start: int, count: int) -> tuple[list[Any], int]:
    """``count`` items from ``start`` on, wrapping; and where the next turn starts. Every item is
    served once every ``ceil(len / count)`` turns whatever the order of the list."""
    if not items:
        return [], 0
    start %= len(items)
    taken = [items[(start + i) % len(items)] for i in range(min(count, len(items)))]
    return taken, (start + len(taken)) % len(items)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(cd.get("type") == "Ready" and cd.get("status") == "True" for cd in conditions)


def _pod_unschedulable(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        cd.get("type") == "PodScheduled"
        and cd.get("status") == "False"
        and cd.get("reason") == "Unschedulable"
        for cd in conditions
    )


def live_pods(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods not terminating and not finished."""
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def replica_counts(desired: int, pods: Iterable[Mapping[str, Any]]) -> ReplicaCounts:
    """The pool's replicas by state (``ReplicaCounts``): ready, starting, unschedulable."""
    ready = starting = unschedulable = 0
    for pod in live_pods(pods):
        if pod_ready(pod):
            ready += 1
        elif _pod_unschedulable(pod):
            unschedulable += 1
        else:
            starting += 1
    return ReplicaCounts(desired=desired, ready=ready, starting=starting, unschedulable=unschedulable)


@dataclass(frozen=True, slots=True)
class LagAsk:
    """What a pool's ToolBindings ask for: the most replicas any of them wants, and which one."""

    desired: int
    lag: float
    binding: str


@dataclass(frozen=True, slots=True)
class Step:
    """What one tick decided for one pool and what to write."""

    desired: int
    current: int
    rule: str
    decision: Decision | None
    status: dict[str, Any] | None
    """status.autoscaling to write (None: nothing changed enough to write)."""
    conditions: list[dict[str, Any]] | None
    """status.conditions to write (None: unchanged)."""
    events: list[tuple[str, str, str]]
    """(type, reason, message) Events to post."""
    ready_after_s: list[float]
    """Seconds from a scale-up decision to its replicas Ready, for each scale-up that completed."""


def _fmt(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class PoolState:
    """One pool's memory: its `TokenAutoscaler`, counters for rates, what was last said and written."""

    spec: Autoscaling | None
    interval_s: float
    autoscaler: TokenAutoscaler | None = None
    counters: PodCounters = field(default_factory=PodCounters)
    last_written: tuple[Any, ...] | None = None
    last_written_at: float = -math.inf
    warned_stale: tuple[Any, ...] | None = None
    warned_conflict: str | None = None
    scale_up: tuple[int, float] | None = None
    """(replicas, when decided) of the scale-up waiting for its replicas to be Ready."""
    last_scale_at: float | None = None

    def __post_init__(self) -> None:
        if self.spec is not None and self.spec.enabled:
            self.autoscaler = TokenAutoscaler(AutoscaleSettings.from_spec(self.spec, self.interval_s))

    def step(
        self,
        *,
        now: float,
        current: int,
        pods: Sequence[Mapping[str, Any]],
        bounds: Bounds,
        reading: Reading | None,
        lag: LagAsk | None,
        conflict: str | None,
        conditions: Sequence[Mapping[str, Any]],
        generation: int,
    ) -> Step:
        """The pool's decision at ``now`` (wall-clock seconds) from what was read."""
        counts = replica_counts(current, pods)
        events: list[tuple[str, str, str]] = []
        ready_after = self._scale_up_done(counts, now)
        decision: Decision | None = None
        if conflict is not None:
            desired, rule = current, "hold:conflict"
            if self.warned_conflict != conflict:
                events.append(
                    (
                        "Warning",
                        CONDITION_CONFLICT,
                        f"{conflict} targets this pool: the autoscaler stays passive",
                    )
                )
        else:
            desired, rule = current, "hold"
            if self.autoscaler is not None and reading is not None:
                values = {name: reading.values.get(name) for name in METRIC_NAMES}
                signals = PoolSignals(now=now, **values, stale=reading.stale)
                decision = self.autoscaler.decide(signals, counts, bounds)
                desired, rule = decision.desired, decision.rule
            if lag is not None and lag.desired > desired:
                desired, rule = bounds.clamp(lag.desired), "toolbinding-lag"
        self.warned_conflict = conflict

        stale = () if reading is None or conflict else reading.stale
        problem = None if reading is None or conflict else reading.problem
        stale_key = (stale, DIGITS.sub("N", problem or "")) if stale else None
        if stale_key is not None and stale_key != self.warned_stale and problem != FIRST_SCRAPE:
            events.append(
                (
                    "Warning",
                    CONDITION_STALE,
                    f"metrics {', '.join(stale)} not trusted ({problem}): no scale-down",
                )
            )
        self.warned_stale = stale_key

        inputs = dict(decision.inputs) if decision is not None else {}
        if lag is not None:
            inputs.update(lag=lag.lag, lag_replicas=float(lag.desired))
        if desired != current:
            self.last_scale_at = now
            direction = "Up" if desired > current else "Down"
            shown = ", ".join(f"{k}={_fmt(v)}" for k, v in inputs.items() if v is not None and k != "current")
            ttft = "" if decision is None else f"; expected TTFT {_fmt(decision.expected_ttft_s)}s"
            binding = f" (ToolBinding {lag.binding})" if lag is not None and rule == "toolbinding-lag" else ""
            events.append(
                (
                    "Normal",
                    f"Autoscaled{direction}",
                    f"{current} -> {desired} replicas by {rule}{binding}{ttft}: {shown}",
                )
            )
            if desired > current:
                since = self.scale_up[1] if self.scale_up is not None else now
                self.scale_up = (desired, since)
            else:
                self.scale_up = None

        key = (desired, current, rule, stale, conflict, problem is None)
        status: dict[str, Any] | None = None
        if key != self.last_written or now - self.last_written_at >= STATUS_REFRESH_S:
            self.last_written, self.last_written_at = key, now
            status = {
                "currentReplicas": current,
                "desiredReplicas": desired,
                "rule": rule,
                "expectedTTFTSeconds": None
                if decision is None or decision.expected_ttft_s is None
                else round(decision.expected_ttft_s, 3),
                "inputs": {k: round(v, 4) for k, v in inputs.items() if v is not None and math.isfinite(v)}
                or None,
                "staleMetrics": list(stale) or None,
                "message": problem,
                "conflict": conflict,
                "lastDecisionTime": iso_time(now),
                "nextDecisionTime": iso_time(now + self.interval_s),
                "lastScaleTime": None if self.last_scale_at is None else iso_time(self.last_scale_at),
            }
        return Step(
            desired=desired,
            current=current,
            rule=rule,
            decision=decision,
            status=status,
            # The first scrape's missing rates are not worth a condition that the next tick clears.
            conditions=_own_conditions(
                conditions, conflict, () if problem == FIRST_SCRAPE else stale, problem, generation, now
            ),
            events=events,
            ready_after_s=ready_after,
        )

    def _scale_up_done(self, counts: ReplicaCounts, now: float) -> list[float]:
        """The scale-up whose replicas are all Ready now: seconds since its decision (the time is
        this tick's, so it is late by at most one interval)."""
        if self.scale_up is None or counts.ready < self.scale_up[0]:
            return []
        since = self.scale_up[1]
        self.scale_up = None
        return [max(0.0, now - since)]


def _own_conditions(
    old: Sequence[Mapping[str, Any]],
    conflict: str | None,
    stale: Sequence[str],
    problem: str | None,
    generation: int,
    now: float,
) -> list[dict[str, Any]] | None:
    """The pool's conditions with this controller's set as they are now; None when nothing changes."""
    wanted: dict[str, tuple[str, str]] = {}
    if conflict is not None:
        wanted[CONDITION_CONFLICT] = (
            "PassiveForOtherAutoscaler",
            f"{conflict} targets this pool: no scaling by NeuroNetes",
        )
    if stale:
        wanted[CONDITION_STALE] = (
            "NoScaleDown",
            f"{', '.join(stale)}: {problem or 'missing'}; scale-down held",
        )
    current = {cd.get("type"): cd for cd in old if cd.get("type") in AUTOSCALER_CONDITIONS}
    same = set(current) == set(wanted) and all(
        current[t].get("reason") == r
        and DIGITS.sub("N", current[t].get("message") or "") == DIGITS.sub("N", m)
        for t, (r, m) in wanted.items()
    )
    if same:
        return None
    kept = [dict(cd) for cd in old if cd.get("type") not in AUTOSCALER_CONDITIONS]
    for kind, (reason, message) in wanted.items():
        previous = current.get(kind)
        kept.append(
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message[:1024],
                "observedGeneration": generation,
                "lastTransitionTime": (previous or {}).get("lastTransitionTime") or iso_time(now),
            }
        )
    return kept


def autoscaled(pool: Mapping[str, Any]) -> bool:
    """Whether the pool's spec asks for autoscaling (``enabled`` defaults to true in the block)."""
    block = (pool.get("spec") or {}).get("autoscaling")
    return isinstance(block, Mapping) and block.get("enabled", True) is not False
