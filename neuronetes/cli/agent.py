"""``neuronetes agent run``: the node agent (docs/gpu-health.md). Its GPU verbs (drain, offline,
online, health) are cluster commands (`neuronetes.cli.cluster`); its fault injectors are
``dev inject-*`` (`neuronetes.cli.dev`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import click

from .options import LOG_LEVEL
from .root import CONTEXT, group, with_version
from .workstation import WORKSTATION_KEYS, WORKSTATION_OPTIONS, run_workstation

__all__ = ["agent", "agent_main"]


@group("agent", help="The node agent.")
def agent() -> None:
    pass


@agent.command(
    "run",
    help="Serve a GPU node (NVML) or a fleet of simulated nodes: discover GPUs, track their health, "
    "publish GPUNode, labels and capacity, evict pods from failed GPUs, export metrics "
    "(docs/gpu-health.md). Give exactly one of --node and --simulate-nodes, or --workstation: no "
    "cluster, this machine's GPUs run a job queue over a local socket (docs/workstation.md).",
    context_settings=CONTEXT,  # -h as well when `neuronetes-agent` runs this command on its own
)
@click.option(
    "--workstation",
    is_flag=True,
    help="workstation mode: schedule jobs on this machine, no cluster (docs/workstation.md)",
)
# The mode's former name, kept so that existing command lines and units still start.
@click.option("--standalone", "standalone_alias", is_flag=True, hidden=True)
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
    "/run/neuronetes); --workstation: the daemon's state (default $NEURONETES_STATE_DIR, else "
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
    "--model-cache-dir",
    default="/var/cache/neuronetes/models",
    show_default=True,
    help="--node: the host model cache whose complete models are reported in GPUNode cachedModels "
    "(docs/model-cache.md; '' for none)",
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
@WORKSTATION_OPTIONS
@LOG_LEVEL
@with_version  # `neuronetes-agent --version` (that script is `agent run`)
def agent_run(**opts: Any) -> int:
    workstation = {k: opts.pop(k) for k in WORKSTATION_KEYS}
    if opts.pop("workstation") | opts.pop("standalone_alias"):
        if opts["node"] is not None or opts["simulate_nodes"] is not None:
            raise click.UsageError("--workstation runs without a cluster: no --node or --simulate-nodes")
        return run_workstation(opts["state_dir"], opts["shim_library"], opts["log_level"], **workstation)
    if (opts["node"] is None) == (opts["simulate_nodes"] is None):
        raise click.UsageError("give exactly one of --node and --simulate-nodes (or --workstation)")
    if any(v is not None for v in workstation.values()):
        raise click.UsageError(
            "--simulate-gpus, --utilization-cap, --headroom, --aging-seconds, --checkpoint-deadline, "
            "--cuda-driver, --containment, --log-max-size and --max-clients need --workstation"
        )
    opts["state_dir"] = opts["state_dir"] or "/run/neuronetes"
    from neuronetes_agent.daemon.commands import cmd_agent_run  # the agent's stack: only when run

    return cmd_agent_run(argparse.Namespace(**opts))


def agent_main() -> int:
    """`neuronetes-agent`: the node agent on its own, ``neuronetes-agent --workstation [...]`` for
    workstation mode (the same options as ``neuronetes agent run``)."""
    from . import main

    # This command itself, not the root's `agent run`: its usage line reads `neuronetes-agent [OPTIONS]`.
    return main(sys.argv[1:], prog_name="neuronetes-agent", command=agent_run)
