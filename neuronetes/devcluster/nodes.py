"""Simulated GPU nodes in a running dev cluster: create them and wait until kwok runs them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from neuronetes.devcluster.api import Api
from neuronetes.devcluster.state import ClusterError
from neuronetes.model import NodeSpec
from neuronetes.profiles import node_manifest

__all__ = ["create_nodes"]


def create_nodes(
    api: Api, specs: Sequence[NodeSpec], *, wait_ready_s: float = 60.0, kwok_log: Callable[[], str] = str
) -> list[str]:
    """Create kwok nodes for `specs` and wait until they are Ready; return their names."""
    names: list[str] = []
    for spec in specs:
        manifest = node_manifest(spec)
        created = api.request("POST", "/api/v1/nodes", manifest)
        if not created.get("status", {}).get("capacity"):
            # Defensive: an API server that drops status on create gets it through /status.
            api.request(
                "PATCH",
                f"/api/v1/nodes/{spec.name}/status",
                {"status": manifest["status"]},
                content_type="application/merge-patch+json",
            )
        names.append(spec.name)
    _wait_ready(api, set(names), wait_ready_s, kwok_log)
    return names


def _wait_ready(api: Api, names: set[str], timeout_s: float, kwok_log: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(names)
    while True:
        for node in api.request("GET", "/api/v1/nodes")["items"]:
            conds = node.get("status", {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                pending.discard(node["metadata"]["name"])
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{len(pending)} node(s) not Ready after {timeout_s:.0f}s (is kwok running?): "
                f"{', '.join(sorted(pending)[:5])}\n{kwok_log()}"
            )
        time.sleep(0.2)
