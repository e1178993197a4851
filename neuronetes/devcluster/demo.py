"""The README's main job: a local cluster with simulated GPU nodes, NeuroNetes, sample pods.

`neuronetes demo` starts the real local control plane (etcd, kube-apiserver,
kube-controller-manager, kwok) and installs NeuroNetes with its Helm chart (``helm/neuronetes``,
values ``hack/local-values.yaml``): the CRDs, the admission policies, RBAC, and the chart's
workloads — the ``gpu-scheduler`` pods (kube-scheduler's ``neuronetes-scheduler`` profile and the
extender), the operator, two webhook replicas and the agent DaemonSet — which the chart runner
runs as host processes exactly as rendered (`neuronetes.devcluster.chartmode`). It adds a few
dozen simulated GPU nodes, submits sample pods — whole GPUs, an NVLink group, shared GPU slices,
a MIG instance, a gang of four, and one that fits nowhere — and prints where each landed and
why, read from the API as any user would: the pod's node and ``neuronetes.io/assigned-gpus``,
the extender's placement Event (reason ``GpusAssigned``) and, for the pod that stays Pending,
kube-scheduler's ``FailedScheduling`` Event. Last it applies one AgentPool and one GPUSlice, prints
their status as the operator wrote it, and a pod that runs inside the slice. Then it takes the
cluster down (unless ``--keep``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TextIO

from neuronetes import contracts as c
from neuronetes.devcluster.chartmode import ChartRelease
from neuronetes.devcluster.cluster import DevCluster
from neuronetes.profiles import KWOK_TAINT

__all__ = [
    "DEMO_NODES",
    "SAMPLE_POOL",
    "SAMPLE_SLICE",
    "UNFIT",
    "run_demo",
    "sample_pods",
    "show_pool_and_slice",
]

NAMESPACE: Final = "demo"
DEMO_NODES: Final = (
    ("dgx-a100-80gb", 8),
    ("dgx-h100", 4),
    ("t4x4-pcie", 12),
    ("a100-40gb-mig", 4),
    ("cpu-only", 4),
)
UNFIT: Final = "too-big-for-any-gpu"
PLACED_REASON: Final = "GpusAssigned"
"""The reason of the Event the extender posts on a pod it placed."""


def _pod(
    name: str,
    limits: dict[str, str | int],
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "neuronetes-demo", **(labels or {})},
            "annotations": annotations or {},
        },
        "spec": {
            "schedulerName": c.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/worker:1",
                    "resources": {
                        "limits": {k: str(v) for k, v in limits.items()},
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                    },
                }
            ],
            "tolerations": [dict(KWOK_TAINT, operator="Equal")],
        },
    }


def sample_pods() -> list[dict[str, Any]]:
    """Single GPUs, an NVLink group, shared slices, a MIG instance, a gang, and one that cannot fit."""
    gang = {c.LABEL_GANG: "llm-train", c.LABEL_GANG_SIZE: "4"}
    return [
        _pod("train-1gpu", {c.RESOURCE_GPU: 1}),
        _pod("train-2gpu", {c.RESOURCE_GPU: 2}),
        _pod("finetune-nvlink-4gpu", {c.RESOURCE_GPU: 4}, annotations={c.ANNOTATION_LOCALITY: "nvlink"}),
        *(
            _pod(f"infer-shared-{k}", {c.RESOURCE_GPU_MEMORY: 10240, c.RESOURCE_GPU_COMPUTE: 30})
            for k in range(3)
        ),
        _pod("notebook-mig-2g", {c.mig_resource_name("2g.10gb"): 1}),
        *(
            _pod(
                f"llm-train-{k}",
                {c.RESOURCE_GPU: 2},
                labels=gang,
                annotations={c.ANNOTATION_LOCALITY: "same-node"},
            )
            for k in range(4)
        ),
        # More GPU memory on one GPU than any GPU has: kube-scheduler's node totals pass, the
        # extender refuses with its reason and the pod stays Pending.
        _pod(UNFIT, {c.RESOURCE_GPU_MEMORY: 100_000, c.RESOURCE_GPU_COMPUTE: 50}),
    ]


def _wait(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.3)


def _gpu_text(doc: c.Assignment) -> str:
    seen: dict[tuple[int, int | None], str] = {}
    for ctr in doc.containers.values():
        for g in ctr.gpus:
            if g.mig_profile is not None:
                text = f"{g.index}:{g.mig_profile}@{g.mig_start}"
            elif g.compute_percent < 100:
                text = f"{g.index}({g.compute_percent}%,{(g.memory_mib or 0) // 1024}Gi)"
            else:
                text = str(g.index)
            seen.setdefault((g.index, g.mig_start), f"{text}={g.uuid[:12]}…")
    return " ".join(seen.values())


def run_demo(
    *,
    name: str = "demo",
    nodes: Sequence[tuple[str, int]] = DEMO_NODES,
    keep: bool = False,
    timeout: float = 180.0,
    out: TextIO = sys.stdout,
) -> int:
    """Run the demo; 0 when every pod but the unfittable one runs with its GPUs assigned."""

    def say(msg: str) -> None:
        print(f">> {msg}", file=sys.stderr, flush=True)

    cluster = DevCluster(name, log=say)
    if cluster.is_up():
        say(f"cluster {name!r} is already up: taking it down first")
        cluster.down()
    ok = False
    try:
        seconds = cluster.up(chart=ChartRelease(), auto_build=True)
        say(f"local control plane up and helm/neuronetes installed in {seconds:.1f}s")
        for profile_name, count in nodes:
            cluster.add_nodes(profile_name, count, profile_name)
        say(f"{sum(n for _, n in nodes)} simulated nodes: " + ", ".join(f"{n} x {p}" for p, n in nodes))
        cluster.kubectl("create", "namespace", NAMESPACE)
        pods = sample_pods()
        cluster.kubectl(
            "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
        )
        say(f"submitted {len(pods)} pods; waiting for them to be scheduled")
        ok = report(cluster, [p["metadata"]["name"] for p in pods], timeout, out)
        ok &= show_pool_and_slice(cluster, timeout, out)
    finally:
        if keep:
            say(f"cluster kept: KUBECONFIG={cluster.kubeconfig} (neuronetes dev cluster down --name {name})")
        else:
            cluster.purge()
            say("cluster down")
    return 0 if ok else 1


def _get(cluster: DevCluster, kind: str) -> list[dict[str, Any]]:
    return list(json.loads(cluster.kubectl("get", kind, "-n", NAMESPACE, "-o", "json").stdout)["items"])


def _scheduled_condition(pod: dict[str, Any]) -> dict[str, Any]:
    conds = [x for x in pod.get("status", {}).get("conditions") or [] if x["type"] == "PodScheduled"]
    return dict(conds[0]) if conds else {}


def _latest_event(events: list[dict[str, Any]], pod: str, reason: str) -> str | None:
    mine = [e for e in events if e.get("involvedObject", {}).get("name") == pod and e.get("reason") == reason]
    mine.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return str(mine[-1].get("message") or "") if mine else None


def report(cluster: DevCluster, names: list[str], timeout: float, out: TextIO) -> bool:
    """Wait until the sample pods settle; print node, GPUs and why for each, from the API."""

    def settled() -> dict[str, dict[str, Any]] | None:
        items = {p["metadata"]["name"]: p for p in _get(cluster, "pods")}
        for n in names:
            p = items.get(n)
            if p is None:
                return None
            if n == UNFIT:
                if _scheduled_condition(p).get("reason") != "Unschedulable":
                    return None
            elif p["status"].get("phase") != "Running":
                return None
        return items

    try:
        items = _wait(settled, timeout, "the sample pods")
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        items = {p["metadata"]["name"]: p for p in _get(cluster, "pods")}
    events = _get(cluster, "events")
    rows = []
    ok = True
    for n in names:
        p = items.get(n, {})
        node = p.get("spec", {}).get("nodeName") or "-"
        raw = (p.get("metadata", {}).get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        gpus = _gpu_text(c.decode_assignment(raw)) if raw else "-"
        if n == UNFIT:
            why = _latest_event(events, n, "FailedScheduling") or _scheduled_condition(p).get(
                "message", "not scheduled yet"
            )
            ok &= node == "-"
        else:
            why = _latest_event(events, n, PLACED_REASON) or (
                f"(no {PLACED_REASON} Event; node and GPUs from the pod's {c.ANNOTATION_ASSIGNED_GPUS})"
            )
            ok &= p.get("status", {}).get("phase") == "Running" and raw is not None
        rows.append((n, p.get("status", {}).get("phase", "?"), node, gpus, why))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    print(
        f"{'POD':<{widths[0]}}  {'PHASE':<{widths[1]}}  {'NODE':<{widths[2]}}  GPUS (index=UUID) / WHY",
        file=out,
    )
    for n, phase, node, gpus, why in rows:
        print(f"{n:<{widths[0]}}  {phase:<{widths[1]}}  {node:<{widths[2]}}  {gpus}", file=out)
        print(f"{'':<{widths[0] + widths[1] + widths[2] + 6}}  why: {why}", file=out)
    gang_nodes = {
        items[n]["spec"].get("nodeName") for n in names if n.startswith("llm-train-") and n in items
    }
    where = (
        f"all on {gang_nodes.pop()}" if len(gang_nodes) == 1 else f"SPLIT over {sorted(map(str, gang_nodes))}"
    )
    print(f"\ngang llm-train (4 x 2 GPUs, same-node): {where}", file=out)
    return ok


SAMPLE_POOL: Final[dict[str, Any]] = {
    "apiVersion": c.API_VERSION,
    "kind": "AgentPool",
    "metadata": {"name": "chat-pool", "namespace": NAMESPACE},
    "spec": {"minReplicas": 2, "gpuRequirements": {"count": 1, "type": "H100"}},
}
SLICE_USER: Final = "chat-slice-user"
SAMPLE_SLICE: Final[dict[str, Any]] = {
    "apiVersion": c.API_VERSION,
    "kind": "GPUSlice",
    "metadata": {"name": "chat-slice", "namespace": NAMESPACE},
    "spec": {"memory": "10Gi", "computePercent": 30, "qosClass": "Guaranteed"},
}


def show_pool_and_slice(cluster: DevCluster, timeout: float, out: TextIO) -> bool:
    """Apply the sample AgentPool and GPUSlice; print their status as the API reports it once the
    pool is Ready and the slice Bound (the operator's doing), then a pod that runs inside the slice;
    whether all three got there."""
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [SAMPLE_POOL, SAMPLE_SLICE]}),
    )

    def status(kind: str, name: str) -> dict[str, Any]:
        obj = json.loads(cluster.kubectl("get", kind, name, "-n", NAMESPACE, "-o", "json").stdout)
        return dict(obj.get("status") or {})

    def settled() -> tuple[dict[str, Any], dict[str, Any]] | None:
        pool, sl = status("agentpool", "chat-pool"), status("gpuslice", "chat-slice")
        return (pool, sl) if pool.get("phase") == "Ready" and sl.get("phase") == "Bound" else None

    try:
        pool, sl = _wait(settled, timeout, "the AgentPool Ready and the GPUSlice Bound")
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        pool, sl = status("agentpool", "chat-pool"), status("gpuslice", "chat-slice")
    placed = ", ".join(
        f"{p['pod']} on {p.get('node')} gpu {','.join(map(str, p.get('gpus') or []))}"
        for p in pool.get("placements") or []
    )
    print(
        f"\nagentpool chat-pool: {pool.get('phase')}, {pool.get('readyReplicas')}/{pool.get('desired')} "
        f"ready, {pool.get('gpus')} GPUs, {pool.get('costPerHour')}/h; {placed or 'no pods placed'}",
        file=out,
    )
    gpu = (sl.get("gpuUUIDs") or ["-"])[0]
    print(
        f"gpuslice chat-slice: {sl.get('phase')} on {sl.get('node')} {gpu} "
        f"({sl.get('memoryMiB')} MiB, {sl.get('computePercent')} %, {sl.get('qosClass')})",
        file=out,
    )
    return bool(pool.get("phase") == "Ready" and sl.get("phase") == "Bound") and _slice_user(
        cluster, timeout, out
    )


def _slice_user(cluster: DevCluster, timeout: float, out: TextIO) -> bool:
    """A pod naming the sample slice and asking for nothing: it runs inside the slice."""
    user = _pod(SLICE_USER, {}, annotations={c.ANNOTATION_SLICE: "chat-slice"})
    cluster.kubectl("create", "-f", "-", input=json.dumps(user))

    def running() -> dict[str, Any] | None:
        pod = json.loads(cluster.kubectl("get", "pod", SLICE_USER, "-n", NAMESPACE, "-o", "json").stdout)
        return dict(pod) if pod.get("status", {}).get("phase") == "Running" else None

    try:
        pod = _wait(running, timeout, "the slice's pod Running")
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    raw = pod["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS]
    gpus = [g for ctr in c.decode_assignment(raw).containers.values() for g in ctr.gpus]
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    print(
        f"pod {SLICE_USER} (names chat-slice, asked for nothing): Running on {pod['spec']['nodeName']} "
        f"{gpus[0].uuid}, limits gpu-memory={limits.get(c.RESOURCE_GPU_MEMORY)} "
        f"gpu-compute={limits.get(c.RESOURCE_GPU_COMPUTE)} (set by the webhook)",
        file=out,
    )
    return True
