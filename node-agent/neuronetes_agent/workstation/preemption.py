"""Preemption: which running jobs make room for an urgent one, and how each is suspended.

Victims are running jobs of strictly lower submitted priority on the GPUs the urgent job could
use; the fewest, lowest-priority, most recently started go first. Each victim is suspended by the
first rung of the ladder that applies to it (docs/workstation.md, "Preemption ladder"):

1. ``checkpoint`` — transparent: the CUDA driver locks and checkpoints the job's CUDA processes
   (their GPU memory moves to host memory, the GPU is free; their CUDA calls wait); on resume the
   memory is restored and they are unlocked. Needs the driver's checkpoint API and a CUDA process.
2. ``cooperative`` — a ``--checkpointable`` job gets SIGUSR1 and `deadline_s` seconds to save and
   exit; it is requeued and restarted with ``NEURONETES_RESUME=1``.
3. ``stop`` — SIGSTOP now, SIGCONT later; its memory stays allocated, so this rung is used only
   when the urgent job fits beside it.

A job none of the rungs can free is not preempted: the urgent job waits.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from .admission import GpuLoad, Settings, check_gpu, loads
from .gpus import GpuView
from .jobs import Job, JobState

__all__ = ["Plan", "Rung", "plan"]


class Rung(enum.Enum):
    CHECKPOINT = "checkpoint"
    COOPERATIVE = "cooperative"
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class Plan:
    """Suspend `victims` (each by its rung) so that `job` fits."""

    job: Job
    victims: tuple[tuple[Job, Rung], ...]


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
) -> Plan | None:
    """The cheapest set of victims that lets `job` start, or None when preemption cannot help.
    `ending`: attempts whose processes are still exiting (they hold their GPUs; never victims)."""
    want = job.spec.gpus if not job.suspended else len(job.gpus)
    running = [j for j in jobs if j.state is JobState.RUNNING]
    options: list[tuple[tuple[int, int], GpuView, list[tuple[Job, Rung]]]] = []
    for view in views:
        if job.suspended and view.uuid not in job.gpus:
            continue
        on_gpu = [j for j in running if view.uuid in j.gpus]
        if (
            check_gpu(
                job,
                view,
                loads(jobs, {view.uuid: view}, ending)[view.uuid],
                external_of.get(view.uuid, 0),
                settings,
            )
            is None
        ):
            options.append(((0, -1), view, []))  # free already
            continue
        if any(j.spec.priority >= job.spec.priority for j in on_gpu):
            continue  # a job as urgent as this one is never preempted
        candidates = sorted(on_gpu, key=lambda j: (j.spec.priority, -j.started_at))
        chosen: list[tuple[Job, Rung]] = []
        for victim in candidates:
            chosen.append((victim, rung_of(victim)))
            suspended = {v.id: _after(v, r) for v, r in chosen}
            after = [suspended.get(j.id, j) for j in jobs]
            load: GpuLoad = loads(after, {view.uuid: view}, ending)[view.uuid]
            if check_gpu(job, view, load, external_of.get(view.uuid, 0), settings) is None:
                cost = (len(chosen), max(v.spec.priority for v, _ in chosen))
                options.append((cost, view, list(chosen)))
                break
    options.sort(key=lambda o: (o[0], o[1].index))
    if len(options) < want or all(not chosen for _, _, chosen in options[:want]):
        return None
    victims: dict[str, tuple[Job, Rung]] = {}
    for _, _, chosen in options[:want]:
        for victim, rung in chosen:
            victims[victim.id] = (victim, rung)
    return Plan(job, tuple(victims.values()))
