"""Cluster verbs: ``status`` and ``health`` (read from the GPUNodes and pods), ``drain``,
``offline``, ``online`` (written to the GPUNode; the node agent carries them out,
docs/gpu-health.md). The plugin's other views, ``top`` and ``explain``, have their own modules.

``status``, ``health``, ``drain``, ``offline`` and ``online`` also drive a workstation daemon:
`workstation.target_state_dir` is the one rule that picks the target (docs/workstation.md)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from . import workstation
from .kube import Cluster, event_time
from .options import GPU_ID, KUBECONFIG
from .output import emit, output_option
from .views import GpuView, NodeView, cluster_views

if TYPE_CHECKING:
    from neuronetes_agent.workstation.protocol import GpuAction

__all__ = ["drain", "health", "offline", "online", "status"]


def _age(timestamp: str) -> str:
    """``12s``/``5m``/``3h``/``2d`` since an RFC 3339 time ("-" when there is none)."""
    if not timestamp:
        return "-"
    try:
        then = datetime.fromisoformat(timestamp)
    except ValueError:
        return timestamp
    seconds = max(0, int((datetime.now(UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _state(gpu: GpuView) -> str:
    marks = [m for m, on in (("cordoned", gpu.cordoned), ("offline", gpu.offline)) if on]
    return gpu.health + (f" ({', '.join(marks)})" if marks else "")


def _cluster(kubeconfig: str | None) -> Cluster:
    """The cluster a verb fell through to by the target rule (its kubeconfig error says so)."""
    return Cluster(kubeconfig, fallback=workstation.no_daemon_either())


def _views(kubeconfig: str | None) -> list[NodeView]:
    cluster = _cluster(kubeconfig)
    return cluster_views(cluster.gpunodes(), cluster.nodes(), cluster.pods())


@click.command(
    "status",
    short_help="GPU nodes (--all: GPUs) as their agents report them; a workstation's GPUs and jobs.",
    help="The cluster's GPU nodes as their agents report them: one row per node (healthy GPUs, "
    "GPU share given out, last heartbeat); --all: one row per GPU. On a workstation "
    "(docs/workstation.md): the daemon, its GPUs and its jobs (--all: finished jobs too).",
)
@KUBECONFIG
@workstation.STATE_DIR
@click.option(
    "--all", "every_gpu", is_flag=True, help="one row per GPU, with its pods (workstation: finished jobs too)"
)
@output_option
def status(kubeconfig: str | None, state_dir: str | None, every_gpu: bool, output: str) -> int:
    target = workstation.target_state_dir(state_dir, kubeconfig)
    if target is not None:
        return workstation.show_status(target, every_gpu, output)
    views = _views(kubeconfig)
    if every_gpu:
        gpus = [g for v in views for g in v.gpus]
        emit(
            output,
            {"gpus": [g.document() for g in gpus]},
            columns=["NODE", "GPU", "UUID", "MODEL", "STATE", "ALLOCATED", "PODS"],
            rows=[
                [
                    g.node,
                    g.index,
                    g.uuid,
                    g.model,
                    _state(g),
                    f"{g.milli / 1000:.2f}",
                    ", ".join(g.users) or "-",
                ]
                for g in gpus
            ],
        )
        return 0
    emit(
        output,
        {"nodes": [v.document(with_gpus=False) for v in views]},
        columns=["NODE", "MODEL", "GPUS", "HEALTHY", "READY", "ALLOCATED", "HEARTBEAT"],
        rows=[
            [
                v.name,
                v.model,
                len(v.gpus),
                sum(g.usable for g in v.gpus),
                v.ready,
                f"{v.allocated_milli / 1000:.2f}",
                _age(v.heartbeat),
            ]
            for v in views
        ],
    )
    return 0


def _health_document(gpunode: dict[str, Any], gpu: GpuView, events: list[dict[str, Any]]) -> dict[str, Any]:
    status = gpunode.get("status") or {}
    return {
        **gpu.document(),
        "nodeConditions": [
            {k: cond.get(k) for k in ("type", "status", "reason", "message")}
            for cond in status.get("conditions") or ()
        ],
        "lastHeartbeatTime": status.get("lastHeartbeatTime"),
        "events": [
            {"time": event_time(e), "reason": e.get("reason"), "message": e.get("message")} for e in events
        ],
    }


@click.command(
    "health",
    short_help="GPU health, one GPU in detail with --gpu-id.",
    help="GPU health from the GPUNodes: one row per GPU (state, reason, cordoned/offline); with "
    "--gpu-id, that GPU in detail with its node's conditions and the agent's events about it. On a "
    "workstation: its GPUs, or one with its processes, jobs and state history.",
)
@KUBECONFIG
@workstation.STATE_DIR
@click.option(
    "--gpu-id",
    metavar="GPU",
    help="one GPU in detail: its UUID or a unique prefix of it (on a workstation also its index)",
)
@output_option
def health(kubeconfig: str | None, state_dir: str | None, gpu_id: str | None, output: str) -> int:
    target = workstation.target_state_dir(state_dir, kubeconfig)
    if target is not None:
        return workstation.show_health(target, gpu_id, output)
    cluster = _cluster(kubeconfig)
    views = cluster_views(cluster.gpunodes(), cluster.nodes(), cluster.pods())
    if gpu_id is None:
        gpus = [g for v in views for g in v.gpus]
        emit(
            output,
            {"gpus": [g.document() for g in gpus]},
            columns=["NODE", "GPU", "UUID", "HEALTH", "REASON", "CORDONED", "OFFLINE"],
            rows=[[g.node, g.index, g.uuid, g.health, g.reason or "-", g.cordoned, g.offline] for g in gpus],
        )
        return 0
    gpunode, entry = cluster.gpu(gpu_id)
    gpu_id = str(entry["uuid"])  # a prefix names it too
    gpu = next(g for v in views for g in v.gpus if g.uuid == gpu_id)
    events = [e for e in cluster.events_about("Node", "", gpu.node) if gpu_id in str(e.get("message", ""))]
    doc = _health_document(gpunode, gpu, events)
    if output != "table":
        emit(output, doc)
        return 0
    emit(
        output,
        doc,
        columns=["FIELD", "VALUE"],
        rows=[
            ["gpu", f"{gpu.uuid} (index {gpu.index} on {gpu.node})"],
            ["model", gpu.model],
            ["health", _state(gpu)],
            ["reason", gpu.reason or "-"],
            ["allocated", f"{gpu.milli / 1000:.2f} GPU, {gpu.memory_used_mib} of {gpu.memory_mib} MiB"],
            ["pods", ", ".join(gpu.users) or "-"],
            ["heartbeat", _age(str(doc["lastHeartbeatTime"] or ""))],
            *[
                [f"node {c['type']}", f"{c['status']} {c['reason'] or ''} {c['message'] or ''}".strip()]
                for c in doc["nodeConditions"]
            ],
        ],
    )
    if events:
        emit(
            output,
            None,
            columns=["AGE", "REASON", "MESSAGE"],
            rows=[[_age(event_time(e)), e.get("reason", ""), e.get("message", "")] for e in events[-10:]],
        )
    return 0


def _gpu_admin(
    verb: GpuAction, gpu_id: str, kubeconfig: str | None, state_dir: str | None, force: bool = False
) -> int:
    target = workstation.target_state_dir(state_dir, kubeconfig)
    if target is not None:
        return workstation.gpu_admin(target, verb, gpu_id, force)
    from neuronetes_agent.daemon.commands import cmd_gpu_admin  # the agent's stack: only when run

    ns = argparse.Namespace(command=verb, gpu_id=gpu_id, kubeconfig=kubeconfig, force=force)
    return cmd_gpu_admin(ns)


@click.command("drain", help="Keep new work off a GPU; running work continues.")
@GPU_ID
@KUBECONFIG
@workstation.STATE_DIR
def drain(gpu_id: str, kubeconfig: str | None, state_dir: str | None) -> int:
    return _gpu_admin("drain", gpu_id, kubeconfig, state_dir)


@click.command(
    "offline",
    short_help="Take a GPU out of service.",
    help="Take a GPU out of service (refused while pods use it, unless --force evicts them).",
)
@GPU_ID
@KUBECONFIG
@workstation.STATE_DIR
@click.option("--force", is_flag=True, help="evict the pods (workstation: the jobs) using the GPU")
def offline(gpu_id: str, kubeconfig: str | None, state_dir: str | None, force: bool) -> int:
    return _gpu_admin("offline", gpu_id, kubeconfig, state_dir, force)


@click.command("online", help="Put a GPU back in service (after a repair or a failed reset).")
@GPU_ID
@KUBECONFIG
@workstation.STATE_DIR
def online(gpu_id: str, kubeconfig: str | None, state_dir: str | None) -> int:
    return _gpu_admin("online", gpu_id, kubeconfig, state_dir)
