"""Transparent GPU checkpoint: the CUDA driver's checkpoint API, called from the daemon.

The driver (≥ 570, CUDA 12.8) checkpoints another process by PID, as NVIDIA's ``cuda-checkpoint``
utility does: ``cuCheckpointProcessLock`` (the process's CUDA calls block),
``cuCheckpointProcessCheckpoint`` (its device memory moves to host memory and the GPU is free),
later ``cuCheckpointProcessRestore`` (memory back on the GPU) and ``cuCheckpointProcessUnlock``.
``cuCheckpointProcessGetState`` tells whether a PID is a CUDA process at all. The entry points are
called through ctypes on the driver library (``libcuda.so.1``, or ``--cuda-driver PATH``); the tests
point it at the fake driver of ``node-agent/shim/fake``, which implements the same state machine.

Where the library or the entry points are missing, `available` is False and `reason` says why;
the preemption ladder then falls back (docs/workstation.md, "Preemption ladder").
"""

from __future__ import annotations

import ctypes
from typing import Final

__all__ = ["MIN_DRIVER_API", "CudaCheckpoint"]

MIN_DRIVER_API: Final = 12080  # cuDriverGetVersion of the first driver with the checkpoint API (570)
_ENTRY_POINTS: Final = (
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
)
_LOCK_TIMEOUT_MS: Final = 10_000
STATE_RUNNING: Final = 0
STATE_LOCKED: Final = 1
STATE_CHECKPOINTED: Final = 2


class _LockArgs(ctypes.Structure):
    """``CUcheckpointLockArgs`` (64 bytes; reserved fields zeroed)."""

    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class CudaCheckpoint:
    """The checkpoint API of one driver library."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        self.library = library
        self.available = False
        self.reason = ""
        self._lib: ctypes.CDLL | None = None
        try:
            lib = ctypes.CDLL(library)
        except OSError as exc:
            # dlopen's message names the library already ("libcuda.so.1: cannot open …")
            said = str(exc) if library in str(exc) else f"{library}: {exc}"
            self.reason = f"no CUDA driver ({said})"
            return
        missing = [name for name in _ENTRY_POINTS if not hasattr(lib, name)]
        if missing:
            self.reason = (
                f"the CUDA driver {library} has no checkpoint API ({missing[0]}; driver ≥ 570 needed)"
            )
            return
        version = ctypes.c_int(0)
        rc = lib.cuInit(0)
        if rc != 0:
            self.reason = f"cuInit failed with CUresult {rc}"
            return
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value < MIN_DRIVER_API:
            self.reason = f"CUDA driver API {version.value} is older than {MIN_DRIVER_API} (driver 570)"
            return
        self._lib = lib
        self.available = True

    def state(self, pid: int) -> int | None:
        """The process's checkpoint state, or None when it is no CUDA process of this driver."""
        if self._lib is None:
            return None
        out = ctypes.c_int(-1)
        rc = self._lib.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(out))
        return int(out.value) if rc == 0 else None

    def suspend(self, pid: int) -> str | None:
        """Lock and checkpoint `pid`: its device memory moves to the host. None when done, else why not
        (the process is left running)."""
        lib = self._require()
        args = _LockArgs(timeoutMs=_LOCK_TIMEOUT_MS)
        rc = lib.cuCheckpointProcessLock(ctypes.c_int(pid), ctypes.byref(args))
        if rc != 0:
            return f"cuCheckpointProcessLock({pid}) failed: CUresult {rc}"
        rc = lib.cuCheckpointProcessCheckpoint(ctypes.c_int(pid), None)
        if rc != 0:
            lib.cuCheckpointProcessUnlock(ctypes.c_int(pid), None)
            return f"cuCheckpointProcessCheckpoint({pid}) failed: CUresult {rc}"
        return None

    def resume(self, pid: int) -> str | None:
        """Restore and unlock `pid`. None when done, else why not (e.g. out of memory: still checkpointed)."""
        lib = self._require()
        if self.state(pid) == STATE_CHECKPOINTED:
            rc = lib.cuCheckpointProcessRestore(ctypes.c_int(pid), None)
            if rc != 0:
                return f"cuCheckpointProcessRestore({pid}) failed: CUresult {rc}"
        if self.state(pid) == STATE_LOCKED:
            rc = lib.cuCheckpointProcessUnlock(ctypes.c_int(pid), None)
            if rc != 0:
                return f"cuCheckpointProcessUnlock({pid}) failed: CUresult {rc}"
        return None

    def _require(self) -> ctypes.CDLL:
        if self._lib is None:
            raise RuntimeError(f"checkpoint API not available: {self.reason}")
        return self._lib
