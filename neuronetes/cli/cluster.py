"""Cluster verbs on GPUs: ``drain``, ``offline``, ``online`` (the node agent carries them out
from the GPUNode; docs/gpu-health.md). The same verbs drive a workstation daemon when
`workstation.target_state_dir` says the workstation is the target (docs/workstation.md)."""

from __future__ import annotations

import argparse

import click

from . import workstation
from .agent import agent_commands
from .options import GPU_ID, KUBECONFIG

__all__ = ["COMMANDS"]


def _gpu_admin(
    verb: str, gpu_id: str, kubeconfig: str | None, state_dir: str | None, force: bool = False
) -> int:
    target = workstation.target_state_dir(state_dir, kubeconfig)
    if target is not None:
        return workstation.gpu_admin(target, verb, gpu_id, force)
    ns = argparse.Namespace(command=verb, gpu_id=gpu_id, kubeconfig=kubeconfig, force=force)
    return int(agent_commands().cmd_gpu_admin(ns))


@click.command("drain", help="Keep new work off a GPU; running work continues.")
@GPU_ID
@KUBECONFIG
@workstation.STATE_DIR
def drain(gpu_id: str, kubeconfig: str | None, state_dir: str | None) -> int:
    return _gpu_admin("drain", gpu_id, kubeconfig, state_dir)


@click.command(
    "offline", help="Take a GPU out of service (refused while pods use it, unless --force evicts them)."
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


COMMANDS: tuple[click.Command, ...] = (drain, offline, online)
