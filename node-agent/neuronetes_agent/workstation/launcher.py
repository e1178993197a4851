"""Starting jobs as real processes, and finding, signalling, killing and reaping them.

Each attempt runs under a shepherd (`shepherd`) in a new session, so the job is one process group
whose leader's PID and ``/proc`` start time identify it across daemon restarts. Each attempt is
contained (`containment`: a cgroup of its own, else the shepherd as subreaper), and its end — of
itself, cancelled, killed, evicted — is over only once none of its processes is left (`settle`).
stdout and stderr go to ``<state>/jobs/<id>/stdout.log`` / ``stderr.log``, through the shepherd,
which rotates each to ``.1`` at the log cap; every file is opened through `statedir` (no link
followed). The job gets its GPUs through
``CUDA_VISIBLE_DEVICES`` (UUIDs) and its limits through the shim's workstation-mode contract
(docs/shim.md): a workstation region (its control and state files) in ``NEURONETES_REGION_DIR`` plus
``CUDA_DEVICE_MEMORY_LIMIT`` and ``CUDA_DEVICE_SM_LIMIT``; with ``--shim-library`` the shim is
preloaded (``LD_PRELOAD``). The shim takes the directory from the environment only where no region
exists at its default path, as on a workstation (it never does in a container).
The job's own variables are in docs/workstation.md ("Job environment").
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from neuronetes_agent import region as shim
from neuronetes_agent.daemon.hostpids import start_ticks

from .commands import command_argv
from .containment import (
    Containment,
    ProcTable,
    cgroup_members,
    kill_cgroup,
    remove_cgroup,
    with_token,
)
from .gpus import GpuView
from .jobs import Job
from .statedir import StateDir

__all__ = [
    "DEFAULT_LOG_MAX_BYTES",
    "Launcher",
    "Started",
    "alive",
    "find_token",
    "group_members",
    "kill_group",
]

_PROC: Final = Path("/proc")
SHEPHERD: Final = "neuronetes_agent.workstation.shepherd"
DEFAULT_LOG_MAX_BYTES: Final = 64 << 20
_WHOLE_ATTEMPT: Final = frozenset({signal.SIGTERM, signal.SIGSTOP, signal.SIGCONT})


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


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid`, leader first."""
    out: list[int] = []
    for pid in _pids():
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pgid:
                out.append(pid)
    return sorted(out, key=lambda p: (p != pgid, p))


def find_token(token: str) -> int | None:
    """The shepherd of a launch the daemon did not get to record: the process group leader whose
    environment holds ``NEURONETES_JOB_TOKEN=token`` (its command and children carry it too), or
    None."""
    found = sorted(with_token([token])[token])
    for pid in found:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:
                return pid
    return found[0] if found else None


@dataclass(frozen=True, slots=True)
class Started:
    pid: int
    pid_start: int
    token: str


