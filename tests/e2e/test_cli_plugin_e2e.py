"""The kubectl plugin against the real local control plane: `kubectl neuronetes VERB` (kubectl finds
`kubectl-neuronetes` on PATH) for top, explain, status --all, health --gpu-id, drain/offline/online,
and `neuronetes simulate --from-cluster`.

The module's own kwok nodes (T4 ×4 each) are served by one fleet agent (GPUNodes), and the real
extender (in this process, its Events posted to the API) sits behind kube-scheduler. Pods: one
whole GPU, one slice, and a slice too large for any T4 (Pending: the extender rejects both nodes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_cluster import E2ECluster, wait_until
from extender_harness import ExtenderThread, free_port, terminate
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes.devcluster import ExtenderConfig
from neuronetes_agent.daemon.fleet import start_fleet_agent
from neuronetes_extender.server import build

pytestmark = pytest.mark.e2e

NAMESPACE = "cli-e2e"
SUITE = ("neuronetes.io/e2e-suite", "cli")
BIN = Path(sys.executable).parent  # the venv's console scripts: neuronetes, kubectl-neuronetes


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


def plugin(
    cluster: E2ECluster, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`kubectl neuronetes ARGS`: kubectl's own plugin dispatch, the kubeconfig from $KUBECONFIG
    (`env`: the environment instead, PATH still finding the plugin)."""
    if env is None:
        env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    env = dict(env, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    kubectl = str(cluster.dev.tools.kubectl)
    return subprocess.run(
        [kubectl, "neuronetes", *args], capture_output=True, text=True, env=env, timeout=120, cwd="/"
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def fleet(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if shutil.which("kubectl-neuronetes", path=str(BIN)) is None:
        pytest.fail("kubectl-neuronetes is not installed beside this Python (pip install -e .)")
    config = Path(tmp_path_factory.mktemp("extender")) / "extender.yaml"
    config.write_text("assumeTTLSeconds: 60\n")
    ext = build(kubeconfig=cluster.extender_kubeconfig, config=config)
    nodes = cluster.add_nodes("t4x4-pcie", 2, "cli-t4", labels=dict([SUITE]))
    log = Path(tmp_path_factory.mktemp("agent")) / "agent.log"
    agent = start_fleet_agent(
        cluster.kubeconfig,
        f"{SUITE[0]}={SUITE[1]}",
        log,
        metrics_port=free_port(),
        extra_args=["--interval", "0.5"],
    )
    try:
        with ExtenderThread(ext.app) as server:
            wait_until(lambda: ext.cache.synced, timeout=30, what="extender cache synced")
            cluster.set_extender(ExtenderConfig(url=server.url, weight=20))
            cluster.kubectl("create", "namespace", NAMESPACE)

            def published() -> bool:
                items = get_json(cluster, "gpunodes")["items"]
                return set(nodes) <= {
                    i["metadata"]["name"] for i in items if (i.get("status") or {}).get("gpus")
                }

            wait_until(published, timeout=60, what="GPUNodes published by the agent")
            pin = {SUITE[0]: SUITE[1]}
            pods = [
                manifest("whole", {c.RESOURCE_GPU: 1}, namespace=NAMESPACE, node_selector=pin),
                manifest(
                    "slice",
                    {c.RESOURCE_GPU_MEMORY: 4096, c.RESOURCE_GPU_COMPUTE: 30},
                    namespace=NAMESPACE,
                    node_selector=pin,
                ),
                # Fits the nodes' gpu-memory total (kube-scheduler passes them) but no single T4.
                manifest(
                    "toolarge",
                    {c.RESOURCE_GPU_MEMORY: 30000, c.RESOURCE_GPU_COMPUTE: 50},
                    namespace=NAMESPACE,
                    node_selector=pin,
                ),
            ]
            # The slice first, bound before the others come: the two nodes then differ when
            # "whole" is placed, so its explanation has terms that set its node apart from the
            # runner-up (two equal nodes would be a tie on every term, and list none).
            for batch, placed in (([pods[1]], "slice"), ([pods[0], pods[2]], "whole")):
                items = json.dumps({"apiVersion": "v1", "kind": "List", "items": batch})
                cluster.kubectl("create", "-f", "-", input=items)

                def bound_node(name: str = placed) -> str | None:
                    node: str | None = get_json(cluster, "pod", name, "-n", NAMESPACE)["spec"].get("nodeName")
                    return node

                wait_until(bound_node, timeout=60, what=f"pod {placed} bound")
            yield {"nodes": nodes}
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
            cluster.set_extender(ExtenderConfig.from_env())
    finally:
        terminate(agent)
        cluster.kubectl("delete", "node", *nodes, "--wait=false", check=False)
        cluster.kubectl("delete", "gpunode", *nodes, "--wait=false", check=False)
        print(f"\nagent log: {log}\n" + log.read_text()[-2000:])


def pod(cluster: E2ECluster, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "pod", name, "-n", NAMESPACE))


def assigned_uuids(cluster: E2ECluster, name: str) -> list[str]:
    raw = pod(cluster, name)["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS]
    return [g.uuid for ctr in c.decode_assignment(raw).containers.values() for g in ctr.gpus]


def test_top_shows_allocation_free_and_fragmentation_per_node_and_gpu(
    cluster: E2ECluster, fleet: dict[str, Any]
) -> None:
    doc = json.loads(ok(plugin(cluster, "top", "-o", "json")))
    mine = {n["node"]: n for n in doc["nodes"] if n["node"] in fleet["nodes"]}
    assert set(mine) == set(fleet["nodes"])
    assert sum(n["allocatedMilli"] for n in mine.values()) == 1000 + 300  # one whole GPU, one 30 % slice
    used = {g["uuid"]: g for n in mine.values() for g in n["gpuList"]}
    [whole] = assigned_uuids(cluster, "whole")
    [sliced] = assigned_uuids(cluster, "slice")
    assert used[whole]["allocatedMilli"] == 1000 and used[whole]["pods"] == [f"{NAMESPACE}/whole"]
    assert used[sliced]["freeMilli"] == 700 and used[sliced]["memoryAllocatedMiB"] == 4096
    assert all(0 <= n["fragmentationMilli"] <= n["freeMilli"] for n in mine.values())
    table = ok(plugin(cluster, "top"))
    assert "█" in table and all(name in table for name in fleet["nodes"]) and "gpu 3" in table
    nodes_only = json.loads(ok(plugin(cluster, "top", "--nodes-only", "-o", "json")))["nodes"]
    assert {n["node"]: n["allocatedMilli"] for n in nodes_only if n["node"] in mine} == {
        name: n["allocatedMilli"] for name, n in mine.items()
    }
    assert all("gpuList" not in n for n in nodes_only)
    table = ok(plugin(cluster, "top", "--nodes-only"))
    assert all(name in table for name in fleet["nodes"]) and "gpu 0" not in table


def test_kubectl_lists_the_plugin_and_the_kubeconfig_comes_after_the_verb_or_from_home(
    cluster: E2ECluster, fleet: dict[str, Any], tmp_path: Path
) -> None:
    """docs/cli.md, "Install the kubectl plugin": `kubectl plugin list` finds it on PATH; without
    $KUBECONFIG the cluster is `--kubeconfig FILE` after the verb, else ~/.kube/config."""
    listed = subprocess.run(
        [str(cluster.dev.tools.kubectl), "plugin", "list"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}"),
        timeout=60,
        cwd="/",
    )
    assert str(BIN / "kubectl-neuronetes") in listed.stdout, listed.stdout + listed.stderr
    bare = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    home = tmp_path / "home"
    home.mkdir()
    bare["HOME"] = str(home)  # no ~/.kube/config yet, and no workstation daemon there
    after_verb = plugin(cluster, "top", "--kubeconfig", str(cluster.kubeconfig), "-o", "json", env=bare)
    nodes = {n["node"] for n in json.loads(ok(after_verb))["nodes"]}
    assert set(fleet["nodes"]) <= nodes
    (home / ".kube").mkdir()
    (home / ".kube" / "config").write_text(cluster.kubeconfig.read_text())
    from_home = json.loads(ok(plugin(cluster, "status", "-o", "json", env=bare)))["nodes"]
    assert set(fleet["nodes"]) <= {n["node"] for n in from_home}


def test_explain_a_placed_pod_shows_node_gpus_and_the_extenders_score_terms(
    cluster: E2ECluster, fleet: dict[str, Any]
) -> None:
    node = pod(cluster, "whole")["spec"]["nodeName"]
    doc = wait_until(
        lambda: (
            (d := json.loads(ok(plugin(cluster, "explain", f"{NAMESPACE}/whole", "-o", "json")))).get(
                "placement"
            )
            and d
        ),
        timeout=30,
        what="the GpusAssigned Event",
    )
    assert doc["node"] == node and doc["placement"]["node"] == node
    assert doc["placement"]["why"] and doc["placement"]["scoreTerms"]  # the extender's reason and terms
    assert [g["uuid"] for g in doc["assignment"]["containers"]["main"]["gpus"]] == assigned_uuids(
        cluster, "whole"
    )
    table = ok(plugin(cluster, "explain", "whole", "-n", NAMESPACE))
    assert "why this node" in table and "score term" in table and node in table


def test_explain_a_pending_pod_lists_each_rejected_node_and_its_reason(
    cluster: E2ECluster, fleet: dict[str, Any]
) -> None:
    def rejected() -> dict[str, Any] | None:
        doc = yaml.safe_load(ok(plugin(cluster, "explain", f"{NAMESPACE}/toolarge", "-o", "yaml")))
        return doc if doc.get("rejectedNodes") and doc.get("scheduler") else None

    doc = wait_until(rejected, timeout=60, what="the GpuFilterRejected and FailedScheduling Events")
    assert doc["phase"] == "Pending" and doc["node"] is None
    assert "nodes are available" in doc["scheduler"]  # kube-scheduler's own summary of every node
    [group] = doc["rejectedNodes"]
    assert sorted(group["nodes"]) == sorted(fleet["nodes"]) and "memory" in group["reason"]
    table = ok(plugin(cluster, "explain", "toolarge", "-n", NAMESPACE))
    assert "REJECTED BECAUSE" in table and all(n in table for n in fleet["nodes"])


def test_status_all_lists_every_gpu_with_its_pods(cluster: E2ECluster, fleet: dict[str, Any]) -> None:
    doc = yaml.safe_load(ok(plugin(cluster, "status", "--all", "-o", "yaml")))
    mine = [g for g in doc["gpus"] if g["node"] in fleet["nodes"]]
    assert len(mine) == 8 and all(g["health"] in ("Available", "Allocated", "InUse") for g in mine)
    [whole] = assigned_uuids(cluster, "whole")
    assert next(g for g in mine if g["uuid"] == whole)["pods"] == [f"{NAMESPACE}/whole"]
    nodes = json.loads(ok(plugin(cluster, "status", "-o", "json")))["nodes"]
    assert {n["node"]: n["gpus"] for n in nodes if n["node"] in fleet["nodes"]} == dict.fromkeys(
        fleet["nodes"], 4
    )
    assert "HEARTBEAT" in ok(plugin(cluster, "status"))


def test_health_of_one_gpu(cluster: E2ECluster, fleet: dict[str, Any]) -> None:
    [whole] = assigned_uuids(cluster, "whole")
    every = json.loads(ok(plugin(cluster, "health", "-o", "json")))["gpus"]  # one row per GPU
    mine = [g for g in every if g["node"] in fleet["nodes"]]
    assert len(mine) == 8 and all({"health", "healthReason", "cordoned", "offline"} <= set(g) for g in mine)
    assert "CORDONED" in ok(plugin(cluster, "health"))
    doc = json.loads(ok(plugin(cluster, "health", "--gpu-id", whole, "-o", "json")))
    assert doc["uuid"] == whole and doc["health"] in ("Allocated", "InUse") and not doc["cordoned"]
    assert {x["type"] for x in doc["nodeConditions"]} >= {"Ready"}
    assert whole in ok(plugin(cluster, "health", "--gpu-id", whole))
    missing = plugin(cluster, "health", "--gpu-id", "GPU-00000000-0000-0000-0000-000000000000")
    assert missing.returncode == 1 and missing.stderr.startswith("error: no GPUNode lists GPU")
    assert missing.stderr.count("\n") == 1


def test_a_gpu_is_named_by_a_prefix_no_other_gpu_shares(cluster: E2ECluster, fleet: dict[str, Any]) -> None:
    [whole] = assigned_uuids(cluster, "whole")
    others = [
        g["uuid"]
        for item in get_json(cluster, "gpunodes")["items"]
        for g in (item.get("status") or {}).get("gpus") or ()
        if g["uuid"] != whole
    ]
    prefix = next(whole[:n] for n in range(5, len(whole)) if not any(u.startswith(whole[:n]) for u in others))
    assert json.loads(ok(plugin(cluster, "health", "--gpu-id", prefix, "-o", "json")))["uuid"] == whole
    shared = plugin(cluster, "health", "--gpu-id", "GPU-")
    assert (shared.returncode, shared.stdout) == (1, "") and shared.stderr.count("\n") == 1
    assert shared.stderr.startswith("error: GPU 'GPU-' is ambiguous: it starts GPU-")
    assert shared.stderr.endswith("; give more of the UUID\n")


def test_a_pod_that_does_not_exist_is_one_error_line(cluster: E2ECluster, fleet: dict[str, Any]) -> None:
    result = plugin(cluster, "explain", f"{NAMESPACE}/no-such-pod")
    assert result.returncode == 1 and result.stderr == f"error: pod {NAMESPACE}/no-such-pod not found\n"


def test_credentials_the_api_server_refuses_are_a_runtime_error(
    cluster: E2ECluster, fleet: dict[str, Any], tmp_path: Path
) -> None:
    config = json.loads(cluster.kubeconfig.read_text())  # the dev cluster writes it as JSON
    for user in config["users"]:
        user["user"] = {"token": "not-a-token-of-this-cluster"}
    refused = tmp_path / "refused.kubeconfig"
    refused.write_text(json.dumps(config))
    result = plugin(cluster, "top", "--kubeconfig", str(refused))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("error: GET ") and result.stderr.count("\n") == 1
    assert result.stderr.endswith(": the API server answered 401 Unauthorized\n")


def free_gpu(cluster: E2ECluster, fleet: dict[str, Any], k: int) -> tuple[str, str]:
    """(node, uuid) of the `k`-th GPU no pod of this module uses, on the module's second node."""
    node = fleet["nodes"][1]
    busy = set(assigned_uuids(cluster, "whole") + assigned_uuids(cluster, "slice"))
    free = [g["uuid"] for g in get_json(cluster, "gpunode", node)["status"]["gpus"] if g["uuid"] not in busy]
    return node, free[k]


def gpu_state(cluster: E2ECluster, gpu: str) -> dict[str, Any]:
    return dict(json.loads(ok(plugin(cluster, "health", "--gpu-id", gpu, "-o", "json"))))


def test_drain_keeps_new_work_off_a_gpu(cluster: E2ECluster, fleet: dict[str, Any]) -> None:
    node, gpu = free_gpu(cluster, fleet, 0)
    try:
        assert f"GPU {gpu} on {node}: cordoned" in ok(plugin(cluster, "drain", "--gpu-id", gpu))
        assert gpu in get_json(cluster, "gpunode", node)["spec"]["cordonedGPUs"]
        state = gpu_state(cluster, gpu)
        assert state["cordoned"] and not state["offline"] and state["freeMilli"] == 0
    finally:
        plugin(cluster, "online", "--gpu-id", gpu)


def test_offline_refuses_a_gpu_in_use_and_takes_a_free_one_out(
    cluster: E2ECluster, fleet: dict[str, Any]
) -> None:
    [used] = assigned_uuids(cluster, "whole")
    node = pod(cluster, "whole")["spec"]["nodeName"]

    def recorded() -> bool:  # the agent's record of who uses the GPU, which `offline` checks
        gpus = get_json(cluster, "gpunode", node)["status"]["gpus"]
        return any(g["uuid"] == used and g.get("allocations") for g in gpus)

    wait_until(recorded, timeout=30, what="the agent's allocation record of the whole-GPU pod")
    refused = plugin(cluster, "offline", "--gpu-id", used)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"error: GPU {used} is used by {NAMESPACE}/whole")
    node, gpu = free_gpu(cluster, fleet, 1)
    try:
        assert f"GPU {gpu} on {node}: offline" in ok(plugin(cluster, "offline", "--gpu-id", gpu))
        state = gpu_state(cluster, gpu)
        assert state["offline"] and state["cordoned"]
    finally:
        plugin(cluster, "online", "--gpu-id", gpu)


def test_online_puts_a_gpu_back_in_service(cluster: E2ECluster, fleet: dict[str, Any]) -> None:
    node, gpu = free_gpu(cluster, fleet, 2)
    ok(plugin(cluster, "offline", "--gpu-id", gpu))
    assert f"GPU {gpu} on {node}: back in service" in ok(plugin(cluster, "online", "--gpu-id", gpu))
    state = gpu_state(cluster, gpu)
    assert not state["cordoned"] and not state["offline"]
    assert gpu not in (get_json(cluster, "gpunode", node)["spec"].get("cordonedGPUs") or [])


def test_offline_force_takes_a_gpu_in_use_out_and_the_agent_evicts_its_pod(
    cluster: E2ECluster, fleet: dict[str, Any]
) -> None:
    pin = {SUITE[0]: SUITE[1]}
    evictee = manifest("evictee", {c.RESOURCE_GPU: 1}, namespace=NAMESPACE, node_selector=pin)
    cluster.kubectl("create", "-f", "-", input=json.dumps(evictee))
    wait_until(lambda: pod(cluster, "evictee")["spec"].get("nodeName"), timeout=60, what="evictee bound")
    node = pod(cluster, "evictee")["spec"]["nodeName"]
    [gpu] = assigned_uuids(cluster, "evictee")

    def recorded() -> bool:
        gpus = get_json(cluster, "gpunode", node)["status"]["gpus"]
        return any(g["uuid"] == gpu and g.get("allocations") for g in gpus)

    wait_until(recorded, timeout=30, what="the agent's allocation record of the evictee")
    try:
        said = ok(plugin(cluster, "offline", "--gpu-id", gpu, "--force"))
        assert f"GPU {gpu} on {node}: offline, evicting 1 allocations" in said
        assert gpu_state(cluster, gpu)["offline"]

        def evicted() -> bool:
            found = cluster.kubectl("get", "pod", "evictee", "-n", NAMESPACE, "-o", "json", check=False)
            return found.returncode != 0 or bool(
                json.loads(found.stdout)["metadata"].get("deletionTimestamp")
            )

        wait_until(evicted, timeout=60, what="the agent evicting the pod on the offline GPU")
    finally:
        plugin(cluster, "online", "--gpu-id", gpu)


def test_simulate_from_cluster_replays_the_clusters_gpu_pods_under_each_policy(
    cluster: E2ECluster, fleet: dict[str, Any], tmp_path: Path
) -> None:
    result = subprocess.run(
        [
            str(BIN / "neuronetes"),
            "simulate",
            "--from-cluster",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--seeds",
            "1-2",
            "--workers",
            "1",
            "--save-trace",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    out = ok(result)
    assert "GPUS SAVED BY DEFAULT" in out and all(f"\n{p} " in out for p in ("fgd", "bestfit", "random"))
    pods = (tmp_path / "cluster_pod_list.csv").read_text().splitlines()
    assert pods[0].startswith("name,cpu_milli,memory_mib,num_gpu,gpu_milli")
    rows = {line.split(",")[0]: line.split(",") for line in pods[1:]}
    assert rows[f"{NAMESPACE}/whole"][3:5] == ["1", "1000"]
    assert rows[f"{NAMESPACE}/slice"][3:5] == ["1", "300"]
    assert rows[f"{NAMESPACE}/toolarge"][3:5] == ["1", "500"]  # Pending pods are part of the workload
    nodes = (tmp_path / "cluster_node_list.csv").read_text()
    assert all(f"{n},48000," in nodes for n in fleet["nodes"])
