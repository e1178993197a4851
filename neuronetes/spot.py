"""Spot capacity: which nodes are spot, which are about to go, how many replicas may use spot. Pure.

docs/spot.md describes every rule here. In short:

* A node is **spot** when one of the capacity labels that clouds and provisioners set says so
  (`SPOT_LABELS`); the pods that must stay on on-demand carry a ``NotIn`` requirement for each.
* A node is **under notice** (`notice_of`) when it carries one of the interruption signals real
  clusters carry — the AWS Node Termination Handler's taints, Karpenter's disruption taint, GKE's
  impending-termination taint — or ours, ``neuronetes.io/interruption-notice`` (a taint, a label or
  an annotation), for any other source. Each source has a deadline: the time the node is gone.
* At most ``floor(maxSpotPercent × units / 100)`` units (replicas, or whole gangs) may be on spot
  (`spot_allowance`).
* ``spotStrategy.instanceTypes`` is a preference order: preferred node affinity terms on
  ``node.kubernetes.io/instance-type`` with decreasing weights (`instance_type_preferences`).
* ``interruptionThreshold {count, window, action}``: `step_threshold` trips after ``count`` notices
  within ``window`` and clears after a quiet period of one ``window`` without a notice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.pricing import CAPACITY_VALUES, LABEL_INSTANCE_TYPE

__all__ = [
    "LABEL_INSTANCE_TYPE",
    "NOTICE_KEY",
    "SOURCES",
    "SPOT_LABELS",
    "Notice",
    "NoticeSource",
    "ThresholdState",
    "duration_seconds",
    "instance_type_preferences",
    "is_spot_node",
    "notice_of",
    "on_demand_requirements",
    "spot_allowance",
    "spot_preferences",
    "step_threshold",
]

NOTICE_KEY: Final = f"{c.GROUP}/interruption-notice"
"""Our notice for any other source: a taint, label or annotation of this key on the node. Its value
may carry the deadline: seconds from the notice (``"90"``), or, in an annotation, an RFC 3339 time."""

SPOT_LABELS: Final[Mapping[str, tuple[str, ...]]] = {
    label: tuple(value for value, kind in values.items() if kind == "spot")
    for label, values in CAPACITY_VALUES.items()
}
"""Node labels that mark spot (preemptible) capacity, and their spot values: ours, Karpenter's,
EKS managed node groups', GKE's (spot and the older preemptible VMs) and AKS's. Taken from the
capacity labels the prices read (`neuronetes.pricing.CAPACITY_VALUES`): one list for both."""


@dataclass(frozen=True, slots=True)
class NoticeSource:
    """One interruption signal: how it appears on a node and how long the node has once it does."""

    name: str
    kind: str  # "taint" | "label" | "annotation"
    key: str
    deadline_s: float
    value: str | None = None  # the value it must have; None: any
    opt_in: bool = False  # recognised only when the operator's settings ask for it


SOURCES: Final[tuple[NoticeSource, ...]] = (
    NoticeSource("aws-nth-spot-itn", "taint", "aws-node-termination-handler/spot-itn", 120.0),
    NoticeSource(
        "aws-nth-rebalance",
        "taint",
        "aws-node-termination-handler/rebalance-recommendation",
        120.0,
        opt_in=True,
    ),
    NoticeSource("karpenter-disrupted", "taint", "karpenter.sh/disrupted", 120.0),
    NoticeSource("karpenter-disruption", "taint", "karpenter.sh/disruption", 120.0, value="disrupting"),
    NoticeSource("gke-impending-termination", "taint", "cloud.google.com/impending-node-termination", 30.0),
    NoticeSource("neuronetes", "taint", NOTICE_KEY, 120.0),
    NoticeSource("neuronetes", "label", NOTICE_KEY, 120.0),
    NoticeSource("neuronetes", "annotation", NOTICE_KEY, 120.0),
)
"""The recognised signals, in the order they are looked for (the first found names the notice).
Deadlines: AWS gives a spot instance two minutes after its interruption notice (the Node
Termination Handler's taint, and Karpenter's taint on the node it drains for the same notice); GCP
gives a spot VM 30 seconds. Ours defaults to two minutes unless its value says otherwise."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A node under notice: from which signal, since when, and when the node is gone."""

    node: str
    source: str
    noticed: datetime
    deadline: datetime
    problem: str | None = None
    """Set when the signal's value could not be read (the default deadline is used): say it once."""


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _our_deadline(value: str, noticed: datetime, default_s: float) -> tuple[datetime, str | None]:
    """The deadline our notice's `value` states: empty → the default; seconds; an RFC 3339 time."""
    text = value.strip()
    if not text or text.lower() == "true":
        return noticed + timedelta(seconds=default_s), None
    if re.fullmatch(r"[0-9]{1,6}(\.[0-9]+)?", text):
        return noticed + timedelta(seconds=float(text)), None
    when = _parse_time(text)
    if when is not None:
        return when, None
    problem = (
        f"{NOTICE_KEY}={text[:64]!r} is neither seconds nor an RFC 3339 time; "
        f"the default deadline of {default_s:g}s is used"
    )
    return noticed + timedelta(seconds=default_s), problem


