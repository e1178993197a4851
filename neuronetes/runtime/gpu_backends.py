"""The GPU backends: CuPy and PyTorch on one CUDA device.

Each is a `neuronetes.runtime.backends.Backend` (``name``, ``xp``, ``time_tile``,
``memory_capacity``, ``stream``) plus ``device_memory()`` for the memory manager
(`neuronetes.runtime.memory.DeviceMemory`: pinned host copies for eviction). The frameworks are
imported only when a backend is made or `cupy_available()` / `torch_available()` is asked, so this
module imports on a machine with neither; there `available()` is False and ``backend="auto"`` falls
back to NumPy. `register_gpu_backends()` adds both to the backend table.

- **Tile timing** uses CUDA events on the current stream: the device time from the event recorded
  before the tile to the one after, waited for (the scheduler paces on it, so a tile's time is
  known before the next decision).
- **Streams**: CUDA honours a range of priorities but schedules only two classes apart in practice;
  a backend keeps two non-blocking streams, the device's greatest priority (``high_priority=True``,
  the guaranteed class) and its least (everyone else).
- **Memory capacity** is the device's free memory as the framework reads it (``cudaMemGetInfo``)
  plus what the framework's own allocator caches unused. Inside a NeuroNetes GPU slice the shim
  hooks ``cuMemGetInfo_v2`` to report the container's total (its limit) and free (the limit minus
  its usage) (docs/shim.md, "Reported memory is the container's"), so this figure never exceeds
  the slice's limit: nothing else needs reading.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Final, TypeVar

import numpy as np

from .backends import register_backend
from .memory import DeviceMemory

__all__ = [
    "CupyBackend",
    "CupyMemory",
    "TorchBackend",
    "TorchMemory",
    "cupy_available",
    "register_gpu_backends",
    "torch_available",
]

T = TypeVar("T")
HIGH: Final = True


def cupy_available() -> bool:
    """CuPy is installed and sees a CUDA device."""
    if importlib.util.find_spec("cupy") is None:  # a probe: CuPy is optional
        return False
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no driver, no device, a CUDA mismatch: all mean "not here"
        return False


def torch_available() -> bool:
    """PyTorch is installed, built with CUDA, and sees a device."""
    if importlib.util.find_spec("torch") is None:  # a probe: PyTorch is optional
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken install or driver means "not here"
        return False


def register_gpu_backends() -> None:
    """Add "cupy" and "torch" to the runtime's backend table."""
    register_backend("cupy", CupyBackend, cupy_available)
    register_backend("torch", TorchBackend, torch_available)


# ---- CuPy


