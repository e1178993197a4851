"""Kubernetes Events of one node's agent: on the Node, and on a pod where one is concerned."""

from __future__ import annotations

import logging

from .kube import KubeError, NodeWrites
from .reconcile import PodRef

__all__ = ["NodeEvents"]

log = logging.getLogger("neuronetes_agent")


class NodeEvents:
    """Records the agent's Events for `node`; an API error is logged, never raised."""

    def __init__(self, node: str, node_uid: str, kube: NodeWrites) -> None:
        self.node = node
        self.node_uid = node_uid
        self.kube = kube

    def record(self, kind: str, reason: str, message: str, *, pod: PodRef | None = None) -> None:
        """An Event on the Node, and with `pod` on that pod too."""
        log.info("node %s: %s %s", self.node, reason, message)
        try:
            self.kube.node_event(self.node, self.node_uid, kind, reason, message)
        except KubeError as exc:
            log.warning("node %s: cannot record event %s: %s", self.node, reason, exc)
        if pod is None:
            return
        try:
            self.kube.pod_event(pod.namespace, pod.name, pod.uid, self.node, kind, reason, message)
        except KubeError as exc:
            log.warning("node %s: cannot record event %s on pod %s: %s", self.node, reason, pod.name, exc)
