"""Real dev-cluster nodes, the pure half: the local OCI images and the files a node is started from."""

from __future__ import annotations

import dataclasses
import json
import tarfile
from pathlib import Path

import pytest

from neuronetes.devcluster import realnodes
from neuronetes.devcluster.localimages import BUSYBOX, busybox_image, pause_image, write_oci_archive
from neuronetes.devcluster.realchart import NodeExtras, chart_node_extras
from neuronetes.devcluster.tools import Toolchain
from neuronetes_agent.daemon.inventory import driver_files_from_cdi

pytestmark = pytest.mark.unit

needs_busybox = pytest.mark.skipif(
    not BUSYBOX.exists(), reason=f"no {BUSYBOX} (Debian package busybox-static)"
)


@needs_busybox
def test_oci_archive_is_reproducible_and_names_both_images(tmp_path: Path) -> None:
    images = [pause_image("t"), busybox_image("t")]
    a = write_oci_archive(images, tmp_path / "a.tar").read_bytes()
    b = write_oci_archive(images, tmp_path / "b.tar").read_bytes()
    assert a == b
    with tarfile.open(tmp_path / "a.tar") as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        names = set(tar.getnames())
    refs = [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]
    assert refs == ["neuronetes.local/pause:t", "neuronetes.local/busybox:t"]
    assert all(f"blobs/sha256/{m['digest'].removeprefix('sha256:')}" in names for m in index["manifests"])


@needs_busybox
def test_render_writes_a_node_that_keeps_off_the_host(tmp_path: Path) -> None:
    files = realnodes.NodeFiles("real-0", 0, tmp_path / "real-nodes" / "real-0", 40001, 40002)
    realnodes.render(tmp_path, "c1", files, Toolchain.pinned(), tmp_path / "kubeconfig", 6443, NodeExtras())
    kubelet = json.loads((files.folder / "kubelet.yaml").read_text())
    assert kubelet["failCgroupV1"] is False  # this machine's cgroups are v1 (hybrid)
    assert kubelet["cgroupRoot"] == "/neuronetes/c1/real-0"
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    assert kubelet["authentication"]["x509"]["clientCAFile"] == str(
        tmp_path / "pki" / "kubelet-client" / "ca.crt"
    )
    assert kubelet["makeIPTablesUtilChains"] is False and kubelet["protectKernelDefaults"] is True
    assert (kubelet["address"], kubelet["port"], kubelet["healthzPort"]) == ("127.0.0.1", 40001, 40002)
    containerd = (files.folder / "containerd.toml").read_text()
    assert f"sandbox = '{realnodes.PAUSE_IMAGE}'" in containerd
    assert "socket_path = '/var/run/nri/nri.sock'" in containerd  # in the node's private /run
    assert "/etc/" not in containerd and "/opt/" not in containerd  # every path is the node's own
    sysctls = {p.name: p.read_text().strip() for p in (files.folder / "sysctl").iterdir()}
    assert sysctls == {k: str(v) for k, v in realnodes.KUBELET_SYSCTLS.items()}
    conflist = json.loads((files.folder / "cni" / "10-pod-netns.conflist").read_text())
    assert [p["type"] for p in conflist["plugins"]] == ["loopback", realnodes.POD_NET_PLUGIN.name]
    # In-cluster clients reach the API server at the `kubernetes` Service through the plugin's relay.
    assert conflist["plugins"][1]["apiServer"] == {
        "serviceIP": "10.0.0.1",
        "port": 443,
        "target": "127.0.0.1:6443",
    }
    env = (files.folder / "kubelet.env").read_text()
    assert "NODE_LABELS='dev.neuronetes.io/real-node=true'" in env
    assert "STAND_IN_DEVICES=''" in env and "FAKE_GPU_DIR=''" in env  # not a GPU node
    assert not any((files.folder / "run").iterdir())
    assert kubelet["registerWithTaints"] == []
    assert [p.name for p in (files.folder / "images").iterdir()] == ["0-local.tar"]
    assert realnodes.node_argv(files.folder)[:5] == ["unshare", "--fork", "--pid", "--mount-proc", "--mount"]


@needs_busybox
def test_render_in_chart_mode_makes_a_tainted_gpu_node_with_the_image(tmp_path: Path) -> None:
    archive = tmp_path / "neuronetes-0.1.0.oci.tar"
    archive.write_bytes(b"")
    extras = chart_node_extras()
    fake = {rel: tmp_path / Path(rel).name for rel, src in extras.run_files.items() if isinstance(src, Path)}
    for path in fake.values():
        path.write_bytes(b"fake driver library")
    extras = dataclasses.replace(extras, archives=[archive], run_files={**extras.run_files, **fake})
    files = realnodes.NodeFiles("real-0", 0, tmp_path / "real-nodes" / "real-0", 40001, 40002)
    realnodes.render(tmp_path, "c1", files, Toolchain.pinned(), tmp_path / "kubeconfig", 6443, extras)
    kubelet = json.loads((files.folder / "kubelet.yaml").read_text())
    assert kubelet["registerWithTaints"] == [
        {"key": "dev.neuronetes.io/real-node", "value": "true", "effect": "NoSchedule"}
    ]
    env = (files.folder / "kubelet.env").read_text()
    assert "NODE_LABELS='dev.neuronetes.io/real-node=true,nvidia.com/gpu.present=true'" in env
    # The driver's device nodes with NVIDIA's numbers, made in the node's own /dev.
    devices = "/dev/nvidiactl:195:255 /dev/nvidia-uvm:508:0 /dev/nvidia-uvm-tools:508:1 /dev/nvidia0:195:0"
    assert f"STAND_IN_DEVICES='{devices}'" in env
    assert "FAKE_GPU_DIR='/mnt/neuronetes-fake-gpu'" in env
    # The node's /run: the fake driver where NVIDIA's GPU operator puts a driver, and its CDI spec.
    run = files.folder / "run"
    libs = run / "nvidia" / "driver" / "usr" / "lib" / "x86_64-linux-gnu"
    assert sorted(p.name for p in libs.iterdir()) == ["libcuda.so.1", "libnvidia-ml.so.1"]
    spec = json.loads((run / "cdi" / "nvidia.yaml").read_text())
    assert spec["kind"] == "nvidia.com/gpu" and [d["name"] for d in spec["devices"]] == ["0"]
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    driver = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu"
    assert mounts == {
        f"/usr/lib/x86_64-linux-gnu/{lib}": f"{driver}/{lib}" for lib in ("libcuda.so.1", "libnvidia-ml.so.1")
    }
    # What the agent reads of it is what a GPU container gets mounted.
    files_from_cdi = driver_files_from_cdi((run / "cdi" / "nvidia.yaml",))
    assert {target for _, target in files_from_cdi.mounts} == set(mounts)
    images = sorted((files.folder / "images").iterdir())
    assert [p.name for p in images] == ["0-local.tar", "1-neuronetes-0.1.0.oci.tar"]
    assert images[1].resolve() == archive
