"""Start, identify and stop the control plane's host processes (Linux, via /proc).

Every component runs in its own session (so its own process group, id = its pid). A process is
identified by its pid *and* its start time (``/proc/PID/stat`` field 22), so a pid that was reused
by an unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ProcessRecord",
    "group_members",
    "interrupt_on",
    "is_running",
    "spawn",
    "stop_all",
    "survivors",
]


def interrupt_on(*signums: signal.Signals) -> None:
    """Turn these signals into KeyboardInterrupt in the main thread, so a benchmark or tool that
    holds a cluster in `try/finally` still tears it down when it is killed with SIGTERM."""

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for signum in signums:
        signal.signal(signum, interrupted)


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """A started component: enough to find it again from another process."""

    name: str
    pid: int
    start_time: int
    argv: tuple[str, ...]
    log: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "start_time": self.start_time,
            "argv": list(self.argv),
            "log": self.log,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            start_time=int(data["start_time"]),
            argv=tuple(str(a) for a in data["argv"]),
            log=str(data["log"]),
        )


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time) of `pid`, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest[0], int(rest[2]), int(rest[19])


def start_time_of(pid: int) -> int:
    st = _stat(pid)
    return st[2] if st else -1


def _reap(pid: int) -> None:
    """Collect `pid`'s exit status when it is our child (no zombie left behind)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_running(record: ProcessRecord) -> bool:
    """Whether the recorded process still runs (a zombie or a reused pid does not count)."""
    st = _stat(record.pid)
    if st is None or st[2] != record.start_time:
        return False
    if st[0] == "Z":
        _reap(record.pid)
        return False
    return True


def group_members(pgids: Iterable[int]) -> list[int]:
    """Live (non-zombie) processes in any of the process groups `pgids`."""
    wanted = set(pgids)
    found: list[int] = []
    if not wanted:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        if st is not None and st[1] in wanted and st[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start `argv` in a new session with stdout and stderr appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            close_fds=True,
        )
    return proc, ProcessRecord(name, proc.pid, start_time_of(proc.pid), tuple(argv), str(log))


def _ours(record: ProcessRecord) -> bool:
    """Whether the process group `record` started may still have members that are ours.

    When the leader's pid now belongs to another process (different start time), it was reused:
    Linux never hands out a pid still in use as a process group id, so our group had ended.
    """
    st = _stat(record.pid)
    return st is None or st[2] == record.start_time


def _signal_group(record: ProcessRecord, sig: signal.Signals) -> None:
    if not _ours(record):
        return
    if _stat(record.pid) is None:
        # The leader is gone; members of its group that remain inherited the pgid and are ours.
        for pid in group_members([record.pid]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(record.pid, sig)


def _wait_gone(records: Sequence[ProcessRecord], timeout_s: float) -> bool:
    pgids = [r.pid for r in records]
    deadline = time.monotonic() + timeout_s
    while True:
        for r in records:
            _reap(r.pid)
        if not group_members(pgids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_all(records: Sequence[ProcessRecord], *, grace_s: float = 10.0) -> None:
    """SIGTERM every recorded process group, wait up to `grace_s`, then SIGKILL what is left.

    Groups whose leader's pid was reused by an unrelated process are left alone (only members
    of a process group we created are ever signalled).
    """
    mine = [r for r in records if _ours(r)]
    if not mine:
        return
    for r in mine:
        _signal_group(r, signal.SIGTERM)
    if _wait_gone(mine, grace_s):
        return
    for r in mine:
        _signal_group(r, signal.SIGKILL)
    _wait_gone(mine, 5.0)


def survivors(records: Iterable[ProcessRecord]) -> list[int]:
    """Live processes left of `records`: the processes themselves and members of their groups.

    A group whose leader's pid now belongs to another process (a reused pid) is not ours any more.
    """
    recs = [r for r in records if _ours(r)]
    for r in recs:
        _reap(r.pid)
    return group_members(r.pid for r in recs)
