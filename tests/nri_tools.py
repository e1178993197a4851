"""Building the NRI plugin's check commands (``node-agent/nri/cmd/*-check``) for the agent's tests.

Each runs the plugin's own strict reader on a file the Python agent wrote, so the two sides of a
contract cannot drift apart. Without `go` the tests that need one are skipped locally and FAIL
under CI=true.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from shim_build import skip_outside_ci

NRI = Path(__file__).resolve().parents[1] / "node-agent" / "nri"


def build_nri_tool(name: str, dest: Path) -> Path:
    """``go build ./cmd/<name>`` into `dest`; returns the executable."""
    go = shutil.which("go")
    if go is None:
        skip_outside_ci(f"go not found: {name} cannot check what the agent writes")
    exe = dest / name
    env = {**os.environ, "GOFLAGS": "-modcacherw", "GOTOOLCHAIN": "local"}
    build = subprocess.run(
        [go, "build", "-o", str(exe), f"./cmd/{name}"], cwd=NRI, env=env, capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr
    return exe
