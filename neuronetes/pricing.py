"""The one source of node prices: what a node costs per hour, for the extender's cost scorer and
the operator's budgets alike (docs/cost.md).

A node's price per hour is, in order:

1. its ``neuronetes.io/price-per-hour`` label (a number ≥ 0, USD per hour by convention);
2. else the price table's entry for its instance type (``node.kubernetes.io/instance-type``, or the
   deprecated ``beta.kubernetes.io/instance-type``) and capacity type (`capacity_type`); a node
   whose capacity type no label says is priced at the highest price the table gives its instance
   type (never below what it may cost);
3. else unknown (None). An unknown price is never read as 0: the cost scorer ranks such a node
   with the most expensive known one, and a pool with a budget creates no replica that could land
   on it (docs/cost.md, "Unknown prices").

The price table is YAML (the chart's ``pricing.priceTable``, rendered into the ConfigMap
``neuronetes-price-table``, key ``prices.yaml``): instance type → capacity type → price::

    p4d.24xlarge:
      on-demand: 32.77
      spot: 13.11
    Standard_ND96asr_v4:
      on-demand: 27.20

Pure: labels and text in, prices out; `neuronetes.kube.pricetable` keeps a table current from
its ConfigMap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from neuronetes import contracts as c

__all__ = [
    "CAPACITY_LABELS",
    "CAPACITY_TYPES",
    "CAPACITY_VALUES",
    "EMPTY_TABLE",
    "LABEL_INSTANCE_TYPE",
    "PRICE_TABLE_KEY",
    "CapacityType",
    "NodePrice",
    "PriceError",
    "PriceTable",
    "capacity_type",
    "instance_type",
    "node_price",
    "parse_price_table",
    "price_of",
]

CapacityType = Literal["on-demand", "spot", "reserved"]
CAPACITY_TYPES: Final[tuple[CapacityType, ...]] = ("on-demand", "spot", "reserved")
"""The capacity types a price table may name (Karpenter's values; EKS capacity blocks are
``reserved``)."""

LABEL_INSTANCE_TYPE: Final = "node.kubernetes.io/instance-type"
_LABEL_INSTANCE_TYPE_BETA: Final = "beta.kubernetes.io/instance-type"
PRICE_TABLE_KEY: Final = "prices.yaml"
"""The key of the price table in its ConfigMap."""
_MAX_ENTRIES: Final = 10_000
_MAX_NAME: Final = 253

# ---- capacity types ---------------------------------------------------------------------------

_KARPENTER: Final = "karpenter.sh/capacity-type"
_EKS: Final = "eks.amazonaws.com/capacityType"
_GKE_SPOT: Final = "cloud.google.com/gke-spot"
_GKE_PREEMPTIBLE: Final = "cloud.google.com/gke-preemptible"
_GKE_NODEPOOL: Final = "cloud.google.com/gke-nodepool"
_AKS_PRIORITY: Final = "kubernetes.azure.com/scalesetpriority"
_AKS_AGENTPOOL: Final = "kubernetes.azure.com/agentpool"

CAPACITY_LABELS: Final[tuple[tuple[str, str], ...]] = (
    (c.LABEL_SPOT, '"true" spot, "false" on-demand (NeuroNetes; any provisioner)'),
    (_KARPENTER, "spot, on-demand, reserved (Karpenter, AWS and Azure providers)"),
    (_EKS, "SPOT, ON_DEMAND, CAPACITY_BLOCK (reserved) (EKS managed node groups)"),
    (_GKE_SPOT, '"true": spot (GKE Spot VMs)'),
    (_GKE_PREEMPTIBLE, '"true": spot (GKE preemptible VMs)'),
    (_AKS_PRIORITY, "spot, regular (on-demand) (AKS node pools)"),
)
"""The labels `capacity_type` reads, in order (the first that says wins), with their values;
docs/cost.md lists them. A GKE node (``cloud.google.com/gke-nodepool``) or an AKS node
(``kubernetes.azure.com/agentpool``) without its provider's spot label is on-demand."""

CAPACITY_VALUES: Final[Mapping[str, Mapping[str, CapacityType]]] = {
    c.LABEL_SPOT: {"true": "spot", "false": "on-demand"},
    _KARPENTER: {"spot": "spot", "on-demand": "on-demand", "reserved": "reserved"},
    _EKS: {"SPOT": "spot", "ON_DEMAND": "on-demand", "CAPACITY_BLOCK": "reserved"},
    _GKE_SPOT: {"true": "spot"},
    _GKE_PREEMPTIBLE: {"true": "spot"},
    _AKS_PRIORITY: {"spot": "spot", "regular": "on-demand"},
}


def capacity_type(labels: Mapping[str, str]) -> CapacityType | None:
    """The node's capacity type from the labels of `CAPACITY_LABELS`; None when none says."""
    for label, _ in CAPACITY_LABELS:
        found = CAPACITY_VALUES[label].get(labels.get(label, "").strip())
        if found is not None:
            return found
    if _GKE_NODEPOOL in labels or _AKS_AGENTPOOL in labels:
        return "on-demand"  # the provider labels its spot nodes; this one carries no such label
    return None


