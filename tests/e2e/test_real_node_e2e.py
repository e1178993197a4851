"""A real node: `neuronetes dev cluster up --real-nodes 1` runs a kubelet and containerd (+ runc).

A pod with the local busybox image runs on ``real-0`` to Completed and ``kubectl logs`` shows its
output; a pod with a network namespace of its own gets a pod IP. ``dev cluster down`` leaves no
process, mount or cgroup of the node, also when the CLI that started it was SIGKILLed half-way.
Needs root and Debian's runc, containernetworking-plugins and busybox-static
(hack/install-node-packages.sh): skipped without them.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import STARTED, ensure_real_node_toolchain, track, wait_until

from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.realnodes import BUSYBOX_IMAGE, CGROUP_FS

pytestmark = pytest.mark.e2e

NAME = f"e2e-real-node-{os.getpid()}"  # parallel sessions do not share a cluster


def _cli(*args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "neuronetes.cli", "dev", "cluster", *args, "--name", NAME],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


UP = ("up", "--direct", "--no-agent", "--no-operator", "--no-extender", "--real-nodes", "1")


def _leftovers(dev: DevCluster) -> list[str]:
    """Processes, mounts and cgroups of the cluster's real nodes still on the machine."""
    found = [f"process {pid}" for pid in dev.leftover_processes()]
    marker = str(dev.state_dir)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            groups = Path(entry.path, "cgroup").read_text()
        except OSError:
            continue
        if marker in argv or f"/neuronetes/{NAME}/" in groups:
            found.append(f"process {entry.name}: {argv[:120]}")
    found += [
        f"mount {line.split()[4]}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if marker in line
    ]
    found += [
        f"cgroup {h}"
        for h in [*CGROUP_FS.glob(f"*/neuronetes/{NAME}"), CGROUP_FS / "neuronetes" / NAME]
        if h.is_dir()
    ]
    return found


@pytest.fixture(scope="module")
def dev(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    ensure_real_node_toolchain()
    cluster = DevCluster(NAME)
    STARTED.append(cluster)
    cluster.down()
    yield cluster
    cluster.down()
    assert _leftovers(cluster) == []
    if request.session.testsfailed == 0:
        cluster.purge()  # its logs stay for a failed run


def test_down_after_the_cli_is_sigkilled_leaves_nothing(dev: DevCluster) -> None:
    cli = subprocess.Popen(
        [sys.executable, "-m", "neuronetes.cli", "dev", "cluster", *UP, "--name", NAME],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Kill the CLI once the node runs: its pid recorded (pids/ exists only in a live run),
        # then the kubelet started (its folder is rendered afresh before the node is spawned).
        node_dir = dev.state_dir / "real-nodes" / "real-0"
        wait_until(
            lambda: (
                (
                    (dev.state_dir / "pids" / "node-real-0.pid").exists()
                    and (node_dir / "kubelet.log").exists()
                )
                or cli.poll() is not None
            ),
            timeout=120,
            what="the real node's kubelet to start",
        )
        assert cli.poll() is None, "the CLI ended before it could be killed"
        cli.send_signal(signal.SIGKILL)
    finally:
        cli.wait()
    track(dev)
    assert _leftovers(dev), "the node should still run after the CLI died"
    down = _cli("down")
    assert down.returncode == 0, down.stderr
    assert "node-real-0" in down.stderr
    assert _leftovers(dev) == []


def test_pod_runs_on_the_real_node_and_kubectl_logs_shows_it(dev: DevCluster) -> None:
    t0 = time.monotonic()
    up = _cli(*UP)
    assert up.returncode == 0, up.stderr
    track(dev)
    nodes = json.loads(dev.kubectl("get", "node", "real-0", "-o", "json").stdout)
    ready = {c["type"]: c["status"] for c in nodes["status"]["conditions"]}
    assert ready["Ready"] == "True", ready
    assert nodes["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    up_s = time.monotonic() - t0

    for pod, host_network in (("hello-host-net", True), ("hello-own-net", False)):
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": "default"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "real-0"},
                "hostNetwork": host_network,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": BUSYBOX_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": [
                            "sh",
                            "-c",
                            "echo hello from $(hostname) on a real node; cat /proc/1/cgroup",
                        ],
                    }
                ],
            },
        }
        dev.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    for pod in ("hello-host-net", "hello-own-net"):
        phase = wait_until(
            lambda p=pod: (  # type: ignore[misc]
                dev.kubectl("get", "pod", p, "-o", "jsonpath={.status.phase}").stdout
                in ("Succeeded", "Failed")
                and dev.kubectl("get", "pod", p, "-o", "jsonpath={.status.phase}").stdout
            ),
            timeout=90,
            what=f"pod {pod} to finish",
        )
        assert phase == "Succeeded", dev.kubectl("describe", "pod", pod).stdout
    logs = dev.kubectl("logs", "hello-own-net").stdout
    assert "hello from hello-own-net on a real node" in logs
    if not (CGROUP_FS / "cgroup.controllers").exists():
        # cgroup v1 (no cgroup namespace): the container's cgroup is under the node's cgroup root.
        assert f"/neuronetes/{NAME}/real-0/kubepods/" in logs
    assert "on a real node" in dev.kubectl("logs", "hello-host-net").stdout
    own_ip = dev.kubectl("get", "pod", "hello-own-net", "-o", "jsonpath={.status.podIP}").stdout
    assert own_ip.startswith("10.244.0."), own_ip
    assert dev.kubectl("get", "pod", "hello-host-net", "-o", "jsonpath={.status.podIP}").stdout == "127.0.0.1"
    # Only the API server's client certificate opens the kubelet: an anonymous caller gets 401.
    port = json.loads((dev.state_dir / "state.json").read_text())["ports"]["kubelet-real-0"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(
            f"https://127.0.0.1:{port}/pods", context=ssl._create_unverified_context(), timeout=10
        )
    assert refused.value.code == 401
    print(f"cluster with a real node up in {up_s:.1f} s")

    down = _cli("down")
    assert down.returncode == 0, down.stderr
    assert _leftovers(dev) == []
