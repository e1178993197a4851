"""The price table kept current from its ConfigMap (`neuronetes.pricing`), for the operator and the
extender alike.

One informer lists and watches the one ConfigMap by name (``fieldSelector=metadata.name=<name>``
in its namespace), which RBAC allows with a Role whose rule names it in ``resourceNames``: neither
component may read any other ConfigMap. The table in force is replaced on every change:

- the ConfigMap absent, or deleted: no table (nodes without a price label have an unknown price);
- its ``prices.yaml`` valid: that table;
- invalid: the last good table stays in force and `on_invalid` is told the ConfigMap and the
  one-line error naming the bad entry (the operator posts it as a Warning Event on the ConfigMap;
  both log it).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from neuronetes.pricing import EMPTY_TABLE, PRICE_TABLE_KEY, PriceError, PriceTable, parse_price_table

from .codec import JsonCodec
from .informer import Informer, InformerHooks, InformerSettings, ListWatch

__all__ = ["PRICE_TABLE_CONFIGMAP", "PriceTableWatch", "parse_price_table_ref"]

log = logging.getLogger(__name__)

PRICE_TABLE_CONFIGMAP: Final = "neuronetes-price-table"
"""The ConfigMap the chart renders ``pricing.priceTable`` into (in the release namespace)."""
_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def parse_price_table_ref(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` → (namespace, name).

    Raises:
        ValueError: not two DNS names separated by one slash.
    """
    namespace, sep, name = text.partition("/")
    if not sep or not _NAME.match(namespace) or not _NAME.match(name) or len(namespace) > 63:
        raise ValueError(f"price table {text!r}: expected NAMESPACE/NAME of a ConfigMap")
    return namespace, name


def _ignore(*_: object) -> None:
    return None


class PriceTableWatch:
    """The price table of one ConfigMap, kept current by a background informer (thread-safe)."""

    def __init__(
        self,
        api: ListWatch,
        namespace: str,
        name: str = PRICE_TABLE_CONFIGMAP,
        *,
        on_change: Callable[[PriceTable], None] = _ignore,
        on_invalid: Callable[[Mapping[str, Any], str], None] = _ignore,
        resync_period: float = 600.0,
        watch_timeout: float = 300.0,
    ) -> None:
        self.namespace, self.name = namespace, name
        self._on_change = on_change
        self._on_invalid = on_invalid
        self._lock = threading.Lock()
        self._table = EMPTY_TABLE
        self.version = 0
        """Bumped whenever the table in force changes."""
        self._listed = threading.Event()
        self.error: str | None = None
        """The last invalid table's error while it is the ConfigMap's content; None once valid."""
        hooks: InformerHooks[dict[str, Any]] = InformerHooks(self._replace, self._change)
        self._informer = Informer(
            api,
            f"configmap {namespace}/{name}",
            f"/api/v1/namespaces/{namespace}/configmaps",
            JsonCodec(),
            hooks,
            InformerSettings(
                query=(("fieldSelector", f"metadata.name={name}"),),
                page_size=0,
                resync_period=resync_period,
                watch_timeout=watch_timeout,
            ),
            thread_name="informer-price-table",
        )

    @property
    def table(self) -> PriceTable:
        with self._lock:
            return self._table

    @property
    def synced(self) -> bool:
        """Whether the ConfigMap has been listed once (the table says what it holds)."""
        return self._listed.is_set()

    def wait_synced(self, timeout: float) -> bool:
        """Wait until the ConfigMap has been listed once, at most `timeout` seconds; whether it was."""
        return self._listed.wait(timeout)

    def start(self) -> PriceTableWatch:
        self._informer.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._informer.stop(timeout)

    # ---- the informer's hooks (its thread) ---------------------------------------------------------
    def _replace(self, items: Sequence[dict[str, Any]]) -> None:
        found = [i for i in items if (i.get("metadata") or {}).get("name") == self.name]
        self.apply(found[0] if found else None)
        self._listed.set()

    def _change(self, kind: str, obj: dict[str, Any]) -> None:
        self.apply(None if kind == "DELETED" else obj)

    def apply(self, configmap: Mapping[str, Any] | None) -> None:
        """Put the table of `configmap` (None: absent) in force, as the module docstring says."""
        if configmap is None:
            self._set(EMPTY_TABLE, None)
            return
        data = configmap.get("data") or {}
        source = f"ConfigMap {self.namespace}/{self.name} key {PRICE_TABLE_KEY}"
        try:
            table = parse_price_table(str(data.get(PRICE_TABLE_KEY) or ""), source=source)
        except PriceError as exc:
            with self._lock:
                repeated = self.error == str(exc)
                self.error = str(exc)
            if not repeated:
                log.error("price table not applied, the previous one stays in force: %s", exc)
                self._on_invalid(configmap, str(exc))
            return
        self._set(table, None)

    def _set(self, table: PriceTable, error: str | None) -> None:
        with self._lock:
            self.error = error
            if table == self._table:
                return
            self._table = table
            self.version += 1
        log.info("price table %s/%s: %d price(s) in force", self.namespace, self.name, len(table))
        self._on_change(table)
