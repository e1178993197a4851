"""Reading objects for an admission decision, with the webhook's own API credentials.

The webhook reads the AgentPool a pod's ``neuronetes.io/pool`` label names (`carbon_admission`),
the GPUSlice a pod names (`slice_admission`), the pod a node agent's Eviction
or Event names (`agent_admission`), the Namespace whose labels grant a priority tier
(`tier_admission`), and a namespace's ResourceQuotas, GPUSlices and pods (`quota_admission`):
in-cluster credentials (its ServiceAccount), else ``$KUBECONFIG`` (a local cluster), through the
core `neuronetes.kube.KubeClient` (raw JSON). A missing object reads as None; any other failure
raises the caller's error type.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from neuronetes import contracts as c
from neuronetes.kube.client import KubeClient, KubeError, load_api_client

__all__ = [
    "ObjectLister",
    "ObjectPath",
    "ObjectReader",
    "agentpool_path",
    "api_client",
    "api_lister",
    "api_reader",
    "gpuslice_path",
    "namespace_path",
    "pod_path",
]

ObjectReader = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) → the object (JSON-shaped), None when there is none."""
ObjectLister = Callable[[str, str], list[Mapping[str, Any]]]
"""(plural, namespace) → the namespace's objects of that kind (JSON-shaped)."""
ObjectPath = Callable[[str, str], str]
"""(namespace, name) → the object's REST path."""


def _q(part: str) -> str:
    return quote(part, safe="")


def gpuslice_path(namespace: str, name: str) -> str:
    return f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{_q(namespace)}/gpuslices/{_q(name)}"


def agentpool_path(namespace: str, name: str) -> str:
    return f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{_q(namespace)}/agentpools/{_q(name)}"


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}"


def namespace_path(_namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_q(name)}"


_COLLECTIONS: dict[str, Callable[[str], str]] = {
    "resourcequotas": lambda ns: f"/api/v1/namespaces/{_q(ns)}/resourcequotas",
    "pods": lambda ns: f"/api/v1/namespaces/{_q(ns)}/pods",
    "gpuslices": lambda ns: f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{_q(ns)}/gpuslices",
}


def api_client() -> KubeClient | None:
    """A client with in-cluster credentials, else ``$KUBECONFIG``'s (None: neither)."""
    try:
        return KubeClient(load_api_client())
    except KubeError:
        return None


def _get(api: KubeClient, path: str, error: type[Exception], timeout_s: float) -> Any:
    """The object at `path` (parsed JSON); None for 404; other failures raise `error`."""
    try:
        return json.loads(api.get(path, timeout=timeout_s))
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise error(f"HTTP {exc.status} {exc.reason}" if exc.status else exc.message) from None
    except ValueError as exc:  # an answer that is not JSON
        raise error(f"GET {path}: {exc}") from None


def api_reader(path: ObjectPath, error: type[Exception], timeout_s: float) -> ObjectReader | None:
    """An `ObjectReader` of the objects at ``path(namespace, name)`` (None: no credentials,
    in-cluster or ``$KUBECONFIG``); errors other than 404 raise `error`."""
    api = api_client()
    if api is None:
        return None

    def read(namespace: str, name: str) -> Mapping[str, Any] | None:
        out: Mapping[str, Any] | None = _get(api, path(namespace, name), error, timeout_s)
        return out

    return read


def api_lister(error: type[Exception], timeout_s: float) -> ObjectLister | None:
    """An `ObjectLister` of ``resourcequotas``, ``pods`` and ``gpuslices`` (None: no credentials);
    failures raise `error` (a namespace that does not exist lists nothing)."""
    api = api_client()
    if api is None:
        return None

    def list_(plural: str, namespace: str) -> list[Mapping[str, Any]]:
        got = _get(api, _COLLECTIONS[plural](namespace), error, timeout_s)
        return list((got or {}).get("items") or [])

    return list_
