"""A lean async HTTP/1.1 client with keep-alive: the extender's transport to the API server.

The request path posts one Binding per pod (and an Event, nudges, reservation writes): a
general-purpose client spent ~1.9 ms of CPU per request here, more than the placement decision
itself, so this one does only what those calls need — a pool of keep-alive connections (TLS or
not), one request at a time per connection, ``Content-Length`` or ``chunked`` responses — at a
fraction of that (``bench/e2e_throughput.py``; bench/README.md, "Async bind, lean client": 0.05 ms
of CPU per request, against 0.9 ms for httpx and more for the Kubernetes client in a thread
pool). A request on a reused connection that the server had already closed is sent
again once on a new connection (nothing of it was answered). Every failure without a response
is an `OSError` for the caller to map.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

__all__ = ["Http1Pool", "HttpResponse"]

MAX_HEADER_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    reason: str
    body: bytes


class _Stale(Exception):
    """A reused connection failed before any byte of the answer (the server had closed it)."""


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


class Http1Pool:
    """Up to `max_connections` keep-alive connections to one server (one event loop)."""

    def __init__(
        self, base_url: str, *, ssl_context: ssl.SSLContext | None, max_connections: int = 32, timeout: float
    ) -> None:
        url = urlsplit(base_url)
        self.host = url.hostname or "localhost"
        self.tls = url.scheme == "https"
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path.rstrip("/")
        self.ssl_context = ssl_context if self.tls else None
        self.timeout = timeout
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        host = self.host if ":" not in self.host else f"[{self.host}]"
        self._host_header = f"{host}:{self.port}".encode()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self.ssl_context, limit=MAX_HEADER_BYTES
        )
        return _Connection(reader, writer)

    async def request(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> HttpResponse:
        """Send one request (`path` with its query); the answer, or `OSError`/`TimeoutError`."""
        head = [
            f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode(),
            b"Host: " + self._host_header + b"\r\n",
        ]
        head += [f"{k}: {v}\r\n".encode() for k, v in headers.items()]
        head.append(b"Content-Length: %d\r\n\r\n" % len(body or b""))
        data = b"".join(head) + (body or b"")
        async with self._slots, asyncio.timeout(self.timeout):
            while self._idle:
                conn = self._idle.pop()
                try:
                    return await self._exchange(conn, data, reused=True)
                except _Stale:
                    continue
            return await self._exchange(await self._connect(), data, reused=False)

    async def _exchange(self, conn: _Connection, data: bytes, *, reused: bool) -> HttpResponse:
        answered = False
        try:
            conn.writer.write(data)
            await conn.writer.drain()
            try:
                # The status line and headers in one read, not one await per line (a tenth of a
                # bind's own CPU: `bench/e2e_throughput.py --profile-extender`, "bind: API call").
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise ConnectionResetError("the server closed the connection") from None
                answered = True  # part of an answer: the request reached the server
                raise
            answered = True
            response, keep = await self._read_response(conn.reader, head)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            conn.close()
            if reused and not answered:
                raise _Stale from None
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:  # cancelled or timed out mid-request: the connection is unusable
            conn.close()
            raise
        if keep:
            self._idle.append(conn)
        else:
            conn.close()
        return response

    @staticmethod
    async def _read_response(reader: asyncio.StreamReader, head: bytes) -> tuple[HttpResponse, bool]:
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code, _, reason = rest.partition(" ")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            size_read = 0
            while True:
                size = int((await reader.readline()).split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                size_read += size
                if size_read > MAX_BODY_BYTES:
                    raise ValueError("response body over the limit")
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            body = b"".join(parts)
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if length > MAX_BODY_BYTES:
                raise ValueError("response body over the limit")
            body = await reader.readexactly(length)
        elif status in (204, 304) or 100 <= status < 200:
            body = b""
        else:
            body = await reader.read(MAX_BODY_BYTES)
            keep = False
        return HttpResponse(status, reason, body), keep
