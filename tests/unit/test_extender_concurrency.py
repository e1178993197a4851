"""200 concurrent filter → bind sequences against one GPU cache never give a GPU more than it holds.

Two independent checks after each run: the core's own invariant (`ClusterState.check_invariants`,
via `GpuCache.check_invariants`: counters equal a recount, nothing negative, no leaked allocation)
and an oracle that knows nothing of the cache: the assignment annotations the fake API server
recorded, summed per GPU UUID against the pods' requests. Once every hold has expired, what the
cache counts per GPU must equal that oracle exactly (nothing leaked, nothing lost).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
from extender_support import (
    FakeApi,
    FakeClock,
    bind_now,
    cpu_pod,
    gpu_pod,
    mig_pod,
    names_request,
    node_objects,
    pod_object,
    shared_pod,
    synced_cache,
)
from pod_builder import container

from neuronetes import contracts as c
from neuronetes import mig
from neuronetes_extender.app import create_app
from neuronetes_extender.bodies import NodeSet
from neuronetes_extender.cache import GpuCache
from neuronetes_extender.kube import KubeError
from neuronetes_extender.service import ExtenderService
from neuronetes_extender.wire import ExtenderBindingArgs, Node

pytestmark = pytest.mark.unit

NODES = node_objects({"dgx-a100-80gb": 2, "t4x4-pcie": 2, "a100-40gb-mig": 1, "cpu-only": 1})
NAMES = [n["metadata"]["name"] for n in NODES]
SPECS = {n["metadata"]["name"]: n for n in NODES}
SEQUENCES = 200


@dataclass(frozen=True)
class Shape:
    kind: str  # whole | shared | mig | cpu
    gpus: int = 0
    memory_mib: int = 0
    compute: int = 0
    profile: str = ""


@dataclass(frozen=True)
class Plan:
    """One pod and what the test's kube-scheduler does with it."""

    pod: dict[str, Any]
    shape: Shape
    other_node: str | None  # bind to this node instead of the one filter chose
    failure: int | None  # HTTP status the API answers the bind with
    delete_after: bool  # delete the pod once bound (frees its GPUs)


def random_plan(rng: random.Random, k: int) -> Plan:
    name = f"p{k}"
    priority = rng.randrange(0, 1000)
    roll = rng.random()
    if roll < 0.45:
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
        shape = Shape("whole", gpus=gpus)
        if rng.random() < 0.3:  # an init container that needs one GPU more than the app
            pod = pod_object(
                name,
                [container("main", {c.RESOURCE_GPU: gpus})],
                init=[container("prep", {c.RESOURCE_GPU: min(gpus + 1, 8)})],
                priority=priority,
            )
            shape = Shape("whole", gpus=min(gpus + 1, 8))
        else:
            pod = gpu_pod(name, gpus, priority=priority)
    elif roll < 0.8:
        shape = Shape(
            "shared",
            gpus=1,
            memory_mib=rng.choice([2048, 4096, 8192, 16384]),
            compute=rng.choice([10, 20, 25, 50]),
        )
        pod = shared_pod(name, shape.memory_mib, shape.compute, priority=priority)
    elif roll < 0.95:
        shape = Shape("mig", gpus=1, profile=rng.choice(["1g.5gb", "2g.10gb", "3g.20gb"]))
        pod = mig_pod(name, shape.profile, priority=priority)
    else:
        shape = Shape("cpu")
        pod = cpu_pod(name, priority=priority)
    other = rng.choice(NAMES) if rng.random() < 0.1 else None
    failure = rng.choice([409, 500, 403]) if rng.random() < 0.1 else None
    return Plan(pod, shape, other, failure, rng.random() < 0.15)


