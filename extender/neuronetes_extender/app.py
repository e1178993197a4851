"""The extender's HTTP service (FastAPI): thin handlers over `ExtenderService`.

Each verb reads the raw body (checked for a JSON content type and a size limit before it is
read whole), decodes it (`neuronetes_extender.bodies`: small bodies inline, big ones in a worker
process, so no body stalls the loop), calls the service, and encodes the answer with msgspec.
Bad input gets a 4xx with a reason — 415 for a content type that is not JSON, 413 for a body
over the limit, 400 for malformed JSON, JSON nested too deeply or a body that does not match
the protocol — never a 5xx. An answer larger than the body limit is replaced by an Error. The
OpenAPI document describes the bodies (JSON Schema generated from the same msgspec structs), so
schemathesis can fuzz the service in-process.

The four verbs are kube-scheduler's hot path: a ``POST`` to one of them goes from the ASGI entry
straight to its handler (`neuronetes_extender.asgi`), past FastAPI's middleware and routing. Their
FastAPI routes stay for the OpenAPI document, for every other method on those paths and for the
app mounted under a prefix; both ways call the same `run_verb`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from .asgi import JSON, Disconnected, ExtenderApp, HttpError, Receive, Scope, Verb, read_body
from .bodies import BadInputError, BodyDecoder
from .cache import GpuCache
from .metrics import CONTENT_TYPE_LATEST, ExtenderMetrics
from .service import ExtenderService
from .wire import (
    ExtenderArgs,
    ExtenderArgsSchema,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    decoder,
    encode,
)

__all__ = ["create_app"]

log = logging.getLogger(__name__)

BIND_BODY_BYTES: Final = 64 * 1024
"""A bind body names one pod and one node: anything larger is not kube-scheduler's."""
EVENT_DRAIN_SECONDS: Final = 2.0


class ErrorBody(msgspec.Struct, rename={"error": "Error"}):
    """What a refused request gets back (same key as the protocol's own error field)."""

    error: str


class _Encoded:
    """An answer already encoded (off the loop)."""

    def __init__(self, content: bytes) -> None:
        self.content = content


def _encoded(answer: tuple[Any, str]) -> tuple[_Encoded, str]:
    return _Encoded(encode(answer[0])), answer[1]


# ---- OpenAPI: the bodies' JSON Schema, from the msgspec structs ------------------------------------

_REF: Final = "#/components/schemas/{name}"
_SCHEMA_TYPES: Final[tuple[Any, ...]] = (
    ExtenderArgsSchema,
    ExtenderFilterResult,
    list[HostPriority],
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    ErrorBody,
)
_SCHEMAS, _COMPONENTS = msgspec.json.schema_components(_SCHEMA_TYPES, ref_template=_REF)
_SCHEMA: Final = dict(zip(_SCHEMA_TYPES, _SCHEMAS, strict=True))


def _content(schema: dict[str, Any]) -> dict[str, Any]:
    return {JSON: {"schema": schema}}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        400: "malformed JSON, JSON nested too deeply, or a body that is not this verb's request",
        413: "body over the configured limit",
        415: "content type is not JSON",
    }
    return {code: {"description": text[code], "content": _content(_SCHEMA[ErrorBody])} for code in codes}


def _verb_doc(request: Any, response: Any, summary: str) -> dict[str, Any]:
    request = ExtenderArgsSchema if request is ExtenderArgs else request
    return {
        "summary": summary,
        "openapi_extra": {"requestBody": {"required": True, "content": _content(_SCHEMA[request])}},
        "responses": {
            200: {"description": "the verb's result", "content": _content(_SCHEMA[response])},
            **_errors(400, 413, 415),
        },
    }


