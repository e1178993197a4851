"""Names and formats the extender, operator, agent and shim agree on — defined once, here.

See docs/contracts.md for the meaning of each. Import these; never spell them again.

Besides the names, this module holds the one structured format that crosses process
boundaries in the control plane: the assignment annotation (`neuronetes.io/assigned-gpus`)
that the extender's Binding carries to the node. `encode_assignment` / `decode_assignment`
are the only way to write and read it; decoding is strict (exact types, no unknown fields,
ranges and formats checked, unknown schema versions refused) because the node agent acts on
it: a document it does not fully understand must stop the container, never be half-applied.
The builder from engine output and the pod-spec reader live in `neuronetes.assignment`.

Over 400 lines because it is one table: every name that crosses a process boundary (resources,
labels, annotations, node paths, the documented metrics with their help and labels) beside the
one document the Binding carries, each defined once so that a reader looks in one place, as
docs/contracts.md does row by row. Split by theme, the table would gain seams and no structure.
"""

from __future__ import annotations

import enum
import uuid as _uuid
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import msgspec

from neuronetes.mig import normalize_profile_name

GROUP: Final = "neuronetes.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
SCHEDULER_NAME: Final = "neuronetes-scheduler"

# ---- identities (the chart's ServiceAccounts; the admission policies and the webhook trust them) ----
SYSTEM_NAMESPACE: Final = "neuronetes-system"
EXTENDER_SERVICE_ACCOUNT: Final = "neuronetes-scheduler"
EXTENDER_USERNAME: Final = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{EXTENDER_SERVICE_ACCOUNT}"
"""The scheduler extender's user: the one the admission policies in ``manifests/policies/`` trust
to write ``neuronetes.io/assigned-gpus``, and the webhook's default trusted user."""

# ---- extended resources (integers, requests == limits) ----------------------------------------
RESOURCE_GPU: Final = f"{GROUP}/gpu"  # whole GPUs
RESOURCE_GPU_MEMORY: Final = f"{GROUP}/gpu-memory"  # MiB of GPU memory
RESOURCE_GPU_COMPUTE: Final = f"{GROUP}/gpu-compute"  # percent of one GPU's compute
RESOURCE_MIG_PREFIX: Final = f"{GROUP}/mig-"  # + profile, e.g. neuronetes.io/mig-1g.5gb (instances)
RESOURCE_PREFIX: Final = f"{GROUP}/"  # every NeuroNetes extended resource starts with this
FOREIGN_GPU_RESOURCES: Final = ("nvidia.com/gpu",)  # never combined with NeuroNetes resources


def mig_resource_name(profile: str) -> str:
    """The extended resource of a MIG profile: ``1g.5gb`` -> ``neuronetes.io/mig-1g.5gb``.

    Resource names cannot hold ``+``, so the media-extension variant ``1g.5gb+me`` is spelled
    ``neuronetes.io/mig-1g.5gb.me`` (what `neuronetes.mig.normalize_profile_name` reads back).
    """
    return RESOURCE_MIG_PREFIX + normalize_profile_name(profile).replace("+", ".")


# ---- node labels (written by the agent; docs/contracts.md) --------------------------------------------
LABEL_GPU_TYPE: Final = f"{GROUP}/gpu-type"
LABEL_GPU_MEMORY: Final = f"{GROUP}/gpu-memory"
LABEL_GPU_COUNT: Final = f"{GROUP}/gpu-count"
LABEL_GPU_TOPOLOGY: Final = f"{GROUP}/gpu-topology"
LABEL_MIG_CAPABLE: Final = f"{GROUP}/mig-capable"
LABEL_MIG_CONFIG: Final = f"{GROUP}/mig-config"
LABEL_PRICE_PER_HOUR: Final = f"{GROUP}/price-per-hour"
LABEL_SPOT: Final = f"{GROUP}/spot"
LABEL_ZONE: Final = "topology.kubernetes.io/zone"
LABEL_REGION: Final = "topology.kubernetes.io/region"
GPU_TOPOLOGY_VALUES: Final = ("nvlink", "pcie")  # values of LABEL_GPU_TOPOLOGY