def check_oracle(api: FakeApi, plans: dict[str, Plan], cache: GpuCache) -> int:
    """Sum the recorded assignments per GPU against the pods' requests; compare with the cache."""
    compute: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    whole: dict[str, int] = defaultdict(int)
    layouts: dict[str, mig.MigLayout] = {}
    capacity: dict[str, tuple[str, int, int, bool]] = {}  # uuid -> (node, index, memory, mig)
    for name in NAMES:
        spec = cache.node_spec(name)
        assert spec is not None
        for g in spec.gpus:
            capacity[g.uuid] = (name, g.index, g.memory_mib, g.mig_enabled)
    bound = api.bound()
    for pod in bound:
        plan = plans[pod["metadata"]["name"]]
        node = pod["spec"]["nodeName"]
        raw = (pod["metadata"].get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        if plan.shape.kind == "cpu":
            assert raw is None
            continue
        assert raw is not None, f"{pod['metadata']['name']} bound without an assignment"
        assignment = c.decode_assignment(raw)
        assert assignment.node == node
        gpus = {(g.uuid, g.mig_profile, g.mig_start) for x in assignment.containers.values() for g in x.gpus}
        assert len(gpus) == plan.shape.gpus
        for uuid, profile, start in gpus:
            gpu_node, _, gpu_memory, mig_mode = capacity[uuid]
            assert gpu_node == node, "an assignment names a GPU of another node"
            if plan.shape.kind == "mig":
                assert mig_mode and profile == plan.shape.profile and start is not None
                layout = layouts.get(uuid) or mig.MigLayout(mig.catalog_for("A100-40GB"))
                layouts[uuid] = layout.place(profile, start)  # raises when instances overlap
            elif plan.shape.kind == "whole":
                assert not mig_mode
                whole[uuid] += 1
                compute[uuid] += 100
                memory[uuid] += gpu_memory
            else:
                assert not mig_mode
                compute[uuid] += plan.shape.compute
                memory[uuid] += plan.shape.memory_mib
    for uuid, (_, _, gpu_memory, _) in capacity.items():
        assert whole[uuid] <= 1, f"GPU {uuid} given whole to {whole[uuid]} pods"
        assert compute[uuid] <= 100, f"GPU {uuid} compute oversubscribed: {compute[uuid]}%"
        assert memory[uuid] <= gpu_memory, f"GPU {uuid} memory oversubscribed: {memory[uuid]} MiB"
    # Nothing leaked: with every hold gone, the cache counts exactly the bound pods' GPUs.
    for name in NAMES:
        usage = cache.gpu_usage(name)
        spec = cache.node_spec(name)
        assert usage is not None and spec is not None
        for g, (milli_free, memory_free) in zip(spec.gpus, usage, strict=True):
            if g.mig_enabled:
                continue
            assert milli_free == 1000 - 10 * compute[g.uuid], (name, g.index)
            assert memory_free == g.memory_mib - memory[g.uuid], (name, g.index)
    return len(bound)


def _args(pod: dict[str, Any]) -> NodeSet:
    return names_request(pod, NAMES)


def test_200_concurrent_filter_bind_sequences_in_threads() -> None:
    clock = FakeClock()
    cache = synced_cache(NODES, clock=clock)
    api = FakeApi(cache=cache)  # every binding reaches the cache as a watch event, racing bind_done
    service = ExtenderService(cache, api)
    rng = random.Random(4)
    plans = {p.pod["metadata"]["name"]: p for p in (random_plan(rng, k) for k in range(SEQUENCES))}
    for plan in plans.values():
        api.add(plan.pod)
        if plan.failure is not None:
            api.fail_pods[plan.pod["metadata"]["name"]] = KubeError(plan.failure, "injected")
    outcomes: dict[str, str] = {}

    def sequence(plan: Plan) -> None:
        meta = plan.pod["metadata"]
        result, _ = service.filter(_args(plan.pod))
        assert not result.error
        names = result.node_names or []
        if not names:
            outcomes[meta["name"]] = "unschedulable"
            return
        node = plan.other_node or names[0]
        bind = ExtenderBindingArgs(
            pod_name=meta["name"], pod_namespace=meta["namespace"], pod_uid=meta["uid"], node=node
        )
        out, _ = bind_now(service, bind)
        if out.error and plan.failure == 500:  # kube-scheduler retries the pod after an error
            result, _ = service.filter(_args(plan.pod))
            if result.node_names:
                bind = ExtenderBindingArgs(
                    pod_name=meta["name"],
                    pod_namespace=meta["namespace"],
                    pod_uid=meta["uid"],
                    node=result.node_names[0],
                )
                out, _ = bind_now(service, bind)
        outcomes[meta["name"]] = "error" if out.error else "bound"
        if not out.error and plan.delete_after:
            api.delete(meta["namespace"], meta["name"])

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(sequence, plans.values()))

    cache.check_invariants()  # holds still live: the core's counters and no leaked allocation
    clock.now += 3600  # every hold expires
    cache.check_invariants()
    assert cache.holds() == []
    bound = check_oracle(api, plans, cache)
    counts = {k: list(outcomes.values()).count(k) for k in ("bound", "unschedulable", "error")}
    assert counts["bound"] >= 25 and counts["unschedulable"] >= 20, counts  # contention really happened
    assert bound == counts["bound"] - sum(
        1 for p in plans.values() if p.delete_after and outcomes.get(p.pod["metadata"]["name"]) == "bound"
    )
    stats = cache.stats()
    assert stats.conflicts == 0 and stats.unaccounted_pods == 0


