"""Cooperative in-process scheduling of GPU (or CPU) work with QoS, memory reservation and
micro-slicing: tasks run as tiles with a yield point between them, and a `Scheduler` decides which
tile runs when (docs/runtime.md).

    from neuronetes import runtime
    sched = runtime.Scheduler(window_ms=10, tick_ms=1, backend="auto")
    task_id = sched.submit(fn, memory=None, bandwidth=None, policy="best_effort", priority=0, slice=None)
    sched.run()

``runtime.scheduler`` is a module-level default `Scheduler`, made on first use.
"""

from __future__ import annotations

from typing import Any

from neuronetes.runtime.backends import Backend, NumpyBackend, register_backend, select_backend
from neuronetes.runtime.errors import AdmissionError, InvalidArgument, RuntimeErrorBase
from neuronetes.runtime.limits import ContainerLimits, ContainerLimitsError, container_limits
from neuronetes.runtime.scheduling import POLICIES, Scheduler, Task, current_task
from neuronetes.runtime.tiles import TiledWorkload, tiled, yield_task

__all__ = [
    "POLICIES",
    "AdmissionError",
    "Backend",
    "ContainerLimits",
    "ContainerLimitsError",
    "InvalidArgument",
    "NumpyBackend",
    "RuntimeErrorBase",
    "Scheduler",
    "Task",
    "TiledWorkload",
    "container_limits",
    "current_task",
    "register_backend",
    "scheduler",
    "select_backend",
    "tiled",
    "yield_task",
]

_default: Scheduler | None = None


def __getattr__(name: str) -> Any:
    # The default scheduler is made on first use, so importing the module selects no backend.
    global _default
    if name == "scheduler":
        if _default is None:
            _default = Scheduler()
        return _default
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
