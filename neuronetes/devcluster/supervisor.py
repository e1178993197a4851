"""Runs the processes of one dev cluster: spawn, wait for health, tail logs, crash, stop.

Each spawn is recorded in the run's ``state.json`` at once, so a process started by this
process can be found and stopped from another (the CLI's ``down``, a pytest session's teardown).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from neuronetes.devcluster import procs
from neuronetes.devcluster.state import ClusterError, RunState, StateStore

__all__ = ["Supervisor"]


class Supervisor:
    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def log_dir(self) -> Path:
        return self.store.state_dir / "logs"

    def spawn(self, state: RunState, name: str, argv: Sequence[str]) -> procs.ProcessRecord:
        proc, rec = procs.spawn(name, argv, log=self.log_dir / f"{name}.log", cwd=self.store.state_dir)
        self._children[name] = proc
        state.processes[name] = rec
        self.store.save(state)
        return rec

    def wait(
        self, state: RunState, name: str, probe: Callable[[], tuple[bool, str]], deadline: float
    ) -> None:
        """Until `probe` passes; `ClusterError` (with the log's tail) if it exits or time runs out."""
        detail = ""
        while time.monotonic() < deadline:
            if not procs.is_running(state.processes[name]):
                raise ClusterError(f"{name} exited during start-up:\n{self.tail(name)}")
            ok, detail = probe()
            if ok:
                return
            time.sleep(0.1)
        raise ClusterError(f"{name} not healthy in time ({detail}):\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 25) -> str:
        """The last `lines` lines of a component's log."""
        try:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self, state: RunState, names: Sequence[str]) -> None:
        """SIGKILL the named processes' groups (a crash: no grace, no clean-up)."""
        for name in names:
            rec = state.processes.get(name)
            if rec is None:
                raise ClusterError(f"cluster {self.store.name!r} has no process {name!r}")
            if procs.is_running(rec):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(rec.pid, signal.SIGKILL)
        self.reap()

    def restart(
        self, state: RunState, name: str, probe: Callable[[], tuple[bool, str]], deadline: float
    ) -> None:
        """The process `name` again, with the command line it was started with."""
        rec = state.processes.get(name)
        if rec is None:
            raise ClusterError(f"cluster {self.store.name!r} has no process {name!r}")
        procs.stop_all([rec])
        self.reap()
        self.spawn(state, name, rec.argv)
        self.wait(state, name, probe, deadline)

    def stop(self, state: RunState, *, grace_s: float = 10.0) -> None:
        """Stop every process of `state`: clients, then the API server, then etcd."""
        records = list(state.processes.values())
        order = [
            [r for r in records if r.name not in ("kube-apiserver", "etcd")],
            [r for r in records if r.name == "kube-apiserver"],
            [r for r in records if r.name == "etcd"],
        ]
        for batch in order:
            procs.stop_all(batch, grace_s=grace_s)
        self.reap()
        left = procs.group_members(r.pid for r in records)
        if left:
            raise ClusterError(f"processes of cluster {self.store.name!r} survived SIGKILL: {left}")

    def reap(self) -> None:
        """Collect the exit status of children that ended (no zombies)."""
        for name, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[name]
