"""Seconds from applying AgentPools to all their pods bound, through the operator, webhook and extender.

One local control plane (``bench-operator-<pid>``) with ``--nodes`` simulated DGX A100 nodes,
the extender behind kube-scheduler, the operator and two webhook replicas as host processes
(`neuronetes.devcluster.localstack.LocalStack`). Two scenarios, each in its own namespace:

1. one AgentPool of ``--replicas`` single-GPU replicas (goal: 64 bound in ≤ 10 s);
2. ``--gangs`` pools with gang scheduling, ``--gang-size`` single-GPU members each, ``same-node``
   (goal: 8 × 8 bound in ≤ 20 s).

The clock starts when ``kubectl apply`` returns; a poll of the API (every 0.1 s) notes when every
pod of the scenario exists (the operator's and the webhook's share) and when every one has
``spec.nodeName`` (bound by kube-scheduler and the extender). The cluster is torn down and purged.

    python bench/operator_pools.py --nodes 1000 --json OUT
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from e2e_throughput import start_extender
from kube_bench import Api, wait_usable

from neuronetes.devcluster import DevCluster, ExtenderConfig
from neuronetes.devcluster.localstack import LocalStack
from neuronetes.devcluster.procs import interrupt_on
from neuronetes_operator.pods import LABEL_POOL


def log(msg: str) -> None:
    print(f">> {msg}", file=sys.stderr, flush=True)


def pool_yaml(name: str, replicas: int, gang: int = 0) -> str:
    text = f"apiVersion: neuronetes.io/v1alpha1\nkind: AgentPool\nmetadata:\n  name: {name}\nspec:\n"
    text += f"  minReplicas: {replicas}\n  gpuRequirements:\n    count: 1\n"
    if gang:
        text += "    topology:\n      locality: same-node\n"
        text += f"  scheduling:\n    gangScheduling:\n      enabled: true\n      minMembers: {gang}\n"
    return text


def count_pods(dev: DevCluster, namespace: str, pools: list[str]) -> tuple[int, int]:
    """The scenario's pods: (existing, bound)."""
    selector = f"{LABEL_POOL} in ({','.join(pools)})"
    out = dev.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    return len(live), sum(1 for p in live if p["spec"].get("nodeName"))


def scenario(
    dev: DevCluster, namespace: str, pools: dict[str, str], pods: int, timeout: float
) -> tuple[float, float]:
    """Apply `pools` (name → YAML) at once; seconds until their `pods` pods exist, and are bound."""
    dev.kubectl("create", "namespace", namespace)
    text = "---\n".join(pools.values())
    dev.kubectl("apply", "-n", namespace, "-f", "-", input=text)
    t0 = time.monotonic()
    created: float | None = None
    while True:
        exist, done = count_pods(dev, namespace, list(pools))
        elapsed = time.monotonic() - t0
        if created is None and exist >= pods:
            created = elapsed
        if done >= pods:
            return (created if created is not None else elapsed), elapsed
        if elapsed > timeout:
            raise RuntimeError(f"{namespace}: {done}/{pods} pods bound after {timeout:.0f} s")
        time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000, help="simulated DGX A100 nodes (default 1000)")
    ap.add_argument("--replicas", type=int, default=64, help="scenario 1: single-GPU replicas (default 64)")
    ap.add_argument("--gangs", type=int, default=8, help="scenario 2: gang pools (default 8)")
    ap.add_argument("--gang-size", type=int, default=8, help="scenario 2: members per gang (default 8)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a scenario may take")
    ap.add_argument("--json", type=Path, help="write the results here")
    ns = ap.parse_args()

    interrupt_on(signal.SIGTERM)  # the cluster is still torn down (finally)
    dev = DevCluster(f"bench-operator-{os.getpid()}", log=log)
    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    ext = None
    stack = None
    try:
        log(f"cluster up in {dev.up():.1f} s")
        for start in range(0, ns.nodes, 250):
            dev.add_nodes("dgx-a100-80gb", min(250, ns.nodes - start), "gpu")
        api = Api(dev)
        wait_usable(api, ns.nodes, 600, lift=True, workers=8)
        ext = start_extender(dev.kubeconfig, workdir, None, ns.nodes)
        dev.set_extender(ExtenderConfig(url=ext.url, weight=20))
        stack = LocalStack(dev.kubeconfig, workdir, dev.kubectl)
        stack.start()
        log(f"{ns.nodes} nodes, extender, operator and two webhook replicas ready")
        single_made, single = scenario(
            dev, "bench-single", {"single": pool_yaml("single", ns.replicas)}, ns.replicas, ns.timeout
        )
        log(f"{ns.replicas} single-GPU replicas created in {single_made:.2f} s, bound in {single:.2f} s")
        gangs = {f"gang-{i}": pool_yaml(f"gang-{i}", ns.gang_size, ns.gang_size) for i in range(ns.gangs)}
        gang_made, gang = scenario(dev, "bench-gangs", gangs, ns.gangs * ns.gang_size, ns.timeout)
        log(f"{ns.gangs} gangs of {ns.gang_size} created in {gang_made:.2f} s, bound in {gang:.2f} s")
        result = {
            "nodes": ns.nodes,
            "single_replicas": ns.replicas,
            "single_seconds_to_created": round(single_made, 2),
            "single_seconds_to_bound": round(single, 2),
            "gangs": ns.gangs,
            "gang_size": ns.gang_size,
            "gangs_seconds_to_created": round(gang_made, 2),
            "gangs_seconds_to_bound": round(gang, 2),
            "cpus": os.cpu_count(),
        }
    finally:
        if stack is not None:
            stack.stop()
        if ext is not None:
            ext.stop()
        dev.down()
        dev.purge()
    print(json.dumps(result, indent=2))
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
