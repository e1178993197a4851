"""The NeuroNetes extender behind the real kube-scheduler: filter, prioritize and bind on kwok GPU nodes.

The extender runs in this process (uvicorn in a thread, list+watch against the e2e cluster);
kube-scheduler's ``neuronetes-scheduler`` profile calls it (names only, ``nodeCacheCapable``).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from extender_harness import ExtenderThread
from extender_support import metric_value
from pod_builder import container, manifest

from neuronetes import contracts as c
from neuronetes.devcluster import ExtenderConfig
from neuronetes_extender.bodies import NodeSet
from neuronetes_extender.server import Extender, build
from neuronetes_extender.service import ExtenderService
from neuronetes_extender.wire import ExtenderFilterResult

pytestmark = pytest.mark.e2e

NAMESPACE = "extender-e2e"
SUITE_LABEL = ("neuronetes.io/e2e-suite", "extender")
NODE_COUNTS = {"dgx-a100-80gb": 40, "t4x4-pcie": 40, "a100-40gb-mig": 12, "cpu-only": 8}  # 100 nodes
TOO_MUCH_MEMORY_MIB = 100_000  # fits a DGX's total GPU memory, no single GPU: only the extender can tell


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


def gang_manifest(name: str, group: str, size: int, gpus: int, locality: str = "same-node") -> dict[str, Any]:
    pod = pod_manifest(name, {c.RESOURCE_GPU: gpus})
    pod["metadata"]["labels"] = {c.LABEL_GANG: group, c.LABEL_GANG_SIZE: str(size)}
    pod["metadata"]["annotations"] = {c.ANNOTATION_LOCALITY: locality}
    return pod


def pod_manifest(name: str, limits: dict[str, Any], *, init: dict[str, Any] | None = None) -> dict[str, Any]:
    return manifest(
        name,
        limits,
        init=[container("prep", init)] if init is not None else (),
        namespace=NAMESPACE,
        node_selector=dict([SUITE_LABEL]),
    )


@dataclass
class Decision:
    node: str
    gpus: tuple[int, ...]
    starts: tuple[int | None, ...]


class RecordingService(ExtenderService):
    """The extender's service, remembering the engine's latest decision per pod."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decisions: dict[str, Decision] = {}

    def filter(self, nodes: NodeSet) -> tuple[ExtenderFilterResult, str]:
        result, outcome = super().filter(nodes)
        hold = self.cache.hold_of(nodes.pod.metadata.uid)
        if hold is not None:
            self.decisions[nodes.pod.metadata.name] = Decision(
                hold.node, tuple(g.gpu_index for g in hold.grants), tuple(g.mig_start for g in hold.grants)
            )
        return result, outcome


@pytest.fixture(scope="module")
def extender(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Extender, str]]:
    config = Path(tmp_path_factory.mktemp("extender")) / "extender.yaml"
    # Three nodes per filter answer, so kube-scheduler also calls prioritize (it skips it for one).
    config.write_text("filterTopK: 3\nassumeTTLSeconds: 60\n")
    ext = build(kubeconfig=cluster.extender_kubeconfig, config=config, service_class=RecordingService)
    with ExtenderThread(ext.app) as server:
        wait_until(lambda: ext.cache.synced, timeout=30, what="extender cache synced")
        # Weight 20: one point of our 0-10 score (x 10 x 20) outweighs kube-scheduler's own plugins,
        # so the node the engine chose (10, the others at most 9) is the one kube-scheduler binds.
        cluster.set_extender(ExtenderConfig(url=server.url, weight=20))
        cluster.kubectl("create", "namespace", NAMESPACE)
        try:
            yield ext, server.url
        finally:
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
            cluster.set_extender(ExtenderConfig.from_env())


@pytest.fixture(scope="module")
def nodes(cluster: E2ECluster, extender: tuple[Extender, str]) -> dict[str, list[str]]:
    ext, _ = extender
    out = {
        prof: cluster.add_nodes(prof, count, f"xe-{prof}", labels=dict([SUITE_LABEL]))
        for prof, count in NODE_COUNTS.items()
    }
    everything = {n for names in out.values() for n in names}
    wait_until(
        lambda: all(ext.cache.node_spec(n) is not None for n in everything),
        timeout=30,
        what="nodes in the cache",
    )
    return out


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return str(response.read().decode())


