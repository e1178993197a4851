"""The Grafana dashboard and the alert rules against a real Prometheus scraping the e2e components.

A cluster of its own runs the extender beside kube-scheduler and the node agent in fleet mode
(as `neuronetes demo` does; the operator is not started: its autoscaling panels are checked by
tests/e2e/test_autoscaling_e2e.py, whose Prometheus scrapes it). One pod is
placed, a gang that cannot fit waits past its 1-second timeout, a GPU reports an XID and is taken
offline. Then every expression of the dashboard and the rules evaluates without error through the HTTP API,
the important panels return series, every rule Prometheus loads is healthy, and the alerts for
the XID, the offline GPU and the late gang go active.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import own_cluster, wait_until
from e2e_prometheus import PrometheusError, PrometheusServer, needs_prometheus
from observability import RULES, Query, all_queries
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes.cli import main as cli
from neuronetes.devcluster import DevCluster

pytestmark = [pytest.mark.e2e, needs_prometheus]

DGX = "dgx-a100-80gb"
T4 = "t4x4-pcie"

# Panels whose every query must return series once a pod is placed, a gang waits and a GPU
# reported an XID (slice panels stay empty: simulated nodes have no shim regions).
IMPORTANT_PANELS = (
    "GPUs",
    "Allocated",
    "Allocation",
    "Fragmented",
    "Pending GPU pods",
    "Pending gangs",
    "GPU allocation over time",
    "Pending pods and gangs",
    "GPU health states",
    "Extender latency p50 / p99 by verb",
    "Attempts and binds",
    "Cache freshness",
    "GPU utilization",
    "GPU memory used",
    "GPU temperature",
    "XID errors",
)
ACTIVE_ALERTS = ("NeuroNetesGPUXidError", "NeuroNetesGPUOffline", "NeuroNetesGangPendingPastTimeout")


@pytest.fixture(scope="module")
def observed(request: pytest.FixtureRequest) -> Iterator[tuple[DevCluster, dict[str, str]]]:
    with own_cluster(request, f"obs-e2e-{os.getpid()}", run_extender=True, run_agent=True) as dev:
        nodes = {p: dev.add_nodes(p, 1, f"obs-{p}")[0] for p in (DGX, T4)}
        yield dev, nodes


def _apply(dev: DevCluster, *pods: dict[str, object]) -> None:
    dev.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(pods)})
    )


def _gang_member(i: int) -> dict[str, object]:
    return manifest(
        f"late-gang-{i}",
        {c.RESOURCE_GPU: 8},
        labels={c.LABEL_GANG: "late", c.LABEL_GANG_SIZE: "3"},
        annotations={c.ANNOTATION_GANG_TIMEOUT: "1"},
    )


def _evaluates(prom: PrometheusServer, q: Query) -> list[dict[str, object]]:
    try:
        return prom.query(q.expr)
    except PrometheusError as exc:
        pytest.fail(f"{q.where}: {exc}", pytrace=False)


def test_every_dashboard_and_alert_expression_evaluates(
    observed: tuple[DevCluster, dict[str, str]], tmp_path: Path
) -> None:
    dev, nodes = observed
    ports = dev.store.running().ports
    targets = {
        "extender": [f"127.0.0.1:{ports['extender']}"],
        "agent": [f"127.0.0.1:{ports['agent_metrics']}"],
    }
    # A 1-GPU pod lands; a 3 × 8-GPU gang fits nowhere (one 8-GPU node) and waits past its timeout.
    # The placed pod goes to the DGX, so every T4 GPU stays free for the operator's `offline`.
    placed_pod = manifest("placed", {c.RESOURCE_GPU: 1}, node_selector={"kubernetes.io/hostname": nodes[DGX]})
    _apply(dev, placed_pod, *(_gang_member(i) for i in range(3)))

    def placed() -> bool:
        pod = json.loads(dev.kubectl("get", "pod", "placed", "-o", "json").stdout)
        return bool(pod["spec"].get("nodeName"))

    wait_until(placed, timeout=60, what="pod placed by the extender")
    gpu = c.simulated_gpu_uuid(nodes[T4], 3)

    def published() -> bool:
        found = dev.kubectl("get", "gpunode", nodes[T4], "-o", "json", check=False)
        return found.returncode == 0 and gpu in found.stdout

    wait_until(published, timeout=60, what="the T4 node's GPUNode published by the agent")
    kubeconfig = ["--kubeconfig", str(dev.kubeconfig)]
    # An application XID (counted, changes nothing), then an operator takes the GPU offline.
    assert cli(["dev", "inject-xid", "--gpu-id", gpu, "--xid", "13", *kubeconfig]) == 0
    assert cli(["offline", "--gpu-id", gpu, *kubeconfig]) == 0

    with PrometheusServer(tmp_path, targets, rule_files=[RULES]) as prom:
        wait_until(prom.ready, timeout=60, what="Prometheus ready")
        wait_until(
            lambda: set(prom.targets_up().values()) == {"up"} and len(prom.targets_up()) == 2,
            timeout=60,
            what="both components scraped",
        )
        queries = all_queries()
        important = [q for q in queries if q.panel in IMPORTANT_PANELS]
        assert {q.panel for q in important} == set(IMPORTANT_PANELS)
        deadline = time.monotonic() + 90
        while empty := [q.where for q in important if not _evaluates(prom, q)]:
            assert time.monotonic() < deadline, f"no series after 90 s for {empty}"
            time.sleep(1.0)
        for q in queries:
            _evaluates(prom, q)  # no error, series or not

        def alert_states() -> dict[str, str]:
            rules = prom.rules()
            bad = {r["name"]: r.get("lastError", "") for r in rules if r["health"] == "err"}
            assert bad == {}, bad
            return {r["name"]: r.get("state", "") for r in rules if r["type"] == "alerting"}

        deadline = time.monotonic() + 60
        while any((state := alert_states()).get(a) not in ("pending", "firing") for a in ACTIVE_ALERTS):
            assert time.monotonic() < deadline, f"alerts not active after 60 s: {state}"
            time.sleep(1.0)
        assert set(state) == {q.where.split(" ", 1)[1] for q in queries if q.where.startswith("alert ")}
        assert all(r["health"] == "ok" for r in prom.rules())

        def gpus() -> tuple[float, ...]:
            names = (c.METRIC_GPUS_ALLOCATED, c.METRIC_GPUS_UNALLOCATED, c.METRIC_GPUS_FRAGMENTED)
            return tuple(float(prom.query(f"max({n})")[0]["value"][1]) for n in names)

        # 1 GPU placed; 7 DGX GPUs and 3 T4s free (the 4th is offline), and the pending 8-GPU
        # shape fits on no node: all 10 are fragment.
        deadline = time.monotonic() + 30
        while (now := gpus()) != (1.0, 10.0, 10.0):
            assert time.monotonic() < deadline, f"allocated, unallocated, fragmented GPUs: {now}"
            time.sleep(1.0)
