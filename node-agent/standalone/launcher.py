"""Starting jobs as real processes, and finding, signalling and reaping them.

Each attempt runs under a shepherd (`shepherd`) in a new session, so the job is one process group
whose leader's PID and ``/proc`` start time identify it across daemon restarts. stdout and stderr
go to ``<state>/jobs/<id>/stdout.log`` / ``stderr.log``. The job gets its GPUs through
``CUDA_VISIBLE_DEVICES`` (UUIDs) and its limits through the shim's workstation-mode contract
(docs/shim.md): a standalone region (its control and state files) in ``NEURONETES_REGION_DIR`` plus
``CUDA_DEVICE_MEMORY_LIMIT`` and ``CUDA_DEVICE_SM_LIMIT``; with ``--shim-library`` the shim is
preloaded (``LD_PRELOAD``). The shim takes the directory from the environment only where no region
exists at its default path, as on a workstation (it never does in a container).
The job's own variables are in docs/workstation.md ("Job environment").
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from neuronetes.agent import region as shim
from neuronetes.agent.daemon.hostpids import start_ticks

from .gpus import GpuView
from .jobs import Job

__all__ = ["Launcher", "Started", "alive", "command_argv", "find_token", "group_members", "kill_group"]

_PROC: Final = Path("/proc")
SHEPHERD: Final = "neuronetes.agent.standalone.shepherd"
_SHELL_SYNTAX: Final = frozenset("|&;<>()$`\\*?[]#~{}\n")


def alive(pid: int, ticks: int) -> bool:
    """The process `pid` exists, is no zombie and started at `ticks` (not a reused PID)."""
    if pid <= 0 or start_ticks(_PROC, pid) != ticks:
        return False
    try:
        stat = (_PROC / str(pid) / "stat").read_text(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] != "Z"


def _pids() -> Iterator[int]:
    for entry in os.listdir(_PROC):
        if entry.isdigit():
            yield int(entry)


def command_argv(command: str) -> list[str]:
    """The job's argv: the words themselves when the command uses no shell syntax (so the program is
    the shepherd's child and gets SIGUSR1 itself), else ``/bin/sh -c COMMAND``."""
    try:
        words = shlex.split(command) if not _SHELL_SYNTAX.intersection(command) else []
    except ValueError:  # unbalanced quotes: the shell reports it
        words = []
    if words and "=" not in words[0]:
        return words
    return ["/bin/sh", "-c", command]


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid`, leader first."""
    out: list[int] = []
    for pid in _pids():
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pgid:
                out.append(pid)
    return sorted(out, key=lambda p: (p != pgid, p))


def find_token(token: str) -> int | None:
    """The process whose environment holds ``NEURONETES_JOB_TOKEN=token`` (a launch the daemon
    did not get to record), or None."""
    needle = f"NEURONETES_JOB_TOKEN={token}".encode()
    for pid in _pids():
        with contextlib.suppress(OSError):
            if needle in (_PROC / str(pid) / "environ").read_bytes().split(b"\0"):
                return pid
    return None


@dataclass(frozen=True, slots=True)
class Started:
    pid: int
    pid_start: int
    token: str


class Launcher:
    """Starts attempts and keeps the handles of the processes this daemon started."""

    def __init__(self, state_dir: Path, shim_library: Path | None = None) -> None:
        self.root = state_dir / "jobs"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.shim_library = shim_library
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def job_dir(self, job_id: str) -> Path:
        return self.root / job_id

    def exit_file(self, job: Job) -> Path:
        return self.job_dir(job.id) / f"exit-{job.attempt}"

    def new_token(self, job: Job) -> str:
        return f"{job.id}.{job.attempt}.{secrets.token_hex(4)}"

    def environment(self, job: Job, gpus: Sequence[GpuView], token: str) -> dict[str, str]:
        d = self.job_dir(job.id)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURONETES_", "CUDA_DEVICE_"))}
        env.update(
            CUDA_VISIBLE_DEVICES=",".join(g.uuid for g in gpus),
            NEURONETES_JOB_ID=job.id,
            NEURONETES_JOB_NAME=job.name,
            NEURONETES_JOB_TOKEN=token,
            NEURONETES_RESUME="1" if job.resume else "0",
            NEURONETES_CHECKPOINT_DIR=str(d / "checkpoint"),
            NEURONETES_REGION_DIR=str(self.region_dir(job)),
        )
        if not job.spec.whole:
            env["CUDA_DEVICE_MEMORY_LIMIT"] = str(job.spec.memory_bytes)
            env["CUDA_DEVICE_SM_LIMIT"] = str(job.spec.compute_percent)
        if self.shim_library is not None:
            env["LD_PRELOAD"] = " ".join(p for p in (str(self.shim_library), env.get("LD_PRELOAD", "")) if p)
        return env

    def region_dir(self, job: Job) -> Path:
        return self.job_dir(job.id) / "region"

    def write_region(self, job: Job, gpus: Sequence[GpuView]) -> None:
        """The job's standalone region: its devices with their memory limit and compute share (both
        files written anew for every attempt)."""
        spec = job.spec
        devices = [
            shim.DeviceLimit(
                g.uuid,
                spec.memory_bytes or g.memory_total_bytes,
                g.memory_total_bytes,
                compute_share_percent=spec.compute_percent,
                host_index=g.index,
            )
            for g in gpus
        ]
        path = self.region_dir(job)
        if path.is_file() or path.is_symlink():  # a region of major version 1 (one file)
            path.unlink()
        shim.create_region(
            path,
            devices,
            admitted=True,
            standalone=True,
            mode=0o600,
            control_mode=0o600,
            container_name=job.id,
            priority=spec.priority,
        ).close()

    def start(self, job: Job, gpus: Sequence[GpuView], token: str) -> Started:
        """Start the job's next attempt. Raises OSError when it cannot be started."""
        d = self.job_dir(job.id)
        (d / "checkpoint").mkdir(parents=True, exist_ok=True, mode=0o700)
        self.write_region(job, gpus)
        exit_file = self.exit_file(job)
        with contextlib.suppress(FileNotFoundError):
            exit_file.unlink()
        workdir = job.spec.workdir if job.spec.workdir and Path(job.spec.workdir).is_dir() else str(d)
        with open(d / "stdout.log", "ab") as out, open(d / "stderr.log", "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", SHEPHERD, str(exit_file), "--", *command_argv(job.spec.command)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=self.environment(job, gpus, token),
                start_new_session=True,
            )
        self._children[proc.pid] = proc
        return Started(proc.pid, start_ticks(_PROC, proc.pid) or 0, token)

    def exit_status(self, job: Job) -> int | None:
        """The attempt's exit status once its shepherd is gone: from the exit file, else (killed
        with the shepherd) from our own child's status; None while it runs. -1: unknown."""
        child = self._children.get(job.pid)
        if child is not None:
            rc = child.poll()
            if rc is None:
                return None
            del self._children[job.pid]
        elif alive(job.pid, job.pid_start):
            return None
        else:
            rc = None
        try:
            return int(self.exit_file(job).read_text().strip())
        except (OSError, ValueError):
            return -1 if rc is None else (128 - rc if rc < 0 else rc)

    def signal(self, job: Job, sig: int) -> bool:
        """Send `sig` to the job's process group (only if its leader is still the same process)."""
        if not alive(job.pid, job.pid_start) and job.pid not in self._children:
            return False
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def stop_all_children(self) -> None:
        """Reap handles on exit (the processes keep running: a restarted daemon re-adopts them)."""
        self._children.clear()


def kill_group(launcher: Launcher, job: Job) -> bool:
    """SIGKILL the job's group; a stopped group is continued so it can die at once."""
    killed = launcher.signal(job, signal.SIGKILL)
    launcher.signal(job, signal.SIGCONT)
    return killed
