"""An AgentPool spec resolved: defaults that depend on other fields, replica counts, policy states.

Pure functions of the spec (no API access). The operator's handlers call `resolve` once per
reconcile and build pods (`neuronetes_operator.pods`) and status (`neuronetes_operator.status`)
from the result. docs/agentpool.md describes every rule here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neuronetes.api.models import (
    AgentPoolSpec,
    CacheAware,
    CarbonAware,
    CostOptimization,
    DataLocality,
    InterruptionThreshold,
    PolicyState,
)
from neuronetes.locality import ANNOTATION_MAX_NODES_TO_SCORE, LOCALITY_WEIGHT_MULTIPLIERS
from neuronetes.spot import duration_seconds

__all__ = [
    "ResolvedPool",
    "SpotPolicy",
    "cache_effect",
    "carbon_effect",
    "cost_optimization_enabled",
    "data_locality_effect",
    "interruption_threshold",
    "resolve",
    "scheduling_request",
]

"""The `effect` of a policy block that the operator shows but does not act on itself."""
BUDGET_EFFECT = "replicas beyond the budget are not created (status.cost, condition CostBudgetExceeded)"
"""The `effect` of ``costOptimization.maxCostPerHour`` (`neuronetes_operator.budget`)."""
AUTOSCALING_CONTROLLER = "the autoscaling controller sets spec.replicas (status.autoscaling)"
"""The `effect` of `spec.autoscaling` (`neuronetes_operator.autoscaler`)."""
FALLBACK_EFFECT = "serves {model} while a fallbackTrigger holds (status.fallback, condition FallbackActive)"
"""The `effect` part of a fallback model (`neuronetes_operator.fallback`)."""


@dataclass(frozen=True, slots=True)
class SpotPolicy:
    """How a pool uses spot capacity (`neuronetes_operator.spot_plan`; docs/spot.md)."""

    max_spot_percent: int = 100
    on_interruption: str = "migrate-to-on-demand"
    instance_types: tuple[str, ...] = ()
    threshold_count: int | None = None
    threshold_window_s: float = 0.0
    threshold_action: str = "disable-spot"


@dataclass(frozen=True, slots=True)
class ResolvedPool:
    """What an AgentPool spec asks for once its defaults are resolved."""

    desired: int
    """Pods wanted: spec.replicas (else minReplicas) plus prewarm, within maxReplicas, whole gangs."""
    gang_size: int
    """Members per gang; 0 without gang scheduling."""
    spot_allowed: bool
    """Whether the pods may land on spot nodes (label neuronetes.io/spot=true)."""
    priority: int
    preemption: bool
    policies: tuple[PolicyState, ...]
    spot: SpotPolicy = SpotPolicy()
    """The spot share, the interruption handling and threshold (defaults when no strategy is set)."""
    fallback_model: str | None = None
    """``costOptimization.fallbackModel`` while cost optimisation is on (None: no fallback)."""
    priority_class: str | None = None
    """The pods' PriorityClass: set by the operator from the pool's priority tier
    (`neuronetes_operator.tiers.pool_priority`), never minted from the spec."""

    @property
    def gangs(self) -> int:
        return self.desired // self.gang_size if self.gang_size else 0


_VICTIM_ORDERS = {
    "lowest-priority-first": "by PodDisruptionBudget violations, then lowest priority, then fewest victims",
    "fewest-victims": "by PodDisruptionBudget violations, then fewest victims, then lowest priority",
}
"""How ``scheduling.preemption.policy`` orders victims (the operator writes it on the pods,
`neuronetes.contracts.ANNOTATION_PREEMPTION_POLICY`; the extender's decision reads it)."""


def cost_optimization_enabled(cost: CostOptimization | None) -> bool:
    """`costOptimization.enabled`, resolved: unset means on when the block asks for anything.

    The block is the user's statement of intent: ``spotEnabled: true`` without ``enabled`` means
    "use spot", not "document that I would like spot". An explicit ``enabled: false`` wins.
    """
    if cost is None:
        return False
    if cost.enabled is not None:
        return cost.enabled
    return bool(
        cost.spot_enabled
        or cost.max_cost_per_hour is not None
        or cost.fallback_model is not None
        or cost.fallback_trigger is not None
        or cost.spot_strategy is not None
        or cost.interruption_threshold is not None
        or cost.spot_max_interruptions is not None
    )


def carbon_effect(carbon: CarbonAware) -> str:
    """What ``carbonAware`` does (docs/carbon.md): region preference and the carbon gate."""
    if not carbon.enabled:
        return "off (carbonAware.enabled is false)"
    parts = []
    if carbon.preferred_regions:
        parts.append(
            f"pods prefer regions {', '.join(carbon.preferred_regions[:8])} (preferred node affinity)"
        )
    shifting = carbon.time_shifting
    if shifting is not None and shifting.enabled:
        parts.append(
            "pods above minReplicas wait behind the scheduling gate neuronetes.io/carbon until "
            f"{shifting.clean_energy_hours} {shifting.time_zone}"
            + (
                f", intensity <= {carbon.max_carbon_intensity:g} gCO2/kWh"
                if carbon.max_carbon_intensity is not None
                else ""
            )
            + f" or their release-by time (at most {shifting.max_delay}); "
            "the carbon gate controller releases them (status.carbon)"
        )
    return "; ".join(parts) or "nothing to do (no preferredRegions, no timeShifting)"


def cache_effect(cache: CacheAware, model: str | None) -> str:
    """What ``cacheAware`` does (docs/model-cache.md): the pods' model-cache weight, preloading."""
    if not cache.enabled:
        return "off (cacheAware.enabled is false)"
    if model is None:
        return "nothing to do (the pool names no spec.model)"
    said = (
        f"the extender scores nodes caching {model} with weight {cache.cache_hit_weight:g} "
        "(pod annotation neuronetes.io/cache-hit-weight)"
    )
    strategy = cache.preload_strategy
    if strategy is not None and strategy.min_cached_replicas:
        said += f"; preload Jobs keep {strategy.min_cached_replicas} selected nodes caching it (status.cache)"
    return said


def _desired(spec: AgentPoolSpec, gang_size: int) -> int:
    base = spec.min_replicas if spec.replicas is None else spec.replicas
    base = max(base, spec.min_replicas)
    want = base + math.ceil(base * spec.prewarm_percent / 100)
    if spec.max_replicas is not None:
        want = min(want, spec.max_replicas)
    if gang_size:
        gangs = math.ceil(want / gang_size)
        if spec.max_replicas is not None and gangs * gang_size > spec.max_replicas:
            gangs = spec.max_replicas // gang_size
        want = gangs * gang_size
    return want


def _gang_size(spec: AgentPoolSpec) -> int:
    gang = spec.scheduling.gang_scheduling if spec.scheduling else None
    if gang is None or not gang.enabled:
        return 0
    return gang.min_members if gang.min_members is not None else spec.min_replicas


def _policies(spec: AgentPoolSpec, spot_allowed: bool) -> tuple[PolicyState, ...]:
    s = spec.scheduling
    out: list[PolicyState] = []
    if spec.autoscaling is not None:
        out.append(
            PolicyState(name="autoscaling", enabled=spec.autoscaling.enabled, effect=AUTOSCALING_CONTROLLER)
        )
    if s is None:
        return tuple(out)
    if s.cost_optimization is not None:
        enabled = cost_optimization_enabled(s.cost_optimization)
        budget = (
            f"maxCostPerHour {s.cost_optimization.max_cost_per_hour:g}: {BUDGET_EFFECT}; "
            if enabled and s.cost_optimization.max_cost_per_hour is not None
            else ""
        )
        fallback = (
            f"; {FALLBACK_EFFECT.format(model=s.cost_optimization.fallback_model)}"
            if enabled and s.cost_optimization.fallback_model is not None
            else ""
        )
        out.append(
            PolicyState(
                name="costOptimization",
                enabled=enabled,
                effect=budget + _spot_effect(s.cost_optimization, spot_allowed) + fallback,
            )
        )
    if s.preemption is not None:
        effect = (
            "lower-priority pods are preempted for these pods (PriorityClass PreemptLowerPriority), "
            "the victims chosen per GPU by the extender's preemption controller (docs/preemption.md), "
            f"ordered {_VICTIM_ORDERS[s.preemption.policy]}"
            if s.preemption.enabled
            else "pods never preempt others (PriorityClass preemptionPolicy: Never)"
        )
        out.append(PolicyState(name="preemption", enabled=s.preemption.enabled, effect=effect))
    if s.carbon_aware is not None:
        out.append(
            PolicyState(
                name="carbonAware", enabled=s.carbon_aware.enabled, effect=carbon_effect(s.carbon_aware)
            )
        )
    if s.data_locality is not None:
        out.append(
            PolicyState(name="dataLocality", enabled=True, effect=data_locality_effect(s.data_locality))
        )
    if s.cache_aware is not None:
        out.append(
            PolicyState(
                name="cacheAware",
                enabled=s.cache_aware.enabled,
                effect=cache_effect(s.cache_aware, spec.model),
            )
        )
    if s.fast_scheduling is not None:
        fast = s.fast_scheduling
        effect = (
            f"the extender scores at most {fast.max_nodes_to_score} feasible nodes per pod "
            f"(annotation {ANNOTATION_MAX_NODES_TO_SCORE}; docs/locality.md)"
            if fast.enabled
            else "off (fastScheduling.enabled is false): every feasible node is scored"
        )
        out.append(PolicyState(name="fastScheduling", enabled=fast.enabled, effect=effect))
    return tuple(out)


def data_locality_effect(block: DataLocality) -> str:
    """What ``dataLocality`` does (docs/locality.md): scores, never hard affinity."""
    stores, avoid = block.vector_store_affinity or [], block.anti_affinity or []
    if not stores and not avoid:
        return "nothing to do (no vectorStoreAffinity, no antiAffinity)"
    parts = []
    if stores:
        more = " ..." if len(stores) > 4 else ""
        parts.append(f"nodes (then zones) running {', '.join(stores[:4])}{more} score higher")
    if avoid:
        more = " ..." if len(avoid) > 4 else ""
        parts.append(f"nodes running pods of {'; '.join(avoid[:4])}{more} score 0")
    weight = LOCALITY_WEIGHT_MULTIPLIERS[block.locality_weight]
    return (
        "; ".join(parts) + f" in the extender's data-locality term (localityWeight {block.locality_weight}:"
        f" x{weight:g} its weight); "
        "written on new pods, running pods stay where they are"
    )


def scheduling_request(spec: AgentPoolSpec) -> tuple[str | None, int | None]:
    """The ``localityWeight`` level (None: no dataLocality) and the candidate limit (None:
    fastScheduling off) that new pods of the pool carry (`neuronetes.locality.locality_annotations`)."""
    s = spec.scheduling
    if s is None:
        return None, None
    weight = s.data_locality.locality_weight if s.data_locality is not None else None
    fast = s.fast_scheduling
    return weight, fast.max_nodes_to_score if fast is not None and fast.enabled else None


def interruption_threshold(cost: CostOptimization) -> InterruptionThreshold | None:
    """``interruptionThreshold``, else the one ``spotMaxInterruptions`` (interruptions an hour the pool
    tolerates on spot) stands for: its next interruption within an hour turns spot off."""
    if cost.interruption_threshold is not None:
        return cost.interruption_threshold
    if cost.spot_max_interruptions is None:
        return None
    return InterruptionThreshold(count=cost.spot_max_interruptions + 1, window="1h", action="disable-spot")


def _spot_effect(cost: CostOptimization, spot_allowed: bool) -> str:
    strategy = cost.spot_strategy
    if not spot_allowed:
        said = "pods avoid spot nodes"
    else:
        pct = strategy.max_spot_percent if strategy else 100
        said = f"at most {pct}% of the replicas (whole gangs) on spot nodes"
        if strategy and strategy.instance_types:
            said += f", preferring instance types {', '.join(strategy.instance_types[:4])}"
            said += " ..." if len(strategy.instance_types) > 4 else ""
    on = strategy.on_interruption if strategy else "migrate-to-on-demand"
    said += f"; on an interruption notice: {on}"
    threshold = interruption_threshold(cost)
    if threshold is not None:
        said += f"; {threshold.count} notices within {threshold.window}: {threshold.action}"
    return said


def _spot_policy(cost: CostOptimization | None) -> SpotPolicy:
    if cost is None:
        return SpotPolicy()
    strategy = cost.spot_strategy
    threshold = interruption_threshold(cost)
    return SpotPolicy(
        max_spot_percent=strategy.max_spot_percent if strategy else 100,
        on_interruption=strategy.on_interruption if strategy else "migrate-to-on-demand",
        instance_types=tuple(strategy.instance_types or ()) if strategy else (),
        threshold_count=threshold.count if threshold else None,
        threshold_window_s=duration_seconds(threshold.window) if threshold else 0.0,
        threshold_action=threshold.action if threshold else "disable-spot",
    )


def resolve(spec: AgentPoolSpec) -> ResolvedPool:
    """The pool `spec` asks for, defaults resolved (docs/agentpool.md "Defaults")."""
    gang_size = _gang_size(spec)
    s = spec.scheduling
    cost = s.cost_optimization if s else None
    spot_allowed = cost_optimization_enabled(cost) and cost is not None and cost.spot_enabled
    if spec.mig_profile is not None:
        mig = PolicyState(
            name="migPlanner",
            enabled=True,
            effect=(
                f"pods ask for one {spec.mig_profile} instance; demand no layout serves is planned onto "
                "idle GPUs and free slots by the MIG layout controller (docs/mig.md)"
            ),
        )
        extra: tuple[PolicyState, ...] = (mig,)
    else:
        extra = ()
    return ResolvedPool(
        desired=_desired(spec, gang_size),
        gang_size=gang_size,
        spot_allowed=spot_allowed,
        spot=_spot_policy(cost if spot_allowed or cost_optimization_enabled(cost) else None),
        priority=s.priority if s else 0,
        preemption=bool(s and s.preemption and s.preemption.enabled),
        policies=_policies(spec, spot_allowed) + extra,
        fallback_model=cost.fallback_model if cost is not None and cost_optimization_enabled(cost) else None,
    )
