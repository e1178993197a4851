"""A real node's figures: pod create → Running with and without the NRI plugin, and the agent at rest.

One chart-mode dev cluster with one real node (kubelet + containerd + runc, `neuronetes dev cluster
up --real-nodes 1`), the chart installed with ``hack/real-node-values.yaml`` (the agent DaemonSet
and its NRI plugin as real containers from ``hack/build-image.sh``'s image). Then:

- **Agent at rest**: with no GPU pod on the node, the agent pod's two containers over
  ``--rest`` seconds: resident memory (``VmRSS`` of the agent's and the plugin's processes, and
  the pod cgroup's working set: ``memory.usage_in_bytes`` − ``total_inactive_file``) and CPU
  (``utime + stime`` of each process over the window, as a share of one core).
- **Pod create → Running**: ``--pods`` plain pods (the node's busybox image, ``sleep``), one at a
  time, each from ``kubectl create`` (the POST) until the API server shows it Running (polled
  every 20 ms), pinned to the real node by node name so no scheduler is timed; each is deleted
  before the next. First with the NRI plugin (every container creation passes through it: a pod
  without an assignment is looked up in the API server once, docs/node-injection.md), then after
  ``helm upgrade --set agent.nri.enabled=false`` (the plugin gone, containerd calls no plugin).
  The ratio of the two is the plugin's cost on a pod's start.

Needs what the real-node e2e tests need (root, runc, the image; `neuronetes.devcluster.realnodes`).

    python bench/real_node.py [--pods 50] [--rest 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.api import ApiError
from neuronetes.devcluster.chartmode import LOCAL_VALUES, ChartOps, ChartRelease
from neuronetes.devcluster.components import REAL_NODE_LABEL
from neuronetes.devcluster.nodeview import node_processes
from neuronetes.devcluster.realchart import REAL_NODE_VALUES
from neuronetes.devcluster.realnodes import BUSYBOX_IMAGE

NAME = "bench-real-node"
NODE = "real-0"
NAMESPACE = "bench-pods"
RELEASE = ChartRelease(values=(LOCAL_VALUES, REAL_NODE_VALUES))
TICKS = os.sysconf("SC_CLK_TCK")


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def create_to_running(dev: DevCluster, count: int, label: str) -> dict[str, float]:
    """Seconds from each pod's POST to the API server showing it Running, one pod at a time."""
    api = dev.api()
    base = f"/api/v1/namespaces/{NAMESPACE}/pods"
    seconds: list[float] = []
    for i in range(count):
        name = f"{label}-{i}"
        t0 = time.perf_counter()
        api.request("POST", base, _pod(name))
        while True:
            status = api.request("GET", f"{base}/{name}").get("status", {})
            if status.get("phase") == "Running":
                break
            if time.perf_counter() - t0 > 120:
                raise SystemExit(f"pod {name} not Running after 120 s: {json.dumps(status)[:400]}")
            time.sleep(0.02)
        seconds.append(time.perf_counter() - t0)
        api.request("DELETE", f"{base}/{name}", {"gracePeriodSeconds": 0})
        while True:  # gone before the next one: each pod starts on a quiet node
            try:
                api.request("GET", f"{base}/{name}")
            except ApiError:  # 404: gone
                break
            time.sleep(0.05)
        print(f"\r{label}: {i + 1}/{count} pods", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {
        "pods": count,
        "p50_s": round(statistics.median(seconds), 3),
        "p99_s": round(_percentile(seconds, 0.99), 3),
        "min_s": round(min(seconds), 3),
        "max_s": round(max(seconds), 3),
    }


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pod_working_set_mib(dev: DevCluster, uid: str) -> float | None:
    """The agent pod's cgroup (v1 memory hierarchy, or v2): usage minus inactive file pages."""
    for top in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")):
        found = list(top.glob(f"neuronetes/{dev.name}/{NODE}/kubepods/**/pod{uid}"))
        if not found:
            continue
        d = found[0]
        stat = dict(line.split() for line in (d / "memory.stat").read_text().splitlines())
        if (d / "memory.usage_in_bytes").exists():
            usage = int((d / "memory.usage_in_bytes").read_text())
            inactive = int(stat.get("total_inactive_file", 0))
        else:
            usage = int((d / "memory.current").read_text())
            inactive = int(stat.get("inactive_file", 0))
        return round((usage - inactive) / 2**20, 1)
    return None


def agent_at_rest(dev: DevCluster, seconds: float) -> dict[str, Any]:
    pods = json.loads(
        dev.kubectl(
            "get", "pods", "-n", RELEASE.namespace, "-l", "app.kubernetes.io/component=agent", "-o", "json"
        ).stdout
    )["items"]
    uid = next(p["metadata"]["uid"] for p in pods if p["spec"].get("nodeName") == NODE)
    procs = {
        "agent": node_processes(dev.state_dir, NODE, f"agent run --node={NODE}"),
        "nri-plugin": node_processes(dev.state_dir, NODE, f"neuronetes-nri --node-name={NODE}"),
    }
    before = {k: sum(_cpu_ticks(p) for p in v) for k, v in procs.items()}
    time.sleep(seconds)
    out: dict[str, Any] = {"window_s": seconds}
    for k, pids in procs.items():
        cpu = (sum(_cpu_ticks(p) for p in pids) - before[k]) / TICKS / seconds
        out[k] = {
            "rss_mib": round(sum(_rss_mib(p) for p in pids), 1),
            "cpu_percent_of_a_core": round(100 * cpu, 2),
        }
    out["pod_working_set_mib"] = _pod_working_set_mib(dev, uid)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=50)
    ap.add_argument("--rest", type=float, default=30.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    dev = DevCluster(NAME)
    dev.down()
    t0 = time.monotonic()
    try:
        dev.up(chart=RELEASE, install_chart=False, real_nodes=1, timeout_s=240.0)
        ops = ChartOps(dev)
        ops.install(timeout_s=240.0)
        print(f"cluster with a real node and the chart up in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        dev.kubectl("create", "namespace", NAMESPACE)
        result: dict[str, Any] = {"agent_at_rest": agent_at_rest(dev, args.rest)}
        result["with_nri_plugin"] = create_to_running(dev, args.pods, "nri")
        ops.upgrade("--set", "agent.nri.enabled=false", timeout_s=240.0)
        result["without_nri_plugin"] = create_to_running(dev, args.pods, "plain")
        w, wo = result["with_nri_plugin"], result["without_nri_plugin"]
        result["ratio_p50"] = round(w["p50_s"] / wo["p50_s"], 3)
        result["ratio_p99"] = round(w["p99_s"] / wo["p99_s"], 3)
    except (urllib.error.URLError, OSError) as exc:
        raise SystemExit(f"bench/real_node.py: {exc}") from None
    finally:
        dev.down()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
