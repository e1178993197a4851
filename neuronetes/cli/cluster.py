"""Cluster verbs on GPUs: ``drain``, ``offline``, ``online`` (the node agent carries them out
from the GPUNode; docs/gpu-health.md)."""

from __future__ import annotations

import argparse

import click

from .agent import agent_commands
from .options import GPU_ID, KUBECONFIG

__all__ = ["COMMANDS"]


def _gpu_admin(verb: str, gpu_id: str, kubeconfig: str | None, force: bool = False) -> int:
    ns = argparse.Namespace(command=verb, gpu_id=gpu_id, kubeconfig=kubeconfig, force=force)
    return int(agent_commands().cmd_gpu_admin(ns))


@click.command("drain", help="Keep new work off a GPU; running work continues.")
@GPU_ID
@KUBECONFIG
def drain(gpu_id: str, kubeconfig: str | None) -> int:
    return _gpu_admin("drain", gpu_id, kubeconfig)


@click.command(
    "offline", help="Take a GPU out of service (refused while pods use it, unless --force evicts them)."
)
@GPU_ID
@KUBECONFIG
@click.option("--force", is_flag=True, help="evict the pods using the GPU")
def offline(gpu_id: str, kubeconfig: str | None, force: bool) -> int:
    return _gpu_admin("offline", gpu_id, kubeconfig, force)


@click.command("online", help="Put a GPU back in service (after a repair or a failed reset).")
@GPU_ID
@KUBECONFIG
def online(gpu_id: str, kubeconfig: str | None) -> int:
    return _gpu_admin("online", gpu_id, kubeconfig)


COMMANDS: tuple[click.Command, ...] = (drain, offline, online)
