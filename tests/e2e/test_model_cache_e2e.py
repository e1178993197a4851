"""Cache-aware placement end to end: the node agent (fleet mode, as the dev cluster runs it) reports
cached models in GPUNode status (``<model>`` shared, ``<namespace>:<model>`` a namespace's), the
extender's model-cache term places a cacheAware pool's pod on the node that caches its model for
the pool's namespace (never on another namespace's copy), the operator's preloading makes
``minCachedReplicas`` selected nodes cache the model (counting shared and own-namespace copies
only), and a namespace whose Pod Security level refuses the preload pods' hostPath says so.

Simulation (docs/model-cache.md "Simulated nodes"): a kwok node has no host directory. Its cache
holds what the Node's annotation ``neuronetes.io/simulated-cached-models`` names, plus
``<namespace>:<model>`` for every preload pod completed on it: kwok completes a Job's pods (its
``pod-complete`` stage), and the simulated agent takes the preload pod's success as the fetch's
write into its namespace's folder. The Jobs, their pods, the GPUNode reports, the extender's scoring
and the operator's bookkeeping are the real ones.
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
BASELINE_NS = "model-cache-e2e-baseline"
"""A namespace that enforces Pod Security ``baseline``, which refuses hostPath volumes."""
SUITE = "neuronetes.test/model-cache-e2e"
GROUP = "neuronetes.test/model-cache-group"
MODEL = "org/llama-8b"
OWN = f"{NS}:{MODEL}"
"""The model as a node reports it cached in the pools' namespace."""
INTRUDER = f"intruder:{MODEL}"
"""The model in another namespace's folder: no cache for the pools of NS."""


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


def baseline_namespace(cluster: E2ECluster) -> None:
    cluster.kubectl("create", "namespace", BASELINE_NS)
    cluster.kubectl("label", "namespace", BASELINE_NS, "pod-security.kubernetes.io/enforce=baseline")


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorStack]:
    """Three nodes to score (the first caches the model in another namespace, the last in the
    pools' own), three to preload on (the first caches it in another namespace, the last shared),
    one agent for them."""
    work = Path(tmp_path_factory.mktemp("model-cache"))
    settings = {**dev_operator_settings(), "resyncSeconds": 2, "autoscaler": {"enabled": False}}
    with operator_stack(
        cluster, work, NS, settings=settings, replicas=1, prepare=lambda: baseline_namespace(cluster)
    ) as up:
        scored = up.add_nodes("t4x4-pcie", 3, "mc-score", labels={SUITE: "true", GROUP: "score"})
        preload = up.add_nodes("t4x4-pcie", 3, "mc-preload", labels={SUITE: "true", GROUP: "preload"})
        declared = {scored[0]: INTRUDER, scored[2]: OWN, preload[0]: INTRUDER, preload[2]: MODEL}
        for node, entry in declared.items():
            cluster.kubectl("annotate", "node", node, f"{c.ANNOTATION_SIMULATED_CACHED_MODELS}={entry}")
        log = work / "agent.log"
        agent = start_fleet_agent(cluster.kubeconfig, f"{SUITE}=true", log, extra_args=["--interval", "0.5"])
        try:
            expected = {n: {declared[n]} if n in declared else set() for n in up.nodes}

            def published() -> bool:
                now = reported(cluster)
                return {n: now.get(n) for n in up.nodes} == expected

            wait_until(published, timeout=60, what="the agent's GPUNodes with their declared caches")
            up.local.start()
            yield up
        finally:
            cluster.kubectl("delete", "namespace", BASELINE_NS, "--wait=false", check=False)
            agent.terminate()
            try:
                agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
            print(f"\n--- agent log ---\n{log.read_text()[-3000:]}")


def pool(name: str, replicas: int, group: str, cache: dict[str, Any]) -> str:
    """An AgentPool of MODEL whose pods select the nodes of `group`."""
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


PRELOAD_TWO = {"nodes": {"labelSelector": {"matchLabels": {GROUP: "preload"}}}, "minCachedReplicas": 2}
"""Keep two of the preload group's nodes caching the model."""


