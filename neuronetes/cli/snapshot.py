"""``neuronetes simulate --from-cluster``: the cluster's GPU nodes and pods as a trace, and what
each policy would leave unallocated on them."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from neuronetes.model import NodeSpec, PodRequest
from neuronetes.sim.cluster_trace import node_rows, pod_rows, write_trace
from neuronetes.sim.simulate import RunResult
from neuronetes.sim.trace import load_nodes, load_pods

from .kube import Cluster
from .output import CliError, emit

__all__ = ["print_savings", "snapshot_trace"]

OURS: Final = "default"  # NeuroNetes' own policy, the one the extender runs
POINT: Final = 100  # arrived GPU requests at 100 % of capacity


def snapshot_trace(
    kubeconfig: str | None, save_to: str | None
) -> tuple[str, list[NodeSpec], list[PodRequest]]:
    """Read the cluster, write its trace (to `save_to`, else a temporary folder) and load it back
    exactly as ``simulate --nodes --pods`` would."""
    cluster = Cluster(kubeconfig)
    nodes = node_rows(cluster.nodes(), cluster.gpunodes())
    pods = pod_rows(cluster.pods())
    if not nodes:
        raise CliError(f"the cluster at {cluster.server} has no GPU nodes: nothing to replay")
    if not pods:
        raise CliError(
            f"the cluster at {cluster.server} has no pods asking for NeuroNetes GPUs: nothing to replay"
        )
    with tempfile.TemporaryDirectory(prefix="neuronetes-trace-") as scratch:
        node_csv, pod_csv = write_trace(Path(save_to or scratch), nodes, pods)
        return "cluster", load_nodes(node_csv), load_pods(pod_csv)


def print_savings(results: Mapping[str, Sequence[RunResult]], total_gpus: int) -> None:
    """Per policy: GPUs left unallocated at 100 % arrived (median over seeds), and how many of
    them NeuroNetes' own policy would put to use instead."""
    unallocated = {p: statistics.median(r.unallocated(POINT) for r in runs) for p, runs in results.items()}
    ours = unallocated.get(OURS)
    rows = []
    for policy, pct in sorted(unallocated.items(), key=lambda kv: kv[1]):
        gpus = pct / 100 * total_gpus
        saves = "-" if ours is None or policy == OURS else f"{(pct - ours) / 100 * total_gpus:+.1f}"
        rows.append([policy, f"{pct:.2f}", f"{gpus:.1f} of {total_gpus}", saves])
    emit(
        "table",
        None,
        title=f"On this cluster, with requests arriving up to {POINT}% of its GPUs:",
        columns=["POLICY", "UNALLOCATED %", "UNALLOCATED GPUS", f"GPUS SAVED BY {OURS.upper()}"],
        rows=rows,
    )
