"""Admission: which waiting job goes next, and is it safe to start it now?

Queue order is effective priority, highest first: the submitted priority plus one point per
`aging_s` seconds waited (since submission or the last preemption), so a low-priority job
overtakes a stream of newer higher-priority jobs after a bounded wait; ties go to the job waiting
longest. Aging orders the queue only: preemption compares submitted priorities.

A job starts on a GPU only when every rule passes (priority never overrides them):
- health: the GPU's state is schedulable (not DEGRADED, RESETTING, OFFLINE: the agent's GPU state
  machine, which also pauses a GPU above 85 °C) and it is not drained;
- utilization: the load the daemon's own jobs do not account for (measured utilization minus the
  compute shares of its jobs running there) plus the safety headroom is at most the cap;
- compute: a running whole-GPU job is exclusive, and a whole-GPU job starts where no job of the
  daemon computes; shares on one GPU add up to at most 100 %. A stopped job (SIGSTOP) does not
  compute: it holds memory only;
- memory: the job's memory fits beside what the daemon's jobs hold — a running job its share or
  the whole GPU, a stopped job what its processes hold, measured (NVML's process list) — and
  what processes the daemon did not start hold. A whole-GPU job needs all the memory those
  outside processes leave: it starts only where no job of the daemon holds any.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from .gpus import GpuView
from .jobs import Job, JobState

__all__ = [
    "MAX_CAP",
    "Admit",
    "GpuLoad",
    "Hold",
    "Measured",
    "Settings",
    "effective_priority",
    "external_memory",
    "gib",
    "is_stopped",
    "loads",
    "measure",
    "place",
    "queue_order",
    "whole_gpu_memory",
]

MAX_CAP: Final = 90.0


@dataclass(frozen=True, slots=True)
class Settings:
    cap_percent: float = 85.0
    headroom_percent: float = 5.0
    aging_s: float = 60.0

    def __post_init__(self) -> None:
        if not 1 <= self.cap_percent <= MAX_CAP:
            raise ValueError(f"utilization cap {self.cap_percent}: use 1-{MAX_CAP:.0f} (percent)")
        if not 0 <= self.headroom_percent < self.cap_percent:
            raise ValueError(f"headroom {self.headroom_percent}: use 0 up to the cap")
        if self.aging_s <= 0:
            raise ValueError(f"aging interval {self.aging_s}: must be positive (seconds)")


@dataclass(slots=True)
class GpuLoad:
    """What the daemon's jobs hold on one GPU."""

    compute: int = 0  # percent, of running jobs
    memory: int = 0  # bytes: reserved by running jobs, measured for stopped ones
    holders: list[str] = field(default_factory=list)  # job ids (running or stopped)
    exclusive: bool = False  # a running whole-GPU job: nothing else computes here
    computing: list[str] = field(default_factory=list)  # job ids running here (stopped ones do not)
    stopped: dict[str, int] = field(default_factory=dict)  # stopped job id → bytes its processes hold


@dataclass(frozen=True, slots=True)
class Measured:
    """GPU memory by owner, from NVML's process lists at one refresh."""

    external: dict[str, int] = field(default_factory=dict)  # GPU → bytes of processes not ours
    held: dict[str, dict[str, int]] = field(default_factory=dict)  # job id → GPU → bytes it holds


@dataclass(frozen=True, slots=True)
class Admit:
    job: Job
    gpus: tuple[GpuView, ...]


