"""Signals handled off the main thread: a handler that touches a lock can deadlock its own thread.

Python runs a signal handler in the main thread between any two of its bytecodes — including
inside ``threading.Event.wait()``/``set()`` while the Event's lock is held. A handler that sets an
Event (or takes any lock) there waits forever for a lock its own thread holds: a daemon whose
SIGCHLD handler did this stopped scheduling, and a SIGTERM handler doing it makes a process
ignore SIGTERM until it is killed. So the handlers installed here do nothing; the interpreter
writes each signal's number to a pipe (``signal.set_wakeup_fd``), and a thread of our own reads it
and calls the process's function, where taking locks is safe.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable

__all__ = ["relay_signals"]


_lock = threading.Lock()
_handlers: dict[int, Callable[[int], None]] = {}
_relay_started = False


def _relayed(signum: int, frame: object) -> None:
    """Nothing to do in the main thread: the relay thread handles the signal."""


def _relay(read_end: int) -> None:
    while True:
        for signum in os.read(read_end, 512):
            # The pipe carries every signal Python handles, not only ours: call only what was asked.
            handle = _handlers.get(signum)
            if handle is not None:
                handle(signum)


def relay_signals(handle: Callable[[int], None], signals: Iterable[int]) -> None:
    """Call ``handle(signum)`` from the relay thread for each of ``signals`` the process receives
    (a later call for the same signal replaces its handler).

    The first call must come from the main thread (``set_wakeup_fd`` is process-wide and
    main-thread only); it starts the one relay thread. Signals that arrive faster than the thread
    reads may be merged (a full pipe drops bytes): ``handle`` must treat a signal as "something
    happened", not count them.
    """
    global _relay_started
    with _lock:
        if not _relay_started:
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            threading.Thread(target=_relay, args=(read_end,), name="signals", daemon=True).start()
            _relay_started = True
        for sig in signals:
            _handlers[sig] = handle
            signal.signal(sig, _relayed)
