"""Jobs: the record, the job state machine and the submitted spec.

The state machine is one table (`TRANSITIONS`): a move it does not list is refused with a typed
`Refused` status, never applied. PENDING → QUEUED happens once the spec is stored; PREEMPTED jobs
go back through QUEUED when the scheduler picks them again (docs/workstation.md, "Job states").

Names and ids are separate namespaces: ids are ``j<number>``, and a new job may not be named so
(`JobSpec.check_new`), so a name never shadows another job's id. Sizes are at least 1 MiB.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Final

from neuronetes.quantity import QuantityError, to_bytes

__all__ = [
    "ACTIVE",
    "DEFAULT_PRIORITY",
    "FINAL",
    "MAX_PRIORITY",
    "MIN_SIZE",
    "TRANSITIONS",
    "Job",
    "JobSpec",
    "JobState",
    "Refused",
    "SpecError",
    "check_transition",
    "parse_size",
    "share_compute_default",
]


class JobState(enum.Enum):
    PENDING = "PENDING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


S = JobState
TRANSITIONS: Final[dict[JobState, frozenset[JobState]]] = {
    S.PENDING: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.QUEUED: frozenset({S.RUNNING, S.CANCELLED, S.FAILED}),
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.PREEMPTED}),
    S.PREEMPTED: frozenset({S.QUEUED, S.CANCELLED, S.FAILED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
"""Legal moves: state → the states it may go to. Final states go nowhere."""

FINAL: Final = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
ACTIVE: Final = frozenset({S.RUNNING, S.PREEMPTED})  # states that may own a live process
MAX_PRIORITY: Final = 1000
DEFAULT_PRIORITY: Final = 0
"""A job submitted without a priority: the lowest, like Slurm's nice 0 among equals — such jobs
never preempt one another, and any job given a priority may preempt them."""


def share_compute_default(memory_bytes: int, gpu_bytes: int) -> int:
    """A share's compute percent when only its memory is given: its part of the GPU's memory,
    rounded up (8Gi of an 80 GiB GPU: 10 %), so shares sized by memory fit beside each other."""
    return max(1, min(100, -(-100 * memory_bytes // max(gpu_bytes, 1))))


@dataclass(frozen=True, slots=True)
class Refused:
    """A transition the table does not allow."""

    job: str
    current: JobState
    wanted: JobState

    def __str__(self) -> str:
        return f"job {self.job}: {self.current.value} → {self.wanted.value} is not a legal transition"


def check_transition(job: str, current: JobState, wanted: JobState) -> Refused | None:
    """None when `current` → `wanted` is in the table, else why not."""
    return None if wanted in TRANSITIONS[current] else Refused(job, current, wanted)


class SpecError(ValueError):
    """A submitted spec is invalid (one line, shown to the user)."""


_NAME_RE: Final = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?")
_ID_RE: Final = re.compile(r"j[0-9]+")
MIN_SIZE: Final = 1 << 20


def parse_size(text: str, option: str = "--gpu-memory") -> int:
    """Bytes from ``8Gi``, ``512Mi``, ``4G`` or ``8GiB`` (a trailing ``B`` is tolerated), at least
    1 MiB; errors name `option`."""
    raw = text.strip()
    if raw.endswith("iB"):
        raw = raw[:-1]
    try:
        value = to_bytes(raw)
    except QuantityError:
        raise SpecError(
            f"{option}: bad size {text!r}: use a number with Ki, Mi, Gi, Ti (or k, M, G, T)"
        ) from None
    if value <= 0:
        raise SpecError(f"{option}: bad size {text!r}: must be positive")
    if value < MIN_SIZE:
        raise SpecError(f"{option}: bad size {text!r}: at least 1Mi ({MIN_SIZE} bytes)")
    return value


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What the user asked for. A job naming no share gets whole GPUs (`gpus`, default 1),
    exclusively; a share asks for memory and a compute percentage of one GPU."""

    command: str
    priority: int
    name: str = ""
    gpus: int = 1
    memory_bytes: int = 0  # 0: whole GPUs
    compute_percent: int = 100
    checkpointable: bool = False
    workdir: str = ""  # where the command runs (the submitter's directory); "" : the job's directory

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise SpecError("empty command")
        if not 0 <= self.priority <= MAX_PRIORITY:
            raise SpecError(f"bad priority {self.priority}: use 0-{MAX_PRIORITY} (higher runs first)")
        if self.name and not _NAME_RE.fullmatch(self.name):
            raise SpecError(f"bad name {self.name!r}: lower-case letters, digits, '.', '_', '-' (≤ 63)")
        if self.memory_bytes:
            if self.gpus != 1:
                raise SpecError(
                    "a GPU share (--gpu-memory/--gpu-compute) is one GPU: do not also give --gpus"
                )
            if not 1 <= self.compute_percent <= 100:
                raise SpecError(f"bad compute share {self.compute_percent}: use 1-100 (percent)")
        else:
            if self.compute_percent != 100:
                raise SpecError("--gpu-compute needs --gpu-memory (a share names both)")
            if not 1 <= self.gpus <= 16:
                raise SpecError(f"bad GPU count {self.gpus}: use 1-16")

    @property
    def whole(self) -> bool:
        return self.memory_bytes == 0

    def check_new(self) -> JobSpec:
        """The rules only a new submission must pass (stored jobs predating them still load)."""
        if _ID_RE.fullmatch(self.name):
            raise SpecError(
                f"bad name {self.name!r}: j<number> is the form of job ids; names and ids are kept"
                " apart, choose another name"
            )
        return self


@dataclass(slots=True)
class Job:
    """A job as stored: its spec, state, the GPUs it was given and its process identity."""

    id: str
    spec: JobSpec
    state: JobState
    submitted_at: float
    queued_at: float  # when it last entered the queue (aging counts from here)
    gpus: tuple[str, ...] = ()
    pid: int = 0  # the job's process group leader (the shepherd); 0: none
    pid_start: int = 0  # its /proc start time: a reused PID is another process
    token: str = ""  # NEURONETES_JOB_TOKEN of the current attempt (finds a launch the daemon lost)
    attempt: int = 0
    resume: bool = False  # the next start tells the job to resume (cooperative checkpoint)
    suspended: str = ""  # how a PREEMPTED job's process is held: "checkpoint", "stopped" or ""
    exit_code: int | None = None
    reason: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    history: list[tuple[float, str, str, str]] = field(default_factory=list)  # (at, from, to, reason)

    @property
    def name(self) -> str:
        return self.spec.name or self.id
