"""The agent's CLI verbs refuse bad input with one line, never a traceback."""

from __future__ import annotations

import pytest

from neuronetes.cli import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "argv",
    [
        ["online", "--gpu-id", "GPU-x", "--kubeconfig", "/nonexistent/kubeconfig"],
        ["offline", "--force", "--gpu-id", "GPU-x", "--kubeconfig", "/nonexistent/kubeconfig"],
        ["dev", "inject-xid", "--gpu-id", "GPU-x", "--xid", "48", "--kubeconfig", "/nonexistent/kubeconfig"],
        ["dev", "inject-xid", "--gpu-id", "GPU-x", "--xid", "0"],
        ["dev", "inject-ecc", "--gpu-id", "GPU-x"],
        ["agent", "run", "--node", "n1", "--kubeconfig", "/nonexistent/kubeconfig"],
    ],
)
def test_one_line_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err


def test_agent_run_needs_exactly_one_target(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["agent", "run", "--node", "a", "--simulate-nodes", "x=y"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit):
        main(["agent", "run"])
