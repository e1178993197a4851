"""An in-memory API server for `PoolController` unit tests: the calls it makes, on one namespace."""

from __future__ import annotations

import json
import types
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from neuronetes_operator.controller import PoolController
from neuronetes_operator.settings import OperatorSettings

__all__ = ["FakeCluster", "controller"]


class FakeCluster:
    """The API calls `PoolController` makes, on one namespace's pods and pools, in memory."""

    def __init__(self, pool: dict[str, Any]) -> None:
        self.pool = pool
        self.pods: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.pages = 0
        self.nodes: list[dict[str, Any]] = []
        self.node_lists = 0

    # CoreV1Api
    def list_namespaced_pod(
        self, namespace: str, label_selector: str, limit: int, _continue: str | None, _preload_content: bool
    ) -> Any:
        key, _, value = label_selector.partition("=")
        items = [p for p in self.pods.values() if p["metadata"]["labels"].get(key) == value]
        start = int(_continue or 0)
        more = {"continue": str(start + limit)} if start + limit < len(items) else {}
        self.pages += 1
        return types.SimpleNamespace(
            data=json.dumps({"metadata": more, "items": items[start : start + limit]}).encode()
        )

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if name in self.pods:
            raise ApiException(status=409)
        self.pods[name] = json.loads(json.dumps(body))
        self.created.append(name)

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self.pods.pop(name)
        self.deleted.append(name)

    def list_node(
        self, limit: int, _preload_content: bool, label_selector: str = "", _continue: str | None = None
    ) -> Any:
        """Nodes, all or ``KEY in (A,B)``, a page of `limit` after the offset `_continue`."""
        items = self.nodes
        if label_selector:
            key, _, values = label_selector.partition(" in ")
            wanted = values.strip("()").split(",")
            items = [n for n in items if n["metadata"]["labels"].get(key) in wanted]
        start = int(_continue or 0)
        more = {"continue": str(start + limit)} if start + limit < len(items) else {}
        self.node_lists += 1
        page = {"metadata": more, "items": items[start : start + limit]}
        return types.SimpleNamespace(data=json.dumps(page).encode())

    def create_namespaced_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.events.append((body["reason"], body["message"]))

    # CustomObjectsApi
    def get_namespaced_custom_object(self, *args: str) -> dict[str, Any]:
        pool: dict[str, Any] = json.loads(json.dumps(self.pool))
        return pool

    def list_namespaced_custom_object(self, *args: str) -> dict[str, Any]:
        return {"items": []}  # no GangReservation reported

    def patch_namespaced_custom_object_status(self, *args: Any) -> None:
        self.pool["status"] = args[-1]["status"]

    # PolicyV1Api, SchedulingV1Api
    def create_namespaced_pod_disruption_budget(self, namespace: str, body: Any) -> None:
        pass

    def create_priority_class(self, body: Any) -> None:
        pass


def controller(fake: FakeCluster, batch_size: int, **settings: Any) -> PoolController:
    ctl = PoolController(client.ApiClient(), OperatorSettings(batch_size=batch_size, **settings))
    ctl.core = ctl.custom = ctl.policy = fake
    return ctl
