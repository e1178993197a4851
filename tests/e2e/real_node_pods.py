"""GPU pods on the dev cluster's real nodes: the GPU probe's pod spec and what it prints.

The probe (``tests/images/gpu-probe``: ``node-agent/shim/validate/gpu_probe.c``) reports what its
container got — devices, ``/etc/ld.so.preload``, the region's limits, what the CUDA driver API
shows — and whether an allocation past its limit fails, in itself, a forked child and an exec'd
program; each line of its log is ``PROBE <json>``.

The fake driver keeps its simulated GPU's account in one file on the node (the agent's
``FAKE_CUDA_STATE``, ``hack/real-node-values.yaml``): a GPU pod mounts that file and names it in
its environment, as a real container reaches the real driver through the device nodes. This is
the simulated GPU's wiring, not NeuroNetes': the plugin injects everything else.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
from e2e_cluster import wait_until

from neuronetes import contracts
from neuronetes.devcluster import DevCluster, nodeview
from neuronetes.devcluster.components import REAL_NODE_LABEL
from neuronetes.devcluster.realchart import GPU_PROBE_IMAGE

__all__ = [
    "FAKE_STATE_ON_NODE",
    "SCHEDULER",
    "apply",
    "exec_probe",
    "gpu_probe_pod",
    "kubectl_json",
    "ledger_uids",
    "node_mounts",
    "node_path",
    "node_pid",
    "node_processes",
    "probe_lines",
    "wait_probe_ready",
]

SCHEDULER: Final = "neuronetes-scheduler"
FAKE_STATE_ON_NODE: Final = "/mnt/neuronetes-fake-gpu/state"
"""The fake driver's account on the node: the agent's FAKE_CUDA_STATE in hack/real-node-values.yaml."""
FAKE_STATE_IN_POD: Final = "/run/fake-gpu/state"


def gpu_probe_pod(
    name: str,
    namespace: str,
    *,
    memory_mib: int,
    compute_percent: int,
    alloc_mib: int,
    annotations: dict[str, str] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    """A pod running ``gpu-probe serve ALLOC_MIB`` on a real node, asking for a GPU slice.

    With `node_name` (and `annotations`) the pod is bound by hand and asks for no NeuroNetes
    resource (the admission policy refuses nodeName with them): what a forged assignment is.
    """
    limits = (
        {}
        if node_name
        else {
            contracts.RESOURCE_GPU_MEMORY: str(memory_mib),
            contracts.RESOURCE_GPU_COMPUTE: str(compute_percent),
        }
    )
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 2,
        "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "probe",
                "image": GPU_PROBE_IMAGE,
                "imagePullPolicy": "Never",
                "args": ["serve", str(alloc_mib)],
                "env": [{"name": "FAKE_CUDA_STATE", "value": FAKE_STATE_IN_POD}],
                "resources": {"limits": limits},
                "volumeMounts": [{"name": "fake-gpu", "mountPath": FAKE_STATE_IN_POD}],
            }
        ],
        "volumes": [{"name": "fake-gpu", "hostPath": {"path": FAKE_STATE_ON_NODE, "type": "File"}}],
        "automountServiceAccountToken": False,
    }
    if node_name:
        spec["nodeName"] = node_name
    else:
        spec["schedulerName"] = SCHEDULER
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": spec,
    }


def probe_lines(log: str) -> list[dict[str, Any]]:
    """The probe's reports in a log, in order."""
    return [json.loads(line.removeprefix("PROBE ")) for line in log.splitlines() if line.startswith("PROBE ")]


def wait_probe_ready(
    dev: DevCluster, namespace: str, name: str, timeout: float = 120.0
) -> list[dict[str, Any]]:
    """Wait until the probe pod says ``ready``; its reports."""

    def ready() -> list[dict[str, Any]] | None:
        logs = dev.kubectl("logs", "-n", namespace, name, check=False)
        lines = probe_lines(logs.stdout) if logs.returncode == 0 else []
        return lines if any(r["what"] == "ready" for r in lines) else None

    try:
        return wait_until(ready, timeout=timeout, what=f"pod {namespace}/{name} ready")
    except AssertionError:
        describe = dev.kubectl("describe", "pod", "-n", namespace, name, check=False).stdout
        raise AssertionError(f"pod {namespace}/{name} never said ready:\n{describe[-3000:]}") from None


def exec_probe(
    dev: DevCluster, namespace: str, name: str, *args: str, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """``kubectl exec`` the probe beside the running one; its reports (it exits 1 on a CUDA error).
    Retried until it reports, for `timeout`: a kubelet that was just restarted does not serve
    ``exec`` at once."""
    errors: list[str] = []

    def reports() -> list[dict[str, Any]]:
        done = dev.kubectl(
            "exec", "-n", namespace, name, "-c", "probe", "--", "gpu-probe", *args, check=False
        )
        errors.append(done.stderr.strip())
        return probe_lines(done.stdout)

    try:
        return wait_until(
            reports, timeout=timeout, interval=1.0, what=f"gpu-probe {' '.join(args)} in {name}"
        )
    except pytest.fail.Exception:
        raise AssertionError(f"kubectl exec gpu-probe {' '.join(args)}: {errors[-1][-500:]}") from None


def kubectl_json(dev: DevCluster, *args: str) -> Any:
    return json.loads(dev.kubectl(*args, "-o", "json").stdout)


def apply(
    dev: DevCluster, manifest: dict[str, Any], *, as_user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl create`` a manifest, its result (not checked). `as_user`: impersonating that user
    name with the rights of an administrator (system:masters) — the name is what the admission
    policies look at."""
    extra = ["--as", as_user, "--as-group", "system:masters"] if as_user else []
    return dev.kubectl("create", *extra, "-f", "-", input=json.dumps(manifest), check=False)


# ---- the node's processes and files, as this machine sees them ------------------------------------


def node_pid(dev: DevCluster, node: str) -> int | None:
    return nodeview.node_pid(dev.state_dir, node)


def node_processes(dev: DevCluster, node: str, pattern: str) -> list[int]:
    return nodeview.node_processes(dev.state_dir, node, pattern)


def node_path(dev: DevCluster, node: str, path: str) -> Path:
    return nodeview.node_path(dev.state_dir, node, path)


def node_mounts(dev: DevCluster, node: str) -> str:
    return nodeview.node_mounts(dev.state_dir, node)


def ledger_uids(dev: DevCluster, node: str) -> set[str]:
    """The pods in the node ledger the agent writes."""
    doc = json.loads(node_path(dev, node, "/run/neuronetes/ledger.json").read_text())
    return {p["uid"] for p in doc["pods"]}
