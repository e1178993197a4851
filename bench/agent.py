"""The node agent's figures: discovery time, fleet publication time for N kwok nodes, memory per node.

1. Discovery: `SimulatedGpus` of a DGX A100 profile built and scanned (the inventory an agent
   publishes), median of 200 runs; the NVML backend needs a GPU and is not measured here.
2. Publication: one local control plane (`neuronetes.devcluster.DevCluster`, ``bench-agent-<pid>``)
   with ``--nodes`` kwok nodes (a mix of the GPU profiles), then one fleet agent (`AgentProcess`, in
   this process) serving all of them. Publication time is from the agent's start until every node
   has its GPUNode status (and labels and capacity, written before it); the API server is polled.
3. Kept published: the agent runs ``--hold`` more seconds with a ``--heartbeat`` period; then every
   GPUNode's ``lastHeartbeatTime`` must be younger than two periods. The agent's CPU use over that
   time is reported.
4. Memory per simulated node: this process's resident memory with all nodes served, minus before
   the agent started, divided by the node count.

The cluster is always torn down and purged.

    python bench/agent.py --nodes 1000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import config as kube_config

from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.procs import interrupt_on
from neuronetes.profiles import PROFILES
from neuronetes_agent.daemon.fleet import AgentProcess, AgentSettings
from neuronetes_agent.daemon.kube import GPUNODES_PATH, Kube, KubeError
from neuronetes_agent.daemon.simulated import SimulatedGpus

MIX = (("dgx-a100-80gb", 0.5), ("t4x4-pcie", 0.3), ("a100-40gb-mig", 0.2))
SELECTOR = ("neuronetes.io/bench", "agent")


def log(msg: str) -> None:
    print(f">> {msg}", file=sys.stderr, flush=True)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def discovery_ms(runs: int = 200) -> float:
    times = []
    for k in range(runs):
        t = time.perf_counter()
        SimulatedGpus(PROFILES["dgx-a100-80gb"], f"d{k}").scan()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def published(kube: Kube) -> dict[str, str]:
    """Node name -> lastHeartbeatTime of every GPUNode with a status."""
    for attempt in range(5):  # a saturated API server may time out a 1,000-object list
        try:
            items = kube.request("GET", GPUNODES_PATH, timeout=120).get("items") or ()
            break
        except KubeError as exc:
            log(f"listing GPUNodes failed ({exc}); again")
            time.sleep(2 * (attempt + 1))
    else:
        raise RuntimeError("the API server did not list the GPUNodes")
    return {
        i["metadata"]["name"]: i["status"]["lastHeartbeatTime"]
        for i in items
        if (i.get("status") or {}).get("lastHeartbeatTime")
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--heartbeat", type=float, default=60.0, help="GPUNode heartbeat period, s")
    p.add_argument("--hold", type=float, default=130.0, help="seconds to keep serving after publication")
    p.add_argument("--json", type=Path, help="write the figures here")
    ns = p.parse_args()

    interrupt_on(signal.SIGTERM)  # the cluster is still torn down (finally)
    result: dict[str, Any] = {"discovery_ms_8_gpus": round(discovery_ms(), 3), "nodes": ns.nodes}
    log(f"discovery of 8 simulated GPUs: {result['discovery_ms_8_gpus']} ms (median)")
    dev = DevCluster(f"bench-agent-{os.getpid()}", log=log)
    agent: AgentProcess | None = None
    thread: threading.Thread | None = None
    try:
        dev.up(controller_manager=False)
        t0 = time.monotonic()
        left = ns.nodes
        for k, (profile, share) in enumerate(MIX):
            count = left if k == len(MIX) - 1 else round(ns.nodes * share)
            left -= count
            for start in range(0, count, 250):
                dev.add_nodes(profile, min(250, count - start), f"ag-{profile}", labels=dict([SELECTOR]))
        log(f"{ns.nodes} kwok nodes Ready in {time.monotonic() - t0:.1f} s")
        api = kube_config.new_client_from_config(config_file=str(dev.kubeconfig))
        api.configuration.connection_pool_maxsize = 16
        kube = Kube(api)
        rss_before = rss_mib()
        agent = AgentProcess(
            api,
            AgentSettings(simulate_nodes=f"{SELECTOR[0]}={SELECTOR[1]}", heartbeat_s=ns.heartbeat),
        )
        started = time.monotonic()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        thread = threading.Thread(target=agent.run, name="fleet agent", daemon=True)
        thread.start()
        while len(published(kube)) < ns.nodes:
            if time.monotonic() - started > 600:
                raise RuntimeError(f"only {len(published(kube))} of {ns.nodes} nodes published after 600 s")
            time.sleep(0.5)
        result["publication_s"] = round(time.monotonic() - started, 2)
        result["rss_mib_per_node"] = round((rss_mib() - rss_before) / ns.nodes, 4)
        log(f"{ns.nodes} nodes published in {result['publication_s']} s")
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(ns.hold)
        cpu2 = resource.getrusage(resource.RUSAGE_SELF)
        beats = published(kube)
        now = datetime.now(UTC)
        ages = [
            (now - datetime.strptime(v, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)).total_seconds()
            for v in beats.values()
        ]
        result["kept_published"] = len(beats) == ns.nodes and max(ages) < 2 * ns.heartbeat
        result["max_heartbeat_age_s"] = round(max(ages), 1)
        result["median_heartbeat_age_s"] = round(statistics.median(ages), 1)
        result["publication_cpu_s"] = round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 2)
        steady = cpu2.ru_utime + cpu2.ru_stime - cpu1.ru_utime - cpu1.ru_stime
        result["steady_cpu_percent"] = round(100 * steady / ns.hold, 1)
        result["rss_mib_total"] = round(rss_mib(), 1)
        result["cpus"] = os.cpu_count()
        result["load_average_1m"] = round(os.getloadavg()[0], 1)  # the machine's, not the agent's
    finally:
        if agent is not None:
            agent.request_stop()
            if thread is not None:
                thread.join(timeout=30)
            agent.stop()
        dev.down()
        dev.purge()
    print(json.dumps(result, indent=2))
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result.get("kept_published") else 1


if __name__ == "__main__":
    raise SystemExit(main())