def notice_of(
    node: Mapping[str, Any],
    *,
    now: datetime,
    first_seen: datetime | None = None,
    rebalance: bool = False,
) -> Notice | None:
    """The notice `node` (a Node object, or the part of one the operator keeps) is under, or None.

    The notice's start is the taint's ``timeAdded`` when it has one, else `first_seen` (when the
    caller first saw the signal), else `now`. `rebalance`: recognise the AWS rebalance
    recommendation too (opt-in: it is a hint, not a notice, and often comes long before one).
    """
    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    taints = (node.get("spec") or {}).get("taints") or []
    for source in SOURCES:
        if source.opt_in and not rebalance:
            continue
        stamp: datetime | None = None
        if source.kind == "taint":
            found = next((t for t in taints if isinstance(t, Mapping) and t.get("key") == source.key), None)
            if found is None:
                continue
            value = str(found.get("value") or "")
            stamp = _parse_time(str(found.get("timeAdded") or ""))
        else:
            held = labels if source.kind == "label" else annotations
            if source.key not in held:
                continue
            value = str(held[source.key] or "")
        if source.value is not None and value != source.value:
            continue
        noticed = stamp or first_seen or now
        if source.name == "neuronetes":
            deadline, problem = _our_deadline(value, noticed, source.deadline_s)
        else:
            deadline, problem = noticed + timedelta(seconds=source.deadline_s), None
        return Notice(node=name, source=source.name, noticed=noticed, deadline=deadline, problem=problem)
    return None


def is_spot_node(labels: Mapping[str, str]) -> bool:
    """Whether a node's labels mark it as spot capacity (any of `SPOT_LABELS`)."""
    return any(labels.get(key) in values for key, values in SPOT_LABELS.items())


def on_demand_requirements() -> list[dict[str, Any]]:
    """Node selector requirements that keep a pod off every kind of spot node: ``NotIn`` its spot
    values for each of `SPOT_LABELS` (a node without the label matches ``NotIn``)."""
    return [{"key": key, "operator": "NotIn", "values": list(values)} for key, values in SPOT_LABELS.items()]


SPOT_PREFERENCE_WEIGHT: Final = 50
"""The preferred-affinity weight a spot-capable pod gives spot nodes: it should use the spot share
it was given, yet still land on on-demand when no spot node fits."""


def spot_preferences() -> list[dict[str, Any]]:
    """Preferred node affinity terms of a spot-capable pod: spot nodes, by any of `SPOT_LABELS`."""
    return [
        {
            "weight": SPOT_PREFERENCE_WEIGHT,
            "preference": {"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]},
        }
        for key, values in SPOT_LABELS.items()
    ]


def instance_type_preferences(types: Sequence[str]) -> list[dict[str, Any]]:
    """``spotStrategy.instanceTypes`` as preferred node affinity: the first type weighs 100, the
    last at least 1, evenly spaced between (kube-scheduler's weights are 1–100); duplicates count
    once, at their first place."""
    ordered = list(dict.fromkeys(types))
    n = len(ordered)
    out = []
    for i, kind in enumerate(ordered):
        weight = max(1, round(100 * (n - i) / n))
        out.append(
            {
                "weight": weight,
                "preference": {
                    "matchExpressions": [{"key": LABEL_INSTANCE_TYPE, "operator": "In", "values": [kind]}]
                },
            }
        )
    return out


def spot_allowance(units: int, max_spot_percent: int) -> int:
    """Units (replicas, or whole gangs) that may be on spot: ``floor(percent × units / 100)``, so
    spot units / units never exceeds the percentage."""
    if units <= 0 or max_spot_percent <= 0:
        return 0
    return min(units, math.floor(units * max_spot_percent / 100))


_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """A Go-style duration (``"10m"``, ``"1h30m"``, ``"90s"``; the CRD's pattern) in seconds.

    Raises:
        ValueError: `text` is not one.
    """
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass(frozen=True, slots=True)
class ThresholdState:
    """The interruption threshold's state, as kept in the pool's status (so a restart keeps it).

    `noticed`: when each notice counted for the pool began (one per node), newest last.
    `tripped_at`: when the threshold tripped; None while it holds."""

    noticed: tuple[datetime, ...] = ()
    tripped_at: datetime | None = None


def step_threshold(
    state: ThresholdState, new: Iterable[datetime], *, count: int, window_s: float, now: datetime
) -> ThresholdState:
    """The state after notices `new` (their start times) at `now`.

    Trips when ``count`` notices began within the last ``window_s``; clears after the quiet period:
    ``window_s`` with no notice since the last one (so spot comes back only once interruptions have
    stopped for a whole window, and a pool is never flapped on and off within one). Notices older
    than the window are dropped, except the newest (the quiet period runs from it)."""
    noticed = sorted((*state.noticed, *new))
    window = timedelta(seconds=window_s)
    recent = [t for t in noticed if now - t <= window]
    tripped = state.tripped_at
    if tripped is None and len(recent) >= count:
        tripped = now
    elif tripped is not None and (not noticed or now - noticed[-1] >= window):
        tripped = None
    kept = recent or noticed[-1:]
    return ThresholdState(noticed=tuple(kept[-64:]), tripped_at=tripped)
