"""The chart runner's processes and files: a container's host process (started, restarted with
back-off, stopped with a grace period) and files written only when their content changes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from neuronetes.devcluster.podplan import ContainerLaunch, HostFile

__all__ = ["BACKOFF_MAX_S", "Proc", "declared_ports", "listens", "stop_procs", "write_files"]

log = logging.getLogger("neuronetes.chartrun")
BACKOFF_MAX_S: Final = 30.0


@dataclass
class Proc:
    """One container's host process, restarted with back-off when it exits."""

    launch: ContainerLaunch
    cwd: Path
    log_file: Path
    grace_s: float
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0

    def start(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(self.launch.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                list(self.launch.argv),
                cwd=self.cwd,
                env=dict(self.launch.env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                close_fds=True,
            )

    def tend(self, now: float) -> None:
        """Start it, or again after it exited (back-off doubling up to 30 s)."""
        if self.popen is not None and self.popen.poll() is None:
            return
        if self.popen is not None:
            log.warning("%s exited with %s", self.log_file.name, self.popen.returncode)
            self.restarts += 1
            self.next_start = now + min(BACKOFF_MAX_S, 2.0 ** min(self.restarts, 5))
            self.popen = None
        if now >= self.next_start:
            self.start()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.popen.pid if self.alive() and self.popen else None,
            "argv": list(self.launch.argv),
            "restarts": self.restarts,
            "log": str(self.log_file),
        }


def stop_procs(procs: Sequence[Proc]) -> None:
    """SIGTERM all, wait each one's grace period, SIGKILL what is left."""
    for p in procs:
        p.signal(signal.SIGTERM)
    deadline = time.monotonic() + max((p.grace_s for p in procs), default=0.0)
    for p in procs:
        if p.popen is None:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        if p.popen.poll() is None:
            p.popen.kill()
            p.popen.wait()


def write_files(files: Sequence[HostFile], dirs: Sequence[Path]) -> bool:
    """Create `dirs` and write the files whose content changed (atomically); True if any did."""
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    changed = False
    for f in files:
        f.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if f.path.read_bytes() == f.content:
                continue
        tmp = f.path.with_name(f".{f.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, f.mode)
        with os.fdopen(fd, "wb") as out:
            out.write(f.content)
        os.replace(tmp, f.path)
        changed = True
    return changed


def declared_ports(pod: Mapping[str, Any], procs: Mapping[str, Proc]) -> list[int]:
    """The declared TCP ports of the containers that run as processes."""
    return [
        int(p["containerPort"])
        for ctr in pod["spec"].get("containers") or ()
        if ctr["name"] in procs
        for p in ctr.get("ports") or ()
        if p.get("protocol", "TCP") == "TCP"
    ]


def listens(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False
