"""The MIG layout controller's reads and writes of the API: pending pods, MIG GPUSlices, Nodes,
``GPUNode.status.migPlan``, and the Events on GPUNodes and on the claims (pods, GPUSlices) a
relayout serves or cannot serve. `mig_layouts.MigLayoutController` decides; this talks to the API.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from neuronetes import contracts as c
from neuronetes.migdemand import demand_owner

from .objects import post_event_about

__all__ = ["EVENT_NAMESPACE", "GPUNODES", "MigLayoutIO"]

log = logging.getLogger("neuronetes_operator.mig_layouts")

GPUNODES: Final = "gpunodes"
GPUSLICES: Final = "gpuslices"
EVENT_NAMESPACE: Final = "default"  # Events about cluster-scoped objects (GPUNode) live here


class MigLayoutIO:
    """API access of the MIG layout controller (in its namespaces, else cluster-wide)."""

    def __init__(self, api: Any, namespaces: list[str] | None = None) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespaces = list(namespaces or [])

    # ---- reads -----------------------------------------------------------------------------------

    def _pending_pods(self) -> list[dict[str, Any]]:
        query = {"field_selector": "status.phase=Pending,spec.nodeName="}
        out: list[dict[str, Any]] = []
        scopes: list[str | None] = [*self.namespaces] or [None]
        for ns in scopes:
            answer = (
                self.core.list_namespaced_pod(ns, _preload_content=False, **query)
                if ns
                else self.core.list_pod_for_all_namespaces(_preload_content=False, **query)
            )
            out.extend(json.loads(answer.data).get("items") or [])
        return out

    def _slices(self) -> list[dict[str, Any]]:
        """Every GPUSlice (its MIG ones are demand while Pending, and hold an instance once Bound)."""
        out: list[dict[str, Any]] = []
        scopes: list[str | None] = [*self.namespaces] or [None]
        for ns in scopes:
            found = (
                self.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, ns, GPUSLICES)
                if ns
                else self.custom.list_cluster_custom_object(c.GROUP, c.VERSION, GPUSLICES)
            )
            out.extend(found.get("items") or [])
        return out

    def _nodes(self) -> dict[str, dict[str, Any]]:
        answer = self.core.list_node(_preload_content=False)
        return {n["metadata"]["name"]: n for n in json.loads(answer.data).get("items") or []}

    # ---- status and Events -----------------------------------------------------------------------

    def _status(self, gpunode: Mapping[str, Any], plan: Mapping[str, Any]) -> None:
        try:
            self.custom.patch_cluster_custom_object_status(
                c.GROUP, c.VERSION, GPUNODES, gpunode["metadata"]["name"], {"status": {"migPlan": dict(plan)}}
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _event(self, gpunode: Mapping[str, Any], etype: str, reason: str, message: str) -> None:
        meta = gpunode["metadata"]
        post_event_about(
            self.core,
            {"apiVersion": c.API_VERSION, "kind": "GPUNode", "name": meta["name"], "uid": meta.get("uid")},
            EVENT_NAMESPACE,
            meta["name"],
            etype,
            reason,
            message,
        )

    def _claim_event(self, key: str, message: str, etype: str, reason: str) -> None:
        """An Event on the pod or GPUSlice a demand key names (`neuronetes.migdemand.demand_owner`)."""
        kind, namespace, name = demand_owner(key)
        api_version = "v1" if kind == "Pod" else c.API_VERSION
        involved = {"apiVersion": api_version, "kind": kind, "name": name, "namespace": namespace}
        post_event_about(self.core, involved, namespace, name, etype, reason, message)