@dataclass(frozen=True, slots=True)
class Hold:
    job: Job
    reason: str
    blocked_by_jobs: bool  # only the daemon's own jobs stand in the way (preemption may help)


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def effective_priority(job: Job, now: float, aging_s: float) -> int:
    return job.spec.priority + int(max(0.0, now - job.queued_at) // aging_s)


def queue_order(jobs: Iterable[Job], now: float, aging_s: float) -> list[Job]:
    """Waiting jobs (QUEUED, PREEMPTED), next to start first."""
    waiting = [j for j in jobs if j.state in (JobState.QUEUED, JobState.PREEMPTED)]
    return sorted(waiting, key=lambda j: (-effective_priority(j, now, aging_s), j.queued_at, j.submitted_at))


def job_memory(job: Job, view: GpuView) -> int:
    """Memory a job holds on a GPU: its share, or the whole GPU."""
    return job.spec.memory_bytes or view.memory_total_bytes


def is_stopped(job: Job) -> bool:
    """A preempted job held by SIGSTOP (QUEUED too, while a resume of it is under way)."""
    return job.suspended == "stopped" and job.state in (JobState.PREEMPTED, JobState.QUEUED)


def loads(
    jobs: Iterable[Job],
    views: Mapping[str, GpuView],
    ending: Iterable[Job] = (),
    held: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, GpuLoad]:
    """Per GPU, what running jobs and stopped (SIGSTOP) preempted jobs hold, and the attempts that
    ended but whose processes are not all gone yet (`ending`: they hold what they held running).
    A running job holds its share (or the whole GPU) and its compute; a stopped job computes
    nothing and holds what its processes hold (`held`: job id → GPU → bytes, measured)."""
    out = {u: GpuLoad() for u in views}
    for job, over in [(j, False) for j in jobs] + [(j, True) for j in ending]:
        running = over or job.state is JobState.RUNNING
        if not (running or is_stopped(job)):
            continue
        for uuid in job.gpus:
            if uuid not in out:
                continue
            load = out[uuid]
            label = f"{job.id} (its processes are exiting)" if over else job.id
            load.holders.append(label)
            if running:
                load.memory += job_memory(job, views[uuid])
                load.compute += job.spec.compute_percent
                load.computing.append(label)
                load.exclusive = load.exclusive or job.spec.whole
            else:
                measured = (held or {}).get(job.id, {}).get(uuid, 0)
                load.memory += measured
                load.stopped[job.id] = measured
    return out


def external_memory(view: GpuView, own_pids: frozenset[int]) -> int:
    """Memory held on the GPU by processes the daemon did not start."""
    return sum(p.used_memory_bytes for p in view.processes if p.pid not in own_pids)


# Used memory that no listed process accounts for, up to which a GPU's process list is trusted:
# the driver's own reservations show as used memory too (a few MiB to a few hundred).
UNLISTED_TOLERANCE_BYTES: Final = 1 << 30


def unlisted_memory(view: GpuView) -> int:
    """Used memory on `view` that its process list does not account for."""
    return max(0, view.memory_used_bytes - sum(p.used_memory_bytes for p in view.processes))


def measure(
    views: Iterable[GpuView],
    pids_of: Mapping[str, frozenset[int]],
    gpus_of: Mapping[str, Iterable[str]] | None = None,
) -> Measured:
    """Who holds the GPUs' memory, by NVML's process lists: each job (`pids_of`: job id → its
    processes) and, per GPU, the processes the daemon did not start.

    Where a GPU's process list misses more than `UNLISTED_TOLERANCE_BYTES` of its used memory
    (NVML lists no processes under WSL, or for processes in another PID namespace), each job on
    it (`gpus_of`: job id → its GPUs) is taken to hold that memory too: a stopped job is never
    assumed to have left room it may not have left."""
    own = frozenset(pid for pids in pids_of.values() for pid in pids)
    external: dict[str, int] = {}
    held: dict[str, dict[str, int]] = {}
    for view in views:
        external[view.uuid] = external_memory(view, own)
        unlisted = unlisted_memory(view)
        unlisted = unlisted if unlisted > UNLISTED_TOLERANCE_BYTES else 0
        for job_id, pids in pids_of.items():
            used = sum(p.used_memory_bytes for p in view.processes if p.pid in pids)
            if unlisted and view.uuid in (gpus_of or {}).get(job_id, ()):
                used += unlisted
            if used:
                held.setdefault(job_id, {})[view.uuid] = used
    return Measured(external, held)


def whole_gpu_memory(view: GpuView, external: int) -> int:
    """What a whole-GPU job needs: all the memory processes the daemon did not start leave."""
    return max(1, view.memory_total_bytes - external)


def check_gpu(job: Job, view: GpuView, load: GpuLoad, external: int, settings: Settings) -> Hold | None:
    """The first rule `job` breaks on `view`, or None when it may start there."""
    if view.drained:
        return Hold(job, f"GPU {view.index} is drained", False)
    if not view.schedulable:
        return Hold(job, f"GPU {view.index} is {view.state.value}: {view.reason}", False)
    other_load = max(0.0, view.utilization_percent - load.compute)
    if other_load + settings.headroom_percent > settings.cap_percent:
        return Hold(
            job,
            f"GPU {view.index}: utilization {other_load:.0f} % + headroom {settings.headroom_percent:.0f} %"
            f" is above the cap {settings.cap_percent:.0f} %",
            False,
        )
    if load.exclusive or (job.spec.whole and load.computing):
        return Hold(job, f"GPU {view.index} is held by job {', '.join(load.computing)}", True)
    if load.compute + job.spec.compute_percent > 100:
        return Hold(
            job,
            f"GPU {view.index}: compute {load.compute} % in use, {job.spec.compute_percent} % asked",
            True,
        )
    free = view.memory_total_bytes - external - load.memory
    need = whole_gpu_memory(view, external) if job.spec.whole else job_memory(job, view)
    if need > free:
        by_jobs = need <= view.memory_total_bytes - external
        held = [f"job {j} holds {gib(b)}, stopped" for j, b in load.stopped.items() if b]
        if external:
            held.append(f"processes the daemon did not start hold {gib(external)}")
        why = f" ({'; '.join(held)})" if held else ""
        return Hold(job, f"GPU {view.index}: needs {gib(need)}, {gib(max(0, free))} free{why}", by_jobs)
    return None


def place(
    job: Job,
    views: Sequence[GpuView],
    load_of: Mapping[str, GpuLoad],
    external_of: Mapping[str, int],
    settings: Settings,
) -> Admit | Hold:
    """GPUs for `job` (the first that pass every rule, in index order), or why it must wait.

    A PREEMPTED job that still owns a process (checkpointed or stopped) resumes on its own GPUs."""
    candidates = [v for v in views if not job.suspended or v.uuid in job.gpus]
    want = len(job.gpus) if job.suspended else job.spec.gpus
    fits: list[GpuView] = []
    holds: list[Hold] = []
    for view in candidates:
        # a stopped job's own memory is already counted there: check the others' load only
        own = _without(load_of[view.uuid], job) if is_stopped(job) else load_of[view.uuid]
        hold = check_gpu(job, view, own, external_of.get(view.uuid, 0), settings)
        if hold is None:
            fits.append(view)
        else:
            holds.append(hold)
    if len(fits) >= want:
        return Admit(job, tuple(fits[:want]))
    if not holds:
        return Hold(job, f"needs {want} GPU(s), the machine has {len(candidates)}", False)
    return Hold(job, "; ".join(h.reason for h in holds), all(h.blocked_by_jobs for h in holds))


def _without(load: GpuLoad, job: Job) -> GpuLoad:
    """The load of the others: a stopped job's own measured memory taken out."""
    return GpuLoad(
        load.compute,
        load.memory - load.stopped.get(job.id, 0),
        [h for h in load.holders if h != job.id],
        load.exclusive,
        list(load.computing),
        {j: b for j, b in load.stopped.items() if j != job.id},
    )
