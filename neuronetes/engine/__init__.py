"""The placement engine: vectorised filters and scorers, policies, GPU selection, gangs."""

from neuronetes.engine.core import Evaluation, PlacementEngine, Unschedulable, scale_scores
from neuronetes.engine.explain import Separation, separate
from neuronetes.engine.policy import POLICIES, Policy, get_policy
from neuronetes.engine.profile import TypicalShape, WorkloadProfile

__all__ = [
    "POLICIES",
    "Evaluation",
    "PlacementEngine",
    "Policy",
    "Separation",
    "TypicalShape",
    "Unschedulable",
    "WorkloadProfile",
    "get_policy",
    "scale_scores",
    "separate",
]
