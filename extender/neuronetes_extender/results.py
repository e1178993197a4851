"""What the GPU cache's decisions return: holds, filter decisions, bind plans and refusals,
barrier states, explanations and statistics. An expected refusal is a typed result
(`BindRefused`, like the engine's `Unschedulable`); the one exception, `CacheInvariantError`,
is a bug."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final, Literal

from neuronetes import contracts as c
from neuronetes.assignment import PodGpuRequest
from neuronetes.engine import Separation
from neuronetes.model import GpuGrant, PodRequest

__all__ = [
    "IN_GANG",
    "NO_OTHER_NODE",
    "TIE",
    "BarrierState",
    "BindPlan",
    "BindRefused",
    "CacheInvariantError",
    "CacheStats",
    "Explanation",
    "FilterDecision",
    "Hold",
]


class CacheInvariantError(RuntimeError):
    """The cache's books disagree with themselves (a bug: allocations leaked, oversubscribed,
    or a hold that holds nothing)."""


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a pod goes where it goes, for a pod Event: the node and GPUs, the engine's reason
    (NVLink group, NUMA node, tightest fit…) and what set the node apart from the runner-up.

    The runner-up is the candidate the engine scored best after the chosen node when the filter
    chose it (`runner_up`); at bind both are scored term by term (`scored`): `margin` is the
    chosen node's total minus the runner-up's, `terms` the largest differences (term name, the
    chosen node's weighted value minus the runner-up's; a negative one is a term the node lost
    on), `more_terms` how many smaller ones differ too. Terms equal on both nodes are never
    listed. Without a runner-up, `alone` says why there is none (no other candidate fits, a
    gang placed as a whole). An explanation with `terms` and neither is read as it was written.
    """

    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    reason: str
    terms: tuple[tuple[str, float], ...] = ()
    runner_up: str = ""
    margin: float | None = None  # None until `scored`
    more_terms: int = 0
    alone: str = ""

    def scored(self, found: Separation | None, shown: int) -> Explanation:
        """This explanation with the engine's comparison of its node and `runner_up`
        (`PlacementEngine.separation`; None: the node itself was not scored), at most `shown`
        terms listed."""
        if not self.runner_up or found is None:
            return self
        if found.runner_up is None:
            return replace(self, runner_up="", alone=f"{self.runner_up}, the runner-up, no longer fits")
        terms = found.terms[:shown]
        return replace(self, terms=terms, margin=found.margin, more_terms=len(found.terms) - len(terms))

    def text(self) -> str:
        """One line: ``node n1, gpus 0,1 (one nvlink group (nvlink group 0)); vs runner-up n2
        (margin +0.0765): topology +0.0765`` or ``…; no runner-up: no other candidate node fits``."""
        gpus = ",".join(str(j) for j in self.gpu_indices) or "none"
        line = f"node {self.node}, gpus {gpus}" + (f" ({self.reason})" if self.reason else "")
        listed = ", ".join(f"{name} {value:+.3g}" for name, value in self.terms)
        if self.more_terms:
            listed += f", +{self.more_terms} more"
        if self.runner_up and self.margin is None:
            return line + f"; vs runner-up {self.runner_up} (not scored)"
        if self.runner_up:
            return line + f"; vs runner-up {self.runner_up} (margin {self.margin:+.3g}): " + (listed or TIE)
        if self.alone:
            return line + f"; no runner-up: {self.alone}"
        return line + (f"; {listed}" if listed else "")


TIE: Final = "no term differs (a tie the policy broke)"
"""What an explanation lists when the runner-up scored the same as the node on every term."""
NO_OTHER_NODE: Final = "no other candidate node fits"
IN_GANG: Final = "placed with its gang as a whole"
"""Why there is no runner-up: no other node passed the filter, or a gang member (the gang was
placed as a whole, a member has no runner-up of its own)."""


@dataclass(frozen=True, slots=True)
class Hold:
    """GPUs (and CPU/memory) held on a node for a pod until its bind, or until `expires_at`
    (the cache's monotonic clock: the one TTL of every hold, gang slots included)."""

    alloc_id: str
    pod: str  # pod identity; "" for a group member not yet claimed
    node: str
    request: PodRequest
    gpu: PodGpuRequest | None
    grants: tuple[GpuGrant, ...]
    expires_at: float
    score: float = 0.0
    reason: str = ""
    group: str = ""
    uid: str = ""
    namespace: str = ""
    name: str = ""
    priority: int = 0
    explanation: Explanation | None = None


@dataclass(frozen=True, slots=True)
class FilterDecision:
    feasible: tuple[str, ...]
    """Nodes the pod may go to, best first; the first holds the pod's GPUs (`hold`)."""
    failed: dict[str, str]
    unresolvable: dict[str, str]
    hold: Hold | None
    topology_violation: str | None = None
    explanation: Explanation | None = None


@dataclass(frozen=True, slots=True)
class BindPlan:
    """What a bind must post, decided under the lock; `GpuCache.bind_done` records the outcome."""

    pod: str
    node: str
    annotations: dict[str, str]
    alloc_id: str | None  # the hold this bind realises (None for a pod without GPUs)
    assignment: c.Assignment | None = None
    already_bound: bool = False
    group: str = ""  # the gang whose slot this bind realises ("" for a lone pod)
    reservation_id: str = ""
    explanation: Explanation | None = None


@dataclass(frozen=True, slots=True)
class BindRefused:
    """The pod may not be bound to the node (an expected answer, not an error): `reason` says
    why; kube-scheduler forgets what it assumed for the pod and schedules it again."""

    reason: str


BarrierStatus = Literal["open", "wait", "failed"]


@dataclass(frozen=True, slots=True)
class BarrierState:
    """A gang member's view of its group's bind barrier (`GpuCache.gang_arrive`).

    `open`: post the Binding; `wait`: not every member has reached bind yet (ask again when the
    barrier listener names the group); `failed`: do not bind, `reason` says why. `deadline` is
    when the reservation expires, on the cache's monotonic clock.
    """

    status: BarrierStatus
    reason: str
    arrived: int
    size: int
    deadline: float


@dataclass(frozen=True, slots=True)
class CacheStats:
    nodes: int
    gpus: int
    pods: int
    bound_pods: int
    pending_gpu_pods: int
    holds: int
    gangs: int
    unaccounted_pods: int
    conflicts: int
    rebuilds: int
    synced: bool
    sync_age_seconds: dict[str, float] = field(default_factory=dict)
    ignored_assignment_changes: int = 0
    """Times a bound pod's ``neuronetes.io/assigned-gpus`` changed after its allocation was
    recorded (the change was ignored: the ledger is not tenant-writable)."""
