"""Building the CUDA shim's C artifacts for the pytest wrappers (tests/unit/test_shim*.py).

`make -C node-agent/shim` builds the library, the fake driver and the C tests against the real
cuda.h / nvml.h of the project's dev extra. Without gcc or make the C tests are skipped locally but
FAIL under CI=true: they must never silently stop running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIM = REPO / "node-agent" / "shim"
BUILD = SHIM / "build"


def build(*targets: str) -> Path:
    """Run `make <targets>` in node-agent/shim (incremental) and return the build directory."""
    missing = [tool for tool in ("gcc", "make") if shutil.which(tool) is None]
    if missing:
        message = f"{' and '.join(missing)} not found: the shim's C tests need a C toolchain"
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(message + " (CI=true: these tests may not be skipped)")
        pytest.skip(message)
    proc = subprocess.run(
        ["make", "-s", "-C", str(SHIM), f"PYTHON={sys.executable}", *targets],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"make {' '.join(targets)} failed:\n{proc.stdout}\n{proc.stderr}"
    return BUILD
