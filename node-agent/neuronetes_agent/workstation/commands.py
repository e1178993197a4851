"""What a job's command line runs: its argv (the words themselves, or ``/bin/sh -c`` when it uses
shell syntax) and, for a command run directly, whether its program can be found (checked at
submit, so a typo is refused at once instead of failing later)."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Final

__all__ = ["command_argv", "missing_program"]

_SHELL_SYNTAX: Final = frozenset("|&;<>()$`\\*?[]#~{}\n")


def command_argv(command: str) -> list[str]:
    """The job's argv: the words themselves when the command uses no shell syntax (so the program is
    the shepherd's child and gets SIGUSR1 itself), else ``/bin/sh -c COMMAND``."""
    try:
        words = shlex.split(command) if not _SHELL_SYNTAX.intersection(command) else []
    except ValueError:  # unbalanced quotes: the shell reports it
        words = []
    if words and "=" not in words[0]:
        return words
    return ["/bin/sh", "-c", command]


def missing_program(command: str, workdir: str, path: str) -> str | None:
    """Why a command run directly cannot start (its program is neither an executable path, taken
    from `workdir`, nor on `path`), or None. A shell command's programs are the shell's to find."""
    argv = command_argv(command)
    if argv == ["/bin/sh", "-c", command]:
        return None
    program = argv[0]
    if "/" in program:
        where = Path(workdir or ".", program)
        if where.is_file() and os.access(where, os.X_OK):
            return None
        return f"command not found: {program!r} is not an executable file"
    if shutil.which(program, path=path) is not None:
        return None
    return f"command not found: {program!r} is not on PATH"
