"""A hostile tenant against the agent's side of the shim region (docs/threat-model.md "Shared
region"): whatever a container writes into its state file — the robust mutex's list pointers, a
lock it never releases, random bytes, out-of-range sizes, indices and counts — the agent neither
crashes, nor waits, nor acts outside that container: it reports that one container and tends the
others as usual.

The agent runs in a child process where it could die (a write through a tenant-chosen pointer is
SIGSEGV at best), and every round is timed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from handoff_support import SYSTEMD_DIR, SYSTEMD_PATH, UID_A, UID_B, cgroup_tree, write_record
from region_fakes import claim, fake_process, state_file

from neuronetes_agent import region as shim
from neuronetes_agent.daemon.containers import ContainerTender
from neuronetes_agent.daemon.regions import RegionKeeper

pytestmark = pytest.mark.unit

UUID = "GPU-fa4e0000-0000-4000-8000-000000000000"
ROUND_LIMIT_S = 0.25  # one region's tend; an honest one takes about a millisecond
# glibc's pthread_mutex_t on 64-bit Linux: __list.__prev at 24, __list.__next at 32 — the pointers
# an unlocking thread writes through.
ROBUST_LIST = shim.NnState.lock.offset + 24

AGENT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from neuronetes_agent.daemon.regions import RegionKeeper
    root, uid, name, rounds, procs, proc_root = sys.argv[1:7]
    keeper = RegionKeeper(Path(root))
    times, errors = [], []
    for _ in range(int(rounds)):
        started = time.monotonic()
        try:
            keeper.tend(uid, name, Path(procs), lambda pid: False, Path(proc_root))
        except Exception as exc:
            errors.append(repr(exc))
        times.append(time.monotonic() - started)
    pids = sorted(keeper.registered_host_pids(uid, name))
    print(json.dumps({"max_s": max(times), "errors": errors[:3], "pids": pids}))
    """
)

TENANT = textwrap.dedent(
    """
    import ctypes, mmap, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR)
    mm = mmap.mmap(fd, 0)
    lock, at = int(sys.argv[2]), int(sys.argv[3])
    if sys.argv[4] == "hold":  # take the container's lock and never give it back
        buf = (ctypes.c_char * len(mm)).from_buffer(mm)
        assert ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(ctypes.addressof(buf) + lock)) == 0
        print("ready", flush=True)
        time.sleep(3600)
    junk = bytes.fromhex("4141414141414141") * 2  # a non-canonical address for both list pointers
    print("ready", flush=True)
    while True:
        mm[at : at + 16] = junk
    """
)


def container(tmp_path: Path, keeper: RegionKeeper, uid: str, host_pid: int) -> Path:
    """A region whose container has one process (container PID 7) claiming slot 0, and the fake
    /proc and cgroup.procs the agent finds its host PID through; returns the cgroup.procs file."""
    with shim.create_region(
        keeper.directory(uid, "main"), [shim.DeviceLimit.from_mib(UUID, 1024, 8192)]
    ) as r:
        claim(r, 0, 7, 1000 + host_pid, used_mib=10)
    fake_process(tmp_path / "proc", host_pid, (host_pid, 7), 1000 + host_pid)
    procs = tmp_path / f"{uid}.procs"
    procs.write_text(f"{host_pid}\n")
    return procs


