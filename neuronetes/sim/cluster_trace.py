"""A live cluster's GPU nodes and GPU pods as a trace in the simulator's CSV format (docs/cli.md
lists the mapping), so ``neuronetes simulate --from-cluster`` replays the user's own workload.

Pure: Kubernetes objects (the API's JSON) in, CSV rows out; `write_trace` writes the two files
that `neuronetes.sim.trace.load_nodes` and `load_pods` read back.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes import mig
from neuronetes.assignment import pod_gpu_request
from neuronetes.quantity import to_mib, to_milli

__all__ = ["NODE_COLUMNS", "POD_COLUMNS", "TraceRows", "node_rows", "pod_rows", "write_trace"]

NODE_COLUMNS: Final = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS: Final = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "pod_phase",
    "creation_time",
)
TERMINAL: Final = frozenset({"Succeeded", "Failed"})

TraceRows = list[dict[str, str]]


def _gpu_count(node: Mapping[str, Any], gpunode: Mapping[str, Any] | None) -> int:
    """GPUs the agent reports (GPUNode), else the node's gpu-count label, else its capacity."""
    if gpunode is not None:
        count = (gpunode.get("status") or {}).get("gpuCount")
        if isinstance(count, int) and count > 0:
            return count
    labels = (node.get("metadata") or {}).get("labels") or {}
    raw = labels.get(c.LABEL_GPU_COUNT) or ((node.get("status") or {}).get("capacity") or {}).get(
        c.RESOURCE_GPU
    )
    try:
        return max(0, int(str(raw))) if raw is not None else 0
    except ValueError:
        return 0


def node_rows(nodes: Iterable[Mapping[str, Any]], gpunodes: Iterable[Mapping[str, Any]]) -> TraceRows:
    """One row per node with GPUs: allocatable CPU and memory, GPU count and model (the
    ``neuronetes.io/gpu-type`` label the pods' selectors name, else the GPUNode's model)."""
    by_name = {str(g["metadata"]["name"]): g for g in gpunodes}
    rows = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(node["metadata"]["name"])
        gpunode = by_name.get(name)
        gpus = _gpu_count(node, gpunode)
        if gpus == 0:
            continue
        alloc = (node.get("status") or {}).get("allocatable") or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        model = labels.get(c.LABEL_GPU_TYPE) or ((gpunode or {}).get("status") or {}).get("model") or ""
        rows.append(
            {
                "sn": name,
                "cpu_milli": str(to_milli(alloc.get("cpu", 0))),
                "memory_mib": str(to_mib(alloc.get("memory", 0))),
                "gpu": str(gpus),
                "model": str(model),
            }
        )
    return rows


def _epoch(timestamp: str | None) -> str:
    if not timestamp:
        return ""
    try:
        return str(int(datetime.fromisoformat(timestamp).timestamp()))
    except ValueError:
        return ""


def pod_rows(pods: Iterable[Mapping[str, Any]]) -> TraceRows:
    """One row per live pod that asks for NeuroNetes GPUs, placed or Pending: its effective
    request (whole GPUs as ``gpu_milli`` 1000, a slice as its compute share, a MIG instance as
    one GPU's share of its profile's compute slices), and the GPU model its node selector pins it to."""
    rows = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if status.get("phase") in TERMINAL or meta.get("deletionTimestamp"):
            continue
        try:
            ask = pod_gpu_request(pod)
        except ValueError:
            continue  # refused by the webhook and the extender: not part of the workload
        if ask is None or ask.request.gpus == 0:
            continue
        r = ask.request
        milli = mig.compute_milli(r.mig_profile) if r.mig_profile is not None else r.gpu_milli
        pinned = (spec.get("nodeSelector") or {}).get(c.LABEL_GPU_TYPE, "")
        rows.append(
            {
                "name": f"{meta.get('namespace')}/{meta.get('name')}",
                "cpu_milli": str(r.cpu_milli),
                "memory_mib": str(r.memory_mib),
                "num_gpu": str(r.gpus),
                "gpu_milli": str(milli),
                "gpu_spec": pinned,
                "pod_phase": str(status.get("phase") or "Pending"),
                "creation_time": _epoch(meta.get("creationTimestamp")),
            }
        )
    return sorted(rows, key=lambda row: row["name"])


def write_trace(directory: Path, nodes: TraceRows, pods: TraceRows) -> tuple[Path, Path]:
    """``cluster_node_list.csv`` and ``cluster_pod_list.csv`` in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    out = (directory / "cluster_node_list.csv", directory / "cluster_pod_list.csv")
    for path, columns, rows in ((out[0], NODE_COLUMNS, nodes), (out[1], POD_COLUMNS, pods)):
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    return out
