"""ToolBinding status: the referenced pool resolved, and what the lag rule does now. Pure.

The lag rule itself (``lag = depth - replicas x prefetch x throughput``; scale when it exceeds
``maxLagThreshold``) is the autoscaling controller's (`neuronetes_operator.autoscaler`), which
reads the depth from Prometheus (``spec.queue.type: prometheus``) and writes queueDepth, lag and
desiredReplicas; this module resolves the pool and says whether the lag rule can act.
"""

from __future__ import annotations

from typing import Any

from neuronetes.api.models import ToolBindingSpec

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
    queue_type = spec.queue.type if spec.queue is not None else None
    if not cfg.autoscale_on_lag:
        lag = ("False", "Disabled", "autoscaleOnLag is false")
    elif queue_type == "prometheus":
        lag = (
            "True",
            "AutoscalingController",
            f"the autoscaling controller reads the depth from Prometheus and scales the pool "
            f"when lag passes {cfg.max_lag_threshold or 0} messages",
        )
    else:
        lag = (
            "False",
            "QueueNotReadable",
            f"queue type {queue_type or 'unset'}: the depth is read from Prometheus only; set "
            "spec.queue.type prometheus with the broker exporter's query (docs/autoscaling.md)",
        )
    conditions = [
        {"type": kind, "status": s, "reason": r, "message": m, "observedGeneration": generation}
        for kind, (s, r, m) in (("Bound", bound), ("LagScaling", lag))
    ]
    return {"phase": phase, "observedGeneration": generation, "conditions": conditions}
