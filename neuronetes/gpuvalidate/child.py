"""One check in a process of its own: ``python -m neuronetes.gpuvalidate.child RUN CONTEXT RESULT``.

Imports the check function named by RUN ("module:function"), calls it with the `Context` read from
the file CONTEXT and writes its `Report` (findings and figures) as JSON to RESULT. An exception is
written as ``{"error": ...}`` with its traceback, which the runner reports as the check's error.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from .context import Context
from .model import Report


def main(argv: list[str]) -> int:
    run, context_file, result_file = argv
    out: dict[str, object]
    try:
        module, _, function = run.partition(":")
        # By name: the runner's check table names each check as "module:function" (a plugin table).
        check = getattr(importlib.import_module(module), function)
        ctx = Context.from_json(Path(context_file).read_text())
        report = check(ctx)
        if not isinstance(report, Report):
            raise TypeError(f"{run} returned {type(report).__name__}, not a Report")
        out = {"findings": [asdict(f) for f in report.findings], "figures": report.figures}
    except Exception as exc:  # any failure of the check is its result, reported, never lost
        out = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    Path(result_file).write_text(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
