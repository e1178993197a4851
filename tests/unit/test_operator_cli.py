"""`neuronetes operator run` and `neuronetes webhook serve` refuse bad input with one line, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from neuronetes.cli import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("content", "expect"),
    [("bad: [\n", "while parsing"), ('{"workers": 0}', "$.workers"), ('{"leader": true}', "unknown field")],
)
def test_bad_settings_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, expect: str
) -> None:
    settings = tmp_path / "operator.yaml"
    settings.write_text(content)
    assert main(["operator", "run", "--config", str(settings)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: settings") and expect in err


def test_unreadable_kubeconfig_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "run", "--kubeconfig", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot reach the cluster")


def test_webhook_without_certificates_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook", "serve", "--port", "0", "--cert-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot serve")
