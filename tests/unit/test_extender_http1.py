"""The extender's lean HTTP/1.1 client: keep-alive, both body framings, a stale connection."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import pytest

from neuronetes_extender.http1 import Http1Pool
from neuronetes_extender.kube import AsyncKube, KubeError

pytestmark = pytest.mark.unit

Handler = Callable[[bytes, bytes], bytes]  # (request head, body) -> raw response


async def _serve(handler: Handler, scenario: Callable[[str, list[int]], Awaitable[None]]) -> list[int]:
    """Run `scenario(base_url, connections)` against a server answering with `handler`."""
    connections: list[int] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                answer = handler(head, body)
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        await scenario(f"http://127.0.0.1:{port}", connections)
    return connections


def _json(status: int, body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (status, len(body))
    return head + b"".join(extra) + b"\r\n" + body


def test_keep_alive_content_length_and_chunked_bodies() -> None:
    def handler(head: bytes, body: bytes) -> bytes:
        if head.startswith(b"GET /chunked"):
            return (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
        assert b"Host: 127.0.0.1:" in head and b"Authorization: Bearer t" in head
        return _json(201, b'{"echo":' + body + b"}")

    async def scenario(url: str, connections: list[int]) -> None:
        pool = Http1Pool(url, ssl_context=None, timeout=5)
        for k in range(5):
            answer = await pool.request("POST", "/p?x=1", {"Authorization": "Bearer t"}, b"%d" % k)
            assert (answer.status, answer.body) == (201, b'{"echo":%d}' % k)
        chunked = await pool.request("GET", "/chunked", {})
        assert chunked.body == b"hello world"
        assert len(connections) == 1  # one keep-alive connection for all six
        await pool.aclose()

    anyio.run(_serve, handler, scenario)


def test_a_connection_the_server_closed_is_replaced_without_losing_the_request() -> None:
    seen: list[bytes] = []

    def handler(head: bytes, body: bytes) -> bytes:
        seen.append(body)
        return _json(200, b"{}", b"Connection: close\r\n") if body == b"first" else _json(200, b"{}")

    async def scenario(url: str, connections: list[int]) -> None:
        pool = Http1Pool(url, ssl_context=None, timeout=5)
        assert (await pool.request("POST", "/", {}, b"first")).status == 200
        assert (await pool.request("POST", "/", {}, b"second")).status == 200
        assert len(connections) == 2
        await pool.aclose()

    anyio.run(_serve, handler, scenario)
    assert seen == [b"first", b"second"]


def test_api_errors_and_no_server_are_kube_errors() -> None:
    def handler(head: bytes, body: bytes) -> bytes:
        return _json(409, b'{"kind":"Status","message":"pod p is already assigned","code":409}')

    class Config:
        verify_ssl = False
        ssl_ca_cert = cert_file = key_file = None

        def __init__(self, host: str) -> None:
            self.host = host

        def auth_settings(self) -> dict[str, dict[str, str]]:
            return {"BearerToken": {"in": "header", "key": "authorization", "value": "Bearer t"}}

    async def scenario(url: str, connections: list[int]) -> None:
        kube = AsyncKube(Config(url))
        with pytest.raises(KubeError) as err:
            await kube.bind("default", "p", "uid", "n1", {})
        assert err.value.status == 409 and "already assigned" in err.value.message
        await kube.aclose()
        gone = AsyncKube(Config("http://127.0.0.1:9"), timeout=2)
        with pytest.raises(KubeError) as err:
            await gone.get_pod("default", "p")
        assert err.value.status == 0 and err.value.ambiguous

    anyio.run(_serve, handler, scenario)
