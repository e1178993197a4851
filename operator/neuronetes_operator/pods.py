"""The pods an AgentPool wants: names and manifests. Pure.

A pool's pods share one `PoolTemplate`, built once per reconcile (or admission review); a pod's
manifest is built from it only when it is about to be created, so nothing here costs memory or
time in proportion to the replica count beyond a name per pod (docs/agentpool.md, "Batches").
Pods have deterministic names, so a restarted operator (or two reconciles racing) finds the pods
it made instead of making more: ``<pool>-<i>`` without gang scheduling, ``<pool>-<g>-<m>`` (gang
``g``, member ``m``) with it. A pod's ``neuronetes.io/pod-template-hash`` label is a hash of
everything the pool contributes to it, so a changed spec is a changed hash (rollout).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.api.models import AgentPoolSpec, PodTemplate
from neuronetes.api.units import bandwidth_gbps, gpu_memory_class_labels
from neuronetes.spot import instance_type_preferences, on_demand_requirements, spot_preferences

from .policy import ResolvedPool

__all__ = [
    "ANNOTATION_MODEL",
    "ANNOTATION_REPLACES",
    "DEFAULT_CONTAINER",
    "ENV_MODEL",
    "LABEL_CAPACITY",
    "LABEL_POOL",
    "LABEL_TEMPLATE_HASH",
    "DesiredPod",
    "PoolTemplate",
    "alternate_name",
    "desired_pods",
    "gang_name",
    "pod_names",
    "region_preferences",
    "served_template",
]

LABEL_POOL: Final = f"{c.GROUP}/pool"
"""Label on every pod (and the PodDisruptionBudget) of a pool: the pool's name."""
LABEL_TEMPLATE_HASH: Final = f"{c.GROUP}/pod-template-hash"
"""Label: hash of what the pool put into the pod; a pod with another hash is outdated."""
LABEL_CAPACITY: Final = f"{c.GROUP}/capacity"
"""Label: ``spot`` on a pod the operator let use spot nodes, ``on-demand`` on one it kept off them."""
ANNOTATION_REPLACES: Final = f"spot.{c.GROUP}/replaces"
"""Annotation of a replacement pod (spot interruption or rebalance): the pod it replaces and its
deadline, ``<pod>@<RFC 3339>`` (``<pod>`` alone: no deadline, the old pod goes once this one is Ready).
Outside ``neuronetes.io/``, whose pod annotations the webhook keeps for GPU decisions and requests;
only the operator reads it, on the pods its pool controls."""
REPLACEMENT_SUFFIX: Final = "-r"
"""A pod's replacement is named by adding this suffix (and a replacement's replacement by taking it
away), so both can exist at once and the names stay deterministic: a restarted operator finds them."""
ANNOTATION_MODEL: Final = c.ANNOTATION_MODEL
"""Annotation on the pods of a pool with a fallback model: the model they serve."""
ENV_MODEL: Final = "AGENTPOOL_MODEL"
"""Environment variable of every container of a pool with a fallback model: the model served, so
a template's args can say ``$(AGENTPOOL_MODEL)`` (docs/fallback.md, "Which template")."""
DEFAULT_CONTAINER: Final[dict[str, Any]] = {"name": "agent", "image": "registry.k8s.io/pause:3.10"}
"""The container of a pool without a template: it only holds the replica's GPUs."""


@dataclass(frozen=True, slots=True)
class DesiredPod:
    """One pod the pool wants: its name, gang (index or None) and the pool's shared template.

    `alternate`: the other name of the same replica (`REPLACEMENT_SUFFIX`): one of the two is the
    replica, both only while one replaces the other. `spot`: whether the pod may use spot nodes;
    `avoid`: nodes it must not land on (under an interruption notice); `replaces`: the value of
    its `ANNOTATION_REPLACES`. These three are set on the pods about to be created
    (`neuronetes_operator.spot_plan`)."""

    name: str
    gang: int | None
    template: PoolTemplate
    alternate: str = ""
    spot: bool = False
    avoid: tuple[str, ...] = ()
    replaces: str | None = None

    @property
    def manifest(self) -> dict[str, Any]:
        """The pod's manifest, built on each access (`PoolTemplate.pod`)."""
        return self.template.pod(
            self.name,
            self.gang,
            spot=self.spot,
            avoid=self.avoid,
            replacement=self.name.endswith(REPLACEMENT_SUFFIX),
            replaces=self.replaces,
        )

    @property
    def unit(self) -> str:
        """What the pod belongs to and goes with: its gang (``gang:<label>``) or itself."""
        if self.gang is None:
            return f"pod:{self.name}"
        return f"gang:{self.template.gang_label(self.gang, self.name.endswith(REPLACEMENT_SUFFIX))}"

    def swapped(self) -> DesiredPod:
        """The same replica under its other name (the replacement of the pod named `name`)."""
        return DesiredPod(self.alternate, self.gang, self.template, self.name)


