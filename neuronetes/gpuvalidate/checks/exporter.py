"""Check "exporter": the agent's health loop and Prometheus exporter on the real GPU, against
``nvidia-smi`` read at the same moment.

A PyTorch loop keeps the GPU busy (so utilization, power and memory are not all idle values). The
agent's own `NodeAgent` runs on the NVML backend with its exporter served over HTTP on loopback; it
has no API server here, so its Kubernetes writes go to `OfflineKube`, which keeps them (the check
is about NVML → sample → metric). Three times, the check scrapes ``/metrics`` and reads
``nvidia-smi --query-gpu`` right after, and compares each per-GPU metric within its tolerance; the
ECC and XID families must be present under their documented names (docs/contracts.md "Metrics").
"""

from __future__ import annotations

import statistics
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from neuronetes import contracts as c

from ..context import MIB, Context
from ..model import Report

ROUNDS: Final = 3
QUERY: Final = (
    "uuid,utilization.gpu,memory.used,memory.free,memory.total,temperature.gpu,power.draw,"
    "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total"
)
# metric: (nvidia-smi field, scale to the metric's unit, absolute tolerance, relative tolerance)
COMPARED: Final[dict[str, tuple[str, float, float, float]]] = {
    c.METRIC_GPU_UTILIZATION: ("utilization.gpu", 1.0, 10.0, 0.0),
    c.METRIC_GPU_MEMORY_USED: ("memory.used", MIB, 64 * MIB, 0.0),
    c.METRIC_GPU_MEMORY_FREE: ("memory.free", MIB, 64 * MIB, 0.0),
    c.METRIC_GPU_MEMORY_TOTAL: ("memory.total", MIB, 1 * MIB, 0.0),
    c.METRIC_GPU_TEMPERATURE: ("temperature.gpu", 1.0, 3.0, 0.0),
    c.METRIC_GPU_POWER: ("power.draw", 1.0, 30.0, 0.25),
}


class OfflineKube:
    """The agent's Kubernetes writes, kept instead of sent (no API server in this check)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def ensure_gpunode(self, node: str, node_uid: str) -> dict[str, Any]:
        self.calls.append(("ensure_gpunode", node))
        return {"metadata": {"name": node, "generation": 1}, "spec": {}}

    def patch_gpunode_status(self, node: str, status: Mapping[str, Any]) -> None:
        self.calls.append(("gpunode_status", dict(status)))

    def patch_gpunode(self, node: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("gpunode", dict(patch)))
        return {"metadata": {"name": node}, "spec": {}}

    def patch_node_labels(self, node: str, labels: Mapping[str, str | None]) -> None:
        self.calls.append(("labels", dict(labels)))

    def patch_node_capacity(self, node: str, resources: Mapping[str, str]) -> None:
        self.calls.append(("capacity", dict(resources)))

    def node_event(self, node: str, node_uid: str, kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", (kind, reason, message)))

    def pod_event(
        self, namespace: str, name: str, uid: str, node: str, kind: str, reason: str, message: str
    ) -> None:
        self.calls.append(("pod_event", (f"{namespace}/{name}", kind, reason, message)))

    def evict(self, namespace: str, name: str) -> int:
        self.calls.append(("evict", f"{namespace}/{name}"))
        return 201


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """Samples by metric name, then by the sample's UUID label ("" without one)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.labels.get("UUID", "")
            if "type" in sample.labels:
                key += "/" + sample.labels["type"]
            out.setdefault(sample.name, {})[key] = float(sample.value)
        out.setdefault(family.name, out.get(family.name, {}))
    return out


def nvidia_smi() -> dict[str, dict[str, float | None]]:
    text = subprocess.run(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    names = QUERY.split(",")
    out: dict[str, dict[str, float | None]] = {}
    for line in text.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        row = dict(zip(names, values, strict=False))
        out[row["uuid"]] = {k: _number(v) for k, v in row.items() if k != "uuid"}
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def run(ctx: Context) -> Report:
    from neuronetes_agent.daemon.exporter import serve_metrics
    from neuronetes_agent.daemon.node import NodeAgent
    from neuronetes_agent.daemon.nvml import NvmlGpus, load_nvml

    report = Report()
    resets = ThreadPoolExecutor(1)
    agent = NodeAgent(
        "gpu-validate",
        "gpu-validate-uid",
        NvmlGpus(load_nvml()),
        OfflineKube(),
        resets,
        agent_version="gpu-validate",
    )
    rounds: list[dict[str, Any]] = []
    with ctx.background("compute_loop", ["matmul", "--seconds", "40"], ctx.env(), name="load"):
        time.sleep(8)  # the load is up (import, warm-up) and the GPU's averages have caught up
        agent.start()
        port = serve_metrics(lambda: [agent], 0)
        for _ in range(ROUNDS):
            agent.tick()
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            smi = nvidia_smi()
            rounds.append({"metrics": parse_metrics(text), "smi": smi})
            time.sleep(1.0)
    resets.shutdown()
    agent.backend.close()
    compare(report, rounds)
    return report


def compare(report: Report, rounds: list[dict[str, Any]]) -> None:
    """Each compared metric of each GPU: the median difference over the rounds within tolerance."""
    first = rounds[0]
    for name in (
        c.METRIC_GPU_XID_ERRORS.removesuffix("_total"),
        c.METRIC_GPU_ECC_ERRORS.removesuffix("_total"),
        c.METRIC_GPU_LAST_XID,
        c.METRIC_GPU_HEALTH,
    ):
        present = name in first["metrics"] or f"{name}_total" in first["metrics"]
        report.check(f"present.{name}", present, "exported" if present else "missing from /metrics")
    for uuid in first["smi"]:
        for metric, (field, scale, abs_tol, rel_tol) in COMPARED.items():
            id = f"{metric.removeprefix('neuronetes_gpu_')}[{uuid[:12]}]"
            diffs, pairs = [], []
            for r in rounds:
                ours = r["metrics"].get(metric, {}).get(uuid)
                theirs = r["smi"].get(uuid, {}).get(field)
                if ours is not None and theirs is not None:
                    diffs.append(abs(ours - theirs * scale))
                    pairs.append((ours, theirs * scale))
            if not pairs:
                report.check(id, False, f"no value to compare (nvidia-smi {field})")
                continue
            diff = statistics.median(diffs)
            theirs_median = statistics.median(p[1] for p in pairs)
            tolerance = max(abs_tol, rel_tol * abs(theirs_median))
            report.check(
                id,
                diff <= tolerance,
                f"median |agent − nvidia-smi| {diff:.4g} (tolerance {tolerance:.4g})",
                agent_vs_smi=[(round(a, 2), round(b, 2)) for a, b in pairs],
            )
        ecc_ok = True
        for kind, field in (
            ("corrected", "ecc.errors.corrected.volatile.total"),
            ("uncorrected", "ecc.errors.uncorrected.volatile.total"),
        ):
            ours = first["metrics"].get(c.METRIC_GPU_ECC_ERRORS, {}).get(f"{uuid}/{kind}")
            theirs = first["smi"].get(uuid, {}).get(field)
            ecc_ok = ecc_ok and (ours == theirs or (theirs is None and ours is None))
        report.check(
            f"ecc_errors[{uuid[:12]}]",
            ecc_ok,
            "volatile ECC counts equal nvidia-smi's" if ecc_ok else "ECC counts differ from nvidia-smi's",
        )
