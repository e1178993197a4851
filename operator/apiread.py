"""Reading one object for an admission decision, with the webhook's own API credentials.

The webhook reads the GPUSlice a pod names (`slice_admission`) and the pod a node agent's Eviction
or Event names (`agent_admission`): in-cluster credentials (its ServiceAccount), else ``$KUBECONFIG`` (a
local cluster). A missing object reads as None; any other failure raises the caller's error type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ObjectReader", "api_reader"]

ObjectReader = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) → the object (JSON-shaped), None when there is none."""


def api_reader(
    get: Callable[[Any, str, str, float], Any], error: type[Exception], timeout_s: float
) -> ObjectReader | None:
    """An `ObjectReader` calling ``get(api_client, namespace, name, timeout_s)`` (None: no
    credentials, in-cluster or ``$KUBECONFIG``); errors other than 404 raise `error`."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException
    from kubernetes.config import ConfigException

    try:
        config.load_incluster_config()
    except ConfigException:
        try:
            config.load_kube_config()
        except (ConfigException, OSError, TypeError):
            return None
    api = client.ApiClient()

    def read(namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            got = get(api, namespace, name, timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise error(f"HTTP {exc.status} {exc.reason}") from None
        except OSError as exc:  # urllib3's connection errors are OSErrors too
            raise error(str(exc)) from None
        out: Mapping[str, Any] = api.sanitize_for_serialization(got)  # models into JSON shape
        return out

    return read
