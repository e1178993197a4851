"""Typed mirrors of the NeuroNetes custom resources (``crds/`` is the source of truth).

Every Struct uses the CRD's wire names (camelCase, with the CRD's spelling of acronyms such as
``memoryMiB`` and ``gpuUUID``), the CRD's defaults, and the CRD's OpenAPI bounds (minimum/maximum,
lengths, patterns) as msgspec constraints, so decoding enforces what the schema enforces. The CEL
rules (cross-field checks such as ``minReplicas <= maxReplicas``) are enforced by the API server
only. ``tests/unit/test_crd_models.py`` walks each CRD schema beside its model and fails on any
difference in fields, types, enums, defaults, required fields or bounds.

Decode with :func:`decode` (from a dict, e.g. parsed YAML or ``kubectl -o json``) and encode with
:func:`encode` (to a dict for a Kubernetes client); fields left at their defaults are omitted.

Over 400 lines because it is one wire format, the mirror of ``crds/``: one section per custom
resource over the constrained types they share (quantities, MIG profiles, replicas), with the
registry of all five (`RESOURCES`) the schema test walks. Kept whole so that the test's one walk
and a reader's comparison with the CRDs read one file in the CRDs' own order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec
from msgspec import Meta, field

from neuronetes.contracts import API_VERSION, GROUP, VERSION
from neuronetes.locality import LABEL_SET_PATTERN, STORE_REF_PATTERN

__all__ = [
    "API_VERSION",
    "DEFAULT_MAX_REPLICAS",
    "GROUP",
    "MAX_REPLICAS",
    "MIG_PROFILE_PATTERN",
    "QUANTITY_PATTERN",
    "RESOURCES",
    "VERSION",
    "AgentPool",
    "AgentPoolSpec",
    "AgentPoolStatus",
    "Condition",
    "GPUNode",
    "GPUNodeSpec",
    "GPUNodeStatus",
    "GPUSlice",
    "GPUSliceSpec",
    "GPUSliceStatus",
    "GangReservation",
    "GangReservationSpec",
    "GangReservationStatus",
    "Resource",
    "ToolBinding",
    "ToolBindingSpec",
    "ToolBindingStatus",
    "decode",
    "encode",
]

QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""Kubernetes resource.Quantity syntax (the pattern controller-gen emits)."""
MIG_PROFILE_PATTERN: Final = r"^[1-9][0-9]*g\.[1-9][0-9]*gb(\+me)?$"
"""MIG profile names (``1g.5gb``, ``3g.40gb``, ``1g.10gb+me``), as ``neuronetes.mig`` parses them."""
DURATION_PATTERN: Final = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"
CLOCK_RANGE_PATTERN: Final = r"^([01][0-9]|2[0-3]):[0-5][0-9]-([01][0-9]|2[0-3]):[0-5][0-9]$"
TIME_ZONE_PATTERN: Final = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"
LABEL_VALUE_PATTERN: Final = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_REPLICAS: Final = 4096
"""The CRD's bound (OpenAPI ``maximum``) on an AgentPool's replicas, minReplicas and maxReplicas,
which no configuration raises: a reconcile of a pool this large holds about 30 MiB and takes
about 0.4 s of the operator's CPU, four at once (its default workers) about 120 MiB of its 512 MiB
(bench/README.md, "Admission and reconcile cost")."""
DEFAULT_MAX_REPLICAS: Final = 1024
"""The admission policy's bound on the same fields and on ``kubectl scale``
(``manifests/policies/agentpool-replicas.yaml``), which the chart value ``agentPools.maxReplicas``
sets, up to `MAX_REPLICAS`: the extender's largest gang (``maxGangSize``) and the most placements
``status.placements`` lists."""

