"""The last lines of a job's log, read from the end of the file in bounded memory.

``jobs logs --tail N`` never reads a whole log: it reads backwards from the end, at most
`MAX_SCAN_BYTES`, finds the last N line breaks, and returns each line cut to `MAX_LINE_BYTES`
(marked with how long it was). When the log holds fewer than N lines and was rotated, the rest
comes from the end of ``NAME.1``. Memory is bounded by the scan, whatever the file holds.

``jobs logs -f`` reads forwards instead (`read_after`): what was written after the offset it got
last, at most `MAX_SCAN_BYTES` a call, continuing into ``NAME.1`` first when the log was rotated
since.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

__all__ = [
    "MAX_LINES",
    "MAX_LINE_BYTES",
    "MAX_SCAN_BYTES",
    "log_size",
    "read_after",
    "tail",
    "tail_rotated",
]

MAX_LINES: Final = 10_000
MAX_LINE_BYTES: Final = 4096
MAX_SCAN_BYTES: Final = 4 << 20
_BLOCK: Final = 1 << 16


def _line(fd: int, start: int, end: int, cut_before: bool) -> list[str]:
    size = end - start
    text = os.pread(fd, min(size, MAX_LINE_BYTES), start).decode(errors="replace")
    if size > MAX_LINE_BYTES:
        text += f"… ({size} bytes, cut to {MAX_LINE_BYTES})"
    if cut_before:
        text = "…" + text
    return text.splitlines() or [""]


def tail(fd: int, lines: int, budget: int = MAX_SCAN_BYTES) -> tuple[list[str], int, bool]:
    """The last `lines` lines of the open file `fd`, reading at most `budget` bytes back from its
    end: (lines, bytes scanned, whether the file's start was reached)."""
    size = os.fstat(fd).st_size
    floor = max(0, size - budget)
    end = size
    if size and os.pread(fd, 1, size - 1) == b"\n":
        end = size - 1  # the last line's own break
    breaks: list[int] = []  # offsets of line breaks before `end`, newest first
    pos = end
    while pos > floor and len(breaks) < lines:
        start = max(floor, pos - _BLOCK)
        block = os.pread(fd, pos - start, start)
        i = len(block)
        while len(breaks) < lines:
            j = block.rfind(b"\n", 0, i)
            if j < 0:
                break
            breaks.append(start + j)
            i = j
        pos = start
    bounds = [end, *breaks]  # newest first: each line lies between two bounds
    segments = [(bounds[k + 1] + 1, bounds[k], False) for k in range(len(breaks))]
    reached = len(breaks) < lines  # the scan ran out before `lines` breaks: the first line in reach
    if reached and size:
        segments.append((floor, bounds[-1], floor > 0))  # from the file's start, or cut by the budget
    out: list[str] = []
    for start, stop, cut in reversed(segments):
        out.extend(_line(fd, start, stop, cut))
    return out[-lines:] if lines > 0 else [], size - pos, reached and floor == 0


def tail_rotated(open_log: Callable[[str], int], name: str, lines: int) -> list[str]:
    """The last `lines` lines of log `name`, continued into ``name.1`` when it holds fewer.
    `open_log` opens a log by name (raising FileNotFoundError when there is none)."""
    out: list[str] = []
    scanned, whole = 0, True
    for which in (name, name + ".1"):
        if len(out) >= lines or not whole or scanned >= MAX_SCAN_BYTES:
            break
        try:
            fd = open_log(which)
        except FileNotFoundError:
            continue
        try:
            got, used, whole = tail(fd, lines - len(out), MAX_SCAN_BYTES - scanned)
        finally:
            os.close(fd)
        out[:0] = got
        scanned += used
    return out


def log_size(open_log: Callable[[str], int], name: str) -> int:
    """The current size of log `name` (0 when there is none yet): where following it starts."""
    try:
        fd = open_log(name)
    except FileNotFoundError:
        return 0
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _read_from(fd: int, offset: int, budget: int) -> bytes:
    return os.pread(fd, max(0, min(budget, os.fstat(fd).st_size - offset)), offset)


def read_after(open_log: Callable[[str], int], name: str, offset: int) -> tuple[bytes, int]:
    """What log `name` holds after byte `offset`, at most `MAX_SCAN_BYTES`, and the offset to ask
    from next time. A log smaller than `offset` was rotated: the rest of ``name.1`` comes first,
    then the new log from its start."""
    try:
        fd = open_log(name)
    except FileNotFoundError:
        return b"", 0
    try:
        size = os.fstat(fd).st_size
        data = b""
        if size < offset:  # rotated since: finish the old file, then start the new one
            try:
                old = open_log(name + ".1")
            except FileNotFoundError:
                pass
            else:
                try:
                    data = _read_from(old, offset, MAX_SCAN_BYTES)
                finally:
                    os.close(old)
                if len(data) == MAX_SCAN_BYTES:
                    return data, offset + len(data)  # the rest of the old file next time
            offset = 0
        more = _read_from(fd, offset, MAX_SCAN_BYTES - len(data))
        return data + more, offset + len(more)
    finally:
        os.close(fd)
