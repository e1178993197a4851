"""What one AgentPool admission review, and one reconcile of the pool, cost at 1 replica and at the most.

**Admission** (the acceptance: the same at the maximum as at 1 replica): the review the API server
sends ``/objects`` for ``kubectl create`` of an AgentPool
(`neuronetes_operator.webhook.admission_response`, the webhook's whole answer short of HTTP and
TLS): a pool of single-GPU replicas whose template is a two-container inference server (env,
ports, volumes, probes, node affinity). Each replica count runs in a fresh Python process, which
first answers two 1-replica reviews (imports, the MIG catalogs and the time-zone data loaded), then:

- **RSS**: the growth of the process's peak resident memory (``ru_maxrss``) over one review: what
  the webhook's container memory limit sees;
- **traced peak**: the peak of Python allocations during one review (``tracemalloc``);
- **time**: the median and slowest of ``--runs`` reviews (without tracemalloc).

**Reconcile** (what the operator holds per pool): the operator's work in one reconcile of the same
pool with all but its last batch created — those pods exist as the API server lists them (status,
managed fields, an assignment): reading the list page by page (`reconcile.read_pod_page`, pages of
`reconcile.LIST_PAGE`, as ``PoolController._pods`` does), the desired pods, the plan, the batch
(``batchSize`` 64) and its manifests, the status. It grows with the pods that exist: the list is
read whole, though never held in full.

Defaults: 1, 1024 (the chart's default maximum) and 4096 (the CRD's bound). The webhook's models
enforce the CRD's bound too, so a review past 4096 is refused at decoding.

    python bench/admission.py [--replicas 1,1024,4096] [--runs 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "chat", "tier": "inference"}, "annotations": {"team": "llm"}},
    "spec": {
        "containers": [
            {
                "name": "server",
                "image": "registry.example/vllm:0.6",
                "args": ["--model", "llama-70b", "--tensor-parallel-size", "1"],
                "env": [{"name": f"VLLM_OPTION_{i}", "value": str(i)} for i in range(20)],
                "ports": [{"containerPort": 8000, "name": "http"}],
                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                "resources": {"limits": {"cpu": "8", "memory": "64Gi"}},
            },
            {"name": "envoy", "image": "registry.example/envoy:1.31", "ports": [{"containerPort": 9901}]},
        ],
        "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "100Gi"}}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
    },
}


def review(replicas: int) -> dict[str, Any]:
    """The AdmissionReview of ``kubectl create`` of a pool of `replicas` single-GPU replicas."""
    pool = {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": "bench", "namespace": "bench"},
        "spec": {
            "replicas": replicas,
            "minReplicas": 1,
            "maxReplicas": replicas,
            "gpuRequirements": {"count": 1, "type": "H100", "memory": "80Gi"},
            "template": TEMPLATE,
        },
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "bench", "operation": "CREATE", "namespace": "bench", "object": pool},
    }


def child(replicas: int, runs: int) -> dict[str, Any]:
    """Run in a fresh process: the figures of one replica count."""
    from neuronetes_operator.webhook import admission_response

    for _ in range(2):
        admission_response("/objects", review(1))
    body = review(replicas)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    answer = admission_response("/objects", body)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    tracemalloc.start()
    admission_response("/objects", body)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        admission_response("/objects", body)
        times.append(time.perf_counter() - t0)
    return {
        "replicas": replicas,
        "allowed": answer["response"]["allowed"],
        "rss_growth_mib": round(rss_kib / 1024, 2),
        "traced_peak_mib": round(traced / 2**20, 3),
        "median_ms": round(statistics.median(times) * 1000, 3),
        "slowest_ms": round(max(times) * 1000, 3),
    }


def _listed(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` as the API server lists it once bound and running."""
    meta = pod["metadata"]
    meta.update(uid="0" * 36, resourceVersion="123456", creationTimestamp="2026-11-26T00:00:00Z")
    meta["managedFields"] = [
        {
            "manager": "neuronetes-operator",
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-11-26T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}, "f:spec": {"f:containers": {}}},
        }
    ]
    meta["annotations"]["neuronetes.io/assigned-gpus"] = '{"version":1,"node":"gpu-1"}' + " " * 260
    pod["spec"].update(nodeName="gpu-1", restartPolicy="Always", serviceAccountName="default")
    pod["status"] = {
        "phase": "Running",
        "podIP": "10.1.0.1",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2026-11-26T00:00:00Z"}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
    }
    return pod


