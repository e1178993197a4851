"""The agent's region writer and reader (node-agent/region.py) against the C shim: same bytes.

The agent creates a region with `create_region`; a CUDA program under the shim (over the fake
driver) allocates through it; the agent reads the shim's slot and totals from the same file,
changes a limit in one store, and the shim's next allocation and report follow it. Then the
process is killed holding memory and the agent reclaims its slot.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from shim_build import build

from neuronetes.agent import region as r

pytestmark = pytest.mark.unit

MIB = 1 << 20
FAKE_GPU0 = "GPU-fa4e0000-0000-4000-8000-000000000000"  # fake_device_uuid(0) in the fake driver


def shimmed(tmp_path: Path, case: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment of test_shim `case` under the shim, over the fake GPU, on tmp_path/region."""
    release = build("release") / "release"
    env = {
        **os.environ,
        "NEURONETES_REGION_PATH": str(tmp_path / "region"),
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
        snap = region.snapshot()
        slots = [i for i, s in enumerate(snap.procs) if s.state == r.SLOT_ACTIVE]
        assert len(slots) == 1
        slot = snap.procs[slots[0]]
        assert slot.container_pid == proc.pid and slot.start_time_ticks > 0
        assert slot.used_bytes[0] == 64 * MIB  # cuMemAlloc_v2 48 MiB + cuMemCreate 16 MiB
        assert snap.devices[0].memory_used_bytes == 64 * MIB == snap.container.memory_used_bytes
        assert snap.devices[0].memory_peak_bytes == 64 * MIB
        # the agent lowers the device limit in one aligned store; the shim follows at once
        region.view.devices[0].memory_limit_bytes = 100 * MIB
        proc.stdin.write("go\n")
        proc.stdin.flush()
        total, free, alloc = proc.stdout.readline().split()[1::2]
        assert (int(total), int(free)) == (100 * MIB, 36 * MIB)
        assert int(alloc) == 2  # CUDA_ERROR_OUT_OF_MEMORY
        assert region.snapshot().devices[0].oom_refusals_total == 1
        # killed holding memory: the agent registers nothing, reclaims the slot, totals drop
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert region.snapshot().devices[0].memory_used_bytes == 64 * MIB  # still charged
        region.reclaim_slot(slots[0])
        snap = region.snapshot()
        assert snap.procs[slots[0]].state == r.SLOT_FREE
        assert snap.devices[0].memory_used_bytes == 0 == snap.container.memory_used_bytes
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
        region.view.container.qos = 0  # a tenant zeroed it: fail closed
    proc = run_case(tmp_path, "refused")
    assert proc.returncode == 0, proc.stderr
    assert "no QoS class" in proc.stderr


@pytest.mark.parametrize("minor", [0, 3])
def test_the_shim_reads_any_minor_version_the_agent_writes(tmp_path: Path, minor: int) -> None:
    with agent_region(tmp_path) as region:
        region.view.header.version_minor = minor
    proc = run_case(tmp_path, "vmm")
    assert proc.returncode == 0, proc.stderr
