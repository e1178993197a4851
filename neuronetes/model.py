"""The GPU and node domain model: plain, immutable descriptions of hardware and requests.

These are the shapes every other part speaks in. The placement engine turns a list of
`NodeSpec` into vectorised arrays (`neuronetes.inventory.ClusterState`); the extender and the
simulator build `PodRequest`s from pods and trace rows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

MILLI_PER_GPU = 1000
"""A whole GPU's compute in milli-GPU (`neuronetes.io/gpu-compute` percent × 10)."""


class GpuHealth(enum.Enum):
    """GPU states of the GPU state machine (docs/gpu-health.md).

    AVAILABLE/ALLOCATED/IN_USE are schedulable (capacity permitting); DEGRADED, RESETTING and
    OFFLINE take the GPU out of placement until it returns to AVAILABLE.
    """

    AVAILABLE = "Available"
    ALLOCATED = "Allocated"
    IN_USE = "InUse"
    DEGRADED = "Degraded"
    RESETTING = "Resetting"
    OFFLINE = "Offline"

    @property
    def schedulable(self) -> bool:
        return self in (GpuHealth.AVAILABLE, GpuHealth.ALLOCATED, GpuHealth.IN_USE)


class Locality(enum.Enum):
    """Topology locality a multi-GPU request (or a gang) asks for (`gpuRequirements.topology.locality`)."""

    ANY = "any"
    SAME_NODE = "same-node"
    SAME_SOCKET = "same-socket"
    NVLINK = "nvlink"

    @classmethod
    def parse(cls, value: str | Locality | None) -> Locality:
        if value is None or value == "":
            return cls.ANY
        if isinstance(value, Locality):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(v.value for v in cls)
            raise ValueError(f"locality {value!r} is not one of: {allowed}") from None


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One physical GPU as discovered through NVML.

    `nvlink_group` identifies the set of GPUs fully connected by NVLink (an NVSwitch domain or
    an NVLink bridge pair); -1 means PCIe only. `nvlink_bandwidth_gbps` is the nominal
    aggregate NVLink bandwidth of this GPU in GB/s (0 without NVLink).
    """

    index: int
    uuid: str
    model: str
    memory_mib: int
    numa_node: int = 0
    socket: int = 0
    pcie_gen: int = 4
    nvlink_group: int = -1
    nvlink_bandwidth_gbps: float = 0.0
    nvlink_peers: tuple[int, ...] = ()
    mig_enabled: bool = False
    health: GpuHealth = GpuHealth.AVAILABLE
    mig_instances: tuple[tuple[str, int], ...] | None = None
    """The MIG instances the GPU has, as (profile, start slot), when its agent reported them: a
    MIG pod then gets one of these, idle. None: not reported (label-only nodes, the simulator's
    clusters), and any placement the catalog allows is offered, as if instances were made on
    demand."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node's capacity and the facts scorers use (cost, zone, cached models)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuSpec, ...]
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    price_per_hour: float | None = None
    """Per hour (`neuronetes.pricing`); None: unknown, which no scorer or filter reads as free."""
    spot: bool = False
    zone: str = ""
    region: str = ""
    cached_models: frozenset[str] = frozenset()
    schedulable: bool = True

    @property
    def gpu_model(self) -> str:
        return self.gpus[0].model if self.gpus else ""


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod (or one gang member) asks of the GPU cluster.

    A request is *exclusive* when it wants whole GPUs (`gpu_milli == 1000` and no explicit GPU
    memory); otherwise each of its `gpus` GPUs is *shared* and must have `gpu_milli` compute and
    `gpu_memory_mib` memory free. `gpu_models` lists acceptable GPU models (empty: any).
    """

    name: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_milli: int = MILLI_PER_GPU
    gpu_memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    mig_profile: str | None = None
    locality: Locality = Locality.ANY
    min_bandwidth_gbps: float = 0.0
    model_name: str | None = None
    model_cache_names: tuple[str, ...] = ()
    """The ``cachedModels`` entries that hold `model_name` for this request: the shared entry and
    its namespace's (`neuronetes.modelcache.hit_entries`), never another namespace's; empty: the
    shared entry alone."""
    model_cache_weight: float | None = None
    """The weight of the `model_cache` term for this request, in place of the policy's (None: the
    policy's). A pool's ``cacheAware.cacheHitWeight``, through its pods' annotation."""
    preferred_zones: tuple[str, ...] = ()
    preferred_nodes: tuple[str, ...] = ()
    """Nodes the pod's data lives on (`neuronetes.locality`): the data-locality term's best nodes."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes running workloads the pod avoids: the data-locality term scores them 0."""
    weight_scale: tuple[tuple[str, float], ...] = ()
    """Multipliers of the policy's term weights for this request, by scorer name (e.g.
    ``(("data_locality", 2.0),)``; a term not named keeps its weight)."""
    max_nodes_to_score: int = 0
    """Feasible nodes scored per decision (0: all): the engine's candidate limit
    (`neuronetes.engine.core.PlacementEngine.evaluate`). Not part of the request's shape."""
    max_price_per_hour: float | None = None
    spot_allowed: bool = True
    priority: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_memory_mib < 0:
            raise ValueError(f"request {self.name!r}: resource amounts must be non-negative")
        if not 0 < self.gpu_milli <= MILLI_PER_GPU:
            raise ValueError(f"request {self.name!r}: gpu_milli must be in 1..1000, got {self.gpu_milli}")
        if self.mig_profile is not None and self.gpus != 1:
            raise ValueError(f"request {self.name!r}: a MIG request asks for exactly one instance")
        if self.max_nodes_to_score < 0 or any(w < 0 for _, w in self.weight_scale):
            raise ValueError(f"request {self.name!r}: max_nodes_to_score and weight multipliers must be >= 0")

    @property
    def exclusive(self) -> bool:
        return (
            self.gpus > 0
            and self.gpu_milli >= MILLI_PER_GPU
            and self.gpu_memory_mib == 0
            and self.mig_profile is None
        )

    @property
    def shared(self) -> bool:
        return self.gpus > 0 and not self.exclusive and self.mig_profile is None

    @property
    def gpu_milli_total(self) -> int:
        """GPU demand in milli-GPU (what placement-quality figures count)."""
        return self.gpus * self.gpu_milli

    def shape(self) -> PodRequest:
        """The request without identity: equal shapes get equal placement scores (the candidate
        limit changes which nodes are scored, not their scores)."""
        return replace(self, name="", priority=0, max_nodes_to_score=0)

    def weight_multiplier(self, term: str) -> float:
        """This request's multiplier of the policy's weight of scorer `term` (1: as the policy says)."""
        for name, scale in self.weight_scale:
            if name == term:
                return scale
        return 1.0


@dataclass(frozen=True, slots=True)
class GpuGrant:
    """The share of one GPU granted to a request."""

    gpu_index: int
    milli: int
    memory_mib: int
    mig_profile: str | None = None
    mig_start: int | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """The engine's decision for one request: a node, GPUs on it, and why."""

    request: PodRequest
    node: str
    node_index: int
    grants: tuple[GpuGrant, ...]
    score: float
    reason: str = ""

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(g.gpu_index for g in self.grants)