def reconcile_child(replicas: int, runs: int) -> dict[str, Any]:
    """Run in a fresh process: one reconcile's work over a pool of `replicas`, all but its last
    batch there."""
    from neuronetes.api.models import AgentPool, decode
    from neuronetes_operator.pods import desired_pods
    from neuronetes_operator.policy import resolve
    from neuronetes_operator.reconcile import LIST_PAGE, batch, plan, read_pod_page
    from neuronetes_operator.status import pool_status

    pool = dict(review(replicas)["request"]["object"])
    pool["metadata"] = {"name": "bench", "namespace": "bench", "uid": "u-1", "generation": 1}
    spec = decode(pool, AgentPool).spec
    resolved = resolve(spec)
    listed = max(0, replicas - 64)
    there = [_listed(d.manifest) for d in desired_pods(pool, spec, resolved)[:listed]]
    pages = []
    for start in range(0, max(1, listed), LIST_PAGE):
        more = {"continue": str(start + LIST_PAGE)} if start + LIST_PAGE < listed else {}
        pages.append(json.dumps({"metadata": more, "items": there[start : start + LIST_PAGE]}).encode())
    del there

    def one() -> int:
        items: list[dict[str, Any]] = []
        for page in pages:
            read_pod_page(page, "u-1", items)
        want = desired_pods(pool, spec, resolved)
        now, _ = batch(plan(want, items), 64)
        made = [a.manifest for a in now]
        pool_status(pool, resolved, items, {}, backlog=1)
        return len(made)

    one()
    tracemalloc.start()
    made = one()
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    times = []
    for _ in range(max(1, runs // 4)):
        t0 = time.perf_counter()
        one()
        times.append(time.perf_counter() - t0)
    return {
        "replicas": replicas,
        "pods_listed": listed,
        "list_mib": round(sum(map(len, pages)) / 2**20, 2),
        "manifests_built": made,
        "traced_peak_mib": round(traced / 2**20, 2),
        "median_ms": round(statistics.median(times) * 1000, 2),
    }


TABLES: dict[str, tuple[str, str, list[tuple[str, str, str]]]] = {
    "admission": (
        "--child",
        "admission review (webhook /objects)",
        [("replicas", "replicas", ""), ("allowed", "allowed", ""), ("median_ms", "median ms", ".2f"),
         ("slowest_ms", "slowest ms", ".2f"), ("traced_peak_mib", "traced MiB", ".3f"),
         ("rss_growth_mib", "RSS MiB", ".2f")],
    ),
    "reconcile": (
        "--reconcile-child",
        "one reconcile, all but the last batch there (operator)",
        [("replicas", "replicas", ""), ("pods_listed", "pods listed", ""), ("list_mib", "list MiB", ".2f"),
         ("manifests_built", "manifests", ""), ("median_ms", "median ms", ".2f"),
         ("traced_peak_mib", "traced MiB", ".2f")],
    ),
}  # fmt: skip
"""Per table: the child's flag, the title, and its columns (key, heading, format spec)."""


def table(title: str, rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> None:
    """Print `rows` under `title`: one column per (key, heading, format spec)."""
    print(title)
    print(" ".join(f"{head:>12}" for _, head, _ in columns))
    for row in rows:
        print(
            " ".join(f"{format(row[key], spec) if spec else str(row[key]):>12}" for key, _, spec in columns)
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--replicas", default="1,1024,4096", help="replica counts, comma-separated")
    ap.add_argument("--runs", type=int, default=20, help="timed reviews per count (default 20)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--reconcile-child", type=int, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child is not None:
        print(json.dumps(child(ns.child, ns.runs)))
        return 0
    if ns.reconcile_child is not None:
        print(json.dumps(reconcile_child(ns.reconcile_child, ns.runs)))
        return 0

    def run(flag: str, replicas: int) -> dict[str, Any]:
        argv = [sys.executable, __file__, flag, str(replicas), "--runs", str(ns.runs)]
        return dict(json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout))

    counts = [int(r) for r in ns.replicas.split(",")]
    results = {}
    for key, (flag, title, columns) in TABLES.items():
        results[key] = [run(flag, n) for n in counts]
        table(title, results[key], columns)
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
