"""The agent's Kubernetes I/O: raw JSON requests, list+watch, and the few writes it makes.

Requests go through the official client's `ApiClient` (authentication, TLS, kubeconfig) but bodies
are plain JSON: a fleet agent serving a thousand nodes cannot afford the client's model
deserialisation. Writes are merge patches of exactly the fields the agent owns.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from kubernetes.client import ApiClient

from neuronetes import contracts as c
from neuronetes.kube.client import KubeClient, KubeError
from neuronetes.kube.codec import JsonCodec
from neuronetes.kube.informer import Informer as CoreInformer
from neuronetes.kube.informer import InformerHooks, InformerSettings

__all__ = ["EVENT_SOURCE", "GPUNODES_PATH", "Informer", "Kube", "KubeError", "NodeWrites"]

log = logging.getLogger("neuronetes_agent")

GPUNODES_PATH: Final = f"/apis/{c.GROUP}/{c.VERSION}/gpunodes"
EVENT_SOURCE: Final = "neuronetes-agent"
MERGE: Final = "application/merge-patch+json"
REQUEST_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 2.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeWrites(Protocol):
    """The writes a node's agent makes (`Kube` sends them; the GPU validation keeps them)."""

    def ensure_gpunode(self, node: str, node_uid: str) -> dict[str, Any]: ...
    def patch_gpunode_status(self, node: str, status: Mapping[str, Any]) -> None: ...
    def patch_gpunode(self, node: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None: ...
    def patch_node_capacity(self, node: str, resources: Mapping[str, str]) -> None: ...
    def node_event(self, node: str, node_uid: str, kind: str, reason: str, message: str) -> None: ...
    def pod_event(
        self, namespace: str, name: str, uid: str, node: str, kind: str, reason: str, message: str
    ) -> None: ...
    def evict(self, namespace: str, name: str) -> int: ...


class Kube:
    """JSON requests against the API server of one `ApiClient` (the core `KubeClient`)."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.client = KubeClient(api, timeout=REQUEST_TIMEOUT_S)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Sequence[tuple[str, str]] = (),
        content_type: str = MERGE,
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> Any:
        """One call; the parsed JSON answer (None when empty). Raises `KubeError` (and
        `ValueError` for an answer that is not JSON)."""
        data = self.client.request(
            method, path, query=query, body=body, timeout=timeout, content_type=content_type
        )
        return json.loads(data) if data else None

    # ---- writes --------------------------------------------------------------------------------

    def ensure_gpunode(self, node: str, node_uid: str) -> dict[str, Any]:
        """The node's GPUNode (created, owned by the Node so it goes with it, when missing)."""
        body = {
            "apiVersion": c.API_VERSION,
            "kind": "GPUNode",
            "metadata": {
                "name": node,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
            },
            "spec": {},
        }
        try:
            return dict(self.request("POST", GPUNODES_PATH, body, content_type="application/json"))
        except KubeError as exc:
            if exc.status != 409:
                raise
            return dict(self.request("GET", f"{GPUNODES_PATH}/{node}"))

    def patch_gpunode_status(self, node: str, status: Mapping[str, Any]) -> None:
        # A merge patch replaces lists whole, which is what status.gpus needs.
        self.request("PATCH", f"{GPUNODES_PATH}/{node}/status", {"status": status})

    def patch_gpunode(self, node: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self.request("PATCH", f"{GPUNODES_PATH}/{node}", patch))

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        self.request("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": dict(labels)}})

    def patch_node_capacity(self, node: str, resources: Mapping[str, str]) -> None:
        resources = dict(resources)
        self.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            {"status": {"capacity": resources, "allocatable": resources}},
        )

    def node_event(self, node: str, node_uid: str, kind: str, reason: str, message: str) -> None:
        """A Kubernetes Event on the Node (namespace default, as kubelet records node events)."""
        involved = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
        self._post_event("default", node, involved, node, kind, reason, message)

    def pod_event(
        self, namespace: str, name: str, uid: str, node: str, kind: str, reason: str, message: str
    ) -> None:
        """A Kubernetes Event on a pod, recorded by the agent of `node` (in the pod's namespace: the
        API server takes an object's Events only there)."""
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}
        self._post_event(namespace, name, involved, node, kind, reason, message)

    def _post_event(
        self,
        namespace: str,
        name: str,
        involved: Mapping[str, str],
        node: str,
        kind: str,
        reason: str,
        message: str,
    ) -> None:
        now = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": dict(involved),
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": EVENT_SOURCE, "host": node},
            "reportingComponent": EVENT_SOURCE,
            "reportingInstance": node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.request("POST", f"/api/v1/namespaces/{namespace}/events", body, content_type="application/json")

    def evict(self, namespace: str, name: str) -> int:
        """Ask the Eviction API to evict a pod; returns the HTTP status (201 done, 404 gone, 429 the
        disruption budget refuses now)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            self.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                body,
                content_type="application/json",
            )
        except KubeError as exc:
            return exc.status
        return 201


class Informer:
    """List+watch of one resource in a thread (the core `neuronetes.kube.Informer`), calling
    `on_event(type, object)` for every change (``SYNC`` with each listed object after a (re)list,
    then ``ADDED``/``MODIFIED``/``DELETED``).

    An object deleted while the watch was down is missing from the relist: it is reported
    ``DELETED`` then, with the identity the informer kept of it (metadata name, namespace, UID and
    ``spec.nodeName``), so nobody keeps a pod that is gone (the node ledger would hold its GPUs)."""

    def __init__(
        self,
        kube: Kube,
        path: str,
        on_event: Callable[[str, dict[str, Any]], None],
        *,
        query: Sequence[tuple[str, str]] = (),
        watch_timeout: int = 240,
    ) -> None:
        self.path = path
        self.on_event = on_event
        self.synced = threading.Event()
        self._known: dict[str, dict[str, Any]] = {}  # key -> identity of each object seen
        hooks: InformerHooks[dict[str, Any]] = InformerHooks(self._replace, self._change)
        self._informer = CoreInformer(
            kube.client,
            path,
            path,
            JsonCodec(),
            hooks,
            _settings(query, watch_timeout),
            thread_name=f"informer {path}",
        )

    def start(self) -> Informer:
        self._informer.start()
        return self

    def stop(self) -> None:
        self._informer.stop(STOP_TIMEOUT_S)

    def relist(self) -> str:
        """List the resource and report it (``SYNC``, then ``DELETED`` for what is gone); returns
        the list's resourceVersion."""
        return self._informer.relist()

    def _replace(self, items: Sequence[dict[str, Any]]) -> None:
        listed: set[str] = set()
        for item in items:
            listed.add(self._remember("SYNC", item))
            self.on_event("SYNC", item)
        for key in [k for k in self._known if k not in listed]:
            self.on_event("DELETED", self._known.pop(key))
        self.synced.set()

    def _change(self, kind: str, obj: dict[str, Any]) -> None:
        self._remember(kind, obj)
        self.on_event(kind, obj)

    def _remember(self, kind: str, obj: Mapping[str, Any]) -> str:
        """Keep (or, for DELETED, forget) the object's identity; returns its key."""
        meta = obj.get("metadata") or {}
        key = str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        if kind == "DELETED":
            self._known.pop(key, None)
            return key
        identity: dict[str, Any] = {
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
        }
        node = (obj.get("spec") or {}).get("nodeName")
        if node:
            identity["spec"] = {"nodeName": node}
        self._known[key] = identity
        return key


def _settings(query: Sequence[tuple[str, str]], watch_timeout: int) -> InformerSettings:
    """The agent's list+watch: one unpaged list per relist, fixed watch timeouts, no periodic
    resync, backoff from 0.5 s to 10 s."""
    return InformerSettings(
        query=tuple(query),
        page_size=0,
        list_timeout=REQUEST_TIMEOUT_S,
        watch_timeout=float(watch_timeout),
        resync_period=None,
        max_backoff=10.0,
        jitter=False,
    )
