"""Python mirror of the CUDA shim's shared region (``node-agent/shim/include/neuronetes_region.h``).

A region is two files in one directory per container with a GPU assignment (docs/contracts.md
"The shim's shared region"):

- ``control`` — the agent's file: limits, compute shares, the control word (admit, pause, drain),
  priority, QoS, device entries, and per process slot the host PID and the reclaim order. The
  agent keeps it mapped read-write (`Region`); containers map it read-only.
- ``state`` — the container's file: the shim processes' robust mutex, their process slots and
  per-device usage and counters. The agent initialises it once (`create_region`) and afterwards
  only reads it: `read_state` takes a bounded ``pread`` into a private copy and validates the
  header, `state_problems` every value the agent uses. It never maps it, never locks its mutex and
  never follows or trusts a pointer or a size found in it, so what a tenant writes there can make
  the agent misreport (or evict) that one container and nothing else.

``tests/unit/test_region_layout.py`` compiles the header and checks that these ctypes structures
agree with it byte for byte.

This module is over 400 lines because it is the one mirror of one wire format, the header: the
layout test checks every structure, constant and validation rule here against the C side byte for
byte, and creating a region (sizes, magic, pair id, the robust mutex) follows the same header, so
they stay in one file; a split would put one format's rules in several places to compare.

Every reader validates before it trusts anything: magic, major version, every recorded size, the
pair id shared by both files. A mismatch raises `RegionError` — the caller must fail closed (the
agent reports the container, the shim refuses CUDA), never fall back to running unlimited.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import secrets
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

__all__ = [
    "CONTROL_MAGIC",
    "CONTROL_NAME",
    "CONTROL_PATH",
    "CONTROL_SIZE",
    "CTL_ADMITTED",
    "CTL_DRAINING",
    "CTL_PAUSED",
    "DEFAULT_PACING_WINDOW_NS",
    "DEV_F_MIG",
    "LOCK_STORAGE_BYTES",
    "MAX_DEVICES",
    "MAX_PROCS",
    "NAME_BYTES",
    "POD_UID_BYTES",
    "PROC_F_ADMITTED",
    "PROC_F_CAPTURING",
    "QOS_BEST_EFFORT",
    "QOS_BURSTABLE",
    "QOS_GUARANTEED",
    "REGION_DIR",
    "REGION_F_READY",
    "REGION_F_WORKSTATION",
    "REGION_VERSION_MAJOR",
    "REGION_VERSION_MINOR",
    "SLOT_ACTIVE",
    "SLOT_DEAD",
    "SLOT_FREE",
    "STATE_MAGIC",
    "STATE_NAME",
    "STATE_PATH",
    "STATE_SIZE",
    "UUID_BYTES",
    "DeviceLimit",
    "NnContainer",
    "NnControl",
    "NnDeviceControl",
    "NnDeviceUsage",
    "NnFileHeader",
    "NnLock",
    "NnProcControl",
    "NnProcSlot",
    "NnState",
    "NnUsage",
    "Region",
    "RegionError",
    "create_region",
    "open_region",
    "read_state",
    "state_problems",
    "validate_control",
    "validate_state",
]

# ---- constants (the header's #defines, NN_ prefix dropped) ------------------------------------

CONTROL_MAGIC: Final = 0x4C52544E4F434E4E  # b"NNCONTRL" little-endian
STATE_MAGIC: Final = 0x5345544154534E4E  # b"NNSTATES" little-endian
REGION_VERSION_MAJOR: Final = 2
REGION_VERSION_MINOR: Final = 0
MAX_DEVICES: Final = 16
MAX_PROCS: Final = 128
UUID_BYTES: Final = 64
LOCK_STORAGE_BYTES: Final = 64
POD_UID_BYTES: Final = 40
NAME_BYTES: Final = 64
CONTROL_SIZE: Final = 16384
STATE_SIZE: Final = 65536
DEFAULT_PACING_WINDOW_NS: Final = 10_000_000
REGION_DIR: Final = "/run/neuronetes"
CONTROL_NAME: Final = "control"
STATE_NAME: Final = "state"
CONTROL_PATH: Final = f"{REGION_DIR}/{CONTROL_NAME}"
STATE_PATH: Final = f"{REGION_DIR}/{STATE_NAME}"

REGION_F_READY: Final = 1 << 0
REGION_F_WORKSTATION: Final = 1 << 1
QOS_GUARANTEED: Final = 1
QOS_BURSTABLE: Final = 2
QOS_BEST_EFFORT: Final = 3
CTL_ADMITTED: Final = 1 << 0
CTL_PAUSED: Final = 1 << 1
CTL_DRAINING: Final = 1 << 2
DEV_F_MIG: Final = 1 << 0
SLOT_FREE: Final = 0
SLOT_ACTIVE: Final = 1
SLOT_DEAD: Final = 2
PROC_F_ADMITTED: Final = 1 << 0
PROC_F_CAPTURING: Final = 1 << 1

_MIB: Final = 1 << 20
_U63: Final = (1 << 63) - 1  # the largest value a byte count or counter may hold
_PID_MAX: Final = 1 << 22  # the kernel's PID_MAX_LIMIT


class RegionError(RuntimeError):
    """A region that must not be used: wrong magic, version, sizes or pair, truncated, not ready,
    or (state file) a value out of range. Fail closed."""


# ---- the layout --------------------------------------------------------------------------------
# Field names are the C field names; `_c_name_` is the C typedef. The layout test generates a C
# program from these lists, so every field here is checked against the header.


class NnFileHeader(ctypes.Structure):
    _c_name_ = "nn_file_header"
    _fields_ = [
        ("magic", ctypes.c_uint64),
        ("version_major", ctypes.c_uint16),
        ("version_minor", ctypes.c_uint16),
        ("header_size", ctypes.c_uint32),
        ("file_size", ctypes.c_uint64),
        ("device_entry_size", ctypes.c_uint32),
        ("proc_slot_size", ctypes.c_uint32),
        ("max_devices", ctypes.c_uint32),
        ("max_procs", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("creator_pid", ctypes.c_uint32),
        ("created_realtime_ns", ctypes.c_uint64),
        ("pair_id", ctypes.c_uint64),
        ("reserved", ctypes.c_uint8 * 64),
    ]
    if TYPE_CHECKING:
        magic: int
        version_major: int
        version_minor: int
        header_size: int
        file_size: int
        device_entry_size: int
        proc_slot_size: int
        max_devices: int
        max_procs: int
        flags: int
        creator_pid: int
        created_realtime_ns: int
        pair_id: int


class NnContainer(ctypes.Structure):
    _c_name_ = "nn_container"
    _fields_ = [
        ("memory_limit_bytes", ctypes.c_uint64),
        ("pacing_window_ns", ctypes.c_uint64),
        ("priority", ctypes.c_int32),
        ("qos", ctypes.c_uint32),
        ("control", ctypes.c_uint32),
        ("device_count", ctypes.c_uint32),
        ("reclaim_generation", ctypes.c_uint64),
        ("pod_uid", ctypes.c_char * POD_UID_BYTES),
        ("namespace_", ctypes.c_char * NAME_BYTES),
        ("container_name", ctypes.c_char * NAME_BYTES),
        ("reserved", ctypes.c_uint8 * 48),
    ]
    if TYPE_CHECKING:
        memory_limit_bytes: int
        pacing_window_ns: int
        priority: int
        qos: int
        control: int
        device_count: int
        reclaim_generation: int
        pod_uid: bytes
        namespace_: bytes
        container_name: bytes


class NnDeviceControl(ctypes.Structure):
    _c_name_ = "nn_device_control"
    _fields_ = [
        ("uuid", ctypes.c_char * UUID_BYTES),
        ("memory_limit_bytes", ctypes.c_uint64),
        ("memory_total_bytes", ctypes.c_uint64),
        ("compute_share_percent", ctypes.c_uint32),
        ("host_index", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("mig_start", ctypes.c_uint32),
        ("reserved", ctypes.c_uint8 * 32),
    ]
    if TYPE_CHECKING:
        uuid: bytes
        memory_limit_bytes: int
        memory_total_bytes: int
        compute_share_percent: int
        host_index: int
        flags: int
        mig_start: int


class NnProcControl(ctypes.Structure):
    _c_name_ = "nn_proc_control"
    _fields_ = [
        ("host_pid", ctypes.c_int32),
        ("reserved0", ctypes.c_uint32),
        ("claim_seq", ctypes.c_uint64),
        ("start_time_ticks", ctypes.c_uint64),
        ("reclaim_claim_seq", ctypes.c_uint64),
    ]
    if TYPE_CHECKING:
        host_pid: int
        claim_seq: int
        start_time_ticks: int
        reclaim_claim_seq: int


class NnControl(ctypes.Structure):
    _c_name_ = "nn_control"
    _fields_ = [
        ("header", NnFileHeader),
        ("container", NnContainer),
        ("devices", NnDeviceControl * MAX_DEVICES),
        ("procs", NnProcControl * MAX_PROCS),
        ("reserved", ctypes.c_uint8 * 9856),
    ]
    if TYPE_CHECKING:
        header: NnFileHeader
        container: NnContainer
        devices: ctypes.Array[NnDeviceControl]
        procs: ctypes.Array[NnProcControl]


class NnLock(ctypes.Structure):
    _c_name_ = "nn_lock"
    _fields_ = [
        ("storage", ctypes.c_uint8 * LOCK_STORAGE_BYTES),  # union { pthread_mutex_t mutex; ... }
        ("owner_died_total", ctypes.c_uint64),
        ("reserved", ctypes.c_uint8 * 56),
    ]
    if TYPE_CHECKING:
        owner_died_total: int


class NnUsage(ctypes.Structure):
    _c_name_ = "nn_usage"
    _fields_ = [
        ("memory_used_bytes", ctypes.c_uint64),
        ("reclaim_generation_seen", ctypes.c_uint64),
        ("reserved", ctypes.c_uint8 * 48),
    ]
    if TYPE_CHECKING:
        memory_used_bytes: int
        reclaim_generation_seen: int


class NnDeviceUsage(ctypes.Structure):
    _c_name_ = "nn_device_usage"
    _fields_ = [
        ("memory_used_bytes", ctypes.c_uint64),
        ("memory_peak_bytes", ctypes.c_uint64),
        ("kernel_ns_total", ctypes.c_uint64),
        ("throttled_ns_total", ctypes.c_uint64),
        ("oom_refusals_total", ctypes.c_uint64),
        ("reserved", ctypes.c_uint8 * 24),
    ]
    if TYPE_CHECKING:
        memory_used_bytes: int
        memory_peak_bytes: int
        kernel_ns_total: int
        throttled_ns_total: int
        oom_refusals_total: int


class NnProcSlot(ctypes.Structure):
    _c_name_ = "nn_proc_slot"
    _fields_ = [
        ("state", ctypes.c_uint32),
        ("container_pid", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("reserved_u32", ctypes.c_uint32),
        ("start_time_ticks", ctypes.c_uint64),
        ("claim_seq", ctypes.c_uint64),
        ("heartbeat_ns", ctypes.c_uint64),
        ("window_index", ctypes.c_uint64),
        ("reserved0", ctypes.c_uint8 * 16),
        ("used_bytes", ctypes.c_uint64 * MAX_DEVICES),
        ("kernel_ns", ctypes.c_uint64 * MAX_DEVICES),
        ("reserved1", ctypes.c_uint8 * 64),
    ]
    if TYPE_CHECKING:
        state: int
        container_pid: int
        flags: int
        start_time_ticks: int
        claim_seq: int
        heartbeat_ns: int
        window_index: int
        used_bytes: ctypes.Array[ctypes.c_uint64]
        kernel_ns: ctypes.Array[ctypes.c_uint64]


class NnState(ctypes.Structure):
    _c_name_ = "nn_state"
    _fields_ = [
        ("header", NnFileHeader),
        ("lock", NnLock),
        ("usage", NnUsage),
        ("devices", NnDeviceUsage * MAX_DEVICES),
        ("procs", NnProcSlot * MAX_PROCS),
        ("reserved", ctypes.c_uint8 * 15040),
    ]
    if TYPE_CHECKING:
        header: NnFileHeader
        lock: NnLock
        usage: NnUsage
        devices: ctypes.Array[NnDeviceUsage]
        procs: ctypes.Array[NnProcSlot]


STRUCTURES: Final[tuple[type[ctypes.Structure], ...]] = (
    NnFileHeader,
    NnContainer,
    NnDeviceControl,
    NnProcControl,
    NnControl,
    NnLock,
    NnUsage,
    NnDeviceUsage,
    NnProcSlot,
    NnState,
)
"""Every mirrored structure, for the layout test."""

if ctypes.sizeof(NnControl) != CONTROL_SIZE or ctypes.sizeof(NnState) != STATE_SIZE:  # pragma: no cover
    raise ImportError("region mirror sizes differ from CONTROL_SIZE / STATE_SIZE")

# ---- validation ------------------------------------------------------------------------------

# Per file: magic, the structure (its size is the file size), device entry and slot structures.
_FILES: Final = {
    CONTROL_NAME: (CONTROL_MAGIC, NnControl, NnDeviceControl, NnProcControl),
    STATE_NAME: (STATE_MAGIC, NnState, NnDeviceUsage, NnProcSlot),
}


def _validate_header(buf: bytes | bytearray | memoryview | mmap.mmap, name: str, require_ready: bool) -> None:
    magic, whole, entry, slot = _FILES[name]
    size = len(buf)
    if size < ctypes.sizeof(NnFileHeader):
        raise RegionError(f"{name} file is {size} bytes, smaller than its header")
    header = NnFileHeader.from_buffer_copy(bytes(buf[: ctypes.sizeof(NnFileHeader)]))
    if header.magic != magic:
        raise RegionError(
            f"{name} file: bad magic {header.magic:#018x} (expected {magic:#018x}): "
            f"not a NeuroNetes {name} file"
        )
    if header.version_major != REGION_VERSION_MAJOR:
        raise RegionError(
            f"{name} file: region version {header.version_major}.{header.version_minor} is not readable by "
            f"this code (major {REGION_VERSION_MAJOR}); agent and shim must come from compatible releases"
        )
    expected = {
        "header_size": ctypes.sizeof(NnFileHeader),
        "file_size": ctypes.sizeof(whole),
        "device_entry_size": ctypes.sizeof(entry),
        "proc_slot_size": ctypes.sizeof(slot),
        "max_devices": MAX_DEVICES,
        "max_procs": MAX_PROCS,
    }
    wrong = [
        f"{k}={getattr(header, k)} (expected {v})" for k, v in expected.items() if getattr(header, k) != v
    ]
    if wrong:
        raise RegionError(f"{name} file: region layout mismatch: " + ", ".join(wrong))
    if size != ctypes.sizeof(whole):
        raise RegionError(
            f"{name} file is {size} bytes, expected {ctypes.sizeof(whole)} (truncated or padded file)"
        )
    if require_ready and not header.flags & REGION_F_READY:
        raise RegionError(f"{name} file: region is not ready (the agent has not finished writing it)")


def field_offset(struct: type[ctypes.Structure], field: str) -> int:
    """Byte offset of `field` in `struct` (its ctypes descriptor's ``offset``; the typed annotations
    above describe instances, so the class attribute is read by name)."""
    return int(getattr(struct, field).offset)


def validate_control(buf: bytes | bytearray | memoryview | mmap.mmap, *, require_ready: bool = True) -> None:
    """Check that `buf` holds a control file this code can use; raise `RegionError` naming what is
    wrong (as the shim checks it: header, a QoS class, 1..MAX_DEVICES devices)."""
    _validate_header(buf, CONTROL_NAME, require_ready)
    container = NnContainer.from_buffer_copy(
        bytes(buf[NnControl.container.offset : NnControl.container.offset + ctypes.sizeof(NnContainer)])
    )
    if container.qos not in (QOS_GUARANTEED, QOS_BURSTABLE, QOS_BEST_EFFORT):
        raise RegionError(f"control file: region has no QoS class ({container.qos})")
    if not 1 <= container.device_count <= MAX_DEVICES:
        raise RegionError(f"control file: region lists {container.device_count} devices (1..{MAX_DEVICES})")


def validate_state(buf: bytes | bytearray | memoryview | mmap.mmap, *, require_ready: bool = True) -> None:
    """Check that `buf` holds a state file this code can use (header only); raise `RegionError`."""
    _validate_header(buf, STATE_NAME, require_ready)


def state_problems(state: NnState, control: NnControl) -> list[str]:
    """What is out of range in a private copy of a state file, judged against the agent's own
    control file: the pair id, and every value the agent reads — device totals and counters of the
    control file's devices (byte counts at most the device's memory or limit, whichever is larger;
    counters below 2⁶³), slot states, and of live slots the container PID, claim number and
    per-device bytes. Empty when
    the copy is usable. Only single fields are checked: the shim updates fields one at a time, so a
    copy taken while it runs may be inconsistent across fields, never within one."""
    problems: list[str] = []
    if state.header.pair_id != control.header.pair_id:
        return ["the state file belongs to another region than the control file (pair id)"]
    count = min(int(control.container.device_count), MAX_DEVICES)  # the agent's own value
    caps = [
        max(int(control.devices[d].memory_total_bytes), int(control.devices[d].memory_limit_bytes))
        for d in range(count)
    ]
    if state.usage.memory_used_bytes > _U63:
        problems.append(f"usage.memory_used_bytes {state.usage.memory_used_bytes} out of range")
    for d in range(count):
        dev = state.devices[d]
        for name in ("memory_used_bytes", "memory_peak_bytes"):
            if getattr(dev, name) > caps[d]:
                problems.append(f"devices[{d}].{name} {getattr(dev, name)} above the device's {caps[d]}")
        for name in ("kernel_ns_total", "throttled_ns_total", "oom_refusals_total"):
            if getattr(dev, name) > _U63:
                problems.append(f"devices[{d}].{name} {getattr(dev, name)} out of range")
    for i in range(MAX_PROCS):
        slot = state.procs[i]
        if slot.state not in (SLOT_FREE, SLOT_ACTIVE, SLOT_DEAD):
            problems.append(f"procs[{i}].state {slot.state} is not a slot state")
            continue
        if slot.state == SLOT_FREE:
            continue
        if not 0 < slot.container_pid <= _PID_MAX:
            problems.append(f"procs[{i}].container_pid {slot.container_pid} out of range")
        if not 0 < slot.claim_seq <= _U63:
            problems.append(f"procs[{i}].claim_seq {slot.claim_seq} out of range")
        used = slot.used_bytes
        problems.extend(
            f"procs[{i}].used_bytes[{d}] {used[d]} above the device's {caps[d]}"
            for d in range(count)
            if used[d] > caps[d]
        )
    return problems


def read_state(path: str | os.PathLike[str]) -> NnState:
    """A private copy of the state file at `path`, its header validated: one bounded ``pread``
    (never a mapping — a tenant can truncate the file under a reader, which would be SIGBUS), of a
    regular file opened without following a symlink.

    Raises:
        RegionError: not a state file this code can use (size, magic, version, layout, not ready).
        OSError: the file cannot be opened or read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RegionError(f"{path}: not a regular file")
        data = os.pread(fd, STATE_SIZE + 1, 0)  # one byte more: a longer file is caught too
    finally:
        os.close(fd)
    try:
        validate_state(data)
    except RegionError as exc:
        raise RegionError(f"{path}: {exc}") from None
    return NnState.from_buffer_copy(data)


