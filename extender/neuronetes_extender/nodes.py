"""The extender's Node objects (`wire.Node`, decoded once from the watch) → `NodeSpec`.

How a node's labels and capacity become its GPUs is the core's (`neuronetes.nodes`, which the
operator's GPUSlice binding reads too); this adapter hands it the fields of the extender's own
decoded objects, so a node is never decoded twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from neuronetes.model import NodeSpec
from neuronetes.nodes import NodeSpecError, node_spec_from_fields
from neuronetes.pricing import EMPTY_TABLE, PriceTable

from .wire import Node

__all__ = ["node_spec_from_node"]


def node_spec_from_node(node: Node | Mapping[str, Any], prices: PriceTable = EMPTY_TABLE) -> NodeSpec:
    """The engine's view of one Node object (a `wire.Node`, or the API's JSON as a mapping); its
    price from its label, else `prices` (`neuronetes.pricing`).

    Raises:
        NodeSpecError: not a Node object, or as `neuronetes.nodes.node_spec_from_fields`.
    """
    if not isinstance(node, Node):
        try:
            node = msgspec.convert(node, Node)
        except msgspec.ValidationError as exc:
            raise NodeSpecError(f"not a Node object: {exc}") from None
    resources: dict[str, Any] = dict(node.status.capacity or {})
    resources.update(node.status.allocatable or {})
    labels = node.metadata.labels or {}
    return node_spec_from_fields(
        node.metadata.name, labels, resources, unschedulable=node.spec.unschedulable, prices=prices
    )
