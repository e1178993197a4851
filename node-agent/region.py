"""Python mirror of the CUDA shim's shared region (``node-agent/shim/include/neuronetes_region.h``).

The agent creates one region per container with a GPU assignment, before the container's first
process starts, and keeps it mapped to read usage, register host PIDs, reclaim dead processes and
send control orders (admit, pause, drain). The shim in every process of the container maps the
same file. The layout, the locking scheme and the versioning rule are documented in the header
and in docs/contracts.md; ``tests/unit/test_region_layout.py`` compiles the header and checks
that these ctypes structures agree with it byte for byte.

Every reader validates before it trusts anything: magic, major version, every recorded size.
A mismatch raises `RegionError` — the caller must fail closed (the agent refuses to start the
container), never fall back to running unlimited.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

__all__ = [
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
    "REGION_F_READY",
    "REGION_F_STANDALONE",
    "REGION_MAGIC",
    "REGION_PATH",
    "REGION_SIZE",
    "REGION_VERSION_MAJOR",
    "REGION_VERSION_MINOR",
    "SLOT_ACTIVE",
    "SLOT_DEAD",
    "SLOT_FREE",
    "UUID_BYTES",
    "DeviceLimit",
    "NnContainer",
    "NnDeviceEntry",
    "NnLock",
    "NnProcSlot",
    "NnRegion",
    "NnRegionHeader",
    "Region",
    "RegionError",
    "create_region",
    "open_region",
    "validate_region",
]

# ---- constants (the header's #defines, NN_ prefix dropped) ------------------------------------

REGION_MAGIC: Final = 0x4E4F494745524E4E  # b"NNREGION" little-endian
REGION_VERSION_MAJOR: Final = 1
REGION_VERSION_MINOR: Final = 0
MAX_DEVICES: Final = 16
MAX_PROCS: Final = 128
UUID_BYTES: Final = 64
LOCK_STORAGE_BYTES: Final = 64
POD_UID_BYTES: Final = 40
NAME_BYTES: Final = 64
REGION_SIZE: Final = 65536
DEFAULT_PACING_WINDOW_NS: Final = 10_000_000
REGION_PATH: Final = "/run/neuronetes/region"

REGION_F_READY: Final = 1 << 0
REGION_F_STANDALONE: Final = 1 << 1
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


class RegionError(RuntimeError):
    """A region that must not be used: wrong magic, version or sizes, truncated, not ready, or a
    lock that cannot be taken. Fail closed."""


# ---- the layout --------------------------------------------------------------------------------
# Field names are the C field names; `_c_name_` is the C typedef. The layout test generates a C
# program from these lists, so every field here is checked against the header.


class NnRegionHeader(ctypes.Structure):
    _c_name_ = "nn_region_header"
    _fields_ = [
        ("magic", ctypes.c_uint64),
        ("version_major", ctypes.c_uint16),
        ("version_minor", ctypes.c_uint16),
        ("header_size", ctypes.c_uint32),
        ("region_size", ctypes.c_uint64),
        ("device_entry_size", ctypes.c_uint32),
        ("proc_slot_size", ctypes.c_uint32),
        ("max_devices", ctypes.c_uint32),
        ("max_procs", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("creator_pid", ctypes.c_uint32),
        ("created_realtime_ns", ctypes.c_uint64),
        ("reserved", ctypes.c_uint8 * 72),
    ]
    if TYPE_CHECKING:
        magic: int
        version_major: int
        version_minor: int
        header_size: int
        region_size: int
        device_entry_size: int
        proc_slot_size: int
        max_devices: int
        max_procs: int
        flags: int
        creator_pid: int
        created_realtime_ns: int


class NnLock(ctypes.Structure):
    _c_name_ = "nn_lock"
    _fields_ = [
        ("storage", ctypes.c_uint8 * LOCK_STORAGE_BYTES),  # union { pthread_mutex_t mutex; ... }
        ("owner_died_total", ctypes.c_uint64),
        ("reserved", ctypes.c_uint8 * 56),
    ]
    if TYPE_CHECKING:
        owner_died_total: int


class NnContainer(ctypes.Structure):
    _c_name_ = "nn_container"
    _fields_ = [
        ("memory_limit_bytes", ctypes.c_uint64),
        ("pacing_window_ns", ctypes.c_uint64),
        ("priority", ctypes.c_int32),
        ("qos", ctypes.c_uint32),
        ("control", ctypes.c_uint32),
        ("device_count", ctypes.c_uint32),
        ("memory_used_bytes", ctypes.c_uint64),
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
        memory_used_bytes: int
        pod_uid: bytes
        namespace_: bytes
        container_name: bytes


class NnDeviceEntry(ctypes.Structure):
    _c_name_ = "nn_device_entry"
    _fields_ = [
        ("uuid", ctypes.c_char * UUID_BYTES),
        ("memory_limit_bytes", ctypes.c_uint64),
        ("memory_used_bytes", ctypes.c_uint64),
        ("memory_total_bytes", ctypes.c_uint64),
        ("compute_share_percent", ctypes.c_uint32),
        ("host_index", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("mig_start", ctypes.c_uint32),
        ("kernel_ns_total", ctypes.c_uint64),
        ("throttled_ns_total", ctypes.c_uint64),
        ("oom_refusals_total", ctypes.c_uint64),
        ("memory_peak_bytes", ctypes.c_uint64),
        ("reserved", ctypes.c_uint8 * 120),
    ]
    if TYPE_CHECKING:
        uuid: bytes
        memory_limit_bytes: int
        memory_used_bytes: int
        memory_total_bytes: int
        compute_share_percent: int
        host_index: int
        flags: int
        mig_start: int
        kernel_ns_total: int
        throttled_ns_total: int
        oom_refusals_total: int
        memory_peak_bytes: int


class NnProcSlot(ctypes.Structure):
    _c_name_ = "nn_proc_slot"
    _fields_ = [
        ("state", ctypes.c_uint32),
        ("container_pid", ctypes.c_int32),
        ("host_pid", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
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
        host_pid: int
        flags: int
        start_time_ticks: int
        claim_seq: int
        heartbeat_ns: int
        window_index: int
        used_bytes: ctypes.Array[ctypes.c_uint64]
        kernel_ns: ctypes.Array[ctypes.c_uint64]


class NnRegion(ctypes.Structure):
    _c_name_ = "nn_region"
    _fields_ = [
        ("header", NnRegionHeader),
        ("lock", NnLock),
        ("container", NnContainer),
        ("devices", NnDeviceEntry * MAX_DEVICES),
        ("procs", NnProcSlot * MAX_PROCS),
        ("reserved", ctypes.c_uint8 * 11776),
    ]
    if TYPE_CHECKING:
        header: NnRegionHeader
        lock: NnLock
        container: NnContainer
        devices: ctypes.Array[NnDeviceEntry]
        procs: ctypes.Array[NnProcSlot]


STRUCTURES: Final[tuple[type[ctypes.Structure], ...]] = (
    NnRegionHeader,
    NnLock,
    NnContainer,
    NnDeviceEntry,
    NnProcSlot,
    NnRegion,
)
"""Every mirrored structure, for the layout test."""

if ctypes.sizeof(NnRegion) != REGION_SIZE:  # pragma: no cover - caught by the layout test too
    raise ImportError(f"region mirror is {ctypes.sizeof(NnRegion)} bytes, expected {REGION_SIZE}")

# ---- validation ------------------------------------------------------------------------------


def validate_region(buf: bytes | bytearray | memoryview | mmap.mmap, *, require_ready: bool = True) -> None:
    """Check that `buf` holds a region this code can use; raise `RegionError` naming what is wrong."""
    size = len(buf)
    if size < ctypes.sizeof(NnRegionHeader):
        raise RegionError(f"region is {size} bytes, smaller than its header")
    header = NnRegionHeader.from_buffer_copy(bytes(buf[: ctypes.sizeof(NnRegionHeader)]))
    if header.magic != REGION_MAGIC:
        raise RegionError(
            f"bad magic {header.magic:#018x} (expected {REGION_MAGIC:#018x}): not a NeuroNetes region"
        )
    if header.version_major != REGION_VERSION_MAJOR:
        raise RegionError(
            f"region version {header.version_major}.{header.version_minor} is not readable by this code "
            f"(major {REGION_VERSION_MAJOR}); agent and shim must come from compatible releases"
        )
    expected = {
        "header_size": ctypes.sizeof(NnRegionHeader),
        "region_size": ctypes.sizeof(NnRegion),
        "device_entry_size": ctypes.sizeof(NnDeviceEntry),
        "proc_slot_size": ctypes.sizeof(NnProcSlot),
        "max_devices": MAX_DEVICES,
        "max_procs": MAX_PROCS,
    }
    wrong = [
        f"{k}={getattr(header, k)} (expected {v})" for k, v in expected.items() if getattr(header, k) != v
    ]
    if wrong:
        raise RegionError("region layout mismatch: " + ", ".join(wrong))
    if size != REGION_SIZE:
        raise RegionError(f"region is {size} bytes, expected {REGION_SIZE} (truncated or padded file)")
    if require_ready and not header.flags & REGION_F_READY:
        raise RegionError("region is not ready (the agent has not finished writing it)")


# ---- the robust mutex (glibc, through ctypes) ---------------------------------------------------


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


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
            "pthread_mutex_timedlock",
            "pthread_mutex_unlock",
            "pthread_mutex_consistent",
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
    """A mapped region. Use as a context manager, or call `close()` (drop views of it first)."""

    def __init__(self, path: Path, mm: mmap.mmap, *, writable: bool) -> None:
        self.path = path
        self.writable = writable
        self._mm: mmap.mmap | None = mm
        self._view: NnRegion | None = NnRegion.from_buffer(mm) if writable else None

    # -- access

    @property
    def view(self) -> NnRegion:
        """The live, writable structure over the mapping (writable regions only)."""
        if self._view is None:
            raise RegionError("region is closed or read-only")
        return self._view

    def snapshot(self) -> NnRegion:
        """A copy of the region as it is now (works on read-only mappings)."""
        if self._mm is None:
            raise RegionError("region is closed")
        return NnRegion.from_buffer_copy(self._mm)

    @property
    def devices(self) -> list[NnDeviceEntry]:
        """The live device entries in use (`container.device_count` of them)."""
        view = self.view
        return [view.devices[i] for i in range(min(view.container.device_count, MAX_DEVICES))]

    # -- control (single aligned stores; the shim polls them)

    def set_control(self, flag: int, on: bool) -> None:
        container = self.view.container
        container.control = (container.control | flag) if on else (container.control & ~flag)

    def set_host_pid(self, slot: int, host_pid: int) -> None:
        """Record the host PID of the process in `slot` (the agent found it through NSpid)."""
        self.view.procs[slot].host_pid = host_pid

    # -- the lock

    @contextlib.contextmanager
    def lock(self, timeout: float = 1.0) -> Iterator[bool]:
        """Hold the region's robust mutex; yields True when it recovered a dead holder's lock.

        On recovery the usage totals are recomputed from the per-process values before the body
        runs, so the body always sees a consistent region. Never blocks longer than `timeout`.

        Raises:
            RegionError: not taken within `timeout` (a tenant process holds it: treat the
                container as misbehaving), or the mutex is unrecoverable.
        """
        view = self.view
        libc = _libc()
        address = ctypes.c_void_p(ctypes.addressof(view.lock))
        deadline = time.clock_gettime_ns(time.CLOCK_REALTIME) + int(timeout * 1e9)
        abstime = _Timespec(deadline // 1_000_000_000, deadline % 1_000_000_000)
        rc = libc.pthread_mutex_timedlock(address, ctypes.byref(abstime))
        recovered = False
        if rc == errno.EOWNERDEAD:
            recovered = True
            if libc.pthread_mutex_consistent(address) != 0:  # pragma: no cover - cannot fail here
                raise RegionError("pthread_mutex_consistent failed")
            view.lock.owner_died_total += 1
            self._recompute(view)
        elif rc == errno.ETIMEDOUT:
            raise RegionError(
                f"region lock not taken within {timeout} s: a process of the container holds it"
            )
        elif rc != 0:
            raise RegionError(f"region lock: {os.strerror(rc)}")
        try:
            yield recovered
        finally:
            libc.pthread_mutex_unlock(address)

    @staticmethod
    def _recompute(view: NnRegion) -> None:
        total = 0
        for i in range(MAX_DEVICES):
            used = sum(int(s.used_bytes[i]) for s in view.procs if s.state != SLOT_FREE)
            device = view.devices[i]
            device.memory_used_bytes = used
            device.memory_peak_bytes = max(device.memory_peak_bytes, used)
            total += used
        view.container.memory_used_bytes = total

    def recompute_usage(self, timeout: float = 1.0) -> None:
        """Rebuild the device and container totals from the per-process values (under the lock)."""
        with self.lock(timeout) as recovered:
            if not recovered:
                self._recompute(self.view)

    def reclaim_slot(self, slot: int, timeout: float = 1.0, *, claim_seq: int | None = None) -> bool:
        """Free `slot` and drop its memory from the totals (its process is gone and NVML shows its
        memory released). With `claim_seq`, only while the slot is still that claim and DEAD (a
        process may have claimed it since the caller looked); True when it was freed."""
        with self.lock(timeout):
            view = self.view
            proc = view.procs[slot]
            if claim_seq is not None and (proc.claim_seq != claim_seq or proc.state != SLOT_DEAD):
                return False
            ctypes.memset(ctypes.addressof(proc), 0, ctypes.sizeof(NnProcSlot))
            proc.state = SLOT_FREE
            self._recompute(view)
        return True

    # -- lifetime

    def close(self) -> None:
        self._view = None
        if self._mm is not None:
            self._mm.close()  # BufferError if a caller still holds a structure from `view`
            self._mm = None

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_region(
    path: str | os.PathLike[str],
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
    standalone: bool = False,
    mode: int = 0o666,
) -> Region:
    """Write a new region at `path` and return it mapped.

    The file is filled under a temporary name in the same directory, its mutex initialised
    (robust, process-shared), `REGION_F_READY` set, and only then renamed to `path`, so no
    process ever maps a half-written region. `mode` defaults to world-writable because the
    container's processes may run as any UID; the directory the NRI plugin mounts is read-only,
    so they can write the region but not replace it.

    Raises:
        ValueError: bad arguments (no device, too many, a string too long, a bad QoS).
        RegionError: the mutex cannot be initialised (not glibc).
        OSError: the file cannot be written.
    """
    target = Path(path)
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

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, REGION_SIZE)
        mm = mmap.mmap(fd, REGION_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        region = Region(target, mm, writable=True)
        try:
            view = region.view
            h = view.header
            h.magic = REGION_MAGIC
            h.version_major = REGION_VERSION_MAJOR
            h.version_minor = REGION_VERSION_MINOR
            h.header_size = ctypes.sizeof(NnRegionHeader)
            h.region_size = ctypes.sizeof(NnRegion)
            h.device_entry_size = ctypes.sizeof(NnDeviceEntry)
            h.proc_slot_size = ctypes.sizeof(NnProcSlot)
            h.max_devices = MAX_DEVICES
            h.max_procs = MAX_PROCS
            h.creator_pid = os.getpid()
            h.created_realtime_ns = time.time_ns()
            _init_mutex(ctypes.addressof(view.lock))
            ct = view.container
            ct.memory_limit_bytes = limit
            ct.pacing_window_ns = pacing_window_ns
            ct.priority = priority
            ct.qos = qos
            ct.control = CTL_ADMITTED if admitted else 0
            ct.device_count = len(devices)
            ct.pod_uid, ct.namespace_, ct.container_name = identity
            for entry, dev in zip(view.devices, devices, strict=False):
                entry.uuid = dev.uuid.encode()
                entry.memory_limit_bytes = dev.memory_limit_bytes
                entry.memory_total_bytes = dev.memory_total_bytes
                entry.compute_share_percent = dev.compute_share_percent
                entry.host_index = dev.host_index
                entry.flags = DEV_F_MIG if dev.mig_start is not None else 0
                entry.mig_start = dev.mig_start or 0
            h.flags = REGION_F_READY | (REGION_F_STANDALONE if standalone else 0)
            mm.flush()
            os.fchmod(fd, mode)
            os.rename(tmp, target)
        except BaseException:
            region.close()
            raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    return region


def open_region(path: str | os.PathLike[str], *, writable: bool = True) -> Region:
    """Map an existing region and validate it (magic, major version, sizes, ready flag).

    Raises:
        RegionError: the file is not a region this code can use. Fail closed.
        OSError: the file cannot be opened.
    """
    target = Path(path)
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
    fd = os.open(target, flags)
    try:
        size = os.fstat(fd).st_size
        if size != REGION_SIZE:  # check before mapping: touching past EOF would SIGBUS
            raise RegionError(f"{target}: {size} bytes, expected {REGION_SIZE}")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mm = mmap.mmap(fd, REGION_SIZE, mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)
    try:
        validate_region(mm)
    except RegionError as exc:
        mm.close()
        raise RegionError(f"{target}: {exc}") from None
    return Region(target, mm, writable=writable)
