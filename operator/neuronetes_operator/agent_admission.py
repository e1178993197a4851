"""What the node agent may do to pods: evict, and record Events about, only those of its own node.

The ValidatingAdmissionPolicy ``neuronetes.io-agent-writes-only-its-node`` holds the agent to its
own Node, GPUNode and Node Events, but an Eviction, and an Event about a pod, name a pod by
namespace and name, and CEL in an admission policy cannot read that pod's ``spec.nodeName``. So
the webhook reads the pod, through two webhooks whose match conditions select the agent's
ServiceAccount (docs/rbac.md, docs/webhook.md):

- ``evictions.neuronetes.io`` (mutating, route ``/evictions``, `review_eviction`): the eviction is
  allowed only when the pod is bound to the node the caller's credentials name (user info extra
  `NODE_NAME_EXTRA`, set by the API server for a token bound to a pod on a node), and is then
  pinned to the pod's UID as its delete precondition, so a pod deleted and re-created under the
  same name (on another node) between this check and the eviction is not evicted: the API server
  answers 409 Conflict instead;
- ``events.neuronetes.io`` (validating, route ``/events``, `review_pod_event`): a core Event whose
  involvedObject is a Pod is allowed only when that pod is bound to the caller's node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from .apiread import api_reader, pod_path

__all__ = [
    "NODE_NAME_EXTRA",
    "PodReadError",
    "PodReader",
    "api_pod_reader",
    "review_eviction",
    "review_pod_event",
]

NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
"""The user info extra the API server sets from a pod-bound ServiceAccount token: the pod's node."""


class PodReadError(Exception):
    """The pod could not be read (the API server is unreachable, or access is denied)."""


PodReader = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) → the pod object, None when there is none; raises `PodReadError`."""


def _node_of(request: Mapping[str, Any]) -> str:
    extra = (request.get("userInfo") or {}).get("extra") or {}
    values = extra.get(NODE_NAME_EXTRA) if isinstance(extra, Mapping) else None
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return ""


def _pin_uid(eviction: Mapping[str, Any], uid: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The JSON patch that makes the Eviction's delete precondition the pod's UID."""
    options = eviction.get("deleteOptions")
    if not isinstance(options, Mapping):
        return [], [{"op": "add", "path": "/deleteOptions", "value": {"preconditions": {"uid": uid}}}]
    pre = options.get("preconditions")
    if not isinstance(pre, Mapping):
        return [], [{"op": "add", "path": "/deleteOptions/preconditions", "value": {"uid": uid}}]
    if pre.get("uid") is None:
        return [], [{"op": "add", "path": "/deleteOptions/preconditions/uid", "value": uid}]
    if pre["uid"] != uid:
        return [f"the Eviction's precondition names UID {pre['uid']}, not the pod's ({uid})"], []
    return [], []


def _pod_on_node(
    request: Mapping[str, Any], namespace: str, name: str, read: PodReader | None, doing: str
) -> tuple[list[str], Mapping[str, Any] | None]:
    """(refusals, the pod): the pod `namespace`/`name` when it is bound to the node the caller's
    credentials name; else a refusal saying why, naming that node, for the agent that may `doing`."""
    user = str((request.get("userInfo") or {}).get("username") or "")
    pod = f"pod {namespace}/{name}"
    node = _node_of(request)
    if not node:
        return [
            f"{user} may {doing} only pods bound to the node its credentials name, and these name none: "
            "the agent runs with the ServiceAccount token the kubelet projects into its pod (bound to "
            f"the pod, and so to its node); refused for {pod}"
        ], None
    agent = f"the NeuroNetes agent of node {node} ({user})"
    if read is None:
        return [
            f"this webhook cannot read pods (no API credentials: an in-cluster service account or "
            f"$KUBECONFIG), so it cannot check that {pod} is on node {node}; {agent} may not {doing} it"
        ], None
    try:
        got = read(namespace, name)
    except PodReadError as exc:
        return [f"{pod} could not be read ({exc}) to check that it is on node {node}; retry"], None
    if got is None:
        return [f"{pod} does not exist: {agent} may {doing} only pods bound to node {node}"], None
    bound = str((got.get("spec") or {}).get("nodeName") or "")
    if bound != node:
        where = f"bound to node {bound}" if bound else "not bound to a node"
        return [f"{agent} may {doing} only pods bound to node {node}; {pod} is {where}"], None
    return [], got


def review_eviction(
    request: Mapping[str, Any], read: PodReader | None
) -> tuple[list[str], list[dict[str, Any]]]:
    """(refusals, JSON patch) for an AdmissionReview request creating a ``pods/eviction``."""
    obj = request.get("object")
    eviction: Mapping[str, Any] = obj if isinstance(obj, Mapping) else {}
    namespace = str(request.get("namespace") or "")
    name = str(request.get("name") or (eviction.get("metadata") or {}).get("name") or "")
    refusals, pod = _pod_on_node(request, namespace, name, read, "evict")
    if pod is None:
        return refusals, []
    return _pin_uid(eviction, str((pod.get("metadata") or {}).get("uid") or ""))


def review_pod_event(request: Mapping[str, Any], read: PodReader | None) -> list[str]:
    """Refusals for an AdmissionReview request writing a core Event (only one about a Pod is
    checked here; the admission policy checks the others)."""
    obj = request.get("object")
    event: Mapping[str, Any] = obj if isinstance(obj, Mapping) else {}
    about = event.get("involvedObject") or {}
    if not isinstance(about, Mapping) or about.get("kind") != "Pod":
        return []
    namespace = str(about.get("namespace") or request.get("namespace") or "")
    name = str(about.get("name") or "")
    refusals, pod = _pod_on_node(request, namespace, name, read, "record Events about")
    if pod is None:
        return refusals
    uid = (pod.get("metadata") or {}).get("uid")
    if about.get("uid") and about["uid"] != uid:
        return [f"the Event's involvedObject names UID {about['uid']}, not pod {namespace}/{name}'s ({uid})"]
    return []


def api_pod_reader(timeout_s: float = 3.0) -> PodReader | None:
    """A `PodReader` over the API server: in-cluster credentials, else ``$KUBECONFIG`` (None:
    neither is available; the agent's evictions are then refused)."""
    return api_reader(pod_path, PodReadError, timeout_s)
