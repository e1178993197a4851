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
from shim_build import build as build_shim

from neuronetes import __version__
from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.chartmode import LOCAL_VALUES, ChartOps, ChartRelease
from neuronetes.devcluster.realchart import FAKE_NVML, REAL_NODE_VALUES, missing_for_chart
from neuronetes.devcluster.tools import REPO_ROOT

pytestmark = pytest.mark.e2e

NAME = f"e2e-chart-real-{os.getpid()}"
RELEASE = ChartRelease(values=(LOCAL_VALUES, REAL_NODE_VALUES))
BUILD_S = 1800  # the image from nothing: base images, pip and Go downloads


def _prerequisites() -> None:
    ensure_real_node_toolchain()
    # The image of this checkout (hack/build-image.sh: cached, quick when nothing changed);
    # NEURONETES_E2E_BUILD=0 takes the archive as it is.
    if os.environ.get("NEURONETES_E2E_BUILD", "1") != "0":
        built = subprocess.run(
            ["bash", str(REPO_ROOT / "hack" / "build-image.sh")],
            capture_output=True,
            text=True,
            timeout=BUILD_S,
            check=False,
        )
        if built.returncode != 0:
            pytest.fail(f"hack/build-image.sh failed: {built.stderr.strip()[-300:]}")
    if not FAKE_NVML.exists():
        build_shim(str(FAKE_NVML))
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
