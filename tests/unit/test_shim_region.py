"""The agent's region writer and reader (`neuronetes_agent.region`) against the C shim: same bytes.

The agent creates a region with `create_region`; a CUDA program under the shim (over the fake
driver) allocates through it; the agent reads the shim's slot and totals from the state file,
changes a limit in its control file in one store, and the shim's next allocation and report follow
it. Then the process is killed holding memory; the agent registers its host PID, orders the
reclaim once the driver shows the memory released, and the next shim process that takes the lock
frees the slot. The shim refuses a region of the old major version, and a region the environment
names where one exists at the default path.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import pytest
from shim_build import build, skip_outside_ci

from neuronetes_agent import region as r

pytestmark = pytest.mark.unit

MIB = 1 << 20
FAKE_GPU0 = "GPU-fa4e0000-0000-4000-8000-000000000000"  # fake_device_uuid(0) in the fake driver


def shimmed(tmp_path: Path, case: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment of test_shim `case` under the shim, over the fake GPU, on tmp_path/region."""
    release = build("release") / "release"
    env = {
        **os.environ,
        "NEURONETES_REGION_DIR": str(tmp_path / "region"),
        "FAKE_CUDA_STATE": str(tmp_path / "gpu"),
        "LD_LIBRARY_PATH": str(release / "fake"),
        "LD_PRELOAD": str(release / "lib" / "libneuronetes-cuda.so"),
    }
    return [str(release / "test_shim"), case, str(tmp_path / "region")], env


def run_case(tmp_path: Path, case: str) -> subprocess.CompletedProcess[str]:
    argv, env = shimmed(tmp_path, case)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def agent_region(tmp_path: Path, **kw: object) -> r.Region:
    device = r.DeviceLimit(FAKE_GPU0, 128 * MIB, 80 << 30)
    return r.create_region(tmp_path / "region", [device], admitted=True, **kw)  # type: ignore[arg-type]


def test_agent_region_drives_the_shim(tmp_path: Path) -> None:
    region = agent_region(tmp_path, container_name="trainer")
    argv, env = shimmed(tmp_path, "agent")
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        snap = region.read_state()
        slots = [i for i, s in enumerate(snap.procs) if s.state == r.SLOT_ACTIVE]
        assert len(slots) == 1
        slot = snap.procs[slots[0]]
        assert slot.container_pid == proc.pid and slot.start_time_ticks > 0
        assert slot.used_bytes[0] == 64 * MIB  # cuMemAlloc_v2 48 MiB + cuMemCreate 16 MiB
        assert snap.devices[0].memory_used_bytes == 64 * MIB == snap.usage.memory_used_bytes
        assert snap.devices[0].memory_peak_bytes == 64 * MIB
        # the agent lowers the device limit in one aligned store; the shim follows at once
        region.control.devices[0].memory_limit_bytes = 100 * MIB
        proc.stdin.write("go\n")
        proc.stdin.flush()
        total, free, alloc = proc.stdout.readline().split()[1::2]
        assert (int(total), int(free)) == (100 * MIB, 36 * MIB)
        assert int(alloc) == 2  # CUDA_ERROR_OUT_OF_MEMORY
        assert region.read_state().devices[0].oom_refusals_total == 1
        # killed holding memory: registered (one PID namespace here), then the driver releases it
        region.set_host_pid(slots[0], proc.pid, slot.claim_seq, slot.start_time_ticks)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert region.read_state().devices[0].memory_used_bytes == 64 * MIB  # still charged
        region.order_reclaim(slots[0], slot.claim_seq)
        assert region.read_state().devices[0].memory_used_bytes == 64 * MIB  # until a shim locks
        # the next process of the container applies the order at its first lock (its claim), so
        # its own accounting starts from zero under the full limit again
        region.control.devices[0].memory_limit_bytes = 128 * MIB
        argv, env = shimmed(tmp_path, "vmm")
        env["FAKE_CUDA_STATE"] = str(tmp_path / "gpu-after")  # the driver's own account, afresh
        vmm = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
        assert vmm.returncode == 0, vmm.stderr
        snap = region.read_state()
        assert snap.procs[slots[0]].state == r.SLOT_FREE or snap.procs[slots[0]].claim_seq != slot.claim_seq
        assert snap.usage.reclaim_generation_seen == region.control.container.reclaim_generation == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        region.close()


def test_a_python_region_without_a_qos_is_refused_by_the_shim(tmp_path: Path) -> None:
    with agent_region(tmp_path) as region:
        region.control.container.qos = 0  # fail closed
    proc = run_case(tmp_path, "refused")
    assert proc.returncode == 0, proc.stderr
    assert "no QoS class" in proc.stderr


@pytest.mark.parametrize("minor", [0, 3])
def test_the_shim_reads_any_minor_version_the_agent_writes(tmp_path: Path, minor: int) -> None:
    with agent_region(tmp_path) as region:
        region.control.header.version_minor = minor
    proc = run_case(tmp_path, "vmm")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", [r.CONTROL_NAME, r.STATE_NAME])
def test_the_shim_refuses_a_region_of_the_old_major_version(tmp_path: Path, name: str) -> None:
    agent_region(tmp_path).close()
    path = tmp_path / "region" / name
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, r.field_offset(r.NnFileHeader, "version_major"), 1)
    path.write_bytes(bytes(data))
    proc = run_case(tmp_path, "refused")  # cuInit, an allocation and a launch: all refused
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines  # one line, once, for the whole process
    assert f"{name} file: region version 1.0 is not readable by this shim (major 2)" in lines[0]
    assert "CUDA is refused" in lines[0]


def test_the_environment_cannot_move_the_region_in_a_container(tmp_path: Path) -> None:
    """In a container a region exists at /run/neuronetes (the NRI plugin's mounts): a
    NEURONETES_REGION_DIR naming a tenant-made region with a larger limit is ignored. A private
    user and mount namespace (unshare) puts a tmpfs over /run for the shimmed process only."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], check=False).returncode:
        skip_outside_ci("unshare -rm (user and mount namespaces) is not available")
    device = r.DeviceLimit(FAKE_GPU0, 128 * MIB, 80 << 30)
    r.create_region(tmp_path / "default", [device], admitted=True).close()
    big = r.DeviceLimit(FAKE_GPU0, 1 << 30, 80 << 30)
    r.create_region(tmp_path / "region", [big], admitted=True).close()  # where the environment points
    argv, env = shimmed(tmp_path, "env")
    preload = env.pop("LD_PRELOAD")
    env["NEURONETES_REGION_PATH"] = str(tmp_path / "region")  # the major-1 name: ignored as well
    script = (
        "mount -t tmpfs nn-test /run && mkdir /run/neuronetes && "
        'cp -p "$1"/control "$1"/state /run/neuronetes/ && '
        'shift && exec env LD_PRELOAD="$1" "$2" "$3" /run/neuronetes'
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(tmp_path / "default"), preload, argv[0], "env"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    # test_shim's env case: the device reports 128 MiB and a 100 MiB allocation fits; with the
    # environment's region it would report 1 GiB
    assert proc.returncode == 0, proc.stderr