class CupyMemory:
    """`DeviceMemory` over CuPy arrays; evicted blocks go to pinned host memory."""

    def __init__(self) -> None:
        import cupy

        self._cp: Any = cupy

    def out_of_memory(self) -> tuple[type[BaseException], ...]:
        return (self._cp.cuda.memory.OutOfMemoryError,)

    def empty_bytes(self, nbytes: int) -> Any:
        return self._cp.empty(nbytes, dtype=self._cp.uint8)

    def view(self, buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return buffer[offset : offset + size].view(dtype).reshape(shape)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return self._cp.zeros(shape, dtype=dtype)

    def assign(self, device: Any, value: Any) -> None:
        device[...] = self._cp.asarray(value)

    def to_host(self, device: Any) -> Any:
        import cupyx

        host = cupyx.empty_pinned(device.shape, dtype=device.dtype)  # NumPy over page-locked memory
        device.get(out=host)  # synchronous: done before the device array is dropped
        return host

    def to_device(self, host: Any) -> Any:
        return self._cp.array(host, copy=True)

    def to_numpy(self, array: Any) -> np.ndarray[Any, Any]:
        return np.array(self._cp.asnumpy(array), copy=True)


def _cupy_priority_range(cupy: Any) -> tuple[int, int]:
    """(least, greatest) stream priority: CUDA's own answer where CuPy exposes it (CuPy 14 does not);
    else (0, -5), the widest range CUDA gives today: it clamps a priority into the device's range,
    so -5 is the device's greatest whatever that is."""
    ask = getattr(cupy.cuda.runtime, "deviceGetStreamPriorityRange", None)
    if ask is None:
        return 0, -5
    least, greatest = ask()
    return int(least), int(greatest)


class CupyBackend:
    """Tiles on CuPy: CUDA events time them, two priority streams, capacity from the device."""

    name = "cupy"

    def __init__(self, device: int = 0) -> None:
        import cupy

        self.xp: Any = cupy
        self._device: Any = cupy.cuda.Device(device)
        self._device.use()
        least, greatest = _cupy_priority_range(cupy)
        self._priorities = {HIGH: greatest, not HIGH: least}
        self._streams: dict[tuple[str, bool], Any] = {}  # (owner, high) -> its stream, made once

    def time_tile(self, fn: Callable[[], T]) -> tuple[T, float]:
        """`fn()` and its device seconds, between events on the current stream: call it inside
        ``stream(...)`` so the events are on the stream the tile's kernels go to."""
        start, end = self.xp.cuda.Event(), self.xp.cuda.Event()
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        return result, float(self.xp.cuda.get_elapsed_time(start, end)) / 1e3

    def memory_capacity(self) -> int:
        free, _total = self.xp.cuda.runtime.memGetInfo()
        return int(free) + int(self.xp.get_default_memory_pool().free_bytes())

    def stream(self, high_priority: bool, owner: str = "") -> AbstractContextManager[Any]:
        """The stream of `owner` (a slice's name; "" for tasks in no slice) at the high or low
        priority: two per owner, the same object every time (the scheduler and a worker thread
        both enter it)."""
        key = (owner, bool(high_priority))
        stream = self._streams.get(key)
        if stream is None:
            stream = self.xp.cuda.Stream(non_blocking=True, priority=self._priorities[key[1]])
            self._streams[key] = stream
        context: AbstractContextManager[Any] = stream
        return context

    def device_memory(self) -> DeviceMemory:
        return CupyMemory()


# ---- PyTorch


class TorchMemory:
    """`DeviceMemory` over PyTorch CUDA tensors; evicted blocks go to pinned host tensors.

    Dtypes are NumPy's (the memory manager's contract), mapped to PyTorch's by
    ``torch.from_numpy``'s own table."""

    def __init__(self, device: Any) -> None:
        import torch

        self._torch: Any = torch
        self._device = device

    def _dtype(self, dtype: np.dtype[Any]) -> Any:
        return self._torch.from_numpy(np.empty(0, dtype)).dtype

    def out_of_memory(self) -> tuple[type[BaseException], ...]:
        return (self._torch.cuda.OutOfMemoryError,)

    def empty_bytes(self, nbytes: int) -> Any:
        return self._torch.empty(nbytes, dtype=self._torch.uint8, device=self._device)

    def view(self, buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return buffer[offset : offset + size].view(self._dtype(dtype)).reshape(shape)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return self._torch.zeros(shape, dtype=self._dtype(dtype), device=self._device)

    def assign(self, device: Any, value: Any) -> None:
        if isinstance(value, int | float | complex | np.generic):
            device.fill_(value.item() if isinstance(value, np.generic) else value)
        else:
            device.copy_(self._torch.as_tensor(value))

    def to_host(self, device: Any) -> Any:
        host = self._torch.empty(device.shape, dtype=device.dtype, pin_memory=True)
        host.copy_(device)  # synchronous: done before the device tensor is dropped
        return host

    def to_device(self, host: Any) -> Any:
        return host.to(self._device)

    def to_numpy(self, array: Any) -> np.ndarray[Any, Any]:
        return np.array(array.detach().cpu().numpy(), copy=True)


class TorchBackend:
    """Tiles on PyTorch: CUDA events time them, two priority streams, capacity from the device."""

    name = "torch"

    def __init__(self, device: int = 0) -> None:
        import torch

        self.xp: Any = torch
        self.device: Any = torch.device("cuda", device)
        torch.cuda.set_device(self.device)
        priority_range = getattr(torch.cuda.Stream, "priority_range", None)
        least, greatest = priority_range() if priority_range is not None else (0, -1)
        self._priorities = {HIGH: greatest, not HIGH: least}
        self._streams: dict[tuple[str, bool], Any] = {}  # (owner, high) -> its stream, made once

    def time_tile(self, fn: Callable[[], T]) -> tuple[T, float]:
        """`fn()` and its device seconds, between events on the current stream: call it inside
        ``stream(...)`` so the events are on the stream the tile's kernels go to."""
        cuda = self.xp.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        return result, float(start.elapsed_time(end)) / 1e3

    def memory_capacity(self) -> int:
        cuda = self.xp.cuda
        free, _total = cuda.mem_get_info(self.device)
        cached = int(cuda.memory_reserved(self.device)) - int(cuda.memory_allocated(self.device))
        return int(free) + cached

    def stream(self, high_priority: bool, owner: str = "") -> AbstractContextManager[Any]:
        """As `CupyBackend.stream`: two streams per owner, made once."""
        key = (owner, bool(high_priority))
        stream = self._streams.get(key)
        if stream is None:
            stream = self.xp.cuda.Stream(self.device, priority=self._priorities[key[1]])
            self._streams[key] = stream
        context: AbstractContextManager[Any] = self.xp.cuda.stream(stream)
        return context

    def device_memory(self) -> DeviceMemory:
        return TorchMemory(self.device)


register_gpu_backends()  # importing the module adds the backends (`backends.select_backend`)
