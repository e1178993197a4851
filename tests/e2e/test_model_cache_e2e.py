"""Cache-aware placement end to end: the node agent (fleet mode, as the dev cluster runs it) reports
cached models in GPUNode status, the extender's model-cache term places a cacheAware pool's pod on
the node that caches its model, and the operator's preloading makes ``minCachedReplicas`` selected
nodes cache the model.

Simulation (docs/model-cache.md "Simulated nodes"): a kwok node has no host directory. Its cache
holds what the Node's annotation ``neuronetes.io/simulated-cached-models`` names, plus every model a
preload pod completed on it: kwok completes a Job's pods (its ``pod-complete`` stage), and the
simulated agent takes the preload pod's success as the fetch's write. The Jobs, their pods, the
GPUNode reports, the extender's scoring and the operator's bookkeeping are the real ones.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from operator_stack import OperatorStack, operator_stack

from neuronetes import contracts as c
from neuronetes_agent.daemon.fleet import start_fleet_agent
from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.pods import LABEL_POOL

pytestmark = pytest.mark.e2e

NS = "model-cache-e2e"
SUITE = "neuronetes.test/model-cache-e2e"
GROUP = "neuronetes.test/model-cache-group"
MODEL = "org/llama-8b"


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


def reported(cluster: E2ECluster) -> dict[str, set[str]]:
    """Per node with a published GPUNode: the models its agent reports cached."""
    out = {}
    for item in get_json(cluster, "gpunodes")["items"]:
        gpus = (item.get("status") or {}).get("gpus") or []
        if gpus:
            out[item["metadata"]["name"]] = {m for g in gpus for m in g.get("cachedModels") or []}
    return out


def cached_models(cluster: E2ECluster, node: str) -> set[str]:
    return reported(cluster).get(node, set())


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorStack]:
    """Three nodes to score (the last caches the model), three to preload on, one agent for them."""
    work = Path(tmp_path_factory.mktemp("model-cache"))
    settings = {**dev_operator_settings(), "resyncSeconds": 2, "autoscaler": {"enabled": False}}
    with operator_stack(cluster, work, NS, settings=settings, replicas=1) as up:
        scored = up.add_nodes("t4x4-pcie", 3, "mc-score", labels={SUITE: "true", GROUP: "score"})
        cluster.kubectl("annotate", "node", scored[2], f"{c.ANNOTATION_SIMULATED_CACHED_MODELS}={MODEL}")
        up.add_nodes("t4x4-pcie", 3, "mc-preload", labels={SUITE: "true", GROUP: "preload"})
        log = work / "agent.log"
        agent = start_fleet_agent(cluster.kubeconfig, f"{SUITE}=true", log, extra_args=["--interval", "0.5"])
        try:
            expected = {n: {MODEL} if n == scored[2] else set() for n in up.nodes}

            def published() -> bool:
                now = reported(cluster)
                return {n: now.get(n) for n in up.nodes} == expected

            wait_until(published, timeout=60, what="the agent's GPUNodes, one node caching the model")
            up.local.start()
            yield up
        finally:
            agent.terminate()
            try:
                agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
            print(f"\n--- agent log ---\n{log.read_text()[-3000:]}")


def pool(name: str, replicas: int, group: str, cache: dict[str, Any]) -> str:
    spec = {
        "model": MODEL,
        "replicas": replicas,
        "minReplicas": 0,
        "gpuRequirements": {"count": 1},
        "template": {"spec": {"nodeSelector": {GROUP: group}}},
        "scheduling": {"cacheAware": cache},
    }
    return json.dumps(
        {"apiVersion": c.API_VERSION, "kind": "AgentPool", "metadata": {"name": name}, "spec": spec}
    )


def reasons(cluster: E2ECluster, name: str) -> list[tuple[str, str]]:
    found = get_json(cluster, "events", "-n", NS, "--field-selector", f"involvedObject.name={name}")["items"]
    return [(e["reason"], e["message"]) for e in found]


def test_cache_aware_pool_lands_on_the_node_caching_its_model(
    cluster: E2ECluster, stack: OperatorStack
) -> None:
    # Three equal empty nodes; the one caching the model is the last by name and by creation, so
    # neither a name nor an inventory-order tie-break would choose it.
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=pool("scored", 1, "score", {"enabled": True}))

    def placed() -> str | None:
        pods = get_json(cluster, "pods", "-n", NS, "-l", f"{LABEL_POOL}=scored")["items"]
        bound = [p["spec"].get("nodeName") for p in pods if p["spec"].get("nodeName")]
        return bound[0] if bound else None

    node = wait_until(placed, timeout=60, what="the pod bound")
    assert node == "mc-score-2"
    pod = get_json(cluster, "pods", "-n", NS, "-l", f"{LABEL_POOL}=scored")["items"][0]
    assert pod["metadata"]["annotations"][c.ANNOTATION_CACHE_HIT_WEIGHT] == "0.2"
    assert pod["metadata"]["annotations"][c.ANNOTATION_MODEL] == MODEL


def test_preloading_makes_min_cached_replicas_nodes_cache_the_model(
    cluster: E2ECluster, stack: OperatorStack
) -> None:
    preload = {"nodes": {"labelSelector": {"matchLabels": {GROUP: "preload"}}}, "minCachedReplicas": 2}
    cluster.kubectl(
        "apply",
        "-n",
        NS,
        "-f",
        "-",
        input=pool("warm", 0, "preload", {"enabled": True, "preloadStrategy": preload}),
    )
    group = [f"mc-preload-{i}" for i in range(3)]

    def done() -> dict[str, Any] | None:
        cache = (get_json(cluster, "agentpool", "warm", "-n", NS).get("status") or {}).get("cache") or {}
        jobs = get_json(cluster, "jobs", "-n", NS, "-l", f"{c.LABEL_PRELOAD_POOL}=warm")["items"]
        finished = len(cache.get("cachedNodes") or []) == 2 and not cache.get("preloading") and not jobs
        return cache if finished else None

    cache = wait_until(done, timeout=75, what="two preload nodes cached, their Jobs deleted")
    assert cache["model"] == MODEL and cache["wanted"] == 2 and not cache.get("failed")
    warm = sorted(cache["cachedNodes"])
    assert set(warm) < set(group)
    assert [n for n in group if MODEL in cached_models(cluster, n)] == warm  # the third was never preloaded
    said = reasons(cluster, "warm")
    started = [m for r, m in said if r == "PreloadStarted"]
    assert started == [f"preloading {MODEL} on nodes {', '.join(warm)}"]
    assert sorted(m for r, m in said if r == "ModelPreloaded") == [f"node {n} caches {MODEL}" for n in warm]
    policies = {p["name"]: p for p in get_json(cluster, "agentpool", "warm", "-n", NS)["status"]["policies"]}
    assert "preload Jobs keep 2 selected nodes caching it" in policies["cacheAware"]["effect"]
