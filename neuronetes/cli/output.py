"""What the CLI prints: tables, ``-o json|yaml``, progress, and the one error line.

Every command prints results through `emit` (a rich table by default, or the same rows as JSON or
YAML with ``-o``), shows progress on stderr through `progress`/`spinner` (only on a terminal, so
pipes and tests get the plain lines), and reports an expected failure by raising `CliError` (exit
1, runtime) or a click usage error (exit 2): `neuronetes.cli.main` turns either into exactly one
``error: ...`` line on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

__all__ = [
    "FORMATS",
    "CliError",
    "bar",
    "emit",
    "err_console",
    "output_option",
    "progress",
    "rows_of",
    "spinner",
    "stdout_console",
]

FORMATS: Final = ("table", "json", "yaml")

F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """An expected runtime failure (API unreachable, object not found, a build that failed):
    one line, exit status 1. A wrong command line is a click usage error instead (exit 2), whoever
    finds it (docs/cli.md, "Errors and exit codes")."""

    exit_code = 1


PIPE_WIDTH: Final = 250  # columns of a table written to a pipe or file: no terminal to fit, keep rows whole


def stdout_console() -> Console:
    # Built per call: tests swap sys.stdout (capsys), and a Console keeps the stream it was made with.
    console = Console(file=sys.stdout, soft_wrap=True, highlight=False)
    if not console.is_terminal:
        console = Console(file=sys.stdout, soft_wrap=True, highlight=False, width=PIPE_WIDTH)
    return console


def err_console() -> Console:
    return Console(file=sys.stderr, soft_wrap=True, highlight=False)


def output_option(func: F) -> F:
    """``-o/--output table|json|yaml`` on a listing command (the parameter ``output``)."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="output format",
    )(func)


def emit(
    output: str,
    document: Any,
    *,
    columns: Sequence[str] = (),
    rows: Sequence[Sequence[Any]] = (),
    title: str | None = None,
) -> None:
    """Print `document` as JSON or YAML, or `rows` under `columns` as a table (cells may be rich
    renderables, e.g. `bar`)."""
    if output == "json":
        click.echo(json.dumps(document, indent=2, default=str))
        return
    if output == "yaml":
        import msgspec.yaml

        click.echo(msgspec.yaml.encode(json.loads(json.dumps(document, default=str))).decode().rstrip("\n"))
        return
    table = Table(
        title=title,
        title_justify="left",
        box=None,
        pad_edge=False,
        header_style="bold",
        show_header=any(columns),
    )
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(cell if hasattr(cell, "__rich_console__") else str(cell) for cell in row))
    stdout_console().print(table)


def bar(fraction: float, width: int = 20) -> str:
    """``[#######.............]``-style bar for a 0..1 fraction (plain text: pipes keep it)."""
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    return "█" * filled + "░" * (width - filled)


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for `total` steps; yields ``advance(n)``. Drawn only on a terminal."""
    console = err_console()
    if not console.is_terminal:
        yield lambda n: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bars:
        task = bars.add_task(description, total=total)
        yield lambda n: bars.advance(task, n)


@contextmanager
def spinner(first: str) -> Iterator[Callable[[str], None]]:
    """A spinner with the current step and the time elapsed, on stderr; yields ``log(msg)``, which
    prints the step as a ``>> msg`` line (kept above the spinner) and shows it beside the spinner
    until the next one. On a pipe only the lines are printed."""
    console = err_console()
    if not console.is_terminal:
        yield lambda msg: click.echo(f">> {msg}", err=True)
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bars:
        task = bars.add_task(first, total=None)

        def log(msg: str) -> None:
            bars.console.print(f">> {msg}", markup=False, highlight=False)
            bars.update(task, description=msg)

        yield log


def rows_of(items: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[list[Any]]:
    """The table rows of `items` (one per item, the values of `keys`; "-" for a missing one)."""
    return [["-" if item.get(k) is None else item[k] for k in keys] for item in items]
