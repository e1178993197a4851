"""The workstation daemon: ``neuronetes agent run --standalone`` (``neuronetes-agent --standalone``).

One daemon per state directory (an exclusive ``flock`` on ``daemon.lock``, released by the kernel
even on SIGKILL). Start: open the store, the GPU backend and the checkpoint API, reconcile the
processes with the store (`recovery`), then serve the socket and run the scheduler loop until
SIGTERM/SIGINT. Stopping the daemon does not stop its jobs: the next daemon re-adopts them.
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

from .admission import Settings
from .checkpoint import CudaCheckpoint
from .gpus import Gpus, open_backend
from .launcher import Launcher
from .recovery import recover
from .scheduler import Config, Scheduler
from .server import DaemonServer, check_socket_path
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
    interval: float = 0.2
    log_level: str = "info"


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def _lock(state_dir: Path) -> int | str:
    """An exclusive lock on the state directory: its fd, or why not."""
    fd = os.open(state_dir / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        return f"a workstation daemon (pid {owner}) already runs for {state_dir}"
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


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
        check_socket_path(opts.state_dir)
        opts.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        locked = _lock(opts.state_dir)
        if isinstance(locked, str):
            return _error(locked)
        store = Store(opts.state_dir)
        backend, description = open_backend(opts.simulate_gpus)
    except (ValueError, OSError, StoreError) as exc:
        return _error(str(exc))
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
        Launcher(opts.state_dir, opts.shim_library),
        ckpt,
        config,
        gpus_description=description,
    )
    recover(sched)
    sched.tick()  # GPUs read and the queue looked at before the first request is answered
    server = DaemonServer(opts.state_dir, sched)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        sched.wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # A job's shepherd ended: reap it now rather than at the next round.
    signal.signal(signal.SIGCHLD, lambda signum, frame: sched.wake.set())
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
        os.close(locked)
    return 0
