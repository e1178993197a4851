"""A running real node as this machine sees it: its PID 1, its processes, its private paths.

Each real node (`neuronetes.devcluster.realnodes`) is ``hack/real-node.sh`` as PID 1 of a PID and
mount namespace of its own; that process is found by its command line (the node's folder) and by
living in another PID namespace than ours (``unshare`` itself, in ours, has the same command line).
Its namespaces are the node's whatever the node's other processes do (a kubelet or containerd
killed and restarted), so the node's processes and its private ``/run``, ``/dev`` and ``/mnt`` are
reached through it. The tests and ``bench/real_node.py`` use these.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["node_mounts", "node_path", "node_pid", "node_processes"]


def _cmdline(pid: str) -> str:
    try:
        return Path("/proc", pid, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # gone meanwhile
        return ""


def _pid_ns(pid: str | int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:  # gone meanwhile
        return ""


def node_pid(state_dir: Path, node: str) -> int | None:
    """The node's PID 1, or None when the node does not run."""
    marker = f"real-node.sh {state_dir / 'real-nodes' / node}"
    ours = _pid_ns("self")
    found = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and marker in _cmdline(p) and _pid_ns(p) not in ("", ours)
    ]
    return min(found) if found else None


def _running(state_dir: Path, node: str) -> int:
    pid1 = node_pid(state_dir, node)
    if pid1 is None:
        raise LookupError(f"node {node} is not running")
    return pid1


def node_processes(state_dir: Path, node: str, pattern: str) -> list[int]:
    """This machine's PIDs of the node's processes whose command line holds `pattern`."""
    ns = _pid_ns(_running(state_dir, node))
    return sorted(
        int(p) for p in os.listdir("/proc") if p.isdigit() and pattern in _cmdline(p) and _pid_ns(p) == ns
    )


def node_path(state_dir: Path, node: str, path: str) -> Path:
    """`path` as the node sees it (its private /run, /dev, /mnt): through its PID 1's root."""
    return Path(f"/proc/{_running(state_dir, node)}/root") / path.lstrip("/")


def node_mounts(state_dir: Path, node: str) -> str:
    """The mount table (``mountinfo``) of the node's mount namespace."""
    return Path(f"/proc/{_running(state_dir, node)}/mountinfo").read_text()
