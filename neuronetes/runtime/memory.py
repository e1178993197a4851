"""Task memory for the runtime: hard reservations as dedicated pools, soft ones evicted to host.

A `MemoryManager` divides `capacity_bytes` of one device among owners (tasks, or slices: any name
the scheduler picks):

- A **hard** reservation carves a dedicated pool out of the device at `reserve()` time: one device
  buffer of that size, allocated then, from which the owner's arrays are cut (first fit, starts
  aligned to 256 bytes). When it does not fit — more than `free_bytes()`, or the framework's
  allocator refuses the buffer — `reserve()` raises `AdmissionError` naming the shortfall. Its
  arrays are never evicted; an array that does not fit in its own pool raises `MemoryError`.
- A **soft** reservation is always accepted. Its arrays live in what the hard pools leave
  (`free_bytes()`), allocated one by one; its `nbytes` caps the owner's resident bytes (`None`: no
  cap of its own). When a soft owner needs room — a new array, a reload, or a hard reservation
  taking its share — the least-recently-used unpinned soft blocks are evicted: copied to host memory
  (pinned host memory on CUDA backends, so the copy is a DMA transfer) and their device memory
  dropped. A block over its owner's cap evicts that owner's own blocks first.

`RuntimeArray` is one block. `get()` returns the device array, reloading it first when it was
evicted; `put(value)` writes a value into it (no reload: the host copy is discarded). The device
array returned by `get()` is the block's live storage: in-place updates to it are kept (eviction
copies the device bytes as they are), but it is valid only until the next call that may evict
(`array()`, `get()`, `put()`, `reserve()` of this manager). A tile that uses several arrays pins
them: ``with mm.pinned(a, b) as (x, y): ...`` — pinned blocks are never evicted. Copies are exact
byte copies, so a computation gives bit-identical results whatever was evicted in between
(tests/unit/test_runtime_memory.py checks it against an unevicted run).

LRU order is a counter of accesses (`get`, `put`, `pinned`, creation), not a clock, so the same
calls evict the same blocks on every run. Evictions and reloads are counted per owner.

Backends: a backend may provide ``device_memory() -> DeviceMemory`` (the GPU backends of
`neuronetes.runtime.gpu_backends` do); one that does not is treated as the NumPy backend (its
"device" is host memory, and evicting copies to a separate host array — the same bookkeeping,
checked on CPU).

Thread-safety: the scheduler is single-threaded, but every public method takes the manager's lock
anyway, so user threads may allocate and read arrays concurrently. An array dropped without
`free()` is released by a finalizer that only queues its block (it may run inside the garbage
collector, in any thread); the queue is drained at the next call.

Longer than most modules on purpose: the manager, its hard pools and its arrays share one lock and
one least-recently-used order, and every eviction or reload touches all three.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

import numpy as np

from neuronetes.quantity import format_quantity
from neuronetes.runtime.errors import AdmissionError

if TYPE_CHECKING:
    from .backends import Backend

__all__ = ["ALIGNMENT", "DeviceMemory", "HostMemory", "MemoryManager", "RuntimeArray"]

ALIGNMENT: Final = 256  # a hard pool's block starts: CUDA's allocation alignment, wide enough for any dtype


@runtime_checkable
class DeviceMemory(Protocol):
    """What the manager needs from a framework: device buffers, views, exact copies both ways."""

    def out_of_memory(self) -> tuple[type[BaseException], ...]:
        """The exception types the framework raises when the device has no room."""
        ...

    def empty_bytes(self, nbytes: int) -> Any:
        """A contiguous 1-D uint8 device buffer of `nbytes` (a hard pool)."""
        ...

    def view(self, buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """The array of `shape` and `dtype` over `buffer`'s bytes from `offset` (aligned)."""
        ...

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """A new zero-filled device array."""
        ...

    def assign(self, device: Any, value: Any) -> None:
        """``device[...] = value`` in place (value: a scalar, host or device array, broadcastable)."""
        ...

    def to_host(self, device: Any) -> Any:
        """An exact copy of `device` in host memory (pinned where the framework has it)."""
        ...

    def to_device(self, host: Any) -> Any:
        """A new device array, an exact copy of `host` (what `to_host` returned)."""
        ...

    def to_numpy(self, array: Any) -> np.ndarray[Any, Any]:
        """A NumPy copy of a device or host array of this framework."""
        ...


