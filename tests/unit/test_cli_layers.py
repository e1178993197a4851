"""The CLI sits on top of the components and imports each inside the command that runs it, so its
start-up (``neuronetes --help``) loads none of them. The layers themselves are `lint-imports`'s
contracts (pyproject.toml, [tool.importlinter]; hack/test.sh runs it after mypy)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_LOADED = """
import json, sys
from neuronetes.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def test_help_loads_no_component_no_dev_cluster_and_no_kubernetes_client() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _LOADED], capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    loaded = json.loads(out.splitlines()[-1])
    heavy: tuple[str, ...] = ("neuronetes_", "neuronetes.devcluster", "neuronetes.gpuvalidate")
    heavy += ("kubernetes", "kopf", "fastapi")
    assert [m for m in loaded if m.startswith(heavy)] == []