# ---- pod annotations / labels ----------------------------------------------------------------
ANNOTATION_ASSIGNED_GPUS: Final = f"{GROUP}/assigned-gpus"  # set by the extender's Binding
ASSIGNMENT_SCHEMA_VERSION: Final = 1
# Fallback for nodes without NRI only: + container name, value "GPU-…,GPU-…" for a downward-API
# NVIDIA_VISIBLE_DEVICES under the legacy nvidia runtime (docs/contracts.md "handoff").
ANNOTATION_VISIBLE_DEVICES_PREFIX: Final = f"{GROUP}/visible-devices-"
LABEL_GANG: Final = f"{GROUP}/gang"
LABEL_GANG_SIZE: Final = f"{GROUP}/gang-size"
LABEL_POD_GROUP_X_K8S: Final = "scheduling.x-k8s.io/pod-group"  # scheduler-plugins coscheduling
ANNOTATION_GROUP_NAME_VOLCANO: Final = "scheduling.k8s.io/group-name"  # Volcano
GANG_KEYS: Final = (LABEL_GANG, LABEL_POD_GROUP_X_K8S, ANNOTATION_GROUP_NAME_VOLCANO)
# Topology a pod asks for (an AgentPool's spec.topology, written on its pods by the operator):
# where the pod's own GPUs sit relative to each other and, for a gang, where its members sit
# (`same-node`: one node; `same-socket` / `nvlink`: one socket / NVLink group of one node).
ANNOTATION_LOCALITY: Final = f"{GROUP}/locality"  # any | same-node | same-socket | nvlink
ANNOTATION_MIN_BANDWIDTH: Final = f"{GROUP}/min-bandwidth-gbps"  # NVLink GB/s between the GPUs
ANNOTATION_GANG_TIMEOUT: Final = f"{GROUP}/gang-timeout-seconds"  # how long a gang reservation holds
ANNOTATION_MODEL: Final = f"{GROUP}/model"
"""On the pods of a pool with a fallback model or cache-aware scoring: the model they serve
(spec.model or fallbackModel)."""
ANNOTATION_CACHE_HIT_WEIGHT: Final = f"{GROUP}/cache-hit-weight"
"""On the pods of a pool with ``cacheAware.enabled``: the weight (0..1) of the extender's model-cache
term for this pod, in place of the policy's (docs/model-cache.md)."""
# Model preloading (docs/model-cache.md): the operator's preload Jobs and their pods carry the pool in
# this label and the model in this annotation (a model name need not be a valid label value).
LABEL_PRELOAD_POOL: Final = f"{GROUP}/preload-pool"
ANNOTATION_PRELOAD_MODEL: Final = f"{GROUP}/preload-model"
ANNOTATION_SIMULATED_CACHED_MODELS: Final = f"{GROUP}/simulated-cached-models"
"""On a simulated (kwok) node only: comma-separated models its simulated cache holds from the start."""
# How a pod orders victims when it preempts: lowest-priority-first (the default, kube-scheduler's
# order) or fewest-victims (an AgentPool's spec.scheduling.preemption.policy; docs/preemption.md).
ANNOTATION_PREEMPTION_POLICY: Final = f"{GROUP}/preemption-policy"
# The GPUSlice (same namespace) a pod runs inside: the pod gets exactly the slice's share of the
# slice's GPU and is not charged again (docs/gpuslice.md).
ANNOTATION_SLICE: Final = f"{GROUP}/slice"
# On a GangReservation: the id of the reservation it describes (new for every reservation of a group).
ANNOTATION_RESERVATION_ID: Final = f"{GROUP}/reservation-id"

# Tenant-set keys the webhook strips or refuses (DESIGN §2 "Fail closed"; docs/threat-model.md).
TENANT_FORBIDDEN_ENV_PREFIXES: Final = ("NVIDIA_", "CUDA_DEVICE_", "NEURONETES_")
TENANT_FORBIDDEN_ENV_NAMES: Final = ("LD_PRELOAD", "LD_AUDIT")
TENANT_FORBIDDEN_ANNOTATION_PREFIXES: Final = (f"{GROUP}/", "cdi.k8s.io/")

# ---- GPUNode annotations (an administrator's orders to the agent) --------------------------------
ANNOTATION_OFFLINE_GPUS: Final = f"{GROUP}/offline-gpus"
"""Comma-separated UUIDs an administrator holds OFFLINE (`neuronetes offline`; the agent and the CLI)."""

