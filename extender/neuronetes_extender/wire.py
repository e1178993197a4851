"""The kube-scheduler extender wire protocol, as msgspec structs.

kube-scheduler (``pkg/scheduler/extender.go``; types in ``k8s.io/kube-scheduler/extender/v1``)
POSTs JSON whose keys are the Go field names (capitalised, no json tags), while the embedded
Pod and Node objects use the Kubernetes API's camelCase. Only what the extender reads is
decoded: a 5,000-node ``NodeList`` is mostly skipped, and each node in it is kept as raw bytes
(`msgspec.Raw`) so that the filter answer in the full-object mode (``nodeCacheCapable: false``,
read from ``Nodes.items``) can return the very objects it was sent without re-encoding them.

Both ``nodeCacheCapable`` modes are spoken: names only (``NodeNames`` both ways) and full
objects (``Nodes.items`` both ways). A filter answer fills the field of the mode the request
used; kube-scheduler filters every node out when the field it reads is empty.

Decoding checks types (`decoder`) and never raises anything but `msgspec.DecodeError`
(`msgspec.ValidationError` is a subclass), which the HTTP layer turns into a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, TypeAlias

import msgspec

__all__ = [
    "MAX_EXTENDER_PRIORITY",
    "Affinity",
    "Container",
    "ExtenderArgs",
    "ExtenderArgsSchema",
    "ExtenderBindingArgs",
    "ExtenderBindingResult",
    "ExtenderFilterResult",
    "ExtenderPreemptionArgs",
    "ExtenderPreemptionResult",
    "HostPriority",
    "MetaPod",
    "MetaVictims",
    "Node",
    "NodeList",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "ObjectMeta",
    "Pod",
    "PodList",
    "RawNodeList",
    "Taint",
    "Toleration",
    "Victims",
    "WatchEvent",
    "decode_node",
    "decoder",
    "encode",
    "pod_as_mapping",
]

MAX_EXTENDER_PRIORITY: Final = 10
"""Prioritize scores are 0..10 (``extenderv1.MaxExtenderPriority``)."""

Quantity: TypeAlias = str | int | float
"""A Kubernetes quantity as JSON carries it (``"500m"``, ``"1Gi"``, ``2``)."""
ResourceList: TypeAlias = dict[str, Quantity]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Score = Annotated[int, msgspec.Meta(ge=0, le=MAX_EXTENDER_PRIORITY)]


# ---- the embedded Kubernetes objects (camelCase; only the fields the extender reads) ------------


class ObjectMeta(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    deletion_timestamp: str | None = None


class ResourceRequirements(msgspec.Struct, kw_only=True, omit_defaults=True):
    requests: ResourceList | None = None
    limits: ResourceList | None = None


class Container(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    name: str = ""
    resources: ResourceRequirements | None = None
    restart_policy: str | None = None  # "Always" on an init container makes it a sidecar


class NodeSelectorRequirement(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One ``matchExpressions`` / ``matchFields`` entry of a node selector term."""

    key: str = ""
    operator: str = ""
    values: list[str] | None = None


