"""The chart on a real node: ``helm install`` schedules the agent DaemonSet's pod onto ``real-0``
(kubelet + containerd + runc) as real containers from the repository's image, the NRI plugin
registers with that node's containerd, and the agent serves its node through NVML (the fake
driver: one simulated GPU). Then GPU pods of the probe image (``tests/images/gpu-probe``) run there
as real containers: the extender places them, the plugin injects the assigned devices, the shim,
the preload and the region, and the shim enforces the slice inside — in the main process, a forked
child, an exec'd program and a ``kubectl exec``'d one. Forged assignments fail container creation
naming why; kubelet, containerd, the agent and the plugin killed in turn leave the running GPU pod
as it was; ``helm upgrade`` rolls the agent and the plugin registers again; ``helm uninstall``
leaves only what docs/dev-cluster.md says stays. The tests run in this order on one cluster.

The cluster runs in chart mode without the release (`DevCluster.up(install_chart=False)`); the
test runs ``helm install`` itself (`ChartOps.install`, with ``hack/real-node-values.yaml``).
Needs root, Debian's runc, containernetworking-plugins and busybox-static
(hack/install-node-packages.sh), buildah for the images (hack/build-image.sh, cached) and the fake
driver (node-agent/shim): skipped without them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_cluster import ensure_real_node_toolchain, own_cluster, wait_until
from real_node_pods import (
    apply,
    exec_probe,
    gpu_probe_pod,
    kubectl_json,
    ledger_uids,
    node_mounts,
    node_path,
    node_processes,
    wait_probe_ready,
)
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
    assert report["cuda"] == {
        "result": "CUDA_SUCCESS",
        "devices": 1,
        "total_bytes": limit,
        "free_bytes": limit,
    }

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


def _refusal(dev: DevCluster, name: str, reason: str) -> str:
    """The pod's container-creation failure naming `reason`, as `kubectl describe pod` shows it (the
    kubelet retries the creation: an earlier attempt may have been refused for a passing reason,
    such as the region not written yet)."""

    def refused() -> str | None:
        text = dev.kubectl("describe", "pod", "-n", PODS, name).stdout
        lines = [
            line for line in text.splitlines() if "neuronetes: refusing container" in line and reason in line
        ]
        return lines[-1] if lines else None

    return wait_until(refused, timeout=90, what=f"pod {name}'s refusal naming {reason!r} in its events")


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
    line = _refusal(dev, "forged-copy", "(a copied annotation)")
    print("copied assignment:", line)
    assert running["metadata"]["uid"] in line, line

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
    forged_value = contracts.encode_assignment(whole)
    forged = gpu_probe_pod(
        "forged-whole", PODS, memory_mib=MEMORY_MIB, compute_percent=COMPUTE, alloc_mib=OVER_MIB,
        annotations={contracts.ANNOTATION_ASSIGNED_GPUS: forged_value}, node_name="real-0",
    )  # fmt: skip
    assert apply(dev, forged, as_user=EXTENDER_USER).returncode == 0
    line = _refusal(dev, "forged-whole", f"GPU {gpu.uuid} would hold")
    print("GPU already held:", line)
    assert "with the pods recorded before this one" in line, line
    for name in ("forged-copy", "forged-whole"):
        status = _pod(dev, name)["status"].get("containerStatuses", [{}])[0]
        assert "running" not in status.get("state", {}), status
    # The running pod kept its GPU.
    status = _pod(dev, "probe-0")["status"]["containerStatuses"][0]
    assert "running" in status["state"] and status["restartCount"] == 0, status
    dev.kubectl("delete", "pod", "-n", PODS, "forged-copy", "forged-whole", "--wait=false")


def _running_unchanged(dev: DevCluster, name: str, container_id: str) -> None:
    """The pod runs the same container as before, never restarted, and its limit still holds."""
    status = _pod(dev, name)["status"]["containerStatuses"][0]
    assert status["containerID"] == container_id and status["restartCount"] == 0, status
    assert "running" in status["state"], status
    (over,) = exec_probe(dev, PODS, name, "alloc", str(OVER_MIB), "after-restart")
    assert (over["shim"], over["result"]) == (True, "CUDA_ERROR_OUT_OF_MEMORY"), over


def _agent_restarts(dev: DevCluster) -> dict[str, int]:
    pod = _agent_pod(dev)
    return {c["name"]: c["restartCount"] for c in pod["status"]["containerStatuses"]}


# What to kill on the node (a pattern of its command line) and how it comes back: the node's
# supervisor restarts containerd and the kubelet (hack/real-node.sh); the kubelet restarts the
# agent's containers.
KILLS = {
    "kubelet": "--hostname-override real-0",
    "containerd": "containerd.toml",
    "agent": "agent run --node=real-0",
    "nri-plugin": "neuronetes-nri --node-name=real-0",
}


def test_restarts_of_kubelet_containerd_agent_and_plugin_keep_running_gpu_pods(dev: DevCluster) -> None:
    before = _pod(dev, "probe-0")
    container_id = before["status"]["containerStatuses"][0]["containerID"]
    region = node_path(dev, "real-0", f"/run/neuronetes/containers/{before['metadata']['uid']}/probe/control")
    region_inode = region.stat().st_ino
    for what, pattern in KILLS.items():
        (pid,) = node_processes(dev, "real-0", pattern)
        restarts = _agent_restarts(dev)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)

        def started_again(pattern: str = pattern, old: int = pid) -> list[int]:
            return [n for n in node_processes(dev, "real-0", pattern) if n != old]

        wait_until(started_again, timeout=120, what=f"{what} running again")
        if what in restarts:  # the kubelet restarted the container, and it is ready again

            def restarted_and_ready(what: str = what, restarts: dict[str, int] = restarts) -> bool:
                return _agent_restarts(dev)[what] > restarts[what] and all(
                    c["ready"] for c in _agent_pod(dev)["status"]["containerStatuses"]
                )

            wait_until(
                restarted_and_ready, timeout=120, what=f"the agent pod's {what} container restarted and ready"
            )
        wait_until(
            lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in kubectl_json(dev, "get", "node", "real-0")["status"]["conditions"]
            ),
            timeout=120,
            what="real-0 Ready",
        )
        print(f"{what} killed (pid {pid}) -> back in {time.monotonic() - t0:.1f} s")
        _running_unchanged(dev, "probe-0", container_id)
        # The agent kept the region it had written (it adopts it, it does not write a new one).
        assert region.stat().st_ino == region_inode, f"{what}: the region of probe-0 was replaced"

    # A new GPU pod still starts (the plugin is registered again) and gets a GPU slice of its own.
    _gpu_pod(dev, "probe-1")
    gpunode = kubectl_json(dev, "get", "gpunodes.neuronetes.io", "real-0")
    allocated = [a for g in gpunode["status"]["gpus"] for a in g["allocations"]]
    names = sorted(a.get("pod", "") for a in allocated)
    print("GPU allocations:", allocated)
    assert names.count(f"{PODS}/probe-0") + names.count("probe-0") == 1, allocated
    assert names.count(f"{PODS}/probe-1") + names.count("probe-1") == 1, allocated

    # A deleted pod's region and ledger entry go.
    uid = before["metadata"]["uid"]
    assert uid in ledger_uids(dev, "real-0")
    dev.kubectl("delete", "pod", "-n", PODS, "probe-0", "--wait=true", timeout=120)
    wait_until(lambda: uid not in ledger_uids(dev, "real-0"), timeout=60, what="probe-0 gone from the ledger")
    wait_until(lambda: not region.parent.parent.exists(), timeout=60, what="probe-0's region removed")


def _registrations(dev: DevCluster) -> int:
    log = dev.state_dir / "real-nodes" / "real-0" / "containerd.log"
    return sum('registered as \\"10-neuronetes\\"' in line for line in log.read_text().splitlines())


def test_helm_upgrade_rolls_the_agent_and_the_plugin_registers_again(dev: DevCluster) -> None:
    old = _agent_pod(dev)["metadata"]["uid"]
    registrations = _registrations(dev)
    running = _pod(dev, "probe-1")["status"]["containerStatuses"][0]["containerID"]
    t0 = time.monotonic()
    ChartOps(dev).upgrade("--set", "agent.interval=2", timeout_s=240.0)
    wait_until(lambda: _agent_pod(dev)["metadata"]["uid"] != old, timeout=120, what="a new agent pod")
    wait_until(lambda: _registrations(dev) > registrations, timeout=120, what="the plugin registered again")
    print(f"helm upgrade: agent rolled and plugin registered again in {time.monotonic() - t0:.1f} s")
    _running_unchanged(dev, "probe-1", running)
    _gpu_pod(dev, "probe-2")  # the new plugin injects


# What `helm uninstall` leaves on a node (docs/dev-cluster.md, "Uninstall"): the agent's state
# folder (the node ledger and inventory, so a reinstall resumes the ledger's order) and the shim
# folder (GPU containers still running keep the shim and preload file they have mounted).
STAYS = {
    "/run/neuronetes": {"inventory.json", "ledger.json", "containers", "containers.d"},
    "/run/neuronetes-shim": {"libneuronetes-cuda.so", "ld.so.preload"},
}


def test_helm_uninstall_leaves_no_process_or_mount_of_ours_on_the_node(dev: DevCluster) -> None:
    dev.kubectl("delete", "namespace", PODS, "--wait=true", timeout=180)
    # The agent removes the regions of pods that are gone (a region of a pod deleted while no
    # agent runs stays until the next agent starts).
    regions = node_path(dev, "real-0", "/run/neuronetes/containers")
    wait_until(lambda: not any(regions.iterdir()), timeout=60, what="the deleted GPU pods' regions removed")
    ChartOps(dev).uninstall(timeout_s=180.0)
    ours = ("neuronetes agent", "neuronetes-nri", "gpu-probe")
    wait_until(
        lambda: not any(node_processes(dev, "real-0", pattern) for pattern in ours),
        timeout=120,
        what="no process of ours on real-0",
    )
    # No mount below our host folders in the node's mount namespace (container mounts die with
    # their containers; a leaked one would show here).
    mount_points = [line.split()[4] for line in node_mounts(dev, "real-0").splitlines()]
    assert not [m for m in mount_points if m.startswith(tuple(STAYS))], mount_points
    for folder, names in STAYS.items():
        there = {p.name for p in node_path(dev, "real-0", folder).iterdir()}
        assert there <= names, (folder, there - names)
    for folder in ("containers", "containers.d"):
        assert not any(node_path(dev, "real-0", f"/run/neuronetes/{folder}").iterdir()), folder
