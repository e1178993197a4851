"""ToolBinding status: the referenced pool resolved, and what the lag rule does now. Pure.

The lag rule itself (``lag = depth - replicas x prefetch x throughput``; scale when it exceeds
``maxLagThreshold``) takes effect in the policy controller; the operator validates the binding
(the CRD), resolves its pool and says so in the status.
"""

from __future__ import annotations

from typing import Any

from neuronetes.api.models import ToolBindingSpec

from .policy import POLICY_CONTROLLER

__all__ = ["binding_status"]


def binding_status(spec: ToolBindingSpec, pool_exists: bool, generation: int) -> dict[str, Any]:
    """The status (a JSON merge patch body's ``status``) of a binding whose pool does or does not exist."""
    if spec.pool_ref is None:
        bound = ("False", "NoPoolRef", "spec.poolRef is unset: the binding only reports depth and lag")
        phase = "Pending"
    elif pool_exists:
        bound = ("True", "PoolFound", f"AgentPool {spec.pool_ref.name} found")
        phase = "Active"
    else:
        bound = ("False", "PoolNotFound", f"AgentPool {spec.pool_ref.name} does not exist in this namespace")
        phase = "Pending"
    cfg = spec.queue_config
    lag = (
        "True" if cfg.autoscale_on_lag else "False",
        "PolicyController" if cfg.autoscale_on_lag else "Disabled",
        (
            f"autoscaleOnLag above {cfg.max_lag_threshold} messages: {POLICY_CONTROLLER}"
            if cfg.autoscale_on_lag
            else "autoscaleOnLag is false"
        ),
    )
    conditions = [
        {"type": kind, "status": s, "reason": r, "message": m, "observedGeneration": generation}
        for kind, (s, r, m) in (("Bound", bound), ("LagScaling", lag))
    ]
    return {"phase": phase, "observedGeneration": generation, "conditions": conditions}
