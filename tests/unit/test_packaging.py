"""The component folders import inside the `neuronetes` namespace and never shadow the stdlib."""

from __future__ import annotations

import importlib
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("module", "folder"),
    [
        ("neuronetes.operator", "operator"),
        ("neuronetes.extender", "extender"),
        ("neuronetes.agent", "node-agent"),
    ],
)
def test_component_folders_are_neuronetes_subpackages(module: str, folder: str) -> None:
    imported = importlib.import_module(module)
    assert imported.__doc__
    assert imported.__file__ is not None
    path = Path(imported.__file__)
    # Editable install: the repository folder itself; regular install: site-packages/neuronetes/<name>.
    assert path.parent == REPO_ROOT / folder or path.parent.parent.name == "neuronetes"


def test_stdlib_operator_is_not_shadowed_from_the_repo_root() -> None:
    # Holds with the project installed as hack/lib.sh installs it (editable): its import hook,
    # loaded at startup, imports the stdlib `operator` before the working directory is on
    # sys.path. In a bare interpreter started in the repository root, `operator/` would win.
    out = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(out).parent == Path(sysconfig.get_paths()["stdlib"])
