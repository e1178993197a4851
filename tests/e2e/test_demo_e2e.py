"""The README's main job (`neuronetes demo`) on its own local cluster: every sample pod lands.

The demo runs kube-scheduler and the extender as host processes and reads what it prints from
the API: each placed pod's node and GPUs, the extender's placement Event (its message names the
node), and the Pending pod's FailedScheduling reason.
"""

from __future__ import annotations

import io
import os

import pytest
from e2e_cluster import ensure_toolchain

from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.demo import PLACED_REASON, UNFIT, run_demo, sample_pods

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
    lines = text.splitlines()
    assert "gang llm-train (4 x 2 GPUs, same-node): all on dgx-" in text
    names = [p["metadata"]["name"] for p in sample_pods()]
    for pod in names:
        (row,) = [k for k, line in enumerate(lines) if line.split()[:1] == [pod]]
        _, phase, node, *gpus = lines[row].split()
        why = lines[row + 1].split("why: ", 1)[1]
        if pod == UNFIT:
            assert (phase, node) == ("Pending", "-")
            assert "insufficient gpu memory on any GPU" in why
        else:
            assert phase == "Running" and gpus and "=GPU-" in gpus[0]
            # The extender's placement Event names the node; until it posts one, the demo says so.
            assert node in why or f"no {PLACED_REASON} Event" in why, why
