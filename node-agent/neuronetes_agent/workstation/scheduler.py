"""The workstation scheduler: one loop that reaps, reads the GPUs, admits, preempts and resumes.

Every change goes through the store first (`Store.transition`), then acts on processes, so a daemon
killed at any point restarts from a recorded state (`recovery`). All methods run under one lock:
the socket handlers and the loop never interleave.

An attempt that ended — of itself, cancelled, killed, evicted, saved after SIGUSR1 — stays in
`ending` until none of its processes is left (`Launcher.settle`: what outlived the command is
killed); until then it holds the GPUs it ran on, so they go to no other job meanwhile.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import admission as adm
from .checkpoint import STATE_RUNNING, CudaCheckpoint
from .containment import ProcTable
from .gpus import Gpus, GpuView, usage
from .jobs import ACTIVE, FINAL, Job, JobState
from .launcher import Launcher
from .preemption import NoRoom, Plan, Rung, plan
from .store import Store

__all__ = ["Config", "Scheduler"]

log = logging.getLogger(__name__)
S = JobState


@dataclass(frozen=True, slots=True)
class Config:
    settings: adm.Settings = field(default_factory=adm.Settings)
    cooperative_deadline_s: float = 30.0  # SIGUSR1 → exit, before SIGKILL
    cancel_grace_s: float = 5.0  # SIGTERM → SIGKILL
    shepherd_grace_s: float = 5.0  # SIGKILL of the job → SIGKILL of a shepherd that lingers
    interval_s: float = 0.2


class Scheduler:
    def __init__(
        self,
        store: Store,
        gpus: Gpus,
        launcher: Launcher,
        ckpt: CudaCheckpoint,
        config: Config,
        clock: Callable[[], float] = time.time,
        gpus_description: str = "",
    ) -> None:
        self.gpus_description = gpus_description
        self.store = store
        self.gpus = gpus
        self.launcher = launcher
        self.ckpt = ckpt
        self.config = config
        self.clock = clock
        self.lock = threading.RLock()
        self.wake = threading.Event()
        self.coop_deadline: dict[str, float] = {}  # job id → when SIGKILL follows SIGUSR1
        # attempts that ended but may have processes left: job id → (the attempt, when to kill it)
        self.ending: dict[str, tuple[Job, float]] = {}
        self.last_preemption: dict[str, float] = {}  # rung → seconds it took (status)
        self.checkpoint_failed: set[str] = set()  # jobs the driver could not checkpoint

    # ---- one round -------------------------------------------------------------------------------

    def tick(self) -> None:
        with self.lock:
            now = self.clock()
            jobs = self.store.jobs(states=frozenset({S.QUEUED, S.RUNNING, S.PREEMPTED}))
            for job in jobs:
                if job.state is S.RUNNING:
                    self.reap(job, now)
                elif job.suspended:  # PREEMPTED, or QUEUED while its resume is under way
                    self.check_suspended(job, now)
            self._settle_ending(now)
            jobs = [j for j in jobs if j.state not in FINAL]
            ending = [attempt for attempt, _ in self.ending.values()]
            views = self.gpus.refresh(usage(jobs, ending), now)
            self._admit(jobs, views, now, ending)

    def reap(self, job: Job, now: float) -> None:
        deadline = self.coop_deadline.get(job.id)
        if deadline is not None and now >= deadline and self.launcher.kill(job):
            log.warning(
                "job %s did not exit within %.0fs of SIGUSR1: killed",
                job.id,
                self.config.cooperative_deadline_s,
            )
            self.coop_deadline[job.id] = float("inf")
        code = self.launcher.exit_status(job)
        if code is None:
            return
        self._ended(job, now)
        if job.suspended == "signalled":  # cooperative preemption
            self.coop_deadline.pop(job.id, None)
            saved = code == 0
            why = (
                "saved and exited after SIGUSR1 (cooperative checkpoint); resumes with NEURONETES_RESUME=1"
                if saved
                else f"exited with status {code} after SIGUSR1; restarts from the beginning"
            )
            self.store.transition(
                job, S.PREEMPTED, why, now, pid=0, pid_start=0, suspended="", resume=saved, queued_at=now
            )
        elif code == 0:
            self.store.transition(job, S.COMPLETED, "exited with status 0", now, exit_code=0)
        else:
            why = (
                f"exited with status {code}"
                if code >= 0
                else "its processes are gone; no exit status recorded"
            )
            self.store.transition(job, S.FAILED, why, now, exit_code=code)

    def check_suspended(self, job: Job, now: float) -> None:
        """A preempted job's held process must still exist; if it ended, the job failed."""
        code = self.launcher.exit_status(job)
        if code is not None:
            self._ended(job, now)
            why = f"its process ended while preempted (status {code})" if code >= 0 else "its process is gone"
            self.store.transition(job, S.FAILED, why, now, exit_code=code, suspended="")

    def _ended(self, job: Job, now: float, kill_at: float | None = None) -> None:
        """The attempt's command is over (or is being ended): it holds its GPUs until none of its
        processes is left."""
        attempt = replace(job, history=[])
        if kill_at is not None or not self.launcher.settle(attempt):
            self.ending[job.id] = (attempt, now if kill_at is None else kill_at)

    def _settle_ending(self, now: float) -> None:
        for job_id, (attempt, when) in list(self.ending.items()):
            self.launcher.exit_status(attempt)  # reaps our own shepherd once it exited
            if self.launcher.settle(attempt):
                del self.ending[job_id]
                continue
            if now >= when:
                self.launcher.kill(attempt)
            if now >= when + self.config.shepherd_grace_s:
                log.warning("job %s: its shepherd did not end the attempt: killed", job_id)
                self.launcher.kill(attempt, spare_shepherd=False)

    # ---- admission and preemption ---------------------------------------------------------------

    def _admit(self, jobs: list[Job], views: dict[str, GpuView], now: float, ending: list[Job]) -> None:
        settings = self.config.settings
        view_list = sorted(views.values(), key=lambda v: v.index)
        measured = self._measure(jobs + ending, view_list)
        external = measured.external
        for job in adm.queue_order(jobs, now, settings.aging_s):
            load_of = adm.loads(jobs, views, ending, measured.held)
            decision = adm.place(job, view_list, load_of, external, settings)
            if isinstance(decision, adm.Admit):
                self._start(job, decision.gpus, now)
                continue
            if decision.blocked_by_jobs and self.coop_deadline:
                self._waiting(job, decision.reason)
                return  # a preemption is under way: nothing starts behind the job it is for
            outcome: Plan | NoRoom = NoRoom(job, "")
            if decision.blocked_by_jobs:
                outcome = plan(
                    job,
                    view_list,
                    jobs,
                    external,
                    settings,
                    self._rung,
                    ending,
                    held=measured.held,
                    why_not_saved=self._why_not_saved,
                )
            if isinstance(outcome, Plan):
                self._waiting(job, decision.reason)
                self._preempt(outcome, now, measured.held)
                self.wake.set()  # the next round starts the urgent job without waiting
                return
            no_room = f"; preemption cannot make room: {outcome.reason}" if outcome.reason else ""
            self._waiting(job, decision.reason + no_room)

    def _waiting(self, job: Job, reason: str) -> None:
        """A queued job's reason says why it waits (a preempted one keeps how it was preempted)."""
        waiting = f"waiting: {reason}"
        if job.reason != waiting and job.state is S.QUEUED:
            self.store.update(job, reason=waiting)

    def _measure(self, jobs: list[Job], views: list[GpuView]) -> adm.Measured:
        """Who holds the GPUs' memory (NVML's process lists): each job, and outside processes."""
        if not any(v.processes or v.memory_used_bytes for v in views):
            return adm.Measured()
        table = ProcTable()
        pids_of: dict[str, frozenset[int]] = {}
        for job in jobs:
            if job.pid:  # running, held, or an attempt still ending
                mine = self.launcher.processes(job, table, by_token=False)
                pids_of[job.id] = pids_of.get(job.id, frozenset()) | mine
        return adm.measure(views, pids_of, {j.id: j.gpus for j in jobs})

    def _rung(self, job: Job) -> Rung:
        if job.id not in self.checkpoint_failed and self.cuda_pids(job):
            return Rung.CHECKPOINT
        return Rung.COOPERATIVE if job.spec.checkpointable else Rung.STOP

    def _why_not_saved(self, job: Job) -> str:
        """Why neither checkpoint rung applies to `job` (it can only be stopped)."""
        if not self.ckpt.available:
            driver = "the driver has no checkpoint API"
        elif job.id in self.checkpoint_failed:
            driver = "its transparent checkpoint failed"
        else:
            driver = "the CUDA driver knows none of its processes"
        return f"it was not submitted --checkpointable and {driver}"

    def cuda_pids(self, job: Job) -> list[int]:
        if not self.ckpt.available or not job.pid:
            return []
        return [
            p for p in sorted(self.launcher.processes(job, by_token=False)) if self.ckpt.state(p) is not None
        ]

    def _preempt(self, chosen: Plan, now: float, held: dict[str, dict[str, int]]) -> None:
        urgent = chosen.job
        for victim, rung in chosen.victims:
            why = f"preempted for job {urgent.id} (priority {urgent.spec.priority})"
            started = time.monotonic()
            if rung is Rung.CHECKPOINT:
                failed = self._checkpoint(victim)
                if failed is None:
                    done = self.clock()  # the transition's time is when the GPU was free
                    self.store.transition(
                        victim,
                        S.PREEMPTED,
                        f"{why}: transparent CUDA checkpoint, GPU memory moved to host memory",
                        done,
                        suspended="checkpoint",
                        queued_at=done,
                    )
                    self.last_preemption[rung.value] = time.monotonic() - started
                    continue
                # The plan counted on its memory leaving the GPU: only a cooperative checkpoint
                # does that too. Otherwise it keeps running, and later plans know not to count on it.
                self.checkpoint_failed.add(victim.id)
                log.warning("job %s: transparent checkpoint failed (%s)", victim.id, failed)
                if not victim.spec.checkpointable:
                    self.store.update(
                        victim, reason=f"not preempted: transparent checkpoint failed: {failed}"
                    )
                    continue
                rung = Rung.COOPERATIVE
            if rung is Rung.COOPERATIVE:
                self.store.update(victim, suspended="signalled", reason=f"{why}: SIGUSR1 sent, saving")
                self.coop_deadline[victim.id] = now + self.config.cooperative_deadline_s
                self.launcher.signal(victim, signal.SIGUSR1)
            else:
                kept = adm.gib(sum(held.get(victim.id, {}).values()))
                self.store.transition(
                    victim,
                    S.PREEMPTED,
                    f"{why}: stopped (SIGSTOP): its compute is free, the {kept} of GPU memory it holds"
                    " stay allocated",
                    now,
                    suspended="stopped",
                    queued_at=now,
                )
                self.launcher.signal(victim, signal.SIGSTOP)
                self.last_preemption[rung.value] = time.monotonic() - started

    def _checkpoint(self, job: Job) -> str | None:
        """Checkpoint every CUDA process of the job; undo on failure. The group is not stopped: its
        CUDA calls wait in the driver, and a stopped process could hold a lock the driver's other
        users need."""
        done: list[int] = []
        for pid in self.cuda_pids(job):
            failed = self.ckpt.suspend(pid)
            if failed is not None:
                for p in done:
                    self.ckpt.resume(p)
                return failed
            done.append(pid)
        if not done:
            return "no CUDA process left in the job"
        return None

    def _start(self, job: Job, gpus: tuple[GpuView, ...], now: float) -> None:
        if job.state is S.PREEMPTED:
            self.store.transition(job, S.QUEUED, "requeued: room for it again", now)
        if job.suspended:
            self._resume(job, now)
            return
        token = self.launcher.new_token(job)
        uuids = tuple(g.uuid for g in gpus)
        # Recorded before the process exists: a daemon killed right after finds it by its token.
        self.store.transition(
            job,
            S.RUNNING,
            f"started on GPU {','.join(str(g.index) for g in gpus)}",
            now,
            token=token,
            attempt=job.attempt + 1,
            gpus=uuids,
            pid=0,
            pid_start=0,
            started_at=now,
            resume=job.resume,
        )
        try:
            started = self.launcher.start(job, gpus, token)
        except (OSError, ValueError) as exc:
            self.store.transition(job, S.FAILED, f"cannot start: {exc}", now)
            return
        self.store.update(job, pid=started.pid, pid_start=started.pid_start)

    def _resume(self, job: Job, now: float) -> None:
        started = time.monotonic()
        how = job.suspended
        if how == "stopped":  # recorded first: a daemon killed before SIGCONT continues it (recovery)
            self.store.transition(job, S.RUNNING, "continued (SIGCONT)", self.clock(), suspended="")
            self.launcher.signal(job, signal.SIGCONT)
            self.last_preemption["resume-stopped"] = time.monotonic() - started
            return
        for pid in sorted(self.launcher.processes(job, by_token=False)):
            if self.ckpt.state(pid) not in (None, STATE_RUNNING):
                failed = self.ckpt.resume(pid)
                if failed is not None:  # still checkpointed: it waits for room
                    self.store.update(job, reason=f"waiting: restore failed: {failed}")
                    return
        # Recorded after the restore, which may fail; a daemon killed between the two finds the
        # job QUEUED and still marked checkpointed, and checkpoints it again (recovery).
        why = "resumed: GPU memory restored from the checkpoint"
        self.store.transition(job, S.RUNNING, why, self.clock(), suspended="")
        self.last_preemption[f"resume-{how}"] = time.monotonic() - started

    # ---- user orders ----------------------------------------------------------------------------

    def cancel(self, job: Job, *, force: bool) -> str:
        """Cancel (SIGTERM, SIGKILL after the grace period) or kill (SIGKILL) a job."""
        now = self.clock()
        how = "killed (SIGKILL)" if force else "cancelled (SIGTERM)"
        live = job.state in ACTIVE and job.pid > 0
        refused = self.store.transition(job, S.CANCELLED, f"{how} by the user", now)
        if refused is not None:
            return str(refused)
        self.coop_deadline.pop(job.id, None)
        if live:
            if force:
                self.launcher.kill(job)
            else:
                self.launcher.signal(job, signal.SIGTERM)
                self.launcher.signal(job, signal.SIGCONT)  # a stopped or checkpointed job must run to die
            self._ended(job, now, now if force else now + self.config.cancel_grace_s)
        self.wake.set()
        return ""

    def evict(self, job: Job, why: str) -> None:
        """Take a job off its GPU for good (GPU forced offline): killed and requeued to start afresh."""
        now = self.clock()
        self.launcher.kill(job)
        self.coop_deadline.pop(job.id, None)
        self._ended(job, now, now)  # its GPUs wait until every process of it is gone
        if job.state is S.RUNNING:
            self.store.transition(
                job,
                S.PREEMPTED,
                f"evicted: {why}; restarts from the beginning",
                now,
                suspended="",
                pid=0,
                pid_start=0,
                resume=False,
                queued_at=now,
            )
        else:
            self.store.update(job, suspended="", pid=0, pid_start=0, resume=False)

    def log_paths(self, job: Job) -> tuple[Path, Path]:
        d = self.launcher.job_dir(job.id)
        return d / "stdout.log", d / "stderr.log"

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # one bad round must not end the daemon; the next round retries
                log.exception("scheduler round failed")
            self.wake.wait(self.config.interval_s)
            self.wake.clear()
