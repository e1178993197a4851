"""Reaching the workstation daemon from the CLI, and running it (``agent run --standalone``).

`target_state_dir` is the ONE rule for the verbs that exist for a cluster and a workstation
(``status``, ``health``, ``drain``, ``offline``, ``online``; docs/workstation.md, "CLI").
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Final

import click

from .output import CliError

__all__ = [
    "STANDALONE_KEYS",
    "STANDALONE_OPTIONS",
    "STATE_DIR",
    "call",
    "run_standalone",
    "standalone",
    "state_dir_of",
    "target_state_dir",
]

STATE_DIR = click.option(
    "--state-dir",
    metavar="DIR",
    help="the workstation daemon's state directory (default: $NEURONETES_STATE_DIR, else "
    "$XDG_STATE_HOME/neuronetes)",
)


def standalone(module: str) -> Any:
    """A module of `neuronetes_agent.workstation`, imported when used."""
    return importlib.import_module(f"neuronetes_agent.workstation.{module}")


def target_state_dir(option: str | None, kubeconfig: str | None = None) -> Path | None:
    """THE target rule for verbs that exist for both: the workstation's state directory, or None
    for the cluster. In order: ``--state-dir`` → workstation; ``--kubeconfig`` → cluster;
    ``$NEURONETES_STATE_DIR`` set → workstation; a daemon answering in the default state
    directory → workstation; otherwise the cluster."""
    client = standalone("client")
    if option:
        return Path(option).expanduser()
    if kubeconfig:
        return None
    path, named = client.state_dir_from(None)
    return path if named or client.daemon_live(path) else None


def state_dir_of(option: str | None) -> Path:
    path: Path = standalone("client").state_dir_from(option)[0]
    return path


def call(state_dir: Path, request: Any) -> Any:
    protocol = standalone("protocol")
    reply = standalone("client").call(state_dir, request)
    if isinstance(reply, protocol.Err):
        raise CliError(reply.message)
    return reply.result


# ---- the daemon (`agent run --standalone`) ------------------------------------------------------

_STANDALONE: Final = (
    click.option("--simulate-gpus", type=click.IntRange(1, 8), help="--standalone: simulate N GPUs"),
    click.option(
        "--utilization-cap", type=click.FloatRange(1, 90), help="--standalone: admission cap, percent (85)"
    ),
    click.option(
        "--headroom", type=click.FloatRange(0, 89), help="--standalone: safety headroom, percent (5)"
    ),
    click.option(
        "--aging-seconds",
        type=click.FloatRange(min=0, min_open=True),
        help="--standalone: a waiting job gains one priority point per this many seconds (60)",
    ),
    click.option(
        "--checkpoint-deadline",
        type=click.FloatRange(min=0, min_open=True),
        help="--standalone: seconds a --checkpointable job has to exit after SIGUSR1 (30)",
    ),
    click.option(
        "--cuda-driver", metavar="PATH", help="--standalone: the CUDA driver library (libcuda.so.1)"
    ),
    click.option(
        "--containment",
        type=click.Choice(["auto", "cgroup2", "cgroup1", "subreaper"]),
        help="--standalone: how each attempt is contained (auto: the first usable cgroup, else subreaper)",
    ),
    click.option(
        "--log-max-size",
        metavar="SIZE",
        help="--standalone: each job log is rotated to one .1 file at this size (64Mi; at least 1Mi)",
    ),
    click.option(
        "--max-clients",
        type=click.IntRange(1, 1024),
        help="--standalone: connections served at once; one more gets a busy reply (16)",
    ),
)
STANDALONE_KEYS: Final = (
    "simulate_gpus",
    "utilization_cap",
    "headroom",
    "aging_seconds",
    "checkpoint_deadline",
    "cuda_driver",
    "containment",
    "log_max_size",
    "max_clients",
)


def STANDALONE_OPTIONS(func: Any) -> Any:  # a decorator, named like the other option constants
    for option in reversed(_STANDALONE):
        func = option(func)
    return func


def run_standalone(state_dir: str | None, shim_library: str | None, log_level: str, **opts: Any) -> int:
    """Run the workstation daemon until SIGTERM/SIGINT."""
    main = standalone("main")
    given = {k: v for k, v in opts.items() if v is not None}
    return int(
        main.run_daemon(
            main.DaemonOptions(
                state_dir=state_dir_of(state_dir),
                shim_library=Path(shim_library) if shim_library else None,
                log_level=log_level,
                **given,
            )
        )
    )
