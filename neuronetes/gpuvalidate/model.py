"""The validation's data: the check table, a check's report, the run's JSON document.

A check reports sub-checks (`Finding`: pass, fail or skipped, a reason and its figures) and
check-wide figures; its status is derived, never set: fail if any sub-check failed, pass if one
passed and none failed, skipped if nothing ran. The runner adds "error" for a check whose process
crashed or overran its time limit. `SCHEMA` names the JSON document's version
(docs/gpu-validation.md).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

__all__ = [
    "MODES",
    "SCHEMA",
    "TABLE",
    "CheckResult",
    "CheckSpec",
    "Finding",
    "Report",
    "Status",
    "TableError",
    "load_table",
]

SCHEMA: Final = "neuronetes.io/gpu-validate/v1"
TABLE: Final = Path(__file__).with_name("checks.toml")
MODES: Final = ("gpu", "fake")

Status = Literal["pass", "fail", "skipped", "error"]


class TableError(ValueError):
    """The check table is malformed: the message names the entry and the field."""


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """One row of the check table."""

    id: str
    title: str
    run: str  # "module:function"
    modes: tuple[str, ...]
    needs: tuple[str, ...]
    timeout_s: float
    goal: str


def _entry(raw: Mapping[str, Any], where: str) -> CheckSpec:
    def text(key: str) -> str:
        value = raw.get(key)
        if not isinstance(value, str) or not value.strip():
            raise TableError(f"{where}: {key!r} must be a non-empty string")
        return value

    def words(key: str) -> tuple[str, ...]:
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise TableError(f"{where}: {key!r} must be a list of strings")
        return tuple(value)

    unknown = set(raw) - {"id", "title", "run", "modes", "needs", "timeout_s", "goal"}
    if unknown:
        raise TableError(f"{where}: unknown field(s) {sorted(unknown)}")
    run = text("run")
    if run.count(":") != 1:
        raise TableError(f"{where}: 'run' must be 'module:function', got {run!r}")
    modes = words("modes")
    if not modes or set(modes) - set(MODES):
        raise TableError(f"{where}: 'modes' must list some of {list(MODES)}, got {list(modes)}")
    for need in words("needs"):
        kind, _, name = need.partition(":")
        if kind not in ("cmd", "py", "built") or not name:
            raise TableError(f"{where}: need {need!r} must be 'cmd:NAME', 'py:MODULE' or 'built:ARTEFACT'")
    timeout = raw.get("timeout_s")
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 1 <= timeout <= 1800:
        raise TableError(f"{where}: 'timeout_s' must be a number of seconds in 1..1800")
    return CheckSpec(text("id"), text("title"), run, modes, words("needs"), float(timeout), text("goal"))


def load_table(path: Path = TABLE) -> list[CheckSpec]:
    """The checks of `path`, in order. Raises `TableError` (or OSError)."""
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TableError(f"{path}: {exc}") from None
    rows = doc.get("check")
    if not isinstance(rows, list) or not rows:
        raise TableError(f"{path}: no [[check]] entries")
    specs = [_entry(row, f"{path}: check #{i + 1}") for i, row in enumerate(rows)]
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise TableError(f"{path}: check ids repeat: {ids}")
    return specs


@dataclass(frozen=True, slots=True)
class Finding:
    """One sub-check: its id, status, why, and the figures that show it."""

    id: str
    status: Status
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Report:
    """What a check function returns: its sub-checks and its check-wide figures."""

    findings: list[Finding] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def check(self, id: str, ok: bool, reason: str, /, **figures: Any) -> bool:
        """Record a sub-check that passed when `ok`; returns `ok`."""
        self.findings.append(Finding(id, "pass" if ok else "fail", reason, figures))
        return ok

    def skip(self, id: str, reason: str, /, **figures: Any) -> None:
        self.findings.append(Finding(id, "skipped", reason, figures))

    @property
    def status(self) -> Status:
        states = {f.status for f in self.findings}
        if "fail" in states or "error" in states:
            return "fail"
        return "pass" if "pass" in states else "skipped"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check in the run's document."""

    id: str
    title: str
    goal: str
    status: Status
    reason: str
    seconds: float
    figures: dict[str, Any]
    subchecks: list[Finding]

    @classmethod
    def of(cls, spec: CheckSpec, report: Report, seconds: float) -> CheckResult:
        failed = [f.id for f in report.findings if f.status == "fail"]
        status = report.status
        if status == "fail":
            reason = "failed: " + ", ".join(failed)
        elif status == "pass":
            skipped = sum(f.status == "skipped" for f in report.findings)
            reason = "all sub-checks passed" + (f" ({skipped} skipped)" if skipped else "")
        else:
            reasons = sorted({f.reason for f in report.findings}) or ["nothing ran"]
            reason = "skipped: " + "; ".join(reasons)
        return cls(
            spec.id, spec.title, spec.goal, status, reason, round(seconds, 2), report.figures, report.findings
        )

    @classmethod
    def not_run(cls, spec: CheckSpec, status: Status, reason: str, seconds: float = 0.0) -> CheckResult:
        return cls(spec.id, spec.title, spec.goal, status, reason, round(seconds, 2), {}, [])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summary(results: Sequence[CheckResult]) -> dict[str, int]:
    """How many checks ended in each status."""
    counts = {s: 0 for s in ("pass", "fail", "skipped", "error")}
    for r in results:
        counts[r.status] += 1
    return counts
