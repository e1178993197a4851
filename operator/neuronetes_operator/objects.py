"""Writing about NeuroNetes objects through the API: their status subresource and core/v1 Events,
shared by the AgentPool, ToolBinding and GPUSlice controllers."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
from kubernetes import client
from kubernetes.client.rest import ApiException

from neuronetes import contracts as c

__all__ = ["api_message", "patch_status", "post_event"]

log = logging.getLogger("neuronetes_operator")


def patch_status(custom: client.CustomObjectsApi, plural: str, meta: Mapping[str, Any], body: Any) -> None:
    """Merge-patch the status subresource of a NeuroNetes object; a deleted object is no error."""
    try:
        custom.patch_namespaced_custom_object_status(
            c.GROUP, c.VERSION, meta["namespace"], plural, meta["name"], body
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


def post_event(core: client.CoreV1Api, obj: Mapping[str, Any], etype: str, reason: str, message: str) -> None:
    """Record a core/v1 Event about `obj` (a NeuroNetes object) from the operator; never raises."""
    meta = obj["metadata"]
    involved = {
        "apiVersion": obj.get("apiVersion", c.API_VERSION),
        "kind": obj.get("kind", "AgentPool"),
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta["uid"],
    }
    post_event_about(core, involved, meta["namespace"], meta["name"], etype, reason, message)


def post_event_about(
    core: client.CoreV1Api,
    involved: Mapping[str, Any],
    namespace: str,
    name: str,
    etype: str,
    reason: str,
    message: str,
) -> None:
    """Record a core/v1 Event in `namespace` about the object `involved` names (its apiVersion, kind,
    name, namespace and uid where known; None values left out), named after `name`; never raises."""
    now = datetime.now(UTC).isoformat()
    body = {
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {k: v for k, v in involved.items() if v is not None},
        "type": etype,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": "neuronetes-operator"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": "neuronetes-operator",
    }
    try:
        core.create_namespaced_event(namespace, body)
    except ApiException as exc:
        log.warning("event %s for %s/%s not posted: %s", reason, namespace, name, exc.status)


def api_message(exc: ApiException) -> str:
    """The API server's own message for a refused request (its Status body), else the HTTP reason."""
    try:
        return str(msgspec.json.decode(exc.body or b"{}").get("message") or exc.reason)
    except msgspec.DecodeError:
        return str(exc.reason)
