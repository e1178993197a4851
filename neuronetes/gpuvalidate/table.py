"""The readable table of a run: one row per check, one indented row per sub-check with its figures.

Plain text (fixed-width columns), so the same text goes to the terminal, to ``gpu-validate.txt`` and
into a closing note; figures are shown compactly (floats to 4 significant digits, bytes as given).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["compact", "render"]

_WIDTH: Final = 150
_MARK: Final = {"pass": "PASS", "fail": "FAIL", "skipped": "skip", "error": "ERROR"}


def compact(value: Any, depth: int = 0) -> str:
    """A figure in few characters."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        if depth > 0:
            return "{" + ", ".join(f"{k}: {compact(v, depth + 1)}" for k, v in value.items()) + "}"
        return ", ".join(f"{k}={compact(v, depth + 1)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(compact(v, depth + 1) for v in value) + "]"
    return str(value)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render(document: Mapping[str, Any]) -> str:
    """The run as a table."""
    gpu = document["machine"]["gpu"]
    lines = [
        f"GPU validation ({document['mode']}): {gpu['name']} {gpu['uuid']}, driver {gpu['driver']}, "
        f"{document['started']}",
        f"{'CHECK / SUB-CHECK':<34} {'STATUS':<6} {'SECONDS':>7}  REASON / FIGURES",
    ]
    for check in document["checks"]:
        lines.append(
            _clip(
                f"{check['id']:<34} {_MARK[check['status']]:<6} {check['seconds']:>7.1f}  {check['reason']}",
                _WIDTH,
            )
        )
        if check["figures"]:
            lines.append(_clip(f"{'  (figures)':<34} {'':<6} {'':>7}  {compact(check['figures'])}", _WIDTH))
        for sub in check["subchecks"]:
            detail = sub["reason"] + (f" | {compact(sub['figures'])}" if sub["figures"] else "")
            lines.append(_clip(f"  {sub['id']:<32} {_MARK[sub['status']]:<6} {'':>7}  {detail}", _WIDTH))
    counts = document["summary"]
    tally = [f"{counts['pass']} passed", f"{counts['fail']} failed", f"{counts['error']} errors"]
    lines.append(", ".join([*tally, f"{counts['skipped']} skipped"]))
    return "\n".join(lines) + "\n"
