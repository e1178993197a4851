"""Reading objects for an admission decision, with the webhook's own API credentials.

The webhook reads the GPUSlice a pod names (`slice_admission`), the pod a node agent's Eviction
or Event names (`agent_admission`), the Namespace whose labels grant a priority tier
(`tier_admission`), and a namespace's ResourceQuotas, GPUSlices and pods (`quota_admission`):
in-cluster credentials (its ServiceAccount), else ``$KUBECONFIG`` (a local cluster). A missing
object reads as None; any other failure raises the caller's error type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ObjectLister", "ObjectReader", "api_client", "api_lister", "api_reader"]

ObjectReader = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) → the object (JSON-shaped), None when there is none."""
ObjectLister = Callable[[str, str], list[Mapping[str, Any]]]
"""(plural, namespace) → the namespace's objects of that kind (JSON-shaped)."""


def api_client() -> Any | None:
    """A Kubernetes ApiClient with in-cluster credentials, else ``$KUBECONFIG``'s (None: neither)."""
    from kubernetes import client, config
    from kubernetes.config import ConfigException

    try:
        config.load_incluster_config()
    except ConfigException:
        try:
            config.load_kube_config()
        except (ConfigException, OSError, TypeError):
            return None
    return client.ApiClient()


def _call(api: Any, error: type[Exception], call: Callable[[], Any]) -> Any:
    """`call()` in JSON shape; None for 404; other failures raise `error`."""
    from kubernetes.client.rest import ApiException

    try:
        got = call()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise error(f"HTTP {exc.status} {exc.reason}") from None
    except OSError as exc:  # urllib3's connection errors are OSErrors too
        raise error(str(exc)) from None
    return api.sanitize_for_serialization(got)  # models into JSON shape


def api_reader(
    get: Callable[[Any, str, str, float], Any], error: type[Exception], timeout_s: float
) -> ObjectReader | None:
    """An `ObjectReader` calling ``get(api_client, namespace, name, timeout_s)`` (None: no
    credentials, in-cluster or ``$KUBECONFIG``); errors other than 404 raise `error`."""
    api = api_client()
    if api is None:
        return None

    def read(namespace: str, name: str) -> Mapping[str, Any] | None:
        out: Mapping[str, Any] | None = _call(api, error, lambda: get(api, namespace, name, timeout_s))
        return out

    return read


def api_lister(error: type[Exception], timeout_s: float) -> ObjectLister | None:
    """An `ObjectLister` of ``resourcequotas``, ``pods`` and ``gpuslices`` (None: no credentials);
    failures raise `error` (a namespace that does not exist lists nothing)."""
    from kubernetes import client

    from neuronetes import contracts as c

    api = api_client()
    if api is None:
        return None
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    calls: dict[str, Callable[[str], Any]] = {
        "resourcequotas": lambda ns: core.list_namespaced_resource_quota(ns, _request_timeout=timeout_s),
        "pods": lambda ns: core.list_namespaced_pod(ns, _request_timeout=timeout_s),
        "gpuslices": lambda ns: custom.list_namespaced_custom_object(
            c.GROUP, c.VERSION, ns, "gpuslices", _request_timeout=timeout_s
        ),
    }

    def list_(plural: str, namespace: str) -> list[Mapping[str, Any]]:
        got = _call(api, error, lambda: calls[plural](namespace))
        return list((got or {}).get("items") or [])

    return list_
