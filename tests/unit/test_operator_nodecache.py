"""The operator's node cache is whole before any pool is reconciled, and stays so.

`NodeCache.replace` (a full list) drops nodes the watch never reported deleted and keeps the first
sighting of a notice still there; `PoolController.list_nodes` reads every page, keeping of each
node only what a reconcile reads; the pool workers wait for the first list, and a failed list is
retried (a reconcile on a partial view priced pods by no node: ``CostBudgetExceeded`` for unknown
prices, which rolled a pool with a cost-triggered fallback model to it and back after a restart).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from operator_fakes import FakeCluster, controller

from neuronetes.spot import NOTICE_KEY
from neuronetes_operator import controller as controller_module
from neuronetes_operator import handlers
from neuronetes_operator.nodecache import NodeCache

pytestmark = pytest.mark.unit


def node(name: str, *, notice: bool = False, **labels: str) -> dict[str, Any]:
    taints = [{"key": NOTICE_KEY, "effect": "NoSchedule"}] if notice else []
    meta = {"name": name, "labels": labels, "annotations": {"other": "x"}, "resourceVersion": "7"}
    return {"metadata": meta, "spec": {"taints": taints, "podCIDR": "10.0.0.0/24"}, "status": {"big": "x"}}


def test_a_full_list_replaces_the_cache_and_marks_it_synced() -> None:
    cache = NodeCache()
    assert not cache.synced.is_set()
    cache.seen("gone", node("gone"))  # deleted while the watch was down: never reported
    assert cache.seen("noticed", node("noticed", notice=True))  # a new notice
    first = cache.first_seen("noticed")
    assert first is not None
    appeared = cache.replace([node("noticed", notice=True), node("new", zone="a")])
    assert not appeared  # the notice was seen before: its first sighting is kept
    assert cache.synced.is_set() and cache.first_seen("noticed") == first
    nodes, _ = cache.snapshot()
    assert sorted(nodes) == ["new", "noticed"]
    assert nodes["new"] == {
        "metadata": {"name": "new", "labels": {"zone": "a"}, "annotations": {}},
        "spec": {"taints": []},
    }
    # A notice that appears in a list is reported like the watch's; one that cleared is forgotten.
    assert cache.replace([node("noticed"), node("new", notice=True)])
    assert cache.first_seen("noticed") is None and cache.first_seen("new") is not None
    now = datetime.now(UTC)
    nodes, _ = cache.snapshot()
    assert sorted(cache.notices(nodes, {}, now)) == ["new"]
    cache.seen("new", None)
    assert cache.first_seen("new") is None and "new" not in cache.snapshot()[0]


def test_list_nodes_reads_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCluster({"metadata": {"name": "p", "namespace": "ns"}})
    fake.nodes = [node(f"n{i}", zone=str(i)) for i in range(5)]
    ctl = controller(fake, batch_size=64)
    monkeypatch.setattr(controller_module, "LIST_PAGE", 2)
    ctl.node_seen("stale", node("stale"))
    assert not ctl.list_nodes()
    assert fake.node_lists == 3  # 2 + 2 + 1
    nodes, _ = ctl.node_cache.snapshot()
    assert sorted(nodes) == [f"n{i}" for i in range(5)]
    assert nodes["n3"]["metadata"]["labels"] == {"zone": "3"} and "status" not in nodes["n3"]
    assert ctl.node_cache.synced.is_set()


def test_pool_workers_wait_for_the_first_node_list_and_a_failed_list_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handlers, "NODE_LIST_RETRY_S", (0.01, 0.02))
    reconciled: list[tuple[str, str]] = []
    lists: list[str] = []

    class Lister:
        def list_nodes(self) -> bool:
            lists.append("try")
            if len(lists) < 3:
                raise OSError("API server unreachable")
            assert not reconciled  # no pool was reconciled before the first whole list
            return False

    async def run() -> None:
        queue = handlers.WorkQueue()
        queue.add(("ns", "pool"))
        listed = asyncio.Event()
        worker = asyncio.create_task(
            handlers._worker(queue, lambda *key: reconciled.append(key), None, listed)
        )
        await asyncio.sleep(0.05)
        assert not reconciled  # waiting for the nodes
        lister = asyncio.create_task(handlers._list_nodes(Lister(), queue, 60.0, listed))  # type: ignore[arg-type]
        for _ in range(200):
            await asyncio.sleep(0.01)
            if reconciled:
                break
        worker.cancel()
        lister.cancel()

    asyncio.run(run())
    assert lists == ["try"] * 3 and reconciled == [("ns", "pool")]
