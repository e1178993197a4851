"""The workstation daemon: ``neuronetes agent run --workstation`` (``neuronetes-agent --workstation``).

One daemon per state directory (an exclusive ``flock`` on ``daemon.lock``, released by the kernel
even on SIGKILL). Start: check the state directory (`statedir`), open the store, the GPU backend,
the checkpoint API and the containment of attempts (`containment`), reconcile the processes with
the store (`recovery`), then serve the socket and run the scheduler loop until SIGTERM/SIGINT.
Stopping the daemon does not stop its jobs: the next daemon re-adopts them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from neuronetes.signals import relay_signals

from .admission import Settings
from .checkpoint import CudaCheckpoint
from .containment import detect
from .gpus import Gpus, open_backend
from .jobs import parse_size
from .launcher import Launcher
from .recovery import recover
from .scheduler import Config, Scheduler
from .server import DEFAULT_MAX_CLIENTS, DaemonServer, check_socket_path
from .statedir import StateDir
from .store import Store, StoreError

__all__ = ["DaemonOptions", "run_daemon"]

log = logging.getLogger("neuronetes.workstation")


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    state_dir: Path
    simulate_gpus: int | None = None
    utilization_cap: float = 85.0
    headroom: float = 5.0
    aging_seconds: float = 60.0
    checkpoint_deadline: float = 30.0
    cuda_driver: str = "libcuda.so.1"
    shim_library: Path | None = None
    containment: str = "auto"
    log_max_size: str = "64Mi"
    max_clients: int = DEFAULT_MAX_CLIENTS
    interval: float = 0.2
    log_level: str = "info"


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def _lock(state: StateDir) -> int | str:
    """An exclusive lock on the state directory: its fd, or why not. The lock file is opened with
    O_NOFOLLOW in the checked directory, and truncated only once the lock is ours."""
    fd = state.open(["daemon.lock"], os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        return f"a workstation daemon (pid {owner}) already runs for {state.path}"
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


_STOPPING = frozenset({signal.SIGTERM, signal.SIGINT})


def _relay_signals(stop: threading.Event, wake: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop`; every signal among them and SIGCHLD (a shepherd stopped,
    continued or ended: reap it now rather than at the next round) sets `wake` — from a thread of
    its own (`neuronetes.signals`: a handler setting an Event could deadlock the scheduler loop)."""

    def handle(signum: int) -> None:
        if signum in _STOPPING:
            stop.set()
        wake.set()

    relay_signals(handle, (*_STOPPING, signal.SIGCHLD))


def run_daemon(opts: DaemonOptions) -> int:
    logging.basicConfig(
        level=opts.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = Settings(opts.utilization_cap, opts.headroom, opts.aging_seconds)
        if opts.checkpoint_deadline <= 0 or opts.interval <= 0:
            raise ValueError("--checkpoint-deadline and the interval must be positive")
        if opts.shim_library is not None and not opts.shim_library.is_file():
            raise ValueError(f"--shim-library {opts.shim_library}: no such file")
        if opts.max_clients < 1:
            raise ValueError(f"--max-clients {opts.max_clients}: at least 1")
        log_max_bytes = parse_size(opts.log_max_size, "--log-max-size")
        check_socket_path(opts.state_dir)
        state = StateDir(opts.state_dir)
        locked = _lock(state)
        if isinstance(locked, str):
            return _error(locked)
        store = Store(opts.state_dir)
        containment = detect(opts.containment, opts.state_dir)
        launcher = Launcher(
            opts.state_dir, opts.shim_library, containment=containment, log_max_bytes=log_max_bytes
        )
        backend, description = open_backend(opts.simulate_gpus)
    except (ValueError, OSError, StoreError) as exc:
        return _error(str(exc))
    log.info("attempts contained by %s", containment.describe())
    ckpt = CudaCheckpoint(opts.cuda_driver)
    if not ckpt.available:
        log.warning(
            "transparent checkpoint unavailable (%s): preemption falls back to cooperative"
            " checkpoint or stop/continue",
            ckpt.reason,
        )
    config = Config(settings, cooperative_deadline_s=opts.checkpoint_deadline, interval_s=opts.interval)
    sched = Scheduler(
        store,
        Gpus(backend, store),
        launcher,
        ckpt,
        config,
        gpus_description=description,
    )
    recover(sched)
    sched.tick()  # GPUs read and the queue looked at before the first request is answered
    server = DaemonServer(opts.state_dir, sched, max_clients=opts.max_clients)
    stop = threading.Event()
    _relay_signals(stop, sched.wake)
    serving = threading.Thread(target=server.serve_forever, name="socket", daemon=True)
    serving.start()
    log.info(
        "workstation daemon on %s (%s; checkpoint %s)",
        server.path,
        description,
        "available" if ckpt.available else "unavailable",
    )
    try:
        sched.run(stop)
    finally:
        server.shutdown()
        server.server_close()
        store.close()
        backend.close()
        containment.cleanup()  # the empty cgroups; those of jobs still running stay theirs
        os.close(locked)
        state.close()
    return 0
