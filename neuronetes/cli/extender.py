"""``neuronetes extender serve``: the kube-scheduler extender."""

from __future__ import annotations

import argparse
from typing import Any

import click

from .options import LOG_LEVEL
from .root import group

__all__ = ["extender"]


@group("extender", help="The kube-scheduler extender.")
def extender() -> None:
    pass


@extender.command(
    "serve",
    help="Serve filter/prioritize/bind/preempt for kube-scheduler: one uvicorn worker, the GPU cache "
    "fed by list+watch.",
)
@click.option("--kubeconfig", help="kubeconfig (default: in-cluster, else ~/.kube/config)")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="listen address (any but loopback needs client-certificate HTTPS or --insecure-allow-remote)",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8888, show_default=True, help="listen port")
@click.option("--tls-cert-file", help="serve HTTPS with this certificate (PEM)")
@click.option("--tls-private-key-file", help="the private key of --tls-cert-file (PEM)")
@click.option(
    "--client-ca-file",
    help="require client certificates signed by this CA (PEM): kube-scheduler's tlsConfig certificate",
)
@click.option(
    "--insecure-allow-remote",
    is_flag=True,
    help="listen on a non-loopback address without client certificates (only behind a network "
    "policy that lets nothing but kube-scheduler reach the port)",
)
@click.option(
    "--metrics-bind-address",
    default="",
    metavar="HOST:PORT",
    help="also serve GET /metrics alone on this address, for Prometheus in the cluster (default: off; "
    "/metrics stays on the verbs' port too)",
)
@click.option("--config", help="settings file, JSON or YAML, hot-reloaded (default: built-in settings)")
@click.option(
    "--resync-period",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="seconds between full relists",
)
@click.option(
    "--price-table",
    metavar="NAMESPACE/NAME",
    help="the ConfigMap of node prices by instance and capacity type, watched (docs/cost.md; the "
    "chart's neuronetes-price-table); default: prices from node labels alone",
)
@LOG_LEVEL
def serve(**opts: Any) -> int:
    # Imported here: the HTTP stack is only the extender's (and slow to load).
    from neuronetes_extender.server import serve as serve_extender

    return serve_extender(argparse.Namespace(**opts))
