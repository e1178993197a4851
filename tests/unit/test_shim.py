"""The CUDA shim's C tests, one pytest test per case so failures are reported by name.

Each case runs the shim (libneuronetes-cuda.so, preloaded) over the fake driver under
AddressSanitizer + UndefinedBehaviorSanitizer (node-agent/shim/tests/run_case.sh); the region
logic also runs on its own under ThreadSanitizer. What each case checks is in
node-agent/shim/tests/test_shim.c; docs/shim.md describes the shim.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from shim_build import SHIM, build

pytestmark = pytest.mark.unit

CASES = [
    "lookup",
    "memory",
    "vmm",
    "graph",
    "capture",
    "pause",
    "admission",
    "env-cluster",
    "env-standalone",
    "children",
    "checkpoint",
    "refused-missing",
    "refused-version",
    "race",
]


@pytest.fixture(scope="module")
def asan_build() -> Path:
    return build("asan") / "asan"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("case", CASES)
def test_shim_case(asan_build: Path, case: str) -> None:
    proc = run(str(SHIM / "tests" / "run_case.sh"), str(asan_build), case)
    assert proc.returncode == 0, f"{case}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def test_refusals_say_why(asan_build: Path) -> None:
    # fail closed, loudly: the process learns which region and what is wrong with it
    proc = run(str(SHIM / "tests" / "run_case.sh"), str(asan_build), "refused-version")
    assert "region version 2.0 is not readable by this shim" in proc.stderr
    assert "CUDA is refused" in proc.stderr


def test_region_logic_under_asan(asan_build: Path) -> None:
    proc = run(str(asan_build / "test_region"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_region_logic_under_tsan() -> None:
    tsan = build("tsan") / "tsan"
    proc = run(str(tsan / "test_region"), "threads")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ThreadSanitizer" not in proc.stderr
