"""The CUDA driver API through ctypes, for the validation's workloads (a plain application: it loads
``libcuda.so.1`` itself, so with the shim preloaded every call goes through the shim's ``dlsym``).

Also the two readings every workload reports: the shim's account (8 bytes of the container's state
file at the file name and offset the runner passes, ``--offset state:320``, in the region directory
``NEURONETES_REGION_DIR``) and NVML's per-process memory of this process (the process list is never
the shim's). Works the same over a real driver and over the fake one.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

SUCCESS = 0
OUT_OF_MEMORY = 2

c_size = ctypes.c_size_t
c_u64 = ctypes.c_uint64


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class AllocationProp(ctypes.Structure):  # CUmemAllocationProp (32 bytes)
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", MemLocation),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", AllocFlags),
    ]


class AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


class PoolProps(ctypes.Structure):  # CUmemPoolProps (88 bytes)
    _fields_ = [
        ("allocType", ctypes.c_int),
        ("handleTypes", ctypes.c_int),
        ("location", MemLocation),
        ("win32SecurityAttributes", ctypes.c_void_p),
        ("maxSize", c_size),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 54),
    ]


class MemAllocNodeParams(ctypes.Structure):  # CUDA_MEM_ALLOC_NODE_PARAMS_v1 (120 bytes)
    _fields_ = [
        ("poolProps", PoolProps),
        ("accessDescs", ctypes.c_void_p),
        ("accessDescCount", c_size),
        ("bytesize", c_size),
        ("dptr", c_u64),
    ]


class ArrayDescriptor(ctypes.Structure):  # CUDA_ARRAY_DESCRIPTOR_v2
    _fields_ = [
        ("Width", c_size),
        ("Height", c_size),
        ("Format", ctypes.c_int),
        ("NumChannels", ctypes.c_uint),
    ]


class Array3DDescriptor(ctypes.Structure):  # CUDA_ARRAY3D_DESCRIPTOR_v2
    _fields_ = [
        ("Width", c_size),
        ("Height", c_size),
        ("Depth", c_size),
        ("Format", ctypes.c_int),
        ("NumChannels", ctypes.c_uint),
        ("Flags", ctypes.c_uint),
    ]


LOCATION_DEVICE = 1
ALLOCATION_PINNED = 1
ACCESS_READWRITE = 3
FORMAT_FLOAT = 0x20
LIMIT_MALLOC_HEAP_SIZE = 2


def out(**figures: Any) -> None:
    """The workload's answer: one RESULT line."""
    print("RESULT " + json.dumps(figures, default=str), flush=True)


Account = tuple[str, int]
"""Where the shim's account of device 0 lives: a file of the region directory and a byte offset."""


def account(text: str) -> Account:
    """``--offset``'s value, ``FILE:OFFSET`` (what the runner's ``used_offset()`` names)."""
    name, _, at = text.rpartition(":")
    if not name or "/" in name or not at.isdigit():
        raise ValueError(f"{text!r} is not FILE:OFFSET")
    return name, int(at)


def account_arg(where: Account | None) -> list[str]:
    """The ``--offset`` argument that passes `where` on (none without one)."""
    return [] if where is None else ["--offset", f"{where[0]}:{where[1]}"]


def region_used(offset: Account | None) -> int | None:
    """The shim's account of this container on device 0 (None without a region)."""
    directory = os.environ.get("NEURONETES_REGION_DIR")
    if offset is None or not directory:
        return None
    fd = os.open(os.path.join(directory, offset[0]), os.O_RDONLY)
    try:
        return int.from_bytes(os.pread(fd, 8, offset[1]), sys.byteorder)
    finally:
        os.close(fd)


def nvml_attributed(pid: int | None = None) -> int | None:
    """NVML's GPU memory of `pid` (this process) on GPU 0, or None when NVML does not list it."""
    import pynvml

    pid = os.getpid() if pid is None else pid
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if int(p.pid) == pid:
                return int(p.usedGpuMemory or 0)
        return None
    finally:
        pynvml.nvmlShutdown()


