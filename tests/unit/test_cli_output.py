"""docs/cli.md, "Output formats": `-o json` and `-o yaml` carry the same document; a table written
to a pipe or a file is 250 columns wide and never folds a shorter row, on a terminal it fits the
terminal's width; progress is drawn only on a terminal (a pipe gets the plain ``>> ...`` lines of
`dev cluster up`, and nothing from the simulator's bar)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from neuronetes.cli.output import emit, progress, spinner

pytestmark = pytest.mark.unit

BIN = Path(sys.executable).parent


def test_json_and_yaml_carry_the_same_document(tmp_path: Path) -> None:
    def status(output: str) -> str:
        return subprocess.run(
            [str(BIN / "neuronetes"), "dev", "cluster", "status", "--name", "never-started", "-o", output],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            cwd="/",
            env={**os.environ, "NEURONETES_CACHE_DIR": str(tmp_path)},
        ).stdout

    as_json = json.loads(status("json"))
    assert as_json["name"] == "never-started" and as_json["up"] is False
    assert yaml.safe_load(status("yaml")) == as_json


def _row(width: int) -> list[str]:
    return ["x" * (width // 2 - 1), "y" * (width - width // 2 - 1)]  # two cells and the gap between


def test_a_table_on_a_pipe_is_250_columns_and_keeps_short_rows_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    emit("table", None, columns=["A", "B"], rows=[_row(240)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and len(lines[1].rstrip()) == 240  # the header and the row, unfolded
    emit("table", None, columns=["A", "B"], rows=[_row(400)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 2 and max(len(line.rstrip()) for line in lines) <= 250


def test_a_table_on_a_terminal_fits_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr(sys, "stdout", terminal)
        monkeypatch.setenv("COLUMNS", "60")
        emit("table", None, columns=["A", "B"], rows=[_row(100)])
        terminal.flush()
    text = re.sub(r"\x1b\[[0-9;]*m", "", os.read(leader, 65536).decode())  # the header's bold
    os.close(leader)
    lines = [line for line in text.replace("\r", "").split("\n") if line.strip()]
    assert len(lines) > 2 and max(len(line.rstrip()) for line in lines) <= 60


def test_progress_on_a_pipe_is_plain_step_lines_or_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with spinner("starting") as log:
        log("etcd up")
        log("kube-apiserver up")
    with progress("replaying seeds", 3) as advance:
        advance(3)
    captured = capsys.readouterr()
    assert captured.err == ">> etcd up\n>> kube-apiserver up\n" and captured.out == ""