class NodeSelectorTerm(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    match_expressions: list[NodeSelectorRequirement] | None = None
    match_fields: list[NodeSelectorRequirement] | None = None


class NodeSelector(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    node_selector_terms: list[NodeSelectorTerm] | None = None


class NodeAffinity(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None


class Affinity(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    node_affinity: NodeAffinity | None = None


class Toleration(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    key: str = ""
    operator: str = ""  # "Exists" or "Equal" (the default)
    value: str = ""
    effect: str = ""  # "" tolerates every effect


class Taint(msgspec.Struct, kw_only=True, omit_defaults=True):
    key: str = ""
    value: str = ""
    effect: str = ""


class PodSpec(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    containers: list[Container] | None = None
    init_containers: list[Container] | None = None
    node_name: str = ""
    scheduler_name: str = ""
    priority: Int32 | None = None
    preemption_policy: str | None = None  # "Never": the pod never preempts
    overhead: ResourceList | None = None
    # Kubernetes' native gang scheduling (1.35+ Workload API): kube-scheduler's own Permit
    # plugin holds the group, so the extender does not run a barrier of its own.
    workload_ref: dict[str, Any] | None = None
    scheduling_group: dict[str, Any] | None = None
    # Where the pod may go (checked again at bind for pods the extender did not place).
    node_selector: dict[str, str] | None = None
    affinity: Affinity | None = None
    tolerations: list[Toleration] | None = None

    @property
    def native_gang(self) -> bool:
        return bool(self.workload_ref) or bool(self.scheduling_group)


class PodStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    phase: str = ""
    start_time: str | None = msgspec.field(default=None, name="startTime")


class Pod(msgspec.Struct, kw_only=True, omit_defaults=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)

    @property
    def key(self) -> str:
        """``namespace/name`` (the name may be empty for a pod built from ``generateName``)."""
        return f"{self.metadata.namespace}/{self.metadata.name}"


class NodeSpecFields(msgspec.Struct, kw_only=True, omit_defaults=True):
    unschedulable: bool = False
    taints: list[Taint] | None = None


class NodeStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    capacity: ResourceList | None = None
    allocatable: ResourceList | None = None


class Node(msgspec.Struct, kw_only=True, omit_defaults=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeSpecFields = msgspec.field(default_factory=NodeSpecFields)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


class ListMeta(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class NodeList(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A list response of the API server (``GET /api/v1/nodes``)."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Node] | None = None


class PodList(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A list response of the API server (``GET /api/v1/pods``)."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Pod] | None = None


class WatchEvent(msgspec.Struct, kw_only=True):
    """One line of a watch stream; `object` is decoded once `type` says what it is."""

    type: str
    object: msgspec.Raw = msgspec.Raw(b"null")


class RawNodeList(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``Nodes`` of the extender protocol: each node kept as its raw JSON, decoded on demand."""

    items: list[msgspec.Raw] | None = None


# ---- the extender protocol (capitalised Go field names) ----------------------------------------


class ExtenderArgs(
    msgspec.Struct, kw_only=True, rename={"pod": "Pod", "nodes": "Nodes", "node_names": "NodeNames"}
):
    """Body of the filter and prioritize verbs."""

    pod: Pod
    nodes: RawNodeList | None = None
    node_names: list[str] | None = None


class _NamedMeta(msgspec.Struct):
    name: Annotated[str, msgspec.Meta(min_length=1)]


class NodeObject(msgspec.Struct):
    """A Node object (only what the extender requires of one: a name); other fields pass through."""

    metadata: _NamedMeta


class NodeObjectList(msgspec.Struct, kw_only=True, omit_defaults=True):
    items: list[NodeObject] | None = None


class ExtenderArgsSchema(
    msgspec.Struct, kw_only=True, rename={"pod": "Pod", "nodes": "Nodes", "node_names": "NodeNames"}
):
    """`ExtenderArgs` as the OpenAPI document describes it (each node must be a named object)."""

    pod: Pod
    nodes: NodeObjectList | None = None
    node_names: list[str] | None = None


class ExtenderFilterResult(
    msgspec.Struct,
    kw_only=True,
    rename={
        "nodes": "Nodes",
        "node_names": "NodeNames",
        "failed_nodes": "FailedNodes",
        "failed_and_unresolvable_nodes": "FailedAndUnresolvableNodes",
        "error": "Error",
    },
):
    nodes: RawNodeList | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = msgspec.field(default_factory=dict)
    failed_and_unresolvable_nodes: dict[str, str] = msgspec.field(default_factory=dict)
    error: str = ""


class HostPriority(msgspec.Struct, kw_only=True, rename={"host": "Host", "score": "Score"}):
    host: str
    score: Score


class ExtenderBindingArgs(
    msgspec.Struct,
    kw_only=True,
    rename={"pod_name": "PodName", "pod_namespace": "PodNamespace", "pod_uid": "PodUID", "node": "Node"},
):
    pod_name: Annotated[str, msgspec.Meta(min_length=1)]
    pod_namespace: str
    pod_uid: str = ""
    node: Annotated[str, msgspec.Meta(min_length=1)]


class ExtenderBindingResult(msgspec.Struct, kw_only=True, rename={"error": "Error"}):
    error: str = ""


class MetaPod(msgspec.Struct, kw_only=True, rename={"uid": "UID"}):
    uid: str


class MetaVictims(
    msgspec.Struct, kw_only=True, rename={"pods": "Pods", "num_pdb_violations": "NumPDBViolations"}
):
    pods: list[MetaPod] | None = None
    num_pdb_violations: Int64 = 0


class Victims(
    msgspec.Struct, kw_only=True, rename={"pods": "Pods", "num_pdb_violations": "NumPDBViolations"}
):
    pods: list[Pod] | None = None
    num_pdb_violations: Int64 = 0


class ExtenderPreemptionArgs(
    msgspec.Struct,
    kw_only=True,
    rename={
        "pod": "Pod",
        "node_name_to_victims": "NodeNameToVictims",
        "node_name_to_meta_victims": "NodeNameToMetaVictims",
    },
):
    """Full victims when kube-scheduler is not ``nodeCacheCapable``, UIDs only when it is."""

    pod: Pod
    node_name_to_victims: dict[str, Victims | None] | None = None
    node_name_to_meta_victims: dict[str, MetaVictims | None] | None = None


class ExtenderPreemptionResult(
    msgspec.Struct, kw_only=True, rename={"node_name_to_meta_victims": "NodeNameToMetaVictims"}
):
    """Always UIDs: kube-scheduler maps them back to its own pods."""

    node_name_to_meta_victims: dict[str, MetaVictims] = msgspec.field(default_factory=dict)


# ---- codecs ------------------------------------------------------------------------------------

_ENCODER: Final = msgspec.json.Encoder()
_NODE_DECODER: Final = msgspec.json.Decoder(Node)
_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def decoder(kind: type[Any]) -> msgspec.json.Decoder[Any]:
    """A cached JSON decoder for one of the structs above.

    Types are checked, with msgspec's lax numeric rules: ``426.0`` (and ``"426"``) read as the
    integer JSON Schema says they are; ``4.5``, ``true`` or ``"x"`` for an integer are refused.
    """
    dec = _DECODERS.get(kind)
    if dec is None:
        dec = _DECODERS[kind] = msgspec.json.Decoder(kind, strict=False)
    return dec


def encode(obj: object) -> bytes:
    return _ENCODER.encode(obj)


def decode_node(raw: msgspec.Raw | bytes) -> Node:
    """One node of a `RawNodeList` (raises `msgspec.DecodeError` when it is not a Node object)."""
    return _NODE_DECODER.decode(raw)


def pod_as_mapping(pod: Pod) -> dict[str, Any]:
    """The pod as the JSON-shaped mapping `neuronetes.assignment.pod_gpu_request` reads."""
    return msgspec.to_builtins(pod)  # type: ignore[no-any-return]
