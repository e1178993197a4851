"""A workstation daemon for the tests: a real ``neuronetes-agent --workstation`` process on the
simulated GPU backend, with the fake CUDA driver (node-agent/shim/fake) as its checkpoint API and as
the jobs' GPU, and the fake NVML read in-process as the oracle of GPU memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from shim_build import BUILD, SHIM, build

from neuronetes.cli import main as cli_main
from neuronetes_agent.workstation import client, containment
from neuronetes_agent.workstation import protocol as p

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "fixtures" / "workstation" / "gpu_job.py"
FAKE = BUILD / "release" / "fake"
MIB = 1 << 20


def fake_driver() -> tuple[Path, Path]:
    """The fake libcuda.so.1 and libnvidia-ml.so.1 (built on demand)."""
    cuda, nvml = FAKE / "libcuda.so.1", FAKE / "libnvidia-ml.so.1"
    build(str(cuda), str(nvml))
    assert cuda.is_file() and nvml.is_file(), f"not built under {SHIM}"
    return cuda, nvml


class FakeGpuMemory:
    """Device memory as the fake driver accounts it (the fake NVML over the shared state file)."""

    def __init__(self, nvml_path: Path, tmp: Path) -> None:
        # A copy per test: the library keeps the state file it opened first in a static, and a
        # second dlopen of the same path would return that instance (another test's GPU).
        copy = tmp / "libnvidia-ml.so.1"
        shutil.copyfile(nvml_path, copy)
        self.lib = ctypes.CDLL(str(copy))
        assert self.lib.nvmlInit_v2() == 0

    def used(self) -> int:
        class Memory(ctypes.Structure):
            _fields_ = [
                ("total", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong),
            ]

        handle = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
        mem = Memory()
        assert self.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == 0
        return int(mem.used)


class Daemon:
    """One daemon process over a state directory; `kill` (SIGKILL) and `start` again at will."""

    def __init__(self, tmp: Path, *extra: str, cuda_driver: Path | None = None) -> None:
        self.state_dir = tmp / "state"
        self.extra = extra
        cuda, nvml = fake_driver()
        self.cuda_driver = cuda_driver or cuda
        fake_state = tmp / "fake-gpu.state"
        os.environ["FAKE_CUDA_STATE"] = str(fake_state)  # read by the fake NVML in this process
        self.env = {
            **os.environ,
            "FAKE_CUDA_STATE": str(fake_state),
            "FAKE_LIBCUDA": str(cuda),
            "FAKE_CUDA_MEM_BYTES": str(80 << 30),
        }
        self.memory = FakeGpuMemory(nvml, tmp)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / "daemon.log"
        self.runs = tmp / "runs.log"

    def start(self) -> None:
        argv = [
            sys.executable,
            "-c",
            "from neuronetes.cli.agent import agent_main; raise SystemExit(agent_main())",
            "--workstation",
            "--state-dir",
            str(self.state_dir),
            "--simulate-gpus",
            "1",
            "--cuda-driver",
            str(self.cuda_driver),
            *self.extra,
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=log, start_new_session=True)
        wait_for(lambda: client.daemon_live(self.state_dir), "the daemon answers", timeout=20)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

    def call(self, request: Any) -> Any:
        reply = client.call(self.state_dir, request)
        assert isinstance(reply, p.Ok), f"{request}: {reply}"
        return reply.result

    def submit(
        self, name: str, priority: int, steps: int, *, mib: int = 0, step_s: float = 0.05, **kwargs: Any
    ) -> dict[str, Any]:
        command = f"{sys.executable} {JOB} {steps} --step-s {step_s} --runs {self.runs}" + (
            f" --mib {mib}" if mib else ""
        )
        return dict(self.call(p.Submit(command=command, priority=priority, name=name, **kwargs)))

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.call(p.Describe(job=name)))

    def state(self, name: str) -> str:
        return str(self.job(name)["state"])

    def wait_state(self, name: str, state: str, timeout: float = 15.0) -> dict[str, Any]:
        wait_for(lambda: self.state(name) == state, f"job {name} {state}", timeout, lambda: self.job(name))
        return self.job(name)

    def stdout(self, name: str) -> list[str]:
        return list(self.call(p.Logs(job=name, tail=10_000))["lines"])

    def gpu(self) -> str:
        return str(self.call(p.Status())["gpus"][0]["uuid"])

    def simulate(self, **order: Any) -> None:
        self.call(p.Simulate(gpu=self.gpu(), **order))

    def measured(self, name: str, nbytes: int) -> None:
        """What NVML would list for job `name`'s processes: the simulated backend sees the fake
        driver's memory only when told (a stopped job keeps what it holds)."""
        self.simulate(process={"pid": self.job(name)["pid"], "bytes": nbytes})

    def cli(self, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli_main([*argv, "--state-dir", str(self.state_dir)])
        out, err = capsys.readouterr()
        return code, out, err

    def cli_json(self, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
        code, out, err = self.cli(capsys, *argv, "-o", "json")
        assert code == 0, err
        return json.loads(out)

    def runs_of(self) -> list[str]:
        return self.runs.read_text().splitlines() if self.runs.exists() else []


def wait_for(
    cond: Callable[[], bool], what: str, timeout: float = 15.0, show: Callable[[], Any] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(AssertionError):
            if cond():
                return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f": {show()}" if show else ""))


def process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


@contextlib.contextmanager
def running_daemon(tmp: Path, *extra: str, cuda_driver: Path | None = None) -> Iterator[Daemon]:
    daemon = Daemon(tmp, *extra, cuda_driver=cuda_driver)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        kill_leftovers(daemon.state_dir)


def kill_leftovers(state_dir: Path) -> None:
    """Jobs outlive their daemon on purpose; a test's must not outlive the test (nor their
    cgroups)."""
    needle = b"NEURONETES_JOB_TOKEN="
    jobs_dir = str(state_dir / "jobs").encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            if needle in environ and jobs_dir in environ:
                os.kill(int(entry), signal.SIGKILL)
    for base in containment.base_dirs(state_dir):
        for attempt in [c for c in base.iterdir() if c.is_dir()]:
            deadline = time.monotonic() + 5
            while not containment.remove_cgroup(attempt) and time.monotonic() < deadline:
                containment.kill_cgroup(attempt)
                time.sleep(0.02)
        with contextlib.suppress(OSError):
            base.rmdir()


def peak_rss(pid: int) -> int:
    """A process's peak resident memory (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")