# Shared field types. int32/int64 are both Python int; the CRD's `format` is not mirrored.
Quantity = int | Annotated[str, Meta(pattern=QUANTITY_PATTERN)]
MigProfile = Annotated[str, Meta(max_length=32, pattern=MIG_PROFILE_PATTERN)]
NonNegative = Annotated[int, Meta(ge=0)]
Replicas = Annotated[int, Meta(ge=0, le=MAX_REPLICAS)]
Percent = Annotated[int, Meta(ge=0, le=100)]
Priority = Annotated[int, Meta(ge=0, le=1_000_000_000)]
GpuIndex = Annotated[int, Meta(ge=0, le=15)]
Str63 = Annotated[str, Meta(max_length=63)]
Str128 = Annotated[str, Meta(max_length=128)]
Str253 = Annotated[str, Meta(max_length=253)]
CachedModelEntry = Annotated[str, Meta(max_length=317)]
"""A GPUNode ``cachedModels`` entry: ``<model>`` or ``<namespace>:<model>`` (63 + 1 + 253)."""


class _Object(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel", forbid_unknown_fields=True):
    """Base of every nested object: camelCase wire names, defaults omitted, unknown fields refused."""


class Condition(_Object):
    """A standard status condition (the shape of metav1.Condition)."""

    type: Annotated[str, Meta(max_length=316)]
    status: Literal["True", "False", "Unknown"]
    observed_generation: NonNegative | None = None
    last_transition_time: datetime | None = None
    reason: Annotated[str, Meta(max_length=1024)] | None = None
    message: Annotated[str, Meta(max_length=32768)] | None = None


Conditions = Annotated[list[Condition], Meta(max_length=32)]


class LocalObjectReference(_Object):
    """A reference to an object of a known kind in the same namespace."""

    name: Str253


# ---- AgentPool ---------------------------------------------------------------------------------


class GpuTopology(_Object):
    locality: Literal["same-node", "same-socket", "nvlink", "any"] = "any"
    min_bandwidth: Quantity | None = None


class GpuRequirements(_Object):
    count: Annotated[int, Meta(ge=1, le=16)] = 1
    type: Annotated[str, Meta(max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")] | None = None
    memory: Quantity | None = None
    topology: GpuTopology = field(default_factory=GpuTopology)


class Saturation(_Object):
    """When a pool counts as saturated: it scales up by the cap whatever the token estimate says."""

    kv_cache_usage: Annotated[float, Meta(ge=0.05, le=1)] = 0.9
    waiting_requests_per_replica: Annotated[float, Meta(ge=0.1, le=100_000)] = 8.0


class ScalingBehavior(_Object):
    """The autoscaler's safety layers (docs/autoscaling.md, "Safety layers")."""

    scale_up_limit: Annotated[float, Meta(ge=1, le=100)] = 2.0
    scale_down_limit: Annotated[float, Meta(ge=1, le=100)] = 2.0
    tolerance: Annotated[float, Meta(ge=0, le=0.5)] = 0.1
    stabilization_window_seconds: Annotated[int, Meta(ge=0, le=3600)] = 300
    saturation: Saturation = field(default_factory=Saturation)
    orphan_window_seconds: Annotated[int, Meta(ge=1, le=3600)] = 60


PROMETHEUS_METRIC_NAME_PATTERN: Final = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
MetricName = Annotated[str, Meta(max_length=253, pattern=PROMETHEUS_METRIC_NAME_PATTERN)]


class MetricNames(_Object):
    """Which serving-engine metric gives each signal; vLLM's names by default."""

    waiting_requests: MetricName = "vllm:num_requests_waiting"
    running_requests: MetricName = "vllm:num_requests_running"
    prompt_tokens: MetricName = "vllm:prompt_tokens_total"
    generation_tokens: MetricName = "vllm:generation_tokens_total"
    request_prompt_tokens: MetricName = "vllm:request_prompt_tokens"
    time_to_first_token: MetricName = "vllm:time_to_first_token_seconds"
    kv_cache_usage: MetricName = "vllm:kv_cache_usage_perc"
    kv_cache_usage_fallback: MetricName = "vllm:gpu_cache_usage_perc"
    queued_prompt_tokens: MetricName | None = None


class AutoscalingMetrics(_Object):
    """Where the autoscaler reads its signals."""

    source: Literal["pods", "prometheus"] = "pods"
    prometheus_url: Annotated[str, Meta(max_length=2048, pattern=r"^https?://[^\s]+$")] | None = field(
        default=None, name="prometheusURL"
    )
    port: Annotated[int, Meta(ge=1, le=65535)] = 8000
    path: Annotated[str, Meta(max_length=253, pattern=r"^/[^\s]*$")] = "/metrics"
    queries: MetricNames = field(default_factory=MetricNames)
    staleness_seconds: Annotated[int, Meta(ge=1, le=3600)] = 30


class Autoscaling(_Object):
    enabled: bool = True
    ttft_ms: Annotated[int, Meta(ge=1)] | None = None
    tokens_per_second: Annotated[int, Meta(ge=1)] | None = None
    model_load_seconds: NonNegative = 0
    cooldown_seconds: NonNegative = 300
    max_sessions_per_replica: Annotated[int, Meta(ge=1)] | None = None
    behavior: ScalingBehavior = field(default_factory=ScalingBehavior)
    metrics: AutoscalingMetrics = field(default_factory=AutoscalingMetrics)


class GangScheduling(_Object):
    enabled: bool = False
    min_members: Annotated[int, Meta(ge=1)] | None = None
    schedule_timeout_seconds: Annotated[int, Meta(ge=1, le=86400)] = 120


class Preemption(_Object):
    enabled: bool = False
    policy: Literal["lowest-priority-first", "fewest-victims"] = "lowest-priority-first"


class FallbackTrigger(_Object):
    cost_exceeded: bool = False
    slo_at_risk: bool = False
    hold_seconds: Annotated[int, Meta(ge=0, le=86400)] = 300


class SpotStrategy(_Object):
    instance_types: Annotated[list[Str128], Meta(max_length=64)] | None = None
    on_interruption: Literal["migrate-to-on-demand", "reschedule-on-spot", "scale-down"] = (
        "migrate-to-on-demand"
    )
    max_spot_percent: Percent = 100


class InterruptionThreshold(_Object):
    count: Annotated[int, Meta(ge=1)]
    window: Annotated[str, Meta(max_length=32, pattern=DURATION_PATTERN)]
    action: Literal["disable-spot", "fallback-model", "alert"] = "disable-spot"


class CostOptimization(_Object):
    enabled: bool | None = None  # unset: resolved by neuronetes_operator.policy (docs/agentpool.md)
    slo_headroom_ms: NonNegative | None = None
    max_cost_per_hour: Annotated[float, Meta(ge=0)] | None = None
    spot_enabled: bool = False
    spot_max_interruptions: NonNegative | None = None
    fallback_model: Str253 | None = None
    fallback_template: PodTemplate | None = None
    fallback_gpu_count: Annotated[int, Meta(ge=1, le=16)] | None = field(
        default=None, name="fallbackGPUCount"
    )
    fallback_trigger: FallbackTrigger | None = None
    spot_strategy: SpotStrategy | None = None
    interruption_threshold: InterruptionThreshold | None = None


class TimeShifting(_Object):
    enabled: bool = False
    clean_energy_hours: Annotated[str, Meta(pattern=CLOCK_RANGE_PATTERN)] | None = None
    time_zone: Annotated[str, Meta(max_length=64, pattern=TIME_ZONE_PATTERN)] = "UTC"
    max_delay: Annotated[str, Meta(max_length=32, pattern=DURATION_PATTERN)] = "6h"
    expected_runtime: Annotated[str, Meta(max_length=32, pattern=DURATION_PATTERN)] | None = None


class CarbonAware(_Object):
    enabled: bool = False
    preferred_regions: (
        Annotated[list[Annotated[str, Meta(max_length=63, pattern=LABEL_VALUE_PATTERN)]], Meta(max_length=64)]
        | None
    ) = None
    time_shifting: TimeShifting | None = None
    max_carbon_intensity: Annotated[float, Meta(ge=0)] | None = None


class DataLocality(_Object):
    vector_store_affinity: (
        Annotated[list[Annotated[str, Meta(max_length=265, pattern=STORE_REF_PATTERN)]], Meta(max_length=64)]
        | None
    ) = None
    locality_weight: Literal["low", "medium", "high"] = "medium"
    anti_affinity: (
        Annotated[list[Annotated[str, Meta(max_length=1024, pattern=LABEL_SET_PATTERN)]], Meta(max_length=64)]
        | None
    ) = None


class LabelSelectorRequirement(_Object):
    key: Annotated[str, Meta(max_length=317)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Annotated[list[Str63], Meta(max_length=64)] | None = None


class LabelSelector(_Object):
    match_labels: Annotated[dict[str, Str63], Meta(max_length=64)] | None = None
    match_expressions: Annotated[list[LabelSelectorRequirement], Meta(max_length=64)] | None = None


class PreloadNodes(_Object):
    label_selector: LabelSelector | None = None


class PreloadStrategy(_Object):
    nodes: PreloadNodes | None = None
    min_cached_replicas: NonNegative | None = None


class CacheAware(_Object):
    enabled: bool = False
    cache_hit_weight: Annotated[float, Meta(ge=0, le=1)] = 0.2
    preload_strategy: PreloadStrategy | None = None


class FastScheduling(_Object):
    enabled: bool = False
    max_nodes_to_score: Annotated[int, Meta(ge=1, le=100_000)] = 100


class Scheduling(_Object):
    priority: Priority = 0
    priority_tier: (
        Annotated[str, Meta(max_length=40, pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")] | None
    ) = None
    gang_scheduling: GangScheduling | None = None
    preemption: Preemption | None = None
    cost_optimization: CostOptimization | None = None
    carbon_aware: CarbonAware | None = None
    data_locality: DataLocality | None = None
    cache_aware: CacheAware | None = None
    fast_scheduling: FastScheduling | None = None


class PodTemplate(_Object):
    """A core/v1 PodTemplateSpec, kept as free-form metadata and spec."""

    metadata: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None


class AgentPoolSpec(_Object):
    replicas: Replicas | None = None
    min_replicas: Replicas = 1
    max_replicas: Replicas | None = None
    prewarm_percent: Percent = 0
    model: Str253 | None = None
    mig_profile: MigProfile | None = None
    gpu_requirements: GpuRequirements = field(default_factory=GpuRequirements)
    autoscaling: Autoscaling | None = None
    scheduling: Scheduling | None = None
    template: PodTemplate | None = None


class Placement(_Object):
    """Where one bound pod of a pool runs (from its ``neuronetes.io/assigned-gpus``)."""

    pod: Str253
    node: Str253 | None = None
    gpus: Annotated[list[NonNegative], Meta(max_length=64)] | None = None
    gang: Str63 | None = None


class PolicyState(_Object):
    """A policy block of an AgentPool spec as resolved, and what it does now."""

    name: Str63
    enabled: bool
    effect: Annotated[str, Meta(max_length=1024)] | None = None


class AutoscalingStatus(_Object):
    """The autoscaling controller's last decision (docs/autoscaling.md, "The controller")."""

    current_replicas: NonNegative | None = None
    desired_replicas: NonNegative | None = None
    rule: Annotated[str, Meta(max_length=64)] | None = None
    expected_ttft_seconds: Annotated[float, Meta(ge=0)] | None = field(
        default=None, name="expectedTTFTSeconds"
    )
    inputs: Annotated[dict[str, float], Meta(max_length=32)] | None = None
    stale_metrics: Annotated[list[Str63], Meta(max_length=16)] | None = None
    message: Annotated[str, Meta(max_length=1024)] | None = None
    conflict: Annotated[str, Meta(max_length=512)] | None = None
    last_decision_time: datetime | None = None
    next_decision_time: datetime | None = None
    last_scale_time: datetime | None = None


class SpotInterruption(_Object):
    """One interruption notice on a node that hosted the pool's pods (`neuronetes.spot.notice_of`)."""

    node: Str253
    source: Str63
    noticed: datetime
    deadline: datetime


class SpotStatus(_Object):
    """The pool's spot state (docs/spot.md): the spot share, notices, the interruption threshold."""

    allowed_units: NonNegative | None = None
    spot_units: NonNegative | None = None
    interruptions: Annotated[list[SpotInterruption], Meta(max_length=64)] | None = None
    threshold_tripped_at: datetime | None = None
    threshold_action: Literal["disable-spot", "fallback-model", "alert"] | None = None
    fallback_requested: bool = False
    message: Annotated[str, Meta(max_length=1024)] | None = None


class CarbonStatus(_Object):
    """The carbon gate-release controller's view of a pool (docs/carbon.md)."""

    gated_pods: NonNegative | None = None
    released_pods: NonNegative | None = None
    intensity: Annotated[float, Meta(ge=0)] | None = None
    intensity_source: Annotated[str, Meta(max_length=64)] | None = None
    intensity_time: datetime | None = None
    avoided_grams_co2: float | None = field(default=None, name="avoidedGramsCO2")
    accounting: Literal["location-based"] | None = None
    last_release_reason: (
        Literal["window", "stale", "intensity", "deadline", "forecast", "disabled"] | None
    ) = None
    last_release_time: datetime | None = None
    message: Annotated[str, Meta(max_length=1024)] | None = None


class FallbackStatus(_Object):
    """The cost/SLO decision tree's last answer (`neuronetes.costpolicy`, docs/fallback.md)."""

    action: (
        Literal[
            "keep", "use-spot", "degrade-model", "restore-model", "scale-up", "use-on-demand", "faster-model"
        ]
        | None
    ) = None
    reason: Annotated[str, Meta(max_length=1024)] | None = None
    triggers: (
        Annotated[list[Literal["costExceeded", "sloAtRisk", "spotInterruptions"]], Meta(max_length=3)] | None
    ) = None
    restore_since: datetime | None = None
    last_switch_time: datetime | None = None


class CostStatus(_Object):
    """The pool's cost per hour (docs/cost.md): running, projected, budget."""

    current_per_hour: Annotated[float, Meta(ge=0)]
    projected_per_hour: Annotated[float, Meta(ge=0)]
    budget_per_hour: Annotated[float, Meta(ge=0)] | None = None
    unknown_price_replicas: NonNegative | None = None


class ModelCacheStatus(_Object):
    """Model preloading (``cacheAware.preloadStrategy``, docs/model-cache.md)."""

    model: Str253 | None = None
    wanted: NonNegative | None = None
    cached_nodes: Annotated[list[Str253], Meta(max_length=256)] | None = None
    preloading: Annotated[list[Str253], Meta(max_length=256)] | None = None
    failed: Annotated[list[Str253], Meta(max_length=256)] | None = None
    message: Annotated[str, Meta(max_length=1024)] | None = None


class AgentPoolStatus(_Object):
    phase: Literal["Pending", "Scheduling", "Ready", "Scaling", "Degraded", "Failed"] | None = None
    replicas: NonNegative | None = None
    ready_replicas: NonNegative | None = None
    desired: NonNegative | None = None
    spot_replicas: NonNegative | None = None
    gpus: NonNegative | None = None
    cost_per_hour: Annotated[float, Meta(ge=0)] | None = None
    cost: CostStatus | None = None
    active_model: Str253 | None = None
    fallback: FallbackStatus | None = None
    selector: str | None = None
    last_scale_time: datetime | None = None
    observed_generation: NonNegative | None = None
    placements: Annotated[list[Placement], Meta(max_length=1024)] | None = None
    policies: Annotated[list[PolicyState], Meta(max_length=16)] | None = None
    autoscaling: AutoscalingStatus | None = None
    spot: SpotStatus | None = None
    carbon: CarbonStatus | None = None
    cache: ModelCacheStatus | None = None
    conditions: Conditions | None = None


# ---- GPUSlice ----------------------------------------------------------------------------------


class GPUSliceSpec(_Object):
    memory: Quantity
    compute_percent: Annotated[int, Meta(ge=1, le=100)] = 100
    qos_class: Literal["Guaranteed", "Burstable", "BestEffort"] = "Burstable"
    priority: Priority = 0
    mig_profile: MigProfile | None = None
    node_name: Annotated[str, Meta(max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")] | None = None
    gpu_uuid: Annotated[str, Meta(max_length=128, pattern=r"^(GPU|MIG)-[A-Za-z0-9-]+$")] | None = field(
        default=None, name="gpuUUID"
    )


class GPUSliceStatus(_Object):
    phase: Literal["Pending", "Bound", "Active", "Released", "Failed"] | None = None
    node: str | None = None
    gpu_uuids: Annotated[list[Str128], Meta(max_length=16)] | None = field(default=None, name="gpuUUIDs")
    # What the slice reserves, copied from the spec by the operator when it binds the slice: the
    # extender counts these (a tenant may write the spec, never the status).
    memory_mib: Annotated[int, Meta(ge=1, le=1 << 24)] | None = field(default=None, name="memoryMiB")
    compute_percent: Annotated[int, Meta(ge=1, le=100)] | None = None
    qos_class: Literal["Guaranteed", "Burstable", "BestEffort"] | None = None
    # A MIG slice's instance, written with Bound: its profile and start slot on the GPU
    # ``gpuUUIDs[0]`` (what the extender counts), and the instance's own UUID when the agent reported it.
    mig_profile: MigProfile | None = None
    mig_start: Annotated[int, Meta(ge=0, le=7)] | None = None
    mig_instance_uuid: Str128 | None = field(default=None, name="migInstanceUUID")
    observed_generation: NonNegative | None = None
    conditions: Conditions | None = None


# ---- GPUNode -----------------------------------------------------------------------------------


class MigLayoutInstances(_Object):
    profile: MigProfile
    count: Annotated[int, Meta(ge=1, le=7)]


class MigPlacement(_Object):
    profile: MigProfile
    start: Annotated[int, Meta(ge=0, le=7)]


class MigLayoutEntry(_Object):
    gpu_index: GpuIndex
    mig_enabled: bool = True
    instances: Annotated[list[MigLayoutInstances], Meta(max_length=8)] | None = None
    placements: Annotated[list[MigPlacement], Meta(max_length=8)] | None = None


class GPUNodeSpec(_Object):
    mig_layout: Annotated[list[MigLayoutEntry], Meta(max_length=16)] | None = None
    cordoned_gpus: Annotated[list[Str128], Meta(max_length=16)] | None = field(
        default=None, name="cordonedGPUs"
    )


class MigInstance(_Object):
    profile: Annotated[str, Meta(max_length=32)]
    uuid: Str128 | None = None
    start: Annotated[int, Meta(ge=0, le=7)] | None = None
    size: Annotated[int, Meta(ge=1, le=8)] | None = None
    gpu_instance_id: NonNegative | None = None
    compute_instance_id: NonNegative | None = None
    memory_mib: NonNegative | None = field(default=None, name="memoryMiB")


class GpuAllocation(_Object):
    namespace: Str63
    pod: Str253
    pod_uid: Annotated[str, Meta(max_length=64)] | None = field(default=None, name="podUID")
    container: Str63 | None = None
    memory_mib: NonNegative | None = field(default=None, name="memoryMiB")
    compute_percent: Percent | None = None
    priority: int | None = None
    mig_instance: Str128 | None = None
    slice: Str253 | None = None


class GpuInfo(_Object):
    uuid: Str128
    index: GpuIndex
    model: str | None = None
    memory_mib: NonNegative | None = field(default=None, name="memoryMiB")
    mig_mode: Literal["Disabled", "Enabled", "Unsupported"] | None = None
    mig_instances: Annotated[list[MigInstance], Meta(max_length=8)] | None = None
    numa_node: Annotated[int, Meta(ge=-1)] | None = None
    socket: NonNegative | None = None
    pcie_gen: Annotated[int, Meta(ge=1, le=7)] | None = None
    nvlink_group: Annotated[int, Meta(ge=-1)] | None = None
    nvlink_peers: Annotated[list[GpuIndex], Meta(max_length=16)] | None = None
    nvlink_bandwidth_gbps: Annotated[float, Meta(ge=0)] | None = field(
        default=None, name="nvlinkBandwidthGBps"
    )
    health: Literal["Available", "Allocated", "InUse", "Degraded", "Resetting", "Offline"] | None = None
    health_reason: Annotated[str, Meta(max_length=1024)] | None = None
    cached_models: Annotated[list[CachedModelEntry], Meta(max_length=256)] | None = None
    allocations: Annotated[list[GpuAllocation], Meta(max_length=64)] | None = None


class MigRelayoutTime(_Object):
    index: GpuIndex
    last_relayout_time: datetime


class MigPlanStatus(_Object):
    state: Literal["Applying", "Applied", "Failed"] | None = None
    path: Literal["agent", "mig-manager", "none"] | None = None
    message: Annotated[str, Meta(max_length=4096)] | None = None
    planned_time: datetime | None = None
    mig_config: Annotated[str, Meta(max_length=63)] | None = None
    cordoned: bool | None = None
    gpus: Annotated[list[MigRelayoutTime], Meta(max_length=16)] | None = None


class GPUNodeStatus(_Object):
    mig_plan: MigPlanStatus | None = None
    model: str | None = None
    gpu_count: NonNegative | None = None
    healthy_gpus: NonNegative | None = field(default=None, name="healthyGPUs")
    driver_version: str | None = None
    cuda_version: str | None = None
    agent_version: str | None = None
    mig_config_state: Literal["None", "Pending", "Applying", "Applied", "Failed"] | None = None
    last_heartbeat_time: datetime | None = None
    gpus: Annotated[list[GpuInfo], Meta(max_length=16)] | None = None
    observed_generation: NonNegative | None = None
    conditions: Conditions | None = None


# ---- ToolBinding -------------------------------------------------------------------------------


class QueueSource(_Object):
    type: Literal["kafka", "nats", "rabbitmq", "redis", "sqs", "prometheus"]
    name: Annotated[str, Meta(max_length=1024)]
    address: Annotated[str, Meta(max_length=1024)] | None = None
    consumer_group: Str253 | None = None


class QueueConfig(_Object):
    autoscale_on_lag: bool = False
    max_lag_threshold: NonNegative | None = None
    prefetch: Annotated[int, Meta(ge=1, le=100_000)] = 1
    throughput: Annotated[float, Meta(ge=0)] = 1.0
    poll_interval_seconds: Annotated[int, Meta(ge=1, le=3600)] = 15


class PoolReference(_Object):
    """A reference to an AgentPool in the same namespace."""

    name: Annotated[str, Meta(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]


class ToolBindingSpec(_Object):
    pool_ref: PoolReference | None = None
    queue: QueueSource | None = None
    queue_config: QueueConfig = field(default_factory=QueueConfig)


class ToolBindingStatus(_Object):
    phase: Literal["Pending", "Active", "Error"] | None = None
    queue_depth: NonNegative | None = None
    lag: int | None = None
    desired_replicas: NonNegative | None = None
    last_poll_time: datetime | None = None
    last_scale_time: datetime | None = None
    observed_generation: NonNegative | None = None
    conditions: Conditions | None = None


# ---- GangReservation ---------------------------------------------------------------------------


class GangMember(_Object):
    name: Str253
    node: Str253
    pod_uid: Annotated[str, Meta(max_length=64)] | None = field(default=None, name="podUID")
    gpu_indices: Annotated[list[GpuIndex], Meta(max_length=16)] | None = None
    gpu_uuids: Annotated[list[Str128], Meta(max_length=16)] | None = field(default=None, name="gpuUUIDs")
    memory_mib: NonNegative | None = field(default=None, name="memoryMiB")
    compute_percent: Annotated[int, Meta(ge=1, le=100)] = 100
    mig_profile: MigProfile | None = None
    mig_start: Annotated[int, Meta(ge=0, le=7)] | None = None
    bound: bool = False


class GangReservationSpec(_Object):
    group_name: Annotated[str, Meta(min_length=1, max_length=253)]
    size: Annotated[int, Meta(ge=1, le=1024)]
    expires_at: datetime
    pool_ref: LocalObjectReference | None = None
    members: Annotated[list[GangMember], Meta(max_length=1024)] | None = None


class GangReservationStatus(_Object):
    phase: Literal["Reserved", "Binding", "Bound", "Expired", "Released", "Failed"] | None = None
    bound_members: NonNegative | None = None
    observed_generation: NonNegative | None = None
    conditions: Conditions | None = None


# ---- top-level objects -------------------------------------------------------------------------


class _Root(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """Top-level fields: always encoded (apiVersion and kind must reach the wire)."""

    api_version: str = API_VERSION
    metadata: dict[str, Any] = field(default_factory=dict)


class AgentPool(_Root, kw_only=True):
    kind: Literal["AgentPool"] = "AgentPool"
    spec: AgentPoolSpec = field(default_factory=AgentPoolSpec)  # the CRD requires it on the wire
    status: AgentPoolStatus | None = None


class GPUSlice(_Root, kw_only=True):
    kind: Literal["GPUSlice"] = "GPUSlice"
    spec: GPUSliceSpec
    status: GPUSliceStatus | None = None


class GPUNode(_Root, kw_only=True):
    kind: Literal["GPUNode"] = "GPUNode"
    spec: GPUNodeSpec = field(default_factory=GPUNodeSpec)
    status: GPUNodeStatus | None = None


class ToolBinding(_Root, kw_only=True):
    kind: Literal["ToolBinding"] = "ToolBinding"
    spec: ToolBindingSpec = field(default_factory=ToolBindingSpec)  # the CRD requires it on the wire
    status: ToolBindingStatus | None = None


class GangReservation(_Root, kw_only=True):
    kind: Literal["GangReservation"] = "GangReservation"
    spec: GangReservationSpec
    status: GangReservationStatus | None = None


@dataclass(frozen=True, slots=True)
class Resource:
    """Where a kind lives in the API."""

    kind: str
    plural: str
    namespaced: bool
    model: type[_Root]

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


RESOURCES: Final[dict[str, Resource]] = {
    r.kind: r
    for r in (
        Resource("AgentPool", "agentpools", True, AgentPool),
        Resource("GPUSlice", "gpuslices", True, GPUSlice),
        Resource("GPUNode", "gpunodes", False, GPUNode),
        Resource("ToolBinding", "toolbindings", True, ToolBinding),
        Resource("GangReservation", "gangreservations", True, GangReservation),
    )
}
"""Every NeuroNetes kind, by kind name."""

_T = TypeVar("_T", bound=_Root)


def decode(obj: Any, model: type[_T]) -> _T:
    """Decode a parsed object (dict from YAML or JSON) into ``model``, enforcing the schema's bounds.

    Raises:
        msgspec.ValidationError: a field is unknown, mistyped or out of bounds (the message names
            the field as ``$.spec...``).
    """
    return msgspec.convert(obj, model, str_keys=True)


def encode(obj: _Root) -> dict[str, Any]:
    """A JSON-ready dict of ``obj``: apiVersion, kind, metadata, spec and (when set) status."""
    out: dict[str, Any] = msgspec.to_builtins(obj)
    if out.get("status") is None:
        out.pop("status", None)
    return out
