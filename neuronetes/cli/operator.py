"""``neuronetes operator run`` and ``neuronetes webhook serve``."""

from __future__ import annotations

import argparse
from typing import Any

import click

from .options import LOG_LEVEL
from .root import group

__all__ = ["operator", "webhook"]

PRIORITY_TIERS = click.option(
    "--priority-tiers",
    help="the priority tiers, a YAML or JSON list (the chart's priorityTiers; default: built-in tiers "
    "default, high, critical, only default granted to every namespace)",
)


@group("operator", help="The AgentPool/GPUSlice/ToolBinding operator.")
def operator() -> None:
    pass


@operator.command(
    "run",
    help="The NeuroNetes operator (kopf): AgentPool -> pods, status, events. Run one replica.",
)
@click.option("--kubeconfig", help="kubeconfig (default: in-cluster)")
@click.option("--config", help="settings file, YAML or JSON (default: built-in settings)")
@PRIORITY_TIERS
@LOG_LEVEL
def operator_run(**opts: Any) -> int:
    from neuronetes_operator.main import operator_run as run  # kopf and its stack: only when run

    return run(argparse.Namespace(**opts))


@group("webhook", help="The admission webhook.")
def webhook() -> None:
    pass


@webhook.command(
    "serve",
    help="Serve pod and NeuroNetes-object admission over HTTPS: refuses what no GPU could satisfy, sets "
    "the scheduler name. Run two or more replicas; they may share --port on one host (SO_REUSEPORT).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="listen address")
@click.option("--port", type=click.IntRange(0, 65535), default=9443, show_default=True, help="listen port")
@click.option("--cert-dir", required=True, help="folder with tls.crt and tls.key")
@click.option(
    "--trusted-user",
    multiple=True,
    help="user allowed to change neuronetes.io/* annotations of existing pods (repeatable)",
)
@click.option(
    "--protected-host-path",
    multiple=True,
    help="a host directory GPU pods may not mount, beyond the built-in ones (repeatable; the chart "
    "passes the agent's host paths)",
)
@PRIORITY_TIERS
@LOG_LEVEL
def webhook_serve(**opts: Any) -> int:
    from neuronetes_operator.main import webhook_serve as serve  # the operator's stack: only when run

    return serve(argparse.Namespace(**opts))
