"""The CLI's side of the protocol: find the daemon's socket, send one request, read one reply.

The state directory is ``--state-dir``, else ``$NEURONETES_STATE_DIR``, else
``$XDG_STATE_HOME/neuronetes`` (``~/.local/state/neuronetes``). No socket, or nobody listening,
is the typed reply ``no_daemon``, which the CLI prints as one line. The client talks only to a
socket of its own user in a state directory nobody else may write (``unsafe`` otherwise): another
local user cannot put a daemon of theirs in its way.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any, Final

import msgspec

from . import protocol as p
from .statedir import StateDirError, check_socket

__all__ = ["ENV_STATE_DIR", "call", "daemon_live", "default_state_dir", "state_dir_from"]

ENV_STATE_DIR: Final = "NEURONETES_STATE_DIR"
_TIMEOUT_S: Final = 30.0


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "neuronetes"


def state_dir_from(option: str | None) -> tuple[Path, bool]:
    """The state directory and whether the user named it (option or environment)."""
    if option:
        return Path(option).expanduser(), True
    env = os.environ.get(ENV_STATE_DIR)
    if env:
        return Path(env).expanduser(), True
    return default_state_dir(), False


def _no_daemon(state_dir: Path, why: str) -> p.Err:
    return p.Err(
        "no_daemon",
        f"no workstation daemon is running for {state_dir} ({why}); start one with "
        f"`neuronetes agent run --workstation --state-dir {state_dir}`",
    )


def call(state_dir: Path, request: p.Request, timeout_s: float = _TIMEOUT_S) -> p.Reply:
    path = state_dir / p.SOCKET_NAME
    if not path.exists():
        return _no_daemon(state_dir, "no socket")
    try:
        check_socket(state_dir, path)
    except StateDirError as exc:
        return p.Err("unsafe", str(exc))
    except OSError as exc:
        return _no_daemon(state_dir, exc.strerror or str(exc))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            # A daemon at its client limit answers "busy" and closes unread: read that answer.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(p.encode_request(request))
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        except (ConnectionRefusedError, FileNotFoundError):
            return _no_daemon(state_dir, "nobody listens on its socket")
        except OSError as exc:
            return p.Err("internal", f"talking to the daemon at {path}: {exc}")
    try:
        body: dict[str, Any] = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return p.Err("internal", f"the daemon at {path} sent no valid reply")
    if body.get("ok"):
        return p.Ok(body.get("result"))
    return p.Err(body.get("error", "internal"), str(body.get("message", "unknown error")))


def daemon_live(state_dir: Path) -> bool:
    return isinstance(call(state_dir, p.Ping(), timeout_s=2.0), p.Ok)
