"""``neuronetes agent run``: the node agent (docs/gpu-health.md). Its GPU verbs (drain, offline,
online, health) are cluster commands (`neuronetes.cli.cluster`); its fault injectors are
``dev inject-*`` (`neuronetes.cli.dev`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

import click

from .options import LOG_LEVEL
from .root import group, with_version
from .standalone import STANDALONE_KEYS, STANDALONE_OPTIONS, run_standalone

__all__ = ["agent", "agent_commands", "agent_main"]


def agent_commands() -> Any:
    """The agent's commands (`neuronetes_agent.daemon.commands`), imported when used."""
    return importlib.import_module("neuronetes_agent.daemon.commands")


@group("agent", help="The node agent.")
def agent() -> None:
    pass


@agent.command(
    "run",
    help="Serve a GPU node (NVML) or a fleet of simulated nodes: discover GPUs, track their health, "
    "publish GPUNode, labels and capacity, evict pods from failed GPUs, export metrics "
    "(docs/gpu-health.md). Give exactly one of --node and --simulate-nodes.",
)
@click.option(
    "--standalone",
    is_flag=True,
    help="workstation mode: schedule jobs on this machine, no cluster (docs/workstation.md)",
)
@click.option("--node", help="serve this node's real GPUs through NVML")
@click.option("--simulate-nodes", metavar="SELECTOR", help="serve every Node matching this label selector")
@click.option("--kubeconfig", help="kubeconfig (default: in-cluster, else ~/.kube/config)")
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="seconds between health rounds",
)
@click.option(
    "--heartbeat",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="seconds between GPUNode heartbeats",
)
@click.option(
    "--watchdog",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="seconds NVML may hang before GPUs degrade",
)
@click.option(
    "--simulated-reset-seconds",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="fleet: a GPU reset's duration",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(-1, 65535),
    default=9400,
    show_default=True,
    help="Prometheus port (-1: none; 0: any free)",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="metrics listen address")
@click.option(
    "--region-dir",
    default="/run/neuronetes/containers",
    show_default=True,
    help="--node: where the containers' shim regions are written ('' for none)",
)
@click.option(
    "--state-dir",
    help="--node: where the node inventory file (inventory.json) is written for the NRI plugin (default "
    "/run/neuronetes); --standalone: the daemon's state (default $NEURONETES_STATE_DIR, else "
    "$XDG_STATE_HOME/neuronetes)",
)
@click.option(
    "--shim-library",
    help="--node: the shim library to install (default: the one `make -C node-agent/shim` built)",
)
@click.option(
    "--shim-dir",
    default="/var/lib/neuronetes/shim",
    show_default=True,
    help="--node: host directory the shim library and its preload file are installed into",
)
@click.option(
    "--cgroup-root",
    default="/sys/fs/cgroup",
    show_default=True,
    help="--node: the host's cgroup mount, where the containers' processes are found",
)
@click.option(
    "--reconcile",
    type=click.Choice(["enforce", "report", "off"]),
    default="enforce",
    show_default=True,
    help="--node: NVML reconciliation of shared GPUs (docs/gpu-health.md): evict pods with a process "
    "that bypasses the shim or with memory past their limit (enforce), only record Events and metrics "
    "(report), or nothing (off)",
)
@click.option(
    "--reconcile-grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="--node: seconds a reconciliation finding must last before it is acted on",
)
@click.option(
    "--reconcile-context-allowance",
    type=click.IntRange(min=0),
    default=1024,
    show_default=True,
    metavar="MIB",
    help="--node: MiB per process NVML may attribute past a slice's limit (the CUDA context, which the "
    "shim does not charge)",
)
@click.option(
    "--reconcile-margin",
    type=click.IntRange(min=0),
    default=64,
    show_default=True,
    metavar="MIB",
    help="--node: MiB NVML may attribute past a slice's limit and its processes' allowances",
)
@STANDALONE_OPTIONS
@LOG_LEVEL
@with_version  # `neuronetes-agent --version` (that script is `agent run`)
def agent_run(**opts: Any) -> int:
    standalone = {k: opts.pop(k) for k in STANDALONE_KEYS}
    if opts.pop("standalone"):
        if opts["node"] is not None or opts["simulate_nodes"] is not None:
            raise click.UsageError("--standalone runs without a cluster: no --node or --simulate-nodes")
        return run_standalone(opts["state_dir"], opts["shim_library"], opts["log_level"], **standalone)
    if (opts["node"] is None) == (opts["simulate_nodes"] is None):
        raise click.UsageError("give exactly one of --node and --simulate-nodes (or --standalone)")
    if any(v is not None for v in standalone.values()):
        raise click.UsageError(
            "--simulate-gpus, --utilization-cap, --headroom, --aging-seconds, --checkpoint-deadline, "
            "--cuda-driver, --containment, --log-max-size and --max-clients need --standalone"
        )
    opts["state_dir"] = opts["state_dir"] or "/run/neuronetes"
    return int(agent_commands().cmd_agent_run(argparse.Namespace(**opts)))


def agent_main() -> int:
    """`neuronetes-agent`: the node agent on its own, ``neuronetes-agent --standalone [...]`` for
    workstation mode (the same options as ``neuronetes agent run``)."""
    from . import main

    return main(["agent", "run", *sys.argv[1:]], prog_name="neuronetes-agent")
