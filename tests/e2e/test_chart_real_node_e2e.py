"""The chart's node agent on a real node: ``helm install`` schedules the agent DaemonSet's pod onto
``real-0`` (kubelet + containerd + runc) as real containers from the repository's image, the NRI
plugin registers with that node's containerd, and the agent serves its node through NVML (the fake
driver: one simulated GPU) — it publishes the node's GPUNode, and ``kubectl logs`` shows it.

The cluster runs in chart mode without the release (`DevCluster.up(install_chart=False)`); the
test runs ``helm install`` itself (`ChartOps.install`, with ``hack/real-node-values.yaml``).
Needs root, Debian's runc, containernetworking-plugins and busybox-static
(hack/install-node-packages.sh), buildah for the image (hack/build-image.sh, cached) and the fake
driver (node-agent/shim): skipped without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_cluster import ensure_real_node_toolchain, own_cluster, wait_until
from real_node_pods import apply, exec_probe, gpu_probe_pod, kubectl_json, wait_probe_ready
from shim_build import build as build_shim

from neuronetes import __version__, contracts
from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.chartmode import LOCAL_VALUES, ChartOps, ChartRelease
from neuronetes.devcluster.realchart import (
    FAKE_CUDA,
    FAKE_NVML,
    GPU_PROBE_IMAGE,
    REAL_NODE_VALUES,
    missing_for_chart,
)
from neuronetes.devcluster.tools import REPO_ROOT

pytestmark = pytest.mark.e2e

NAME = f"e2e-chart-real-{os.getpid()}"
RELEASE = ChartRelease(values=(LOCAL_VALUES, REAL_NODE_VALUES))
BUILD_S = 1800  # the image from nothing: base images, pip and Go downloads
PROBE_DOCKERFILE = REPO_ROOT / "tests" / "images" / "gpu-probe" / "Dockerfile"
PODS = "gpu-pods"  # the GPU pods' namespace
EXTENDER_USER = "system:serviceaccount:neuronetes-system:neuronetes-scheduler"
MEMORY_MIB, COMPUTE = 1024, 50  # the probe pod's slice
OVER_MIB = 2 * MEMORY_MIB  # past its limit, well within the simulated GPU's 80 GiB


def _prerequisites() -> None:
    ensure_real_node_toolchain()
    # The image of this checkout (hack/build-image.sh: cached, quick when nothing changed);
    # NEURONETES_E2E_BUILD=0 takes the archive as it is.
    # The GPU pods' image: tests/images/gpu-probe (the shim stage's layers are shared).
    if os.environ.get("NEURONETES_E2E_BUILD", "1") != "0":
        for extra in ([], ["--dockerfile", str(PROBE_DOCKERFILE), "--tag", GPU_PROBE_IMAGE]):
            built = subprocess.run(
                ["bash", str(REPO_ROOT / "hack" / "build-image.sh"), *extra],
                capture_output=True,
                text=True,
                timeout=BUILD_S,
                check=False,
            )
            if built.returncode != 0:
                pytest.fail(f"hack/build-image.sh {' '.join(extra)} failed: {built.stderr.strip()[-300:]}")
    build_shim(str(FAKE_NVML), str(FAKE_CUDA))  # incremental: a stale fake is rebuilt
    why = missing_for_chart()
    if why:
        pytest.skip("the chart's agent cannot run on a real node here: " + "; ".join(why))


@pytest.fixture(scope="module")
def dev(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    _prerequisites()
    DevCluster(NAME).down()  # of an earlier session killed half-way
    t0 = time.monotonic()
    with own_cluster(request, NAME, chart=RELEASE, install_chart=False, real_nodes=1, timeout_s=180.0) as c:
        print(f"chart-mode cluster with a real node up in {time.monotonic() - t0:.1f} s")
        yield c


def _agent_pod(dev: DevCluster) -> dict[str, Any]:
    pods = json.loads(
        dev.kubectl(
            "get", "pods", "-n", RELEASE.namespace, "-l", "app.kubernetes.io/component=agent", "-o", "json"
        ).stdout
    )["items"]
    on_real = [p for p in pods if p["spec"].get("nodeName") == "real-0"]
    assert len(on_real) == 1, [p["metadata"]["name"] for p in pods]
    pod: dict[str, Any] = on_real[0]
    return pod


def test_helm_install_runs_the_agent_and_its_nri_plugin_on_the_real_node(dev: DevCluster) -> None:
    ops = ChartOps(dev)
    t0 = time.monotonic()
    ops.install(timeout_s=240.0)
    print(f"helm install (agent Ready on real-0) in {time.monotonic() - t0:.1f} s")

    pod = _agent_pod(dev)
    name = str(pod["metadata"]["name"])
    statuses = {c["name"]: c for c in pod["status"]["containerStatuses"]}
    assert set(statuses) == {"agent", "nri-plugin"}
    for c in statuses.values():
        assert c["ready"] and "running" in c["state"], c
        assert c["containerID"].startswith("containerd://"), c
        assert c["image"].endswith(f"localhost/neuronetes:{__version__}"), c["image"]
    # Not a host process of the chart runner: the node's kubelet runs it.
    assert all(r["name"] != name for r in ops.runner_state()["pods"].values())

    # The NRI plugin registered with the node's containerd (plugin index 10, name neuronetes).
    containerd_log = dev.state_dir / "real-nodes" / "real-0" / "containerd.log"
    registered = wait_until(
        lambda: [line for line in containerd_log.read_text().splitlines() if "10-neuronetes" in line],
        timeout=60,
        what="the NRI plugin in containerd's log",
    )
    print("containerd:", *registered[:3], sep="\n  ")
    plugin_log = dev.kubectl("logs", "-n", RELEASE.namespace, name, "-c", "nri-plugin").stdout
    assert '"msg":"starting"' in plugin_log, plugin_log

    # The agent serves its node: NVML (the fake driver) found the GPU, GPUNode real-0 is published.
    gpunode = wait_until(
        lambda: (
            json.loads(
                dev.kubectl("get", "gpunodes.neuronetes.io", "real-0", "-o", "json", check=False).stdout
                or "{}"
            )
            .get("status", {})
            .get("gpus")
        ),
        timeout=90,
        what="GPUNode real-0 with GPUs",
    )
    assert len(gpunode) == 1, gpunode
    agent_log = dev.kubectl("logs", "-n", RELEASE.namespace, name, "-c", "agent").stdout
    print("agent:", *agent_log.splitlines()[:5], sep="\n  ")
    assert "metrics on http://127.0.0.1:9400/metrics" in agent_log, agent_log


def _pod(dev: DevCluster, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = kubectl_json(dev, "get", "pod", "-n", PODS, name)
    return pod


def _gpu_pod(dev: DevCluster, name: str) -> list[dict[str, Any]]:
    """Create a probe pod through the scheduler; its reports once ready."""
    dev.kubectl("create", "namespace", PODS, check=False)
    created = apply(
        dev, gpu_probe_pod(name, PODS, memory_mib=MEMORY_MIB, compute_percent=COMPUTE, alloc_mib=OVER_MIB)
    )
    assert created.returncode == 0, created.stderr
    return wait_probe_ready(dev, PODS, name)


def test_a_gpu_pod_runs_on_the_real_node_with_its_slice_enforced_inside(dev: DevCluster) -> None:
    t0 = time.monotonic()
    lines = _gpu_pod(dev, "probe-0")
    print(f"GPU pod created -> probe ready in {time.monotonic() - t0:.1f} s")
    pod = _pod(dev, "probe-0")
    assert pod["spec"]["nodeName"] == "real-0"
    assignment = contracts.decode_assignment(
        pod["metadata"]["annotations"][contracts.ANNOTATION_ASSIGNED_GPUS]
    )
    (gpu,) = assignment.containers["probe"].gpus
    assert (gpu.memory_mib, gpu.compute_percent) == (MEMORY_MIB, COMPUTE)

    report = next(r for r in lines if r["what"] == "report")
    print("probe report:", json.dumps(report))
    # Exactly the assigned GPU: its UUID, its device node and the driver's control nodes.
    assert report["cuda_visible_devices"] == gpu.uuid
    assert report["devices"] == [
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        f"/dev/nvidia{gpu.index}",
        "/dev/nvidiactl",
    ]
    # The shim is preloaded, and the region is this pod's, with its limits.
    assert report["preload"].strip() == "/usr/lib/neuronetes/libneuronetes-cuda.so"
    assert report["shim"] is True
    control = report["control"]
    assert control["pod_uid"] == pod["metadata"]["uid"]
    assert control["devices"] == [
        {"uuid": gpu.uuid, "memory_limit_bytes": MEMORY_MIB << 20, "compute_share_percent": COMPUTE}
    ]
    # The CUDA driver API through the shim: the slice is the GPU's memory.
    limit = MEMORY_MIB << 20
    assert report["cuda"] == {"result": "CUDA_SUCCESS", "devices": 1, "total_bytes": limit, "free_bytes": limit}

    # Past the limit: out of memory, in the container's main process, a forked child and an
    # exec'd program alike — and the container lives on.
    allocs = {r["by"]: r for r in lines if r["what"] == "alloc"}
    assert set(allocs) == {"main", "fork", "exec"}, lines
    for by, r in allocs.items():
        assert (r["shim"], r["result"]) == (True, "CUDA_ERROR_OUT_OF_MEMORY"), (by, r)
    status = _pod(dev, "probe-0")["status"]["containerStatuses"][0]
    assert "running" in status["state"] and status["restartCount"] == 0, status


def test_a_process_started_by_kubectl_exec_is_under_the_shim(dev: DevCluster) -> None:
    (over,) = exec_probe(dev, PODS, "probe-0", "alloc", str(OVER_MIB), "kubectl-exec")
    assert (over["shim"], over["result"]) == (True, "CUDA_ERROR_OUT_OF_MEMORY"), over
    (within,) = exec_probe(dev, PODS, "probe-0", "alloc", str(MEMORY_MIB // 2), "kubectl-exec")
    assert (within["shim"], within["result"]) == (True, "CUDA_SUCCESS"), within


def _refusal(dev: DevCluster, name: str) -> str:
    """The pod's container-creation failure as `kubectl describe pod` shows it."""

    def refused() -> str | None:
        text = dev.kubectl("describe", "pod", "-n", PODS, name).stdout
        lines = [line for line in text.splitlines() if "neuronetes: refusing container" in line]
        return lines[-1] if lines else None

    return wait_until(refused, timeout=90, what=f"pod {name}'s refusal in its events")


