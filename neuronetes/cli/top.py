"""``neuronetes top`` (``kubectl neuronetes top``): per node and GPU, the GPU share given out, what
is free, and how much of the free share is fragmented (docs/cli.md), as bars."""

from __future__ import annotations

import click
from rich.text import Text

from .kube import Cluster
from .options import KUBECONFIG
from .output import bar, emit, output_option
from .views import cluster_views

__all__ = ["top"]


def _bar(fraction: float, width: int = 20) -> Text:
    style = "green" if fraction < 0.7 else "yellow" if fraction < 0.9 else "red"
    return Text(f"{bar(fraction, width)} {fraction * 100:5.1f}%", style=style)


@click.command(
    "top",
    short_help="GPU use per node and GPU: allocated, free, fragmented.",
    help="GPU use per node and GPU: share allocated (bars), free, and the fragmented part of the free "
    "share (what the cluster's GPU pod shapes could not use, the engine's FGD measure).",
)
@KUBECONFIG
@click.option("--nodes-only", is_flag=True, help="one row per node, no GPU rows")
@output_option
def top(kubeconfig: str | None, nodes_only: bool, output: str) -> int:
    cluster = Cluster(kubeconfig)
    views = cluster_views(cluster.gpunodes(), cluster.nodes(), cluster.pods())
    rows: list[list[object]] = []
    for v in views:
        total = len(v.gpus) or 1
        free = v.free_milli / 1000
        frag = v.fragmentation_milli / 1000
        rows.append(
            [
                Text(v.name, style="bold"),
                v.model,
                _bar(v.allocated_milli / 1000 / total),
                f"{free:.2f} / {len(v.gpus)}",
                f"{frag:.2f} ({frag / free * 100 if free else 0:.0f}% of free)",
            ]
        )
        if nodes_only:
            continue
        for g in v.gpus:
            state = g.health + (" cordoned" if g.cordoned else "") + (" offline" if g.offline else "")
            rows.append(
                [
                    f"  gpu {g.index}",
                    state,
                    _bar(g.milli / 1000),
                    f"{g.free_milli / 1000:.2f}",
                    f"mem {g.memory_used_mib}/{g.memory_mib} MiB  {', '.join(g.users)}".rstrip(),
                ]
            )
    emit(
        output,
        {"nodes": [v.document(with_gpus=not nodes_only) for v in views]},
        columns=["NODE / GPU", "MODEL / STATE", "ALLOCATED", "FREE (GPUs)", "FRAGMENTED / USE"],
        rows=rows,
    )
    return 0
