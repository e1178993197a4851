"""The root command group and the one table of its commands.

A new area of the CLI is a module with click commands or groups, listed in `COMMANDS`; each
group carries `--version` through `group` (this module), so ``neuronetes X --version`` works
for every X.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import click

import neuronetes

__all__ = ["COMMANDS", "build_root", "group", "verbose"]

CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}

_state = {"verbose": False}


def verbose() -> bool:
    """Whether the root's ``-v`` was given (the error path prints tracebacks then)."""
    return _state["verbose"]


def with_version(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.version_option(
        neuronetes.__version__, "--version", package_name="neuronetes", message="%(prog)s %(version)s"
    )(func)


def group(name: str, help: str) -> Callable[[Callable[..., Any]], click.Group]:
    """A command group with ``--version``; its callback does nothing."""

    def make(func: Callable[..., Any]) -> click.Group:
        return click.group(name, help=help, context_settings=CONTEXT)(with_version(func))

    return make


# The registration table: each module of `neuronetes.cli` with its top-level commands, in help
# order. Modules are imported when the root is built (each imports its heavy parts only when a
# command runs), so `import neuronetes.cli` stays cheap.
COMMANDS: list[tuple[str, tuple[str, ...]]] = [
    ("simulate", ("simulate",)),
    ("dev", ("dev", "demo")),
    ("extender", ("extender",)),
    ("operator", ("operator", "webhook")),
    ("agent", ("agent",)),
    ("cluster", ("status", "health", "drain", "offline", "online")),
    ("top", ("top",)),
    ("explain", ("explain",)),
    ("workstation", ("submit", "jobs", "cancel", "watch")),
]


def _registered() -> Iterator[click.Command]:
    for module_name, names in COMMANDS:
        # By name from the table: one list of the CLI's areas, in help order (a plugin table).
        module = importlib.import_module(f"{__package__}.{module_name}")
        for name in names:
            command = getattr(module, name)
            if not isinstance(command, click.Command):
                raise TypeError(f"neuronetes.cli.{module_name}.{name} is not a click command")
            yield command


class _InOrder(click.Group):
    """Lists its commands in the order they were added (the table's), not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


def build_root() -> click.Group:
    _state["verbose"] = False  # a fresh command line: `main` may run several times in one process

    @click.group(
        "neuronetes",
        cls=_InOrder,
        context_settings=CONTEXT,
        help="NeuroNetes: GPU scheduling for Kubernetes.",
    )
    @with_version
    @click.option("-v", "--verbose", is_flag=True, help="show the traceback of an unexpected error")
    def root(verbose: bool) -> None:
        _state["verbose"] = verbose

    for command in _registered():
        root.add_command(command)
    _carry_settings(root)
    return root


def _carry_settings(command: click.Command) -> None:
    """Give every command the root's context settings itself: click caches a command's help option
    from the first context that builds it, so one parsed without its parents (a test, an embedding
    program) would otherwise lose ``-h`` for every later command line too."""
    for key, value in CONTEXT.items():
        command.context_settings.setdefault(key, value)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _carry_settings(sub)
