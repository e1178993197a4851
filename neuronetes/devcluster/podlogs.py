"""The kubelet's log endpoint for the chart runner's pods: ``kubectl logs`` on the local cluster.

``kubectl logs POD`` asks the API server, which asks the pod's node's kubelet
(``GET /containerLogs/NS/POD/CONTAINER``, HTTPS) through its ``cluster`` egress — the chart
runner's proxy, which sends connections to the simulated nodes' address here. This server answers
from the container's log file (``tailLines``, ``follow``), on loopback with a self-signed
certificate (the API server verifies kubelets only when given their CA; the dev cluster gives none).
The agent container of every agent pod reads the fleet's log.
"""

from __future__ import annotations

import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from neuronetes_operator import webhook

__all__ = ["FindLog", "LogServer", "log_lines"]

FindLog = Callable[[str, str, str], Path | None]
"""(namespace, pod, container) → its log file, or None: no such container runs."""
_MARK: Final = "=== "
"""The runner's line before each start of a process (not the container's output)."""


def log_lines(path: Path, tail: int | None) -> tuple[list[str], int]:
    """The container's lines of `path` (the last `tail` when given) and the offset read up to."""
    data = path.read_bytes()
    lines = _output(data.decode(errors="replace").splitlines(keepends=True))
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    return lines, len(data)


def _output(lines: list[str]) -> list[str]:
    """`lines` without the runner's start lines (and the blank line it writes before each)."""
    out: list[str] = []
    for line in lines:
        if line.startswith(_MARK):
            if out and out[-1] == "\n":
                out.pop()
            continue
        out.append(line)
    return out


def _follow(path: Path, offset: int, alive: Callable[[], bool]) -> Iterator[str]:
    while alive():
        try:
            with path.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        if chunk:
            offset += len(chunk)
            yield from _output(chunk.decode(errors="replace").splitlines(keepends=True))
        else:
            time.sleep(0.3)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        query = urllib.parse.parse_qs(url.query)
        if len(parts) != 4 or parts[0] != "containerLogs":
            self.send_error(404, "only /containerLogs/NAMESPACE/POD/CONTAINER")
            return
        path = self.server.find(parts[1], parts[2], parts[3])
        if path is None or not path.exists():
            self.send_error(404, f"no log of container {parts[3]} in pod {parts[1]}/{parts[2]}")
            return
        try:
            tail = int(query["tailLines"][0]) if "tailLines" in query else None
        except ValueError:
            self.send_error(400, "tailLines: an integer")
            return
        lines, offset = log_lines(path, tail)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        try:
            self.wfile.write("".join(lines).encode())
            if query.get("follow", ["false"])[0] == "true":
                alive = lambda: self.server.find(parts[1], parts[2], parts[3]) == path  # noqa: E731
                for line in _follow(path, offset, alive):
                    self.wfile.write(line.encode())
                    self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, find: FindLog) -> None:
        self.find = find
        super().__init__(("127.0.0.1", 0), _Handler)


class LogServer:
    """Serves `find`'s log files on a free loopback port, HTTPS with a certificate in `cert_dir`."""

    def __init__(self, cert_dir: Path, find: FindLog) -> None:
        webhook.ensure_certificate(cert_dir)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_dir / webhook.CERT_FILE, cert_dir / webhook.KEY_FILE)
        self._server = _Server(find)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="pod-logs", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
