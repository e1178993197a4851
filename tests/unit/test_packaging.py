"""Each component folder holds its package under the installed name, and nothing shadows the stdlib."""

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
        ("neuronetes_operator", "operator"),
        ("neuronetes_extender", "extender"),
        ("neuronetes_agent", "node-agent"),
    ],
)
def test_component_folders_hold_their_installed_packages(module: str, folder: str) -> None:
    imported = importlib.import_module(module)
    assert imported.__doc__
    assert imported.__file__ is not None
    path = Path(imported.__file__)
    # Editable install: the package folder inside the component folder; regular install: site-packages.
    assert path.parent == REPO_ROOT / folder / module or path.parent.parent.name == "site-packages"


@pytest.mark.parametrize("flags", [[], ["-S"]], ids=["installed", "bare"])
def test_stdlib_operator_is_not_shadowed_from_the_repo_root(flags: list[str]) -> None:
    # The folder operator/ holds the package neuronetes_operator and no __init__.py of its own, so
    # even a bare interpreter (-S: no site, no import hook) started in the repository root, with
    # the working directory first on sys.path, imports the standard library's `operator`.
    out = subprocess.run(
        [sys.executable, *flags, "-c", "import operator; print(operator.__file__)"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(out).parent == Path(sysconfig.get_paths()["stdlib"])
