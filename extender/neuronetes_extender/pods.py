"""Pod objects → what the GPU cache keeps of them: resources held, GPU request, assignment.

Every pod bound to a node holds CPU and memory there (what kube-scheduler counts, init
containers, sidecars and ``spec.overhead`` included); a GPU pod also holds the GPUs its
`neuronetes.io/assigned-gpus` annotation names. A pending pod is kept for its GPU request (the
bind verb may need it) and for the pending-pods gauge.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

import msgspec

from neuronetes import contracts as c
from neuronetes.assignment import (
    ContainerRole,
    PodGpuRequest,
    ResourceRequestError,
    effective_request,
    gang_of,
    pod_gpu_request,
)
from neuronetes.engine.victims import VictimOrder
from neuronetes.model import PodRequest
from neuronetes.quantity import QuantityError, to_mib, to_milli

from .wire import (
    Affinity,
    Container,
    ObjectMeta,
    Pod,
    PodSpec,
    Quantity,
    ResourceList,
    Toleration,
    pod_as_mapping,
)

__all__ = [
    "TERMINAL_PHASES",
    "GangRef",
    "PodInfo",
    "assigned_gpu_uuids",
    "effective_cpu_memory",
    "pod_identity",
]

TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})
_MAX_AMOUNT: Final = 2**53
_POD_UID: Final = re.compile(c.POD_UID_PATTERN)


_BINDING_LABELS: Final = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region")
"""Labels the API server copies from the node onto the pod at binding (pod topology labels,
Kubernetes 1.33+). Nothing in a `PodInfo` is read from them."""


def _read_labels(labels: dict[str, str] | None) -> dict[str, str] | None:
    """`labels` less `_BINDING_LABELS`: the labels a `PodInfo` may be derived from."""
    if not labels or not any(key in labels for key in _BINDING_LABELS):
        return labels
    return {k: v for k, v in labels.items() if k not in _BINDING_LABELS}


def pod_identity(uid: str, namespace: str, name: str) -> str:
    """The cache's key of a pod: its UID, else ``namespace/name`` (hand-made requests lack UIDs)."""
    return uid or f"{namespace}/{name}"


def _amount(resources: ResourceList | None, key: str) -> int:
    if not resources:
        return 0
    value: Quantity | None = resources.get(key)
    if value is None:
        return 0
    try:
        amount = to_milli(value) if key == "cpu" else to_mib(value)
    except (QuantityError, ValueError, ZeroDivisionError):
        return 0  # the API server validated the pod; an unreadable amount is not ours to refuse
    return min(max(amount, 0), _MAX_AMOUNT)


def _container_amount(container: Container, key: str) -> int:
    resources = container.resources
    if resources is None:
        return 0
    # Kubernetes defaults a missing request to the limit.
    if resources.requests and key in resources.requests:
        return _amount(resources.requests, key)
    return _amount(resources.limits, key)


def _effective(pod: Pod, key: str) -> int:
    """Kubernetes' effective request of `key` (`effective_request`) plus the pod overhead."""
    amounts = [
        (
            ContainerRole.SIDECAR if x.restart_policy == "Always" else ContainerRole.INIT,
            _container_amount(x, key),
        )
        for x in pod.spec.init_containers or ()
    ]
    amounts += [(ContainerRole.APP, _container_amount(x, key)) for x in pod.spec.containers or ()]
    return min(effective_request(amounts) + _amount(pod.spec.overhead, key), _MAX_AMOUNT)


def effective_cpu_memory(pod: Pod) -> tuple[int, int]:
    """(CPU milli, memory MiB) the pod holds on its node, as kube-scheduler counts them."""
    return _effective(pod, "cpu"), _effective(pod, "memory")


@dataclass(frozen=True, slots=True)
class GangRef:
    """The gang (pod group) a pod belongs to, as its labels/annotations say."""

    key: str  # the label or annotation it was read from (`contracts.GANG_KEYS`)
    name: str
    size: int | None  # None: the size is the group object's minMember
    timeout_s: float | None = None  # `neuronetes.io/gang-timeout-seconds`, if set


