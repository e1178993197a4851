"""The README's main job (`neuronetes demo`) on its own local cluster: every sample pod lands."""

from __future__ import annotations

import io
import os

import pytest
from e2e_cluster import ensure_toolchain

from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.demo import run_demo

pytestmark = pytest.mark.e2e


def test_demo_places_every_sample_pod_and_explains_why() -> None:
    ensure_toolchain()
    name = f"demo-e2e-{os.getpid()}"
    out = io.StringIO()
    try:
        assert run_demo(name=name, timeout=120, out=out) == 0, out.getvalue()
    finally:
        assert DevCluster(name).leftover_processes() == []
    text = out.getvalue()
    assert "gang llm-train (4 x 2 GPUs, same-node): all on dgx-" in text
    assert "why: one nvlink group" in text  # the NVLink pod and the gang members
    assert "insufficient gpu memory on any GPU" in text  # the pod that fits nowhere
    assert text.count("Running") == 11 and text.count("Pending") == 1
