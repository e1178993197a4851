"""Publication of one node: its GPU labels, its capacity and its GPUNode status, each written only
where it changed, and the status also as a heartbeat (the values: `publish`).

An API error is logged and the next round tries again; a GPUNode found missing (deleted by
someone, or a 404) is created again, since the agent owns it.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .devices import Inventory
from .kube import KubeError, NodeWrites
from .nodestate import NodeState
from .publish import gpu_capacity, gpu_labels, gpunode_status

__all__ = ["Publisher"]

log = logging.getLogger("neuronetes_agent")


@dataclass(slots=True)
class _Published:
    labels: dict[str, str | None] | None = None  # what the Node has (None: unknown)
    capacity: dict[str, str] | None = None
    status_key: str = ""
    heartbeat: float = 0.0
    gpunode_missing: bool = False


@dataclass(eq=False, slots=True)
class Publisher:
    """What one node's agent last wrote, and the writes that bring it up to date (called with the
    node's lock held). `on_gpunode` takes the GPUNode when publication had to create it again."""

    state: NodeState
    kube: NodeWrites
    on_gpunode: Callable[[Mapping[str, Any]], None]
    agent_version: str
    heartbeat_s: float
    _published: _Published = field(default_factory=_Published, init=False)
    _conditions_since: dict[tuple[str, str], str] = field(default_factory=dict, init=False)
    # Labels depend on the inventory only, capacity on the usable GPUs: computed on change.
    _labels: dict[str, str | None] = field(default_factory=dict, init=False)
    _capacity_of: tuple[frozenset[str] | None, dict[str, str]] = field(default=(None, {}), init=False)

    def seen(self, node: Mapping[str, Any]) -> dict[str, str]:
        """The Node as a watch delivered it: labels and capacity it has are not rewritten. Returns
        its labels."""
        labels = dict((node.get("metadata") or {}).get("labels") or {})
        self._published.labels = dict(labels)
        self._published.capacity = dict((node.get("status") or {}).get("capacity") or {})
        return labels

    def inventory_changed(self, inventory: Inventory) -> None:
        """A new inventory: labels and capacity follow it."""
        self._labels = gpu_labels(self.state.node, inventory)
        self._capacity_of = (None, {})

    def spread_heartbeat(self) -> None:
        """Nodes started together would heartbeat together: spread them over one period."""
        self._published.heartbeat -= random.uniform(0, self.heartbeat_s)

    def gpunode_deleted(self) -> None:
        """Someone deleted the node's GPUNode: the next round creates and publishes it again."""
        self._published.gpunode_missing = True
        self._published.status_key = ""

    def publish(self, *, force: bool, mig_state: str) -> None:
        """Write labels, capacity and the GPUNode status where they changed (status also on the
        heartbeat). API errors are logged; the next tick tries again."""
        state = self.state
        inventory = state.inventory
        assert inventory is not None
        node = state.node
        pub = self._published
        now = time.monotonic()
        try:
            if pub.gpunode_missing:  # deleted by someone: the agent owns it, so it comes back
                self.on_gpunode(self.kube.ensure_gpunode(node, state.node_uid))
                pub.gpunode_missing = False
            labels = self._labels
            if pub.labels is None or any(pub.labels.get(k) != v for k, v in labels.items()):
                self.kube.patch_node_labels(node, labels)
                pub.labels = labels
            usable = frozenset(state.usable_gpus())
            if usable != self._capacity_of[0]:
                self._capacity_of = (usable, gpu_capacity(node, inventory, set(usable)))
            capacity = self._capacity_of[1]
            if pub.capacity is None or any(pub.capacity.get(k) != v for k, v in capacity.items()):
                self.kube.patch_node_capacity(node, capacity)
                pub.capacity = capacity
            allocations = state.allocations()
            key = json.dumps(
                [
                    sorted(state.states.items()),
                    allocations,
                    state.generation,
                    state.nvml_ok,
                    mig_state,
                    state.cached_models,
                ],
                default=str,
            )
            if not force and key == pub.status_key and now - pub.heartbeat >= self.heartbeat_s:
                # Nothing changed: the heartbeat alone (a small patch; a fleet sends many).
                stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                self.kube.patch_gpunode_status(node, {"lastHeartbeatTime": stamp})
                pub.heartbeat = now
            elif force or key != pub.status_key:
                status = gpunode_status(
                    inventory,
                    state.states,
                    allocations,
                    agent_version=self.agent_version,
                    generation=state.generation,
                    heartbeat=datetime.now(UTC),
                    nvml_ok=state.nvml_ok,
                    mig_state=mig_state,
                    cached_models=state.cached_models,
                )
                self._stamp_conditions(status)
                self.kube.patch_gpunode_status(node, status)
                pub.status_key, pub.heartbeat = key, now
        except KubeError as exc:
            log.warning("node %s: publication failed: %s", node, exc)
            if exc.status == 404:
                pub.gpunode_missing = True
                pub.status_key = ""

    def _stamp_conditions(self, status: dict[str, Any]) -> None:
        """Keep each condition's lastTransitionTime until its status changes."""
        stamp = status["lastHeartbeatTime"]
        for cond in status["conditions"]:
            key = (cond["type"], cond["status"])
            since = self._conditions_since.setdefault(key, stamp)
            other = (cond["type"], "False" if cond["status"] == "True" else "True")
            self._conditions_since.pop(other, None)
            cond["lastTransitionTime"] = since
