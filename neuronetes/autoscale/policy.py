"""The token autoscaler's decision: how many replicas an AgentPool wants, and which rule said so.

The law and every safety layer, with their defaults and the CRD fields that change them, are in
docs/autoscaling.md; this module is that document as code. One `TokenAutoscaler` per pool keeps the
little history a decision needs (the stabilization window's recommendations, when the queue stopped
draining, when a request last came, when the last scale-up was), bounded whatever the run length.
"""

from __future__ import annotations

import math
from collections import deque
from types import MappingProxyType

from neuronetes.autoscale.reading import Reading, WindowMax, whole_replicas
from neuronetes.autoscale.settings import AutoscaleSettings, Decision
from neuronetes.autoscale.signals import Bounds, PoolSignals, ReplicaCounts
from neuronetes.autoscale.toolbinding_lag import lag_replicas

__all__ = ["AutoscaleSettings", "Decision", "TokenAutoscaler", "lag_replicas"]

IDLE_RUNNING_REQUESTS = 0.5
"""Fewer running requests than this (summed over the pool) is "no request being served"."""
STEP_DOWN_QUEUE_SECONDS = 0.5
"""The idle step-down needs the queue to hold under this many seconds of the pool's work."""
STEP_DOWN_READS = ("tokens_in_queue", "request_rate")
"""The metrics a step-down must have fresh (besides the throughput, measured or the spec's)."""


_Supply = tuple[int, str, int]
"""`TokenAutoscaler._supply_target`'s answer: the target, its rule, the queue-growth target."""


