"""The daemon's local protocol: one JSON request per connection, one JSON reply (docs/workstation.md).

A request is one line, a JSON object whose ``op`` names it; the reply is one line, either
``{"ok": true, "result": …}`` or ``{"ok": false, "error": CODE, "message": "…"}``. Requests are
decoded and validated by msgspec against the structures below, so a malformed request gets one
``bad_request`` reply naming the problem and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import msgspec

__all__ = [
    "MAX_REQUEST_BYTES",
    "SOCKET_NAME",
    "Cancel",
    "Describe",
    "Err",
    "GpuAction",
    "GpuAdmin",
    "Health",
    "ListJobs",
    "Logs",
    "Ok",
    "Ping",
    "Reply",
    "Request",
    "Simulate",
    "SimulatedProcess",
    "Status",
    "Submit",
    "decode_request",
    "encode_reply",
]

SOCKET_NAME: Final = "daemon.sock"
MAX_REQUEST_BYTES: Final = 1 << 20


class _Op(msgspec.Struct, forbid_unknown_fields=True, tag_field="op"):
    pass


class Ping(_Op, tag="ping"):
    pass


class Submit(_Op, tag="submit"):
    command: str
    priority: int
    name: str = ""
    gpus: int = 1
    gpu_memory: str = ""  # a size (8Gi); empty: whole GPUs
    gpu_compute: int | None = None  # None: 100 for whole GPUs, a share's part of the GPU's memory
    checkpointable: bool = False
    workdir: str = ""


class ListJobs(_Op, tag="list"):
    all: bool = False


class Status(_Op, tag="status"):
    all: bool = False


class Describe(_Op, tag="describe"):
    job: str


class Cancel(_Op, tag="cancel"):
    job: str
    force: bool = False  # SIGKILL at once (`jobs kill`) instead of SIGTERM then SIGKILL


class Logs(_Op, tag="logs"):
    job: str
    stream: Literal["stdout", "stderr"] = "stdout"
    tail: int = 100
    after: int | None = None  # following (`jobs logs -f`): what was written after this byte offset


class Health(_Op, tag="health"):
    gpu: str


GpuAction = Literal["drain", "offline", "online"]
"""What ``drain``, ``offline`` and ``online`` ask of one GPU."""


class GpuAdmin(_Op, tag="gpu"):
    gpu: str
    action: GpuAction
    force: bool = False


class SimulatedProcess(msgspec.Struct, forbid_unknown_fields=True):
    pid: int
    bytes: int  # 0 removes it


class Simulate(_Op, tag="simulate"):
    """Fault injection on the simulated backend (tests, demos): the agent's fault fields
    (utilizationPercent, temperatureCelsius, xid, …) and processes the daemon did not start."""

    gpu: str
    fault: dict[str, Any] = {}
    process: SimulatedProcess | None = None


Request = Ping | Submit | ListJobs | Status | Describe | Cancel | Logs | Health | GpuAdmin | Simulate

_DECODER: Final = msgspec.json.Decoder(Request)
_ENCODER: Final = msgspec.json.Encoder()

ErrorCode = Literal[
    "bad_request",
    "not_found",
    "invalid",
    "conflict",
    "unsupported",
    "busy",
    "internal",
    "no_daemon",
    "unsafe",
]


@dataclass(frozen=True, slots=True)
class Ok:
    result: Any


@dataclass(frozen=True, slots=True)
class Err:
    code: ErrorCode
    message: str


Reply = Ok | Err


def decode_request(raw: bytes) -> Request | Err:
    try:
        return cast(Request, _DECODER.decode(raw))
    except msgspec.ValidationError as exc:
        return Err("bad_request", f"invalid request: {exc}")
    except msgspec.DecodeError as exc:
        return Err("bad_request", f"malformed JSON: {exc}")


def encode_reply(reply: Reply) -> bytes:
    if isinstance(reply, Ok):
        body: dict[str, Any] = {"ok": True, "result": reply.result}
    else:
        body = {"ok": False, "error": reply.code, "message": reply.message}
    return _ENCODER.encode(body) + b"\n"


def encode_request(request: Request) -> bytes:
    return _ENCODER.encode(request) + b"\n"