def nvml_memory_info() -> dict[str, int]:
    """NVML's memory figures of GPU 0 as this process sees them (v1 and v2; the shim reports both)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        return {
            "total": int(v1.total),
            "free": int(v1.free),
            "used": int(v1.used),
            "v2_total": int(v2.total),
            "v2_free": int(v2.free),
            "v2_used": int(v2.used),
        }
    finally:
        pynvml.nvmlShutdown()


class Driver:
    """One context on device 0 of ``libcuda.so.1``."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.require("cuInit", self.lib.cuInit(0))
        self.ctx = ctypes.c_void_p()
        self.require("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), 0))
        self.require("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(self.ctx))
        self.stream = ctypes.c_void_p()
        self.require("cuStreamCreate", self.lib.cuStreamCreate(ctypes.byref(self.stream), 0))

    def require(self, what: str, rc: int) -> None:
        if rc != SUCCESS:
            out(error=f"{what} returned CUresult {rc}")
            sys.exit(1)

    def has(self, name: str) -> bool:
        return hasattr(self.lib, name)

    # ---- plain allocations

    def alloc(self, size: int) -> tuple[int, int]:
        ptr = c_u64()
        rc = self.lib.cuMemAlloc_v2(ctypes.byref(ptr), c_size(size))
        return rc, ptr.value

    def free(self, ptr: int) -> int:
        return int(self.lib.cuMemFree_v2(c_u64(ptr)))

    def mem_get_info(self) -> tuple[int, int]:
        free, total = c_size(), c_size()
        self.require("cuMemGetInfo_v2", self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    def sync(self) -> int:
        return int(self.lib.cuStreamSynchronize(self.stream))

    # ---- VMM

    def prop(self) -> AllocationProp:
        p = AllocationProp()
        p.type = ALLOCATION_PINNED
        p.location.type = LOCATION_DEVICE
        p.location.id = 0
        return p

    def granularity(self) -> int:
        g = c_size()
        prop = self.prop()
        self.require(
            "cuMemGetAllocationGranularity",
            self.lib.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), 0),
        )
        return g.value

    def vmm_create(self, size: int) -> tuple[int, int]:
        handle = c_u64()
        prop = self.prop()
        rc = self.lib.cuMemCreate(
            ctypes.byref(handle), c_size(size), ctypes.byref(prop), ctypes.c_ulonglong(0)
        )
        return rc, handle.value

    def vmm_reserve(self, size: int) -> int:
        va = c_u64()
        self.require(
            "cuMemAddressReserve",
            self.lib.cuMemAddressReserve(
                ctypes.byref(va), c_size(size), c_size(0), c_u64(0), ctypes.c_ulonglong(0)
            ),
        )
        return va.value

    def vmm_map(self, va: int, size: int, handle: int) -> int:
        rc = self.lib.cuMemMap(c_u64(va), c_size(size), c_size(0), c_u64(handle), ctypes.c_ulonglong(0))
        if rc == SUCCESS:
            access = AccessDesc()
            access.location.type = LOCATION_DEVICE
            access.location.id = 0
            access.flags = ACCESS_READWRITE
            rc = self.lib.cuMemSetAccess(c_u64(va), c_size(size), ctypes.byref(access), c_size(1))
        return int(rc)

    def vmm_release(self, handle: int) -> int:
        return int(self.lib.cuMemRelease(c_u64(handle)))

    def vmm_unmap(self, va: int, size: int) -> int:
        return int(self.lib.cuMemUnmap(c_u64(va), c_size(size)))

    def vmm_retain(self, va: int) -> tuple[int, int]:
        handle = c_u64()
        rc = self.lib.cuMemRetainAllocationHandle(ctypes.byref(handle), ctypes.c_void_p(va))
        return rc, handle.value

    def vmm_address_free(self, va: int, size: int) -> int:
        return int(self.lib.cuMemAddressFree(c_u64(va), c_size(size)))

    # ---- other allocation paths

    def array_create(self, width: int, height: int) -> tuple[int, int]:
        """A 2-D float4 array (16 bytes an element)."""
        desc = ArrayDescriptor(width, height, FORMAT_FLOAT, 4)
        handle = ctypes.c_void_p()
        rc = self.lib.cuArrayCreate_v2(ctypes.byref(handle), ctypes.byref(desc))
        return rc, handle.value or 0

    def array_destroy(self, handle: int) -> int:
        return int(self.lib.cuArrayDestroy(ctypes.c_void_p(handle)))

    def mipmapped_create(self, width: int, height: int, levels: int) -> tuple[int, int]:
        """A 2-D float4 mipmapped array of `levels` levels."""
        desc = Array3DDescriptor(width, height, 0, FORMAT_FLOAT, 4, 0)
        handle = ctypes.c_void_p()
        rc = self.lib.cuMipmappedArrayCreate(ctypes.byref(handle), ctypes.byref(desc), ctypes.c_uint(levels))
        return rc, handle.value or 0

    def mipmapped_destroy(self, handle: int) -> int:
        return int(self.lib.cuMipmappedArrayDestroy(ctypes.c_void_p(handle)))

    def graph_alloc_launch(self, size: int) -> tuple[int, int, int]:
        """A graph whose one node allocates `size` bytes (cuGraphAddMemAllocNode), instantiated and
        launched: (launch CUresult, the allocation's address, the executable graph)."""
        graph, node, exec_ = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        self.require("cuGraphCreate", self.lib.cuGraphCreate(ctypes.byref(graph), 0))
        params = MemAllocNodeParams()
        params.poolProps.allocType = ALLOCATION_PINNED
        params.poolProps.location.type = LOCATION_DEVICE
        params.poolProps.location.id = 0
        params.bytesize = size
        rc = self.lib.cuGraphAddMemAllocNode(ctypes.byref(node), graph, None, c_size(0), ctypes.byref(params))
        if rc != SUCCESS:
            return int(rc), 0, 0
        rc = self.lib.cuGraphInstantiateWithFlags(ctypes.byref(exec_), graph, ctypes.c_ulonglong(0))
        if rc != SUCCESS:
            return int(rc), 0, 0
        rc = self.lib.cuGraphLaunch(exec_, self.stream)
        if rc == SUCCESS:
            rc = self.sync()
        return int(rc), int(params.dptr), exec_.value or 0

    def free_async(self, ptr: int) -> int:
        rc = self.lib.cuMemFreeAsync(c_u64(ptr), self.stream)
        return int(rc) if rc != SUCCESS else self.sync()

    def set_heap_limit(self, size: int) -> int:
        return int(self.lib.cuCtxSetLimit(ctypes.c_int(LIMIT_MALLOC_HEAP_SIZE), c_size(size)))

    def get_heap_limit(self) -> int:
        value = c_size()
        self.require(
            "cuCtxGetLimit", self.lib.cuCtxGetLimit(ctypes.byref(value), ctypes.c_int(LIMIT_MALLOC_HEAP_SIZE))
        )
        return value.value