def alternate_name(name: str) -> str:
    """The other name of the replica named `name` (`REPLACEMENT_SUFFIX`)."""
    if name.endswith(REPLACEMENT_SUFFIX):
        return name[: -len(REPLACEMENT_SUFFIX)]
    return name + REPLACEMENT_SUFFIX


def gang_name(pool: str, index: int) -> str:
    """The ``neuronetes.io/gang`` value of a pool's gang ``index``."""
    return f"{pool}-{index}"


def _resources(spec: AgentPoolSpec, resolved: ResolvedPool, model: str | None) -> dict[str, str]:
    """The GPUs of a replica serving `model`: ``gpuRequirements.count``, or
    ``costOptimization.fallbackGPUCount`` for the fallback model when set."""
    if spec.mig_profile is not None:
        return {c.mig_resource_name(spec.mig_profile): "1"}
    count = spec.gpu_requirements.count
    cost = spec.scheduling.cost_optimization if spec.scheduling else None
    if (
        cost is not None
        and cost.fallback_gpu_count is not None
        and resolved.fallback_model is not None
        and model == resolved.fallback_model
    ):
        count = cost.fallback_gpu_count
    return {c.RESOURCE_GPU: str(count)}


def _node_requirements(spec: AgentPoolSpec, resolved: ResolvedPool) -> list[dict[str, Any]]:
    req = spec.gpu_requirements
    out: list[dict[str, Any]] = []
    if req.type is not None:
        values = sorted({req.type, req.type.upper()})
        out.append({"key": c.LABEL_GPU_TYPE, "operator": "In", "values": values})
    if req.memory is not None and spec.mig_profile is None:
        out.append(
            {"key": c.LABEL_GPU_MEMORY, "operator": "In", "values": list(gpu_memory_class_labels(req.memory))}
        )
    return out


def _with_node_requirements(spec: dict[str, Any], extra: list[dict[str, Any]]) -> None:
    """AND `extra` into every required node-selector term of the pod spec (a new term if none)."""
    if not extra:
        return
    affinity = spec.setdefault("affinity", {})
    node = affinity.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term["matchExpressions"] = [*term.get("matchExpressions", []), *copy.deepcopy(extra)]


def region_preferences(spec: AgentPoolSpec) -> list[dict[str, Any]]:
    """``carbonAware.preferredRegions`` as preferred node-affinity terms on
    ``topology.kubernetes.io/region``: the first region weighs 100, each next one 10 less (at least
    1), so kube-scheduler ranks nodes by the list's order and still places a pod where none is."""
    carbon = spec.scheduling.carbon_aware if spec.scheduling else None
    if carbon is None or not carbon.enabled or not carbon.preferred_regions:
        return []
    return [
        {
            "weight": max(1, 100 - 10 * i),
            "preference": {
                "matchExpressions": [{"key": c.LABEL_REGION, "operator": "In", "values": [region]}]
            },
        }
        for i, region in enumerate(carbon.preferred_regions)
    ]


def _with_node_preferences(spec: dict[str, Any], extra: list[dict[str, Any]]) -> None:
    """Add `extra` to the pod spec's preferred node-affinity terms (after the template's own)."""
    if not extra:
        return
    node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    preferred = node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    preferred.extend(copy.deepcopy(extra))


def _annotations(spec: AgentPoolSpec, resolved: ResolvedPool) -> dict[str, str]:
    topo = spec.gpu_requirements.topology
    out: dict[str, str] = {c.ANNOTATION_LOCALITY: topo.locality}
    if topo.min_bandwidth is not None:
        out[c.ANNOTATION_MIN_BANDWIDTH] = f"{bandwidth_gbps(topo.min_bandwidth):g}"
    gang = spec.scheduling.gang_scheduling if spec.scheduling else None
    if resolved.gang_size and gang is not None:
        out[c.ANNOTATION_GANG_TIMEOUT] = str(gang.schedule_timeout_seconds)
    preemption = spec.scheduling.preemption if spec.scheduling else None
    # Written only when it changes the extender's order: the default needs no annotation, and
    # writing it would change the template (and roll the pods) of every pool that preempts.
    if preemption is not None and preemption.enabled and preemption.policy != "lowest-priority-first":
        out[c.ANNOTATION_PREEMPTION_POLICY] = preemption.policy
    return out