# ---- node-side paths (agent <-> NRI plugin <-> shim) ------------------------------------------
# The shim's region inside the container (= NN_REGION_DIR, NN_CONTROL_PATH, NN_STATE_PATH in the header):
# the directory and the agent's control file read-only, the container's state file writable.
SHIM_REGION_DIR: Final = "/run/neuronetes"
SHIM_CONTROL_PATH: Final = f"{SHIM_REGION_DIR}/control"
SHIM_STATE_PATH: Final = f"{SHIM_REGION_DIR}/state"
SHIM_LIBRARY_PATH: Final = "/usr/lib/neuronetes/libneuronetes-cuda.so"  # inside the container
SHIM_PRELOAD_FILE: Final = "/etc/ld.so.preload"  # injected read-only, lists SHIM_LIBRARY_PATH
# On the node (the chart's agent.hostPaths; the agent's and the NRI plugin's defaults):
NODE_STATE_DIR: Final = "/run/neuronetes"  # inventory, node ledger, every container's region
NODE_SHIM_DIR: Final = "/var/lib/neuronetes/shim"  # the CUDA shim and its preload file
NODE_NRI_SOCKET_DIR: Final = "/var/run/nri"  # the runtime's NRI socket (nri.sock)
NODE_MODEL_CACHE_DIR: Final = "/var/cache/neuronetes/models"
"""The host model cache (docs/model-cache.md): outside /var/lib/neuronetes, so that serving pods may
mount it read-only; the agent's ``--model-cache-dir`` and the chart's ``agent.modelCache.hostPath``."""

# Host paths a tenant's pod may not mount (hostPath volume), and why. The webhook refuses a hostPath
# that is, contains or lies inside one of them, compared after textual normalisation (`//`, `.`,
# `..`, trailing slashes; /var/run is /run): the API server resolves no symlink, and the kubelet
# mounts whatever the path names on the node (docs/threat-model.md, "Admission webhook").
TENANT_FORBIDDEN_HOST_PATHS: Final = {
    "/dev": "device nodes, every GPU's among them",
    "/proc": "the node's processes and kernel settings",
    "/sys": "sysfs and the cgroups, device rules included",
    "/run": "the container runtime's sockets and state (/var/run is the same directory)",
    NODE_STATE_DIR: "the NeuroNetes agent's state: node ledger and every container's shim region",
    "/var/lib/neuronetes": "the NeuroNetes agent's host directory: the CUDA shim and its preload file",
    "/etc/cdi": "CDI specs: the device edits the container runtime applies",
    "/run/cdi": "CDI specs: the device edits the container runtime applies",
    "/run/nri": "the container runtime's NRI socket, through which the NeuroNetes plugin injects GPUs",
    "/var/lib/kubelet": "the kubelet's state: other pods' volumes, device-plugin and pod-resources sockets",
}
# Names the same host directory as another path (the API server does not resolve symlinks).
HOST_PATH_ALIASES: Final = {"/var/run": "/run"}


