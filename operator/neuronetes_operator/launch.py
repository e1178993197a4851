"""How the operator and the webhook are started and registered: argv, settings, RBAC, webhook configs.

`neuronetes dev cluster up` (and the e2e tests) start both as host processes with these: the
operator with `operator_argv` and a settings file from `dev_operator_settings`, two webhook
replicas with `webhook_argv` on one port, and the API objects from `webhook_configurations`
(pointing at ``https://127.0.0.1:<port>``), `priority_classes` (the priority tiers' PriorityClasses)
and `operator_rbac` (what the operator may do, for a deployment under its own service account).
The chart renders the same objects.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.profiles import KWOK_TAINT

from .admission import ANNOTATION_SLICE
from .settings import MIG_PARTED_CONFIG_MAP
from .tiers import CLASS_PREFIX, PriorityTier, priority_classes

__all__ = [
    "AGENT_USERNAME",
    "EVICTION_MATCH_CONDITION",
    "MUTATING_WEBHOOK_NAME",
    "POD_EVENT_MATCH_CONDITION",
    "POD_MATCH_CONDITION",
    "VALIDATING_WEBHOOK_NAME",
    "dev_operator_settings",
    "operator_argv",
    "operator_rbac",
    "priority_classes",
    "tiers_file",
    "webhook_argv",
    "webhook_configurations",
]

MUTATING_WEBHOOK_NAME: Final = "neuronetes-pods"
VALIDATING_WEBHOOK_NAME: Final = "neuronetes-objects"

_HAS_OURS = "c.resources.{part}.exists(k, k.startsWith('" + c.RESOURCE_PREFIX + "'))"
_ASKS = (
    "(has(c.resources) && ((has(c.resources.limits) && " + _HAS_OURS.format(part="limits") + ") || "
    "(has(c.resources.requests) && " + _HAS_OURS.format(part="requests") + ")))"
)
POD_MATCH_CONDITION: Final = (
    f"object.spec.containers.exists(c, {_ASKS}) || "
    f"(has(object.spec.initContainers) && object.spec.initContainers.exists(c, {_ASKS})) || "
    f"(has(object.metadata.annotations) && '{ANNOTATION_SLICE}' in object.metadata.annotations) || "
    f"(has(object.spec.priorityClassName) && object.spec.priorityClassName.startsWith('{CLASS_PREFIX}'))"
)
"""CEL: the pod asks for a NeuroNetes resource, names a GPUSlice, or names a ``neuronetes-*``
PriorityClass (a priority tier's, which only namespaces granted the tier may use). Other pods never
reach the webhook, so they are admitted even when no replica is up."""

AGENT_USERNAME: Final = "system:serviceaccount:neuronetes-system:neuronetes-agent"
"""The node agent's ServiceAccount (the chart's, in namespace neuronetes-system): the user whose
evictions the webhook checks, as the policy manifests/policies/agent-node.yaml names it."""


def eviction_match_condition(agent_user: str = AGENT_USERNAME) -> str:
    """CEL: the request is the node agent's. Only its evictions and pod Events reach the webhook
    (which holds them to pods of its own node); every other one is admitted with no replica up."""
    return f"request.userInfo.username == '{agent_user}'"


EVICTION_MATCH_CONDITION: Final = eviction_match_condition()
POD_EVENT_MATCH_CONDITION: Final = "has(object.involvedObject.kind) && object.involvedObject.kind == 'Pod'"
"""CEL: a core Event about a Pod (the admission policy decides every other Event of the agent)."""


def operator_argv(kubeconfig: Path, settings: Path, tiers: Path | None = None) -> list[str]:
    """`tiers`: the priority tiers file (default: `tiers.DEFAULT_TIERS`)."""
    return [
        sys.executable,
        "-m",
        "neuronetes.cli",
        "operator",
        "run",
        "--kubeconfig",
        str(kubeconfig),
        "--config",
        str(settings),
        *(["--priority-tiers", str(tiers)] if tiers is not None else []),
    ]


def tiers_file(path: Path, tiers: Sequence[PriorityTier]) -> Path:
    """Write `tiers` to `path` as the operator and the webhook read them (``--priority-tiers``)."""
    import msgspec

    path.write_bytes(msgspec.json.encode(list(tiers)))
    return path


def webhook_argv(
    port: int,
    cert_dir: Path,
    host: str = "127.0.0.1",
    kubeconfig: Path | None = None,
    trusted: Sequence[str] | None = None,
    tiers: Path | None = None,
) -> list[str]:
    """`kubeconfig`: what the replica reads GPUSlices, Namespaces, ResourceQuotas and pods with
    (``$KUBECONFIG``; in a cluster, its service account). `trusted`: users that may change
    NeuroNetes annotations of existing pods (default: a local cluster's extender, whose nudge
    touches pending pods). `tiers`: the priority tiers file (default: `tiers.DEFAULT_TIERS`)."""
    if trusted is None:
        trusted = [c.EXTENDER_USERNAME]
    env = ["env", f"KUBECONFIG={kubeconfig}"] if kubeconfig is not None else []
    return [
        *env,
        sys.executable,
        "-m",
        "neuronetes.cli",
        "webhook",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        "--cert-dir",
        str(cert_dir),
        *(arg for user in trusted for arg in ("--trusted-user", user)),
        *(["--priority-tiers", str(tiers)] if tiers is not None else []),
    ]


def dev_operator_settings() -> dict[str, Any]:
    """Settings for a local cluster: pool pods tolerate the simulated (kwok) nodes' taint."""
    return {"podTolerations": [dict(KWOK_TAINT, operator="Equal")]}