def test_gpu_pods_are_filtered_scored_and_bound_by_the_extender(
    cluster: E2ECluster, extender: tuple[Extender, str], nodes: dict[str, list[str]]
) -> None:
    ext, url = extender
    before = scrape(url)
    pods = [pod_manifest(f"one-{k}", {c.RESOURCE_GPU: 1}) for k in range(10)]
    pods += [pod_manifest(f"two-{k}", {c.RESOURCE_GPU: 2}) for k in range(3)]
    pods += [pod_manifest("eight", {c.RESOURCE_GPU: 8})]
    pods += [
        pod_manifest(f"share-{k}", {c.RESOURCE_GPU_MEMORY: 8192, c.RESOURCE_GPU_COMPUTE: 25})
        for k in range(4)
    ]
    pods += [pod_manifest(f"mig-{k}", {c.mig_resource_name("2g.10gb"): 1}) for k in range(2)]
    pods += [pod_manifest("with-init", {c.RESOURCE_GPU: 1}, init={c.RESOURCE_GPU: 2})]
    names = [p["metadata"]["name"] for p in pods]
    cluster.kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    )

    def all_running() -> list[dict[str, Any]] | None:
        items = get_json(cluster, "pods", "-n", NAMESPACE)["items"]
        mine = [p for p in items if p["metadata"]["name"] in names]
        if len(mine) == len(names) and all(p["status"].get("phase") == "Running" for p in mine):
            return mine
        return None

    running = wait_until(all_running, timeout=120, what=f"{len(names)} GPU pods Running")
    assert isinstance(ext.service, RecordingService)
    decisions = ext.service.decisions
    whole_nodes = set(nodes["dgx-a100-80gb"]) | set(nodes["t4x4-pcie"])
    for pod in running:
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        raw = pod["metadata"].get("annotations", {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        assert raw, f"{name} has no assignment annotation"
        assignment = c.decode_assignment(raw)
        assert assignment.node == node and assignment.pod_uid == pod["metadata"]["uid"]
        gpus = {(g.index, g.mig_start) for x in assignment.containers.values() for g in x.gpus}
        for g in (g for x in assignment.containers.values() for g in x.gpus):
            assert g.uuid == c.simulated_gpu_uuid(node, g.index)
        # The cluster ends where the engine decided: that node, those GPUs.
        decision = decisions[name]
        assert node == decision.node, name
        assert gpus == set(zip(decision.gpus, decision.starts, strict=True)), name
        if name.startswith("mig-"):
            assert node in nodes["a100-40gb-mig"]
        else:
            assert node in whole_nodes
        if name == "with-init":
            assert set(assignment.containers) == {"prep", "main"} and len(gpus) == 2
    # No GPU was given twice.
    used: dict[tuple[str, int, int | None], str] = {}
    for pod in running:
        assignment = c.decode_assignment(pod["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS])
        for x in assignment.containers.values():
            for g in x.gpus:
                if g.compute_percent == 100:
                    key = (assignment.node, g.index, g.mig_start)
                    assert used.setdefault(key, pod["metadata"]["name"]) == pod["metadata"]["name"], key

    after = scrape(url)

    def delta(metric: str, **labels: str) -> float:
        return metric_value(after, metric, **labels) - metric_value(before, metric, **labels)

    n = len(names)
    assert delta("neuronetes_scheduler_latency_seconds_count", verb="filter", result="scheduled") >= n
    assert delta("neuronetes_scheduler_latency_seconds_count", verb="prioritize") >= 1
    assert delta("neuronetes_scheduler_latency_seconds_count", verb="bind", result="ok") == n
    assert delta("neuronetes_scheduler_attempts_total") >= n
    assert delta("neuronetes_scheduler_success_total") == n
    assert metric_value(after, "neuronetes_scheduler_cache_pods") >= n
    ext.cache.check_invariants()


def test_pod_that_fits_nowhere_stays_pending_with_the_extenders_reasons(
    cluster: E2ECluster, extender: tuple[Extender, str], nodes: dict[str, list[str]]
) -> None:
    ext, _ = extender
    pod = pod_manifest("nowhere", {c.RESOURCE_GPU_MEMORY: TOO_MUCH_MEMORY_MIB, c.RESOURCE_GPU_COMPUTE: 50})
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))

    def unschedulable() -> dict[str, Any] | None:
        got = get_json(cluster, "pod", "nowhere", "-n", NAMESPACE)
        for cond in got["status"].get("conditions") or []:
            if (
                cond["type"] == "PodScheduled"
                and cond["status"] == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                return dict(cond)
        return None

    cond = wait_until(unschedulable, timeout=60, what="PodScheduled=False/Unschedulable")
    # kube-scheduler's own fit check rejects nodes whose totals are short; the DGXs pass it and
    # are rejected by the extender with its categorical reason.
    reason = "insufficient gpu memory on any GPU"
    assert f"{len(nodes['dgx-a100-80gb'])} {reason}" in cond["message"], cond["message"]
    time.sleep(2)
    got = get_json(cluster, "pod", "nowhere", "-n", NAMESPACE)
    assert got["status"]["phase"] == "Pending" and not got["spec"].get("nodeName")
    events = get_json(cluster, "events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=nowhere")
    assert any(
        e.get("reason") == "FailedScheduling" and reason in e.get("message", "") for e in events["items"]
    )
    described = cluster.kubectl("describe", "pod", "nowhere", "-n", NAMESPACE).stdout
    assert reason in described
    assert ext.cache.hold_of(got["metadata"]["uid"]) is None
    ext.cache.check_invariants()


def test_gang_of_four_lands_on_one_node_or_not_at_all(
    cluster: E2ECluster, extender: tuple[Extender, str], nodes: dict[str, list[str]]
) -> None:
    ext, url = extender
    before = scrape(url)
    train = [gang_manifest(f"train-{k}", "train", 4, 2) for k in range(4)]
    huge = [gang_manifest(f"huge-{k}", "huge", 4, 8) for k in range(4)]  # 32 GPUs on one node: nowhere
    cluster.kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": train + huge})
    )

    def running(prefix: str, n: int) -> list[dict[str, Any]] | None:
        items = get_json(cluster, "pods", "-n", NAMESPACE)["items"]
        mine = [p for p in items if p["metadata"]["name"].startswith(prefix)]
        ok = len(mine) == n and all(p["status"].get("phase") == "Running" for p in mine)
        return mine if ok else None

    pods = wait_until(lambda: running("train-", 4), timeout=120, what="the 4-member gang Running")
    on = {p["spec"]["nodeName"] for p in pods}
    assert len(on) == 1 and on <= set(nodes["dgx-a100-80gb"]), on
    gpus = set()
    for p in pods:
        doc = c.decode_assignment(p["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS])
        assert doc.gang is not None and (doc.gang.name, doc.gang.size) == ("train", 4)
        gpus |= {g.index for x in doc.containers.values() for g in x.gpus}
    assert len(gpus) == 8  # 4 members × 2 GPUs, none shared
    # The spent reservation's object is gone; the one that fits nowhere never had one.
    wait_until(
        lambda: not get_json(cluster, "gangreservations", "-n", NAMESPACE)["items"],
        timeout=30,
        what="the spent GangReservation deleted",
    )

    def all_unschedulable() -> list[str] | None:
        items = get_json(cluster, "pods", "-n", NAMESPACE)["items"]
        messages = []
        for p in (p for p in items if p["metadata"]["name"].startswith("huge-")):
            assert not p["spec"].get("nodeName"), "a member of the unplaceable gang was bound"
            conds = [x for x in p["status"].get("conditions") or [] if x["type"] == "PodScheduled"]
            if not conds or conds[0].get("reason") != "Unschedulable":
                return None
            messages.append(conds[0]["message"])
        return messages if len(messages) == 4 else None

    messages = wait_until(all_unschedulable, timeout=60, what="the 32-GPU gang Unschedulable")
    assert all("gang huge: no room for all 4 members same-node" in m for m in messages), messages
    after = scrape(url)
    binds = metric_value(after, "neuronetes_scheduler_latency_seconds_count", verb="bind", result="ok")
    assert (
        binds - metric_value(before, "neuronetes_scheduler_latency_seconds_count", verb="bind", result="ok")
        == 4
    )
    ext.cache.check_invariants()
    assert ext.cache.gangs() == []


def test_the_agents_gpunode_objects_reach_the_cache(
    cluster: E2ECluster, extender: tuple[Extender, str], nodes: dict[str, list[str]]
) -> None:
    ext, _ = extender
    node = nodes["t4x4-pcie"][-1]
    gpus = [
        {"uuid": f"GPU-agent-{k}", "index": k, "model": "Tesla T4", "memoryMiB": 15360, "numaNode": k // 2}
        for k in range(4)
    ]
    obj = {"apiVersion": c.API_VERSION, "kind": "GPUNode", "metadata": {"name": node}, "spec": {}}
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(obj))
    status = {
        "apiVersion": c.API_VERSION,
        "kind": "GPUNode",
        "metadata": {"name": node},
        "status": {"gpus": gpus},
    }
    cluster.kubectl("apply", "--server-side", "--subresource=status", "-f", "-", input=json.dumps(status))

    def uuids() -> list[str] | None:
        spec = ext.cache.node_spec(node)
        got = [g.uuid for g in spec.gpus] if spec is not None else []
        return got if got and got[0].startswith("GPU-agent-") else None

    assert wait_until(uuids, timeout=30, what="the GPUNode in the cache") == [
        f"GPU-agent-{k}" for k in range(4)
    ]
    cluster.kubectl("delete", "gpunode", node)
    wait_until(lambda: uuids() is None, timeout=30, what="the label inventory back")
    ext.cache.check_invariants()


def describe(cluster: E2ECluster, pod: str) -> str:
    return str(cluster.kubectl("describe", "pod", "-n", NAMESPACE, pod).stdout)


def test_describe_pod_shows_the_placement_and_the_gang_barrier(
    cluster: E2ECluster, extender: tuple[Extender, str], nodes: dict[str, list[str]]
) -> None:
    ext, _ = extender
    lone = pod_manifest("explained", {c.RESOURCE_GPU: 2})
    # One member of a gang of two: its bind waits at the barrier for the other.
    waiting = gang_manifest("pair-0", "pair", 2, 1)
    cluster.kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [lone, waiting]})
    )

    def placed() -> str | None:
        text = describe(cluster, "explained")
        return text if "GpusAssigned" in text else None

    text = wait_until(placed, timeout=60, what="the GpusAssigned Event on the pod")
    node = get_json(cluster, "pod", "-n", NAMESPACE, "explained")["spec"]["nodeName"]
    assert f"node {node}, gpus " in text and "neuronetes-extender" in text, text

    def barrier() -> str | None:
        text = describe(cluster, "pair-0")
        return text if "GangWaiting" in text else None

    text = wait_until(barrier, timeout=60, what="the GangWaiting Event on the waiting member")
    assert "1 of 2 members at the bind barrier (gang extender-e2e/pair)" in text, text
    # The second member arrives: both are bound.
    cluster.kubectl("create", "-f", "-", input=json.dumps(gang_manifest("pair-1", "pair", 2, 1)))

    def both_bound() -> bool:
        items = get_json(cluster, "pods", "-n", NAMESPACE)["items"]
        pair = [p for p in items if p["metadata"]["name"].startswith("pair-")]
        return len(pair) == 2 and all(p["spec"].get("nodeName") for p in pair)

    wait_until(both_bound, timeout=120, what="both members of the pair bound")
    ext.cache.check_invariants()
