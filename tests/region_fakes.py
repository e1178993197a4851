"""What the shim and the kernel would write, for the agent's region tests: a process claiming a
slot of the container's state file, the shim applying the agent's reclaim orders under its lock,
and a process in a fake ``/proc`` tree (docs/contracts.md "Host PIDs", "Dead processes")."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

from neuronetes_agent import region as shim

MIB = 1 << 20


@contextlib.contextmanager
def state_file(path: Path) -> Iterator[shim.NnState]:
    """The state file as a process of the container changes it (tests only: the agent never writes
    it): a copy to change, written back whole when the block ends."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        view = shim.NnState.from_buffer_copy(os.pread(fd, shim.STATE_SIZE, 0))
        yield view
        os.pwrite(fd, bytes(view), 0)
    finally:
        os.close(fd)


def _recompute(st: shim.NnState) -> None:
    total = 0
    for d in range(shim.MAX_DEVICES):
        used = sum(int(s.used_bytes[d]) for s in st.procs if s.state != shim.SLOT_FREE)
        st.devices[d].memory_used_bytes = used
        st.devices[d].memory_peak_bytes = max(int(st.devices[d].memory_peak_bytes), used)
        total += used
    st.usage.memory_used_bytes = total


def claim(region: shim.Region, slot: int, container_pid: int, start: int, used_mib: int = 0) -> None:
    """What the shim writes when a process claims `slot` and allocates on device 0."""
    with state_file(region.state_path) as st:
        s = st.procs[slot]
        s.container_pid, s.start_time_ticks, s.claim_seq = container_pid, start, slot + 1
        s.used_bytes[0] = used_mib * MIB
        s.state = shim.SLOT_ACTIVE
        del s
        _recompute(st)


def apply_orders(region: shim.Region) -> list[int]:
    """What the shim does at its next lock (src/region.c): free every slot whose claim is the one
    the agent ordered reclaimed, recompute the totals; returns the freed slots."""
    control = region.snapshot_control()
    freed = []
    with state_file(region.state_path) as st:
        for i in range(shim.MAX_PROCS):
            order, s = int(control.procs[i].reclaim_claim_seq), st.procs[i]
            if order and s.state != shim.SLOT_FREE and s.claim_seq == order:
                seq = int(s.claim_seq)
                ctypes.memset(ctypes.addressof(s), 0, ctypes.sizeof(s))
                s.claim_seq = seq
                freed.append(i)
            del s
        st.usage.reclaim_generation_seen = control.container.reclaim_generation
        _recompute(st)
    return freed


def fake_process(proc: Path, host_pid: int, nspid: tuple[int, ...], start: int) -> None:
    """``/proc/<host_pid>/status`` (NSpid) and ``stat`` (start time, field 22) under `proc`."""
    d = proc / str(host_pid)
    d.mkdir(parents=True)
    (d / "status").write_text(
        "Name:\tpython\nNSpid:\t" + "\t".join(str(p) for p in nspid) + "\nUid:\t0\t0\t0\t0\n"
    )
    rest = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 10  # fields 3..21, 22 = start time, more
    (d / "stat").write_text(f"{host_pid} (a) b (c)) " + " ".join(rest) + "\n")
