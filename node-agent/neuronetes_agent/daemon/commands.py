"""The agent's command-line verbs: ``agent run``, ``drain``/``offline``/``online`` and the dev fault
injectors. `neuronetes.cli` parses their options and calls them with a namespace of the option
values; every verb prints one line on error and returns an exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuronetes.signals import relay_signals

from .devices import GpuRefError, match_gpu

if TYPE_CHECKING:  # imported when a verb runs: the rest of the CLI does without the API client
    from kubernetes.client import ApiClient

    from .kube import Kube

__all__ = ["cmd_agent_run", "cmd_gpu_admin", "cmd_inject"]


def _api(kubeconfig: str | None) -> ApiClient:
    """The API client of `kubeconfig`, else in-cluster, else the default kubeconfig (`KubeError`
    when none can be loaded)."""
    from neuronetes.kube.client import load_api_client

    return load_api_client(kubeconfig or None)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


# ---- agent run -----------------------------------------------------------------------------------


def cmd_agent_run(ns: argparse.Namespace) -> int:
    from neuronetes.kube.client import KubeError

    from .devices import DiscoveryError
    from .fleet import AgentProcess, AgentSettings
    from .inventory import InventoryError, ShimError
    from .reconcile import Mode, Policy

    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        settings = AgentSettings(
            node=ns.node,
            simulate_nodes=ns.simulate_nodes,
            interval_s=ns.interval,
            heartbeat_s=ns.heartbeat,
            watchdog_s=ns.watchdog,
            reset_seconds=ns.simulated_reset_seconds,
            region_dir=Path(ns.region_dir) if ns.region_dir else None,
            state_dir=Path(ns.state_dir),
            shim_library=Path(ns.shim_library) if ns.shim_library else None,
            shim_dir=Path(ns.shim_dir),
            cgroup_root=Path(ns.cgroup_root),
            model_cache_dir=Path(ns.model_cache_dir) if ns.model_cache_dir else None,
            reconcile=Policy(
                mode=Mode(ns.reconcile),
                grace_s=ns.reconcile_grace,
                context_allowance_bytes=ns.reconcile_context_allowance << 20,
                margin_bytes=ns.reconcile_margin << 20,
            ),
        )
        api = _api(ns.kubeconfig)
    except (ValueError, KubeError, OSError) as exc:
        return _error(str(exc))

    def nvml_backend() -> Any:
        from .nvml import NvmlGpus, load_nvml

        return NvmlGpus(load_nvml())

    process = AgentProcess(api, settings, nvml_backend=nvml_backend)
    if ns.metrics_port >= 0:
        from .exporter import serve_metrics

        try:
            port = serve_metrics(lambda: list(process.agents.values()), ns.metrics_port, ns.metrics_host)
        except OSError as exc:
            return _error(f"metrics on {ns.metrics_host}:{ns.metrics_port}: {exc}")
        print(f"metrics on http://{ns.metrics_host}:{port}/metrics", file=sys.stderr, flush=True)

    relay_signals(lambda signum: process.request_stop(), (signal.SIGTERM, signal.SIGINT))
    try:
        process.run()
    except DiscoveryError as exc:
        return _error(str(exc))
    except (ShimError, InventoryError) as exc:  # fail closed: nothing written, nothing advertised
        return _error(f"{exc}; no GPU is advertised to containers")
    finally:
        process.stop()
    return 0


# ---- drain / offline / online ---------------------------------------------------------------------


def _find_gpunode(kube: Kube, ref: str) -> tuple[dict[str, Any], str]:
    """The GPUNode whose status lists the GPU `ref` names (its UUID or a unique UUID prefix:
    `match_gpu`), and that GPU's UUID. KeyError when no GPUNode lists it or the prefix is ambiguous."""
    from .kube import GPUNODES_PATH

    owners: dict[str, dict[str, Any]] = {}
    for item in kube.request("GET", GPUNODES_PATH).get("items") or ():
        for g in (item.get("status") or {}).get("gpus") or ():
            owners.setdefault(str(g.get("uuid")), dict(item))
    try:
        uuid = match_gpu(ref, ((None, u) for u in owners), "")
    except GpuRefError as exc:
        raise KeyError(exc.message if exc.ambiguous else f"no GPUNode lists GPU {ref}") from None
    return owners[uuid], uuid


def _gpu_status(gpunode: dict[str, Any], uuid: str) -> dict[str, Any]:
    return next(g for g in gpunode["status"]["gpus"] if g.get("uuid") == uuid)


