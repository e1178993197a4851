"""A pool's pods on spot capacity: replacements on interruption notices, the spot share. Pure.

Rules (docs/spot.md, "What the operator does"):

* A replica has two names (`pods.alternate_name`); a gang's two generations are two gangs. A
  replica whose pod (a gang: any member) is bound to a node under notice is replaced under its
  other name at once — the whole gang for a gang — on on-demand (``migrate-to-on-demand``), on spot
  but not on that node (``reschedule-on-spot``), or not at all (``scale-down``: its pods are
  deleted, and the replica comes back through the ordinary flow, away from the node).
* The old pods are deleted once every replacement pod is Ready, or at the notice's deadline,
  whichever comes first (the replacement carries both in `pods.ANNOTATION_REPLACES`).
* At most `neuronetes.spot.spot_allowance` units are spot: bound to a spot node, or created
  spot-capable and not yet bound. Over it (the share lowered, the pool scaled down, spot disabled
  by the interruption threshold), unbound spot-capable units are deleted (recreated on-demand) and
  bound ones are replaced on on-demand like an interruption without a deadline.
* Pods created while nodes are under notice carry a required ``kubernetes.io/hostname NotIn``
  those nodes (the notice taints are not relied on: a pool may tolerate every taint, and a label or
  annotation notice has none).

Past 400 lines because the replacements and the share are one plan over the same pods (a move
off spot is a replacement without a deadline) and the spot state written to status is that plan's
outcome; the pure rules it uses (notices, the share, preferences, the threshold) are `neuronetes.spot`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from neuronetes import contracts as c
from neuronetes.api.models import Condition, SpotInterruption, SpotStatus
from neuronetes.spot import Notice, ThresholdState, is_spot_node, spot_allowance, step_threshold

from .pods import ANNOTATION_REPLACES, LABEL_CAPACITY, DesiredPod
from .policy import ResolvedPool
from .reconcile import Action, is_ready, is_terminating
from .status import make_condition

__all__ = ["SpotPlan", "SpotState", "plan_spot", "spot_state", "with_capacity"]


@dataclass(frozen=True, slots=True)
class _Unit:
    """A replica (or gang) as found: its desired members and, per name generation, its live pods."""

    members: tuple[DesiredPod, ...]
    first: tuple[Mapping[str, Any], ...]  # live pods under the members' names
    second: tuple[Mapping[str, Any], ...]  # live pods under their alternates

    @property
    def key(self) -> str:
        return self.members[0].unit


@dataclass(slots=True)
class SpotPlan:
    """What `plan_spot` decided for one reconcile."""

    actions: list[Action] = field(default_factory=list)
    """Replacement creations and deletions, in the order to do them (whole units)."""
    deleting: set[str] = field(default_factory=set)
    """Pods `actions` delete (for `reconcile.plan`: gone)."""
    allowed_units: int = 0
    share: int = 0
    """Units the pool's spot share allows whether or not the threshold turned spot off."""
    spot_units: int = 0
    """Units on spot (or spot-capable and unbound) before the actions."""
    free_spot: int = 0
    """Spot-capable creations still allowed after the actions."""
    avoid: tuple[str, ...] = ()
    """Nodes under notice: no pod created now may land there."""
    notified: dict[str, list[str]] = field(default_factory=dict)
    """Per node under notice, the pool's pods on it (for the Event and condition)."""
    replacing: int = 0
    """Units with a replacement under way (after the actions)."""
    in_flight: int = 0
    """Units whose old and new pods both exist (the old go when the new are Ready, or at the deadline)."""


