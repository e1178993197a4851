"""The autoscalers compared, each as its project documents it, all on vllm:num_requests_waiting
except ours.

- ``hpa``: Kubernetes HorizontalPodAutoscaler v2, a Pods metric (per-pod num_requests_waiting
  through a metrics adapter), target averageValue 5. The replica calculation of
  kubernetes/pkg/controller/podautoscaler/replica_calculator.go (calcPlainMetricReplicas: pods
  without a metric yet, i.e. starting ones, count as 0 when scaling up and as the target when
  scaling down; no change inside the 10 % tolerance) and the default behavior of the HPA docs
  (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/, "Default Behavior"): sync
  every 15 s; scale-up stabilization 0 s, policies 100 % or 4 pods per 15 s, the larger; scale-down
  stabilization 300 s (the highest recommendation of the window), 100 % per 15 s.
- ``keda``: the vLLM production stack's KEDA pattern (docs.vllm.ai/projects/production-stack,
  "Autoscaling with KEDA"): a Prometheus trigger on sum(vllm:num_requests_waiting), threshold 5,
  pollingInterval 15 s, cooldownPeriod 360 s, minReplicaCount 1. KEDA hands the value to an HPA as
  an External metric with an AverageValue target (keda.sh/docs/latest/concepts/scaling-deployments:
  cooldownPeriod only applies to scaling to zero, which minReplicaCount 1 excludes), so the HPA's
  external-metric rule applies: ratio = value / (5 x spec.replicas), outside the tolerance
  ceil(value / 5), then the same default behavior.
- ``aibrix-apa``: AIBrix's APA (vllm-project/aibrix, pkg/controller/podautoscaler/algorithm/apa.go
  and context/context.go defaults): per-pod average of the metric against target 5; above
  1 + 0.1 → ceil(current x ratio) capped at ceil(2 x current); below 1 - 0.1 → ceil(current x ratio)
  floored at floor(current / 2); the pending-replica guard of autoscaler.go (scaling up, the metric
  is scaled by ready / current); scale-up cooldown 0 s, scale-down cooldown 300 s (here: no
  scale-down until 300 s after the last change). APA has no panic window (that is its KPA); its
  evaluation period is taken as 15 s like the HPA's.
- ``ours``: neuronetes.autoscale.TokenAutoscaler with AutoscaleSettings.from_spec of an AgentPool's
  autoscaling block; it decides when its Decision.next_decision_at says.

Every run starts with the pool warm at the same size; the baselines are primed as if they had
kept it there (HPA: a stabilization window of that recommendation; APA: a cooldown from the start),
so none of them drops the warm replicas in its first sync. Ours keeps its own history and gets none.

Every policy reads the same scrapes of the pool (``Snapshot``, every ``scrape_s``), never the
simulator's state.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from .server import ServerModel, Snapshot


@dataclass(frozen=True, slots=True)
class PoolState:
    desired: int
    ready: int
    starting: int


class Policy(Protocol):
    name: str

    def decide(self, now: float, snapshot: Snapshot | None, state: PoolState) -> int | None:
        """The new spec.replicas, or None when the policy does not evaluate at `now`."""


@dataclass(frozen=True, slots=True)
class HpaBehavior:
    sync_s: float = 15.0
    tolerance: float = 0.10
    up_stabilization_s: float = 0.0
    up_percent: float = 100.0
    up_pods: int = 4
    up_period_s: float = 15.0
    down_stabilization_s: float = 300.0
    down_percent: float = 100.0
    down_period_s: float = 15.0


@dataclass(slots=True)
class Hpa:
    """HPA v2 on num_requests_waiting: a Pods metric (``external=False``) or, under KEDA, an
    External metric with an AverageValue target (``external=True``)."""

    name: str
    min_replicas: int
    max_replicas: int
    target: float = 5.0
    external: bool = False
    behavior: HpaBehavior = field(default_factory=HpaBehavior)
    next_sync: float = 0.0
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    events: list[tuple[float, int]] = field(default_factory=list)  # (time, signed change)

    def prime(self, now: float, replicas: int) -> None:
        """As if the pool had run at `replicas` through the last stabilization window."""
        self.recommendations = [(now, replicas)]

    def _pods_proposal(self, values: list[float], missing: int, current: int) -> int:
        tolerance, target = self.behavior.tolerance, self.target
        ratio = sum(values) / (target * len(values))
        if missing == 0:
            if abs(1.0 - ratio) <= tolerance:
                return current
            return math.ceil(ratio * len(values))
        filled = values + [target if ratio < 1.0 else 0.0] * missing
        new_ratio = sum(filled) / (target * len(filled))
        if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (new_ratio < 1.0 < ratio):
            return current
        proposal = math.ceil(new_ratio * len(filled))
        if (new_ratio < 1.0 and proposal > current) or (new_ratio > 1.0 and proposal < current):
            return current
        return proposal

    def _external_proposal(self, value: float, current: int) -> int:
        ratio = value / (self.target * current)
        if abs(1.0 - ratio) <= self.behavior.tolerance:
            return current
        return math.ceil(value / self.target)

    def _stabilize(self, now: float, current: int, proposal: int) -> int:
        b = self.behavior
        up, down = proposal, proposal
        for at, recommendation in self.recommendations:
            if at > now - b.up_stabilization_s:
                up = min(up, recommendation)
            if at > now - b.down_stabilization_s:
                down = max(down, recommendation)
        horizon = now - max(b.up_stabilization_s, b.down_stabilization_s)
        self.recommendations = [(at, r) for at, r in self.recommendations if at > horizon]
        self.recommendations.append((now, proposal))
        return min(max(current, up), down)

    def _rate_limit(self, now: float, current: int, desired: int) -> int:
        b = self.behavior
        if desired > current:
            added = sum(d for at, d in self.events if d > 0 and at > now - b.up_period_s)
            start = current - added
            limit = max(start + b.up_pods, math.ceil(start * (1 + b.up_percent / 100)))
            return min(desired, max(limit, current), self.max_replicas)
        if desired < current:
            deleted = -sum(d for at, d in self.events if d < 0 and at > now - b.down_period_s)
            start = current + deleted
            limit = int(start * (1 - b.down_percent / 100))
            return max(desired, min(limit, current), self.min_replicas)
        return desired

    def decide(self, now: float, snapshot: Snapshot | None, state: PoolState) -> int | None:
        if now < self.next_sync:
            return None
        self.next_sync = now + self.behavior.sync_s
        current = state.desired
        if snapshot is None or (not snapshot.replicas and not self.external):
            return current  # no metric: the HPA keeps the scale (FailedGetPodsMetric)
        if self.external:
            proposal = self._external_proposal(snapshot.total("num_requests_waiting"), current)
        else:
            values = [float(m.num_requests_waiting) for m in snapshot.replicas]
            proposal = self._pods_proposal(values, max(0, current - len(values)), current)
        proposal = min(max(proposal, self.min_replicas), self.max_replicas)
        desired = self._rate_limit(now, current, self._stabilize(now, current, proposal))
        if desired != current:
            self.events = [(at, d) for at, d in self.events if at > now - 60.0]
            self.events.append((now, desired - current))
        return desired


@dataclass(slots=True)
class AibrixApa:
    name: str
    min_replicas: int
    max_replicas: int
    target: float = 5.0
    sync_s: float = 15.0
    up_tolerance: float = 0.1
    down_tolerance: float = 0.1
    max_scale_up_rate: float = 2.0
    max_scale_down_rate: float = 2.0
    scale_down_cooldown_s: float = 300.0
    next_sync: float = 0.0
    last_change: float = -math.inf

    def prime(self, now: float, replicas: int) -> None:
        """As if the pool had just been scaled to `replicas` (the scale-down cooldown runs)."""
        self.last_change = now

    def decide(self, now: float, snapshot: Snapshot | None, state: PoolState) -> int | None:
        if now < self.next_sync:
            return None
        self.next_sync = now + self.sync_s
        current = state.desired
        if snapshot is None or not snapshot.replicas:
            return current
        per_pod = snapshot.total("num_requests_waiting") / len(snapshot.replicas)
        ratio = per_pod / self.target
        desired = current
        if ratio > 1 + self.up_tolerance:
            desired = min(math.ceil(current * ratio), math.ceil(self.max_scale_up_rate * current))
            ready = min(state.ready, current)
            if ready < current:  # pending-replica guard: starting pods count as having no load
                guarded = math.ceil(current * (per_pod * ready / current) / self.target)
                desired = min(max(guarded, current), desired)
        elif ratio < 1 - self.down_tolerance:
            desired = max(math.ceil(current * ratio), math.floor(current / self.max_scale_down_rate))
            if now - self.last_change < self.scale_down_cooldown_s:
                desired = current
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        if desired != current:
            self.last_change = now
        return desired


@dataclass(slots=True)
class Ours:
    """neuronetes.autoscale.TokenAutoscaler fed the signals its API names, from the scrapes."""

    name: str
    min_replicas: int
    max_replicas: int
    autoscaler: Any
    signals_type: Any
    counts_type: Any
    bounds_type: Any
    staleness_s: float = 30.0
    rate_window_s: float = 30.0
    next_decision: float = 0.0
    history: list[Snapshot] = field(default_factory=list)
    rules: Counter[str] = field(default_factory=Counter)

    def _rates(self, snapshot: Snapshot) -> tuple[float | None, float | None]:
        """Prompt tokens/s (per-replica counter deltas, so removed replicas are no resets) and
        arrivals/s over the last `rate_window_s` of scrapes."""
        if not self.history or self.history[-1].at != snapshot.at:
            self.history.append(snapshot)
        self.history = [s for s in self.history if s.at >= snapshot.at - self.rate_window_s]
        oldest = self.history[0]
        span = snapshot.at - oldest.at
        if span <= 0:
            return None, None
        before = {m.index: m.prompt_tokens_total for m in oldest.replicas}
        prompt = sum(m.prompt_tokens_total - before.get(m.index, 0.0) for m in snapshot.replicas)
        return prompt / span, (snapshot.arrivals_total - oldest.arrivals_total) / span

    def decide(self, now: float, snapshot: Snapshot | None, state: PoolState) -> int | None:
        if now < self.next_decision:
            return None
        names = (
            "tokens_in_queue",
            "prefill_tokens_per_second",
            "waiting_requests",
            "running_requests",
            "kv_cache_usage",
            "request_rate",
        )
        if snapshot is None:
            signals = self.signals_type(now, None, None, None, None, None, None, stale=names)
        else:
            prefill_rate, request_rate = self._rates(snapshot)
            stale = names if now - snapshot.at > self.staleness_s else ()
            kv = max((m.kv_cache_usage_perc for m in snapshot.replicas), default=0.0)
            signals = self.signals_type(
                now=now,
                tokens_in_queue=snapshot.total("waiting_prompt_tokens"),
                prefill_tokens_per_second=prefill_rate,
                waiting_requests=snapshot.total("num_requests_waiting"),
                running_requests=snapshot.total("num_requests_running"),
                kv_cache_usage=kv,
                request_rate=request_rate,
                stale=stale,
            )
        counts = self.counts_type(
            desired=state.desired, ready=state.ready, starting=state.starting, unschedulable=0
        )
        decision = self.autoscaler.decide(
            signals, counts, self.bounds_type(self.min_replicas, self.max_replicas)
        )
        self.rules[decision.rule] += 1
        self.next_decision = max(decision.next_decision_at, now + 1.0)
        return int(decision.desired)


def ours_policy(model: ServerModel, slo_ttft_s: float, min_replicas: int, max_replicas: int) -> Ours | str:
    """Our policy built from an AgentPool autoscaling block, or why it cannot be (the core absent)."""
    try:
        from neuronetes.api import models
        from neuronetes.autoscale.policy import AutoscaleSettings, TokenAutoscaler
        from neuronetes.autoscale.signals import Bounds, PoolSignals, ReplicaCounts
    except ImportError as error:
        return f"neuronetes.autoscale is not available ({error})"
    spec = models.Autoscaling(
        ttft_ms=round(slo_ttft_s * 1000),
        tokens_per_second=round(model.prefill_tokens_per_s),
        model_load_seconds=round(model.cold_start_s),
    )
    settings = AutoscaleSettings.from_spec(spec)
    return Ours(
        "ours", min_replicas, max_replicas, TokenAutoscaler(settings), PoolSignals, ReplicaCounts, Bounds
    )


def baselines(min_replicas: int, max_replicas: int) -> list[Policy]:
    return [
        Hpa("hpa", min_replicas, max_replicas),
        Hpa("keda", min_replicas, max_replicas, external=True),
        AibrixApa("aibrix-apa", min_replicas, max_replicas),
    ]
