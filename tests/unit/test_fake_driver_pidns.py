"""The fake GPU driver across PID namespaces, as GPU pods in containers use it.

Two processes, each pid 1 of its own PID namespace (`unshare --fork --pid --mount-proc`), allocate
through the fake libcuda.so.1 on one FAKE_CUDA_STATE. The fake NVML called from this (the host's)
namespace lists both by their HOST PIDs with their own memory; the checkpoint API finds one by its
host PID. After one exits, the other's in-namespace libcuda and NVML leave the dead one's memory
alone (they cannot see it), and the host's NVML reader frees it while the other keeps its memory.
Needs root and unshare; node-agent/shim/fake/fake_state.h describes the rules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from shim_build import build

pytestmark = pytest.mark.unit

MIB = 1 << 20

# A process under the fake driver: allocates argv[2] MiB through libcuda, then answers commands on
# stdin with one JSON line each: "cuda" (cuMemGetInfo: total - free, after libcuda's own reaping),
# "nvml" (the NVML process list and used memory as this process sees them), "exit".
CLIENT = r"""
import ctypes, json, os, sys
fake = sys.argv[1]
cuda = ctypes.CDLL(os.path.join(fake, "libcuda.so.1"))
nvml = ctypes.CDLL(os.path.join(fake, "libnvidia-ml.so.1"))
assert cuda.cuInit(0) == 0
mib = int(sys.argv[2])
if mib:
    ptr = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20)) == 0

class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2/v3 layout)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

class Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

def answer(cmd):
    if cmd == "cuda":
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
        return {"used": total.value - free.value}
    if cmd == "nvml":
        assert nvml.nvmlInit_v2() == 0
        dev = ctypes.c_void_p()
        assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
        infos, count = (ProcessInfo * 64)(), ctypes.c_uint(64)
        assert nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(count), infos) == 0
        mem = Memory()
        assert nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(mem)) == 0
        return {"procs": sorted([infos[i].pid, infos[i].usedGpuMemory] for i in range(count.value)),
                "used": mem.used}
    if cmd.startswith("ckpt "):
        state = ctypes.c_int(-1)
        rc = cuda.cuCheckpointProcessGetState(int(cmd[5:]), ctypes.byref(state))
        return {"rc": rc, "state": state.value}
    raise SystemExit(0)

print(json.dumps({"pid": os.getpid()}), flush=True)
for line in sys.stdin:
    print(json.dumps(answer(line.strip())), flush=True)
"""


class Client:
    """CLIENT in a process of its own, optionally as pid 1 of a new PID namespace."""

    def __init__(self, fake: Path, state: Path, mib: int, *, namespace: bool) -> None:
        prefix = ["unshare", "--fork", "--pid", "--mount-proc", "--kill-child"] if namespace else []
        env = {**os.environ, "FAKE_CUDA_STATE": str(state)}
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", CLIENT, str(fake), str(mib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.own_pid = self.read()["pid"]
        # unshare forks the client: the host PID is unshare's only child
        self.host_pid = self.child_of(self.proc.pid) if namespace else self.proc.pid

    @staticmethod
    def child_of(pid: int) -> int:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def read(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"client exited: rc={self.proc.poll()}"
        return dict(json.loads(line))

    def ask(self, cmd: str) -> dict[str, object]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.read()

    def exit(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def fake() -> Path:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for PID namespaces")
    probe = subprocess.run(
        ["unshare", "--fork", "--pid", "--mount-proc", "true"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid --mount-proc is refused here: {probe.stderr.decode().strip()}")
    return build("release") / "release" / "fake"


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    started: list[Client] = []
    yield started
    for c in started:
        c.exit()


def test_two_containers_pid_1_each_seen_by_host_pid(
    fake: Path, tmp_path: Path, clients: list[Client]
) -> None:
    state = tmp_path / "gpu"
    a = Client(fake, state, 64, namespace=True)
    clients.append(a)
    b = Client(fake, state, 96, namespace=True)
    clients.append(b)
    assert a.own_pid == b.own_pid == 1  # both collide on pid 1 inside
    reader = Client(fake, state, 0, namespace=False)
    clients.append(reader)

    # the host's reader: both, by host PID, each with its own memory
    seen = reader.ask("nvml")
    assert seen == {
        "procs": [[p, m * MIB] for p, m in sorted([(a.host_pid, 64), (b.host_pid, 96)])],
        "used": 160 * MIB,
    }
    # the checkpoint API takes the caller's PID: the host PID finds B's entry, pid 1 is nobody here
    assert reader.ask(f"ckpt {b.host_pid}") == {"rc": 0, "state": 0}
    assert reader.ask("ckpt 1")["rc"] != 0
    # inside B: only B, as pid 1
    assert b.ask("nvml") == {"procs": [[1, 96 * MIB]], "used": 160 * MIB}

    a.exit()
    # B's libcuda and NVML cannot see A's namespace: they must not free its memory
    assert b.ask("cuda") == {"used": 160 * MIB}
    assert b.ask("nvml") == {"procs": [[1, 96 * MIB]], "used": 160 * MIB}
    # the host's reader (an ancestor: it saw A) finds A gone and frees it; B keeps its memory
    assert reader.ask("nvml") == {"procs": [[b.host_pid, 96 * MIB]], "used": 96 * MIB}
    assert b.ask("cuda") == {"used": 96 * MIB}

    b.exit()
    assert reader.ask("nvml") == {"procs": [], "used": 0}


def test_host_process_and_container_side_by_side(fake: Path, tmp_path: Path, clients: list[Client]) -> None:
    # a host process and a container process share the account; each libcuda reaps only its own
    # namespace, and the container's pid 1 is not confused with the host's pid 1 (init)
    state = tmp_path / "gpu"
    host = Client(fake, state, 32, namespace=False)
    clients.append(host)
    box = Client(fake, state, 16, namespace=True)
    clients.append(box)
    assert host.ask("nvml") == {
        "procs": [[p, m * MIB] for p, m in sorted([(host.host_pid, 32), (box.host_pid, 16)])],
        "used": 48 * MIB,
    }
    assert box.ask("nvml") == {"procs": [[1, 16 * MIB]], "used": 48 * MIB}
    box.exit()
    assert host.ask("cuda") == {"used": 48 * MIB}  # libcuda never judges another namespace
    assert host.ask("nvml") == {"procs": [[host.host_pid, 32 * MIB]], "used": 32 * MIB}