def instance_type(labels: Mapping[str, str]) -> str | None:
    """The node's instance type (``node.kubernetes.io/instance-type``, else the beta label)."""
    return (labels.get(LABEL_INSTANCE_TYPE) or labels.get(_LABEL_INSTANCE_TYPE_BETA) or "").strip() or None


# ---- the price table --------------------------------------------------------------------------


class PriceError(ValueError):
    """A price label or a price table that cannot be read; the message names the bad entry."""


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices per hour by instance type and capacity type (`parse_price_table`)."""

    prices: Mapping[str, Mapping[CapacityType, float]] = field(default_factory=dict)

    def lookup(self, instance: str | None, capacity: CapacityType | None) -> float | None:
        """The table's price of `instance` on `capacity` (None: the highest it lists for
        `instance`); None when it has none."""
        if instance is None:
            return None
        entries = self.prices.get(instance)
        if not entries:
            return None
        if capacity is None:
            return max(entries.values())
        return entries.get(capacity)

    @property
    def highest(self) -> float | None:
        """The highest price in the table (None when empty)."""
        return max((p for entries in self.prices.values() for p in entries.values()), default=None)

    def __len__(self) -> int:
        return sum(len(entries) for entries in self.prices.values())


EMPTY_TABLE: Final = PriceTable()


def _price(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise PriceError(f"{where}: {value!r} is not a price (a number >= 0, per hour)")
    try:
        price = float(value)
    except ValueError:
        raise PriceError(f"{where}: {value!r} is not a price (a number >= 0, per hour)") from None
    if not (price >= 0.0 and math.isfinite(price)):
        raise PriceError(f"{where}: {value!r} is not a price (a number >= 0, per hour)")
    return price


def parse_price_table(text: str | bytes, *, source: str = "price table") -> PriceTable:
    """The table in `text` (YAML: instance type → capacity type → price; empty text: no entries).

    Raises:
        PriceError: not YAML, not that shape, an unknown capacity type or a price that is not a
            number ≥ 0; the message names the entry (``p4d.24xlarge/spot``).
    """
    try:
        doc: Any = msgspec.yaml.decode(text) if str(text).strip() else {}
    except msgspec.DecodeError as exc:
        raise PriceError(f"{source}: not YAML: {' '.join(str(exc).split())}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise PriceError(f"{source}: expected a mapping of instance type to prices, got {type(doc).__name__}")
    prices: dict[str, dict[CapacityType, float]] = {}
    for instance, entries in doc.items():
        name = str(instance)
        if not isinstance(instance, str) or not instance.strip() or len(name) > _MAX_NAME:
            raise PriceError(f"{source}: {instance!r} is not an instance type (a node label value)")
        if not isinstance(entries, dict) or not entries:
            raise PriceError(
                f"{source}: entry {name}: expected capacity types ({', '.join(CAPACITY_TYPES)}) "
                f"with prices, got {entries!r}"
            )
        row: dict[CapacityType, float] = {}
        for capacity, value in entries.items():
            if capacity not in CAPACITY_TYPES:
                raise PriceError(
                    f"{source}: entry {name}/{capacity}: unknown capacity type "
                    f"(one of {', '.join(CAPACITY_TYPES)})"
                )
            row[capacity] = _price(value, f"{source}: entry {name}/{capacity}")
        prices[name] = row
        if len(prices) > _MAX_ENTRIES:
            raise PriceError(f"{source}: more than {_MAX_ENTRIES} instance types")
    return PriceTable(prices)


# ---- a node's price ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodePrice:
    """A node's price per hour (None: unknown) and where it came from."""

    per_hour: float | None
    source: Literal["label", "table", "unknown"]
    capacity: CapacityType | None = None
    instance: str | None = None


def node_price(labels: Mapping[str, str], table: PriceTable = EMPTY_TABLE) -> NodePrice:
    """The node's price: its label, else the table's entry, else unknown (module docstring).

    Raises:
        PriceError: a ``neuronetes.io/price-per-hour`` label that is not a number ≥ 0.
    """
    raw = labels.get(c.LABEL_PRICE_PER_HOUR, "").strip()
    capacity = capacity_type(labels)
    instance = instance_type(labels)
    if raw:
        return NodePrice(_price(raw, f"label {c.LABEL_PRICE_PER_HOUR}"), "label", capacity, instance)
    found = table.lookup(instance, capacity)
    return NodePrice(found, "table" if found is not None else "unknown", capacity, instance)


def price_of(labels: Mapping[str, str], table: PriceTable = EMPTY_TABLE) -> float | None:
    """`node_price`'s price alone; a malformed label counts as unknown (None), never as free."""
    try:
        return node_price(labels, table).per_hour
    except PriceError:
        return None