# ---- the state file's robust mutex (initialised once, by the agent, before publication) ---------


_PTHREAD_PROCESS_SHARED: Final = 1
_PTHREAD_MUTEX_ROBUST: Final = 1
_libc_handle: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _libc_handle
    if _libc_handle is None:
        lib = ctypes.CDLL(None, use_errno=True)  # pthread_* live in the process's libc (glibc)
        for fn in (
            "pthread_mutexattr_init",
            "pthread_mutexattr_setpshared",
            "pthread_mutexattr_setrobust",
            "pthread_mutexattr_destroy",
            "pthread_mutex_init",
        ):
            try:
                getattr(lib, fn).restype = ctypes.c_int
            except AttributeError:
                raise RegionError(
                    f"this libc has no {fn}: robust process-shared mutexes need glibc"
                ) from None
        _libc_handle = lib
    return _libc_handle


def _init_mutex(address: int) -> None:
    libc = _libc()
    attr = (ctypes.c_uint64 * 8)()  # pthread_mutexattr_t is 4 bytes on glibc; leave room
    steps = (
        ("pthread_mutexattr_init", (attr,)),
        ("pthread_mutexattr_setpshared", (attr, _PTHREAD_PROCESS_SHARED)),
        ("pthread_mutexattr_setrobust", (attr, _PTHREAD_MUTEX_ROBUST)),
        ("pthread_mutex_init", (ctypes.c_void_p(address), attr)),
    )
    try:
        for name, args in steps:
            rc = getattr(libc, name)(*args)
            if rc != 0:
                raise RegionError(f"{name} failed: {os.strerror(rc)}")
    finally:
        libc.pthread_mutexattr_destroy(attr)


