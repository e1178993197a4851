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
    assert "agentpool chat-pool: Ready, 2/2 ready, 2 GPUs" in text  # the operator's status, from the API
    assert "gpuslice chat-slice: Bound on " in text and "(10240 MiB, 30 %, Guaranteed)" in text
    (slice_line,) = [line for line in lines if line.startswith("gpuslice chat-slice")]
    (user_line,) = [line for line in lines if line.startswith("pod chat-slice-user")]
    node, uuid = slice_line.split()[4:6]
    assert f"Running on {node} {uuid}, limits gpu-memory=10240 gpu-compute=30" in user_line
    assert f"no {PLACED_REASON} Event" not in text
    assert "(one nvlink group (nvlink group 0))" in text  # the NVLink pod and the gang members
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
            # Read from the extender's placement Event: node, GPUs, why, the score terms.
            assert why.startswith(f"node {node}, gpus ") and "; " in why, why
