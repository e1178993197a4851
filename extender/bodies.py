"""Request bodies into what the service decides on, without stalling the event loop.

msgspec holds the GIL for the whole of one decode, so a thread does not keep a huge body from
stalling every other request (a 62 MB preempt body once held ``/healthz`` for 11 s). Bodies up
to `INLINE_BYTES` decode on the loop (tens of microseconds); larger ones decode in a worker
process, which hands back only what the decision needs: the pod, the node names and, for
full-object node lists, each node's byte span in the body (so the answer can echo the chosen
nodes without the main process ever parsing them), or preemption victims reduced to (UID,
identity, priority). A body nested deeper than the decoder allows is a `BadInputError` (400),
never a `RecursionError` (500).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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


class _Spans(Mapping[str, msgspec.Raw]):
    """Node name -> that node's object, sliced lazily out of the request body."""

    def __init__(self, body: bytes, spans: Mapping[str, tuple[int, int]]) -> None:
        self._body = memoryview(body)
        self._spans = spans

    def __getitem__(self, name: str) -> msgspec.Raw:
        start, end = self._spans[name]
        return msgspec.Raw(self._body[start:end])

    def __iter__(self) -> Iterator[str]:
        return iter(self._spans)

    def __len__(self) -> int:
        return len(self._spans)


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


def _spanned_nodes(body: bytes) -> tuple[ExtenderArgs, list[str], dict[str, tuple[int, int]] | None]:
    """In the worker: the args without their node objects, the names, each node's byte span."""
    args: ExtenderArgs = _decode(ExtenderArgs, body)
    if args.nodes is None:
        return args, [], None
    items = args.nodes.items or ()
    spans: dict[str, tuple[int, int]] = {}
    names: list[str] = []
    at = 0
    for name, item in zip(_node_names(items), items, strict=True):
        text = bytes(item)
        # Items appear in order, separated only by commas and white space: the first match at or
        # after the previous item's end is this item.
        start = body.find(text, at)
        at = start + len(text)
        if name not in spans:
            spans[name] = (start, at)
            names.append(name)
    return msgspec.structs.replace(args, nodes=None), names, spans


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


class BodyDecoder:
    """Decodes request bodies: inline when small, else in one spawned worker process."""

    def __init__(self, inline_bytes: int = INLINE_BYTES) -> None:
        self.inline_bytes = inline_bytes
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def start(self) -> concurrent.futures.ProcessPoolExecutor:
        """The worker, started now if it is not (call at startup: the first big body then does
        not pay for the start)."""
        if self._pool is None:
            # spawn, not fork: the parent has threads (reflectors, writers) whose locks fork copies.
            context = multiprocessing.get_context("spawn")
            self._pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context)
            self._pool.submit(int)  # spawns the worker now; its imports run there, not here
        return self._pool

    def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def _in_worker(self, fn: Any, body: bytes) -> Any:
        try:
            return await asyncio.wrap_future(self.start().submit(fn, body))
        except concurrent.futures.process.BrokenProcessPool:
            self._pool = None  # a worker that died (memory): the next big body gets a fresh one
            raise BadInputError("the body could not be decoded (decoder worker failed)") from None

    async def nodes_request(self, body: bytes) -> NodeSet:
        if len(body) <= self.inline_bytes:
            return decode_nodes_request(body)
        args, names, spans = await self._in_worker(_spanned_nodes, body)
        return _nodes_request(args, None if spans is None else _Spans(body, spans), names)

    async def preempt_request(self, body: bytes) -> PreemptRequest:
        if len(body) <= self.inline_bytes:
            return decode_preempt_request(body)
        request: PreemptRequest = await self._in_worker(decode_preempt_request, body)
        return request
