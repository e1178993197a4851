"""HTTP latency and throughput of the scheduler extender, with its GPU cache pre-filled.

For each cluster size N the extender app runs under uvicorn (one worker) in a separate process
on a loopback port. Its cache holds N 8-GPU nodes (DGX A100 80GB and DGX H100 dev-cluster
profiles, alternating) and bound pods holding ~40 % of the GPUs (whole 1/2/4/8-GPU pods and
GPUs shared by two pods), each with its ``assigned-gpus`` annotation, as the watch would deliver
them. No API server is involved: the child process fills the cache through `GpuCache`'s own
``replace_nodes``/``replace_pods`` and marks it synced.

This process is the client: one keep-alive HTTP connection, ``nodeCacheCapable`` bodies (the
pod and all N node names), a mix of pod shapes (1, 2, 4 and 8 whole GPUs; shared 0.25, 0.5 and
0.8 of a GPU with memory; CPU-only pods never reach the extender). It measures, after a
warm-up, the p50/p99 of filter and of prioritize, the HTTP floor (``GET /healthz`` on the same
server and connection), and sustained filter requests/s back to back for ~5 s.

Filter holds a pod's GPUs for the assume TTL and replaces any earlier hold of the same pod, so
the requests cycle through a fixed pool of pending pods (as kube-scheduler retries pods): the
holds never exceed the pool, and capacity cannot run out (every filter answer must name a node;
the run fails otherwise).

    .venv/bin/python bench/extender.py [--nodes 100,1000,5000] [--requests 500] [--json OUT]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from neuronetes import contracts as c
from neuronetes.profiles import PROFILES, node_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from extender_harness import free_port, terminate
from pod_builder import manifest, served

NODE_PROFILES = ("dgx-a100-80gb", "dgx-h100")
GPUS_PER_NODE = 8
HOST = "127.0.0.1"

# (name, whole GPUs, shared compute %, shared memory MiB, weight) of the pods sent to the extender.
SHAPES: tuple[tuple[str, int, int, int, float], ...] = (
    ("1gpu", 1, 0, 0, 0.30),
    ("2gpu", 2, 0, 0, 0.12),
    ("4gpu", 4, 0, 0, 0.08),
    ("8gpu", 8, 0, 0, 0.05),
    ("0.25gpu", 0, 25, 8192, 0.15),
    ("0.5gpu", 0, 50, 20480, 0.15),
    ("0.8gpu", 0, 80, 40960, 0.15),
)


# ---- the cluster (built in the server process) -----------------------------------------------------


def node_name(i: int) -> str:
    return f"bench-{i:05d}"


def pod_object(name: str, uid: str, limits: dict[str, int], node: str = "") -> dict[str, Any]:
    pod = manifest(name, limits, namespace="bench", labels={"app": "bench"}, node=node)
    return served(pod, uid=uid, resource_version="1")


def _bound(name: str, node: str, limits: dict[str, int], gpus: list[tuple[int, int, int]]) -> dict[str, Any]:
    """A running pod on `node` holding `gpus` (index, memory MiB, compute %), with its assignment."""
    pod = pod_object(name, f"uid-{name}", limits, node)
    doc = {
        "version": 1,
        "node": node,
        "containers": {
            "main": {
                "gpus": [
                    {
                        "uuid": c.simulated_gpu_uuid(node, j),
                        "index": j,
                        "memoryMiB": mem,
                        "computePercent": compute,
                    }
                    for j, mem, compute in gpus
                ],
                "priority": 0,
                "qos": "Guaranteed",
            }
        },
    }
    pod["metadata"]["annotations"] = {c.ANNOTATION_ASSIGNED_GPUS: json.dumps(doc)}
    return pod


def cluster(n: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`n` node objects and the bound pods holding ~40 % of their GPUs."""
    rng = random.Random(seed)
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for i in range(n):
        name = node_name(i)
        prof = PROFILES[NODE_PROFILES[i % len(NODE_PROFILES)]]
        nodes.append(node_manifest(prof.node_spec(name)))
        mem = prof.gpu_memory_mib
        # One 8-GPU job on some nodes, else 0-6 GPUs in use.
        used = GPUS_PER_NODE if rng.random() < 0.12 else rng.choice((0, 1, 2, 3, 4, 5, 6))
        j = 0
        while j < used:
            left = used - j
            if left == GPUS_PER_NODE:
                k = GPUS_PER_NODE
            elif rng.random() < 0.3:  # a GPU shared by two pods
                for s in range(2):
                    share = {c.RESOURCE_GPU_MEMORY: mem // 4, c.RESOURCE_GPU_COMPUTE: 40}
                    pods.append(_bound(f"{name}-s{j}-{s}", name, share, [(j, mem // 4, 40)]))
                j += 1
                continue
            else:
                k = rng.choice([w for w in (1, 2, 4) if w <= left])
            gpus = [(x, mem, 100) for x in range(j, j + k)]
            pods.append(_bound(f"{name}-w{j}", name, {c.RESOURCE_GPU: k}, gpus))
            j += k
    return nodes, pods


def serve(port: int, n: int, seed: int) -> None:
    """The server process: fill the cache, then run the app under uvicorn until killed."""
    import uvicorn

    from neuronetes_extender.app import create_app
    from neuronetes_extender.cache import GpuCache
    from neuronetes_extender.metrics import ExtenderMetrics
    from neuronetes_extender.service import ExtenderService
    from neuronetes_extender.wire import Node, Pod

    t0 = time.perf_counter()
    node_objs, pod_objs = cluster(n, seed)
    cache = GpuCache()
    cache.replace_nodes([msgspec.convert(o, Node) for o in node_objs])
    cache.replace_pods([msgspec.convert(o, Pod) for o in pod_objs])
    cache.mark_synced("nodes")
    cache.mark_synced("pods")
    cache.check_invariants()
    metrics = ExtenderMetrics(cache.stats)
    app = create_app(ExtenderService(cache, None, metrics), metrics=metrics)
    held = sum(
        1000 - milli for name in (node_name(i) for i in range(n)) for milli, _ in cache.gpu_usage(name) or []
    )
    print(
        f"server: {n} nodes, {len(pod_objs)} bound pods, {held / (1000 * n * GPUS_PER_NODE):.1%} of GPU "
        f"compute held, filled in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        app,
        host=HOST,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=120,
    )
    uvicorn.Server(config).run()


# ---- the client ------------------------------------------------------------------------------------


class Client:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection(HOST, port, timeout=60)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[float, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        t0 = time.perf_counter()
        self.conn.request(method, path, body=body, headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        elapsed = time.perf_counter() - t0
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {response.status}: {data[:300]!r}")
        return elapsed, data

    def close(self) -> None:
        self.conn.close()


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"extender process exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("extender did not become ready")


def pending_pods(count: int, seed: int) -> list[dict[str, Any]]:
    """`count` pending GPU pods, shapes drawn from `SHAPES` by weight."""
    rng = random.Random(seed)
    shapes = rng.choices(SHAPES, weights=[s[4] for s in SHAPES], k=count)
    out = []
    for k, (shape, whole, compute, memory, _) in enumerate(shapes):
        limits = (
            {c.RESOURCE_GPU: whole}
            if whole
            else {c.RESOURCE_GPU_MEMORY: memory, c.RESOURCE_GPU_COMPUTE: compute}
        )
        out.append(pod_object(f"pending-{shape}-{k}", f"pending-uid-{k:06d}", limits))
    return out


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.array(values) * 1000, q)), 3)


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": pct(values, 50), "p99": pct(values, 99)}


def measure(n: int, requests: int, seconds: float, seed: int) -> dict[str, Any]:
    port = free_port(HOST)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve",
            str(n),
            "--port",
            str(port),
            "--seed",
            str(seed),
        ]
    )
    try:
        wait_ready(port, proc)
        names = [node_name(i) for i in range(n)]
        # The pool of pending pods the requests cycle through: bounds the live holds.
        pool = pending_pods(min(256, max(32, n // 4)), seed + 1)
        bodies = [msgspec.json.encode({"Pod": p, "NodeNames": names}) for p in pool]
        client = Client(port)
        rejected = 0

        def filter_once(k: int) -> float:
            nonlocal rejected
            elapsed, data = client.call("POST", "/filter", bodies[k % len(bodies)])
            answer = msgspec.json.decode(data)
            if not answer.get("NodeNames") or answer.get("Error"):
                rejected += 1
            return elapsed

        def prioritize_once(k: int) -> float:
            elapsed, data = client.call("POST", "/prioritize", bodies[k % len(bodies)])
            if len(msgspec.json.decode(data)) != n:
                raise RuntimeError("prioritize did not score every node")
            return elapsed

        for k in range(max(50, len(bodies))):  # warm-up: every pod filtered once, code paths hot
            filter_once(k)
            prioritize_once(k)
            client.call("GET", "/healthz")
        rejected = 0
        filt, prio, floor = [], [], []
        for k in range(requests):  # interleaved, as kube-scheduler calls them per pod
            filt.append(filter_once(k))
            prio.append(prioritize_once(k))
            floor.append(client.call("GET", "/healthz")[0])
        done = 0
        t0 = time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds:
            filter_once(done)
            done += 1
        rps = done / elapsed
        client.close()
        if rejected:
            raise RuntimeError(f"{rejected} filter requests found no node: capacity ran out")
        return {
            "nodes": n,
            "filter_ms": summary(filt),
            "prioritize_ms": summary(prio),
            "floor_ms": summary(floor),
            "rps": round(rps, 1),
        }
    finally:
        terminate(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", default="100,1000,5000", help="comma-separated cluster sizes")
    ap.add_argument("--requests", type=int, default=500, help="measured requests per verb")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of the sustained-rate run")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--serve", type=int, metavar="N", help=argparse.SUPPRESS)  # the server process
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.serve is not None:
        serve(ns.port, ns.serve, ns.seed)
        return 0
    results = [measure(int(x), ns.requests, ns.seconds, ns.seed) for x in ns.nodes.split(",") if x.strip()]
    header = (
        f"{'nodes':>6} | {'filter p50':>10} {'p99':>7} | {'prioritize p50':>14} {'p99':>7} | "
        f"{'floor p50':>9} {'p99':>7} | {'f+p p99':>7} | {'filter req/s':>12}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        f, p, h = r["filter_ms"], r["prioritize_ms"], r["floor_ms"]
        print(
            f"{r['nodes']:>6} | {f['p50']:>10.3f} {f['p99']:>7.3f} | {p['p50']:>14.3f} {p['p99']:>7.3f} | "
            f"{h['p50']:>9.3f} {h['p99']:>7.3f} | {f['p99'] + p['p99']:>7.3f} | {r['rps']:>12.1f}"
        )
    print("(ms; one keep-alive connection, one uvicorn worker, nodeCacheCapable bodies with all node names)")
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
