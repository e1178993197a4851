"""The agent's Kubernetes I/O: raw JSON requests, list+watch, and the few writes it makes.

Requests go through the official client's `ApiClient` (authentication, TLS, kubeconfig) but bodies
are plain JSON: a fleet agent serving a thousand nodes cannot afford the client's model
deserialisation. Writes are merge patches of exactly the fields the agent owns.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError

from neuronetes import contracts as c

__all__ = ["EVENT_SOURCE", "GPUNODES_PATH", "Informer", "Kube", "KubeError", "NodeWrites"]

log = logging.getLogger("neuronetes_agent")

GPUNODES_PATH: Final = f"/apis/{c.GROUP}/{c.VERSION}/gpunodes"
EVENT_SOURCE: Final = "neuronetes-agent"
MERGE: Final = "application/merge-patch+json"


class KubeError(RuntimeError):
    """An API request failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
    """JSON requests against the API server of one `ApiClient`."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Sequence[tuple[str, str]] = (),
        content_type: str = MERGE,
        timeout: float = 30.0,
        stream: bool = False,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            resp = self.api.call_api(
                path,
                method,
                query_params=list(query),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=timeout,
            )
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), f"{method} {path}: {exc.status} {exc.reason}") from exc
        except Exception as exc:  # urllib3 connection errors
            raise KubeError(0, f"{method} {path}: {exc}") from exc
        if stream:
            return resp
        data = resp.data
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
    """List+watch of one resource in a thread, calling `on_event(type, object)` for every change
    (``SYNC`` with each listed object after a (re)list, then ``ADDED``/``MODIFIED``/``DELETED``).

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
        self.kube = kube
        self.path = path
        self.on_event = on_event
        self.query = list(query)
        self.watch_timeout = watch_timeout
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"informer {path}", daemon=True)
        self._resp: Any = None
        self._known: dict[str, dict[str, Any]] = {}  # key -> identity of each object seen

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # a stream that already ended
                resp.shutdown()  # unblocks the watch thread's read (urllib3 >= 2.3)
                resp.close()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                rv = self._list()
                self.synced.set()
                backoff = 0.5
                while not self._stop.is_set():
                    rv = self._watch(rv)
            except (KubeError, OSError, ValueError, HTTPError) as exc:
                if self._stop.is_set():
                    return
                log.warning("watch %s: %s; relisting in %.1f s", self.path, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _list(self) -> str:
        doc = self.kube.request("GET", self.path, query=self.query)
        listed: set[str] = set()
        for item in doc.get("items") or ():
            listed.add(self._remember("SYNC", item))
            self.on_event("SYNC", item)
        for key in [k for k in self._known if k not in listed]:
            self.on_event("DELETED", self._known.pop(key))
        return str(doc["metadata"]["resourceVersion"])

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

    def _watch(self, rv: str) -> str:
        query = [
            *self.query,
            ("watch", "true"),
            ("resourceVersion", rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.watch_timeout)),
        ]
        self._resp = self.kube.request(
            "GET", self.path, query=query, stream=True, timeout=self.watch_timeout + 30
        )
        try:
            for line in iter_resp_lines(self._resp):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise KubeError(int(obj.get("code") or 0), f"watch {self.path}: {obj.get('message')}")
                rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                if kind != "BOOKMARK":
                    self._remember(str(kind), obj)
                    self.on_event(str(kind), obj)
        finally:
            self._resp.release_conn()
            self._resp = None
        return rv
