"""Where tiles run and how they are timed: the `Backend` protocol, the NumPy backend, and the
registry `select_backend` chooses from.

The NumPy backend is always there: "device time" is the scheduler thread's wall time inside a
tile (``time.perf_counter``), so a task's bandwidth is its share of that thread. GPU backends
(CuPy, PyTorch) live in ``neuronetes.runtime.gpu_backends``, which registers them through
`register_backend` when it is imported (it imports no framework until a backend is asked for);
``select_backend("auto")`` imports it and takes the first registered GPU backend that says it is
available, else NumPy.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any, Protocol, TypeVar, runtime_checkable

from neuronetes.runtime.errors import InvalidArgument

T = TypeVar("T")


@runtime_checkable
class Backend(Protocol):
    """What the scheduler needs from an array library and its device.

    - `name`: how `select_backend` knows it ("numpy", "cupy", "torch").
    - `xp`: the array module (numpy, cupy, torch).
    - `time_tile(fn)`: run one tile and return its result and the device time it took, in seconds
      (the NumPy backend: wall time of the calling thread; GPU backends: CUDA events around the
      tile on the current stream, synchronised before returning).
    - `memory_capacity()`: bytes of device memory the process could use.
    - `stream(high_priority, owner)`: a context manager making `owner`'s stream of that priority
      current for the calling thread. Each distinct `owner` (a slice's name; ``""`` for tasks in no
      slice) has its own two streams, and the same owner and priority always give the same stream,
      so two threads entering it launch onto one stream. The scheduler asks once per task and
      enters the same object for each of its tiles, so it must be reusable (a
      ``contextlib.nullcontext`` is never entered). A no-op on the CPU.

    Optional: `tile_clock`, a host clock whose difference around the tile call is exactly what
    `time_tile` measures (the NumPy backend's); the scheduler then times tiles of tasks without a
    stream itself, one call fewer between tiles, which is time no task gets.
    """

    name: str

    @property
    def xp(self) -> ModuleType: ...

    def time_tile(self, fn: Callable[[], T]) -> tuple[T, float]: ...

    def memory_capacity(self) -> int: ...

    def stream(self, high_priority: bool, owner: str = "") -> AbstractContextManager[Any]: ...


class NumpyBackend:
    """The CPU backend: NumPy arrays, tiles timed by `clock` (``time.perf_counter`` unless a test
    gives another; also `tile_clock`, so the scheduler times them inline), physical memory as
    capacity, no streams."""

    name = "numpy"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = self.tile_clock = clock

    @property
    def xp(self) -> ModuleType:
        import numpy

        return numpy

    def time_tile(self, fn: Callable[[], T]) -> tuple[T, float]:
        start = self._clock()
        result = fn()
        return result, self._clock() - start

    def memory_capacity(self) -> int:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))

    def stream(self, high_priority: bool, owner: str = "") -> AbstractContextManager[Any]:
        return contextlib.nullcontext()


# name → (factory, available); insertion order is the order "auto" tries GPU backends in.
_REGISTRY: dict[str, tuple[Callable[[], Backend], Callable[[], bool]]] = {
    "numpy": (NumpyBackend, lambda: True),
}


def register_backend(name: str, factory: Callable[[], Backend], available: Callable[[], bool]) -> None:
    """Make a backend selectable by `name`. `available()` is asked at selection time (is the
    library installed, is a GPU visible); `factory()` builds it. Registering a name again replaces
    it."""
    if not name or not isinstance(name, str):
        raise InvalidArgument("name", f"a backend needs a non-empty name, got {name!r}")
    _REGISTRY[name] = (factory, available)


def backend_names() -> list[str]:
    """The names `select_backend` knows (the GPU backends registered too)."""
    _load_gpu_backends()
    return [*_REGISTRY, "auto"]


def _load_gpu_backends() -> None:
    # Imported here, not at the top: it imports this module (`register_backend`), and importing it
    # registers its backends.
    from neuronetes.runtime import gpu_backends  # noqa: F401


def select_backend(backend: str | Backend = "auto") -> Backend:
    """The backend named by `backend` ("auto", "numpy", "cupy", "torch", or any registered name), or
    `backend` itself when it already is one. "auto" prefers a GPU backend that is available.

    Raises:
        InvalidArgument: an unknown name, or a named backend that is not available here.
    """
    if not isinstance(backend, str):
        if isinstance(backend, Backend):
            return backend
        raise InvalidArgument(
            "backend", f"expected a backend name or a Backend, got {type(backend).__name__}"
        )
    _load_gpu_backends()
    if backend == "auto":
        for name, (factory, available) in _REGISTRY.items():
            if name != "numpy" and available():
                return factory()
        return NumpyBackend()
    if backend not in _REGISTRY:
        known = ", ".join(sorted([*_REGISTRY, "auto"]))
        raise InvalidArgument("backend", f"unknown backend {backend!r} (known: {known})")
    factory, available = _REGISTRY[backend]
    if not available():
        raise InvalidArgument("backend", f"{backend} is not available in this process (no library or no GPU)")
    return factory()
