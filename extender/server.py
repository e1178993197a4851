"""Running the extender: the `neuronetes extender serve` command and an in-thread runner.

One uvicorn worker (uvloop + httptools when installed) serves the app; two background threads
keep the GPU cache in step with the API server. One worker is deliberate: the cache is the
single picture of every GPU, and the decisions it makes under its lock are sub-millisecond.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from .app import create_app
from .cache import GpuCache
from .config import ConfigError, SettingsSource
from .kube import KubeApi, KubeError
from .metrics import ExtenderMetrics
from .reservations import GroupDirectory, ReservationStore
from .service import ExtenderService
from .watch import Reflectors, start_reflectors

__all__ = ["Extender", "ExtenderProcess", "ExtenderThread", "build", "free_port", "serve"]

log = logging.getLogger(__name__)


@dataclass
class Extender:
    """An assembled extender: cache, service, app, and (once started) the reflectors."""

    cache: GpuCache
    service: ExtenderService
    app: FastAPI
    metrics: ExtenderMetrics
    reflectors: Reflectors | None = None
    store: ReservationStore | None = None


def build(
    *,
    kubeconfig: str | Path | None = None,
    config: str | Path | None = None,
    api: KubeApi | None = None,
    watch: bool = True,
    resync_period: float = 600.0,
    service_class: type[ExtenderService] = ExtenderService,
) -> Extender:
    """Cache + service + app; with `watch`, the app's startup starts the list+watch threads.

    `service_class` may be a subclass that instruments the verbs (tests, benchmarks).
    """
    settings = SettingsSource(config)
    cache = GpuCache(settings)
    api = api or KubeApi.from_kubeconfig(kubeconfig)
    metrics = ExtenderMetrics(cache.stats)
    service = service_class(cache, api, metrics, GroupDirectory(api))
    store = ReservationStore(cache, api, resync_period=resync_period) if watch else None
    holder: dict[str, Reflectors] = {}

    def startup() -> None:
        if watch:
            holder["r"] = start_reflectors(cache, api, resync_period=resync_period)
            extender.reflectors = holder["r"]
        if store is not None:
            store.start()

    def shutdown() -> None:
        if "r" in holder:
            holder.pop("r").stop()
        if store is not None:
            store.stop()

    app = create_app(service, metrics=metrics, on_startup=startup, on_shutdown=shutdown)
    extender = Extender(cache, service, app, metrics, store=store)
    return extender


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _uvicorn_config(app: Any, host: str, port: int, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_keep_alive=120,  # kube-scheduler keeps one connection per extender
    )


class ExtenderThread:
    """The extender's uvicorn server in a background thread (e2e tests, benchmarks, demos)."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(_uvicorn_config(app, self.host, self.port, "warning"))
        self._thread = threading.Thread(target=self.server.run, name="extender-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ExtenderThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"extender did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> ExtenderThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ExtenderProcess:
    """``neuronetes extender serve`` in a child process (benchmarks, restart tests).

    The port is fixed for the object's life, so the extender can be killed and started again at
    the same URL (kube-scheduler's configuration stays valid). The child runs in its own session
    with `workdir` as its working directory (never the checkout, whose ``operator/`` folder would
    shadow the standard library's module); each start logs to ``workdir/extender-<n>.log``.
    """

    def __init__(
        self,
        kubeconfig: str | Path,
        workdir: Path,
        config: Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_level: str = "info",
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.workdir = workdir
        self.config = config
        self.host = host
        self.port = port or free_port(host)
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"extender-{self.starts}.log"

    def start(self, timeout: float = 60.0, ready: Callable[[], bool] | None = None) -> None:
        """Start it and wait until ``/readyz`` answers 200 (and `ready()`, when given, is true)."""
        self.starts += 1
        argv = [sys.executable, "-m", "neuronetes.cli", "extender", "serve"]
        argv += ["--kubeconfig", str(self.kubeconfig), "--host", self.host, "--port", str(self.port)]
        argv += ["--log-level", self.log_level]
        if self.config is not None:
            argv += ["--config", str(self.config)]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not (self.ready() and (ready is None or ready())):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the extender exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the extender was not ready in {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.2)

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 now."""
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def kill(self) -> None:
        """SIGKILL, no grace (a crash)."""
        self._signal(signal.SIGKILL)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; nothing of its session is left."""
        self._signal(signal.SIGTERM, grace_s)

    def _signal(self, sig: signal.Signals, grace_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything left in its session

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def serve(ns: argparse.Namespace) -> int:
    """`neuronetes extender serve` (arguments from `neuronetes.cli`): run until interrupted."""
    logging.basicConfig(
        level=getattr(logging, ns.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        extender = build(kubeconfig=ns.kubeconfig, config=ns.config, resync_period=ns.resync_period)
    except (ConfigError, KubeError) as exc:
        log.error("%s", exc)
        return 2
    uvicorn.Server(_uvicorn_config(extender.app, ns.host, ns.port, ns.log_level)).run()
    return 0