def test_a_forged_assignment_fails_container_creation_naming_why(dev: DevCluster) -> None:
    """Past the admission policies (here: impersonating the extender, as a compromised extender
    or a missing policy would), the node still refuses what its ledger does not hold."""
    running = _pod(dev, "probe-0")
    copied = running["metadata"]["annotations"][contracts.ANNOTATION_ASSIGNED_GPUS]
    # 1. A running pod's assignment copied onto another pod: its podUID is the other pod's.
    forged = gpu_probe_pod(
        "forged-copy", PODS, memory_mib=MEMORY_MIB, compute_percent=COMPUTE, alloc_mib=OVER_MIB,
        annotations={contracts.ANNOTATION_ASSIGNED_GPUS: copied}, node_name="real-0",
    )  # fmt: skip
    assert apply(dev, forged, as_user=EXTENDER_USER).returncode == 0
    line = _refusal(dev, "forged-copy")
    print("copied assignment:", line)
    assert "podUID" in line or "another pod" in line, line

    # 2. A whole GPU written without a pod UID: well-formed, this node's, but the GPU is held by
    # the pod the ledger recorded first.
    gpu = contracts.decode_assignment(copied).containers["probe"].gpus[0]
    whole = contracts.Assignment(
        version=1,
        node="real-0",
        containers={
            "probe": contracts.ContainerAssignment(
                gpus=(
                    contracts.GpuAssignment(
                        uuid=gpu.uuid, index=gpu.index, memory_mib=81920, compute_percent=100
                    ),
                ),
                priority=0,
                qos=contracts.QoS.GUARANTEED,
            )
        },
    )
    forged = gpu_probe_pod(
        "forged-whole", PODS, memory_mib=MEMORY_MIB, compute_percent=COMPUTE, alloc_mib=OVER_MIB,
        annotations={contracts.ANNOTATION_ASSIGNED_GPUS: contracts.encode_assignment(whole)}, node_name="real-0",
    )  # fmt: skip
    assert apply(dev, forged, as_user=EXTENDER_USER).returncode == 0
    line = _refusal(dev, "forged-whole")
    print("GPU already held:", line)
    assert gpu.uuid in line or "held" in line, line
    for name in ("forged-copy", "forged-whole"):
        status = _pod(dev, name)["status"].get("containerStatuses", [{}])[0]
        assert "running" not in status.get("state", {}), status
    # The running pod kept its GPU.
    status = _pod(dev, "probe-0")["status"]["containerStatuses"][0]
    assert "running" in status["state"] and status["restartCount"] == 0, status
    dev.kubectl("delete", "pod", "-n", PODS, "forged-copy", "forged-whole", "--wait=false")
