"""The extender as tests and benchmarks run it: ``neuronetes extender serve`` in a child process,
or its app in a thread of this one.

Importable from tests (pytest's ``pythonpath`` holds ``tests/``) and from the benchmarks (they
put this folder on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvicorn

from neuronetes_extender.server import SHUTTING_DOWN, ListenPolicy, free_port, uvicorn_config
from neuronetes_extender.service import ExtenderService

__all__ = ["ExtenderProcess", "ExtenderThread", "free_port", "terminate"]


def terminate(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """SIGTERM `proc`, SIGKILL it if it is still there after `grace_s`, and reap it."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ExtenderThread:
    """The extender's uvicorn server in a background thread of this process (e2e tests)."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        policy: ListenPolicy | None = None,
    ) -> None:
        self.app = app
        self.policy = policy or ListenPolicy(host, port or free_port(host))
        self.host, self.port = self.policy.host, self.policy.port
        self.server = uvicorn.Server(uvicorn_config(app, self.policy, "warning"))
        self._thread = threading.Thread(target=self.server.run, name="extender-http", daemon=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.policy.https else 'http'}://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ExtenderThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"extender did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        service = getattr(getattr(self.app, "state", None), "service", None)
        if isinstance(service, ExtenderService):
            service.barrier.fail_all(SHUTTING_DOWN)  # as on SIGTERM: waiting binds do not hold the stop
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
        extra_args: Sequence[str] = (),
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.workdir = workdir
        self.config = config
        self.host = host
        self.port = port or free_port(host)
        self.log_level = log_level
        self.extra_args = list(extra_args)
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
        argv += self.extra_args
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

    def stop(self, grace_s: float = 15.0) -> float | None:
        """SIGTERM, then SIGKILL after `grace_s`; nothing of its session is left. Returns how
        long it took to exit by itself (None: it had to be killed, or was not running)."""
        return self._signal(signal.SIGTERM, grace_s)

    def _signal(self, sig: signal.Signals, grace_s: float = 10.0) -> float | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        took: float | None = None
        started = time.monotonic()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(grace_s)
                took = time.monotonic() - started
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything left in its session
        return took

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def serve_fake(port: int, max_body_bytes: int) -> None:
    """Serve the extender app over a synced in-memory cache of four nodes (no API server) on
    loopback `port` until killed: for tests that need a real HTTP server in another process."""
    from extender_support import FakeApi, node_objects, synced_cache

    from neuronetes_extender.app import create_app
    from neuronetes_extender.config import ExtenderSettings

    cache = synced_cache(node_objects({"dgx-a100-80gb": 4}), ExtenderSettings(max_body_bytes=max_body_bytes))
    app = create_app(ExtenderService(cache, FakeApi(cache=cache)))
    uvicorn.Server(uvicorn_config(app, ListenPolicy("127.0.0.1", port), "warning")).run()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="an extender over a fake cache, for tests")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024)
    args = parser.parse_args()
    serve_fake(args.port, args.max_body_bytes)
