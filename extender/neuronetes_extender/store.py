"""The store fed by the watches: node specs (Node merged with its GPUNode), the facts the
bind-time filter reads, pod records, Bound GPUSlices, and the sync bookkeeping readiness reports.

No decisions here: the store records what the API server said, and says whether the node set
or a slice's reservation changed (`dirty`), which the cache answers by rebuilding its snapshot
(slices change rarely, and pods that run inside a slice are charged differently once it is
known). Not thread-safe on its own: `GpuCache` calls it under its lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Final

from neuronetes.api.models import GPUNode
from neuronetes.model import NodeSpec
from neuronetes.nodes import NodeSpecError, apply_gpunode, unusable_node
from neuronetes.pricing import EMPTY_TABLE, PriceTable, price_of

from .nodefit import NodeFacts
from .nodes import node_spec_from_node
from .pods import PodInfo
from .slices import SliceInfo
from .wire import Node

__all__ = ["GPUNODES", "RESOURCES", "ClusterStore"]

log = logging.getLogger(__name__)

RESOURCES: Final = ("nodes", "pods")
GPUNODES: Final = "gpunodes"


def spec_of(node: Node, prices: PriceTable = EMPTY_TABLE) -> NodeSpec:
    """The node's spec; an unreadable node is kept as one nothing is placed on."""
    try:
        return node_spec_from_node(node, prices)
    except NodeSpecError as exc:
        log.warning("%s: nothing will be placed there", exc)
        return unusable_node(node.metadata.name)


