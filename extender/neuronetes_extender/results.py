"""What the GPU cache's decisions return: holds, filter decisions, bind plans and refusals,
barrier states, explanations and statistics. An expected refusal is a typed result
(`BindRefused`, like the engine's `Unschedulable`); the one exception, `CacheInvariantError`,
is a bug."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from neuronetes import contracts as c
from neuronetes.assignment import PodGpuRequest
from neuronetes.model import GpuGrant, PodRequest

__all__ = [
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
    (NVLink group, NUMA node, tightest fit…) and the score terms that decided it (the three
    largest weighted values by magnitude, term name first)."""

    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    reason: str
    terms: tuple[tuple[str, float], ...] = ()

    def text(self) -> str:
        """One line: ``node n1, gpus 0,1 (one nvlink group (nvlink group 0)); topology +0.25, …``."""
        gpus = ",".join(str(j) for j in self.gpu_indices) or "none"
        line = f"node {self.node}, gpus {gpus}" + (f" ({self.reason})" if self.reason else "")
        if self.terms:
            line += "; " + ", ".join(f"{name} {value:+.3g}" for name, value in self.terms)
        return line


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
