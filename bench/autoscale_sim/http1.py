"""The little HTTP/1.1 the live pool needs, on asyncio streams: one request a connection, bounded.

A server reads one request (head at most ``MAX_HEAD_BYTES``, body at most ``MAX_BODY_BYTES`` and
only with a Content-Length, all within ``READ_TIMEOUT_S``), hands it to its handler and answers
with ``Connection: close``; a request it cannot read gets a 4xx with one JSON error line. The client
(`call`) is the matching side for the bench's router and scrapes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024
READ_TIMEOUT_S = 10.0

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class HttpError(Exception):
    """An answer other than 200, with its one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str
    body: bytes

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object (an empty body: {})."""
        if not self.body.strip():
            return {}
        try:
            value = json.loads(self.body)
        except ValueError as exc:
            raise HttpError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise HttpError(400, "the body must be a JSON object")
        return value


Answer = tuple[int, bytes, str]  # status, body, content type
Handler = Callable[[HttpRequest], Awaitable[Answer]]


def json_answer(value: Any, status: int = 200) -> Answer:
    return status, (json.dumps(value) + "\n").encode(), "application/json"


async def _read_request(reader: asyncio.StreamReader) -> HttpRequest:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"request head over {MAX_HEAD_BYTES} bytes") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "malformed request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise HttpError(400, f"malformed header line {line[:60]!r}")
        headers[name.strip().lower()] = value.strip()
    if "transfer-encoding" in headers:
        raise HttpError(411, "send the body with a Content-Length, not chunked")
    length = headers.get("content-length", "0")
    if not length.isdigit():
        raise HttpError(400, f"Content-Length {length[:20]!r} is not a number")
    if int(length) > MAX_BODY_BYTES:
        raise HttpError(413, f"body over {MAX_BODY_BYTES} bytes")
    body = await reader.readexactly(int(length))
    return HttpRequest(parts[0], parts[1].split("?", 1)[0], body)


def _encode(status: int, body: bytes, content_type: str) -> bytes:
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


async def serve(host: str, port: int, handler: Handler) -> asyncio.Server:
    """Listen on host:port (0: the OS picks); every connection gets one answer from `handler`."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await asyncio.wait_for(_read_request(reader), READ_TIMEOUT_S)
                answer = await handler(request)
            except HttpError as exc:
                answer = json_answer({"error": exc.message}, exc.status)
            except TimeoutError:
                answer = json_answer({"error": f"no whole request within {READ_TIMEOUT_S:g} s"}, 408)
            writer.write(_encode(*answer))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: nobody to answer
        finally:
            writer.close()

    return await asyncio.start_server(connection, host, port, limit=MAX_HEAD_BYTES)


async def call(
    port: int, method: str, path: str, body: Any = None, timeout_s: float = 60.0
) -> tuple[int, Any]:
    """One request to 127.0.0.1:port; the answer's status and its body (JSON decoded when JSON).

    Raises:
        OSError: no connection (a port nobody listens on), or no whole answer within `timeout_s`.
    """
    data = b"" if body is None else json.dumps(body).encode()
    request = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode() + data

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request)
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()

    try:
        raw = await asyncio.wait_for(exchange(), timeout_s)
    except TimeoutError:
        raise OSError(f"127.0.0.1:{port}{path}: no answer within {timeout_s:g} s") from None
    head, _, payload = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ")
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise OSError(f"127.0.0.1:{port}{path}: not an HTTP answer")
    status = int(status_line[1])
    if b"application/json" in head.lower():
        return status, json.loads(payload)
    return status, payload.decode("utf-8", "replace")