class ClusterStore:
    """Nodes, GPUNodes and pods as last reported, and when each resource was last heard of."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.specs: dict[str, NodeSpec] = {}  # merged: what the snapshot is built from
        self._node_specs: dict[str, NodeSpec] = {}  # from the Node objects alone
        self._gpunodes: dict[str, GPUNode] = {}  # the agents' GPUNode objects, by node name
        self.facts: dict[str, NodeFacts] = {}  # labels and taints, by node name
        self.pods: dict[str, PodInfo] = {}
        # Binds in flight: each pod as the watch will report it once our Binding is in (it often
        # does before the Binding's answer is read), so that report reuses the record.
        self._binding: dict[str, PodInfo] = {}
        self.slices: dict[str, SliceInfo] = {}  # Bound GPUSlices by namespace/name
        self.dirty = False  # the node specs changed since the snapshot was built
        self.prices = EMPTY_TABLE  # the price table (`neuronetes.pricing`) of nodes without a price label
        self._required: set[str] = set(RESOURCES)
        self._synced: set[str] = set()
        self._heard: dict[str, float] = {}

    # ---- nodes ---------------------------------------------------------------------------------
    def _merged(self, spec: NodeSpec) -> NodeSpec:
        gpunode = self._gpunodes.get(spec.name)
        if gpunode is None or (not spec.schedulable and not spec.gpus):
            return spec
        return apply_gpunode(spec, gpunode)

    def _set_spec(self, name: str) -> bool:
        """Recompute node `name`'s spec; whether it changed."""
        base = self._node_specs.get(name)
        spec = None if base is None else self._merged(base)
        if self.specs.get(name) == spec:
            return False
        if spec is None:
            del self.specs[name]
        else:
            self.specs[name] = spec
        self.dirty = True
        return True

    def set_node_specs(self, specs: Iterable[NodeSpec]) -> None:
        """Replace the node set with ready-made specs (a relist, tests, benchmarks)."""
        self._node_specs = {s.name: s for s in specs}
        new = {name: self._merged(s) for name, s in self._node_specs.items()}
        if new != self.specs:
            self.specs = new
            self.dirty = True

    def replace_nodes(self, nodes: Iterable[Node]) -> None:
        named = [n for n in nodes if n.metadata.name]
        self.facts = {n.metadata.name: NodeFacts.of(n) for n in named}
        self.set_node_specs(spec_of(n, self.prices) for n in named)

    def upsert_node(self, node: Node) -> None:
        spec = spec_of(node, self.prices)
        self.facts[spec.name] = NodeFacts.of(node)
        self._node_specs[spec.name] = spec
        self._set_spec(spec.name)

    def set_prices(self, prices: PriceTable) -> None:
        """Price every node again with `prices` (the price table changed): a node's own price
        label still wins (`neuronetes.pricing.node_price`)."""
        self.prices = prices
        for name, spec in list(self._node_specs.items()):
            if spec.schedulable or spec.gpus:  # an unusable node has no labels to price it by
                self._node_specs[name] = replace(spec, price_per_hour=price_of(spec.labels, prices))
                self._set_spec(name)

    def delete_node(self, name: str) -> None:
        self.facts.pop(name, None)
        self._node_specs.pop(name, None)
        self._set_spec(name)

    def replace_gpunodes(self, objs: Iterable[GPUNode]) -> None:
        new = {str(o.metadata.get("name") or ""): o for o in objs}
        new.pop("", None)
        names = set(new) | set(self._gpunodes)
        self._gpunodes = new
        for name in names:
            self._set_spec(name)

    def upsert_gpunode(self, obj: GPUNode) -> bool:
        """Record an agent's GPUNode; whether its node's spec changed (GPUs, their health, MIG
        instances, cached models)."""
        name = str(obj.metadata.get("name") or "")
        if not name:
            return False
        self._gpunodes[name] = obj
        return self._set_spec(name)

    def delete_gpunode(self, name: str) -> None:
        if self._gpunodes.pop(name, None) is not None:
            self._set_spec(name)

    # ---- pods ----------------------------------------------------------------------------------
    def put_pod(self, info: PodInfo) -> PodInfo:
        """Record `info` and return what is recorded: ``nodeName`` is write-once in Kubernetes,
        so an event showing a pod unbound after it was bound predates the binding."""
        old = self.pods.get(info.id)
        if old is not None and old.node and not info.node:
            info = replace(
                info, node=old.node, assignment=old.assignment, assignment_error=old.assignment_error
            )
        self.pods[info.id] = info
        if info.node:
            self._binding.pop(info.id, None)
        return info

    def pop_pod(self, pod_id: str) -> PodInfo | None:
        self._binding.pop(pod_id, None)
        return self.pods.pop(pod_id, None)

    def expect_bound(self, info: PodInfo) -> None:
        """`info` is its pod as the watch will report it once our Binding is in (a bind in flight)."""
        self._binding[info.id] = info

    def bind_settled(self, pod_id: str) -> None:
        self._binding.pop(pod_id, None)

    def previous(self, pod_id: str) -> PodInfo | None:
        """The record a new version of the pod may reuse (`PodInfo.from_pod`): as expected after
        a bind in flight, else as recorded. Safe without the cache's lock: dict reads of
        immutable records (`bench/e2e_throughput.py --profile-extender`: "watch: apply")."""
        return self._binding.get(pod_id) or self.pods.get(pod_id)

    # ---- GPUSlices -----------------------------------------------------------------------------
    def replace_slices(self, slices: Iterable[SliceInfo]) -> bool:
        """The Bound slices after a (re)list; whether any reservation changed."""
        new = {s.key: s for s in slices}
        if new == self.slices:
            return False
        self.slices = new
        self.dirty = True
        return True

    def put_slice(self, key: str, info: SliceInfo | None) -> bool:
        """Record slice `key` (None: it reserves nothing now); whether its reservation changed."""
        if self.slices.get(key) == info:
            return False
        if info is None:
            del self.slices[key]
        else:
            self.slices[key] = info
        self.dirty = True
        return True

    # ---- sync bookkeeping ----------------------------------------------------------------------
    def touch(self, resource: str) -> None:
        self._heard[resource] = self._clock()

    def mark_synced(self, resource: str) -> None:
        self._synced.add(resource)
        self.touch(resource)

    def require_sync(self, resource: str) -> None:
        self._required.add(resource)

    def is_synced(self, resource: str) -> bool:
        return resource in self._synced

    @property
    def synced(self) -> bool:
        return all(r in self._synced for r in self._required)

    def sync_age(self, resource: str) -> float:
        heard = self._heard.get(resource)
        return float("inf") if heard is None else max(0.0, self._clock() - heard)
