"""Placement quality on the real openb trace: our baselines reproduce the FGD paper, ours beats it.

Runs three seeds (the full ten-seed figures are in bench/README.md); the bands are loose enough
for three seeds and tight enough to catch a broken scorer or protocol.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import pytest

from neuronetes.model import NodeSpec, PodRequest
from neuronetes.sim.report import load_expected, paper_median_unallocated
from neuronetes.sim.simulate import simulate
from neuronetes.sim.trace import load_nodes, load_pods

pytestmark = [pytest.mark.unit, pytest.mark.slow]

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
TRACE = Path(os.environ.get("NEURONETES_TRACE_DIR", SHARED / "openb" / "csv"))
FGD_DIR = Path(os.environ.get("NEURONETES_FGD_DIR", SHARED / "fgd-expected"))
SEEDS = (42, 43, 44)


@pytest.fixture(scope="module")
def trace() -> tuple[list[NodeSpec], list[PodRequest]]:
    if not (TRACE / "openb_pod_list_default.csv").exists():
        if os.environ.get("CI"):
            pytest.fail(f"openb trace not found at {TRACE}")
        pytest.skip("openb trace not available")
    return load_nodes(TRACE / "openb_node_list_gpu_node.csv"), load_pods(TRACE / "openb_pod_list_default.csv")


def _median_unallocated(trace: tuple[list[NodeSpec], list[PodRequest]], policy: str) -> float:
    nodes, pods = trace
    return statistics.median(simulate(nodes, pods, policy, s).unallocated(100) for s in SEEDS)


@pytest.mark.parametrize("policy", ["fgd", "bestfit"])
def test_baseline_reproduces_paper(trace: tuple[list[NodeSpec], list[PodRequest]], policy: str) -> None:
    paper = paper_median_unallocated(load_expected(FGD_DIR, "openb_pod_list_default"), policy, 100)
    assert paper is not None
    ours = _median_unallocated(trace, policy)
    assert abs(ours - paper) < 0.75, f"{policy}: ours {ours:.2f} vs paper {paper:.2f}"


def test_default_beats_fgd(trace: tuple[list[NodeSpec], list[PodRequest]]) -> None:
    assert _median_unallocated(trace, "default") < _median_unallocated(trace, "fgd")