def served_template(spec: AgentPoolSpec, resolved: ResolvedPool, model: str | None) -> PodTemplate | None:
    """The template of the pods that serve `model`: ``costOptimization.fallbackTemplate`` for the
    fallback model when set, else ``spec.template``."""
    cost = spec.scheduling.cost_optimization if spec.scheduling else None
    if (
        resolved.fallback_model is not None
        and model == resolved.fallback_model
        and cost is not None
        and cost.fallback_template is not None
    ):
        return cost.fallback_template
    return spec.template


def _pod_spec(
    spec: AgentPoolSpec,
    resolved: ResolvedPool,
    tolerations: list[dict[str, Any]],
    template: PodTemplate | None,
    model: str | None,
) -> dict[str, Any]:
    pod = copy.deepcopy(dict(template.spec if template and template.spec else {}))
    containers = pod.get("containers") or [dict(DEFAULT_CONTAINER)]
    pod["containers"] = containers
    if resolved.fallback_model is not None and model is not None:
        for ctr in containers:
            env = [e for e in ctr.get("env") or [] if e.get("name") != ENV_MODEL]
            ctr["env"] = [*env, {"name": ENV_MODEL, "value": model}]
    first = containers[0]
    resources = first.setdefault("resources", {})
    limits = resources.setdefault("limits", {})
    limits.update(_resources(spec, resolved, model))
    pod["schedulerName"] = c.SCHEDULER_NAME
    if resolved.priority_class is not None:  # a tier's, chosen by the operator (tiers.pool_priority)
        pod["priorityClassName"] = resolved.priority_class
    _with_node_requirements(pod, _node_requirements(spec, resolved))
    _with_node_preferences(pod, region_preferences(spec))
    if tolerations:
        pod["tolerations"] = [*pod.get("tolerations", []), *copy.deepcopy(tolerations)]
    return pod


