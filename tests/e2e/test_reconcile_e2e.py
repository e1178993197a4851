"""NVML reconciliation against the real local control plane: the extender places a shared-slice pod
and a whole-GPU pod on a kwok node, and that node's agent (`NodeAgent` with the simulated NVML
backend, real shim regions, the NRI plugin's container records, a cgroup tree and ``/proc`` as the
kernel shows them, and the real Kubernetes client) finds an unshimmed process in each. The slice
pod is evicted through the Eviction API with a Warning Event in its namespace naming the process,
its memory and the limit; the whole-GPU pod keeps running (docs/gpu-health.md "Reconciliation")."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, pinned_pod, wait_until
from extender_harness import ExtenderThread
from handoff_support import cgroup_tree, write_record
from region_fakes import fake_process

from neuronetes import contracts as c
from neuronetes.devcluster import ExtenderConfig
from neuronetes.profiles import PROFILES
from neuronetes_agent.daemon.backstop import Backstop
from neuronetes_agent.daemon.containers import ContainerTender
from neuronetes_agent.daemon.kube import Kube
from neuronetes_agent.daemon.node import NodeAgent
from neuronetes_agent.daemon.pods import pod_use
from neuronetes_agent.daemon.reconcile import Policy
from neuronetes_agent.daemon.regions import RegionKeeper
from neuronetes_agent.daemon.simulated import SimulatedGpus
from neuronetes_extender.server import build

pytestmark = pytest.mark.e2e

NAMESPACE = "reconcile-e2e"
PROFILE = "dgx-a100-80gb"
GRACE_S = 2.0
GIB = 1 << 30


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


class ServedNode:
    """One kwok node served by an in-process agent ticking every 0.3 s, its pods read from the API."""

    def __init__(self, cluster: E2ECluster, node: str, root: Path) -> None:
        self.node = node
        self.state, self.cgroups, self.proc = root / "state", root / "cgroup", root / "proc"
        self.sim = SimulatedGpus(PROFILES[PROFILE], node)
        self.kube = Kube(cluster.api_client())
        regions = RegionKeeper(self.state / "containers")
        self.agent = NodeAgent(
            node,
            get_json(cluster, "node", node)["metadata"]["uid"],
            self.sim,
            self.kube,
            ThreadPoolExecutor(1),
            agent_version="e2e",
            regions=regions,
            containers=ContainerTender(
                self.state, regions, cgroup_root=self.cgroups, proc_root=self.proc, clock=time.time
            ),
            backstop=Backstop(Policy(grace_s=GRACE_S), regions),
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seen: set[str] = set()
        while not self.stop.wait(0.3):
            pods = self.kube.request(
                "GET", "/api/v1/pods", query=[("fieldSelector", f"spec.nodeName={self.node}")]
            )
            now = {}
            for p in pods.get("items") or ():
                use = pod_use(p)
                if use is not None:
                    now[use.uid] = use
            for uid in seen - set(now):
                self.agent.set_pod(uid, None)
            for uid, use in now.items():
                self.agent.set_pod(uid, use)
            seen = set(now)
            self.agent.tick()

    def start_container(self, pod: dict[str, Any], container: str, pid: int, used: int) -> str:
        """The container runs: the plugin's record, its cgroup with process `pid` (no shim: it claims
        no slot), and NVML showing `used` bytes for it on the pod's GPU."""
        uid = pod["metadata"]["uid"]
        assignment = c.decode_assignment(pod["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS])
        gpu = assignment.containers[container].gpus[0].uuid
        path = f"/kubepods/pod{uid}/{container}"
        write_record(self.state, uid, container, path, time.time())
        cgroup_tree(self.cgroups, 2, path.lstrip("/"), pid)
        fake_process(self.proc, pid, (pid, 1), 1000 + pid)
        self.sim.set_process(gpu, pid, used)
        return gpu


@pytest.fixture(scope="module")
def served(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedNode]:
    config = Path(tmp_path_factory.mktemp("extender")) / "extender.yaml"
    config.write_text("filterTopK: 3\nassumeTTLSeconds: 60\n")
    ext = build(kubeconfig=cluster.extender_kubeconfig, config=config)
    (node,) = cluster.add_nodes(PROFILE, 1, "rc-dgx", labels={"neuronetes.io/e2e-suite": "reconcile"})
    served = ServedNode(cluster, node, Path(tmp_path_factory.mktemp("node")))
    served.agent.start(get_json(cluster, "node", node))
    served.thread.start()
    try:
        with ExtenderThread(ext.app) as server:
            wait_until(lambda: ext.cache.node_spec(node) is not None, timeout=30, what="the node's GPUs seen")
            cluster.set_extender(ExtenderConfig(url=server.url, weight=20))
            cluster.kubectl("create", "namespace", NAMESPACE)
            yield served
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
            cluster.set_extender(ExtenderConfig.from_env())
    finally:
        served.stop.set()
        served.thread.join(timeout=10)
        served.sim.close()
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        cluster.kubectl("delete", "gpunode", node, "--wait=false", check=False)


def gpu_pod(name: str, node: str, limits: dict[str, str]) -> dict[str, Any]:
    return pinned_pod(name, NAMESPACE, node, limits)


def running(cluster: E2ECluster, name: str) -> dict[str, Any] | None:
    pods = get_json(cluster, "pods", "-n", NAMESPACE)["items"]
    found = [p for p in pods if p["metadata"]["name"] == name and p["status"].get("phase") == "Running"]
    return found[0] if found and not found[0]["metadata"].get("deletionTimestamp") else None


def pod_events(cluster: E2ECluster, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={name},involvedObject.kind=Pod"
    return list(get_json(cluster, "events", "-n", NAMESPACE, "--field-selector", selector)["items"])


def test_an_unshimmed_process_evicts_a_slice_pod_not_a_whole_gpu_pod(
    cluster: E2ECluster, served: ServedNode
) -> None:
    node = served.node
    shared = {c.RESOURCE_GPU_MEMORY: "10240", c.RESOURCE_GPU_COMPUTE: "30"}
    for name, limits in (("slice", shared), ("whole", {c.RESOURCE_GPU: "1"})):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(gpu_pod(name, node, limits)))
    slice_pod = wait_until(lambda: running(cluster, "slice"), timeout=60, what="slice pod Running")
    whole_pod = wait_until(lambda: running(cluster, "whole"), timeout=60, what="whole-GPU pod Running")

    # both run a binary that never loads the shim
    gpu = served.start_container(slice_pod, "main", 7001, 3 * GIB)
    served.start_container(whole_pod, "main", 7002, 30 * GIB)

    def evicted() -> bool:
        return running(cluster, "slice") is None

    started = time.monotonic()
    wait_until(evicted, timeout=GRACE_S + 30, what="the slice pod evicted")
    assert time.monotonic() - started >= GRACE_S - 0.5  # not before its grace
    events = wait_until(lambda: pod_events(cluster, "slice"), timeout=15, what="the slice pod's Event")
    (event,) = [e for e in events if e["reason"] == "GPUUnshimmedProcess"]
    assert event["type"] == "Warning" and event["involvedObject"]["uid"] == slice_pod["metadata"]["uid"]
    assert "process 7001" in event["message"] and f"{3 * GIB} bytes" in event["message"]
    assert f"{10240 << 20} bytes" in event["message"] and gpu in event["message"]
    assert served.agent.counters.slice_evictions == {(NAMESPACE, "slice", "unshimmed"): 1}

    # the whole-GPU pod, unshimmed too, runs on
    time.sleep(GRACE_S + 1)
    assert running(cluster, "whole") is not None
    assert not [e for e in pod_events(cluster, "whole") if e["reason"].startswith("GPU")]
