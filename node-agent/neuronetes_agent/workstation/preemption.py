"""Preemption: which running jobs make room for an urgent one, and how each is suspended.

Victims are running jobs of strictly lower submitted priority on the GPUs the urgent job could
use; the fewest, lowest-priority, most recently started go first. How they are suspended, cheapest
first (docs/workstation.md, "Preemption ladder"):

1. ``stop`` — SIGSTOP now, SIGCONT later, whenever the urgent job fits in the GPU's memory beside
   what the stopped victims' processes hold, measured (NVML's process list), not assumed to be
   their share or the GPU. A stopped job frees its compute, not its memory; a whole-GPU job is
   exclusive in compute only while it runs: a stopped one computes nothing.
2. ``checkpoint`` — otherwise, for a victim holding GPU memory: transparent, the CUDA driver locks
   and checkpoints the job's CUDA processes (their GPU memory moves to host memory, the GPU is
   free; their CUDA calls wait); on resume the memory is restored and they are unlocked. Needs the
   driver's checkpoint API and a CUDA process.
3. ``cooperative`` — else a ``--checkpointable`` job gets SIGUSR1 and `deadline_s` seconds to save
   and exit; it is requeued and restarted with ``NEURONETES_RESUME=1``. A victim neither rung
   applies to can only be stopped.

A job none of the rungs can free is not preempted: the urgent job waits, and `NoRoom` says why
(which job holds how much, and why it cannot be checkpointed).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from .admission import GpuLoad, Hold, Settings, check_gpu, gib, job_memory, loads, whole_gpu_memory
from .gpus import GpuView
from .jobs import Job, JobState

__all__ = ["NoRoom", "Plan", "Rung", "plan"]


class Rung(enum.Enum):
    CHECKPOINT = "checkpoint"
    COOPERATIVE = "cooperative"
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class Plan:
    """Suspend `victims` (each by its rung) so that `job` fits."""

    job: Job
    victims: tuple[tuple[Job, Rung], ...]


@dataclass(frozen=True, slots=True)
class NoRoom:
    """No set of victims lets `job` start; `reason` says why per GPU ("" when preemption has
    nothing to add to the admission's own reason)."""

    job: Job
    reason: str


def _after(job: Job, rung: Rung) -> Job:
    """How a victim holds the GPU once suspended by `rung`."""
    return replace(job, state=JobState.PREEMPTED, suspended="stopped" if rung is Rung.STOP else "checkpoint")


def plan(
    job: Job,
    views: Sequence[GpuView],
    jobs: Sequence[Job],
    external_of: Mapping[str, int],
    settings: Settings,
    rung_of: Callable[[Job], Rung],
    ending: Sequence[Job] = (),
    *,
    held: Mapping[str, Mapping[str, int]] | None = None,
    why_not_saved: Callable[[Job], str] = lambda _: "it can only be stopped",
) -> Plan | NoRoom:
    """The cheapest set of victims that lets `job` start, or why preemption cannot help.
    `ending`: attempts whose processes are still exiting (they hold their GPUs; never victims);
    `held`: job id → GPU → bytes its processes hold (what a stopped job keeps); `why_not_saved`:
    why a job can only be stopped (neither checkpoint rung applies to it)."""
    want = job.spec.gpus if not job.suspended else len(job.gpus)
    others = [j for j in jobs if j.id != job.id]  # a stopped job waiting to resume holds its own
    running = [j for j in others if j.state is JobState.RUNNING]
    options: list[tuple[tuple[int, int], GpuView, list[tuple[Job, Rung]]]] = []
    whys: list[str] = []
    for view in views:
        if job.suspended and view.uuid not in job.gpus:
            continue
        external = external_of.get(view.uuid, 0)
        load: GpuLoad = loads(others, {view.uuid: view}, ending, held)[view.uuid]
        hold = check_gpu(job, view, load, external, settings)
        if hold is None:
            options.append(((0, -1), view, []))  # free already
            continue
        if not hold.blocked_by_jobs:
            continue  # health, utilization or outside processes: no victim helps (said already)
        on_gpu = [j for j in running if view.uuid in j.gpus]
        keep = [j for j in on_gpu if j.spec.priority >= job.spec.priority]
        if keep:  # a job as urgent as this one is never preempted
            whys.append(
                f"GPU {view.index}: job {', '.join(j.id for j in keep)} has priority"
                f" {max(j.spec.priority for j in keep)} ≥ {job.spec.priority}:"
                " only lower-priority jobs are preempted"
            )
            continue
        candidates = sorted(on_gpu, key=lambda j: (j.spec.priority, -j.started_at))
        prefix: list[Job] = []
        for victim in candidates:
            prefix.append(victim)
            for chosen in _rungs(prefix, rung_of, held or {}):
                suspended = {v.id: _after(v, r) for v, r in chosen}
                after = [suspended.get(j.id, j) for j in others]
                load = loads(after, {view.uuid: view}, ending, held)[view.uuid]
                hold = check_gpu(job, view, load, external, settings)
                if hold is None:
                    cost = (len(chosen), max(v.spec.priority for v, _ in chosen))
                    options.append((cost, view, chosen))
                    break
            if hold is None:
                break
        if hold is not None:
            by_id = {j.id: j for j in others}
            whys.append(_no_rung(job, view, load, external, hold, by_id, why_not_saved))
    options.sort(key=lambda o: (o[0], o[1].index))
    if len(options) < want:
        return NoRoom(job, "; ".join(whys))
    if all(not chosen for _, _, chosen in options[:want]):
        return NoRoom(job, "")
    victims: dict[str, tuple[Job, Rung]] = {}
    for _, _, chosen in options[:want]:
        for victim, rung in chosen:
            victims[victim.id] = (victim, rung)
    return Plan(job, tuple(victims.values()))


def _rungs(
    victims: Sequence[Job], rung_of: Callable[[Job], Rung], held: Mapping[str, Mapping[str, int]]
) -> list[list[tuple[Job, Rung]]]:
    """The ways to suspend `victims`, cheapest first: all stopped (microseconds, and nothing to
    restore); then saved by their checkpoint rung where they hold GPU memory (a victim holding none
    is stopped: saving it would free nothing more)."""
    stopped = [(v, Rung.STOP) for v in victims]
    saved = [(v, rung_of(v) if sum(held.get(v.id, {}).values()) else Rung.STOP) for v in victims]
    return [stopped] if saved == stopped else [stopped, saved]


def _no_rung(
    job: Job,
    view: GpuView,
    load: GpuLoad,
    external: int,
    hold: Hold,
    by_id: Mapping[str, Job],
    why_not_saved: Callable[[Job], str],
) -> str:
    """Why `job` still does not fit on `view` with every possible victim suspended (`load`)."""
    stuck = [(by_id[j], b) for j, b in load.stopped.items() if b and j in by_id]
    if not stuck:
        return hold.reason
    held = "; ".join(
        f"job {v.id} holds {gib(b)} and cannot be checkpointed: {why_not_saved(v)}" for v, b in stuck
    )
    need = whole_gpu_memory(view, external) if job.spec.whole else job_memory(job, view)
    free = max(0, view.memory_total_bytes - external - load.memory)
    they = "they" if len(stuck) > 1 else "it"
    return (
        f"{held}; stopped, {they} would leave {gib(free)} on GPU {view.index} and this job needs {gib(need)}"
    )
