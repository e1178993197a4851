"""Request bodies into what the service decides on, without stalling the event loop.

msgspec holds the GIL for the whole of one decode, so a thread does not keep a huge body from
stalling every other request (a 62 MB preempt body once held ``/healthz`` for 11 s); even
joining or pickling 60 MB holds it for tens of milliseconds. Bodies up to `INLINE_BYTES` decode
on the loop (well under a millisecond); larger ones stay in the chunks they arrived in and are
streamed to a worker process, which hands back only what the decision needs: the pod, the node
names and, for full-object node lists, each node's byte span in the body (so the answer can echo
the chosen nodes without this process ever parsing them), or preemption victims reduced to
(UID, identity, priority). A body nested deeper than the decoder allows is a `BadInputError` (400),
never a `RecursionError` (500).
"""

from __future__ import annotations

import array
import asyncio
import bisect
import itertools
import multiprocessing
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final

import msgspec

from .pods import pod_identity
from .wire import (
    ExtenderArgs,
    ExtenderPreemptionArgs,
    MetaPod,
    MetaVictims,
    Pod,
    RawNodeList,
    decode_node,
    decoder,
)

__all__ = [
    "INLINE_BYTES",
    "BadInputError",
    "BodyDecoder",
    "NodeSet",
    "PreemptRequest",
    "Victim",
    "decode_nodes_request",
    "decode_preempt_request",
]

INLINE_BYTES: Final = 256 * 1024
"""Bodies up to this size decode on the event loop (well under a millisecond)."""


class BadInputError(ValueError):
    """A request that decoded but cannot be acted on, or did not decode (the HTTP layer answers 400)."""


@dataclass(frozen=True, slots=True)
class NodeSet:
    """The pod and nodes of a filter/prioritize request, in either ``nodeCacheCapable`` mode."""

    pod: Pod
    names: list[str]
    raw: Mapping[str, msgspec.Raw] | None  # name -> the node object as sent (full-object mode)
    by_name: bool  # the request listed NodeNames (answer in NodeNames)

    def answer(self, chosen: Sequence[str]) -> tuple[list[str] | None, RawNodeList | None]:
        """(NodeNames, Nodes) carrying `chosen` in the mode(s) the request used."""
        node_names = list(chosen) if self.by_name or self.raw is None else None
        nodes = None
        if self.raw is not None:
            nodes = RawNodeList(items=[self.raw[n] for n in chosen if n in self.raw])
        return node_names, nodes


Victim = tuple[str, str, int | None]
"""(UID, pod identity, priority; None: not in the request, the cache knows it)."""


@dataclass(frozen=True, slots=True)
class PreemptRequest:
    pod: Pod
    proposed: dict[str, tuple[list[Victim], int]]  # node -> (victims, PDB violations)


def _node_names(items: Sequence[msgspec.Raw]) -> list[str]:
    names: list[str] = []
    for k, item in enumerate(items):
        try:
            name = decode_node(item).metadata.name
        except msgspec.DecodeError as exc:
            raise BadInputError(f"Nodes.items[{k}]: {exc}") from None
        if not name:
            raise BadInputError(f"Nodes.items[{k}]: node without metadata.name")
        names.append(name)
    return names


def _decode(kind: type[Any], body: bytes) -> Any:
    try:
        return decoder(kind).decode(body)
    except msgspec.DecodeError as exc:
        raise BadInputError(str(exc)) from None
    except RecursionError:
        raise BadInputError("JSON nested too deeply") from None


def _nodes_request(args: ExtenderArgs, raw: Mapping[str, msgspec.Raw] | None, names: list[str]) -> NodeSet:
    if args.node_names is not None:
        names = args.node_names  # duplicates are harmless: the cache considers each node once
    return NodeSet(args.pod, names, raw, args.node_names is not None)


def decode_nodes_request(body: bytes) -> NodeSet:
    """A filter/prioritize body, decoded here (small bodies; `BodyDecoder` for any)."""
    args: ExtenderArgs = _decode(ExtenderArgs, body)
    raw: dict[str, msgspec.Raw] | None = None
    names: list[str] = []
    if args.nodes is not None:
        items = args.nodes.items or ()
        raw = {}
        for name, item in zip(_node_names(items), items, strict=True):
            if name not in raw:
                raw[name] = item
                names.append(name)
    return _nodes_request(args, raw, names)


_NUL: Final = "\0"


def _spanned_nodes(body: bytes) -> tuple[ExtenderArgs, str | None, bytes, bytes]:
    """In the worker: the args without their node objects, the node names (NUL-joined: one
    string unpickles in microseconds, 40,000 do not) and each node's byte span (two int64
    arrays) in the body; names and spans are None/empty without a node list."""
    args: ExtenderArgs = _decode(ExtenderArgs, body)
    if args.nodes is None:
        return args, None, b"", b""
    items = args.nodes.items or ()
    seen: set[str] = set()
    names: list[str] = []
    starts, ends = array.array("q"), array.array("q")
    at = 0
    for k, (name, item) in enumerate(zip(_node_names(items), items, strict=True)):
        if _NUL in name:
            raise BadInputError(f"Nodes.items[{k}]: node name with a NUL character")
        text = bytes(item)
        # Items appear in order, separated only by commas and white space: the first match at or
        # after the previous item's end is this item.
        start = body.find(text, at)
        at = start + len(text)
        if name not in seen:
            seen.add(name)
            names.append(name)
            starts.append(start)
            ends.append(at)
    return msgspec.structs.replace(args, nodes=None), _NUL.join(names), starts.tobytes(), ends.tobytes()


