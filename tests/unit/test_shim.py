"""The CUDA shim's C tests, one pytest test per case so failures are reported by name.

Each case runs the shim (libneuronetes-cuda.so, preloaded) over the fake driver under
AddressSanitizer + UndefinedBehaviorSanitizer (node-agent/shim/tests/run_case.sh); the region
logic also runs on its own under ThreadSanitizer. What each case checks is in
node-agent/shim/tests/test_shim.c; docs/shim.md describes the shim.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from shim_build import SHIM, build

pytestmark = pytest.mark.unit

CASES = [
    "lookup",
    "memory",
    "vmm",
    "vmm-mapped",
    "arrays",
    "graph",
    "graph-nodes",
    "limits",
    "capture",
    "pause",
    "admission",
    "env-cluster",
    "env-workstation",
    "children",
    "checkpoint",
    "unassigned",
    "refused-missing",
    "refused-version",
    "refused-legacy",
    "region-container",
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
    assert "control file: region version 1.0 is not readable by this shim (major 2)" in proc.stderr
    assert "CUDA is refused" in proc.stderr
    # what an agent of major 1 left (one file, "region") is named as such
    proc = run(str(SHIM / "tests" / "run_case.sh"), str(asan_build), "refused-legacy")
    assert "is a region of major version 1, which this shim (major 2) does not read" in proc.stderr


def test_region_logic_under_asan(asan_build: Path) -> None:
    proc = run(str(asan_build / "test_region"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_region_logic_under_tsan() -> None:
    tsan = build("tsan") / "tsan"
    proc = run(str(tsan / "test_region"), "threads")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ThreadSanitizer" not in proc.stderr


def cuda_include() -> Path:
    return Path(
        subprocess.run(
            ["make", "-s", "-C", str(SHIM), f"PYTHON={sys.executable}", "print-cuda-include"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )


@pytest.mark.parametrize(
    ("hook", "compiles"),
    [
        ("CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { (void)dptr; return bytesize; }", True),
        (
            "CUresult cuMemAlloc_v2(CUdeviceptr *dptr, unsigned bytesize) { (void)dptr; return bytesize; }",
            False,
        ),
        ("int cuLaunchKernel_ptsz(void) { return 0; }", False),
    ],
)
def test_a_hook_must_have_the_headers_signature(
    asan_build: Path, tmp_path: Path, hook: str, compiles: bool
) -> None:
    # hooks are defined under their cuda.h names with every variant declared: a mismatch is an error
    src = tmp_path / "hook.c"
    src.write_text(f'#include "shim.h"\n{hook}\n')
    proc = run(
        "gcc", "-std=gnu11", "-Werror", "-c", "-I", str(SHIM / "src"), "-I", str(SHIM / "include"),
        "-I", str(cuda_include()), str(src), "-o", str(tmp_path / "hook.o"),
    )  # fmt: skip
    assert (proc.returncode == 0) == compiles, proc.stderr
    if not compiles:
        assert "conflicting types" in proc.stderr
