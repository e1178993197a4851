"""A workstation daemon for a check: started as a user starts it, driven through the ``neuronetes`` CLI.

On a GPU the daemon reads the real GPU through NVML; in fake mode it runs on one simulated GPU
(``--simulate-gpus 1``) with the fake driver's checkpoint API, and the fake driver is told the
simulated GPU's UUID (``FAKE_CUDA_UUIDS``) so the regions the daemon writes for its jobs match the
device the shim finds. Jobs inherit the daemon's environment, as they would on a workstation.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..context import Context

__all__ = ["Workstation", "WorkstationError"]

FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
SOCKET_PATH_LIMIT = 100  # bytes; a Unix socket path may have 107 (the daemon refuses a deeper one)


class WorkstationError(RuntimeError):
    """The daemon or the CLI did not do what the check needs (the message says what)."""


def simulated_gpu_uuid() -> str:
    """The UUID of the daemon's one simulated GPU (``--simulate-gpus 1``)."""
    from neuronetes_agent.workstation.gpus import open_backend

    backend, _ = open_backend(1)
    try:
        return str(backend.scan().gpus[0].uuid)
    finally:
        backend.close()


class Workstation:
    """One daemon over its own state directory (stopped by `stop`, or as a context manager)."""

    def __init__(self, ctx: Context, name: str = "ws") -> None:
        self.ctx = ctx
        self.state_dir = ctx.path(f"{name}-state")
        self._temporary = len(os.fsencode(self.state_dir / "daemon.sock")) > SOCKET_PATH_LIMIT
        if self._temporary:  # a deep output folder: the daemon's socket would not fit a Unix socket path
            self.state_dir = Path(tempfile.mkdtemp(prefix=f"nn-{name}-"))
        self.log = ctx.path(f"{name}-daemon.log")
        self.env = dict(ctx.base_env)
        self.env["NEURONETES_STATE_DIR"] = str(self.state_dir)
        argv = [
            "--workstation",
            "--state-dir",
            str(self.state_dir),
            "--shim-library",
            ctx.shim,
            "--interval",
            "0.1",
        ]
        if ctx.fake:
            self.env["FAKE_CUDA_UUIDS"] = simulated_gpu_uuid()
            argv += ["--simulate-gpus", "1", "--cuda-driver", str(Path(ctx.fake_lib_dir) / "libcuda.so.1")]
        self.proc: subprocess.Popen[bytes] | None = None
        self._argv = [
            ctx.python,
            "-c",
            "from neuronetes.cli.agent import agent_main; raise SystemExit(agent_main())",
            *argv,
        ]

    def __enter__(self) -> Workstation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self._argv, env=self.env, stdout=log, stderr=log, start_new_session=True, cwd=self.ctx.work
            )
        self.wait_for(
            lambda: self.cli("status", "-o", "json", check=False) is not None, "the daemon answers", 30
        )

    def stop(self) -> None:
        """Cancel what still runs, then stop the daemon (SIGTERM; SIGKILL after 15 s)."""
        if self.proc is None:
            return
        try:
            for job in self.jobs():
                if job["state"] not in FINAL:
                    self.cli("jobs", "kill", job["id"], check=False)
        except WorkstationError:
            pass
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None
        self.ctx.append_log("workstation daemon", self.log.read_text(errors="replace")[-20000:], "")
        for logs in sorted((self.state_dir / "jobs").glob("*/std*.log")):
            self.ctx.append_log(
                f"workstation job {logs.parent.name} {logs.name}", logs.read_text(errors="replace"), ""
            )
        if self._temporary:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    # ---- the CLI

    def cli(self, *args: str, check: bool = True) -> Any:
        """``neuronetes ARGS`` (with ``-o json``): the parsed output; None when it failed and not `check`."""
        proc = subprocess.run(
            [self.ctx.python, "-m", "neuronetes.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.ctx.work,
        )
        if proc.returncode != 0:
            if check:
                raise WorkstationError(f"neuronetes {' '.join(args)}: {proc.stderr.strip()[-300:]}")
            return None
        try:
            return json.loads(proc.stdout)
        except ValueError:
            if check:
                raise WorkstationError(
                    f"neuronetes {' '.join(args)}: no JSON: {proc.stdout[-300:]}"
                ) from None
            return None

    def submit(self, name: str, command: Sequence[str], priority: int, *options: str) -> dict[str, Any]:
        cmd = " ".join(_quote(a) for a in command)
        job: dict[str, Any] = self.cli(
            "submit", "--cmd", cmd, "--priority", str(priority), "--name", name, *options, "-o", "json"
        )
        return job

    def measured(self, pid: int, nbytes: int) -> None:
        """Fake mode: tell the daemon's simulated GPU what the fake's NVML lists for `pid` (on a GPU
        the daemon reads NVML's process list itself; the simulated backend knows only what it is told)."""
        from neuronetes_agent.workstation import client
        from neuronetes_agent.workstation import protocol as p

        gpu = self.env["FAKE_CUDA_UUIDS"]
        reply = client.call(
            self.state_dir, p.Simulate(gpu=gpu, process=p.SimulatedProcess(pid=pid, bytes=nbytes))
        )
        if not isinstance(reply, p.Ok):
            raise WorkstationError(f"the daemon refused the simulated process {pid}: {reply}")

    def job(self, name: str) -> dict[str, Any]:
        job: dict[str, Any] = self.cli("jobs", "describe", name, "-o", "json")
        return job

    def jobs(self) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = self.cli("jobs", "list", "--all", "-o", "json")
        return jobs

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.cli("status", "-o", "json")
        return status

    def stdout(self, name: str) -> str:
        path = self.job(name).get("logs", {}).get("stdout")
        try:
            return Path(path).read_text(errors="replace") if path else ""
        except OSError:
            return ""

    def wait_state(self, name: str, states: Iterable[str], timeout: float) -> dict[str, Any]:
        """Poll the job until it is in one of `states`. A CLI call that fails meanwhile (the daemon is
        busy, e.g. checkpointing a large job, and does not answer within the CLI's time) is retried."""
        wanted = set(states)
        found: dict[str, Any] = {}

        def reached() -> bool:
            nonlocal found
            job = self.cli("jobs", "describe", name, "-o", "json", check=False)
            if isinstance(job, dict):
                found = job
            return found.get("state") in wanted

        try:
            self.wait_for(reached, f"job {name} {'/'.join(sorted(wanted))}", timeout)
        except WorkstationError as exc:
            raise WorkstationError(f"{exc}; it is {found.get('state')}: {found.get('reason')}") from None
        return found

    def wait_for(self, cond: Callable[[], bool], what: str, timeout: float) -> float:
        """Poll `cond` every 50 ms; the seconds it took. Raises WorkstationError at `timeout`."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
                raise WorkstationError(f"the daemon exited ({self.proc.returncode}): {' | '.join(tail)}")
            if cond():
                return time.monotonic() - started
            time.sleep(0.05)
        raise WorkstationError(f"timed out after {timeout:.0f} s waiting for {what}")


def _quote(arg: str) -> str:
    """Words the daemon runs directly (no shell syntax), so the job's program is the shepherd's child."""
    if not arg or any(c in arg for c in " \t'\"\\$`;&|<>()*?[]#~{}"):
        raise WorkstationError(f"argument {arg!r} would need a shell")
    return arg


def pid_of_ready(text: str) -> int | None:
    """The PID a job printed as ``READY <pid>``."""
    for line in text.splitlines():
        if line.startswith("READY "):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def os_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
