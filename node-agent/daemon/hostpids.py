"""Host PIDs and dead processes of one container's shim region (docs/contracts.md "Host PIDs",
"Dead processes"; docs/threat-model.md "Host PIDs").

The shim writes only its container PID and start time into its slot. `register_host_pids` finds
the host PID itself: it lists the container's cgroup (`cgroup.procs`), reads each member's
`/proc/<pid>/status` `NSpid` (the PID in each namespace, outermost first, so the last is the one
the shim's `getpid()` returned) and start time (`/proc/<pid>/stat` field 22), and writes
`host_pid` into the slot whose container PID and start time both match. A PID a tenant wrote
that is not in that cgroup is never written, and the start time tells a reused PID from the
process that claimed the slot.

`reclaim_dead` marks a slot whose registered process is gone `DEAD` and frees it only once the
driver no longer holds memory for that host PID, so a crash cannot make room that is not there
yet. A slot whose process died before its host PID was registered cannot be asked about and is
left charged (the agent never acts on a PID it did not find in the cgroup).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from neuronetes.agent import region as shim

from .devices import GpuProcess

__all__ = ["driver_holds_in", "process_alive", "reclaim_dead", "register_host_pids", "start_ticks"]


def _nspid(proc_root: Path, pid: int) -> tuple[int, ...] | None:
    try:
        text = (proc_root / str(pid) / "status").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            try:
                return tuple(int(v) for v in line.split()[1:])
            except ValueError:
                return None
    return None


def start_ticks(proc_root: Path, pid: int) -> int | None:
    """`/proc/<pid>/stat` field 22 (start time in clock ticks after boot); None when unreadable."""
    try:
        text = (proc_root / str(pid) / "stat").read_text(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    fields = text[text.rfind(")") + 1 :].split()
    try:
        return int(fields[22 - 3])
    except (IndexError, ValueError):
        return None


def _members(cgroup_procs: Path) -> list[int]:
    try:
        lines = cgroup_procs.read_text().split()
    except OSError:
        return []
    return [int(v) for v in lines if v.isdigit()]


def register_host_pids(region: shim.Region, cgroup_procs: Path, proc_root: Path = Path("/proc")) -> int:
    """Write `host_pid` into each active slot matched by a member of the container's cgroup on
    container PID and start time; returns how many slots got one.

    Raises:
        RegionError: the region's lock was not taken in time (a process of the container holds it).
    """
    found: dict[tuple[int, int], int] = {}
    for pid in _members(cgroup_procs):
        ns = _nspid(proc_root, pid)
        start = start_ticks(proc_root, pid)
        # NSpid's first entry is the PID in proc_root's namespace: it must be the member listed.
        if ns is None or start is None or not ns or ns[0] != pid:
            continue
        found[(ns[-1], start)] = pid
    written = 0
    with region.lock():
        for slot in region.view.procs:
            if slot.state != shim.SLOT_ACTIVE:
                continue
            host_pid = found.get((slot.container_pid, slot.start_time_ticks))
            if host_pid is not None and slot.host_pid != host_pid:
                slot.host_pid = host_pid
                written += 1
    return written


def reclaim_dead(
    region: shim.Region,
    is_alive: Callable[[int, int], bool],
    driver_holds: Callable[[int], bool],
) -> list[int]:
    """Mark the slots whose registered process is gone DEAD, then free those the driver no longer
    holds memory for; returns the freed slot numbers.

    `is_alive(host_pid, start_ticks)` and `driver_holds(host_pid)` are the host's answers
    (`process_alive`, `driver_holds_in` in production). Slots without a host PID are left alone.

    Raises:
        RegionError: the region's lock was not taken in time.
    """
    releasable: list[tuple[int, int]] = []
    with region.lock():
        for index, slot in enumerate(region.view.procs):
            if slot.state == shim.SLOT_FREE or slot.host_pid <= 0:
                continue
            if slot.state == shim.SLOT_ACTIVE and not is_alive(slot.host_pid, slot.start_time_ticks):
                slot.state = shim.SLOT_DEAD
            if slot.state == shim.SLOT_DEAD and not driver_holds(slot.host_pid):
                releasable.append((index, slot.claim_seq))
    # reclaim_slot takes the lock itself; claim_seq makes it skip a slot claimed again meanwhile.
    return [i for i, seq in releasable if region.reclaim_slot(i, claim_seq=seq)]


def process_alive(proc_root: Path = Path("/proc")) -> Callable[[int, int], bool]:
    """`is_alive` for `reclaim_dead`: the host PID exists and started at the recorded time."""
    return lambda host_pid, ticks: start_ticks(proc_root, host_pid) == ticks


def driver_holds_in(processes: Iterable[GpuProcess]) -> Callable[[int], bool]:
    """`driver_holds` for `reclaim_dead` from NVML's running processes of the node's GPUs
    (`GpuSample.processes`): the host PID still has memory on some GPU."""
    holding = {p.pid for p in processes if p.used_memory_bytes > 0}
    return lambda host_pid: host_pid in holding