def decode_preempt_request(body: bytes) -> PreemptRequest:
    """A preempt body reduced to its victims (small bodies here; `BodyDecoder` for any)."""
    args: ExtenderPreemptionArgs = _decode(ExtenderPreemptionArgs, body)
    proposed: dict[str, tuple[list[Victim], int]] = {}
    if args.node_name_to_meta_victims is not None:
        for node, meta in args.node_name_to_meta_victims.items():
            if meta is not None:
                victims: list[Victim] = [(p.uid, p.uid, None) for p in meta.pods or ()]
                proposed[node] = (victims, meta.num_pdb_violations)
    elif args.node_name_to_victims is not None:
        for node, full in args.node_name_to_victims.items():
            if full is not None:
                victims = [
                    (
                        p.metadata.uid,
                        pod_identity(p.metadata.uid, p.metadata.namespace, p.metadata.name),
                        p.spec.priority or 0,
                    )
                    for p in full.pods or ()
                ]
                proposed[node] = (victims, full.num_pdb_violations)
    return PreemptRequest(args.pod, proposed)


def meta_victims(victims: Sequence[Victim], pdb: int) -> MetaVictims:
    return MetaVictims(pods=[MetaPod(uid=v[0]) for v in victims], num_pdb_violations=pdb)


Body = Sequence[bytes]
"""A request body as the chunks it arrived in (never joined in this process when it is big)."""

_VERBS: Final[dict[str, Callable[[bytes], Any]]] = {
    "nodes": _spanned_nodes,
    "preempt": decode_preempt_request,
}


def _worker_main(conn: Connection) -> None:
    """The decoder process: (verb, chunk count), the chunks, then one answer, until EOF."""
    while True:
        try:
            verb, count = conn.recv()
            body = b"".join(conn.recv_bytes() for _ in range(count))
        except (EOFError, OSError):
            return
        try:
            answer: tuple[str, Any] = ("ok", _VERBS[verb](body))
        except BadInputError as exc:
            answer = ("bad", str(exc))
        del body
        conn.send(answer)


class _Chunks(Mapping[str, msgspec.Raw]):
    """Node name -> that node's object, cut lazily out of the body's chunks by its byte span."""

    def __init__(self, chunks: Body, spans: Mapping[str, tuple[int, int]]) -> None:
        self._chunks = chunks
        self._starts = list(itertools.accumulate((len(c) for c in chunks), initial=0))
        self._spans = spans

    def __getitem__(self, name: str) -> msgspec.Raw:
        start, end = self._spans[name]
        k = bisect.bisect_right(self._starts, start) - 1
        parts = []
        while start < end:
            offset = start - self._starts[k]
            piece = self._chunks[k][offset : offset + end - start]
            parts.append(piece)
            start += len(piece)
            k += 1
        return msgspec.Raw(b"".join(parts))

    def __iter__(self) -> Iterator[str]:
        return iter(self._spans)

    def __len__(self) -> int:
        return len(self._spans)


class BodyDecoder:
    """Decodes request bodies: inline when small, else in one spawned worker process.

    A big body goes to the worker chunk by chunk from a thread (each write releases the GIL),
    so this process never copies it whole; the worker answers with the little the decision
    needs. One body at a time is in the worker; a dead worker is replaced at the next body.
    """

    def __init__(self, inline_bytes: int = INLINE_BYTES) -> None:
        self.inline_bytes = inline_bytes
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._proc: Any = None

    def start(self) -> None:
        """Start the worker now (at startup: the first big body then does not wait for it)."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> Connection:
        if self._conn is None or self._proc is None or not self._proc.is_alive():
            self._close()
            # spawn, not fork: the parent has threads (reflectors, writers) whose locks fork copies.
            context = multiprocessing.get_context("spawn")
            ours, theirs = context.Pipe()
            self._proc = context.Process(
                target=_worker_main, args=(theirs,), name="extender-body-decoder", daemon=True
            )
            self._proc.start()
            theirs.close()
            self._conn = ours
        return self._conn

    def _close(self) -> None:
        conn, proc, self._conn, self._proc = self._conn, self._proc, None, None
        if conn is not None:
            conn.close()
        if proc is not None:
            proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)

    def stop(self) -> None:
        with self._lock:
            self._close()

    def _exchange(self, verb: str, chunks: Body) -> Any:
        with self._lock:
            try:
                conn = self._ensure()
                conn.send((verb, len(chunks)))
                for chunk in chunks:
                    conn.send_bytes(chunk)
                status, answer = conn.recv()
            except (EOFError, OSError):
                self._close()  # the worker died (memory?): the next big body gets a fresh one
                raise BadInputError("the body could not be decoded (the decoder process failed)") from None
        if status != "ok":
            raise BadInputError(answer)
        return answer

    def _spanned_request(self, chunks: Body) -> NodeSet:
        args, joined, start_bytes, end_bytes = self._exchange("nodes", chunks)
        if joined is None:
            return _nodes_request(args, None, [])
        names = joined.split(_NUL) if joined else []
        starts, ends = array.array("q"), array.array("q")
        starts.frombytes(start_bytes)
        ends.frombytes(end_bytes)
        spans = {}
        for k, name in enumerate(names):  # bytecode, not one long C call: the loop gets turns
            spans[name] = (starts[k], ends[k])
        return _nodes_request(args, _Chunks(chunks, spans), names)

    async def nodes_request(self, chunks: Body) -> NodeSet:
        if sum(map(len, chunks)) <= self.inline_bytes:
            return decode_nodes_request(b"".join(chunks))
        return await asyncio.to_thread(self._spanned_request, chunks)

    async def preempt_request(self, chunks: Body) -> PreemptRequest:
        if sum(map(len, chunks)) <= self.inline_bytes:
            return decode_preempt_request(b"".join(chunks))
        request: PreemptRequest = await asyncio.to_thread(self._exchange, "preempt", chunks)
        return request
