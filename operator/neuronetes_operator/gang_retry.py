"""Gangs the extender could not place: its failed reservations read, and retries with backoff. Pure.

The extender keeps one ``GangReservation`` per gang (``spec.groupName`` is the gang's
``neuronetes.io/gang`` label). When a reservation ends ``Expired`` (not every member reached bind in
time) or ``Failed`` (a bind failed after the barrier), the pool's gang is recreated: its pods are
deleted and created again, whole. Each gang's retries back off: the first at once, then each no
sooner than `base` × 2^(n-1) seconds after the previous one, at most `cap`; a gang bound whole starts
over (docs/agentpool.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from neuronetes import contracts as c

from .pods import DesiredPod
from .reconcile import Action, is_terminating

__all__ = [
    "FAILED_PHASES",
    "GangFailure",
    "GangRetries",
    "GangRetryPlan",
    "RetryVerdict",
    "failed_reservations",
    "plan_gang_retries",
    "pool_of_gang",
]

FAILED_PHASES: Final = frozenset({"Failed", "Expired"})
_GANG: Final = re.compile(r"^(?P<pool>.+)-(?P<index>[0-9]+)(-r)?$")  # -r: a replacement gang


@dataclass(frozen=True, slots=True)
class GangFailure:
    """One failed reservation of a gang, as the extender reported it."""

    gang: str
    phase: str
    report: str  # identifies this report (the reservation id, else the object's resourceVersion)
    bound: int


def pool_of_gang(gang: str) -> str | None:
    """The pool whose gang label is `gang` (``<pool>-<index>``, or ``<pool>-<index>-r`` for the
    gang that replaces it on a spot interruption), or None."""
    found = _GANG.match(gang)
    return found["pool"] if found else None


def failed_reservations(
    reservations: Iterable[Mapping[str, Any]], gangs: Iterable[str]
) -> dict[str, GangFailure]:
    """The failed reservations of `gangs` among `reservations` (GangReservation objects), by gang."""
    wanted = set(gangs)
    out: dict[str, GangFailure] = {}
    for obj in reservations:
        gang = str((obj.get("spec") or {}).get("groupName") or "")
        status = obj.get("status") or {}
        phase = str(status.get("phase") or "")
        if gang not in wanted or phase not in FAILED_PHASES:
            continue
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        report = str(annotations.get(c.ANNOTATION_RESERVATION_ID) or meta.get("resourceVersion"))
        out[gang] = GangFailure(gang, phase, report, int(status.get("boundMembers") or 0))
    return out


@dataclass(frozen=True, slots=True)
class RetryVerdict:
    """What to do about a failure now: recreate (attempt `attempt`), or wait `wait_s` more."""

    retry: bool
    attempt: int
    wait_s: float  # retry: how long the next retry will wait at least; else: how long until this one


@dataclass
class _State:
    attempts: int = 0
    handled: str = ""
    last: float = 0.0


class GangRetries:
    """Per gang (``namespace/gang``): the reports handled, the retries made and when the last was."""

    def __init__(self, base_s: float = 10.0, cap_s: float = 300.0) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self._gangs: dict[str, _State] = {}

    def delay(self, attempts: int) -> float:
        """The least time after retry number `attempts` before the next one."""
        return 0.0 if attempts <= 0 else min(self.cap_s, self.base_s * 2 ** (attempts - 1))

    def attempts(self, key: str) -> int:
        state = self._gangs.get(key)
        return 0 if state is None else state.attempts

    def decide(self, key: str, failure: GangFailure, now: float) -> RetryVerdict | None:
        """None: this report was handled already. Else retry now, or wait."""
        state = self._gangs.setdefault(key, _State())
        if state.handled == failure.report:
            return None
        due = state.last + self.delay(state.attempts)
        if state.attempts and now < due:
            return RetryVerdict(False, state.attempts, due - now)
        state.attempts += 1
        state.handled, state.last = failure.report, now
        return RetryVerdict(True, state.attempts, self.delay(state.attempts))

    def settled(self, key: str) -> None:
        """The gang was bound whole: its next failure starts the backoff over."""
        self._gangs.pop(key, None)

    def forget_pool(self, namespace: str, pool: str) -> None:
        """The pool is gone: so are its gangs' records."""
        for key in [
            k
            for k in self._gangs
            if k.startswith(f"{namespace}/") and pool_of_gang(k.split("/", 1)[1]) == pool
        ]:
            del self._gangs[key]

    def __len__(self) -> int:
        return len(self._gangs)


@dataclass(frozen=True, slots=True)
class GangRetryPlan:
    """What a reconcile does about its pool's failed gangs (`plan_gang_retries`)."""

    actions: list[Action]
    """The reconcile's actions with the retried gangs' deletions added and their creations removed
    (a gang is created whole once its old members are gone)."""
    notes: dict[str, str] = field(default_factory=dict)
    """Per failed gang: what the ``GangScheduled`` condition says about it."""
    retried: dict[str, list[str]] = field(default_factory=dict)
    """Per gang recreated now: the pods deleted (a ``GangRetry`` Warning Event each)."""


def plan_gang_retries(
    retries: GangRetries,
    namespace: str,
    gang_size: int,
    want: Sequence[DesiredPod],
    pods: Sequence[Mapping[str, Any]],
    actions: Sequence[Action],
    reservations: Iterable[Mapping[str, Any]],
    now: float,
) -> GangRetryPlan:
    """Recreate the gangs of `want` (either generation) whose reservation (among `reservations`)
    the extender reported Failed or Expired, with `retries`' backoff: their pods are deleted. A
    gang bound whole settles its record."""
    # Both generations of each gang: a spot replacement is a gang of its own (``<gang>-r``), and
    # its reservation can fail as the original's can.
    gangs = {d.template.gang_label(d.gang, r) for d in want if d.gang is not None for r in (False, True)}
    failures = failed_reservations(reservations, gangs)
    members: dict[str, list[str]] = {}
    for pod in pods:
        gang = (pod["metadata"].get("labels") or {}).get(c.LABEL_GANG)
        if gang and not is_terminating(pod):
            members.setdefault(gang, []).append(pod["metadata"]["name"])
    for gang in gangs - set(failures):
        bound = [p for p in pods if (p["metadata"].get("labels") or {}).get(c.LABEL_GANG) == gang]
        if len(bound) == gang_size and all(p.get("spec", {}).get("nodeName") for p in bound):
            retries.settled(f"{namespace}/{gang}")
    out = GangRetryPlan(list(actions))
    deleted = {a.name for a in actions if a.verb == "delete"}
    for gang, failure in sorted(failures.items()):
        key = f"{namespace}/{gang}"
        said = (
            f"gang {gang}: the scheduler's reservation {failure.phase} ({failure.bound} of {gang_size} bound)"
        )
        verdict = retries.decide(key, failure, now)
        if verdict is None:
            out.notes[gang] = f"{said}; recreated ({retries.attempts(key)} retries so far)"
            continue
        if not verdict.retry:
            out.notes[gang] = f"{said}; retry {verdict.attempt + 1} in {verdict.wait_s:.0f}s (backoff)"
            continue
        doomed = [n for n in members.get(gang, []) if n not in deleted]
        out.actions[:] = [a for a in out.actions if not (a.verb == "create" and a.unit == f"gang:{gang}")]
        out.actions.extend(Action("delete", n, "GangRetry") for n in doomed)
        out.notes[gang] = (
            f"{said}; recreated (retry {verdict.attempt}, the next waits at least {verdict.wait_s:.0f}s)"
        )
        out.retried[gang] = sorted(doomed)
    return out