class HostMemory:
    """`DeviceMemory` of the NumPy backend: the "device" is host memory."""

    def out_of_memory(self) -> tuple[type[BaseException], ...]:
        return (MemoryError,)

    def empty_bytes(self, nbytes: int) -> Any:
        return np.zeros(nbytes, np.uint8)

    def view(self, buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return buffer[offset : offset + size].view(dtype).reshape(shape)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return np.zeros(shape, dtype)

    def assign(self, device: Any, value: Any) -> None:
        device[...] = value

    def to_host(self, device: Any) -> Any:
        return np.array(device, copy=True)

    def to_device(self, host: Any) -> Any:
        return np.array(host, copy=True)

    def to_numpy(self, array: Any) -> np.ndarray[Any, Any]:
        return np.array(array, copy=True)


def device_memory_of(backend: Backend | Any) -> DeviceMemory:
    """The backend's `DeviceMemory`: its ``device_memory()``, else `HostMemory` (NumPy)."""
    provider = getattr(backend, "device_memory", None)
    if provider is None:
        return HostMemory()
    memory = provider()
    if not isinstance(memory, DeviceMemory):
        raise TypeError(f"backend {getattr(backend, 'name', backend)!r}: device_memory() is no DeviceMemory")
    return memory


def _size(nbytes: int) -> str:
    text = format_quantity(nbytes, "binary")
    return text if text[-1].isalpha() else f"{text} B"


def _admission_error(owner: str, nbytes: int, free: int, reason: str = "") -> Exception:
    return AdmissionError(
        "memory", nbytes, free, what=f"hard memory reservation for {owner!r}", reason=reason
    )


class _Pool:
    """A hard reservation's device buffer and its free ranges (offset, length), sorted, coalesced."""

    def __init__(self, buffer: Any, size: int) -> None:
        self.buffer = buffer
        self.size = size
        self.free: list[tuple[int, int]] = [(0, size)] if size else []

    def free_bytes(self) -> int:
        return sum(length for _, length in self.free)

    def take(self, nbytes: int) -> int | None:
        """The offset of `nbytes` cut from the first free range that holds it aligned; None if none."""
        if nbytes == 0:
            return 0
        for i, (start, length) in enumerate(self.free):
            at = -(-start // ALIGNMENT) * ALIGNMENT
            end = start + length
            if at + nbytes <= end:
                pieces = [(s, n) for s, n in ((start, at - start), (at + nbytes, end - at - nbytes)) if n]
                self.free[i : i + 1] = pieces
                return at
        return None

    def give(self, offset: int, nbytes: int) -> None:
        if nbytes == 0:
            return
        ranges = sorted([*self.free, (offset, nbytes)])
        merged: list[tuple[int, int]] = []
        for start, length in ranges:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self.free = merged


@dataclass(eq=False, slots=True)
class _Block:
    owner: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    nbytes: int
    hard: bool
    device: Any = None  # the device array while resident
    host: Any = None  # the host copy while evicted
    offset: int = -1  # in the owner's pool (hard)
    pins: int = 0
    freed: bool = False


@dataclass(eq=False, slots=True)
class _Owner:
    name: str
    hard: bool
    reserved: int | None  # hard: the pool's size; soft: the cap on resident bytes (None: none)
    pool: _Pool | None
    blocks: set[_Block] = field(default_factory=set)
    resident: int = 0  # bytes of its blocks on the device
    evictions: int = 0
    reloads: int = 0


class MemoryManager:
    """The device memory of one scheduler (or one slice): hard pools and evictable soft blocks.

    `capacity_bytes` is what it may use of the device: the scheduler passes the backend's
    `memory_capacity()` (inside a NeuroNetes slice that is already the slice's limit: the shim
    reports the container's free and total memory to the framework) or a slice's quota.
    """

    def __init__(self, capacity_bytes: int, backend: Backend | Any) -> None:
        if not isinstance(capacity_bytes, int) or isinstance(capacity_bytes, bool) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be a non-negative int, got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes
        self.backend = backend
        self._memory = device_memory_of(backend)
        self._lock = threading.RLock()
        self._owners: dict[str, _Owner] = {}
        self._hard_total = 0  # bytes carved into hard pools
        self._soft_resident = 0  # bytes of soft blocks on the device
        self._lru: OrderedDict[_Block, None] = OrderedDict()  # resident soft blocks, least recent first
        self._dropped: deque[_Block] = deque()  # blocks of arrays collected without free()

    # ---- reservations

    def free_bytes(self) -> int:
        """What a new hard reservation may still take: the capacity not carved into hard pools
        (soft blocks in it are evicted to make room)."""
        with self._lock:
            return self.capacity_bytes - self._hard_total

    def soft_resident_bytes(self) -> int:
        """Bytes of soft blocks on the device now."""
        with self._lock:
            return self._soft_resident

    def reserve(self, owner: str, nbytes: int | None, hard: bool) -> None:
        """Reserve for `owner`: hard carves a pool of `nbytes` now (raises `AdmissionError` naming
        the shortfall when it does not fit); soft caps the owner's resident bytes at `nbytes`
        (None: no cap) and is always accepted. An owner has one reservation at a time."""
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"owner must be a non-empty string, got {owner!r}")
        if not isinstance(hard, bool):
            raise ValueError(f"hard must be a bool, got {hard!r}")
        if nbytes is None and hard:
            raise ValueError("nbytes must be an int for a hard reservation, got None")
        if nbytes is not None and (not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0):
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        with self._lock:
            self._drain()
            if owner in self._owners:
                raise ValueError(f"owner {owner!r} already has a reservation: release() it first")
            if not hard:
                self._owners[owner] = _Owner(owner, False, nbytes, None)
                return
            assert nbytes is not None
            free = self.capacity_bytes - self._hard_total
            if nbytes > free:
                raise _admission_error(
                    owner, nbytes, free, f"{_size(free)} free of {_size(self.capacity_bytes)}"
                )
            soft_room = free - nbytes
            while self._soft_resident > soft_room:
                if not self._evict_lru(None):
                    pinned = self._soft_resident - soft_room
                    raise _admission_error(
                        owner, nbytes, free - pinned, f"{_size(pinned)} is held by pinned soft arrays"
                    )
            buffer = self._allocate(lambda: self._memory.empty_bytes(nbytes))
            if buffer is None:
                raise _admission_error(
                    owner,
                    nbytes,
                    free,
                    "the device refused a buffer of that size (other allocations hold it)",
                )
            self._owners[owner] = _Owner(owner, True, nbytes, _Pool(buffer, nbytes))
            self._hard_total += nbytes

    def release(self, owner: str) -> None:
        """Drop `owner`'s reservation, pool and arrays (their `get()` raises from now on)."""
        with self._lock:
            self._drain()
            record = self._take_owner(owner)
            for block in list(record.blocks):
                self._drop(block)
            del self._owners[owner]
            if record.hard:
                assert record.reserved is not None
                self._hard_total -= record.reserved

    def owners(self) -> list[str]:
        with self._lock:
            return list(self._owners)

    def reserved(self, owner: str) -> int | None:
        """The owner's reservation: a hard pool's size, a soft cap, or None (soft, no cap)."""
        with self._lock:
            return self._take_owner(owner).reserved

    def is_hard(self, owner: str) -> bool:
        with self._lock:
            return self._take_owner(owner).hard

    def usage(self, owner: str) -> int:
        """Bytes of `owner`'s arrays on the device now (evicted ones are not counted)."""
        with self._lock:
            self._drain()
            return self._take_owner(owner).resident

    def charged(self, owner: str) -> int:
        """Device bytes `owner` holds now: a hard owner its whole pool (carved when reserved, whatever
        its arrays use of it), a soft one its arrays on the device (as `usage`)."""
        with self._lock:
            self._drain()
            record = self._take_owner(owner)
            return (record.reserved or 0) if record.hard else record.resident

    def evictions(self, owner: str) -> int:
        """How many times one of `owner`'s blocks was evicted to host memory."""
        with self._lock:
            return self._take_owner(owner).evictions

    def reloads(self, owner: str) -> int:
        """How many times one of `owner`'s evicted blocks was copied back to the device."""
        with self._lock:
            return self._take_owner(owner).reloads

    # ---- arrays

    def array(self, owner: str, shape: int | Sequence[int], dtype: Any) -> RuntimeArray:
        """A new zero-filled array of `owner`: cut from its pool (hard; `MemoryError` when the pool
        has no room) or allocated in the soft area, evicting LRU soft blocks to make room."""
        dims = _shape(shape)
        kind = _dtype(dtype)
        nbytes = int(np.prod(dims, dtype=np.int64)) * kind.itemsize
        with self._lock:
            self._drain()
            record = self._take_owner(owner)
            block = _Block(owner, dims, kind, nbytes, record.hard)
            if record.hard:
                assert record.pool is not None
                offset = record.pool.take(nbytes)
                if offset is None:
                    raise MemoryError(
                        f"the hard reservation of {owner!r} has no room for {_size(nbytes)}: "
                        f"{_size(record.pool.free_bytes())} of {_size(record.pool.size)} free"
                        + (" (fragmented)" if record.pool.free_bytes() >= nbytes else "")
                    )
                block.offset = offset
                block.device = self._memory.view(record.pool.buffer, offset, dims, kind)
                self._memory.assign(block.device, 0)
                record.resident += nbytes
            else:
                block.device = self._place(record, block, lambda: self._memory.zeros(dims, kind))
            record.blocks.add(block)
            array = RuntimeArray(self, block)
            weakref.finalize(array, self._dropped.append, block)
            return array

    @contextmanager
    def pinned(self, *arrays: RuntimeArray) -> Iterator[tuple[Any, ...]]:
        """The device arrays of `arrays`, reloaded and kept on the device (never evicted) for the
        body: what a tile that uses several arrays holds."""
        held: list[_Block] = []
        try:
            with self._lock:
                for array in arrays:
                    self._check_mine(array)
                    self._load(array._block)
                    array._block.pins += 1
                    held.append(array._block)
                devices = tuple(b.device for b in held)
            yield devices
        finally:
            with self._lock:
                for block in held:
                    block.pins -= 1

    # ---- the array's operations (RuntimeArray calls these)

    def _get(self, block: _Block) -> Any:
        with self._lock:
            self._drain()
            self._load(block)
            return block.device

    def _put(self, block: _Block, value: Any) -> None:
        with self._lock:
            self._drain()
            self._alive(block)
            if block.device is None:  # evicted: overwritten whole, so the host copy is not reloaded
                record = self._owners[block.owner]
                block.device = self._place(
                    record, block, lambda: self._memory.zeros(block.shape, block.dtype)
                )
                block.host = None
            else:
                self._touch(block)
            self._memory.assign(block.device, value)

    def _to_numpy(self, block: _Block) -> np.ndarray[Any, Any]:
        with self._lock:
            self._alive(block)
            return self._memory.to_numpy(block.device if block.device is not None else block.host)

    def _free(self, block: _Block) -> None:
        with self._lock:
            self._drain()
            if not block.freed:
                self._drop(block)

    # ---- internals (the lock is held)

    def _take_owner(self, owner: str) -> _Owner:
        record = self._owners.get(owner)
        if record is None:
            raise ValueError(f"owner {owner!r} has no reservation: reserve() first")
        return record

    def _check_mine(self, array: RuntimeArray) -> None:
        if not isinstance(array, RuntimeArray) or array._manager is not self:
            raise ValueError(f"arrays must be RuntimeArrays of this manager, got {type(array).__name__}")

    def _alive(self, block: _Block) -> None:
        if block.freed:
            raise ValueError(f"the array of {block.owner!r} was freed or its owner released")

    def _touch(self, block: _Block) -> None:
        if not block.hard:
            self._lru.move_to_end(block)

    def _load(self, block: _Block) -> None:
        """Make `block` resident (reloading it from host when evicted) and most recently used."""
        self._alive(block)
        if block.device is not None:
            self._touch(block)
            return
        record = self._owners[block.owner]
        host = block.host
        block.device = self._place(record, block, lambda: self._memory.to_device(host))
        block.host = None
        record.reloads += 1

    def _place(self, record: _Owner, block: _Block, make: Any) -> Any:
        """Room for soft `block` (evicting LRU soft blocks), then its device array from `make()`;
        the block is resident and most recently used after."""
        soft_area = self.capacity_bytes - self._hard_total
        if record.reserved is not None and block.nbytes > record.reserved:
            raise MemoryError(
                f"an array of {_size(block.nbytes)} exceeds the soft reservation of {record.name!r} "
                f"({_size(record.reserved)})"
            )
        if block.nbytes > soft_area:
            raise MemoryError(
                f"an array of {_size(block.nbytes)} for {record.name!r} exceeds the memory hard "
                f"reservations leave ({_size(soft_area)})"
            )
        while record.reserved is not None and record.resident + block.nbytes > record.reserved:
            if not self._evict_lru(record.name):
                raise MemoryError(f"{record.name!r}: its soft reservation is held by pinned arrays")
        while self._soft_resident + block.nbytes > soft_area:
            if not self._evict_lru(None):
                raise MemoryError(
                    f"no room for {_size(block.nbytes)} of {record.name!r}: pinned arrays hold it"
                )
        device = self._allocate(make)
        if device is None:
            raise MemoryError(f"the device has no room for {_size(block.nbytes)} of {record.name!r}")
        block.device = device
        record.resident += block.nbytes
        self._soft_resident += block.nbytes
        self._lru[block] = None
        return device

    def _allocate(self, make: Any) -> Any:
        """`make()`, evicting LRU soft blocks while the framework says the device is full (memory
        used outside this manager); None when nothing is left to evict."""
        while True:
            try:
                return make()
            except self._memory.out_of_memory():
                if not self._evict_lru(None):
                    return None

    def _evict_lru(self, owner: str | None) -> bool:
        """Evict the least recently used unpinned soft block (of `owner`, or of anyone)."""
        for block in self._lru:
            if block.pins == 0 and (owner is None or block.owner == owner):
                block.host = self._memory.to_host(block.device)
                self._unplace(block)
                self._owners[block.owner].evictions += 1
                return True
        return False

    def _unplace(self, block: _Block) -> None:
        """Forget `block`'s device array (it was copied out, or is being dropped)."""
        record = self._owners[block.owner]
        record.resident -= block.nbytes
        if not block.hard:
            self._soft_resident -= block.nbytes
            del self._lru[block]
        block.device = None

    def _drop(self, block: _Block) -> None:
        record = self._owners[block.owner]
        if block.device is not None:
            if block.hard:
                assert record.pool is not None
                record.pool.give(block.offset, block.nbytes)
            self._unplace(block)
        block.host = None
        block.freed = True
        record.blocks.discard(block)

    def _drain(self) -> None:
        while self._dropped:
            block = self._dropped.popleft()
            if not block.freed:
                self._drop(block)


class RuntimeArray:
    """One block of a `MemoryManager`: on the device, or evicted to host memory.

    `get()` returns the device array (reloading it when evicted); `put(value)` writes into it;
    `to_numpy()` reads a copy without moving it; `free()` returns its memory. Use
    ``with manager.pinned(a, b) as (x, y)`` for several arrays at once.
    """

    __slots__ = ("__weakref__", "_block", "_manager")

    def __init__(self, manager: MemoryManager, block: _Block) -> None:
        self._manager = manager
        self._block = block

    @property
    def owner(self) -> str:
        return self._block.owner

    @property
    def shape(self) -> tuple[int, ...]:
        return self._block.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._block.dtype

    @property
    def nbytes(self) -> int:
        return self._block.nbytes

    @property
    def resident(self) -> bool:
        """On the device now (False once evicted, until the next access)."""
        return self._block.device is not None

    def get(self) -> Any:
        """The device array, reloaded first when evicted; valid until the next call that may evict."""
        return self._manager._get(self._block)

    def put(self, value: Any) -> None:
        """Write `value` (scalar or array broadcastable to `shape`) into the array, in place."""
        self._manager._put(self._block, value)

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """A NumPy copy of the contents, from wherever they are (no reload, no LRU change)."""
        return self._manager._to_numpy(self._block)

    def pinned(self) -> Any:
        """``with arr.pinned() as (device,):`` — `MemoryManager.pinned` for this array."""
        return self._manager.pinned(self)

    def free(self) -> None:
        """Give its memory back now (also done when the array is garbage-collected)."""
        self._manager._free(self._block)

    def __repr__(self) -> str:
        where = "freed" if self._block.freed else "device" if self.resident else "host"
        return f"RuntimeArray(owner={self.owner!r}, shape={self.shape}, dtype={self.dtype}, on={where})"


def _shape(shape: object) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int | np.integer) else shape
    if isinstance(dims, str) or not isinstance(dims, Sequence):
        raise ValueError(f"shape must be an int or a sequence of ints, got {shape!r}")
    if not all(isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise ValueError(f"shape must hold non-negative ints, got {shape!r}")
    return tuple(int(d) for d in dims)


def _dtype(dtype: Any) -> np.dtype[Any]:
    if dtype is None:  # np.dtype(None) is float64: a missing dtype is an error, not a default
        raise ValueError("dtype must be a NumPy dtype (np.float32, 'int64', ...), got None")
    try:
        kind: np.dtype[Any] = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must be a NumPy dtype (np.float32, 'int64', ...), got {dtype!r}") from None
    if kind.hasobject or kind.itemsize == 0:
        raise ValueError(f"dtype must be a fixed-size numeric dtype, got {dtype!r}")
    return kind
