"""The API server's way to the chart's pods on one host: an HTTP CONNECT proxy on a Unix socket.

The API server calls an admission webhook at its Service (``clusterIP:443``), which no host
process listens on: nothing routes Service or pod IPs here. kube-apiserver sends such traffic
(network context ``cluster``: webhooks, aggregated APIs, kubelets) through the proxy its
``--egress-selector-config-file`` names, and this proxy — run by the chart runner — resolves the
target as kube-proxy would: a Service's cluster IP and port to a ready pod behind it, a pod IP to
the pod's loopback address (`neuronetes.devcluster.podplan.pod_address`). TLS stays end to end:
the proxy only copies bytes, the API server verifies the webhook's certificate itself.
"""

from __future__ import annotations

import contextlib
import select
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

__all__ = ["EgressProxy", "Resolve", "egress_selector_config", "parse_connect"]

Resolve = Callable[[str, int], tuple[str, int] | None]
"""(host, port) the API server asked for → (address, port) on this host, or None: unreachable."""
_MAX_HEAD: Final = 8192
DIAL_WAIT_S: Final = 4.5
"""Below the API server's shortest webhook timeout that matters here (the chart's: 5 s)."""


def egress_selector_config(socket_path: Path) -> dict[str, Any]:
    """kube-apiserver's EgressSelectorConfiguration: ``cluster`` traffic through `socket_path`."""
    return {
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [
            {
                "name": "cluster",
                "connection": {
                    "proxyProtocol": "HTTPConnect",
                    "transport": {"uds": {"udsName": str(socket_path)}},
                },
            }
        ],
    }


def parse_connect(head: bytes) -> tuple[str, int] | None:
    """(host, port) of a ``CONNECT host:port HTTP/1.x`` request head; None for anything else."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or parts[0] != "CONNECT" or not parts[2].startswith("HTTP/1."):
        return None
    host, sep, port = parts[1].rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    peers = {a: b, b: a}
    open_ = [a, b]
    while open_:
        readable, _, _ = select.select(open_, [], [], 300)
        if not readable:
            return  # idle for five minutes
        for s in readable:
            data = s.recv(65536)
            if not data:
                open_.remove(s)
                with contextlib.suppress(OSError):
                    peers[s].shutdown(socket.SHUT_WR)
                continue
            peers[s].sendall(data)


def _dial(resolve: Resolve, target: tuple[str, int], wait_s: float) -> socket.socket | None:
    """A connection to what `target` resolves to, retried for `wait_s`: a pod that was just
    started may not listen yet (a kubelet's endpoints would wait for its readiness)."""
    deadline = time.monotonic() + wait_s
    while True:
        resolved = resolve(*target)
        if resolved is not None:
            try:
                return socket.create_connection(resolved, timeout=2)
            except OSError:
                pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        client: socket.socket = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(1024)
            if not chunk or len(head) > _MAX_HEAD:
                return
            head += chunk
        target = parse_connect(head)
        if target is None:
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        upstream = _dial(self.server.resolve, target, self.server.dial_wait_s)
        if upstream is None:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            return
        with upstream:
            upstream.settimeout(None)
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            rest = head.split(b"\r\n\r\n", 1)[1]
            if rest:
                upstream.sendall(rest)
            with contextlib.suppress(OSError):
                _pipe(client, upstream)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, resolve: Resolve, dial_wait_s: float) -> None:
        self.resolve = resolve
        self.dial_wait_s = dial_wait_s
        super().__init__(path, _Handler)


class EgressProxy:
    """The proxy on `socket_path` (owner-only), serving in a daemon thread until `close`."""

    def __init__(self, socket_path: Path, resolve: Resolve, *, dial_wait_s: float = DIAL_WAIT_S) -> None:
        socket_path.unlink(missing_ok=True)
        self.path = socket_path
        self._server = _Server(str(socket_path), resolve, dial_wait_s)
        socket_path.chmod(0o600)
        self._thread = threading.Thread(target=self._server.serve_forever, name="egress-proxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)
