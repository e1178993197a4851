"""Where tiles run: the `Backend` protocol and the table of backends by name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

__all__ = ["Backend", "register_backend"]

T = TypeVar("T")


class Backend(Protocol):
    """An array framework and its device: tiles are timed on it, memory is sized from it."""

    name: str
    xp: Any  # the array module: numpy, cupy, torch

    def time_tile(self, fn: Callable[[], T]) -> tuple[T, float]:
        """Run `fn` and return its result and the device seconds it took."""
        ...

    def memory_capacity(self) -> int:
        """The device memory the runtime may use, in bytes."""
        ...

    def stream(self, high_priority: bool) -> AbstractContextManager[Any]:
        """A context in which work is queued on the high- or low-priority stream."""
        ...


_REGISTRY: dict[str, tuple[Callable[[], Backend], Callable[[], bool]]] = {}


def register_backend(name: str, factory: Callable[[], Backend], available: Callable[[], bool]) -> None:
    """Add a backend by name: `factory()` makes it, `available()` says whether this machine can."""
    _REGISTRY[name] = (factory, available)


def registered() -> Iterator[tuple[str, Callable[[], Backend], Callable[[], bool]]]:
    for name, (factory, available) in _REGISTRY.items():
        yield name, factory, available