# ---- metrics (the documented names; base units, _total counters) ------------------------------------
METRIC_SCHEDULER_LATENCY: Final = "neuronetes_scheduler_latency_seconds"
METRIC_SCHEDULER_ATTEMPTS: Final = "neuronetes_scheduler_attempts_total"
METRIC_SCHEDULER_SUCCESS: Final = "neuronetes_scheduler_success_total"
METRIC_SCHEDULER_PENDING: Final = "neuronetes_scheduler_pending_pods"
METRIC_TOPOLOGY_VIOLATIONS: Final = "neuronetes_scheduler_topology_violations_total"
METRIC_GPU_UTILIZATION: Final = "neuronetes_gpu_utilization_percent"
# extender (beyond the scheduler metrics): HTTP outcomes and the GPU cache
METRIC_SCHEDULER_REQUESTS: Final = "neuronetes_scheduler_requests_total"
METRIC_CACHE_NODES: Final = "neuronetes_scheduler_cache_nodes"
METRIC_CACHE_GPUS: Final = "neuronetes_scheduler_cache_gpus"
METRIC_CACHE_PODS: Final = "neuronetes_scheduler_cache_pods"
METRIC_CACHE_HOLDS: Final = "neuronetes_scheduler_cache_holds"
METRIC_CACHE_UNACCOUNTED: Final = "neuronetes_scheduler_cache_unaccounted_pods"
METRIC_CACHE_SYNC_AGE: Final = "neuronetes_scheduler_cache_sync_age_seconds"
METRIC_WATCH_BROKEN: Final = "neuronetes_scheduler_watch_broken_seconds"
METRIC_EVENTS: Final = "neuronetes_scheduler_events_total"
METRIC_API_LATENCY: Final = "neuronetes_scheduler_api_latency_seconds"
METRIC_GPUS_ALLOCATED: Final = "neuronetes_scheduler_gpus_allocated"
METRIC_GPUS_UNALLOCATED: Final = "neuronetes_scheduler_gpus_unallocated"
METRIC_GPUS_FRAGMENTED: Final = "neuronetes_scheduler_gpus_fragmented"
METRIC_GANGS_PENDING: Final = "neuronetes_scheduler_gangs_pending"
METRIC_GANGS_PAST_TIMEOUT: Final = "neuronetes_scheduler_gangs_pending_past_timeout"
# per GPU (agent), DCGM-equivalent
METRIC_GPU_MEMORY_USED: Final = "neuronetes_gpu_memory_used_bytes"
METRIC_GPU_MEMORY_FREE: Final = "neuronetes_gpu_memory_free_bytes"
METRIC_GPU_MEMORY_TOTAL: Final = "neuronetes_gpu_memory_total_bytes"
METRIC_GPU_TEMPERATURE: Final = "neuronetes_gpu_temperature_celsius"
METRIC_GPU_POWER: Final = "neuronetes_gpu_power_watts"
METRIC_GPU_LAST_XID: Final = "neuronetes_gpu_last_xid"
METRIC_GPU_XID_ERRORS: Final = "neuronetes_gpu_xid_errors_total"
METRIC_GPU_ECC_ERRORS: Final = "neuronetes_gpu_ecc_errors_total"
METRIC_GPU_HEALTH: Final = "neuronetes_gpu_health_state"
METRIC_GPU_STATE_TRANSITIONS: Final = "neuronetes_gpu_state_transitions_total"
# per node (agent)
METRIC_AGENT_DISCOVERY: Final = "neuronetes_agent_discovery_seconds"
METRIC_AGENT_EVICTIONS: Final = "neuronetes_agent_evictions_total"
METRIC_AGENT_SLOTS_RECLAIMED: Final = "neuronetes_agent_slots_reclaimed_total"
# per slice = per (container, GPU) with an assignment (agent, from the shim's region)
METRIC_SLICE_MEMORY_LIMIT: Final = "neuronetes_slice_memory_limit_bytes"
METRIC_SLICE_MEMORY_USED: Final = "neuronetes_slice_memory_used_bytes"
METRIC_SLICE_COMPUTE_SHARE: Final = "neuronetes_slice_compute_share_ratio"
METRIC_SLICE_KERNEL_TIME: Final = "neuronetes_slice_kernel_seconds_total"
METRIC_SLICE_THROTTLED_TIME: Final = "neuronetes_slice_throttled_seconds_total"
METRIC_SLICE_OOM_REFUSALS: Final = "neuronetes_slice_oom_refusals_total"
METRIC_SLICE_PAUSED: Final = "neuronetes_slice_paused"
# per pod (agent, NVML reconciliation of shared GPUs)
METRIC_SLICE_EVICTIONS: Final = "neuronetes_slice_evictions_total"
# per AgentPool (operator, the autoscaling controller)
METRIC_AUTOSCALER_DECISIONS: Final = "neuronetes_autoscaler_decisions_total"
METRIC_AUTOSCALER_DESIRED: Final = "neuronetes_autoscaler_desired_replicas"
METRIC_SCALEUP_TO_READY: Final = "neuronetes_scaleup_decision_to_ready_seconds"


