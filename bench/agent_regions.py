"""The node agent's round over one node's shim regions: honest containers against hostile ones.

One node's state under a temporary directory, as the agent sees it: ``--regions`` containers (100),
each with its region (control and state file, written by the agent's own `create_region`), the NRI
plugin's container record, a cgroup (v2 layout) listing its two processes, and those processes in a
fake ``/proc`` (NSpid, start time). A round is what the agent does per poll and per scrape:
`ContainerTender.tend` over every record (read each state file, register host PIDs, order reclaims)
and `RegionKeeper.read` of every container (the per-slice metrics).

- **honest**: each container's two processes hold slots 0 and 1 of its state file (as the shim
  writes them) with memory charged; the agent registers their host PIDs.
- **hostile**: every container's state file has its robust mutex held by another process forever
  (one process holds all of them) with the mutex's robust-list pointers overwritten, and then, in
  turn, one of: random bytes over the whole file; a valid header with random bytes after it; header
  sizes out of range (file size 1 TiB, 2²⁰ slots, slot size 1 GiB); valid sizes with slot and
  device values out of range (state 7, PID −1, claim 2⁶⁴−1, 2⁶⁴−1 bytes, a device counter of
  2⁶⁴−1); or the most work a valid file can ask for (all 128 slots live, none of them a process
  of the container's cgroup). The agent reports the first four kinds and registers nothing for
  any of them.

Rounds alternate between the two nodes (``--rounds`` of each), so drift of the machine affects both
alike; the figures are the median and the slowest round. The hostile median must be within 10 % of
the honest one (lower is fine: a region refused at its header costs less than one read in full).

    python bench/agent_regions.py --regions 100 --rounds 30
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import mmap
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from neuronetes_agent import region as shim
from neuronetes_agent.daemon.containers import RECORDS_DIR, ContainerTender
from neuronetes_agent.daemon.devices import GpuProcess
from neuronetes_agent.daemon.regions import RegionKeeper

UUID = "GPU-fa4e0000-0000-4000-8000-000000000000"
MIB = 1 << 20
# glibc's pthread_mutex_t on 64-bit Linux: __list.__prev at 24, __list.__next at 32.
ROBUST_LIST = shim.field_offset(shim.NnState, "lock") + 24

HOLDER = textwrap.dedent(
    """
    import ctypes, mmap, os, sys, time
    libc = ctypes.CDLL(None)
    keep = []
    for path in sys.argv[2:]:
        fd = os.open(path, os.O_RDWR)
        mm = mmap.mmap(fd, 0)
        os.close(fd)
        buf = (ctypes.c_char * len(mm)).from_buffer(mm)
        assert libc.pthread_mutex_lock(ctypes.c_void_p(ctypes.addressof(buf) + int(sys.argv[1]))) == 0
        keep.append((mm, buf))
    print("held", flush=True)
    time.sleep(1e9)
    """
)


def log(msg: str) -> None:
    print(f">> {msg}", file=sys.stderr, flush=True)


class Node:
    """One node's state directory with `n` containers, their records, cgroups and processes."""

    def __init__(self, root: Path, n: int) -> None:
        self.state, self.cg, self.proc = root / "state", root / "cg", root / "proc"
        self.keeper = RegionKeeper(self.state / "containers")
        self.uids = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(n)]
        self.processes: list[GpuProcess] = []
        self.cg.mkdir(parents=True)
        (self.cg / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (self.state / RECORDS_DIR).mkdir(parents=True, mode=0o700)
        for i, uid in enumerate(self.uids):
            host = [100_000 + 2 * i, 100_001 + 2 * i]
            with shim.create_region(
                self.keeper.directory(uid, "main"), [shim.DeviceLimit(UUID, 1 << 30, 80 << 30)]
            ):
                pass
            self._claim(self.keeper.state_path(uid, "main"), host)
            for k, pid in enumerate(host):
                self._process(pid, k + 1)
                self.processes.append(GpuProcess(pid, 64 * MIB))
            rel = f"kubepods/pod{uid}/c{i}"
            (self.cg / rel).mkdir(parents=True)
            (self.cg / rel / "cgroup.procs").write_text("".join(f"{p}\n" for p in host))
            record = {
                "version": 1,
                "podUID": uid,
                "namespace": "bench",
                "pod": f"p{i}",
                "container": "main",
                "containerID": f"{i:064x}",
                "cgroupsPath": "/" + rel,
                "regionDir": str(self.keeper.directory(uid, "main")),
                "writtenAt": "2026-11-26T00:00:00Z",
            }
            (self.state / RECORDS_DIR / f"{uid}.main.json").write_text(json.dumps(record))
        self.tender = ContainerTender(
            self.state, self.keeper, cgroup_root=self.cg, proc_root=self.proc, clock=time.time
        )

    @staticmethod
    def _claim(path: Path, host: list[int]) -> None:
        """What the shim writes for two processes (container PIDs 1 and 2) holding 64 MiB each."""
        fd = os.open(path, os.O_RDWR)
        try:
            st = shim.NnState.from_buffer_copy(os.pread(fd, shim.STATE_SIZE, 0))
            for k in range(len(host)):
                slot = st.procs[k]
                slot.container_pid, slot.start_time_ticks, slot.claim_seq = k + 1, 5000 + k, 1
                slot.used_bytes[0] = 64 * MIB
                slot.state = shim.SLOT_ACTIVE
            st.devices[0].memory_used_bytes = st.usage.memory_used_bytes = 64 * MIB * len(host)
            st.devices[0].memory_peak_bytes = 64 * MIB * len(host)
            os.pwrite(fd, bytes(st), 0)
        finally:
            os.close(fd)

    def _process(self, host_pid: int, container_pid: int) -> None:
        d = self.proc / str(host_pid)
        d.mkdir(parents=True)
        (d / "status").write_text(f"Name:\tpython\nNSpid:\t{host_pid}\t{container_pid}\n")
        fields = ["S"] + ["0"] * 18 + [str(5000 + container_pid - 1)] + ["0"] * 10
        (d / "stat").write_text(f"{host_pid} (python) " + " ".join(fields) + "\n")

    def round(self) -> tuple[float, tuple[int, int, int]]:
        """One poll and one scrape: seconds, and (containers tended, containers reported, readings)."""
        started = time.perf_counter()
        report = self.tender.tend({}, self.processes)
        readings = sum(len(self.keeper.read(uid, "main")) for uid in self.uids)
        return time.perf_counter() - started, (report.registered, len(report.warnings), readings)


def corrupt(path: Path, kind: int) -> None:
    """The hostile contents of one state file (its lock already held by the holder)."""
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mm[ROBUST_LIST : ROBUST_LIST + 16] = bytes.fromhex("4141414141414141") * 2
        head = ctypes.sizeof(shim.NnFileHeader)
        lock_start = shim.field_offset(shim.NnState, "lock")
        lock_end = lock_start + ctypes.sizeof(shim.NnLock)
        if kind == 0:  # random bytes, all of it
            mm[:] = os.urandom(len(mm))
        elif kind == 1:  # a valid header, random bytes after it (the held lock kept)
            mm[head:lock_start] = os.urandom(lock_start - head)
            mm[lock_end:] = os.urandom(len(mm) - lock_end)
        elif kind == 2:  # sizes out of range
            struct.pack_into("<Q", mm, shim.field_offset(shim.NnFileHeader, "file_size"), 1 << 40)
            struct.pack_into("<I", mm, shim.field_offset(shim.NnFileHeader, "max_procs"), 1 << 20)
            struct.pack_into("<I", mm, shim.field_offset(shim.NnFileHeader, "proc_slot_size"), 1 << 30)
        elif kind == 3:  # indices, counts and values out of range in a valid layout
            st = shim.NnState.from_buffer_copy(mm)
            st.procs[0].state = 7
            st.procs[1].container_pid = -1
            st.procs[1].claim_seq = (1 << 64) - 1
            st.procs[1].used_bytes[0] = (1 << 64) - 1
            st.devices[0].kernel_ns_total = (1 << 64) - 1
            mm[lock_end:] = bytes(st)[lock_end:]
        else:  # the most work a valid file can ask for: every slot live, none of them the cgroup's
            st = shim.NnState.from_buffer_copy(mm)
            for i in range(shim.MAX_PROCS):
                slot = st.procs[i]
                slot.state, slot.container_pid, slot.claim_seq = shim.SLOT_ACTIVE, 1000 + i, 1 + i
                slot.start_time_ticks, slot.used_bytes[0] = 1, 1 << 20
            mm[lock_end:] = bytes(st)[lock_end:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--regions", type=int, default=100)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--json", type=Path, help="write the figures here")
    ns = p.parse_args()
    holder: subprocess.Popen[str] | None = None
    with tempfile.TemporaryDirectory(prefix="nn-agent-regions-") as tmp:
        honest, hostile = Node(Path(tmp) / "honest", ns.regions), Node(Path(tmp) / "hostile", ns.regions)
        states = [hostile.keeper.state_path(uid, "main") for uid in hostile.uids]
        try:
            holder = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    HOLDER,
                    str(shim.field_offset(shim.NnState, "lock")),
                    *map(str, states),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            for i, path in enumerate(states):
                corrupt(path, i % 5)
            log(f"{ns.regions} regions per node; {ns.rounds} rounds of each, alternating")
            times: dict[str, list[float]] = {"honest": [], "hostile": []}
            seen: dict[str, tuple[int, int, int]] = {}
            for _ in range(ns.rounds):
                for name, node in (("honest", honest), ("hostile", hostile)):
                    seconds, seen[name] = node.round()
                    times[name].append(seconds)
        finally:
            if holder is not None:
                holder.kill()
                holder.wait(timeout=10)
                if holder.stdout is not None:
                    holder.stdout.close()
    result: dict[str, Any] = {"regions": ns.regions, "rounds": ns.rounds}
    for name, values in times.items():
        result[f"{name}_median_ms"] = round(1000 * statistics.median(values), 2)
        result[f"{name}_max_ms"] = round(1000 * max(values), 2)
        tended, reported, readings = seen[name]
        result[f"{name}_containers_tended"] = tended
        result[f"{name}_containers_reported"] = reported
        result[f"{name}_readings"] = readings
    result["hostile_over_honest"] = round(result["hostile_median_ms"] / result["honest_median_ms"], 3)
    result["within_10_percent"] = result["hostile_over_honest"] <= 1.10
    result["cpus"] = os.cpu_count()
    result["load_average_1m"] = round(os.getloadavg()[0], 1)
    print(json.dumps(result, indent=2))
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(result, indent=2) + "\n")
    ok = (
        result["within_10_percent"]
        and seen["honest"] == (ns.regions, 0, ns.regions)
        and seen["hostile"][2] <= ns.regions // 5  # only the valid-but-busy fifth is read
    )
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
