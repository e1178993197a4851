"""The operator's work per reconcile is bounded: pods are created and deleted in batches.

`PoolController.reconcile` against an in-memory API (pods, the pool's status, events): a pool of
more pods than ``batchSize`` converges over several reconciles, each creating (or deleting) at most
one batch and building no more pod manifests than it creates, its status growing reconcile by
reconcile with ``Progressing`` saying ``Batching``; a gang is never split; the work queue runs a
pool again while its reconcile says more is left.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from operator_fakes import FakeCluster, controller

from neuronetes import contracts as c
from neuronetes_operator import controller as controller_module
from neuronetes_operator import handlers, pods
from neuronetes_operator.reconcile import Action, batch

pytestmark = pytest.mark.unit


def pool(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": "big", "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": spec,
    }


def test_a_pool_larger_than_a_batch_converges_over_several_reconciles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeCluster(pool({"replicas": 150, "minReplicas": 1}))
    ctl = controller(fake, batch_size=64)
    monkeypatch.setattr(controller_module, "LIST_PAGE", 40)  # the pods are listed in pages
    built = 0
    original = pods.PoolTemplate.pod

    def counting(self: Any, name: str, gang: int | None, **variant: Any) -> dict[str, Any]:
        nonlocal built
        built += 1
        return original(self, name, gang, **variant)

    monkeypatch.setattr(pods.PoolTemplate, "pod", counting)
    rounds, messages = [], []
    more = True
    while more:
        before, built = len(fake.created), 0
        more = ctl.reconcile("ns", "big")
        st = fake.pool["status"]
        progressing = next(cd for cd in st["conditions"] if cd["type"] == "Progressing")
        rounds.append((len(fake.created) - before, built, st["replicas"], progressing["reason"], more))
        messages.append(progressing["message"])
        assert len(rounds) < 10, rounds
    assert rounds == [
        (64, 64, 64, "Batching", True),
        (64, 64, 128, "Batching", True),
        (22, 22, 150, "WaitingForPlacement", False),  # all there, none bound
    ]
    assert sorted(fake.pods) == sorted(f"big-{i}" for i in range(150))
    # Each reconcile lists before and after its batch, 40 pods a page: 0 + 64, 64 + 128, 128 + 150.
    assert fake.pages == (1 + 2) + (2 + 4) + (4 + 4)
    assert (
        messages[0]
        == "64 pods, 0 bound, 150 desired; 86 more pod changes wait for the next reconciles (batches)"
    )
    created = [m for r, m in fake.events if r == "Created"]
    assert (
        len(created) == 3
        and created[0].startswith("created pods big-0, big-1")
        and "and 54 more" in created[0]
    )
    # Scaled down: the deletions are batched too.
    fake.pool["spec"]["replicas"] = 10
    deleted: list[int] = []
    while True:
        more = ctl.reconcile("ns", "big")
        deleted.append(len(fake.deleted) - sum(deleted))
        if not more:
            break
    assert deleted == [64, 64, 12] and sorted(fake.pods) == sorted(f"big-{i}" for i in range(10))


def test_a_gang_is_never_split_even_when_larger_than_a_batch() -> None:
    gang = {"gangScheduling": {"enabled": True, "minMembers": 48}}
    fake = FakeCluster(pool({"replicas": 144, "minReplicas": 48, "scheduling": gang}))
    ctl = controller(fake, batch_size=64)
    per_round = []
    while True:
        before = len(fake.created)
        more = ctl.reconcile("ns", "big")
        per_round.append(len(fake.created) - before)
        if not more:
            break
    assert per_round == [48, 48, 48]  # two gangs (96) would pass the batch: one per reconcile
    whole = {"gangScheduling": {"enabled": True}}  # the gang is minReplicas (100) pods
    fake = FakeCluster(pool({"replicas": 100, "minReplicas": 100, "scheduling": whole}))
    assert not controller(fake, batch_size=64).reconcile("ns", "big") and len(fake.created) == 100


def test_batch_keeps_order_and_whole_units() -> None:
    acts = [Action("delete", "a", "ScaledDown", unit="pod:a")]
    acts += [
        Action("create", f"g-{g}-{m}", "Created", unit=f"gang:g-{g}") for g in range(3) for m in range(3)
    ]
    now, later = batch(acts, 5)
    assert [a.name for a in now] == ["a", "g-0-0", "g-0-1", "g-0-2"]
    assert [a.name for a in later] == [f"g-{g}-{m}" for g in (1, 2) for m in range(3)]
    now, later = batch(acts[1:], 2)
    assert len(now) == 3 and len(later) == 6  # a unit larger than the batch goes alone
    assert batch([], 4) == ([], [])


def test_the_work_queue_runs_a_pool_again_while_its_reconcile_says_more_is_left() -> None:
    calls: list[tuple[str, str]] = []

    def reconcile(namespace: str, name: str) -> bool:
        calls.append((namespace, name))
        return len(calls) < 3

    async def run() -> None:
        queue = handlers.WorkQueue()
        queue.add(("ns", "big"))
        worker = asyncio.create_task(handlers._worker(queue, reconcile))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(calls) >= 3:
                break
        await asyncio.sleep(0.05)
        worker.cancel()

    asyncio.run(run())
    assert calls == [("ns", "big")] * 3


def test_a_pool_of_a_gpu_type_no_node_has_says_so_and_records_an_event() -> None:
    """Never a silent Pending: the condition NoMatchingNodes and a Warning Event, once; the API
    server is asked when the node cache knows no such node (it may not be filled yet)."""
    fake = FakeCluster(pool({"minReplicas": 1, "gpuRequirements": {"type": "T4"}}))
    ctl = controller(fake, batch_size=64)
    for _ in range(2):
        ctl.reconcile("ns", "big")
    cond = next(cd for cd in fake.pool["status"]["conditions"] if cd["type"] == "NoMatchingNodes")
    assert (cond["status"], cond["reason"]) == ("True", "NoMatchingNodes")
    assert "no node has GPUs of type T4" in cond["message"]
    assert [m for r, m in fake.events if r == "NoMatchingNodes"] == [cond["message"]]  # once
    assert fake.node_lists == 2

    t4 = {"metadata": {"name": "n1", "labels": {c.LABEL_GPU_TYPE: "T4"}}}
    fake.nodes.append(t4)  # the API server has it before the watch delivers it
    ctl.reconcile("ns", "big")
    cond = next(cd for cd in fake.pool["status"]["conditions"] if cd["type"] == "NoMatchingNodes")
    assert (cond["status"], cond["reason"]) == ("False", "NodesMatch")
    ctl.node_seen("n1", t4)
    ctl.reconcile("ns", "big")
    assert fake.node_lists == 3  # the cache answers now
    assert len([r for r, _ in fake.events if r == "NoMatchingNodes"]) == 1


def test_a_pool_without_a_gpu_type_has_no_node_condition() -> None:
    fake = FakeCluster(pool({"minReplicas": 1}))
    controller(fake, batch_size=64).reconcile("ns", "big")
    assert "NoMatchingNodes" not in {cd["type"] for cd in fake.pool["status"]["conditions"]}
    assert fake.node_lists == 0
