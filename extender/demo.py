"""The README's main job: a local cluster with simulated GPU nodes, the extender, sample pods.

`neuronetes demo` starts the real local control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler with the ``neuronetes-scheduler`` profile, kwok) with a
few dozen simulated GPU nodes, runs the extender (in this process), submits sample pods — whole
GPUs, an NVLink group, shared GPU slices, a MIG instance, a gang of four, and one that fits
nowhere — and prints where each landed and why: node, GPU indices and UUIDs, and the engine's
reason for those GPUs (NVLink group, NUMA node, socket). Then it takes the cluster down (unless
``--keep``).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.devcluster import DevCluster, ExtenderConfig
from neuronetes.devcluster.profiles import KWOK_TAINT

from .bodies import NodeSet
from .server import ExtenderThread, build
from .service import ExtenderService
from .wire import ExtenderFilterResult

__all__ = ["DEMO_NODES", "run_demo", "sample_pods"]

NAMESPACE: Final = "demo"
DEMO_NODES: Final = (
    ("dgx-a100-80gb", 8),
    ("dgx-h100", 4),
    ("t4x4-pcie", 12),
    ("a100-40gb-mig", 4),
    ("cpu-only", 4),
)


class _Reasons(ExtenderService):
    """The extender's service, remembering why the engine chose each pod's GPUs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.why: dict[str, str] = {}

    def filter(self, nodes: NodeSet) -> tuple[ExtenderFilterResult, str]:
        result, outcome = super().filter(nodes)
        hold = self.cache.hold_of(nodes.pod.metadata.uid)
        if hold is not None:
            self.why[nodes.pod.metadata.name] = hold.reason
        return result, outcome


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
        _pod("too-big-for-any-gpu", {c.RESOURCE_GPU_MEMORY: 100_000, c.RESOURCE_GPU_COMPUTE: 50}),
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
    out: Any = sys.stdout,
) -> int:
    """Run the demo; 0 when every pod but the unfittable one is Running where the engine said."""

    def say(msg: str) -> None:
        print(f">> {msg}", file=sys.stderr, flush=True)

    logging.basicConfig(level=logging.WARNING)
    cluster = DevCluster(name, log=say)
    if cluster.is_up():
        say(f"cluster {name!r} is already up: taking it down first")
        cluster.down()
    seconds = cluster.up(auto_build=True)
    say(
        f"local control plane up in {seconds:.1f}s "
        "(etcd, kube-apiserver, controller-manager, scheduler, kwok)"
    )
    ok = False
    try:
        total = 0
        for profile_name, count in nodes:
            cluster.add_nodes(profile_name, count, profile_name)
            total += count
        say(f"{total} simulated nodes: " + ", ".join(f"{n} x {p}" for p, n in nodes))
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "extender.yaml"
            config.write_text("filterTopK: 3\n")
            ext = build(kubeconfig=cluster.kubeconfig, config=config, service_class=_Reasons)
            with ExtenderThread(ext.app) as server:
                _wait(lambda: ext.cache.synced, 60, "the extender's cache to sync")
                cluster.set_extender(ExtenderConfig(url=server.url, weight=20))
                say(f"extender on {server.url}; kube-scheduler restarted to call it")
                cluster.kubectl("create", "namespace", NAMESPACE)
                pods = sample_pods()
                cluster.kubectl(
                    "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
                )
                say(f"submitted {len(pods)} pods; waiting for them to be scheduled")
                ok = _report(cluster, pods, ext.service, timeout, out)
    finally:
        if keep:
            say(f"cluster kept: KUBECONFIG={cluster.kubeconfig} (neuronetes dev cluster down --name {name})")
        else:
            cluster.down()
            cluster.purge()
            say("cluster down")
    return 0 if ok else 1


def _report(cluster: DevCluster, pods: list[dict[str, Any]], service: Any, timeout: float, out: Any) -> bool:
    names = [p["metadata"]["name"] for p in pods]
    unfit = "too-big-for-any-gpu"

    def listing() -> dict[str, dict[str, Any]]:
        got = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)
        return {p["metadata"]["name"]: p for p in got["items"]}

    def settled() -> dict[str, dict[str, Any]] | None:
        items = listing()
        for n in names:
            p = items.get(n)
            if p is None:
                return None
            if n == unfit:
                conds = [x for x in p["status"].get("conditions") or [] if x["type"] == "PodScheduled"]
                if not conds or conds[0].get("reason") != "Unschedulable":
                    return None
            elif p["status"].get("phase") != "Running":
                return None
        return items

    try:
        items = _wait(settled, timeout, "the sample pods")
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        items = listing()
    rows = []
    ok = True
    for n in names:
        p = items.get(n, {})
        node = p.get("spec", {}).get("nodeName") or "-"
        raw = (p.get("metadata", {}).get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        gpus = _gpu_text(c.decode_assignment(raw)) if raw else "-"
        if n == unfit:
            conds = [x for x in p.get("status", {}).get("conditions") or [] if x["type"] == "PodScheduled"]
            why = conds[0].get("message", "") if conds else "not scheduled yet"
            ok &= node == "-"
        else:
            why = service.why.get(n, "")
            ok &= p.get("status", {}).get("phase") == "Running" and raw is not None
        phase = p.get("status", {}).get("phase", "?")
        rows.append((n, phase, node, gpus, why))
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
    print(
        "\ngang llm-train (4 x 2 GPUs, same-node): "
        + (
            f"all on {gang_nodes.pop()}"
            if len(gang_nodes) == 1
            else f"SPLIT over {sorted(map(str, gang_nodes))}"
        ),
        file=out,
    )
    return ok
