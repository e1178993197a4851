"""A real Prometheus server (Debian's ``prometheus`` package) for the e2e tests, and its HTTP API.

``with PrometheusServer(tmp_path, {"agent": ["127.0.0.1:PORT"]}, rule_files=[...]) as prom:``
scrapes every target and evaluates the rules once a second; ``prom.query(expr)`` returns the
instant result (raises `PrometheusError` when Prometheus refuses the expression),
``prom.rules()`` the rules' health and state. Entering waits until the server is ready: its API
answers 503 while the TSDB opens, which takes seconds on a loaded machine.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

INSTALLED = shutil.which("prometheus") is not None
needs_prometheus = pytest.mark.skipif(not INSTALLED, reason="prometheus (Debian package) is not installed")


READY_TIMEOUT_S = 120.0


class PrometheusError(RuntimeError):
    """Prometheus answered an error (a query it cannot parse or evaluate)."""


class PrometheusUnavailable(OSError):
    """Prometheus answered 503 (not ready, or shutting down): worth asking again, like no answer."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    def __init__(
        self,
        workdir: Path,
        targets: Mapping[str, Sequence[str]],
        *,
        rule_files: Sequence[Path] = (),
        file_sd: Mapping[str, Path] | None = None,
    ) -> None:
        """``file_sd``: job → a file_sd JSON file of targets and their labels (``__metrics_path__``
        included), reread as it changes."""
        self.workdir = workdir
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(f) for f in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(addresses)}]}
                for job, addresses in targets.items()
            ]
            + [
                {"job_name": job, "file_sd_configs": [{"files": [str(path)], "refresh_interval": "1s"}]}
                for job, path in (file_sd or {}).items()
            ],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(json.dumps(config))  # JSON is YAML
        self.log = workdir / "prometheus.log"
        self._server: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        with self.log.open("wb") as out:
            self._server = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ready():
            exited = self._server.poll()
            if exited is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.__exit__(None, None, None)
                raise RuntimeError(
                    f"prometheus {'exited ' + str(exited) if exited is not None else 'not ready'} "
                    f"after {READY_TIMEOUT_S:.0f} s at most; its log ends:\n{tail}"
                )
            time.sleep(0.2)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.terminate()
            try:
                self._server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())["data"]
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                raise PrometheusUnavailable(f"{path}: 503 {exc.reason}") from None
            # 400/422: the expression is refused
            raise PrometheusError(
                f"{path} {params}: {exc.code} {exc.read().decode(errors='replace')}"
            ) from None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
                status: int = r.status
                return status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) `expr` evaluates to now."""
        data = self._get("/api/v1/query", {"query": expr})
        result = data["result"]
        return result if data["resultType"] in ("vector", "matrix") else [{"value": result}]

    def targets_up(self) -> dict[str, str]:
        """Scrape URL -> health ("up", "down", "unknown") of every active target."""
        return {t["scrapeUrl"]: t["health"] for t in self._get("/api/v1/targets")["activeTargets"]}

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule: name, health ("ok", "err", "unknown"), lastError, state (alerts)."""
        return [rule for group in self._get("/api/v1/rules")["groups"] for rule in group["rules"]]
