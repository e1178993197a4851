"""The root command group and the one table of its commands.

A new area of the CLI is a module with a click command or group, listed in `COMMANDS`; each
group carries `--version` through `group` (this module), so ``neuronetes X --version`` works
for every X.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

import neuronetes

__all__ = ["COMMANDS", "build_root", "group", "verbose"]

CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}

_state = {"verbose": False}


def verbose() -> bool:
    """Whether the root's ``-v`` was given (the error path prints tracebacks then)."""
    return _state["verbose"]


def _version(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.version_option(
        neuronetes.__version__, "--version", package_name="neuronetes", message="%(prog)s %(version)s"
    )(func)


def group(name: str, help: str) -> Callable[[Callable[..., Any]], click.Group]:
    """A command group with ``--version``; its callback does nothing."""

    def make(func: Callable[..., Any]) -> click.Group:
        return click.group(name, help=help, context_settings=CONTEXT)(_version(func))

    return make


def _commands() -> list[click.Command]:
    """Every top-level command, in help order. Areas are imported here, not at module level, so
    that `neuronetes.cli` stays cheap to import (each area imports its heavy parts when run)."""
    from . import agent, cluster, dev, extender, operator, simulate, workstation

    return [
        simulate.simulate,
        dev.dev,
        dev.demo,
        extender.extender,
        operator.operator,
        operator.webhook,
        agent.agent,
        *cluster.COMMANDS,
        *workstation.COMMANDS,
    ]


# The registration table: one entry per module that adds top-level commands.
COMMANDS: list[Callable[[], list[click.Command]]] = [_commands]


def build_root() -> click.Group:
    @click.group(
        "neuronetes",
        context_settings=CONTEXT,
        help="NeuroNetes: GPU scheduling for Kubernetes.",
    )
    @_version
    @click.option("-v", "--verbose", is_flag=True, help="show the traceback of an unexpected error")
    def root(verbose: bool) -> None:
        _state["verbose"] = verbose

    for source in COMMANDS:
        for command in source():
            root.add_command(command)
    return root