class TokenAutoscaler:
    """The decision for one pool, called every ``decision_interval_s`` with fresh readings."""

    def __init__(self, settings: AutoscaleSettings) -> None:
        self.settings = settings
        self._recommendations = WindowMax(settings.stabilization_s)
        self._saturated_capacity = WindowMax(settings.capacity_window_s)
        # (when, demand, whether the queue's trend was known) over a load time
        self._demand_history: deque[tuple[float, float, bool]] = deque()
        self._last_request_at: float | None = None
        self._stuck_since: float | None = None
        self._starting_since: float | None = None
        self._last_scale_up_at: float | None = None
        self._known_per_replica: float | None = None
        self._capacity: float | None = None  # the last capacity measured under saturation
        self._last_queue: tuple[float, float] | None = None  # (when, tokens_in_queue)
        self._backlog_supplied = False
        self._quiet_since: float | None = None
        self._ready_seen: int | None = None
        self._ready_since = -math.inf  # when the ready count last changed

    @property
    def history_size(self) -> int:
        """Entries the autoscaler holds (bounded by the number of distinct replica counts, plus the
        distinct capacities measured within the capacity window)."""
        return len(self._recommendations) + len(self._saturated_capacity)

    def decide(self, signals: PoolSignals, replicas: ReplicaCounts, bounds: Bounds) -> Decision:
        reading = self._read(signals, replicas)
        current = replicas.desired
        desired, rule, inputs = self._choose(signals, replicas, bounds, reading)
        if desired > current:
            self._last_scale_up_at = signals.now
            if reading.tokens_in_queue:
                self._backlog_supplied = True  # replicas were added while this backlog stood
        inputs = {
            "current": float(current),
            "ready": float(replicas.ready),
            "starting": float(replicas.starting),
            "unschedulable": float(replicas.unschedulable),
            "tokens_in_queue": reading.tokens_in_queue,
            "queue_trend": reading.queue_trend,
            "tokens_per_second": reading.pool_tokens_per_second,
            "tokens_per_second_per_replica": reading.tokens_per_second_per_replica,
            "arrival_tokens_per_second": reading.arrival_tokens_per_second,
            "arrival_replicas": reading.arrival_replicas,
            "demand_growth": reading.demand_growth,
            "steady_replicas": reading.steady_replicas,
            "slo_ttft_s": self.settings.slo_ttft_s,
            **inputs,
        }
        return Decision(
            desired=desired,
            rule=rule,
            expected_ttft_s=reading.expected_ttft_s,
            inputs=MappingProxyType(inputs),
            next_decision_at=signals.now + self.settings.decision_interval_s,
        )

    # ---- reading the signals ---------------------------------------------------------------------

    def _read(self, signals: PoolSignals, replicas: ReplicaCounts) -> Reading:
        now, s = signals.now, self.settings
        rate = signals.fresh("request_rate")
        # The first reading counts as a request: what came before it (an operator restart) is unknown.
        if self._last_request_at is None or (rate is not None and rate > 0):
            self._last_request_at = now
        if replicas.starting == 0:
            self._starting_since = None
        elif self._starting_since is None:
            self._starting_since = now

        tokens, waiting = signals.fresh("tokens_in_queue"), signals.fresh("waiting_requests")
        measured = signals.fresh("prefill_tokens_per_second")
        running = signals.fresh("running_requests")
        # Tokens queued while ready replicas serve nothing and process nothing: more replicas cannot
        # drain it (the capacity is idle); past the orphan window it is ignored altogether.
        stuck = (
            tokens is not None
            and tokens > 0
            and replicas.ready > 0
            and running is not None
            and running < IDLE_RUNNING_REQUESTS
            and (measured is None or measured == 0)
        )
        if not stuck:
            self._stuck_since = None
        elif self._stuck_since is None:
            self._stuck_since = now
        orphaned = self._stuck_since is not None and now - self._stuck_since >= s.orphan_window_s
        if orphaned:
            tokens, waiting = 0.0, 0.0

        trend: float | None = None
        if tokens is not None and self._last_queue is not None and now > self._last_queue[0]:
            trend = (tokens - self._last_queue[1]) / (now - self._last_queue[0])
        self._last_queue = None if tokens is None else (now, tokens)

        # Only a saturated pool measures its capacity; otherwise the measured throughput is the arrival
        # rate. Saturated here: the waiting layer's test (requests queue in front of the whole pool;
        # the KV layer reads the fullest replica, which says one replica is full, not the pool) while
        # the queue is not draining (a draining queue means replicas that just became Ready, which did
        # not produce the measured throughput yet, are taking the arrivals).
        kv = signals.fresh("kv_cache_usage")
        saturated = self._saturated(None, waiting, replicas.ready) and trend is not None and trend >= 0
        capacity = self._per_replica_capacity(measured, replicas.ready, saturated, now)
        per_replica = capacity if capacity is not None else self._known_per_replica
        pool_tps = per_replica * replicas.ready if per_replica and replicas.ready else None
        if pool_tps is None and measured:
            pool_tps = measured
        expected: float | None = None
        if tokens is not None:
            if tokens == 0:
                expected = s.model_load_s
            elif pool_tps:
                expected = tokens / pool_tps + s.model_load_s
        if tokens is not None and tokens < STEP_DOWN_QUEUE_SECONDS * (pool_tps or 0.0):
            self._backlog_supplied = False  # the backlog that asked for replicas is gone

        # Prompt tokens arrive as fast as they are prefilled plus as fast as the queue grows (a draining
        # queue is prefilled faster than tokens arrive).
        arrival = None if measured is None else max(measured + (trend or 0.0), 0.0)
        for_arrivals = steady = None
        if arrival is not None and capacity:
            for_arrivals = steady = self._staffed(arrival / capacity)
            if kv is not None:
                # The decode load: the KV cache the ready replicas hold, as if each were as full as
                # the fullest (an upper bound: the step-down never leaves less KV than in use).
                steady = max(steady, self._staffed(kv * replicas.ready))
        growth, rise = self._growth(now, for_arrivals, trend is not None)
        return Reading(
            tokens,
            waiting,
            pool_tps,
            per_replica,
            expected,
            stuck,
            orphaned,
            trend,
            arrival,
            for_arrivals,
            growth,
            rise,
            steady,
        )

    def _staffed(self, load: float) -> float:
        """The replicas that carry ``load`` replicas' worth of capacity (square-root staffing)."""
        return load + self.settings.staffing_beta * math.sqrt(load)

    def _per_replica_capacity(
        self, measured: float | None, ready: int, saturated: bool, now: float
    ) -> float | None:
        """One ready replica's prefill capacity: the highest per-replica throughput measured under
        saturation within the capacity window; after the window, the last such value (capacity changes
        with the model, the hardware and the request mix, not by itself); before the first saturation
        the spec's prior; else unknown (None)."""
        if ready != self._ready_seen:
            # The first count read is taken as settled: what came before it is unknown.
            self._ready_since = now if self._ready_seen is not None else -math.inf
            self._ready_seen = ready
        # The measured throughput is a rate over a window: replicas that became Ready within it
        # produced only part of it, so measured / ready under-states a replica's capacity, and such a
        # low value can outlive the higher ones in the capacity window. A saturated reading measures
        # the capacity once the ready count has held for half a load time.
        settled = now - self._ready_since >= self._load_s() / 2
        if measured and ready > 0:
            self._known_per_replica = measured / ready
            if saturated and settled:
                self._capacity = self._saturated_capacity.add(now, self._known_per_replica)
        if self._capacity is not None:
            return self._saturated_capacity.highest(now) or self._capacity
        return self.settings.tokens_per_second_per_replica

    def _load_s(self) -> float:
        """The time from ordering a replica to its serving: the model load time, else cold_start_s."""
        return self.settings.model_load_s or self.settings.cold_start_s

    def _growth(self, now: float, demand: float | None, complete: bool) -> tuple[float, float]:
        """The demand's rise over the load time ahead, extrapolated from its rise over the last one:
        sustained (the smaller of its two halves' rises, the arrival-rate rule's) and whole (from the
        oldest estimate that had the queue's trend in it: one without it misses the queue's growth,
        so the rise from it is the estimate filling in, not the demand rising)."""
        load = self._load_s()
        history = self._demand_history
        if demand is None:
            history.clear()  # no demand known: no rise to extrapolate either
            return 0.0, 0.0
        history.append((now, demand, complete))
        while history and history[0][0] < now - load:
            history.popleft()
        then, before, _ = history[0]
        if now - then < load / 2:
            return 0.0, 0.0  # too short a history to say
        # A rise sustained through the window (a ramp), not one burst: the smaller of the rises over
        # its two halves, so a single spike (which rises in one half only) extrapolates nothing.
        middle = next(value for when, value, _ in history if when >= (now + then) / 2)
        sustained = min(middle - before, demand - middle)
        first = next(((when, value) for when, value, known in history if known), (now, demand))
        whole = (demand - first[1]) / (now - first[0]) * load if now > first[0] else 0.0
        return max(0.0, 2 * sustained / (now - then) * load), max(0.0, whole)

    def _demand_watched(self, now: float) -> bool:
        """Whether the demand has been estimated for half a load time without a gap: before that the
        arrival-rate rule does not act (after a start or a gap in the metrics, the first estimates
        rest on the fewest scrapes)."""
        history = self._demand_history
        return bool(history) and now - history[0][0] >= self._load_s() / 2

    def _saturated(self, kv: float | None, waiting: float | None, ready: int) -> bool:
        """The saturation layer's test: the fullest replica's KV use, or waiting requests per ready
        replica, at or over its threshold."""
        s = self.settings
        return (kv is not None and kv >= s.saturation_kv) or (
            waiting is not None and ready > 0 and waiting / ready >= s.saturation_waiting_per_replica
        )

    # ---- the rules -------------------------------------------------------------------------------

    def _choose(
        self, signals: PoolSignals, replicas: ReplicaCounts, bounds: Bounds, reading: Reading
    ) -> tuple[int, str, dict[str, float | None]]:
        current, now, s = replicas.desired, signals.now, self.settings
        if not bounds.min_replicas <= current <= bounds.max_replicas:
            desired = bounds.clamp(current)
            self._hold(now, desired)
            return desired, "bounds", {}

        supply = self._supply_target(current, replicas.ready, now, reading)
        up_target, up_rule, inputs = self._scale_up_target(signals, replicas, reading, supply)
        if up_target > current:
            desired, rule = self._limit_scale_up(current, up_target, up_rule, replicas, bounds, now, supply)
            self._hold(now, desired)
            return desired, rule, {**inputs, "target": float(up_target)}
        if up_rule != "hold":  # a scale-up rule fired and was held (tolerance, orphaned queue, ...)
            self._hold(now, current)
            return current, up_rule, inputs

        hold = self._step_down_blocker(signals, reading)
        if hold is not None:
            self._hold(now, current)
            return current, hold, inputs
        if current <= bounds.min_replicas:
            self._hold(now, current)
            return current, "hold:bounds", inputs
        rate = signals.fresh("request_rate")
        if rate and reading.steady_replicas is not None:
            # Traffic continues: the right-sizing step-down, to the steady-state target, once the
            # pool has been quiet (queue near empty, no saturation) for the whole window.
            if self._quiet_since is None:
                self._quiet_since = now
            steady = whole_replicas(reading.steady_replicas * (1 + s.step_down_headroom))
            recommendation = max(steady, bounds.min_replicas)
            rule = "right-size"
        else:
            self._quiet_since = None
            if self._last_request_at is not None and now - self._last_request_at < s.cooldown_s:
                self._hold(now, current)
                return current, "hold:cooldown", inputs
            # The idle step-down: one replica, paced by the stabilization window and the down cap.
            recommendation = max(current - 1, bounds.min_replicas)
            rule = "idle-step-down"
        stabilized = int(self._recommendations.add(now, recommendation))
        inputs = {**inputs, "recommendation": float(recommendation), "stabilized": float(stabilized)}
        if recommendation >= current:
            return current, "hold", inputs
        quiet_for = 0.0 if self._quiet_since is None else now - self._quiet_since
        if stabilized >= current or (rule == "right-size" and quiet_for < s.stabilization_s):
            return current, "hold:stabilization", inputs
        desired = max(stabilized, s.fewest_down(current), bounds.min_replicas)
        if rule == "right-size":
            self._quiet_since = now  # the next right-sizing step needs a whole quiet window again
        return desired, rule, inputs

    def _hold(self, now: float, replicas: int) -> None:
        """Record ``replicas`` as this decision's recommendation; the pool is not quiet."""
        self._recommendations.add(now, replicas)
        self._quiet_since = None

    def _scale_up_target(
        self, signals: PoolSignals, replicas: ReplicaCounts, reading: Reading, supply: _Supply
    ) -> tuple[int, str, dict[str, float | None]]:
        """The highest replica count a scale-up rule asks for (``current`` when none does); `supply`
        is `_supply_target`'s answer for this reading."""
        current, s = replicas.desired, self.settings
        kv = signals.fresh("kv_cache_usage")
        waiting = reading.waiting_requests
        waiting_per_replica = None if waiting is None or replicas.ready == 0 else waiting / replicas.ready
        inputs: dict[str, float | None] = {"kv_cache_usage": kv, "waiting_per_replica": waiting_per_replica}
        target, rule = current, "hold"
        tokens, per_replica = reading.tokens_in_queue, reading.tokens_per_second_per_replica
        # Once replicas have been added for a backlog, the backlog asks again only while it is not
        # draining: requests stay on the replica they were sent to, so replicas that came up for a
        # backlog do not shrink it, and its size alone would double the pool again.
        draining = self._backlog_supplied and (reading.queue_trend is None or reading.queue_trend < 0)
        inputs["queue_draining"] = float(draining)
        if reading.queue_stuck and not reading.queue_orphaned:
            return current, "hold:orphaned-queue", inputs
        if tokens and reading.expected_ttft_s is None and per_replica is None:
            rule = "hold:no-throughput"
        if (
            tokens
            and per_replica
            and reading.expected_ttft_s is not None
            and reading.expected_ttft_s > s.slo_ttft_s
        ):
            # The backlog floor: the replicas that prefill the queue within the SLO. Starting replicas
            # count as supply (current includes them).
            needed = whole_replicas(tokens / (per_replica * s.slo_ttft_s))
            inputs["backlog_target"] = float(needed)
            if needed > current and not draining:
                if current > 0 and needed <= current * (1 + s.tolerance):
                    rule = "hold:tolerance"
                else:
                    target, rule = needed, "ttft-slo"
        # The steady-state target scales up ahead of the queue when the arrival rate outgrows the
        # replicas (starting ones included) beyond the tolerance; the queue-growth target, when a queue
        # grows in front of a saturated pool, sizes for the arrivals and the backlog to come. The KV
        # bound is not a scale-up reason: the fullest replica's KV use is a noisy stand-in for the
        # pool's; the KV layer covers it.
        demand_target, demand_rule, growth_target = supply
        inputs["queue_growth_target"] = float(growth_target)
        if demand_target > target:
            target, rule = demand_target, demand_rule
        if self._saturated(kv, waiting, replicas.ready) and s.most_up(current) > target:
            if draining:
                rule = "hold:backlog-draining" if rule == "hold" else rule
            else:
                target, rule = s.most_up(current), "saturation"
        demand = bool(tokens) or bool(waiting) or bool(signals.fresh("request_rate"))
        if current == 0 and demand and target == 0:
            target, rule = 1, "wake-from-zero"
        return target, rule, inputs

    def _demand_target(self, current: int, now: float, reading: Reading) -> tuple[int, str]:
        """The arrival-rate scale-up: the replicas (starting ones count as supply) that carry the
        arrivals with square-root staffing headroom, plus the growth expected over a load time, when the
        arrivals alone need more than current x (1 + tolerance) and have been watched for half a load
        time; ``(current, "hold")`` otherwise."""
        demand, above = reading.arrival_replicas, current * (1 + self.settings.tolerance)
        if demand is None or demand <= above or not self._demand_watched(now):
            return current, "hold"
        # Already short of supply: shorter still by the growth to come before new replicas are Ready.
        return max(current, whole_replicas(demand + reading.demand_growth)), "arrival-rate"

    def _queue_growth_target(self, current: int, ready: int, reading: Reading) -> int:
        """The queue-growth scale-up, for a queue that grows in front of a saturated pool (waiting
        requests per ready replica at the saturation threshold) and holds more than the SLO's worth of
        the ready replicas' work: the replicas that carry the arrivals when a replica ordered now is
        Ready (staffed, plus the demand's whole rise over the last load time extrapolated over the
        next), plus the replica-seconds the backlog will take then (the queue grown at its trend for
        a load time, at the per-replica capacity) spread over one load time. ``current`` when that is
        within current x (1 + tolerance). Starting replicas count as supply (they are in current)."""
        s = self.settings
        tokens, trend = reading.tokens_in_queue, reading.queue_trend
        per_replica, pool = reading.tokens_per_second_per_replica, reading.pool_tokens_per_second
        arrival = reading.arrival_tokens_per_second
        if not tokens or trend is None or trend <= 0 or not per_replica or not pool or arrival is None:
            return current
        if tokens / pool <= s.slo_ttft_s or not self._saturated(None, reading.waiting_requests, ready):
            return current
        load = self._load_s()
        arrivals = self._staffed(arrival / per_replica) + reading.demand_rise
        backlog = (tokens + trend * load) / (per_replica * load)
        need = arrivals + backlog
        return whole_replicas(need) if need > current * (1 + s.tolerance) else current

    def _supply_target(self, current: int, ready: int, now: float, reading: Reading) -> _Supply:
        """The higher of the arrival-rate and queue-growth targets, with its rule, and the
        queue-growth target itself; both count the starting replicas as supply, so a cold start in
        flight does not hold them."""
        target, rule = self._demand_target(current, now, reading)
        growth = self._queue_growth_target(current, ready, reading)
        return (growth, "queue-growth", growth) if growth > target else (target, rule, growth)

    def _limit_scale_up(
        self,
        current: int,
        target: int,
        rule: str,
        replicas: ReplicaCounts,
        bounds: Bounds,
        now: float,
        supply: _Supply,
    ) -> tuple[int, str]:
        """Apply, in order: unschedulable replicas, a cold start in flight, maxReplicas, the up cap
        (`supply`: `_supply_target`'s answer for this reading)."""
        if replicas.unschedulable > 0:
            return current, "hold:unschedulable"
        if self._cold_start_in_flight(replicas, now):
            # The starting replicas are counted in current: a demand or queue-growth target above
            # them is supply still missing once they are Ready. Rules that cannot say how much is
            # missing (the backlog floor for a backlog already supplied, saturation's doubling) wait.
            target, rule, _ = supply
            if target <= current:
                return current, "hold:cold-start"
        if current >= bounds.max_replicas:
            return current, "hold:bounds"
        return min(target, self.settings.most_up(current), bounds.max_replicas), rule

    def _cold_start_in_flight(self, replicas: ReplicaCounts, now: float) -> bool:
        """Starting replicas are supply arriving: no more scale-up for the same backlog until they are
        Ready or the model load time (cold_start_s when unknown) has passed since they started."""
        if replicas.starting == 0 or self._starting_since is None:
            return False
        since = max(self._starting_since, self._last_scale_up_at or self._starting_since)
        return now - since < self._load_s()

    def _step_down_blocker(self, signals: PoolSignals, reading: Reading) -> str | None:
        """Why no step-down (idle or right-sizing) may happen now, or None when one may."""
        missing = [name for name in STEP_DOWN_READS if signals.fresh(name) is None]
        if missing or signals.stale:
            return "hold:stale-metrics"
        tokens = reading.tokens_in_queue or 0.0
        if tokens > 0 and tokens >= STEP_DOWN_QUEUE_SECONDS * (reading.pool_tokens_per_second or 0.0):
            return "hold"
        return None
