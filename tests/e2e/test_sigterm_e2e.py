"""A test run killed with SIGTERM leaves no process of its cluster behind.

The outer test runs this file's inner test in a pytest subprocess: the inner one takes the session
`cluster` fixture, writes the cluster's name and waits; the outer one sends the subprocess SIGTERM
(what a CI timeout or `kill` sends) and checks that the run ended and that no process whose command
line names the cluster's state directory is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_cluster import E2ECluster, wait_until

from neuronetes.devcluster.tools import REPO_ROOT

MARKER_ENV = "NEURONETES_SIGTERM_MARKER"


@pytest.mark.skipif(
    MARKER_ENV not in os.environ,
    reason="the inner run of test_a_run_killed_with_sigterm_tears_its_cluster_down",
)
def test_holds_its_cluster_until_killed(cluster: E2ECluster) -> None:
    Path(os.environ[MARKER_ENV]).write_text(str(cluster.dev.state_dir))
    time.sleep(300)  # the outer test kills the run long before


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if text in cmdline:
            found.append(int(entry.name))
    return found


def test_a_run_killed_with_sigterm_tears_its_cluster_down(tmp_path: Path) -> None:
    marker = tmp_path / "cluster-dir"
    inner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{__file__}::test_holds_its_cluster_until_killed",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, MARKER_ENV: str(marker)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def written() -> str | None:
            return marker.read_text() if marker.exists() else None

        state_dir = wait_until(written, timeout=180, what="inner cluster up")
        assert processes_naming(state_dir), "the inner run's cluster has no process to tear down"
        inner.send_signal(signal.SIGTERM)
        output, _ = inner.communicate(timeout=120)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
    assert "KeyboardInterrupt: signal 15" in output, output[-2000:]
    assert processes_naming(state_dir) == [], f"left after SIGTERM: {processes_naming(state_dir)}"
