"""Token- and queue-driven autoscaling of AgentPools: the decision, pure (docs/autoscaling.md).

`signals` holds what the decision reads, `policy` the decision (`TokenAutoscaler.decide`),
`toolbinding_lag` the ToolBinding lag rule. No Kubernetes client, no I/O, no wall clock: the caller
reads metrics and pods and passes its own time in.
"""

from neuronetes.autoscale.policy import AutoscaleSettings, Decision, TokenAutoscaler
from neuronetes.autoscale.signals import Bounds, PoolSignals, ReplicaCounts
from neuronetes.autoscale.toolbinding_lag import lag_replicas

__all__ = [
    "AutoscaleSettings",
    "Bounds",
    "Decision",
    "PoolSignals",
    "ReplicaCounts",
    "TokenAutoscaler",
    "lag_replicas",
]
