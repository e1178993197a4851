"""Administrators' word on the GPUNode's annotations: the GPUs held OFFLINE, and the one-shot
requests (``online``, ``evict``, and on simulated nodes ``inject``; docs/gpu-health.md
"Administrator verbs") the agent executes once, records as a ``GPURequest`` Event and removes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.contracts import ANNOTATION_OFFLINE_GPUS  # re-exported: importable from here too

from .devices import Discovery
from .events import NodeEvents
from .eviction import Evictor
from .kube import KubeError, NodeWrites
from .nodestate import NodeState

__all__ = ["ANNOTATION_OFFLINE_GPUS", "REQUEST_PREFIX", "Orders"]

log = logging.getLogger("neuronetes_agent")

REQUEST_PREFIX: Final = f"request.{c.GROUP}/"
"""GPUNode annotations ``request.neuronetes.io/<id>``: one-shot orders the agent executes and removes
(``online``, ``evict``, and on simulated nodes ``inject``); docs/gpu-health.md."""


@dataclass(eq=False, slots=True)
class Orders:
    """The offline holds and requests of one node's GPUNode (called with the node's lock held)."""

    state: NodeState
    backend: Discovery
    kube: NodeWrites
    events: NodeEvents
    evictor: Evictor
    _requests: dict[str, dict[str, Any]] = field(default_factory=dict, init=False)
    _done: set[str] = field(default_factory=set, init=False)  # executed, annotation not yet gone

    def take(self, annotations: Mapping[str, str]) -> None:
        """Read the GPUNode's annotations: hold the listed GPUs OFFLINE, queue new requests."""
        offline = {u.strip() for u in annotations.get(ANNOTATION_OFFLINE_GPUS, "").split(",") if u.strip()}
        for uuid, h in self.state.health.items():
            h.admin_offline = uuid in offline
        self._done &= set(annotations)  # handled and removed: forget them
        for key, value in annotations.items():
            if key.startswith(REQUEST_PREFIX) and key not in self._done:
                try:
                    order = json.loads(value)
                except ValueError:
                    order = {}
                self._requests[key] = order if isinstance(order, dict) else {}

    def handle(self) -> None:
        """Execute the queued requests, each once, and remove their annotations."""
        if not self._requests:
            return
        requests, self._requests = self._requests, {}
        node = self.state.node
        for key, order in requests.items():
            message = self._execute(order)
            self._done.add(key)
            self.events.record("Normal", "GPURequest", f"{key}: {message}")
            try:
                self.kube.patch_gpunode(node, {"metadata": {"annotations": {key: None}}})
            except KubeError as exc:
                log.warning("node %s: cannot remove %s: %s", node, key, exc)

    def _execute(self, order: Mapping[str, Any]) -> str:
        verb, uuid = order.get("verb"), order.get("gpu")
        h = self.state.health.get(str(uuid))
        if h is None:
            return f"refused: no GPU {uuid!r} on this node"
        if verb == "online":
            repair = getattr(self.backend, "repair", None)
            if repair is not None:
                repair(str(uuid))
            h.on_online()
            return f"GPU {uuid} online"
        if verb == "evict":
            pods = [p for p in self.state.pods.values() if uuid in p.allocations]
            for pod in pods:
                self.evictor.evict(pod, f"GPU {uuid} taken offline by an administrator (--force)")
            return f"evicted {len(pods)} pods from GPU {uuid}"
        if verb == "inject":
            inject = getattr(self.backend, "inject", None)
            if inject is None:
                return "refused: fault injection exists only on simulated nodes"
            try:
                return str(inject(str(uuid), order.get("fault") or {}))
            except (KeyError, TypeError, ValueError) as exc:
                return f"refused: {exc}"
        return f"refused: unknown verb {verb!r}"
