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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from neuronetes import contracts as c

__all__ = [
    "FAILED_PHASES",
    "GangFailure",
    "GangRetries",
    "RetryVerdict",
    "failed_reservations",
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
