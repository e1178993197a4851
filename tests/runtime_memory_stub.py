"""A stand-in for ``neuronetes.runtime.memory`` where that module is not in the tree: plain byte
accounting (no arrays' blocks, no eviction), installed only when the real module is missing."""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import numpy


class MemoryManager:
    def __init__(self, capacity_bytes: int, backend: Any) -> None:
        self.capacity = capacity_bytes
        self.reserved: dict[str, int] = {}

    def free_bytes(self) -> int:
        return self.capacity - sum(self.reserved.values())

    def reserve(self, owner: str, nbytes: int, hard: bool) -> None:
        from neuronetes.runtime.errors import AdmissionError

        if hard and nbytes > self.free_bytes():
            raise AdmissionError("memory", nbytes, self.free_bytes())
        self.reserved[owner] = nbytes

    def release(self, owner: str) -> None:
        self.reserved.pop(owner, None)

    def usage(self, owner: str) -> int:
        return self.reserved.get(owner, 0)

    def evictions(self, owner: str) -> int:
        return 0

    def array(self, owner: str, shape: Any, dtype: Any) -> Any:
        return numpy.zeros(shape, dtype)


def install() -> None:
    if importlib.util.find_spec("neuronetes.runtime.memory") is None:
        module = types.ModuleType("neuronetes.runtime.memory")
        module.MemoryManager = MemoryManager  # type: ignore[attr-defined]
        sys.modules["neuronetes.runtime.memory"] = module