def _gang_ref(pod: Pod, mapping: dict[str, Any]) -> GangRef | None:
    """The pod's gang (raises ResourceRequestError for a malformed size or timeout)."""
    found = gang_of(mapping)
    if found is None:
        return None
    key, name, size = found
    timeout: float | None = None
    raw = (pod.metadata.annotations or {}).get(c.ANNOTATION_GANG_TIMEOUT)
    if raw is not None:
        try:
            timeout = float(raw)
        except ValueError:
            timeout = -1.0
        if not 1.0 <= timeout <= 86400.0:
            raise ResourceRequestError(
                f"annotation {c.ANNOTATION_GANG_TIMEOUT}: {raw!r} is not a number of seconds in 1..86400"
            )
    return GangRef(key, name, size, timeout)


def _victim_order(annotations: dict[str, str] | None) -> VictimOrder:
    raw = (annotations or {}).get(c.ANNOTATION_PREEMPTION_POLICY, "")
    try:
        return VictimOrder(raw)
    except ValueError:  # absent, or a value the CRD would refuse: kube-scheduler's order
        return VictimOrder.LOWEST_PRIORITY_FIRST


def _started(pod: Pod) -> float:
    """``status.startTime`` in Unix seconds (0.0: none, or not a time)."""
    try:
        return datetime.fromisoformat(pod.status.start_time).timestamp() if pod.status.start_time else 0.0
    except ValueError:
        return 0.0


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The cache's record of one pod."""

    id: str  # `pod_identity`
    uid: str
    namespace: str
    name: str
    node: str  # spec.nodeName; "" while pending
    phase: str
    deleting: bool
    priority: int
    cpu_milli: int
    memory_mib: int
    gpu: PodGpuRequest | None  # None: asks for no NeuroNetes resource (or `gpu_error`)
    gpu_error: str  # why the NeuroNetes request cannot be served ("" when it can)
    assignment: c.Assignment | None
    assignment_error: str
    resource_version: str
    gang: GangRef | None = None
    scheduler_name: str = ""
    node_selector: dict[str, str] | None = None  # spec.nodeSelector
    affinity: Affinity | None = None  # spec.affinity
    tolerations: tuple[Toleration, ...] = ()
    slice: str = ""  # the GPUSlice (same namespace) it runs inside: `neuronetes.io/slice`
    preemption_policy: str = ""  # spec.preemptionPolicy ("Never": it never preempts)
    started: float = 0.0  # status.startTime, Unix seconds (0: not started or unknown)
    # How it orders victims when it preempts (`neuronetes.io/preemption-policy`, an AgentPool's
    # spec.scheduling.preemption.policy written by the operator; absent or unknown: the default).
    victim_order: VictimOrder = VictimOrder.LOWEST_PRIORITY_FIRST
    # What the derived fields above were read from (spec, labels, annotations): a later version
    # of the pod with the same sources needs none of them read again (`from_pod`).
    sources: tuple[PodSpec, dict[str, str] | None, dict[str, str] | None] | None = field(
        default=None, compare=False, repr=False
    )

    @classmethod
    def from_pod(cls, pod: Pod, previous: PodInfo | None = None) -> PodInfo:
        """The record of `pod`; `previous` (the record of an earlier version, if any) is reused
        when the pod's spec, labels and annotations are unchanged (only its status, deletion or
        resourceVersion moved).

        Reusing it is the watch's hot path: most pod events after a bind are status updates
        (kubelet or kwok), and reading a pod's requests, gang and assignment again cost more than
        decoding the event (`bench/e2e_throughput.py --profile-extender`: "watch: apply").
        """
        meta = pod.metadata
        if previous is not None and previous.sources is not None and previous.uid == meta.uid:
            spec, labels, annotations = previous.sources
            if spec == pod.spec and labels == _read_labels(meta.labels) and annotations == meta.annotations:
                return replace(
                    previous,
                    phase=pod.status.phase,
                    started=_started(pod),
                    deleting=meta.deletion_timestamp is not None,
                    resource_version=meta.resource_version,
                )
        return cls._parse(pod, meta)

    @classmethod
    def _parse(cls, pod: Pod, meta: ObjectMeta) -> PodInfo:
        gpu: PodGpuRequest | None = None
        gpu_error = ""
        gang: GangRef | None = None
        try:
            mapping = pod_as_mapping(pod)
            gpu = pod_gpu_request(mapping, name=pod.key)
            gang = _gang_ref(pod, mapping)
        except (ResourceRequestError, ValueError) as exc:
            gpu_error = str(exc)
        assignment: c.Assignment | None = None
        assignment_error = ""
        raw = (meta.annotations or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        if raw is not None:
            try:
                assignment = c.decode_assignment(raw)
            except c.AssignmentError as exc:
                assignment_error = str(exc)
        cpu, memory = effective_cpu_memory(pod)
        return cls(
            id=pod_identity(meta.uid, meta.namespace, meta.name),
            uid=meta.uid,
            namespace=meta.namespace,
            name=meta.name,
            node=pod.spec.node_name,
            phase=pod.status.phase,
            deleting=meta.deletion_timestamp is not None,
            priority=pod.spec.priority or 0,
            cpu_milli=cpu,
            memory_mib=memory,
            gpu=gpu,
            gpu_error=gpu_error,
            assignment=assignment,
            assignment_error=assignment_error,
            resource_version=meta.resource_version,
            gang=gang if gpu is not None and not pod.spec.native_gang else None,
            scheduler_name=pod.spec.scheduler_name,
            node_selector=pod.spec.node_selector,
            affinity=pod.spec.affinity,
            tolerations=tuple(pod.spec.tolerations or ()),
            slice=(meta.annotations or {}).get(c.ANNOTATION_SLICE, ""),
            preemption_policy=pod.spec.preemption_policy or "",
            started=_started(pod),
            victim_order=_victim_order(meta.annotations),
            sources=(pod.spec, _read_labels(meta.labels), meta.annotations),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def labels(self) -> dict[str, str] | None:
        """Its labels (less those the API server copies from the node at binding)."""
        return self.sources[1] if self.sources is not None else None

    @property
    def gang_id(self) -> str | None:
        """``namespace/group`` of the pod's gang (groups are namespaced), or None."""
        return None if self.gang is None else f"{self.namespace}/{self.gang.name}"

    @property
    def slice_key(self) -> str:
        """``namespace/name`` of the GPUSlice the pod runs inside ("" when none)."""
        return f"{self.namespace}/{self.slice}" if self.slice else ""

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def holds_resources(self) -> bool:
        """Bound and not finished: its node counts its resources (deleting pods too, until gone)."""
        return bool(self.node) and not self.terminal

    @property
    def wants_gpu(self) -> bool:
        return self.gpu is not None or bool(self.gpu_error) or bool(self.slice)

    @property
    def pending_gpu(self) -> bool:
        """A GPU pod waiting for a placement."""
        return not self.node and not self.terminal and not self.deleting and self.wants_gpu

    @property
    def request(self) -> PodRequest:
        """What the engine places: the GPU request with the pod's CPU/memory (overhead included)."""
        if self.gpu is not None:
            return replace(
                self.gpu.request, name=self.key, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib
            )
        return PodRequest(
            name=self.key, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib, priority=self.priority
        )

    @property
    def assignment_uid(self) -> str | None:
        """The UID to record in an assignment (the contract's format), or None."""
        return self.uid if _POD_UID.fullmatch(self.uid) else None

    def bound_to(
        self, node: str, assignment: c.Assignment | None, annotations: Mapping[str, str] | None = None
    ) -> PodInfo:
        """This pod as bound by our Binding, which set `node` and added `annotations` (before the
        watch reports it). Its sources become what the API server makes of them, so the watch's
        report of the binding reuses this record unless something else changed too."""
        sources = self.sources
        if sources is not None:
            spec, labels, before = sources
            after = {**(before or {}), **annotations} if annotations else before
            sources = (msgspec.structs.replace(spec, node_name=node), labels, after)
        return replace(self, node=node, assignment=assignment, assignment_error="", sources=sources)


def assigned_gpu_uuids(assignment: c.Assignment) -> Iterable[tuple[str, str | None, int | None]]:
    """Distinct (GPU UUID, MIG profile, MIG start) the assignment's containers use."""
    seen: dict[tuple[str, int | None], tuple[str, str | None, int | None]] = {}
    for container in assignment.containers.values():
        for gpu in container.gpus:
            seen.setdefault((gpu.uuid, gpu.mig_start), (gpu.uuid, gpu.mig_profile, gpu.mig_start))
    return seen.values()