def webhook_configurations(ca_pem: bytes, url: str, agent_user: str = AGENT_USERNAME) -> list[dict[str, Any]]:
    """The Mutating (pods; the node agent's evictions) and Validating (AgentPool, GPUSlice; the node
    agent's Events about pods) webhook configurations for `url` (the agent: `agent_user`)."""
    import base64

    bundle = base64.b64encode(ca_pem).decode()

    def hook(
        name: str, group: str, version: str, operations: list[str], resources: list[str]
    ) -> dict[str, Any]:
        """A webhook of `name` (path ``/<name>``), failing closed, for `operations` on `resources`."""
        return {
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "name": f"{name}.{c.GROUP}",
            "clientConfig": {"url": f"{url}/{name}", "caBundle": bundle},
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": [version],
                    "operations": operations,
                    "resources": resources,
                    "scope": "Namespaced",
                }
            ],
        }

    pods = {
        **hook("pods", "", "v1", ["CREATE", "UPDATE"], ["pods"]),
        "matchConditions": [{"name": "asks-for-neuronetes-gpus", "expression": POD_MATCH_CONDITION}],
        "reinvocationPolicy": "IfNeeded",
    }
    evictions = {
        **hook("evictions", "", "v1", ["CREATE"], ["pods/eviction"]),
        "matchConditions": [
            {"name": "by-the-node-agent", "expression": eviction_match_condition(agent_user)}
        ],
    }
    objects = hook("objects", c.GROUP, c.VERSION, ["CREATE", "UPDATE"], ["agentpools", "gpuslices"])
    events = {
        **hook("events", "", "v1", ["CREATE", "UPDATE"], ["events"]),
        "matchConditions": [
            {"name": "by-the-node-agent", "expression": eviction_match_condition(agent_user)},
            {"name": "about-a-pod", "expression": POD_EVENT_MATCH_CONDITION},
        ],
    }
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": MUTATING_WEBHOOK_NAME},
            "webhooks": [pods, evictions],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": VALIDATING_WEBHOOK_NAME},
            "webhooks": [objects, events],
        },
    ]


def operator_rbac(namespace: str, service_account: str = "neuronetes-operator") -> list[dict[str, Any]]:
    """Least privilege for the operator: its objects, the pods and budgets it owns, events, nodes,
    and the ResourceQuotas its slices count against. No PriorityClass: the admin's tiers are the
    chart's (`priority_classes`)."""
    rules = [
        {
            "apiGroups": [c.GROUP],
            "resources": ["agentpools", "gpuslices", "toolbindings", "gpunodes"],
            "verbs": ["get", "list", "watch", "patch"],
        },
        {
            "apiGroups": [c.GROUP],
            "resources": ["agentpools/status", "gpuslices/status", "toolbindings/status"],
            "verbs": ["get", "patch", "update"],
        },
        # patch: the carbon gate controller removes the neuronetes.io/carbon scheduling gate.
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "list", "watch", "create", "delete", "patch"],
        },
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        # The MIG layout controller (docs/mig.md, "Applying a plan"): GPUNode status.migPlan, the
        # nvidia.com/mig.config label and cordon of mig-manager nodes, mig-manager's ConfigMap
        # (get and patch by name; create cannot be limited to a name).
        {"apiGroups": [c.GROUP], "resources": ["gpunodes/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [MIG_PARTED_CONFIG_MAP],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [c.GROUP], "resources": ["gangreservations"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "create", "patch"]},
        # Model preloading (docs/model-cache.md): one Job per node, deleted once done.
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list", "create", "delete"]},
        {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["list"]},
        # dataLocality: the Services / StatefulSets a pool runs near (`locality`).
        {"apiGroups": [""], "resources": ["services"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get"]},
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        # The autoscaling controller: spec.replicas through the scale subresource, and the other
        # autoscalers that would make it passive (docs/autoscaling.md, "The controller").
        {"apiGroups": [c.GROUP], "resources": ["agentpools/scale"], "verbs": ["get", "patch"]},
        {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": ["list"]},
        {"apiGroups": ["keda.sh"], "resources": ["scaledobjects"], "verbs": ["list"]},
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "neuronetes-operator"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "neuronetes-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "neuronetes-operator",
            },
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    ]
