"""The README's "Install with Helm" section works as written on the local control plane.

The section's bash block runs unchanged (``bash -euo pipefail``) from the checkout's root, with its
own cluster state folder (``$NEURONETES_CACHE_DIR``, so the block's ``dev`` cluster is not a
developer's) and the pinned binaries where the README says they are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_cluster import ensure_toolchain

from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.tools import REPO_ROOT, bin_root

pytestmark = pytest.mark.e2e


def install_block() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("\n## Install with Helm\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_the_install_section_runs_as_written(tmp_path: Path) -> None:
    ensure_toolchain()
    block = install_block()
    assert "helm install neuronetes helm/neuronetes" in block and "helm uninstall" in block
    cache = tmp_path / "cache"
    env = {
        **os.environ,
        "NEURONETES_CACHE_DIR": str(cache),
        "NEURONETES_BIN_DIR": str(bin_root()),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    env.pop("KUBECONFIG", None)
    if bin_root() != Path.home() / ".cache" / "neuronetes" / "bin":
        pytest.skip("the README's block reads the pinned binaries from ~/.cache/neuronetes/bin")
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        DevCluster("dev", state_root=cache / "clusters").down()
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "agentpool.neuronetes.io/sample condition met" in done.stdout
    assert 'release "neuronetes" uninstalled' in done.stdout
    assert DevCluster("dev", state_root=cache / "clusters").leftover_processes() == []