class MetricType(enum.StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its name, type, label names and help text (what the exporters register)."""

    name: str
    type: MetricType
    labels: tuple[str, ...]
    help: str


# dcgm-exporter's label names, except `modelName`, spelled `model_name`: promtool's lint refuses
# camelCase label names (docs/contracts.md "Metrics").
GPU_LABELS: Final = ("Hostname", "gpu", "UUID", "model_name")
GPU_USER_LABELS: Final = (
    *GPU_LABELS,
    "namespace",
    "pod",
    "container",
)  # + the GPU's one user, as dcgm-exporter
SLICE_LABELS: Final = ("Hostname", "namespace", "pod", "container", "UUID")

METRICS: Final[tuple[MetricSpec, ...]] = (
    MetricSpec(
        METRIC_SCHEDULER_LATENCY,
        MetricType.HISTOGRAM,
        ("verb", "result"),
        "Extender verb latency (filter, prioritize, bind, preempt) in seconds.",
    ),
    MetricSpec(
        METRIC_SCHEDULER_ATTEMPTS, MetricType.COUNTER, (), "Pods the extender tried to place (filter)."
    ),
    MetricSpec(METRIC_SCHEDULER_SUCCESS, MetricType.COUNTER, (), "Pods the extender bound."),
    MetricSpec(METRIC_SCHEDULER_PENDING, MetricType.GAUGE, (), "GPU pods waiting for a placement."),
    MetricSpec(
        METRIC_TOPOLOGY_VIOLATIONS,
        MetricType.COUNTER,
        ("locality",),
        "Placements that could not honour the requested locality (best effort fallbacks).",
    ),
    MetricSpec(
        METRIC_SCHEDULER_REQUESTS,
        MetricType.COUNTER,
        ("verb", "code"),
        "Extender HTTP requests by verb and status code (4xx: refused input).",
    ),
    MetricSpec(
        METRIC_API_LATENCY,
        MetricType.HISTOGRAM,
        ("call",),
        "API server calls on the extender's bind path (call: binding, get_pod) in seconds.",
    ),
    MetricSpec(METRIC_CACHE_NODES, MetricType.GAUGE, (), "Nodes in the extender's GPU cache."),
    MetricSpec(METRIC_CACHE_GPUS, MetricType.GAUGE, (), "GPUs in the extender's GPU cache."),
    MetricSpec(METRIC_CACHE_PODS, MetricType.GAUGE, (), "Bound pods whose resources the GPU cache counts."),
    MetricSpec(
        METRIC_CACHE_HOLDS,
        MetricType.GAUGE,
        (),
        "Filter decisions (and group reservations) holding GPUs until their bind or TTL.",
    ),
    MetricSpec(
        METRIC_CACHE_UNACCOUNTED,
        MetricType.GAUGE,
        (),
        "Bound pods whose GPUs the cache could not count (unreadable assignment, double booking).",
    ),
    MetricSpec(
        METRIC_CACHE_SYNC_AGE,
        MetricType.GAUGE,
        ("resource",),
        "Seconds since the API server last told the GPU cache about a resource (nodes, pods).",
    ),
    MetricSpec(
        METRIC_WATCH_BROKEN,
        MetricType.GAUGE,
        ("resource",),
        "Seconds a watch of the extender has been broken (0: connected); over the limit: unready.",
    ),
    MetricSpec(
        METRIC_EVENTS,
        MetricType.COUNTER,
        ("result",),
        "Pod Events the extender posted (posted), could not post (failed) or dropped (storm bound).",
    ),
    MetricSpec(
        METRIC_GPUS_ALLOCATED,
        MetricType.GAUGE,
        (),
        "GPU compute granted to bound pods and held for binds, in GPUs (MIG-partitioned GPUs excluded).",
    ),
    MetricSpec(
        METRIC_GPUS_UNALLOCATED,
        MetricType.GAUGE,
        (),
        "Free compute on schedulable GPUs, in GPUs (a half-used GPU counts 0.5).",
    ),
    MetricSpec(
        METRIC_GPUS_FRAGMENTED,
        MetricType.GAUGE,
        (),
        "Unallocated GPU compute, in GPUs, that no pending pod's shape can use now (0: none pending).",
    ),
    MetricSpec(
        METRIC_GANGS_PENDING, MetricType.GAUGE, (), "Gangs with at least one member waiting for a placement."
    ),
    MetricSpec(
        METRIC_GANGS_PAST_TIMEOUT,
        MetricType.GAUGE,
        (),
        "Pending gangs the extender has seen pending for longer than their gang timeout.",
    ),
    MetricSpec(
        METRIC_GPU_UTILIZATION,
        MetricType.GAUGE,
        GPU_USER_LABELS,
        "GPU utilization, 0-100 (the product's documented name; the one metric not in base units).",
    ),
    MetricSpec(METRIC_GPU_MEMORY_USED, MetricType.GAUGE, GPU_USER_LABELS, "Framebuffer in use, bytes."),
    MetricSpec(METRIC_GPU_MEMORY_FREE, MetricType.GAUGE, GPU_USER_LABELS, "Framebuffer free, bytes."),
    MetricSpec(METRIC_GPU_MEMORY_TOTAL, MetricType.GAUGE, GPU_USER_LABELS, "Framebuffer size, bytes."),
    MetricSpec(
        METRIC_GPU_TEMPERATURE, MetricType.GAUGE, GPU_USER_LABELS, "GPU temperature, degrees Celsius."
    ),
    MetricSpec(METRIC_GPU_POWER, MetricType.GAUGE, GPU_USER_LABELS, "Power draw, watts."),
    MetricSpec(METRIC_GPU_LAST_XID, MetricType.GAUGE, GPU_USER_LABELS, "Last XID error seen (0: none)."),
    MetricSpec(METRIC_GPU_XID_ERRORS, MetricType.COUNTER, (*GPU_LABELS, "xid"), "XID errors seen."),
    MetricSpec(
        METRIC_GPU_ECC_ERRORS,
        MetricType.COUNTER,
        (*GPU_LABELS, "type"),
        "ECC errors since the driver loaded (NVML volatile count), type corrected or uncorrected.",
    ),
    MetricSpec(
        METRIC_GPU_HEALTH,
        MetricType.GAUGE,
        (*GPU_LABELS, "state"),
        "1 for the GPU's current health state (Available, Allocated, InUse, Degraded, ...), else 0.",
    ),
    MetricSpec(
        METRIC_GPU_STATE_TRANSITIONS,
        MetricType.COUNTER,
        (*GPU_LABELS, "from", "to"),
        "GPU state-machine transitions the agent recorded.",
    ),
    MetricSpec(
        METRIC_AGENT_DISCOVERY,
        MetricType.GAUGE,
        ("Hostname",),
        "Duration of the node's last GPU discovery (inventory scan), seconds.",
    ),
    MetricSpec(
        METRIC_AGENT_EVICTIONS,
        MetricType.COUNTER,
        ("Hostname", "code"),
        "Pods the agent asked the Eviction API to evict, by HTTP status of the answer.",
    ),
    MetricSpec(
        METRIC_AGENT_SLOTS_RECLAIMED,
        MetricType.COUNTER,
        ("Hostname",),
        "Shim region slots of dead GPU processes the agent freed once NVML showed their memory released.",
    ),
    MetricSpec(METRIC_SLICE_MEMORY_LIMIT, MetricType.GAUGE, SLICE_LABELS, "Slice memory limit, bytes."),
    MetricSpec(
        METRIC_SLICE_MEMORY_USED, MetricType.GAUGE, SLICE_LABELS, "Memory the slice's processes hold, bytes."
    ),
    MetricSpec(
        METRIC_SLICE_COMPUTE_SHARE, MetricType.GAUGE, SLICE_LABELS, "Compute share granted, ratio 0-1."
    ),
    MetricSpec(METRIC_SLICE_KERNEL_TIME, MetricType.COUNTER, SLICE_LABELS, "Measured kernel time, seconds."),
    MetricSpec(
        METRIC_SLICE_THROTTLED_TIME,
        MetricType.COUNTER,
        SLICE_LABELS,
        "Time the shim delayed kernel launches to keep the slice in its share, seconds.",
    ),
    MetricSpec(
        METRIC_SLICE_OOM_REFUSALS,
        MetricType.COUNTER,
        SLICE_LABELS,
        "Allocations refused with CUDA_ERROR_OUT_OF_MEMORY because of the slice limit.",
    ),
    MetricSpec(
        METRIC_SLICE_PAUSED, MetricType.GAUGE, SLICE_LABELS, "1 while the agent holds the slice paused."
    ),
    MetricSpec(
        METRIC_SLICE_EVICTIONS,
        MetricType.COUNTER,
        ("Hostname", "namespace", "pod", "reason"),
        "Pods with a slice that NVML reconciliation found holding GPU memory past the shim, by reason "
        "(unshimmed, over_limit): evicted, or only reported under --reconcile=report.",
    ),
    MetricSpec(
        METRIC_AUTOSCALER_DECISIONS,
        MetricType.COUNTER,
        ("namespace", "pool", "rule"),
        "Autoscaling decisions by AgentPool and the rule that decided (docs/autoscaling.md).",
    ),
    MetricSpec(
        METRIC_AUTOSCALER_DESIRED,
        MetricType.GAUGE,
        ("namespace", "pool"),
        "Replicas the autoscaling controller last decided for an AgentPool.",
    ),
    MetricSpec(
        METRIC_SCALEUP_TO_READY,
        MetricType.HISTOGRAM,
        ("namespace", "pool"),
        "Seconds from a scale-up decision to all of its replicas Ready (seen at the next tick).",
    ),
)
"""Every metric NeuroNetes exports; docs/contracts.md lists the same table."""


# ---- the assignment annotation (versioned JSON, per container) --------------------------------


class QoS(enum.StrEnum):
    """GPU QoS class of a slice (docs/contracts.md, `qos`). Memory limits are hard for every class."""

    GUARANTEED = "Guaranteed"  # compute share reserved: pacing keeps others out of it
    BURSTABLE = "Burstable"  # compute share is a floor under contention; idle compute may be used
    BEST_EFFORT = "BestEffort"  # compute only from what others leave idle


SUPPORTED_ASSIGNMENT_VERSIONS: Final = (ASSIGNMENT_SCHEMA_VERSION,)
MAX_ASSIGNMENT_BYTES: Final = 64 * 1024  # far below the API server's 256 KiB for all annotations
MAX_GPU_INDEX: Final = 255
MAX_GPU_MEMORY_MIB: Final = 1 << 24  # 16 TiB: any bigger number is a bug or an attack
MAX_GPUS_PER_CONTAINER: Final = 64
MAX_CONTAINERS: Final = 256
MAX_GANG_SIZE: Final = 100_000
MIG_START_SLOTS: Final = 8  # = neuronetes.mig.MEMORY_SLICES
PRIORITY_MIN: Final = -(2**31)
PRIORITY_MAX: Final = 2**31 - 1

GPU_UUID_PATTERN: Final = r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
"""An NVIDIA GPU UUID as NVML reports it (``nvmlDeviceGetUUID``; lower-case hex)."""
MIG_PROFILE_PATTERN: Final = r"^[1-9][0-9]*g\.[1-9][0-9]*gb(\+me)?$"
"""A MIG profile name in canonical spelling (same grammar as `neuronetes.mig`)."""
DNS_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE_PATTERN: Final = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"
POD_UID_PATTERN: Final = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"

_SIMULATED_UUID_NAMESPACE: Final = _uuid.UUID("6c1f1b1e-4e65-4e65-9a1e-0e7572306e65")


def simulated_gpu_uuid(node: str, index: int) -> str:
    """A stable, well-formed GPU UUID for a simulated GPU (kwok nodes, fixtures, fake NVML).

    Real UUIDs come from NVML; simulated nodes need ones that pass the same validation.
    """
    return f"GPU-{_uuid.uuid5(_SIMULATED_UUID_NAMESPACE, f'{node}/{index}')}"


def _strict(pattern: str) -> str:
    """`pattern` for msgspec, which uses `re.search`: ``$`` would also match before a final newline."""
    assert pattern.startswith("^") and pattern.endswith("$")
    return pattern[:-1] + r"\Z"


GpuUuid = Annotated[str, msgspec.Meta(pattern=_strict(GPU_UUID_PATTERN))]
GpuIndex = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_INDEX)]
MemoryMiB = Annotated[int, msgspec.Meta(ge=1, le=MAX_GPU_MEMORY_MIB)]
ComputePercent = Annotated[int, msgspec.Meta(ge=1, le=100)]
MigProfileName = Annotated[str, msgspec.Meta(pattern=_strict(MIG_PROFILE_PATTERN), max_length=32)]
MigStart = Annotated[int, msgspec.Meta(ge=0, le=MIG_START_SLOTS - 1)]
Priority = Annotated[int, msgspec.Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX)]
ContainerName = Annotated[str, msgspec.Meta(pattern=_strict(DNS_LABEL_PATTERN), min_length=1, max_length=63)]
NodeName = Annotated[str, msgspec.Meta(pattern=_strict(DNS_SUBDOMAIN_PATTERN), min_length=1, max_length=253)]
GangName = Annotated[str, msgspec.Meta(pattern=_strict(LABEL_VALUE_PATTERN), min_length=1, max_length=63)]
GangSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_GANG_SIZE)]
PodUid = Annotated[str, msgspec.Meta(pattern=_strict(POD_UID_PATTERN))]


class AssignmentError(ValueError):
    """An assignment annotation that must not be acted on (malformed, invalid, unknown version)."""


class GpuAssignment(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    rename={
        "memory_mib": "memoryMiB",
        "compute_percent": "computePercent",
        "mig_profile": "migProfile",
        "mig_start": "migStart",
    },
):
    """One GPU (or one MIG instance of it) given to one container.

    `uuid` is the physical GPU's; with `mig_profile` the container gets the MIG instance of
    that profile whose placement starts at memory slice `mig_start` on that GPU (the agent
    resolves it to the instance's own ``MIG-…`` UUID). `memory_mib` is the hard memory limit
    the shim enforces on this device, `compute_percent` the compute share it paces to (100:
    no pacing; always 100 for a MIG instance, which is isolated in hardware).
    """

    uuid: GpuUuid
    index: GpuIndex
    memory_mib: MemoryMiB
    compute_percent: ComputePercent
    mig_profile: MigProfileName | None = None
    mig_start: MigStart | None = None

    def __post_init__(self) -> None:
        if (self.mig_profile is None) != (self.mig_start is None):
            raise ValueError("migProfile and migStart go together (both or neither)")
        if self.mig_profile is not None and self.compute_percent != 100:
            raise ValueError(
                "computePercent of a MIG instance must be 100 (MIG isolates compute in hardware)"
            )


class ContainerAssignment(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one container (app, init or sidecar) gets: its GPUs, priority and QoS class."""

    gpus: Annotated[tuple[GpuAssignment, ...], msgspec.Meta(min_length=1, max_length=MAX_GPUS_PER_CONTAINER)]
    priority: Priority
    qos: QoS

    def __post_init__(self) -> None:
        seen: set[tuple[str, int | None]] = set()
        for gpu in self.gpus:
            key = (gpu.uuid, gpu.mig_start)
            if key in seen:
                raise ValueError(f"GPU {gpu.uuid} is listed twice")
            seen.add(key)


class GangAssignment(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The gang (pod group) the pod was placed with: all members were reserved together."""

    name: GangName
    size: GangSize


class Assignment(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    rename={"pod_uid": "podUID"},
):
    """The value of `neuronetes.io/assigned-gpus`, schema version 1.

    `containers` maps each container that gets GPUs (init containers and sidecars included) to
    its assignment; a container not listed gets no GPU. `pod_uid`, when present, must equal the
    pod's UID (the agent refuses a copied annotation). See docs/contracts.md.
    """

    version: Literal[1]
    node: NodeName
    containers: Annotated[
        dict[ContainerName, ContainerAssignment], msgspec.Meta(min_length=1, max_length=MAX_CONTAINERS)
    ]
    gang: GangAssignment | None = None
    pod_uid: PodUid | None = None

    def __post_init__(self) -> None:
        index_of: dict[str, tuple[int, str]] = {}
        for name, container in self.containers.items():
            for gpu in container.gpus:
                first = index_of.setdefault(gpu.uuid, (gpu.index, name))
                if first[0] != gpu.index:
                    raise ValueError(
                        f"container {name!r}: GPU {gpu.uuid} has index {gpu.index}, "
                        f"but index {first[0]} in container {first[1]!r}"
                    )


class _VersionProbe(msgspec.Struct):
    version: int


_PROBE_DECODER: Final = msgspec.json.Decoder(_VersionProbe, strict=True)
_DECODERS: Final = {1: msgspec.json.Decoder(Assignment, strict=True)}
_ENCODER: Final = msgspec.json.Encoder()


def decode_assignment(data: str | bytes) -> Assignment:
    """Parse and validate an `neuronetes.io/assigned-gpus` value.

    Raises:
        AssignmentError: not JSON, no integer ``version``, a version this reader does not know,
            an unknown field, a wrong type (no coercion: ``"1"`` is not ``1``), a value out of
            range or a malformed name; the message names the field (``$.containers[...].gpus[0]
            .memoryMiB``).
    """
    where = ANNOTATION_ASSIGNED_GPUS
    try:
        # A JSON document is UTF-8: a lone surrogate or undecodable bytes are refused here, with the
        # same error type as every other malformed value, not as a UnicodeError from deep inside.
        raw = data.encode() if isinstance(data, str) else data
        raw.decode()
    except (UnicodeEncodeError, UnicodeDecodeError) as exc:
        raise AssignmentError(f"{where}: not UTF-8 text: {exc.reason}") from None
    if len(raw) > MAX_ASSIGNMENT_BYTES:
        raise AssignmentError(f"{where}: {len(raw)} bytes, more than the {MAX_ASSIGNMENT_BYTES} allowed")
    try:
        version = _PROBE_DECODER.decode(raw).version
    except msgspec.DecodeError as exc:
        raise AssignmentError(f"{where}: not a versioned assignment document: {exc}") from None
    decoder = _DECODERS.get(version)
    if decoder is None:
        known = ", ".join(str(v) for v in SUPPORTED_ASSIGNMENT_VERSIONS)
        raise AssignmentError(
            f"{where}: schema version {version} is not supported by this reader (it reads {known}); "
            "upgrade the node agent before the extender"
        )
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise AssignmentError(f"{where}: {exc}") from None


def encode_assignment(assignment: Assignment) -> str:
    """Serialise an assignment to the annotation value (compact JSON).

    The result is decoded again before it is returned, so a document that the node would refuse
    (a value out of range, a malformed UUID) is never written: `AssignmentError` here instead.
    """
    try:
        raw = _ENCODER.encode(assignment)
    except (TypeError, ValueError) as exc:
        raise AssignmentError(f"{ANNOTATION_ASSIGNED_GPUS}: cannot encode: {exc}") from None
    decode_assignment(raw)
    return raw.decode()
