"""The one pod builder of the tests and benchmarks.

`manifest` is a pod as a user submits it (``kubectl create``, a POST); `served` adds what the API
server adds (UID, resourceVersion, status, defaulted fields), which is how the watch and
kube-scheduler's extender requests carry it. Containers request 100m CPU and 128Mi; NeuroNetes
limits are mirrored into requests, as the API server does for extended resources.

Importable from tests (pytest's ``pythonpath`` holds ``tests/``) and from the benchmarks (they
put this folder on ``sys.path``).
"""

from __future__ import annotations

import copy
import itertools
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from neuronetes import contracts as c
from neuronetes.profiles import KWOK_TAINT

__all__ = ["container", "manifest", "new_uid", "node_view", "served"]

_UIDS = itertools.count(1)
IMAGE = "registry.example/worker:1"


def new_uid() -> str:
    return str(uuid.UUID(int=next(_UIDS) + (7 << 100)))


def container(name: str = "main", limits: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {}}
    for key, value in (limits or {}).items():
        resources["limits"][key] = str(value)
        if key.startswith(c.RESOURCE_PREFIX):
            resources["requests"][key] = str(value)
    return {"name": name, "image": IMAGE, "resources": resources, **extra}


def manifest(
    name: str,
    limits: Mapping[str, Any] | None = None,
    *,
    containers: Sequence[dict[str, Any]] | None = None,
    init: Sequence[dict[str, Any]] = (),
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    node: str = "",
    priority: int | None = None,
    scheduler: str = c.SCHEDULER_NAME,
) -> dict[str, Any]:
    """A pod as submitted: one container ``main`` with `limits`, or `containers`; tolerates kwok."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": list(containers) if containers is not None else [container("main", limits)],
        "tolerations": [dict(KWOK_TAINT, operator="Equal")],
    }
    if init:
        spec["initContainers"] = list(init)
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def served(
    pod: Mapping[str, Any], *, uid: str | None = None, resource_version: str = "4242"
) -> dict[str, Any]:
    """`pod` as the API server serves it: UID, resourceVersion, status, and fields it defaults
    (which the extender must ignore)."""
    out = copy.deepcopy(dict(pod))
    meta = out["metadata"]
    meta.setdefault("labels", {"app": "gpu-test"})
    meta.update(
        {
            "uid": uid or new_uid(),
            "resourceVersion": resource_version,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl", "operation": "Update"}],
        }
    )
    spec = out["spec"]
    spec.setdefault("priority", 0)
    spec.update(
        {
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        }
    )
    for ctr in [*spec["containers"], *spec.get("initContainers", ())]:
        ctr.setdefault("terminationMessagePath", "/dev/termination-log")
        ctr.setdefault("imagePullPolicy", "IfNotPresent")
    phase = "Running" if spec.get("nodeName") else "Pending"
    out["status"] = {"phase": phase, "qosClass": "Burstable", "conditions": []}
    return out


def node_view(
    node: str,
    uid: str,
    name: str,
    containers: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    namespace: str = "ml",
    phase: str = "Running",
) -> dict[str, Any]:
    """A pod bound to `node` as the node agent's watch sees it: metadata with an assignment
    annotation giving each container its GPU entries (``uuid``, ``index``, ``memoryMiB``,
    ``computePercent``), ``nodeName`` and the phase."""
    doc = {
        "version": 1,
        "node": node,
        "podUID": uid,
        "containers": {
            n: {"gpus": [dict(g) for g in gpus], "priority": 0, "qos": "Guaranteed"}
            for n, gpus in containers.items()
        },
    }
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "annotations": {c.ANNOTATION_ASSIGNED_GPUS: json.dumps(doc)},
        },
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }
