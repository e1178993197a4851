"""The node agent in fleet mode against the real local control plane, with the extender scheduling.

One agent process (`start_fleet_agent`, as the dev cluster runs it) serves this module's kwok nodes:
it publishes GPUNode, labels and capacity; a critical XID takes a GPU out, evicts its pod, the
Deployment's replacement lands on another GPU, and the GPU comes back after its reset; a real
Prometheus server scrapes the agent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, stop_process, wait_until
from e2e_prometheus import PrometheusServer, free_port, needs_prometheus
from extender_harness import ExtenderThread

from neuronetes import contracts as c
from neuronetes.cli import main as cli
from neuronetes.devcluster import ExtenderConfig
from neuronetes.profiles import KWOK_TAINT, PROFILES
from neuronetes_agent.daemon.fleet import start_fleet_agent
from neuronetes_extender.server import build

pytestmark = pytest.mark.e2e

NAMESPACE = "agent-e2e"
SUITE = ("neuronetes.io/e2e-suite", "agent")
RESET_SECONDS = 8.0


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


@pytest.fixture(scope="module")
def fleet(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Nodes of three profiles, the extender, and one fleet agent serving the nodes."""
    config = Path(tmp_path_factory.mktemp("extender")) / "extender.yaml"
    config.write_text("filterTopK: 3\nassumeTTLSeconds: 60\n")
    ext = build(kubeconfig=cluster.extender_kubeconfig, config=config)
    nodes = {
        "dgx-a100-80gb": cluster.add_nodes("dgx-a100-80gb", 2, "ag-dgx", labels=dict([SUITE])),
        "a100-40gb-mig": cluster.add_nodes("a100-40gb-mig", 1, "ag-mig", labels=dict([SUITE])),
    }
    port = free_port()
    log = Path(tmp_path_factory.mktemp("agent")) / "agent.log"
    agent = start_fleet_agent(
        cluster.kubeconfig,
        f"{SUITE[0]}={SUITE[1]}",
        log,
        metrics_port=port,
        extra_args=["--interval", "0.5", "--simulated-reset-seconds", str(RESET_SECONDS)],
    )
    try:
        with ExtenderThread(ext.app) as server:
            wait_until(lambda: ext.cache.synced, timeout=30, what="extender cache synced")
            cluster.set_extender(ExtenderConfig(url=server.url, weight=20))
            cluster.kubectl("create", "namespace", NAMESPACE)
            everything = [n for names in nodes.values() for n in names]

            def published() -> bool:
                items = get_json(cluster, "gpunodes")["items"]
                done = {i["metadata"]["name"] for i in items if (i.get("status") or {}).get("gpus")}
                return set(everything) <= done

            wait_until(published, timeout=60, what="GPUNodes published by the agent")
            yield {"nodes": nodes, "port": port, "log": log, "extender": ext}
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
            cluster.set_extender(ExtenderConfig.from_env())
    finally:
        stop_process(agent)
        # The session's other tests share this cluster: take this suite's nodes (and the GPUNodes the
        # agent published for them) away again, so no later test finds its pods placed on them.
        everything = [n for names in nodes.values() for n in names]
        cluster.kubectl("delete", "node", *everything, "--wait=false", check=False)
        cluster.kubectl("delete", "gpunode", *everything, "--wait=false", check=False)
        print(f"\nagent log: {log}\n" + log.read_text()[-3000:])
    assert agent.returncode == 0, f"agent exited {agent.returncode} on SIGTERM"


def gpunode(cluster: E2ECluster, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "gpunode", name))


def capacity(cluster: E2ECluster, node: str) -> dict[str, str]:
    return dict(get_json(cluster, "node", node)["status"]["capacity"])


def test_dgx_and_mig_inventory_published(cluster: E2ECluster, fleet: dict[str, Any]) -> None:
    dgx = fleet["nodes"]["dgx-a100-80gb"][0]
    status = gpunode(cluster, dgx)["status"]
    gpus = status["gpus"]
    assert status["gpuCount"] == 8 and status["healthyGPUs"] == 8 and len(gpus) == 8
    assert [g["uuid"] for g in gpus] == [c.simulated_gpu_uuid(dgx, k) for k in range(8)]
    assert all(g["nvlinkPeers"] == [k for k in range(8) if k != g["index"]] for g in gpus)
    assert {g["numaNode"] for g in gpus} == {0, 1} and all(g["nvlinkBandwidthGBps"] == 600 for g in gpus)
    assert {x["type"]: x["status"] for x in status["conditions"]} == {
        "NVMLAvailable": "True",
        "Ready": "True",
    }
    labels = get_json(cluster, "node", dgx)["metadata"]["labels"]
    assert labels[c.LABEL_GPU_TYPE] == "A100" and labels[c.LABEL_GPU_COUNT] == "8"
    assert labels[c.LABEL_GPU_TOPOLOGY] == "nvlink" and labels[c.LABEL_GPU_MEMORY] == "80Gi"
    assert capacity(cluster, dgx)[c.RESOURCE_GPU] == "8"

    mig = fleet["nodes"]["a100-40gb-mig"][0]
    mstatus = gpunode(cluster, mig)["status"]
    instances = [i for g in mstatus["gpus"] for i in g["migInstances"]]
    assert len(instances) == 32 and all(i["uuid"].startswith("MIG-") for i in instances)
    assert all(g["migMode"] == "Enabled" for g in mstatus["gpus"])
    assert (
        get_json(cluster, "node", mig)["metadata"]["labels"][c.LABEL_MIG_CONFIG]
        == "3g.20gb-8_2g.10gb-8_1g.5gb-16"
    )
    cap = capacity(cluster, mig)
    assert cap[c.mig_resource_name("1g.5gb")] == "16" and cap[c.RESOURCE_GPU] == "0"
    # The extender reads the GPUNodes: its view of the node has the agent's GPUs.
    spec = fleet["extender"].cache.node_spec(dgx)
    assert spec is not None and [g.uuid for g in spec.gpus] == [g["uuid"] for g in gpus]


def deployment(name: str, node: str, limits: dict[str, str]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "schedulerName": c.SCHEDULER_NAME,
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [dict(KWOK_TAINT, operator="Equal")],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/worker:1",
                            "resources": {"limits": limits},
                        }
                    ],
                },
            },
        },
    }


def running_pod(cluster: E2ECluster, app: str, exclude: str = "") -> dict[str, Any] | None:
    for pod in get_json(cluster, "pods", "-n", NAMESPACE, "-l", f"app={app}")["items"]:
        meta = pod["metadata"]
        if (
            meta["name"] != exclude
            and not meta.get("deletionTimestamp")
            and pod["status"].get("phase") == "Running"
        ):
            return dict(pod)
    return None


def assigned_gpu(pod: dict[str, Any]) -> str:
    assignment = c.decode_assignment(pod["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS])
    return assignment.containers["main"].gpus[0].uuid


def gpu_health(cluster: E2ECluster, node: str, uuid: str) -> str:
    return str(next(g["health"] for g in gpunode(cluster, node)["status"]["gpus"] if g["uuid"] == uuid))


def node_events(cluster: E2ECluster, node: str) -> list[str]:
    items = get_json(cluster, "events", "-n", "default", "--field-selector", f"involvedObject.name={node}")[
        "items"
    ]
    return [f"{e['reason']}: {e['message']}" for e in items]


def test_critical_xid_evicts_and_the_pod_runs_on_another_gpu(
    cluster: E2ECluster, fleet: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    node = fleet["nodes"]["dgx-a100-80gb"][1]
    cluster.kubectl("apply", "-f", "-", input=json.dumps(deployment("trainer", node, {c.RESOURCE_GPU: "1"})))
    first = wait_until(lambda: running_pod(cluster, "trainer"), timeout=60, what="trainer Running")
    gpu = assigned_gpu(first)
    wait_until(lambda: gpu_health(cluster, node, gpu) == "InUse", timeout=15, what="GPU InUse")

    # An application XID changes nothing.
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig)]
    assert cli(["dev", "inject-xid", "--gpu-id", gpu, "--xid", "13", *kubeconfig]) == 0
    wait_until(lambda: any("XID 13" in e for e in node_events(cluster, node)), timeout=15, what="XID 13 seen")
    assert gpu_health(cluster, node, gpu) == "InUse" and capacity(cluster, node)[c.RESOURCE_GPU] == "8"
    still = running_pod(cluster, "trainer")
    assert still is not None and still["metadata"]["name"] == first["metadata"]["name"]

    # A double-bit ECC error: OFFLINE, capacity down, pod evicted and replaced on another GPU.
    started = time.monotonic()
    assert cli(["dev", "inject-xid", "--gpu-id", gpu, "--xid", "48", *kubeconfig]) == 0
    second = wait_until(
        lambda: running_pod(cluster, "trainer", exclude=first["metadata"]["name"]),
        timeout=60,
        what="replacement pod Running",
    )
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(f"\ncritical XID 48 -> replacement pod Running on another GPU: {elapsed:.1f} s")
    assert assigned_gpu(second) != gpu
    # The GPU stays out for the simulated reset (RESET_SECONDS), its capacity with it.
    assert gpu_health(cluster, node, gpu) in ("Offline", "Resetting")
    assert capacity(cluster, node)[c.RESOURCE_GPU] == "7"
    events = node_events(cluster, node)
    assert any(e.startswith("GPUOffline") and gpu in e and "XID 48" in e for e in events), events
    assert any(e.startswith("GPUPodEvicted") and "trainer" in e for e in events), events
    assert elapsed <= 30, f"{elapsed:.1f} s from injection to the replacement Running"

    # After the reset the GPU is back, with its capacity.
    wait_until(
        lambda: gpu_health(cluster, node, gpu) == "Available", timeout=RESET_SECONDS + 30, what="GPU back"
    )
    wait_until(lambda: capacity(cluster, node)[c.RESOURCE_GPU] == "8", timeout=15, what="capacity back")
    assert any(e.startswith("GPUResetting") and gpu in e for e in node_events(cluster, node))


def test_drain_offline_online_verbs(cluster: E2ECluster, fleet: dict[str, Any]) -> None:
    node = fleet["nodes"]["dgx-a100-80gb"][0]
    gpu = c.simulated_gpu_uuid(node, 5)
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig)]
    assert cli(["drain", "--gpu-id", gpu, *kubeconfig]) == 0
    assert gpu in gpunode(cluster, node)["spec"]["cordonedGPUs"]
    wait_until(lambda: capacity(cluster, node)[c.RESOURCE_GPU] == "7", timeout=15, what="drained capacity")
    assert cli(["offline", "--gpu-id", gpu, *kubeconfig]) == 0
    wait_until(lambda: gpu_health(cluster, node, gpu) == "Offline", timeout=15, what="GPU offline")
    assert cli(["online", "--gpu-id", gpu, *kubeconfig]) == 0
    wait_until(lambda: gpu_health(cluster, node, gpu) == "Available", timeout=15, what="GPU online")
    wait_until(lambda: capacity(cluster, node)[c.RESOURCE_GPU] == "8", timeout=15, what="capacity back")
    assert not gpunode(cluster, node)["spec"].get("cordonedGPUs")
    assert cli(["online", "--gpu-id", "GPU-00000000-0000-0000-0000-000000000000", *kubeconfig]) == 1


def test_a_deleted_gpunode_comes_back(cluster: E2ECluster, fleet: dict[str, Any]) -> None:
    node = fleet["nodes"]["a100-40gb-mig"][0]
    uid = gpunode(cluster, node)["metadata"]["uid"]
    cluster.kubectl("delete", "gpunode", node)

    def republished() -> bool:
        found = get_json(cluster, "gpunodes")["items"]
        mine = [i for i in found if i["metadata"]["name"] == node]
        return (
            bool(mine)
            and mine[0]["metadata"]["uid"] != uid
            and len(mine[0].get("status", {}).get("gpus", [])) == 8
        )

    wait_until(republished, timeout=30, what="GPUNode recreated with its status")


@needs_prometheus
def test_prometheus_scrapes_one_utilization_series_per_gpu(
    cluster: E2ECluster, fleet: dict[str, Any], tmp_path: Path
) -> None:
    with PrometheusServer(tmp_path, {"agent": [f"127.0.0.1:{fleet['port']}"]}) as prom:
        dgx = fleet["nodes"]["dgx-a100-80gb"]
        query = f'neuronetes_gpu_utilization_percent{{Hostname=~"{"|".join(dgx)}"}}'

        def series() -> list[dict[str, Any]] | None:
            try:
                result = prom.query(query)
            except OSError:
                return None
            return result if len(result) == 8 * len(dgx) else None

        result = wait_until(series, timeout=60, what="utilization series in Prometheus")
        assert {(s["metric"]["Hostname"], s["metric"]["UUID"]) for s in result} == {
            (n, c.simulated_gpu_uuid(n, k)) for n in dgx for k in range(8)
        }
        assert all(s["metric"]["model_name"] == PROFILES["dgx-a100-80gb"].gpu_model for s in result)