# ---- creating and opening ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceLimit:
    """One device entry the agent writes (from one `GpuAssignment` of the container)."""

    uuid: str  # the UUID the container sees: GPU-… (whole GPU, slice) or MIG-… (MIG instance)
    memory_limit_bytes: int
    memory_total_bytes: int
    compute_share_percent: int = 100
    host_index: int = 0
    mig_start: int | None = None

    def __post_init__(self) -> None:
        raw = self.uuid.encode()
        if not raw or len(raw) >= UUID_BYTES or b"\0" in raw:
            raise ValueError(f"device uuid {self.uuid!r} must be 1..{UUID_BYTES - 1} bytes without NUL")
        if not 0 < self.memory_limit_bytes < 1 << 63 or not 0 <= self.memory_total_bytes < 1 << 63:
            raise ValueError(f"device {self.uuid}: memory limit must be positive, totals non-negative")
        if not 1 <= self.compute_share_percent <= 100:
            raise ValueError(f"device {self.uuid}: compute_share_percent must be 1..100")
        if self.mig_start is not None and self.compute_share_percent != 100:
            raise ValueError(f"device {self.uuid}: a MIG instance is not paced (compute_share_percent=100)")

    @classmethod
    def from_mib(cls, uuid: str, memory_mib: int, total_mib: int, **kw: int | None) -> DeviceLimit:
        """The same, with the assignment's MiB figures."""
        return cls(uuid, memory_mib * _MIB, total_mib * _MIB, **kw)  # type: ignore[arg-type]


