"""Options several commands share (one definition each)."""

from __future__ import annotations

import click

__all__ = ["GPU_ID", "KUBECONFIG", "LOG_LEVEL"]

LOG_LEVEL = click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
GPU_ID = click.option(
    "--gpu-id",
    required=True,
    metavar="GPU",
    help="the GPU as nvidia-smi -i takes it: its UUID (GPU-...) or a unique prefix of it; on a "
    "workstation also its index",
)
KUBECONFIG = click.option("--kubeconfig", help="kubeconfig (default: in-cluster, else ~/.kube/config)")