def apply_preload_pool(cluster: E2ECluster, namespace: str, name: str) -> None:
    body = pool(name, 0, "preload", {"enabled": True, "preloadStrategy": PRELOAD_TWO})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=body)


def reasons(cluster: E2ECluster, name: str, namespace: str = NS) -> list[tuple[str, str]]:
    found = get_json(cluster, "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")[
        "items"
    ]
    return [(e["reason"], e["message"]) for e in found]


def test_cache_aware_pool_lands_on_the_node_caching_its_model(
    cluster: E2ECluster, stack: OperatorStack
) -> None:
    # Three equal empty nodes; the one caching the model for NS is the last by name and by creation,
    # so neither a name nor an inventory-order tie-break would choose it; the first caches it for
    # another namespace, which must count for nothing here (else the tie-break would take it).
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
    """mc-preload-2 caches the model shared (it counts), mc-preload-0 in another namespace (it does
    not): one preload Job, on mc-preload-0, makes the two wanted; it writes NS's folder only."""
    apply_preload_pool(cluster, NS, "warm")

    def done() -> dict[str, Any] | None:
        cache = (get_json(cluster, "agentpool", "warm", "-n", NS).get("status") or {}).get("cache") or {}
        jobs = get_json(cluster, "jobs", "-n", NS, "-l", f"{c.LABEL_PRELOAD_POOL}=warm")["items"]
        finished = len(cache.get("cachedNodes") or []) == 2 and not cache.get("preloading") and not jobs
        return cache if finished else None

    cache = wait_until(done, timeout=75, what="two preload nodes cached, their Jobs deleted")
    assert cache["model"] == MODEL and cache["wanted"] == 2 and not cache.get("failed")
    assert sorted(cache["cachedNodes"]) == ["mc-preload-0", "mc-preload-2"]
    now = reported(cluster)
    assert (now["mc-preload-0"], now["mc-preload-1"], now["mc-preload-2"]) == (
        {INTRUDER, OWN},
        set(),
        {MODEL},
    )
    said = reasons(cluster, "warm")
    assert [m for r, m in said if r == "PreloadStarted"] == [f"preloading {MODEL} on nodes mc-preload-0"]
    assert [m for r, m in said if r == "ModelPreloaded"] == [f"node mc-preload-0 caches {MODEL}"]
    policies = {p["name"]: p for p in get_json(cluster, "agentpool", "warm", "-n", NS)["status"]["policies"]}
    assert "preload Jobs keep 2 selected nodes caching it" in policies["cacheAware"]["effect"]


def test_a_namespace_refusing_hostpath_volumes_shows_the_refused_preload(
    cluster: E2ECluster, stack: OperatorStack
) -> None:
    """Pod Security baseline refuses the preload pod's hostPath volume: the Job is created but no
    pod of it ever is; the pool's status and a PreloadFailed Event say why."""
    apply_preload_pool(cluster, BASELINE_NS, "fenced")

    def refused() -> dict[str, Any] | None:
        found = get_json(cluster, "agentpool", "fenced", "-n", BASELINE_NS)
        cache = (found.get("status") or {}).get("cache") or {}
        return cache if cache.get("failed") else None

    cache = wait_until(refused, timeout=90, what="the refused preload counted as failed")
    # Only the shared copy counts for this namespace; NS's and the intruder's count for nothing.
    assert cache["cachedNodes"] == ["mc-preload-2"] and cache["failed"] == ["mc-preload-0"]
    assert f"refused in namespace {BASELINE_NS}" in cache["message"]
    assert get_json(cluster, "pods", "-n", BASELINE_NS)["items"] == []
    jobs = get_json(cluster, "jobs", "-n", BASELINE_NS, "-l", f"{c.LABEL_PRELOAD_POOL}=fenced")["items"]
    (job,) = [j for j in jobs if j["spec"]["template"]["spec"]["nodeName"] == "mc-preload-0"]
    said = reasons(cluster, job["metadata"]["name"], BASELINE_NS)
    assert any(r == "FailedCreate" and "hostPath" in m for r, m in said), said  # the Job says which policy
    failed = [m for r, m in reasons(cluster, "fenced", BASELINE_NS) if r == "PreloadFailed"]
    assert failed and "was created in" in failed[0] and "hostPath" in failed[0]
