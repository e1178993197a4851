"""The job's shepherd: leader of the job's process group, it runs the command and records its exit.

``python -m neuronetes_agent.workstation.shepherd EXIT_FILE [--cgroup DIR] [--log-max BYTES]
-- ARGV…``. The daemon starts one per job attempt in a new session, so the job's process group is
the shepherd's. Signals the daemon sends to the group (SIGTERM, SIGUSR1, …) reach the command; the
shepherd ignores them (its handlers do nothing; handlers are reset on exec, so the command gets the
default dispositions).

It is a child subreaper, so whatever the command leaves behind — in its group or not (``setsid``,
double forks) — stays its descendant; with ``--cgroup`` the command also joins that cgroup before
it is executed (`containment`). When the command ends (of itself, or killed by the daemon's cancel,
kill or eviction, which spare the shepherd), the shepherd writes its exit status to EXIT_FILE
(128+N for signal N) atomically, kills everything left of the attempt — the cgroup and every
descendant, until none is left —, removes the cgroup and finally kills its own group (itself
included). A daemon that was restarted meanwhile reads the status from that file, since the shepherd
is no longer its child.

With ``--log-max``, the command's stdout and stderr are pipes the shepherd copies into its own
stdout and stderr — the job's log files, ``stdout.log`` and ``stderr.log`` beside EXIT_FILE —
rotating each to ``NAME.1`` when it reaches BYTES (one rotated file is kept, so a stream takes at
most twice BYTES on disk). Without it the command writes to the shepherd's stdout and stderr itself.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Final

from .containment import cgroup_members, join, kill_cgroup, remove_cgroup, set_subreaper, sweep_descendants

_FORWARDED: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_NOFOLLOW: Final = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
LOG_NAMES: Final = ("stdout.log", "stderr.log")
_CHUNK: Final = 1 << 16


def _ignore(signum: int, frame: object) -> None:
    """The signal was sent to the whole group: the command got it too."""


class _Log:
    """The shepherd's own stdout or stderr (`target`), a log file in `dirfd` rotated at `cap` bytes."""

    def __init__(self, target: int, dirfd: int, name: str, cap: int) -> None:
        self.target, self.dirfd, self.name, self.cap = target, dirfd, name, cap
        self.size = os.fstat(target).st_size

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.size >= self.cap:
                self.rotate()
            written = os.write(self.target, view[: self.cap - self.size])
            self.size += written
            view = view[written:]

    def rotate(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.name, self.name + ".1", src_dir_fd=self.dirfd, dst_dir_fd=self.dirfd)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | _NOFOLLOW
        fd = os.open(self.name, flags, 0o600, dir_fd=self.dirfd)
        os.dup2(fd, self.target)
        os.close(fd)
        self.size = 0


def _pump(child: subprocess.Popen[bytes], logs: list[_Log]) -> int:
    """Copy the command's output into the logs until it exits; its exit status (128+N: signal N)."""
    sel = selectors.DefaultSelector()
    for pipe, log in zip((child.stdout, child.stderr), logs, strict=True):
        assert pipe is not None
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe, selectors.EVENT_READ, log)
    exited: int | None = None
    with contextlib.suppress(AttributeError, OSError):  # no pidfd (Linux < 5.3): look twice a second
        exited = os.pidfd_open(child.pid)
        sel.register(exited, selectors.EVENT_READ, None)
    code: int | None = None
    while code is None:
        for key, _ in sel.select(timeout=0.5):
            if key.data is not None:
                _copy(sel, key)
        code = _reap_until(child.pid)
    if exited is not None:
        sel.unregister(exited)
        os.close(exited)
    child.returncode = code
    return code if code >= 0 else 128 - code


def _copy(sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    try:
        chunk = os.read(key.fd, _CHUNK)
    except BlockingIOError:
        return
    if chunk:
        key.data.write(chunk)
    else:
        sel.unregister(key.fileobj)


def _drain(child: subprocess.Popen[bytes], logs: list[_Log], timeout_s: float = 5.0) -> None:
    """What the attempt wrote before it ended (its writers are all dead: each pipe ends)."""
    sel = selectors.DefaultSelector()
    for pipe, log in zip((child.stdout, child.stderr), logs, strict=True):
        if pipe is not None:
            sel.register(pipe, selectors.EVENT_READ, log)
    deadline = time.monotonic() + timeout_s
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.1):
            _copy(sel, key)


def _reap_until(pid: int) -> int | None:
    """Reap exited children (orphans the subreaper inherited included); `pid`'s returncode once it
    exited, else None."""
    found: int | None = None
    while True:
        try:
            done, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if done == 0:
            return found
        if done == pid:
            found = os.waitstatus_to_exitcode(status)


def _write_exit(exit_file: Path, dirfd: int, code: int) -> None:
    tmp = exit_file.name + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dirfd)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dirfd)
    try:
        os.write(fd, f"{code}\n".encode())
    finally:
        os.close(fd)
    os.replace(tmp, exit_file.name, src_dir_fd=dirfd, dst_dir_fd=dirfd)


def _end_attempt(cgroup: Path | None) -> None:
    """Kill whatever the attempt left: its cgroup, and every descendant of the shepherd."""
    if cgroup is not None:
        deadline = time.monotonic() + 10
        while cgroup_members(cgroup) and time.monotonic() < deadline:
            kill_cgroup(cgroup)
            time.sleep(0.01)
    sweep_descendants()
    if cgroup is not None:
        deadline = time.monotonic() + 2
        while not remove_cgroup(cgroup) and time.monotonic() < deadline:
            time.sleep(0.01)


def _parse(argv: list[str]) -> tuple[Path, Path | None, int, list[str]] | None:
    if "--" not in argv:
        return None
    split = argv.index("--")
    head, command = argv[:split], argv[split + 1 :]
    if not head or not command:
        return None
    cgroup: Path | None = None
    log_max = 0
    options = head[1:]
    if len(options) % 2:
        return None
    for name, value in zip(options[::2], options[1::2], strict=True):
        if name == "--cgroup":
            cgroup = Path(value)
        elif name == "--log-max" and value.isdigit() and int(value) > 0:
            log_max = int(value)
        else:
            return None
    return Path(head[0]), cgroup, log_max, command


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if parsed is None:
        print("usage: shepherd EXIT_FILE [--cgroup DIR] [--log-max BYTES] -- ARGV...", file=sys.stderr)
        return 64
    exit_file, cgroup, log_max, command = parsed
    set_subreaper()
    for sig in _FORWARDED:
        signal.signal(sig, _ignore)
    dirfd = os.open(exit_file.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    logs = [_Log(fd, dirfd, name, log_max) for fd, name in zip((1, 2), LOG_NAMES, strict=True)]
    logs = logs if log_max else []
    pipe = subprocess.PIPE if log_max else None
    child: subprocess.Popen[bytes] | None = None
    try:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe,
            preexec_fn=None if cgroup is None else partial(join, cgroup),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        message = f"neuronetes: cannot start the job: {exc}\n".encode()
        if logs:
            logs[1].write(message)
        else:
            os.write(2, message)
        code = 127
    else:
        code = _pump(child, logs) if logs else _status(child.wait())
    _write_exit(exit_file, dirfd, code)
    _end_attempt(cgroup)
    if child is not None and logs:
        _drain(child, logs)
    if os.getpgid(0) == os.getpid():
        # The job is its process group: the shepherd ends with it, its status already written.
        os.killpg(0, signal.SIGKILL)
    return code


def _status(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
