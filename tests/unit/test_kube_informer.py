"""The core client's error and the core informer with plain-JSON objects (the agent's settings):
one unpaged list with the caller's query, fixed watch timeouts, a relist at once on 410 Gone, and a
stop that returns while a watch is open."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from neuronetes.kube.client import KubeError, status_error
from neuronetes.kube.codec import JsonCodec
from neuronetes.kube.informer import Informer, InformerHooks, InformerSettings

pytestmark = pytest.mark.unit


class Stream:
    """Scripted watch lines; then, with `hold`, stays open until closed."""

    def __init__(self, lines: list[bytes], hold: bool) -> None:
        self.lines = lines
        self.hold = hold
        self.closed = threading.Event()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.closed.set()

    def __iter__(self) -> Iterator[bytes]:
        yield from self.lines
        if self.hold:
            self.closed.wait(30)


class Api:
    def __init__(self, lists: list[dict[str, Any]], streams: list[list[bytes]]) -> None:
        self.lists = lists
        self.streams = streams
        self.gets: list[list[tuple[str, str]]] = []
        self.watches: list[list[tuple[str, str]]] = []
        self.open: list[Stream] = []

    def get(self, path: str, query: Sequence[tuple[str, str]] = (), *, timeout: float | None = None) -> bytes:
        self.gets.append(list(query))
        return json.dumps(self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]).encode()

    def watch(self, path: str, query: Sequence[tuple[str, str]], *, read_timeout: float) -> Stream:
        self.watches.append(list(query))
        stream = Stream(self.streams.pop(0) if self.streams else [], hold=not self.streams)
        self.open.append(stream)
        return stream


def listing(rv: str, *names: str) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv}, "items": [{"metadata": {"name": n}} for n in names]}


def line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


def test_status_errors_carry_the_status_message_and_reason() -> None:
    err = status_error(404, b'{"kind":"Status","message":"pods \\"x\\" not found","code":404}', "Not Found")
    assert (err.status, err.message, err.reason, str(err)) == (
        404,
        'pods "x" not found',
        "Not Found",
        '404: pods "x" not found',
    )
    assert not err.ambiguous and KubeError(0, "refused").ambiguous and KubeError(503, "busy").ambiguous
    assert str(KubeError(0, "GET /api: refused")) == "GET /api: refused"


def test_an_unpaged_informer_relists_at_once_on_410_and_stops_within_its_bound() -> None:
    api = Api(
        [listing("5", "a", "b"), listing("9", "b", "c")],
        [
            [line("ADDED", {"metadata": {"name": "c", "resourceVersion": "6"}})],
            [line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})],
        ],
    )
    seen: list[tuple[str, str]] = []
    synced = threading.Event()
    hooks: InformerHooks[dict[str, Any]] = InformerHooks(
        on_replace=lambda items: seen.append(("list", ",".join(i["metadata"]["name"] for i in items))),
        on_change=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        on_synced=synced.set,
    )
    settings = InformerSettings(
        query=(("fieldSelector", "spec.nodeName=n1"),),
        page_size=0,
        watch_timeout=240.0,
        resync_period=None,
        max_backoff=10.0,
        jitter=False,
    )
    informer = Informer(api, "pods", "/api/v1/pods", JsonCodec(), hooks, settings)
    informer.start()
    deadline = time.monotonic() + 5
    while len(api.watches) < 3:  # the list's watch, the one after the stream ended, after the relist
        assert time.monotonic() < deadline, api.watches
        time.sleep(0.01)
    started = time.monotonic()
    informer.stop(2.0)
    assert time.monotonic() - started < 1.0 and api.open[-1].closed.is_set()
    assert synced.is_set() and informer.relists == 2 and informer.broken_for() == 0
    assert api.gets == [[("fieldSelector", "spec.nodeName=n1")]] * 2  # unpaged: no limit
    assert [dict(q)["resourceVersion"] for q in api.watches] == ["5", "6", "9"]
    assert {dict(q)["timeoutSeconds"] for q in api.watches} == {"240"}  # no jitter
    assert all(q[0] == ("fieldSelector", "spec.nodeName=n1") for q in api.watches)
    assert seen == [("list", "a,b"), ("ADDED", "c"), ("list", "b,c")]