def _capacity_variants(base: dict[str, Any], resolved: ResolvedPool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(on-demand, spot-capable) variants of the pod spec: the two a pool's pods come in.

    On-demand: ``NotIn`` the spot values of every spot label (`neuronetes.spot.SPOT_LABELS`).
    Spot-capable: no such requirement, a preference for spot nodes and, in order, for
    ``spotStrategy.instanceTypes``."""
    on_demand = copy.deepcopy(base)
    _with_node_requirements(on_demand, on_demand_requirements())
    spot = copy.deepcopy(base)
    _with_node_preferences(spot, spot_preferences() + instance_type_preferences(resolved.spot.instance_types))
    return on_demand, spot


def _template_hash(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


class PoolTemplate:
    """What every pod of a pool shares, built once: the spec, labels, annotations, owner and hash.

    The pods of a pool differ only in their name and, with gang scheduling, their gang labels
    (`pod`); so building the template is the only cost that grows with the pool's spec, and none
    grows with its replica count. The webhook checks one pod of it; the operator builds the pods
    it creates in this reconcile's batch, no others.
    """

    __slots__ = (
        "annotations",
        "digest",
        "gang_size",
        "labels",
        "namespace",
        "on_demand_spec",
        "owner",
        "pool",
        "scheduling_annotations",
        "spec",
        "spot_spec",
    )

    def __init__(
        self,
        pool: Mapping[str, Any],
        spec: AgentPoolSpec,
        resolved: ResolvedPool,
        tolerations: list[dict[str, Any]] | None = None,
        model: str | None = None,
    ) -> None:
        """`model`: the model the pods serve (``status.activeModel``); None is ``spec.model``. Only
        a pool with a fallback model has its model in its pods (`ENV_MODEL`, `ANNOTATION_MODEL`):
        the pods of other pools are as they were, and no operator upgrade rolls them."""
        meta = pool["metadata"]
        self.pool: str = meta["name"]
        self.namespace: str = meta["namespace"]
        model = spec.model if model is None else model
        template = served_template(spec, resolved, model)
        template_meta = template.metadata if template and template.metadata else {}
        self.spec = _pod_spec(spec, resolved, tolerations or [], template, model)
        self.annotations = {**(template_meta.get("annotations") or {}), **_annotations(spec, resolved)}
        if resolved.fallback_model is not None and model is not None:
            self.annotations[ANNOTATION_MODEL] = model
        cache = spec.scheduling.cache_aware if spec.scheduling else None
        if cache is not None and cache.enabled and model is not None:
            # The extender's model-cache term for this pod (docs/model-cache.md "Scoring").
            self.annotations[ANNOTATION_MODEL] = model
            self.annotations[c.ANNOTATION_CACHE_HIT_WEIGHT] = f"{cache.cache_hit_weight:g}"
        self.labels: dict[str, str] = dict(template_meta.get("labels") or {})
        self.gang_size = resolved.gang_size
        # The hash leaves out whether a pod may use spot: that is decided per pod, at creation
        # (docs/spot.md), and a change of spot share moves pods by replacement, not by rollout.
        self.digest = _template_hash(self.spec, self.annotations, self.labels, resolved.gang_size)
        self.on_demand_spec, self.spot_spec = _capacity_variants(self.spec, resolved)
        self.scheduling_annotations: dict[str, str] = {}
        """Added to the pods created from now on and left out of the hash: data-locality hints and
        the candidate limit (`neuronetes.locality`), which change as the data's pods move and
        matter only while a pod is scheduled, so a change never replaces running pods."""
        self.owner = {
            "apiVersion": pool.get("apiVersion", c.API_VERSION),
            "kind": "AgentPool",
            "name": self.pool,
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def gang_label(self, gang: int, replacement: bool = False) -> str:
        """The ``neuronetes.io/gang`` of gang `gang`'s members (of its replacement: another gang)."""
        label = gang_name(self.pool, gang)
        return label + REPLACEMENT_SUFFIX if replacement else label

    def pod(
        self,
        name: str,
        gang: int | None,
        *,
        spot: bool = False,
        avoid: tuple[str, ...] = (),
        replacement: bool = False,
        replaces: str | None = None,
    ) -> dict[str, Any]:
        """The manifest of the pool's pod `name` (in gang `gang`, or None); a new object each call.

        `spot`: the spot-capable variant, else the on-demand one; `avoid`: nodes it must not land
        on; `replacement`: a member of its gang's replacement; `replaces`: `ANNOTATION_REPLACES`."""
        labels = {
            **self.labels,
            LABEL_POOL: self.pool,
            LABEL_TEMPLATE_HASH: self.digest,
            LABEL_CAPACITY: "spot" if spot else "on-demand",
        }
        if gang is not None:
            labels[c.LABEL_GANG] = self.gang_label(gang, replacement)
            labels[c.LABEL_GANG_SIZE] = str(self.gang_size)
        annotations = {**self.scheduling_annotations, **self.annotations}
        if replaces is not None:
            annotations[ANNOTATION_REPLACES] = replaces
        spec = copy.deepcopy(self.spot_spec if spot else self.on_demand_spec)
        if avoid:
            _with_node_requirements(
                spec, [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": sorted(avoid)[:64]}]
            )
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [dict(self.owner)],
            },
            "spec": spec,
        }


def pod_names(pool: str, resolved: ResolvedPool) -> Iterator[tuple[str, int | None]]:
    """(name, gang) of every pod `resolved` wants, in creation order: ``<pool>-<i>``, or
    ``<pool>-<g>-<m>`` for member ``m`` of gang ``g``."""
    if resolved.gang_size:
        for g in range(resolved.gangs):
            for m in range(resolved.gang_size):
                yield f"{pool}-{g}-{m}", g
    else:
        for i in range(resolved.desired):
            yield f"{pool}-{i}", None


def desired_pods(
    pool: Mapping[str, Any],
    spec: AgentPoolSpec,
    resolved: ResolvedPool,
    *,
    tolerations: list[dict[str, Any]] | None = None,
    model: str | None = None,
) -> list[DesiredPod]:
    """Every pod `pool` (the AgentPool object as the API server sent it) wants, in creation order.

    One `PoolTemplate` is built; each `DesiredPod` is a name and a gang index that share it, and
    builds its manifest only when asked (`DesiredPod.manifest`).

    Args:
        pool: the AgentPool's object (for name, namespace, uid: the pods' owner).
        spec: its decoded spec; resolved: `neuronetes_operator.policy.resolve(spec)`.
        tolerations: added to every pod (the operator's settings; e.g. simulated nodes' taint).
        model: the model served (``status.activeModel``, `neuronetes_operator.fallback`); None:
            ``spec.model``.
    """
    template = PoolTemplate(pool, spec, resolved, tolerations, model)
    return [
        DesiredPod(name, gang, template, alternate_name(name))
        for name, gang in pod_names(template.pool, resolved)
    ]
