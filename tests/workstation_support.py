"""A workstation scheduler in-process for the unit tests: the store, one simulated GPU, a launcher
(subreaper containment) and no CUDA checkpoint API, over a state directory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from neuronetes_agent.workstation.checkpoint import CudaCheckpoint
from neuronetes_agent.workstation.gpus import Gpus, open_backend
from neuronetes_agent.workstation.launcher import Launcher
from neuronetes_agent.workstation.scheduler import Config, Scheduler
from neuronetes_agent.workstation.store import Store


@contextlib.contextmanager
def workstation_scheduler(state_dir: Path) -> Iterator[Scheduler]:
    store = Store(state_dir)
    backend, _ = open_backend(1)
    try:
        yield Scheduler(
            store,
            Gpus(backend, store),
            Launcher(state_dir),
            CudaCheckpoint(str(state_dir / "none")),
            Config(),
        )
    finally:
        backend.close()
        store.close()