def test_200_concurrent_sequences_through_the_http_app() -> None:
    """The same through the ASGI app on one event loop: filters inline, binds in its thread pool."""
    clock = FakeClock()
    cache = synced_cache(NODES, clock=clock)
    api = FakeApi(cache=cache)
    app = create_app(ExtenderService(cache, api))
    rng = random.Random(11)
    plans = {p.pod["metadata"]["name"]: p for p in (random_plan(rng, k) for k in range(SEQUENCES))}
    for plan in plans.values():
        api.add(plan.pod)
    headers = {"content-type": "application/json"}

    async def sequence(client: httpx.AsyncClient, plan: Plan) -> str:
        meta = plan.pod["metadata"]
        doc = {"Pod": plan.pod, "Nodes": None, "NodeNames": NAMES}
        response = await client.post("/filter", content=json.dumps(doc), headers=headers)
        assert response.status_code == 200
        names = response.json()["NodeNames"]
        if not names:
            return "unschedulable"
        await asyncio.sleep(random.random() / 100)  # let other pods' filters run before this bind
        bind = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": names[0],
        }
        response = await client.post("/bind", content=json.dumps(bind), headers=headers)
        assert response.status_code == 200
        return "error" if response.json()["Error"] else "bound"

    async def run() -> list[str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
            return await asyncio.gather(*(sequence(client, p) for p in plans.values()))

    outcomes = asyncio.run(run())
    assert "error" not in outcomes  # every filter decision was bindable: no GPU was promised twice
    cache.check_invariants()
    clock.now += 3600
    cache.check_invariants()
    assert check_oracle(api, plans, cache) == outcomes.count("bound") >= 40


def test_node_changes_mid_flight_replay_without_oversubscription() -> None:
    """Nodes vanish and come back while pods are placed: the rebuilt state replays bound pods and
    the holds that still fit; nothing is oversubscribed, nothing leaked."""
    clock = FakeClock()
    cache = synced_cache(NODES, clock=clock)
    api = FakeApi(cache=cache)
    service = ExtenderService(cache, api)
    rng = random.Random(7)
    plans = [random_plan(rng, k) for k in range(120)]
    node_objs = [msgspec.convert(n, Node) for n in NODES]

    def churn() -> None:
        for k in range(30):
            cache.replace_nodes(node_objs[: len(node_objs) - 1 - (k % 2)] if k % 3 else node_objs)

    def sequence(plan: Plan) -> None:
        meta = plan.pod["metadata"]
        api.add(plan.pod)
        result, _ = service.filter(_args(plan.pod))
        if result.node_names:
            bind_now(
                service,
                ExtenderBindingArgs(
                    pod_name=meta["name"],
                    pod_namespace=meta["namespace"],
                    pod_uid=meta["uid"],
                    node=result.node_names[0],
                ),
            )

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(churn)] + [pool.submit(sequence, p) for p in plans]
        for f in futures:
            f.result()
    cache.replace_nodes(node_objs)
    cache.check_invariants()
    clock.now += 3600
    cache.check_invariants()
    check_oracle(api, {p.pod["metadata"]["name"]: p for p in plans}, cache)