def _fixed(value: str, size: int, what: str) -> bytes:
    raw = value.encode()
    if len(raw) >= size or b"\0" in raw:
        raise ValueError(f"{what} {value!r} must be shorter than {size} bytes, without NUL")
    return raw


class Region:
    """The agent's handle on one container's region: its control file mapped (read-write for the
    agent, read-only for a reader) and the path of the state file, which is only ever read into
    private copies (`read_state`). Use as a context manager, or call `close()`."""

    def __init__(self, directory: Path, mm: mmap.mmap, *, writable: bool) -> None:
        self.directory = directory
        self.control_path = directory / CONTROL_NAME
        self.state_path = directory / STATE_NAME
        self.writable = writable
        self._mm: mmap.mmap | None = mm
        self._control: NnControl | None = NnControl.from_buffer(mm) if writable else None

    # -- the control file

    @property
    def control(self) -> NnControl:
        """The live, writable control file (writable handles only): single aligned stores."""
        if self._control is None:
            raise RegionError("region is closed or read-only")
        return self._control

    def snapshot_control(self) -> NnControl:
        """A copy of the control file as it is now (works on read-only handles)."""
        if self._mm is None:
            raise RegionError("region is closed")
        return NnControl.from_buffer_copy(self._mm)

    @property
    def devices(self) -> list[NnDeviceControl]:
        """The live device entries in use (`container.device_count` of them)."""
        control = self.control
        return [control.devices[i] for i in range(min(control.container.device_count, MAX_DEVICES))]

    def set_control(self, flag: int, on: bool) -> None:
        container = self.control.container
        container.control = (container.control | flag) if on else (container.control & ~flag)

    def set_host_pid(self, slot: int, host_pid: int, claim_seq: int, start_time_ticks: int) -> None:
        """Record the host PID of the process holding claim `claim_seq` of `slot` (the agent found it
        through NSpid and start time). Stores in the order the header gives: host_pid = 0, the claim,
        its start time, then host_pid — a reader never pairs a PID with another claim."""
        proc = self.control.procs[slot]
        proc.host_pid = 0
        proc.claim_seq = claim_seq
        proc.start_time_ticks = start_time_ticks
        proc.host_pid = host_pid

    def order_reclaim(self, slot: int, claim_seq: int) -> None:
        """Order the shim to free `slot` while its claim is `claim_seq` (its process is gone and the
        driver released its memory), then announce it (`reclaim_generation`)."""
        if not 0 < claim_seq <= _U63:
            raise ValueError(f"claim_seq {claim_seq} cannot be ordered")
        control = self.control
        control.procs[slot].reclaim_claim_seq = claim_seq
        control.container.reclaim_generation += 1

    # -- the state file

    def read_state(self) -> NnState:
        """A validated private copy of the state file: header (`read_state`), pair and every value
        the agent reads (`state_problems`).

        Raises:
            RegionError: not usable; the message names the first problems.
            OSError: it cannot be read.
        """
        state = read_state(self.state_path)
        problems = state_problems(state, self.snapshot_control())
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise RegionError(f"{self.state_path}: " + "; ".join(problems[:3]) + more)
        return state

    # -- lifetime

    def close(self) -> None:
        self._control = None
        if self._mm is not None:
            mm, self._mm = self._mm, None
            with contextlib.suppress(BufferError):  # a caller still holds a structure of it: the
                mm.close()  # mapping goes with that structure, it never fails the caller

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _new_file(directory: Path, name: str, size: int) -> tuple[Path, int, mmap.mmap]:
    tmp = directory / f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
        return tmp, fd, mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise


def _fill_header(h: NnFileHeader, name: str, pair_id: int, created_ns: int) -> None:
    magic, whole, entry, slot = _FILES[name]
    h.magic = magic
    h.version_major = REGION_VERSION_MAJOR
    h.version_minor = REGION_VERSION_MINOR
    h.header_size = ctypes.sizeof(NnFileHeader)
    h.file_size = ctypes.sizeof(whole)
    h.device_entry_size = ctypes.sizeof(entry)
    h.proc_slot_size = ctypes.sizeof(slot)
    h.max_devices = MAX_DEVICES
    h.max_procs = MAX_PROCS
    h.creator_pid = os.getpid()
    h.created_realtime_ns = created_ns
    h.pair_id = pair_id


def create_region(
    directory: str | os.PathLike[str],
    devices: Sequence[DeviceLimit],
    *,
    memory_limit_bytes: int | None = None,
    pacing_window_ns: int = DEFAULT_PACING_WINDOW_NS,
    priority: int = 0,
    qos: int = QOS_GUARANTEED,
    pod_uid: str = "",
    namespace: str = "",
    container_name: str = "",
    admitted: bool = False,
    workstation: bool = False,
    mode: int = 0o666,
    control_mode: int = 0o644,
) -> Region:
    """Write a new region — ``control`` and ``state`` in `directory` (created if missing) — and
    return it with the control file mapped read-write.

    Each file is filled under a temporary name in the directory and renamed into place: the state
    file first (its robust mutex initialised, `REGION_F_READY` set), the control file last, so the
    control file's presence means the pair is complete and no process maps a half-written one.
    `mode` (the state file) defaults to world-writable because the container's processes may run
    as any UID; `control_mode` to readable by all, writable by the agent only. The NRI plugin
    mounts the directory and the control file read-only, so the container writes the state file
    and nothing else.

    Raises:
        ValueError: bad arguments (no device, too many, a string too long, a bad QoS).
        RegionError: the mutex cannot be initialised (not glibc).
        OSError: a file cannot be written.
    """
    target = Path(directory)
    if not 1 <= len(devices) <= MAX_DEVICES:
        raise ValueError(f"a region holds 1..{MAX_DEVICES} devices, got {len(devices)}")
    if qos not in (QOS_GUARANTEED, QOS_BURSTABLE, QOS_BEST_EFFORT):
        raise ValueError(f"qos {qos} is not a QoS class")
    if not 0 < pacing_window_ns < 1 << 63:
        raise ValueError("pacing_window_ns must be positive")
    if not -(2**31) <= priority < 2**31:
        raise ValueError("priority must fit in int32")
    uuids = [d.uuid for d in devices]
    if len(set(uuids)) != len(uuids):
        raise ValueError(f"device uuids repeat: {uuids}")
    limit = sum(d.memory_limit_bytes for d in devices) if memory_limit_bytes is None else memory_limit_bytes
    if not 0 <= limit < 1 << 63:
        raise ValueError("memory_limit_bytes out of range")
    identity = (
        _fixed(pod_uid, POD_UID_BYTES, "pod_uid"),
        _fixed(namespace, NAME_BYTES, "namespace"),
        _fixed(container_name, NAME_BYTES, "container_name"),
    )
    target.mkdir(parents=True, exist_ok=True)
    pair_id = secrets.randbits(64) or 1
    created = time.time_ns()

    tmp, fd, mm = _new_file(target, STATE_NAME, STATE_SIZE)
    try:
        state = NnState.from_buffer(mm)
        _fill_header(state.header, STATE_NAME, pair_id, created)
        _init_mutex(ctypes.addressof(state.lock))
        state.header.flags = REGION_F_READY
        del state
        mm.flush()
        mm.close()
        os.fchmod(fd, mode)
        os.rename(tmp, target / STATE_NAME)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)

    tmp, fd, mm = _new_file(target, CONTROL_NAME, CONTROL_SIZE)
    region = Region(target, mm, writable=True)
    try:
        control = region.control
        _fill_header(control.header, CONTROL_NAME, pair_id, created)
        ct = control.container
        ct.memory_limit_bytes = limit
        ct.pacing_window_ns = pacing_window_ns
        ct.priority = priority
        ct.qos = qos
        ct.control = CTL_ADMITTED if admitted else 0
        ct.device_count = len(devices)
        ct.pod_uid, ct.namespace_, ct.container_name = identity
        for entry, dev in zip(control.devices, devices, strict=False):
            entry.uuid = dev.uuid.encode()
            entry.memory_limit_bytes = dev.memory_limit_bytes
            entry.memory_total_bytes = dev.memory_total_bytes
            entry.compute_share_percent = dev.compute_share_percent
            entry.host_index = dev.host_index
            entry.flags = DEV_F_MIG if dev.mig_start is not None else 0
            entry.mig_start = dev.mig_start or 0
        control.header.flags = REGION_F_READY | (REGION_F_WORKSTATION if workstation else 0)
        del control, ct, entry
        mm.flush()
        os.fchmod(fd, control_mode)
        os.rename(tmp, target / CONTROL_NAME)
    except BaseException:
        region.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    return region


def open_region(directory: str | os.PathLike[str], *, writable: bool = True) -> Region:
    """Map an existing region's control file and validate it (magic, major version, sizes, ready,
    QoS, device count); the state file is read later, on demand (`Region.read_state`).

    Raises:
        RegionError: the control file is not one this code can use. Fail closed.
        OSError: it cannot be opened.
    """
    target = Path(directory)
    path = target / CONTROL_NAME
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if (target / "region").exists():
            raise RegionError(
                f"{target}: holds a region of major version 1 (one file, 'region'), which this agent "
                f"(major {REGION_VERSION_MAJOR}) does not read"
            ) from None
        raise
    try:
        size = os.fstat(fd).st_size
        if size != CONTROL_SIZE:  # check before mapping: touching past EOF would SIGBUS
            raise RegionError(f"{path}: {size} bytes, expected {CONTROL_SIZE}")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mm = mmap.mmap(fd, CONTROL_SIZE, mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)
    try:
        validate_control(mm)
    except RegionError as exc:
        mm.close()
        raise RegionError(f"{path}: {exc}") from None
    return Region(target, mm, writable=writable)
