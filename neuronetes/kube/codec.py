"""How an informer decodes one resource's objects: `StructCodec` into msgspec structs (the
extender's lean wire types), `JsonCodec` into plain dicts (the agent's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

import msgspec

__all__ = ["Codec", "JsonCodec", "Page", "StructCodec"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list answer."""

    items: Sequence[T]
    resource_version: str
    continue_token: str


class Codec(Protocol[T]):
    """Decodes the objects of one resource (raising `msgspec.DecodeError` on bad input)."""

    def page(self, data: bytes) -> Page[T]: ...
    def item(self, data: bytes) -> T: ...
    def version(self, obj: T) -> str:
        """The object's resourceVersion ("" when it has none)."""
        ...


class _ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _HasListMeta(Protocol):
    @property
    def metadata(self) -> Any: ...
    @property
    def items(self) -> Sequence[Any] | None: ...


class _HasVersion(Protocol):
    @property
    def resource_version(self) -> str: ...


class _Object(Protocol):
    @property
    def metadata(self) -> _HasVersion: ...


S = TypeVar("S", bound=_Object)


class StructCodec(Generic[S]):
    """Objects as msgspec structs with ``metadata.resource_version`` (lists: ``metadata`` with
    ``resource_version`` and ``continue_``, ``items``); numbers decoded with msgspec's lax rules."""

    def __init__(self, item: type[S], list_type: type[Any]) -> None:
        self._item = msgspec.json.Decoder(item, strict=False)
        self._list = msgspec.json.Decoder(list_type, strict=False)

    def page(self, data: bytes) -> Page[S]:
        listed: _HasListMeta = self._list.decode(data)
        meta = listed.metadata
        return Page(listed.items or (), str(meta.resource_version), str(meta.continue_))

    def item(self, data: bytes) -> S:
        obj: S = self._item.decode(data)
        return obj

    def version(self, obj: S) -> str:
        return obj.metadata.resource_version or ""


class _JsonList(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[dict[str, Any]] | None = None


class JsonCodec:
    """Objects as plain JSON dicts."""

    _list: Final = msgspec.json.Decoder(_JsonList)
    _item: Final = msgspec.json.Decoder(dict[str, Any])

    def page(self, data: bytes) -> Page[dict[str, Any]]:
        listed = self._list.decode(data)
        return Page(listed.items or (), listed.metadata.resource_version, listed.metadata.continue_)

    def item(self, data: bytes) -> dict[str, Any]:
        return self._item.decode(data)

    def version(self, obj: dict[str, Any]) -> str:
        return str((obj.get("metadata") or {}).get("resourceVersion") or "")