class Launcher:
    """Starts attempts and keeps the handles of the processes this daemon started."""

    def __init__(
        self,
        state_dir: Path,
        shim_library: Path | None = None,
        *,
        containment: Containment | None = None,
        log_max_bytes: int = DEFAULT_LOG_MAX_BYTES,
    ) -> None:
        self.state = StateDir(state_dir)
        os.close(self.state.open_dir(["jobs"]))
        self.root = state_dir / "jobs"
        self.shim_library = shim_library
        self.containment = containment or Containment("subreaper")
        self.log_max_bytes = log_max_bytes
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
        """The job's workstation region: its devices with their memory limit and compute share (both
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
        with self.state.directory(["jobs", job.id]) as d:
            with contextlib.suppress(FileNotFoundError):
                if not stat.S_ISDIR(os.stat("region", dir_fd=d, follow_symlinks=False).st_mode):
                    os.unlink("region", dir_fd=d)  # a region of major version 1 (one file), a link
            with contextlib.suppress(FileExistsError):
                os.mkdir("region", 0o700, dir_fd=d)
            os.close(self.state.open_dir(["jobs", job.id, "region"], create=False))  # checked
        shim.create_region(
            path,
            devices,
            admitted=True,
            workstation=True,
            mode=0o600,
            control_mode=0o600,
            container_name=job.id,
            priority=spec.priority,
        ).close()

    def start(self, job: Job, gpus: Sequence[GpuView], token: str) -> Started:
        """Start the job's next attempt. Raises OSError when it cannot be started."""
        parts = ["jobs", job.id]
        d = self.job_dir(job.id)
        os.close(self.state.open_dir([*parts, "checkpoint"]))
        self.write_region(job, gpus)
        with self.state.directory(parts) as dirfd, contextlib.suppress(FileNotFoundError):
            os.unlink(self.exit_file(job).name, dir_fd=dirfd)
        cgroup = self.containment.create(self.attempt_name(job))
        self._record_cgroup(job, cgroup)
        workdir = job.spec.workdir if job.spec.workdir and Path(job.spec.workdir).is_dir() else str(d)
        append = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        out = self.state.open([*parts, "stdout.log"], append)
        try:
            err = self.state.open([*parts, "stderr.log"], append)
        except BaseException:
            os.close(out)
            raise
        contained = ["--cgroup", str(cgroup)] if cgroup is not None else []
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    SHEPHERD,
                    str(self.exit_file(job)),
                    "--log-max",
                    str(self.log_max_bytes),
                    *contained,
                    "--",
                    *command_argv(job.spec.command),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=self.environment(job, gpus, token),
                start_new_session=True,
            )
        finally:
            os.close(out)
            os.close(err)
        self._children[proc.pid] = proc
        return Started(proc.pid, start_ticks(_PROC, proc.pid) or 0, token)

    # ---- the attempt's processes ----------------------------------------------------------------

    @staticmethod
    def attempt_name(job: Job) -> str:
        return f"{job.id}.{job.attempt}"

    def _record_cgroup(self, job: Job, cgroup: Path | None) -> None:
        """Where the attempt's cgroup is (`cgroup-<attempt>` in the job's directory): a restarted
        daemon, maybe in another cgroup itself, still finds it."""
        name = f"cgroup-{job.attempt}"
        if cgroup is None:
            with self.state.directory(["jobs", job.id]) as d, contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=d)
            return
        fd = self.state.open(["jobs", job.id, name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, os.fsencode(cgroup) + b"\n")
        finally:
            os.close(fd)

    def cgroup_of(self, job: Job) -> Path | None:
        """The attempt's cgroup, while it exists."""
        if job.attempt <= 0:
            return None
        try:
            fd = self.state.open(["jobs", job.id, f"cgroup-{job.attempt}"], os.O_RDONLY)
        except OSError:
            return None
        try:
            path = Path(os.fsdecode(os.read(fd, 4096)).strip())
        finally:
            os.close(fd)
        return path if path.is_absolute() and (path / "cgroup.procs").is_file() else None

    def shepherd_alive(self, job: Job) -> bool:
        child = self._children.get(job.pid)
        if child is not None:
            return child.poll() is None
        return alive(job.pid, job.pid_start)

    def processes(self, job: Job, table: ProcTable | None = None, *, by_token: bool = True) -> set[int]:
        """Every live process of the job's current attempt: its shepherd's group and descendants
        (while the shepherd lives), its cgroup, and (`by_token`) whatever carries its token."""
        pids: set[int] = set()
        if job.pid > 0 and self.shepherd_alive(job):
            table = table or ProcTable()
            pids |= {job.pid} | table.in_group(job.pid) | table.descendants(job.pid)
        cgroup = self.cgroup_of(job)
        if cgroup is not None:
            pids |= cgroup_members(cgroup)
        if job.token and by_token:
            pids |= with_token([job.token])[job.token]
        return pids

    def kill(self, job: Job, *, spare_shepherd: bool = True) -> bool:
        """SIGKILL every process of the attempt. A live shepherd is spared (and continued if it was
        stopped) unless `spare_shepherd` is false: it then ends the attempt itself (its exit status,
        its own sweep). True when there was anything to kill."""
        shepherd = job.pid if job.pid > 0 and self.shepherd_alive(job) else 0
        cgroup = self.cgroup_of(job)
        if cgroup is not None:
            kill_cgroup(cgroup)
        pids = self.processes(job)
        if spare_shepherd:
            pids.discard(shepherd)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if shepherd:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shepherd, signal.SIGCONT)
        return bool(pids or shepherd)

    def settle(self, job: Job) -> bool:
        """True once nothing of the attempt is left (its cgroup then removed). While its shepherd
        lives: False. Once the shepherd is gone, whatever is left is killed (False until gone)."""
        if job.pid > 0 and self.shepherd_alive(job):
            return False
        if self.processes(job):
            self.kill(job)
            return False
        cgroup = self.cgroup_of(job)
        return cgroup is None or remove_cgroup(cgroup)

    def leftovers(self, jobs: Sequence[Job]) -> list[Job]:
        """Of `jobs` (whose shepherds are gone), those whose last attempt left a process or a
        cgroup behind: one reading of /proc for all of them (a restarted daemon's check)."""
        found = with_token(j.token for j in jobs if j.token)
        return [j for j in jobs if (j.token and found.get(j.token)) or self.cgroup_of(j) is not None]

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
            fd = self.state.open(["jobs", job.id, self.exit_file(job).name], os.O_RDONLY)
            try:
                return int(os.read(fd, 64).strip())
            finally:
                os.close(fd)
        except (OSError, ValueError):
            return -1 if rc is None else (128 - rc if rc < 0 else rc)

    def signal(self, job: Job, sig: int) -> bool:
        """Send `sig` to the job's process group (only if its leader is still the same process).
        SIGTERM, SIGSTOP and SIGCONT also reach the attempt's processes outside the group (its
        cgroup, the shepherd's descendants); SIGUSR1, the job's own contract, only the group."""
        if not alive(job.pid, job.pid_start) and job.pid not in self._children:
            return False
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            return False
        if sig in _WHOLE_ATTEMPT:
            table = ProcTable()
            for pid in self.processes(job, table, by_token=False) - table.in_group(job.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        return True

    def stop_all_children(self) -> None:
        """Reap handles on exit (the processes keep running: a restarted daemon re-adopts them)."""
        self._children.clear()


def kill_group(launcher: Launcher, job: Job) -> bool:
    """SIGKILL every process of the job's attempt (`Launcher.kill`)."""
    return launcher.kill(job)
