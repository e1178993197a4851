"""What the shim and the kernel would write, for the agent's region tests: a process claiming a
region slot, and a process in a fake ``/proc`` tree (docs/contracts.md "Host PIDs")."""

from __future__ import annotations

from pathlib import Path

from neuronetes.agent import region as shim

MIB = 1 << 20


def claim(region: shim.Region, slot: int, container_pid: int, start: int, used_mib: int = 0) -> None:
    """What the shim writes when a process claims `slot` and allocates on device 0."""
    s = region.view.procs[slot]
    s.container_pid, s.start_time_ticks, s.claim_seq = container_pid, start, slot + 1
    s.used_bytes[0] = used_mib * MIB
    s.state = shim.SLOT_ACTIVE
    del s
    region.recompute_usage()


def fake_process(proc: Path, host_pid: int, nspid: tuple[int, ...], start: int) -> None:
    """``/proc/<host_pid>/status`` (NSpid) and ``stat`` (start time, field 22) under `proc`."""
    d = proc / str(host_pid)
    d.mkdir(parents=True)
    (d / "status").write_text(
        "Name:\tpython\nNSpid:\t" + "\t".join(str(p) for p in nspid) + "\nUid:\t0\t0\t0\t0\n"
    )
    rest = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 10  # fields 3..21, 22 = start time, more
    (d / "stat").write_text(f"{host_pid} (a) b (c)) " + " ".join(rest) + "\n")
