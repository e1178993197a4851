"""The token autoscaler's settings (from an AgentPool's ``spec.autoscaling``) and its decision type.

docs/autoscaling.md gives each setting's default, reason and CRD field. `neuronetes.autoscale.policy`
decides with them (and re-exports both names: the API callers use).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from neuronetes.api.models import Autoscaling

__all__ = ["AutoscaleSettings", "Decision"]


@dataclass(frozen=True, slots=True)
class AutoscaleSettings:
    """One pool's autoscaling settings in seconds and fractions; `from_spec` reads them off the CRD."""

    slo_ttft_s: float
    model_load_s: float = 0.0
    cooldown_s: float = 300.0
    tokens_per_second_per_replica: float | None = None
    scale_up_limit: float = 2.0
    scale_down_limit: float = 2.0
    tolerance: float = 0.10
    stabilization_s: float = 300.0
    saturation_kv: float = 0.90
    saturation_waiting_per_replica: float = 8.0
    orphan_window_s: float = 60.0
    decision_interval_s: float = 5.0
    cold_start_s: float = 90.0
    """How long starting replicas hold scale-up when model_load_s is 0 (unknown)."""
    staffing_beta: float = 0.75
    """The steady-state target for a load of R replicas' capacity is R + staffing_beta x sqrt(R): the
    square-root staffing rule of many-server queues (Halfin and Whitt, 1981), which holds the chance
    that a request waits constant as the pool grows, so a big pool runs nearer its capacity than a
    small one (R = 2 -> 3.1, 65 % busy; R = 20 -> 23.4, 86 %). A fixed target utilization (Knative's
    and KServe's 0.7) over-provisions big pools and under-provisions small ones. 0.75 (a request waits
    in about one case in three, briefly) from the benchmark's runs (bench/README.md); 0 targets full
    utilization. Not a CRD field yet."""
    step_down_headroom: float = 0.25
    """The right-size step-down leaves this share of growth over the window's highest demand before
    the demand scale-up would fire again: a trade of GPU-seconds (a pool kept up to 25 % above its
    steady-state target) for no step-down reversed by the next rise (0: the cheapest, the most
    reversals). Not a CRD field yet."""
    capacity_window_s: float = 600.0
    """How long a per-replica throughput measured under saturation stands as the replica's capacity
    (the highest of this window); past it the spec's tokensPerSecond is the prior again."""

    def __post_init__(self) -> None:
        positive = (
            "slo_ttft_s",
            "decision_interval_s",
            "orphan_window_s",
            "cold_start_s",
        )
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if not math.isfinite(value) or value < 0 or (f.name in positive and value == 0):
                raise ValueError(
                    f"{f.name} must be a finite number {'> 0' if f.name in positive else '>= 0'}"
                )
        if self.tokens_per_second_per_replica == 0:
            raise ValueError("tokens_per_second_per_replica must be > 0 or None (measured)")
        if self.scale_up_limit < 1 or self.scale_down_limit < 1:
            raise ValueError("scale_up_limit and scale_down_limit must be >= 1 (1: one replica a step)")
        if not 0 < self.saturation_kv <= 1:
            raise ValueError(f"saturation_kv must be in (0, 1], not {self.saturation_kv}")
        if self.saturation_waiting_per_replica == 0:
            raise ValueError("saturation_waiting_per_replica must be > 0")
        if self.step_down_headroom < 0:
            raise ValueError(f"step_down_headroom must be >= 0, not {self.step_down_headroom}")

    @classmethod
    def from_spec(cls, spec: Autoscaling, decision_interval_s: float = 5.0) -> AutoscaleSettings:
        """The settings an AgentPool's ``spec.autoscaling`` asks for.

        Raises:
            ValueError: ``spec.autoscaling.ttftMs`` is unset (the CRD requires it when enabled).
        """
        if spec.ttft_ms is None:
            raise ValueError("spec.autoscaling.ttftMs is required: the autoscaler scales to that TTFT SLO")
        behavior, saturation = spec.behavior, spec.behavior.saturation
        return cls(
            slo_ttft_s=spec.ttft_ms / 1000,
            model_load_s=float(spec.model_load_seconds),
            cooldown_s=float(spec.cooldown_seconds),
            tokens_per_second_per_replica=None
            if spec.tokens_per_second is None
            else float(spec.tokens_per_second),
            scale_up_limit=behavior.scale_up_limit,
            scale_down_limit=behavior.scale_down_limit,
            tolerance=behavior.tolerance,
            stabilization_s=float(behavior.stabilization_window_seconds),
            saturation_kv=saturation.kv_cache_usage,
            saturation_waiting_per_replica=saturation.waiting_requests_per_replica,
            orphan_window_s=float(behavior.orphan_window_seconds),
            decision_interval_s=decision_interval_s,
        )

    def most_up(self, current: int) -> int:
        """The most replicas one decision may go to from ``current``: ×scale_up_limit, at least +1."""
        return max(math.ceil(current * self.scale_up_limit), current + 1)

    def fewest_down(self, current: int) -> int:
        """The fewest replicas one decision may go to: ÷scale_down_limit, at least −1."""
        return max(0, min(current - 1, math.ceil(current / self.scale_down_limit)))


@dataclass(frozen=True, slots=True)
class Decision:
    """What to set spec.replicas to (``desired == current``: hold), and why."""

    desired: int
    rule: str
    """The rule that decided (docs/autoscaling.md, "Rules"): a scaling rule or ``hold:<reason>``."""
    expected_ttft_s: float | None
    inputs: Mapping[str, float | None]
    """The numbers the rule used (for status and the Event)."""
    next_decision_at: float
