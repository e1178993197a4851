"""The node inventory file the agent writes for the NRI plugin (docs/contracts.md, "The node
inventory file"), and the shim installation it names.

The cross-language check runs the plugin's own strict reader (`node-agent/nri/inventory`, through
`node-agent/nri/cmd/inventory-check`) on what the Python agent wrote: the test fails when the Go
side refuses it. Without `go` that half is skipped locally and FAILS under CI=true.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from nri_tools import build_nri_tool
from shim_build import build

from neuronetes import contracts as c
from neuronetes.profiles import PROFILES
from neuronetes_agent.daemon import inventory as inv
from neuronetes_agent.daemon.fleet import AgentProcess, AgentSettings
from neuronetes_agent.daemon.node import NodeAgent
from neuronetes_agent.daemon.simulated import SimulatedGpus

pytestmark = pytest.mark.unit

# The smallest ELF64 header of a shared object (e_type ET_DYN): what install_shim checks.
FAKE_SO = b"\x7fELF\x02\x01\x01" + bytes(9) + (3).to_bytes(2, "little") + bytes(46)


class QuietKube:
    """The API server stand-in: the agent's writes are not what these tests look at."""

    def __init__(self, node: str) -> None:
        self.gpunode: dict[str, Any] = {"metadata": {"name": node, "generation": 1}, "spec": {}}

    def ensure_gpunode(self, node: str, node_uid: str) -> dict[str, Any]:
        return self.gpunode

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: 201


def shim(tmp_path: Path) -> inv.ShimPaths:
    source = tmp_path / "build" / "libneuronetes-cuda.so"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_bytes(FAKE_SO)
    return inv.install_shim(source, tmp_path / "shim")


def writer(tmp_path: Path, node: str, **kw: Any) -> inv.InventoryWriter:
    devices = inv.SimulatedDeviceNodes()
    return inv.InventoryWriter(node, tmp_path / "state", shim(tmp_path), devices, inv.DriverFiles(), **kw)


def run_agent(profile: str, node: str, tmp_path: Path) -> tuple[NodeAgent, SimulatedGpus, dict[str, Any]]:
    sim = SimulatedGpus(PROFILES[profile], node)
    agent = NodeAgent(
        node,
        "uid",
        sim,
        QuietKube(node),
        ThreadPoolExecutor(1),
        agent_version="t",
        inventory_file=writer(tmp_path, node),
    )
    agent.start()
    return agent, sim, json.loads((tmp_path / "state" / inv.INVENTORY_FILE).read_text())


@pytest.fixture(scope="session")
def inventory_check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nri_tool("inventory-check", tmp_path_factory.mktemp("go"))