def _request(kube: Kube, node: str, order: dict[str, Any]) -> str:
    from .node import REQUEST_PREFIX

    key = f"{REQUEST_PREFIX}{secrets.token_hex(6)}"
    kube.patch_gpunode(node, {"metadata": {"annotations": {key: json.dumps(order)}}})
    return key


def _set_lists(kube: Kube, gpunode: dict[str, Any], uuid: str, *, cordon: bool, offline: bool) -> None:
    """Add or remove `uuid` in spec.cordonedGPUs and the offline annotation, guarded by the
    object's resourceVersion (a concurrent change makes the patch fail with 409, not lose data)."""
    from neuronetes.contracts import ANNOTATION_OFFLINE_GPUS

    meta = gpunode["metadata"]
    cordoned = [u for u in (gpunode.get("spec") or {}).get("cordonedGPUs") or () if u != uuid]
    held = [
        u
        for u in (meta.get("annotations") or {}).get(ANNOTATION_OFFLINE_GPUS, "").split(",")
        if u and u != uuid
    ]
    if cordon:
        cordoned.append(uuid)
    if offline:
        held.append(uuid)
    patch = {
        "metadata": {
            "resourceVersion": meta["resourceVersion"],
            "annotations": {ANNOTATION_OFFLINE_GPUS: ",".join(held) or None},
        },
        "spec": {"cordonedGPUs": cordoned or None},
    }
    kube.patch_gpunode(meta["name"], patch)


def cmd_gpu_admin(ns: argparse.Namespace) -> int:
    from .kube import Kube, KubeError

    try:
        kube = Kube(_api(ns.kubeconfig))
        gpunode, ns.gpu_id = _find_gpunode(kube, ns.gpu_id)
        node = gpunode["metadata"]["name"]
        if ns.command == "drain":
            _set_lists(kube, gpunode, ns.gpu_id, cordon=True, offline=False)
            print(f"GPU {ns.gpu_id} on {node}: cordoned (running work continues, nothing new is placed)")
        elif ns.command == "offline":
            users = _gpu_status(gpunode, ns.gpu_id).get("allocations") or []
            if users and not ns.force:
                pods = sorted({f"{a['namespace']}/{a['pod']}" for a in users})
                return _error(
                    f"GPU {ns.gpu_id} is used by {', '.join(pods)}: drain it, or --force to evict them"
                )
            _set_lists(kube, gpunode, ns.gpu_id, cordon=True, offline=True)
            if users:
                _request(kube, node, {"verb": "evict", "gpu": ns.gpu_id})
            print(
                f"GPU {ns.gpu_id} on {node}: offline"
                + (f", evicting {len(users)} allocations" if users else "")
            )
        else:
            _set_lists(kube, gpunode, ns.gpu_id, cordon=False, offline=False)
            _request(kube, node, {"verb": "online", "gpu": ns.gpu_id})
            print(f"GPU {ns.gpu_id} on {node}: back in service")
    except (KeyError, KubeError, OSError) as exc:
        return _error(str(exc).strip("'\""))
    return 0


# ---- dev inject-* ----------------------------------------------------------------------------


def fault_order(ns: argparse.Namespace) -> dict[str, Any]:
    """The fault fields a ``dev inject-*`` command orders (the simulated backend's ``inject``, on a
    fleet agent or a workstation daemon alike). Raises ValueError on a bad value."""
    if ns.dev_command == "inject-xid":
        if not 1 <= ns.xid <= 999:
            raise ValueError(f"--xid {ns.xid} is not an XID (1-999)")
        return {"xid": ns.xid}
    if ns.dev_command == "inject-temperature":
        return {"temperatureCelsius": ns.celsius}
    if ns.corrected < 0 or ns.uncorrected < 0 or not (ns.corrected or ns.uncorrected):
        raise ValueError("give --corrected and/or --uncorrected as positive counts")
    return {k: v for k, v in (("eccCorrected", ns.corrected), ("eccUncorrected", ns.uncorrected)) if v}


def cmd_inject(ns: argparse.Namespace) -> int:
    try:
        fault = fault_order(ns)
    except ValueError as exc:
        return _error(str(exc))
    from .kube import Kube, KubeError

    try:
        kube = Kube(_api(ns.kubeconfig))
        gpunode, ns.gpu_id = _find_gpunode(kube, ns.gpu_id)
        node = gpunode["metadata"]["name"]
        key = _request(kube, node, {"verb": "inject", "gpu": ns.gpu_id, "fault": fault})
    except (KeyError, KubeError, OSError) as exc:
        return _error(str(exc).strip("'\""))
    print(f"{node}: {key} {json.dumps(fault)}")
    return 0
