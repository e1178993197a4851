"""The ToolBinding lag rule: a queue (Kafka, NATS, RabbitMQ, Redis, SQS) read by a pool's replicas.

lag = queue_depth − replicas · prefetch · throughput (``spec.queueConfig``: ``prefetch`` messages per
batch, ``throughput`` batches per poll interval per replica). When lag exceeds ``maxLagThreshold`` the
bound pool scales up to the fewest replicas that bring lag to the threshold or under it, capped at
maxReplicas. The rule never scales down: that is the token autoscaler's, whose idle step-down also
sees the pool.
"""

from __future__ import annotations

import math

from neuronetes.autoscale.signals import Bounds

__all__ = ["lag_replicas"]


def lag_replicas(
    queue_depth: float,
    replicas: int,
    prefetch: int,
    throughput: float,
    max_lag_threshold: float,
    bounds: Bounds,
) -> tuple[int, float]:
    """(desired replicas, lag). Desired is ``replicas`` (within bounds) while lag <= the threshold.

    With ``prefetch · throughput == 0`` no replica drains anything: a lag over the threshold then asks
    for maxReplicas (the most the binding may do; status shows the lag).
    """
    if queue_depth < 0 or not math.isfinite(queue_depth):
        raise ValueError(f"queue_depth must be a finite number >= 0, not {queue_depth!r}")
    if replicas < 0:
        raise ValueError(f"replicas must be >= 0, not {replicas}")
    if prefetch < 1:
        raise ValueError(f"spec.queueConfig.prefetch must be >= 1, not {prefetch}")
    if throughput < 0 or not math.isfinite(throughput):
        raise ValueError(f"spec.queueConfig.throughput must be a finite number >= 0, not {throughput!r}")
    if max_lag_threshold < 0:
        raise ValueError(f"spec.queueConfig.maxLagThreshold must be >= 0, not {max_lag_threshold!r}")
    drained_per_replica = prefetch * throughput
    lag = queue_depth - replicas * drained_per_replica
    if lag <= max_lag_threshold:
        return bounds.clamp(replicas), lag
    if drained_per_replica == 0:
        return bounds.max_replicas, lag
    # The fewest n with queue_depth − n · drained_per_replica <= max_lag_threshold.
    needed = math.ceil((queue_depth - max_lag_threshold) / drained_per_replica)
    return bounds.clamp(max(needed, replicas)), lag
