"""The verbs' direct ASGI path: kube-scheduler's requests answered before FastAPI's stack.

A ``POST`` to one of the verbs goes from the ASGI entry straight to its handler (`ExtenderApp`),
past FastAPI's middleware, routing and request/response objects, which cost more CPU per request
than the filter decision itself (`bench/e2e_throughput.py --profile-extender`: "HTTP:
FastAPI/Starlette"). The body is read from the ASGI channel here (`read_body`: content type and
size checked before it is read whole), for this path and for FastAPI's routes alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from fastapi import FastAPI

__all__ = [
    "JSON",
    "Disconnected",
    "ExtenderApp",
    "HttpError",
    "Receive",
    "Scope",
    "Send",
    "Verb",
    "read_body",
]

JSON: Final = "application/json"


class HttpError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Disconnected(Exception):
    """The client went away before its body was read (no one to answer)."""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> list[bytes]:
    """The body's chunks (not joined: a big body is never copied whole in this process)."""
    content_type = _header(scope, b"content-type") or ""
    if not _is_json(content_type):
        raise HttpError(415, f"content type must be {JSON}, got {content_type or 'none'!r}")
    declared = _header(scope, b"content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise HttpError(400, f"invalid Content-Length {declared!r}") from None
        if length > limit:
            raise HttpError(413, f"body of {length} bytes is over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"body over the {limit}-byte limit")
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks


Verb = Callable[[Scope, Receive], Awaitable[tuple[int, bytes]]]
"""A verb's handler: the request's scope and body channel in, (HTTP status, JSON answer) out."""
_ANSWER_HEADERS: Final = [(b"content-type", JSON.encode())]


class ExtenderApp(FastAPI):
    """FastAPI with the verbs' ``POST`` dispatched before its middleware and routing."""

    verbs: dict[str, Verb]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = (
            self.verbs.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if verb is None:
            await super().__call__(scope, receive, send)
            return
        try:
            status, content = await verb(scope, receive)
        except Disconnected:
            return
        headers = [*_ANSWER_HEADERS, (b"content-length", b"%d" % len(content))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})
