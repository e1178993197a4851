"""The webhook's HTTPS server in process: TLS with its own CA, 200 for reviews, 4xx (never 5xx) for junk."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from webhook_cases import gpu_pod

from neuronetes.devcluster.localstack import free_port
from neuronetes_operator.webhook import CA_FILE, WebhookServer, ensure_certificate

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, ssl.SSLContext]]:
    certs = Path(tmp_path_factory.mktemp("certs"))
    ca = ensure_certificate(certs)
    assert ensure_certificate(certs) == ca  # kept, not regenerated
    srv = WebhookServer("127.0.0.1", free_port(), certs)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.port, ssl.create_default_context(cafile=str(certs / CA_FILE))
    finally:
        srv.shutdown()
        thread.join(5)


def call(
    server: tuple[int, ssl.SSLContext], method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, bytes]:
    port, context = server
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_health_and_a_review_over_verified_tls(server: tuple[int, ssl.SSLContext]) -> None:
    assert call(server, "GET", "/healthz") == (200, b"ok")
    review = {"request": {"uid": "x", "operation": "CREATE", "object": gpu_pod()}}
    status, body = call(server, "POST", "/pods?timeout=5s", json.dumps(review).encode())
    assert status == 200 and json.loads(body)["response"]["allowed"] is True


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        ("POST", "/pods", b"{not json", 400),
        ("POST", "/pods", b"[1, 2]", 400),
        ("POST", "/objects", b'{"request": {}}', 400),
        ("POST", "/pods", b"\xff\xfe", 400),
        ("POST", "/elsewhere", b"{}", 404),
        ("GET", "/pods", None, 404),
        ("POST", "/pods", b"", 400),
    ],
)
def test_junk_gets_a_4xx(
    server: tuple[int, ssl.SSLContext], method: str, path: str, body: bytes | None, expected: int
) -> None:
    assert call(server, method, path, body)[0] == expected


def test_oversized_body_is_413_without_reading_it(server: tuple[int, ssl.SSLContext]) -> None:
    port, context = server
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1") as s:
        s.sendall(b"POST /pods HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n{")
        assert s.recv(64).startswith(b"HTTP/1.1 413")


def test_missing_content_length_is_411(server: tuple[int, ssl.SSLContext]) -> None:
    port, context = server
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1") as s:
        s.sendall(b"POST /pods HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.1 411")