def go_check(exe: Path, path: Path, node: str) -> str:
    out = subprocess.run([str(exe), str(path), node], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # the plugin refused what the agent wrote
    return out.stdout


@pytest.mark.parametrize("profile", ["dgx-a100-80gb", "a100-40gb-mig"])
def test_go_plugin_reads_what_the_agent_writes(profile: str, tmp_path: Path, inventory_check: Path) -> None:
    _, sim, _ = run_agent(profile, "gpu-node-1", tmp_path)
    instances = sum(len(g.mig_devices) for g in sim.scan().gpus)
    assert (instances > 0) == ("mig" in profile)
    out = go_check(inventory_check, tmp_path / "state" / inv.INVENTORY_FILE, "gpu-node-1")
    assert out.startswith(f"OK node=gpu-node-1 generation=1 gpus=8 migInstances={instances} ")
    sim.close()


def test_document_follows_the_contract(tmp_path: Path) -> None:
    _, sim, doc = run_agent("a100-40gb-mig", "n1", tmp_path)
    assert list(doc) == [
        "version", "node", "generation", "updatedAt", "controlDevices", "gpus", "shim", "driver",
    ]  # fmt: skip
    assert (doc["version"], doc["node"], doc["generation"]) == (1, "n1", 1)
    assert [d["path"] for d in doc["controlDevices"]] == list(inv.CONTROL_DEVICES)
    first = sim.scan().gpus[0]
    g0 = doc["gpus"][0]
    assert g0["uuid"] == first.uuid
    assert g0["device"] == {"path": "/dev/nvidia0", "major": 195, "minor": 0}
    m = g0["migInstances"][0]
    assert (m["uuid"], m["profile"], m["start"]) == (
        first.mig_devices[0].uuid,
        first.mig_devices[0].profile,
        first.mig_devices[0].start,
    )
    assert len(m["caps"]) == 2
    assert all(cap["path"].startswith("/dev/nvidia-caps/nvidia-cap") for cap in m["caps"])
    assert doc["shim"] == {
        "library": str(tmp_path / "shim" / "libneuronetes-cuda.so"),
        "preloadFile": str(tmp_path / "shim" / "ld.so.preload"),
    }
    assert doc["driver"] == {"capabilities": "compute,utility", "mounts": [], "hooks": []}
    sim.close()


def test_write_is_atomic_and_mode_0644(tmp_path: Path) -> None:
    _, sim, _ = run_agent("dgx-a100-80gb", "n0", tmp_path)
    state = tmp_path / "state"
    assert [p.name for p in state.iterdir()] == [inv.INVENTORY_FILE]  # no temporary file left
    assert stat.S_IMODE((state / inv.INVENTORY_FILE).stat().st_mode) == 0o644
    sim.close()


def test_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, sim, before = run_agent("dgx-a100-80gb", "n0", tmp_path)
    path = tmp_path / "state" / inv.INVENTORY_FILE

    def fail(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    sim.apply_mig(sim.scan().gpus[0].uuid, True, {"1g.10gb": 7})
    assert agent.inventory_file is not None
    assert agent.inventory_file.refresh(sim.scan()) is False
    assert json.loads(path.read_text()) == before
    assert [p.name for p in path.parent.iterdir()] == [inv.INVENTORY_FILE]
    sim.close()


def test_generation_continues_from_the_existing_file(tmp_path: Path) -> None:
    now = [0.0]
    w = writer(tmp_path, "n0", clock=lambda: now[0])
    sim = SimulatedGpus(PROFILES["dgx-a100-80gb"], "n0")
    assert w.refresh(sim.scan()) and w.generation == 1
    assert not w.refresh(sim.scan())  # nothing changed, not due
    now[0] += inv.REWRITE_S
    assert w.refresh(sim.scan()) and w.generation == 2  # due: rewritten
    sim.apply_mig(sim.scan().gpus[3].uuid, True, {"7g.80gb": 1})
    assert w.refresh(sim.scan()) and w.generation == 3  # a MIG change: at once
    restarted = writer(tmp_path, "n0")
    assert restarted.refresh(sim.scan())
    doc = json.loads(restarted.path.read_text())
    assert doc["generation"] == 4
    assert doc["gpus"][3]["migInstances"][0]["profile"] == "7g.80gb"
    sim.close()


def test_agent_rewrites_on_mig_change(tmp_path: Path) -> None:
    agent, sim, _ = run_agent("dgx-a100-80gb", "n0", tmp_path)
    agent.mig_targets = {}
    sim.apply_mig(sim.scan().gpus[0].uuid, True, {"1g.10gb": 7})
    agent.inventory = sim.scan()
    agent.tick()
    after = json.loads((tmp_path / "state" / inv.INVENTORY_FILE).read_text())
    assert after["generation"] == 2 and len(after["gpus"][0]["migInstances"]) == 7
    sim.close()


def test_shim_installed_with_its_preload_file(tmp_path: Path) -> None:
    paths = shim(tmp_path)
    assert paths.library.read_bytes() == FAKE_SO
    assert paths.preload_file.read_text() == c.SHIM_LIBRARY_PATH + "\n"
    assert stat.S_IMODE(paths.library.stat().st_mode) == 0o644


@pytest.mark.parametrize("content", [None, b"", b"#!/bin/sh\n", FAKE_SO[:16] + (2).to_bytes(2, "little")])
def test_shim_refused_when_missing_or_not_a_shared_object(tmp_path: Path, content: bytes | None) -> None:
    source = tmp_path / "lib.so"
    if content is not None:
        source.write_bytes(content + bytes(64))
    with pytest.raises(inv.ShimError, match="shim library"):
        inv.install_shim(source, tmp_path / "shim")
    assert not (tmp_path / "shim").exists()


@pytest.mark.parametrize("library", ["missing.so", "not-elf.so"])
def test_agent_without_shim_advertises_nothing(tmp_path: Path, library: str) -> None:
    """Fail closed: `agent run --node` stops before any inventory is written (the CLI prints the
    error as its one line), and the GPU backend it opened is closed."""
    (tmp_path / "not-elf.so").write_text("#!/bin/sh\n" * 10)
    state = tmp_path / "state"
    settings = AgentSettings(
        node="n0", state_dir=state, shim_library=tmp_path / library, shim_dir=tmp_path / "shim"
    )
    sim = SimulatedGpus(PROFILES["dgx-a100-80gb"], "n0")
    process = AgentProcess(None, settings, nvml_backend=lambda: sim)
    with pytest.raises(inv.ShimError, match=f"shim library {tmp_path / library}"):
        process.run()
    process.stop()
    assert not state.exists() and not (tmp_path / "shim").exists()
    assert not process.informers and sim._closed


def test_fleet_writes_no_inventory(tmp_path: Path) -> None:
    settings = AgentSettings(simulate_nodes="x=y", state_dir=tmp_path / "state")
    process = AgentProcess(None, settings)
    assert process._inventory_file is None


def test_driver_files_from_cdi_spec(tmp_path: Path, inventory_check: Path) -> None:
    spec = tmp_path / "nvidia.yaml"
    spec.write_text(
        """
cdiVersion: 0.5.0
kind: nvidia.com/gpu
containerEdits:
  mounts:
  - {hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05,
     containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05, options: [ro, nosuid, nodev, bind]}
  - {hostPath: /run/nvidia-persistenced/socket, containerPath: /dev/shm/x}
  - {hostPath: /x, containerPath: /usr/lib/neuronetes/y}
  hooks:
  - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook,
     args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]}
  - {hookName: poststart, path: /bin/true}
  - {hookName: createContainer, path: /bin/x, env: ["not an env entry"]}
  - {hookName: createContainer, path: /bin/x, args: "not a list"}
"""
    )
    files = inv.driver_files_from_cdi((tmp_path / "absent.yaml", spec))
    assert files.mounts == (
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"),
    )
    assert files.doc()["hooks"] == [
        {
            "path": "/usr/bin/nvidia-cdi-hook",
            "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
            "env": [],
        }
    ]
    assert inv.driver_files_from_cdi((tmp_path / "absent.yaml",)) == inv.DriverFiles()
    w = inv.InventoryWriter("n0", tmp_path / "state", shim(tmp_path), inv.SimulatedDeviceNodes(), files)
    assert w.refresh(SimulatedGpus(PROFILES["dgx-a100-80gb"], "n0").scan())
    assert "mounts=1 hooks=1" in go_check(inventory_check, w.path, "n0")


def test_host_device_numbers_from_dev_and_proc(tmp_path: Path, inventory_check: Path) -> None:
    """A real node's numbers: stat of the control nodes, NVML's minor, the driver's /proc files."""
    dev, proc = tmp_path / "dev", tmp_path / "proc"
    dev.mkdir()
    for name, target in zip(inv.CONTROL_DEVICES, ("/dev/null", "/dev/zero", "/dev/full"), strict=True):
        (dev / name.removeprefix("/dev/")).symlink_to(target)
    (proc / "driver").mkdir(parents=True)
    (proc / "devices").write_text("Character devices:\n  1 mem\n195 nvidia\n237 nvidia-caps\n")
    sim = SimulatedGpus(PROFILES["a100-40gb-mig"], "n0")
    for g in sim.scan().gpus:
        for m in g.mig_devices:
            gi = proc / f"driver/nvidia/capabilities/gpu{g.minor}/mig/gi{m.gpu_instance_id}"
            (gi / f"ci{m.compute_instance_id}").mkdir(parents=True)
            (gi / "access").write_text(f"DeviceFileName: x\nDeviceFileMinor: {100 + m.gpu_instance_id}\n")
            (gi / f"ci{m.compute_instance_id}" / "access").write_text("DeviceFileMinor: 7\n")
    devices = inv.HostDeviceNodes(dev, proc)
    assert devices.control()[0] == inv.DeviceNode("/dev/nvidiactl", 1, 3)  # /dev/null's numbers
    w = inv.InventoryWriter("n0", tmp_path / "state", shim(tmp_path), devices, inv.DriverFiles())
    assert w.refresh(sim.scan())
    caps = json.loads(w.path.read_text())["gpus"][0]["migInstances"][0]["caps"]
    assert caps[0]["major"] == 237
    assert caps[1] == {"path": "/dev/nvidia-caps/nvidia-cap7", "major": 237, "minor": 7}
    assert go_check(inventory_check, w.path, "n0").startswith("OK ")
    (proc / "devices").write_text("195 nvidia\n")  # the driver lost its caps device: nothing written
    sim.apply_mig(sim.scan().gpus[0].uuid, True, {"1g.5gb": 7})
    assert not w.refresh(sim.scan())
    assert json.loads(w.path.read_text())["generation"] == 1
    sim.close()


def test_the_built_shim_library_is_accepted(tmp_path: Path) -> None:
    library = build("release") / "release" / "lib" / "libneuronetes-cuda.so"
    paths = inv.install_shim(library, tmp_path / "shim")
    assert paths.library.read_bytes() == library.read_bytes()