def create_app(
    service: ExtenderService,
    *,
    metrics: ExtenderMetrics | None = None,
    bodies: BodyDecoder | None = None,
    on_startup: Callable[[], None] | None = None,
    on_shutdown: Callable[[], None] | None = None,
    on_shutdown_async: Callable[[], Awaitable[None]] | None = None,
) -> FastAPI:
    """The extender app over `service` (its cache's settings give the body-size limit).

    The lifespan starts the body decoder's worker and the Event writer, then `on_startup`; at
    shutdown it calls `on_shutdown` (stop reflectors and writers), posts what Events it can in
    `EVENT_DRAIN_SECONDS`, then awaits `on_shutdown_async` (close the API client).
    """
    cache: GpuCache = service.cache
    metrics = metrics or service.metrics or ExtenderMetrics(cache.stats)
    metrics.attach(service.health, service.events, cache.demand)
    service.metrics = metrics
    decode = bodies or BodyDecoder()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Everything allocated so far (modules, the app) lives as long as the process: out of the
        # collector's sight, so a full collection (it holds the GIL) walks only what requests
        # allocate, and a big request cannot stall the loop for a walk over the whole heap.
        gc.collect()
        gc.freeze()
        decode.start()
        writer = asyncio.create_task(service.events.run(), name="event-writer")
        if on_startup is not None:
            on_startup()
        try:
            yield
        finally:
            if on_shutdown is not None:
                on_shutdown()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            await service.events.drain(EVENT_DRAIN_SECONDS)
            decode.stop()
            if on_shutdown_async is not None:
                await on_shutdown_async()

    app = ExtenderApp(
        title="NeuroNetes scheduler extender",
        version="1",
        description="kube-scheduler extender verbs (filter, prioritize, bind, preempt) over the GPU cache.",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.metrics = metrics

    async def run_verb(
        verb: str,
        scope: Scope,
        receive: Receive,
        handle: Callable[[list[bytes]], Awaitable[tuple[Any, str]]],
        *,
        limit: int | None = None,
        too_big: Callable[[str], Any] | None = None,
    ) -> tuple[int, bytes]:
        max_body = cache.settings.get().max_body_bytes
        try:
            body = await read_body(scope, receive, min(max_body, limit or max_body))
        except HttpError as exc:
            metrics.requests.labels(verb, str(exc.status)).inc()
            return exc.status, encode(ErrorBody(exc.reason))
        started = time.perf_counter()
        try:
            result, outcome = await handle(body)
        except (msgspec.DecodeError, BadInputError) as exc:
            metrics.requests.labels(verb, "400").inc()
            metrics.observe(verb, "invalid", time.perf_counter() - started)
            return 400, encode(ErrorBody(f"invalid {verb} request: {exc}"))
        except RecursionError:
            metrics.requests.labels(verb, "400").inc()
            metrics.observe(verb, "invalid", time.perf_counter() - started)
            return 400, encode(ErrorBody(f"invalid {verb} request: JSON nested too deeply"))
        content = result.content if isinstance(result, _Encoded) else encode(result)
        if len(content) > max_body and too_big is not None:
            outcome = "error"
            content = encode(too_big(f"neuronetes extender: answer of {len(content)} bytes over the limit"))
        metrics.observe(verb, outcome, time.perf_counter() - started)
        metrics.requests.labels(verb, "200").inc()
        return 200, content

    async def decide(
        body: list[bytes], decision: Callable[[Any], tuple[Any, str]], request: Any
    ) -> tuple[Any, str]:
        # A body too big to decode inline carries many nodes: decide (and encode) in a thread
        # too, so the loop gets the GIL back every switch interval instead of waiting.
        if sum(map(len, body)) > decode.inline_bytes:
            encoded: tuple[_Encoded, str] = await asyncio.to_thread(lambda: _encoded(decision(request)))
            return encoded
        return decision(request)

    async def filter_verb(body: list[bytes]) -> tuple[Any, str]:
        return await decide(body, service.filter, await decode.nodes_request(body))

    async def prioritize_verb(body: list[bytes]) -> tuple[Any, str]:
        return await decide(body, service.prioritize, await decode.nodes_request(body))

    async def bind_verb(body: list[bytes]) -> tuple[Any, str]:
        args: ExtenderBindingArgs = decoder(ExtenderBindingArgs).decode(b"".join(body))
        return await service.bind(args)

    async def preempt_verb(body: list[bytes]) -> tuple[Any, str]:
        return await decide(body, service.preempt, await decode.preempt_request(body))

    def verb(
        name: str,
        handle: Callable[[list[bytes]], Awaitable[tuple[Any, str]]],
        *,
        limit: int | None = None,
        too_big: Callable[[str], Any] | None = None,
    ) -> Verb:
        async def run(scope: Scope, receive: Receive) -> tuple[int, bytes]:
            return await run_verb(name, scope, receive, handle, limit=limit, too_big=too_big)

        return run

    app.verbs = {
        "/filter": verb("filter", filter_verb, too_big=lambda why: ExtenderFilterResult(error=why)),
        # An oversized score list has no error field: kube-scheduler's body limit is the answer's.
        "/prioritize": verb("prioritize", prioritize_verb),
        "/bind": verb("bind", bind_verb, limit=BIND_BODY_BYTES),
        "/preempt": verb("preempt", preempt_verb),
    }

    async def routed(path: str, request: Request) -> Response:
        try:
            status, content = await app.verbs[path](request.scope, request.receive)
        except Disconnected:
            return Response(status_code=400)  # nobody reads it
        return Response(content=content, status_code=status, media_type=JSON)

    @app.post("/filter", **_verb_doc(ExtenderArgs, ExtenderFilterResult, "Filter nodes for a pod"))
    async def filter_(request: Request) -> Response:
        return await routed("/filter", request)

    @app.post("/prioritize", **_verb_doc(ExtenderArgs, list[HostPriority], "Score nodes 0..10 for a pod"))
    async def prioritize(request: Request) -> Response:
        return await routed("/prioritize", request)

    @app.post("/bind", **_verb_doc(ExtenderBindingArgs, ExtenderBindingResult, "Bind a pod with its GPUs"))
    async def bind(request: Request) -> Response:
        return await routed("/bind", request)

    @app.post(
        "/preempt", **_verb_doc(ExtenderPreemptionArgs, ExtenderPreemptionResult, "Refine preemption victims")
    )
    async def preempt(request: Request) -> Response:
        return await routed("/preempt", request)

    text = {"text/plain": {"schema": {"type": "string"}}}

    @app.get(
        "/healthz",
        summary="Liveness",
        response_class=PlainTextResponse,
        responses={200: {"description": "alive", "content": text}},
    )
    async def healthz() -> Response:
        return PlainTextResponse("ok")

    @app.get(
        "/readyz",
        summary="Readiness: the GPU cache has synced and every watch follows the API server",
        response_class=PlainTextResponse,
        responses={
            200: {"description": "ready", "content": text},
            503: {"description": "not synced, or a watch broken too long", "content": text},
        },
    )
    async def readyz() -> Response:
        unready = service.unready()
        if unready is None:
            return PlainTextResponse("ok")
        return PlainTextResponse(unready, status_code=503)

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus text exposition", "content": text}},
    )
    async def metrics_() -> Response:
        return Response(content=metrics.render(), media_type=CONTENT_TYPE_LATEST)

    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = default_openapi()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(_COMPONENTS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
