"""Containment: nothing an attempt started outlives it (docs/workstation.md, "Containment").

A job's children may leave its process group and session (``setsid``, double forks: daemonisers,
shells with job control), so the group alone does not hold them. The daemon contains each attempt
by the first mechanism this machine allows (`detect`; ``--containment`` names one):

- ``cgroup2``: a cgroup v2 of its own, ``<daemon's cgroup>/neuronetes-<uid>-<hash>/<job>.<attempt>``,
  where the daemon may create cgroups (a delegated subtree, or root). The command joins it before
  it is executed; whatever it starts is born inside and stays there. Killed with ``cgroup.kill``
  (or SIGKILL to each member until it is empty).
- ``cgroup1``: the same in the cgroup v1 ``pids`` hierarchy (SIGKILL to each member until empty).
- ``subreaper``: no usable cgroup. The shepherd is a child subreaper (``PR_SET_CHILD_SUBREAPER``):
  orphans of the job are re-parented to it, not to init, so every descendant stays in its process
  tree while it lives, and it kills them all when the command ends.

In every mode the shepherd is a subreaper, and every process of an attempt carries the attempt's
``NEURONETES_JOB_TOKEN``, which the daemon searches for once the shepherd is gone (`with_token`).
The scheduler hands an attempt's GPUs to another job only once none of its processes is left.
Containment holds a job's own children, not a hostile job: a program running as the user can move
itself out of a cgroup the user may write, or clear its environment and escape a dead shepherd.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "MODES",
    "Containment",
    "ProcTable",
    "base_dirs",
    "cgroup_members",
    "detect",
    "join",
    "kill_cgroup",
    "remove_cgroup",
    "set_subreaper",
    "sweep_descendants",
]

MODES: Final = ("auto", "cgroup2", "cgroup1", "subreaper")
_PROC: Final = Path("/proc")
_PR_SET_CHILD_SUBREAPER: Final = 36


def set_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ≥ 3.4)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


# ---- the process table ----------------------------------------------------------------------------


class ProcTable:
    """One reading of /proc: each live (not zombie) process's parent and process group."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}
        self.group: dict[int, int] = {}
        self.zombies: set[int] = set()
        for entry in os.listdir(_PROC):
            if not entry.isdigit():
                continue
            try:
                stat = (_PROC / entry / "stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            pid = int(entry)
            if fields[0] in (b"Z", b"X"):
                self.zombies.add(pid)
                continue
            self.parent[pid] = int(fields[1])
            self.group[pid] = int(fields[2])

    def descendants(self, root: int) -> set[int]:
        """Live processes below `root` in the process tree."""
        children: dict[int, list[int]] = {}
        for pid, ppid in self.parent.items():
            children.setdefault(ppid, []).append(pid)
        out: set[int] = set()
        todo = list(children.get(root, ()))
        while todo:
            pid = todo.pop()
            if pid not in out:
                out.add(pid)
                todo.extend(children.get(pid, ()))
        return out

    def in_group(self, pgid: int) -> set[int]:
        return {pid for pid, group in self.group.items() if group == pgid}


def with_token(tokens: Iterable[str]) -> dict[str, set[int]]:
    """Live processes whose environment holds ``NEURONETES_JOB_TOKEN=<token>``, per token."""
    wanted = {f"NEURONETES_JOB_TOKEN={t}".encode(): t for t in tokens if t}
    out: dict[str, set[int]] = {t: set() for t in wanted.values()}
    if not wanted:
        return out
    for entry in os.listdir(_PROC):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            for var in (_PROC / entry / "environ").read_bytes().split(b"\0"):
                token = wanted.get(var)
                if token is not None and _live(int(entry)):
                    out[token].add(int(entry))
    return out


def _live(pid: int) -> bool:
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _reap() -> None:
    """Collect every exited child of this process (a subreaper inherits orphans' zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep_descendants(timeout_s: float = 10.0) -> bool:
    """SIGKILL every descendant of this process until none is left (new ones forked meanwhile
    included); True when none is left within `timeout_s`."""
    me = os.getpid()
    deadline = time.monotonic() + timeout_s
    while True:
        _reap()
        left = ProcTable().descendants(me)
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        _kill(left)
        time.sleep(0.01)


# ---- cgroups ----------------------------------------------------------------------------------------


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _mounts() -> Iterator[tuple[str, str, str, str]]:
    """(mount point, root inside the hierarchy, filesystem type, super options) of each mount."""
    with contextlib.suppress(OSError), open(_PROC / "self" / "mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3:
                yield _unescape(fields[4]), _unescape(fields[3]), tail[0], tail[2]


def _own_cgroup(version: int) -> Path | None:
    """The directory of this process's cgroup: v2, or v1's ``pids`` hierarchy."""
    try:
        lines = (_PROC / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (version == 2 and controllers == "") or (version == 1 and "pids" in controllers.split(",")):
            break
    else:
        return None
    for point, root, fstype, options in _mounts():
        ok = fstype == "cgroup2" if version == 2 else fstype == "cgroup" and "pids" in options.split(",")
        if not ok:
            continue
        if root != "/" and path != root and not path.startswith(root.rstrip("/") + "/"):
            continue
        relative = path[len(root) :] if root != "/" else path
        return Path(point) / relative.lstrip("/")
    return None


@dataclass(frozen=True, slots=True)
class Containment:
    """How this daemon contains its attempts: a cgroup per attempt under `base`, or none."""

    kind: str  # "cgroup2", "cgroup1" or "subreaper"
    base: Path | None = None
    why: str = ""  # why no cgroup (subreaper)

    def describe(self) -> str:
        if self.base is not None:
            return f"{self.kind} ({self.base})"
        return f"subreaper ({self.why})" if self.why else "subreaper"

    def create(self, name: str) -> Path | None:
        """A new empty cgroup for one attempt (None: subreaper mode). Raises OSError."""
        if self.base is None:
            return None
        path = self.base / name
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.base)
        if path.exists():  # left by an attempt of this name that never started: reuse it empty
            kill_cgroup(path)
            remove_cgroup(path)
        os.mkdir(path)
        return path

    def cleanup(self) -> None:
        """Remove the empty cgroups of this daemon (at its exit; busy ones stay for the next)."""
        if self.base is None or not self.base.is_dir():
            return
        for child in self.base.iterdir():
            if child.is_dir() and not cgroup_members(child):
                remove_cgroup(child)
        with contextlib.suppress(OSError):
            os.rmdir(self.base)


def _base_name(state_dir: Path) -> str:
    digest = hashlib.sha256(os.fsencode(state_dir.resolve())).hexdigest()[:12]
    return f"neuronetes-{os.geteuid()}-{digest}"


def base_dirs(state_dir: Path) -> list[Path]:
    """The cgroups (v2, v1) under which a daemon of `state_dir` started in this process's cgroup
    puts its attempts, where they exist."""
    found = []
    for version in (2, 1):
        own = _own_cgroup(version)
        if own is not None and (own / _base_name(state_dir)).is_dir():
            found.append(own / _base_name(state_dir))
    return found


def _usable(version: int, state_dir: Path) -> Path | str:
    """The base cgroup for this daemon when it can create cgroups and move processes, else why not."""
    own = _own_cgroup(version)
    if own is None:
        return f"no cgroup v{version}{' pids hierarchy' if version == 1 else ''} mounted"
    base = own / _base_name(state_dir)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(base)
        probe = base / f"probe-{os.getpid()}"
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as exc:
        return f"cannot create a cgroup v{version} under {own}: {exc.strerror}"
    for procs in (own / "cgroup.procs", base / "cgroup.procs"):
        if not os.access(procs, os.W_OK):
            with contextlib.suppress(OSError):
                os.rmdir(base)
            return f"cannot move processes into cgroup v{version} {base} ({procs} is not writable)"
    return base


def detect(mode: str, state_dir: Path) -> Containment:
    """The containment `mode` asks for (``auto``: the first usable of cgroup2, cgroup1, subreaper).
    Raises ValueError when a cgroup mode is named and unusable."""
    if mode not in MODES:
        raise ValueError(f"--containment {mode}: use one of {', '.join(MODES)}")
    if mode == "subreaper":
        return Containment("subreaper", why="chosen with --containment")
    reasons: list[str] = []
    for version in (2, 1):
        kind = f"cgroup{version}"
        if mode not in ("auto", kind):
            continue
        base = _usable(version, state_dir)
        if isinstance(base, Path):
            return Containment(kind, base)
        if mode == kind:
            raise ValueError(f"--containment {kind}: {base}")
        reasons.append(base)
    return Containment("subreaper", why="; ".join(reasons))


def join(cgroup: Path) -> None:
    """Move the calling process into `cgroup` (the command does, before it is executed)."""
    fd = os.open(cgroup / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"0\n")
    finally:
        os.close(fd)


def cgroup_members(cgroup: Path) -> set[int]:
    """Processes in `cgroup` (empty when it is gone)."""
    try:
        text = (cgroup / "cgroup.procs").read_text()
    except OSError:
        return set()
    return {int(p) for p in text.split() if p.isdigit() and _live(int(p))}


def kill_cgroup(cgroup: Path) -> None:
    """SIGKILL everything in `cgroup` (``cgroup.kill`` where the kernel has it)."""
    with contextlib.suppress(OSError):
        fd = os.open(cgroup / "cgroup.kill", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    _kill(cgroup_members(cgroup))


def remove_cgroup(cgroup: Path) -> bool:
    """Remove an empty cgroup; True when it is gone."""
    try:
        os.rmdir(cgroup)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.ENOTEMPTY, errno.EACCES, errno.EPERM):
            return False
        raise
    return True
