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

__all__ = ["DaemonServer", "socket_path"]

log = logging.getLogger(__name__)
_READ_TIMEOUT_S: Final = 10.0


def socket_path(state_dir: Path) -> Path:
    return state_dir / p.SOCKET_NAME


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
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket of a daemon that was killed (the state lock is ours now)
        old = os.umask(0o177)
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self.path = path

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
