"""What the pool reconciles know of the cluster's nodes, and whether they know all of it yet.

The cache is fed two ways: the kopf node watch (`NodeCache.seen`, one node per event) and a full
list (`NodeCache.replace`): the operator lists the nodes once before its first pool reconcile and
again every ``nodeResyncSeconds``. The list is what makes the cache *whole*:

* Before it, the cache holds whatever nodes the watch happened to deliver, and a reconcile on a
  partial view acts wrongly and visibly: the budget finds no node to price a pod by (its condition
  ``CostBudgetExceeded`` turns True for unknown prices and new replicas are held back), the spot
  step sees no spot node, ``NoMatchingNodes`` says the pool's GPU type is missing. A restarted
  operator must not roll a pool to its fallback model, or hold its replicas back, for that.
  `NodeCache.synced` is set by the first list; the operator's pool workers start only after it
  (`handlers._list_nodes` signals them once `PoolController.list_nodes` returns).
* A watch that restarts lists again and never reports a node deleted while it was down; the
  periodic list drops such nodes (a node that is gone must not price a pod or count as spot).

A node's interruption notice is timed from when it was first seen (`spot.notice_of`): the first
sighting is kept per node and carried through a list that still has the node.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from neuronetes.pricing import EMPTY_TABLE, PriceTable
from neuronetes.spot import NOTICE_KEY, Notice, notice_of

__all__ = ["NodeCache", "node_view"]


def node_view(name: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """What the reconciles read of a node: its labels, taints and our notice annotation."""
    meta = body.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return {
        "metadata": {
            "name": name,
            "labels": dict(meta.get("labels") or {}),
            "annotations": {k: v for k, v in annotations.items() if k == NOTICE_KEY},
        },
        "spec": {"taints": list((body.get("spec") or {}).get("taints") or [])},
    }


class NodeCache:
    """The nodes (by name) and the price table; thread-safe."""

    def __init__(self, *, rebalance_notices: bool = False) -> None:
        self._rebalance = rebalance_notices
        self._nodes: dict[str, Mapping[str, Any]] = {}
        self._first_seen: dict[str, datetime] = {}  # node → when its interruption notice was first seen
        self._prices: PriceTable = EMPTY_TABLE
        self._lock = threading.Lock()
        self.synced = threading.Event()
        """Set once a full list of the nodes is in the cache (`replace`)."""

    def _put(self, name: str, node: dict[str, Any], now: datetime) -> bool:
        """Store one node (the lock held); whether an interruption notice appeared on it."""
        self._nodes[name] = node
        notice = notice_of(node, now=now, rebalance=self._rebalance)
        if notice is None:
            self._first_seen.pop(name, None)
            return False
        if name in self._first_seen:
            return False
        self._first_seen[name] = notice.noticed
        return True

    def seen(self, name: str, body: Mapping[str, Any] | None) -> bool:
        """A watch event: the node as it is now (None: deleted). Whether an interruption notice
        appeared on it (the caller reconciles every pool then)."""
        with self._lock:
            if body is None:
                self._nodes.pop(name, None)
                self._first_seen.pop(name, None)
                return False
            return self._put(name, node_view(name, body), datetime.now(UTC))

    def replace(self, items: Iterable[Mapping[str, Any]]) -> bool:
        """A full list of the nodes: the cache becomes it (nodes not in it are gone) and is
        `synced`. Whether an interruption notice appeared on a node."""
        kept = {}
        for body in items:
            name = (body.get("metadata") or {}).get("name")
            if name:
                kept[str(name)] = node_view(str(name), body)
        now = datetime.now(UTC)
        appeared = False
        with self._lock:
            for name in set(self._nodes) - set(kept):
                self._nodes.pop(name, None)
                self._first_seen.pop(name, None)
            for name, node in kept.items():
                appeared = self._put(name, node, now) or appeared
        self.synced.set()
        return appeared

    def set_prices(self, table: PriceTable) -> None:
        with self._lock:
            self._prices = table

    def snapshot(self) -> tuple[dict[str, Mapping[str, Any]], PriceTable]:
        """One reconcile's view: a copy of the nodes, and the price table."""
        with self._lock:
            return dict(self._nodes), self._prices

    def first_seen(self, name: str) -> datetime | None:
        """When the node's current interruption notice was first seen (None: it has none)."""
        with self._lock:
            return self._first_seen.get(name)

    def notices(
        self, nodes: Mapping[str, Mapping[str, Any]], recorded: Mapping[str, datetime], now: datetime
    ) -> dict[str, Notice]:
        """Every node of `nodes` under an interruption notice, its start from `recorded` (a pool's
        status: a restarted operator keeps the deadline), else from when it was first seen."""
        with self._lock:
            first = dict(self._first_seen)
        out = {}
        for name in first:  # the nodes under notice: not every node, every reconcile
            node = nodes.get(name)
            if node is None:
                continue
            notice = notice_of(
                node, now=now, first_seen=recorded.get(name) or first.get(name), rebalance=self._rebalance
            )
            if notice is not None:
                out[name] = notice
        return out
