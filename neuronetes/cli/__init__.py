"""The `neuronetes` command line (and `kubectl-neuronetes`, the same commands as a kubectl plugin).

`main` is the one error path: a command returns its exit status; an expected failure raised
anywhere below (a click usage error, `CliError`, or one of the library errors in `EXPECTED`)
becomes ONE ``error: ...`` line on stderr and exit status 2 (usage) or 1 (runtime). Anything
else is a bug: one line saying so, and the traceback only with the root's ``-v``.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Final

import click

from .output import CliError
from .root import build_root, verbose

__all__ = ["CliError", "kubectl_main", "main"]

USAGE: Final = 2
RUNTIME: Final = 1


def _one_line(text: object) -> str:
    return " ".join(str(text).split()).strip("'\"") or "(no message)"


def _kube_error(exc: BaseException) -> str | None:
    """A Kubernetes client failure as one line (None when `exc` is not one)."""
    module = type(exc).__module__
    if module.startswith("kubernetes.config"):
        return f"kubeconfig: {_one_line(exc)}"
    status = getattr(exc, "status", None)
    if module.startswith("kubernetes.client") and status is not None:
        reason = getattr(exc, "reason", "") or ""
        if status == 404:
            return f"not found ({reason or 404})"
        return f"API server answered {status} {reason}".rstrip()
    if module.startswith("urllib3"):
        return f"cannot reach the API server: {_one_line(getattr(exc, 'reason', None) or exc)}"
    return None


# Expected failures that are not click's: (exception type, exit status, message).
EXPECTED: Final[tuple[tuple[type[BaseException], int, Callable[[BaseException], str]], ...]] = (
    (FileNotFoundError, RUNTIME, lambda e: f"{getattr(e, 'filename', '') or ''}: no such file".lstrip(": ")),
    (
        PermissionError,
        RUNTIME,
        lambda e: f"{getattr(e, 'filename', '') or ''}: permission denied".lstrip(": "),
    ),
    (OSError, RUNTIME, _one_line),
)


def _fail(message: str, status: int) -> int:
    click.echo(f"error: {message}", err=True)
    return status


def main(
    argv: Sequence[str] | None = None, prog_name: str = "neuronetes", command: click.Command | None = None
) -> int:
    """Run the CLI on `argv` (default: sys.argv[1:]); returns the exit status. `command`: one command
    run on its own under `prog_name` (`neuronetes-agent`), through the same error path."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        root = build_root()  # also resets the root's -v for a fresh command line
        status = (command or root).main(args=args, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        return _fail(
            f"a command is needed (see {exc.ctx.command_path if exc.ctx else prog_name} --help)", USAGE
        )
    except click.ClickException as exc:
        return _fail(_one_line(exc.format_message()), exc.exit_code)
    except click.Abort:  # click's form of KeyboardInterrupt
        return _fail("interrupted", 130)
    except BrokenPipeError:  # `neuronetes status --all | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except Exception as exc:
        kube = _kube_error(exc)
        if kube is not None:
            return _fail(kube, RUNTIME)
        for kind, code, message in EXPECTED:
            if isinstance(exc, kind):
                return _fail(message(exc), code)
        if verbose():
            traceback.print_exc()
        return _fail(
            f"unexpected {type(exc).__name__}: {_one_line(exc)} (a bug: rerun with `{prog_name} -v ...` "
            "for the traceback and report it)",
            RUNTIME,
        )
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    return int(status or 0)


def kubectl_main() -> int:
    """`kubectl-neuronetes`: the same commands, named as kubectl shows plugins."""
    return main(prog_name="kubectl neuronetes")