def _live(pods: Mapping[str, Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    pod = pods.get(name) if name else None
    return None if pod is None or is_terminating(pod) else pod


def _node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _on_spot(pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> bool:
    node = _node(pod)
    if not node:
        return (pod["metadata"].get("labels") or {}).get(LABEL_CAPACITY) == "spot"
    labels = (nodes.get(node) or {}).get("metadata", {}).get("labels") or {}
    return is_spot_node(labels)


def _replaces(pod: Mapping[str, Any]) -> tuple[str, datetime | None] | None:
    raw = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_REPLACES)
    if not raw:
        return None
    name, _, when = str(raw).partition("@")
    try:
        deadline = datetime.fromisoformat(when) if when else None
    except ValueError:
        deadline = None
    return name, deadline


def _units(want: Sequence[DesiredPod], pods: Mapping[str, Mapping[str, Any]]) -> list[_Unit]:
    grouped: dict[str, list[DesiredPod]] = {}
    for d in want:
        grouped.setdefault(d.unit, []).append(d)
    out = []
    for members in grouped.values():
        first = tuple(p for m in members if (p := _live(pods, m.name)) is not None)
        second = tuple(p for m in members if (p := _live(pods, m.alternate)) is not None)
        out.append(_Unit(tuple(members), first, second))
    return out


def _unit_of(pod: Mapping[str, Any]) -> str:
    gang = (pod["metadata"].get("labels") or {}).get(c.LABEL_GANG)
    return f"gang:{gang}" if gang else f"pod:{pod['metadata']['name']}"


def _names(pods: Sequence[Mapping[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


def _newer(unit: _Unit) -> tuple[tuple[Mapping[str, Any], ...], tuple[Mapping[str, Any], ...]]:
    """(new, old) generations of a unit with both: the new one's `ANNOTATION_REPLACES` names a pod
    of the other (the annotation stays on a pod, so a replacement's replacement is told apart)."""
    mark = _replaces(unit.first[0])
    if mark is not None and mark[0] in _names(unit.second):
        return unit.first, unit.second
    return unit.second, unit.first


def plan_spot(
    want: Sequence[DesiredPod],
    observed: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    notices: Mapping[str, Notice],
    resolved: ResolvedPool,
    *,
    spot_off: bool,
    now: datetime,
) -> SpotPlan:
    """Replacements for the pool's pods on nodes under `notices`, and the spot share's moves.

    `nodes`: by name, at least their labels (spot or not); `spot_off`: the interruption threshold
    turned spot off for the pool."""
    pods = {p["metadata"]["name"]: p for p in observed}
    out = SpotPlan(avoid=tuple(sorted(notices)))
    units = _units(want, pods)
    allowed = spot_allowance(len(units), resolved.spot.max_spot_percent)
    out.share = allowed if resolved.spot_allowed else 0
    out.allowed_units = 0 if spot_off else out.share
    on_interruption = resolved.spot.on_interruption
    spot_new: set[str] = set()  # units given a spot-capable replacement now
    moving: set[str] = set()  # units whose replacement (under way or created now) is on-demand

    def on_spot(gen: Sequence[Mapping[str, Any]]) -> bool:
        return any(_on_spot(p, nodes) for p in gen)

    def delete(gen: Sequence[Mapping[str, Any]], reason: str) -> None:
        for p in gen:
            name = p["metadata"]["name"]
            if name not in out.deleting:
                out.deleting.add(name)
                out.actions.append(Action("delete", name, reason, unit=_unit_of(p)))

    def replace(
        unit: _Unit, gen: Sequence[Mapping[str, Any]], *, spot: bool, replaces: str, reason: str
    ) -> bool:
        old_first = gen is unit.first
        other = [m.alternate if old_first else m.name for m in unit.members]
        if any(n in pods for n in other):
            return False  # the other names are still terminating: the replacement waits for them
        for m in unit.members:
            d = dataclasses.replace(
                m.swapped() if old_first else m, spot=spot, avoid=out.avoid, replaces=replaces
            )
            out.actions.append(Action("create", d.name, reason, d, d.unit))
        out.replacing += 1
        (spot_new if spot else moving).add(unit.key)
        return True

    for unit in units:
        gens = [g for g in (unit.first, unit.second) if g]
        for gen in gens:
            for p in gen:
                if (node := _node(p)) in notices:
                    out.notified.setdefault(node, []).append(p["metadata"]["name"])
        if len(gens) == 2:  # a replacement under way: old pods go once the new are Ready, or at the deadline
            new, old = _newer(unit)
            mark = _replaces(new[0])
            deadline = mark[1] if mark else None
            whole = len(new) == len(unit.members)
            if (whole and all(is_ready(p) for p in new)) or (deadline is not None and now >= deadline):
                delete(old, "SpotReplaced")
            else:
                out.replacing += 1
                out.in_flight += 1
                if not on_spot(new):
                    moving.add(unit.key)
            continue
        if not gens:
            continue
        gen = gens[0]
        hit = [notices[n] for p in gen if (n := _node(p)) in notices]
        if not hit:
            continue
        if on_interruption == "scale-down":
            delete(gen, "SpotInterrupted")
            continue
        deadline = min(n.deadline for n in hit)
        replace(
            unit,
            gen,
            spot=on_interruption == "reschedule-on-spot" and out.allowed_units > 0,
            replaces=f"{gen[0]['metadata']['name']}@{deadline.isoformat()}",
            reason="SpotReplacement",
        )

    def is_spot_unit(unit: _Unit) -> bool:
        return on_spot([p for p in (*unit.first, *unit.second) if p["metadata"]["name"] not in out.deleting])

    spot_units = [u for u in units if on_spot((*u.first, *u.second))]
    out.spot_units = len(spot_units)
    staying = [u for u in units if is_spot_unit(u) and u.key not in moving]
    excess = len(staying) - out.allowed_units
    busy = {u.key for u in units if u.first and u.second} | moving | spot_new
    # Over the share: unbound spot-capable units first (nothing runs there yet), newest first; then
    # bound ones, replaced on on-demand before their pods go.
    for unit in reversed(staying):
        gen = unit.first or unit.second
        if excess > 0 and unit.key not in busy and not any(_node(p) for p in gen):
            delete(gen, "SpotRebalanced")
            excess -= 1
    for unit in reversed(staying):
        gen = unit.first or unit.second
        if excess > 0 and unit.key not in busy and not (_names(gen) & out.deleting):
            excess -= replace(
                unit, gen, spot=False, replaces=gen[0]["metadata"]["name"], reason="SpotRebalanced"
            )
    committed = sum(1 for u in units if (is_spot_unit(u) or u.key in spot_new))
    out.free_spot = max(0, out.allowed_units - committed)
    return out


def with_capacity(actions: Sequence[Action], spot: SpotPlan) -> list[Action]:
    """`actions` (the plan's), their creations made spot-capable while the share allows (whole
    units, in order) and kept off the nodes under notice."""
    free = spot.free_spot
    granted: dict[str, bool] = {}
    out = []
    for a in actions:
        if a.verb != "create" or a.pod is None:
            out.append(a)
            continue
        if a.unit not in granted:
            granted[a.unit] = free > 0
            free -= granted[a.unit]
        d = dataclasses.replace(a.pod, spot=granted[a.unit], avoid=spot.avoid)
        out.append(dataclasses.replace(a, pod=d))
    return out


@dataclass(frozen=True, slots=True)
class SpotState:
    """The pool's spot status after a reconcile, its conditions and the Events to post."""

    status: SpotStatus
    conditions: list[Condition]
    events: list[tuple[str, str, str]]
    disables_spot: bool
    shown: bool


_HOW = {
    "migrate-to-on-demand": "replaced on on-demand nodes",
    "reschedule-on-spot": "replaced on other nodes, spot allowed",
    "scale-down": "deleted (onInterruption: scale-down)",
}
_KEEP_S = 3600.0
"""Without a threshold, notices are kept in the status this long (the last one at least)."""


def _when(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


def spot_state(
    pool: Mapping[str, Any],
    resolved: ResolvedPool,
    moves: SpotPlan,
    notices: Mapping[str, Notice],
    *,
    now: datetime,
) -> SpotState:
    """The pool's `SpotStatus` from the last one (``status.spot``: a restarted operator keeps the
    notices and the threshold) and this reconcile's `moves`; the conditions ``SpotInterrupted``,
    and with ``interruptionThreshold`` ``InterruptionThresholdReached`` and ``SpotDisabled``."""
    meta = pool["metadata"]
    generation = int(meta.get("generation") or 0)
    old = (pool.get("status") or {}).get("spot") or {}
    kept: list[SpotInterruption] = []
    for item in old.get("interruptions") or []:
        noticed, deadline = _when(item.get("noticed")), _when(item.get("deadline"))
        if item.get("node") and noticed and deadline:
            kept.append(
                SpotInterruption(
                    node=str(item["node"])[:253],
                    source=str(item.get("source") or "unknown")[:63],
                    noticed=noticed,
                    deadline=deadline,
                )
            )
    events: list[tuple[str, str, str]] = []
    policy = resolved.spot
    fresh: list[SpotInterruption] = []
    for node, names in sorted(moves.notified.items()):
        notice = notices[node]
        if any(i.node == node and i.deadline >= notice.noticed for i in kept):
            continue  # the notice already recorded (a node noticed again after its last one is new)
        entry = SpotInterruption(
            node=node, source=notice.source, noticed=notice.noticed, deadline=notice.deadline
        )
        fresh.append(entry)
        left = max(0.0, (notice.deadline - now).total_seconds())
        events.append(
            (
                "Warning",
                "SpotInterrupted",
                f"node {node} is under an interruption notice ({notice.source}; gone at "
                f"{notice.deadline.isoformat(timespec='seconds')}, in {left:.0f}s): pods "
                f"{', '.join(sorted(names)[:10])} are {_HOW.get(policy.on_interruption, 'replaced')}",
            )
        )
        if notice.problem:
            events.append(("Warning", "InvalidInterruptionNotice", f"node {node}: {notice.problem}"))
    threshold = policy.threshold_count
    window = policy.threshold_window_s if threshold else _KEEP_S
    tripped_at = _when(old.get("thresholdTrippedAt"))
    if threshold:
        state = step_threshold(
            ThresholdState(noticed=tuple(i.noticed for i in kept), tripped_at=tripped_at),
            [i.noticed for i in fresh],
            count=threshold,
            window_s=window,
            now=now,
        )
        if state.tripped_at is not None and tripped_at is None:
            events.append(
                (
                    "Warning",
                    "InterruptionThresholdReached",
                    f"{threshold} interruption notices within {window:g}s: {policy.threshold_action}"
                    + (
                        " (no new pod goes to spot; pods on spot move to on-demand)"
                        if policy.threshold_action == "disable-spot"
                        else ""
                    )
                    + f"; it clears after {window:g}s without a notice",
                )
            )
        elif state.tripped_at is None and tripped_at is not None:
            events.append(
                (
                    "Normal",
                    "InterruptionThresholdCleared",
                    f"no interruption notice for {window:g}s: spot is used again",
                )
            )
        tripped_at = state.tripped_at
    else:
        tripped_at = None
    entries = sorted([*kept, *fresh], key=lambda i: i.noticed)
    recent = [i for i in entries if i.node in notices or (now - i.noticed).total_seconds() <= window]
    entries = (recent or entries[-1:])[-64:]
    action = policy.threshold_action if tripped_at is not None else None
    disables = action == "disable-spot"
    interrupted = bool(moves.notified) or moves.replacing > 0
    conditions = []
    shown = bool(resolved.spot_allowed or threshold or interrupted or entries or old)
    if shown:
        conditions.append(
            make_condition(
                "SpotInterrupted",
                interrupted,
                "Replacing" if interrupted else "NoInterruption",
                f"nodes under notice with the pool's pods: {', '.join(sorted(moves.notified)) or 'none'}"
                f"; {moves.replacing} replacements under way",
                generation,
            )
        )
    if threshold:
        reason = {"disable-spot": "DisableSpot", "fallback-model": "FallbackModel", "alert": "Alert"}
        conditions.append(
            make_condition(
                "InterruptionThresholdReached",
                tripped_at is not None,
                reason[policy.threshold_action] if tripped_at is not None else "BelowThreshold",
                f"{len([i for i in entries if (now - i.noticed).total_seconds() <= window])} notices within "
                f"the last {window:g}s (threshold {threshold})",
                generation,
            )
        )
        conditions.append(
            make_condition(
                "SpotDisabled",
                disables,
                "InterruptionThreshold" if disables else "SpotAllowed",
                (
                    f"spot is off since {tripped_at.isoformat(timespec='seconds')}; "
                    f"back on after {window:g}s without a notice"
                    if disables and tripped_at is not None
                    else "spot is used as spotStrategy says"
                ),
                generation,
            )
        )
    status = SpotStatus(
        allowed_units=moves.share if not disables else 0,
        spot_units=moves.spot_units,
        interruptions=entries or None,
        threshold_tripped_at=tripped_at,
        threshold_action=action,  # type: ignore[arg-type]
        fallback_requested=action == "fallback-model",
        message=f"{moves.spot_units} spot units, {moves.share if not disables else 0} allowed"
        + (f"; {moves.replacing} replacements under way" if moves.replacing else ""),
    )
    return SpotState(status=status, conditions=conditions, events=events, disables_spot=disables, shown=shown)
