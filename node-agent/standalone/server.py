"""The daemon's Unix socket (``<state-dir>/daemon.sock``, mode 0600: only its owner may talk to it).

One thread per connection (`socketserver`), one request per connection; every reply is produced by
`handlers.handle`. A request that is too large, malformed or times out gets one error reply; a
handler that fails unexpectedly gets an ``internal`` reply and a log line, never a dead daemon.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socketserver
from pathlib import Path
from typing import Final

from . import protocol as p
from .handlers import handle
from .scheduler import Scheduler

__all__ = ["MAX_SOCKET_PATH_BYTES", "DaemonServer", "check_socket_path", "socket_path"]

log = logging.getLogger(__name__)
_READ_TIMEOUT_S: Final = 10.0


# sockaddr_un.sun_path holds 108 bytes on Linux, its terminating NUL included
MAX_SOCKET_PATH_BYTES: Final = 107


def socket_path(state_dir: Path) -> Path:
    return state_dir / p.SOCKET_NAME


def check_socket_path(state_dir: Path) -> None:
    """Raise ValueError when the state directory is too deep for its Unix socket."""
    path = socket_path(state_dir.resolve())
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        raise ValueError(
            f"--state-dir {state_dir}: its socket {path} would be {size} bytes long and a Unix socket "
            f"path may have at most {MAX_SOCKET_PATH_BYTES}; choose a shorter state directory"
        )


class _Handler(socketserver.StreamRequestHandler):
    server: DaemonServer

    def handle(self) -> None:
        self.connection.settimeout(_READ_TIMEOUT_S)
        try:
            raw = self.rfile.readline(p.MAX_REQUEST_BYTES + 1)
        except OSError:
            return
        if len(raw) > p.MAX_REQUEST_BYTES:
            reply = p.encode_reply(p.Err("bad_request", f"request larger than {p.MAX_REQUEST_BYTES} bytes"))
        elif not raw.strip():
            reply = p.encode_reply(p.Err("bad_request", "empty request"))
        else:
            try:
                reply = handle(self.server.scheduler, raw)
            except Exception as exc:  # a handler bug must not end the daemon
                log.exception("request failed")
                reply = p.encode_reply(p.Err("internal", f"the daemon failed to answer: {exc}"))
        with contextlib.suppress(OSError):
            self.wfile.write(reply)


class DaemonServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, state_dir: Path, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        path = socket_path(state_dir)
        self.path = path  # before binding: a failed bind calls server_close
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket of a daemon that was killed (the state lock is ours now)
        old = os.umask(0o177)
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