@pytest.mark.parametrize("mode", ["scribble", "hold"])
def test_a_tenant_working_the_lock_cannot_crash_or_stall_the_agent(tmp_path: Path, mode: str) -> None:
    """The tenant rewrites the robust mutex's list pointers as fast as it can, or holds the lock
    forever, while the agent tends the region 300 times. Before the region was split, the agent
    locked that mutex: it died of SIGSEGV within 300 rounds, or waited out a 1 s timeout a round."""
    keeper = RegionKeeper(tmp_path / "containers")
    procs = container(tmp_path, keeper, UID_A, 4242)
    state = keeper.state_path(UID_A, "main")
    tenant = subprocess.Popen(
        [sys.executable, "-c", TENANT, str(state), str(shim.NnState.lock.offset), str(ROBUST_LIST), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert tenant.stdout is not None and tenant.stdout.readline().strip() == "ready"
        agent = subprocess.run(
            [
                sys.executable,
                "-c",
                AGENT,
                str(keeper.root),
                UID_A,
                "main",
                "300",
                str(procs),
                str(tmp_path / "proc"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        tenant.kill()
        tenant.wait(timeout=10)
        assert tenant.stdout is not None
        tenant.stdout.close()
    assert agent.returncode == 0, f"the agent died: rc={agent.returncode} {agent.stderr[-500:]}"
    result = json.loads(agent.stdout)
    assert result["errors"] == [], result
    assert result["max_s"] < ROUND_LIMIT_S, result
    assert result["pids"] == [4242]  # and its work was done: the host PID is registered


def _random_body(path: Path) -> None:
    data = bytearray(path.read_bytes())
    head = ctypes.sizeof(shim.NnFileHeader)
    data[head:] = os.urandom(len(data) - head)  # a valid header, everything else random
    path.write_bytes(bytes(data))


def _random_file(path: Path) -> None:
    path.write_bytes(os.urandom(shim.STATE_SIZE))


def _truncated(path: Path) -> None:
    os.truncate(path, 100)


def _grown(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\0" * 4096)


def _header(field: str, fmt: str, value: int):  # type: ignore[no-untyped-def]
    def spoil(path: Path) -> None:
        data = bytearray(path.read_bytes())
        struct.pack_into(fmt, data, getattr(shim.NnFileHeader, field).offset, value)
        path.write_bytes(bytes(data))

    return spoil


def _slot(**fields: int):  # type: ignore[no-untyped-def]
    def spoil(path: Path) -> None:
        with state_file(path) as st:
            for name, value in fields.items():
                if name == "used_bytes":
                    st.procs[0].used_bytes[0] = value
                else:
                    setattr(st.procs[0], name, value)

    return spoil


def _device(**fields: int):  # type: ignore[no-untyped-def]
    def spoil(path: Path) -> None:
        with state_file(path) as st:
            for name, value in fields.items():
                setattr(st.devices[0], name, value)

    return spoil


CORRUPTIONS = {
    "random body": _random_body,
    "random file": _random_file,
    "truncated": _truncated,
    "grown": _grown,
    "file_size": _header("file_size", "<Q", 1 << 40),
    "proc_slot_size": _header("proc_slot_size", "<I", 1 << 30),
    "max_procs": _header("max_procs", "<I", 1 << 20),
    "max_devices": _header("max_devices", "<I", 0),
    "old major": _header("version_major", "<H", 1),
    "other pair": _header("pair_id", "<Q", 7),
    "slot state": _slot(state=7),
    "slot pid": _slot(container_pid=-1),
    "slot claim": _slot(claim_seq=(1 << 64) - 1),
    "slot bytes": _slot(used_bytes=(1 << 64) - 1),
    "device bytes": _device(memory_used_bytes=1 << 62),
    "device counter": _device(kernel_ns_total=(1 << 64) - 1),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupted_state_file_costs_only_its_own_container(tmp_path: Path, corruption: str) -> None:
    state_dir, cg, proc = tmp_path / "state", tmp_path / "cg", tmp_path / "proc"
    keeper = RegionKeeper(state_dir / "containers")
    container(tmp_path, keeper, UID_A, 4242)
    container(tmp_path, keeper, UID_B, 4300)
    other = f"/kubepods/pod{UID_B}/c"
    write_record(state_dir, UID_A, "main", SYSTEMD_PATH, time.time())
    cgroup_tree(cg, 2, SYSTEMD_DIR, 4242)
    write_record(state_dir, UID_B, "main", other, time.time())
    cgroup_tree(cg, 2, other[1:], 4300)
    CORRUPTIONS[corruption](keeper.state_path(UID_A, "main"))
    tender = ContainerTender(state_dir, keeper, cgroup_root=cg, proc_root=proc, clock=time.time)
    started = time.monotonic()
    report = tender.tend({}, [])
    assert time.monotonic() - started < ROUND_LIMIT_S
    assert len(report.warnings) == 1 and f"pod {UID_A} container main" in report.warnings[0], report.warnings
    assert report.registered == 1 and report.live == {UID_A, UID_B}
    # the corrupted container: no reading, no host PID; the other one as if nothing happened
    assert keeper.read(UID_A, "main") == []
    with pytest.raises(shim.RegionError):  # the reconciliation then counts none of its processes shimmed
        keeper.registered_host_pids(UID_A, "main")
    assert keeper.registered_host_pids(UID_B, "main") == {4300}
    (reading,) = keeper.read(UID_B, "main")
    assert reading.memory_used_bytes == 10 << 20 and reading.uuid == UUID
    with shim.open_region(keeper.directory(UID_A, "main"), writable=False) as region:
        assert region.snapshot_control().procs[0].host_pid == 0  # nothing written for it


def test_state_corrupted_while_the_agent_reads_never_escapes(tmp_path: Path) -> None:
    """A tenant rewriting its state file with random bytes while the agent tends and reads it:
    every round ends in a reading, a result or a `RegionError` (the report), never another
    exception."""
    keeper = RegionKeeper(tmp_path / "containers")
    procs = container(tmp_path, keeper, UID_A, 4242)
    path = keeper.state_path(UID_A, "main")
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY)\nhead = int(sys.argv[2])\n"
            "while True:\n"
            "    os.pwrite(fd, os.urandom(4096), head + int.from_bytes(os.urandom(2)) % 60000)\n",
            str(path),
            str(ctypes.sizeof(shim.NnFileHeader)),
        ]
    )
    try:
        for _ in range(200):
            with contextlib.suppress(shim.RegionError):  # reported; nothing else may come out
                keeper.tend(UID_A, "main", procs, lambda pid: False, tmp_path / "proc")
            keeper.read(UID_A, "main")
            with contextlib.suppress(shim.RegionError):
                keeper.registered_host_pids(UID_A, "main")
    finally:
        writer.kill()
        writer.wait(timeout=10)
