"""Host PIDs and dead processes of one container's shim region (docs/contracts.md "Host PIDs",
"Dead processes"; docs/threat-model.md "Host PIDs").

The shim writes only its container PID, start time and claim number into its slot of the state
file. `register_host_pids` finds the host PID itself: it lists the container's cgroup
(`cgroup.procs`), reads each member's `/proc/<pid>/status` `NSpid` (the PID in each namespace,
outermost first, so the last is the one the shim's `getpid()` returned) and start time
(`/proc/<pid>/stat` field 22), and writes the host PID, with the slot's claim and the start time
it read itself, into the agent's control file for the slot whose container PID and start time
both match. A PID a tenant wrote that is not in that cgroup is never written, and the start time
tells a reused PID from the process that claimed the slot.

`reclaim_dead` orders the reclaim of a slot (the control file's `reclaim_claim_seq`) once its
registered host process is gone — judged from the agent's own record of that process, never
from the state file — and the driver no longer holds memory for it, so a crash cannot make room
that is not there yet; the shim frees the slot at its next lock. A slot whose process died before
its host PID was registered cannot be asked about and is left charged (the agent never acts on a
PID it did not find in the cgroup).

Both read the state file only as a validated private copy (`Region.read_state`) and write only the
agent's control file: they take no lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from neuronetes_agent import region as shim

from .devices import GpuProcess

__all__ = [
    "driver_holds_in",
    "process_alive",
    "reclaim_dead",
    "register_host_pids",
    "registered",
    "start_ticks",
]


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


def register_host_pids(
    region: shim.Region, state: shim.NnState, cgroup_procs: Path, proc_root: Path = Path("/proc")
) -> int:
    """Register the host PID of each active slot of `state` (a validated copy) matched by a member
    of the container's cgroup on container PID and start time; returns how many slots got one."""
    found: dict[tuple[int, int], int] = {}
    for pid in _members(cgroup_procs):
        ns = _nspid(proc_root, pid)
        start = start_ticks(proc_root, pid)
        # NSpid's first entry is the PID in proc_root's namespace: it must be the member listed.
        if ns is None or start is None or not ns or ns[0] != pid:
            continue
        found[(ns[-1], start)] = pid
    written = 0
    control = region.control
    for index in range(shim.MAX_PROCS):
        slot = state.procs[index]
        if slot.state != shim.SLOT_ACTIVE or slot.claim_seq == 0:
            continue
        host_pid = found.get((slot.container_pid, slot.start_time_ticks))
        mine = control.procs[index]
        if host_pid is not None and (mine.host_pid, mine.claim_seq) != (host_pid, slot.claim_seq):
            region.set_host_pid(index, host_pid, slot.claim_seq, slot.start_time_ticks)
            written += 1
    return written


def reclaim_dead(
    region: shim.Region,
    state: shim.NnState,
    is_alive: Callable[[int, int], bool],
    driver_holds: Callable[[int], bool],
) -> list[int]:
    """Order the reclaim of every slot of `state` (a validated copy) whose registered host process
    is gone and whose memory the driver no longer holds; returns the slots ordered this round.

    `is_alive(host_pid, start_ticks)` and `driver_holds(host_pid)` are the host's answers
    (`process_alive`, `driver_holds_in` in production), asked about the PID and start time the
    agent registered. Slots without a registration for their current claim are left alone, and a
    slot already ordered is not ordered again.
    """
    ordered: list[int] = []
    control = region.control
    for index in range(shim.MAX_PROCS):
        slot = state.procs[index]
        if slot.state == shim.SLOT_FREE or slot.claim_seq == 0:
            continue
        mine = control.procs[index]
        host_pid, seq, ticks = int(mine.host_pid), int(mine.claim_seq), int(mine.start_time_ticks)
        if host_pid <= 0 or seq != slot.claim_seq or mine.reclaim_claim_seq == seq:
            continue
        if is_alive(host_pid, ticks) or driver_holds(host_pid):
            continue
        region.order_reclaim(index, seq)
        ordered.append(index)
    return ordered


def registered(control: shim.NnControl, state: shim.NnState) -> set[int]:
    """The host PIDs the agent registered for the active slots of `state` (a validated copy)."""
    pids: set[int] = set()
    for index in range(shim.MAX_PROCS):
        slot, mine = state.procs[index], control.procs[index]
        if slot.state == shim.SLOT_ACTIVE and mine.host_pid > 0 and mine.claim_seq == slot.claim_seq != 0:
            pids.add(int(mine.host_pid))
    return pids


def process_alive(proc_root: Path = Path("/proc")) -> Callable[[int, int], bool]:
    """`is_alive` for `reclaim_dead`: the host PID exists and started at the recorded time."""
    return lambda host_pid, ticks: start_ticks(proc_root, host_pid) == ticks


def driver_holds_in(processes: Iterable[GpuProcess]) -> Callable[[int], bool]:
    """`driver_holds` for `reclaim_dead` from NVML's running processes of the node's GPUs
    (`GpuSample.processes`): the host PID still has memory on some GPU."""
    holding = {p.pid for p in processes if p.used_memory_bytes > 0}
    return lambda host_pid: host_pid in holding
