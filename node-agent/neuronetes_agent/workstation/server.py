"""The daemon's Unix socket (``<state-dir>/daemon.sock``, mode 0600: only its owner may talk to it).

One thread per connection, one request per connection; every reply is produced by
`handlers.handle`. A request that is too large, malformed or not complete within its deadline gets
one error reply; a handler that fails unexpectedly gets an ``internal`` reply and a log line, never
a dead daemon. Slow clients cannot hold the daemon: the whole request must arrive within
`request_deadline_s` (not per read), and at most `max_clients` connections are served at once —
one more gets a ``busy`` reply at once and is closed.

The socket is bound inside the checked state directory through its open descriptor
(``/proc/self/fd/N/daemon.sock``), created ``0600`` (umask), never through a path another user
could redirect; a stale socket is removed relative to the same descriptor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import threading
import time
from pathlib import Path
from typing import Any, Final

from . import protocol as p
from .handlers import handle
from .scheduler import Scheduler
from .statedir import StateDir

__all__ = [
    "DEFAULT_MAX_CLIENTS",
    "MAX_SOCKET_PATH_BYTES",
    "REQUEST_DEADLINE_S",
    "DaemonServer",
    "check_socket_path",
    "socket_path",
]

log = logging.getLogger(__name__)
REQUEST_DEADLINE_S: Final = 10.0  # the whole request, however it trickles in
_SEND_DEADLINE_S: Final = 10.0
DEFAULT_MAX_CLIENTS: Final = 16


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


def read_request(sock: socket.socket, deadline_s: float) -> bytes | p.Err | None:
    """One request line (up to `MAX_REQUEST_BYTES`), all of it within `deadline_s`; an error to
    answer; or None when the client went away."""
    end = time.monotonic() + deadline_s
    data = bytearray()
    while b"\n" not in data and len(data) <= p.MAX_REQUEST_BYTES:
        left = end - time.monotonic()
        if left <= 0:
            return p.Err("bad_request", f"request not complete within {deadline_s:g} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            return p.Err("bad_request", f"request not complete within {deadline_s:g} s")
        except OSError:
            return None
        if not chunk:
            break
        data += chunk
    line = bytes(data.partition(b"\n")[0] + b"\n") if b"\n" in data else bytes(data)
    if len(line) > p.MAX_REQUEST_BYTES:
        return p.Err("bad_request", f"request larger than {p.MAX_REQUEST_BYTES} bytes")
    if not line.strip():
        return p.Err("bad_request", "empty request")
    return line


class _Handler(socketserver.BaseRequestHandler):
    server: DaemonServer
    request: socket.socket

    def handle(self) -> None:
        raw = read_request(self.request, self.server.request_deadline_s)
        if raw is None:
            return
        if isinstance(raw, p.Err):
            reply = p.encode_reply(raw)
        else:
            try:
                reply = handle(self.server.scheduler, raw)
            except Exception as exc:  # a handler bug must not end the daemon
                log.exception("request failed")
                reply = p.encode_reply(p.Err("internal", f"the daemon failed to answer: {exc}"))
        self.request.settimeout(_SEND_DEADLINE_S)
        with contextlib.suppress(OSError):
            self.request.sendall(reply)


class DaemonServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = 128  # connections waiting to be accepted (each then served, or told busy)

    def __init__(
        self,
        state_dir: Path,
        scheduler: Scheduler,
        *,
        max_clients: int = DEFAULT_MAX_CLIENTS,
        request_deadline_s: float = REQUEST_DEADLINE_S,
    ) -> None:
        if max_clients < 1:
            raise ValueError(f"--max-clients {max_clients}: at least 1")
        self.scheduler = scheduler
        self.max_clients = max_clients
        self.request_deadline_s = request_deadline_s
        self._slots = threading.BoundedSemaphore(max_clients)
        self.path = socket_path(state_dir)  # before binding: a failed bind calls server_close
        self._state = StateDir(state_dir, create=False)
        with contextlib.suppress(FileNotFoundError):
            # a stale socket of a daemon that was killed (the state lock is ours now)
            os.unlink(p.SOCKET_NAME, dir_fd=self._state.fd)
        old = os.umask(0o177)
        try:
            super().__init__(f"/proc/self/fd/{self._state.fd}/{p.SOCKET_NAME}", _Handler)
        finally:
            os.umask(old)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            busy = p.Err("busy", f"the daemon is serving {self.max_clients} clients already: try again")
            with contextlib.suppress(OSError):
                request.send(p.encode_reply(busy), socket.MSG_DONTWAIT)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p.SOCKET_NAME, dir_fd=self._state.fd)
        self._state.close()
