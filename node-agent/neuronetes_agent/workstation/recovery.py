"""Restart safety: make the processes agree with the store when the daemon starts.

The store records a transition before the daemon acts on it, so after a SIGKILL at any point
(docs/workstation.md, "Restart"):

- a RUNNING job whose process group leader (PID + start time) is alive is re-adopted; processes
  left half-preempted (CUDA-locked or checkpointed, or stopped) are put back to running; a
  cooperative preemption under way gets a new deadline;
- a RUNNING job recorded before its process started (PID 0) is found by its launch token in the
  processes' environment and adopted; if there is none, it is marked FAILED and never started
  again (it may have started: a job is never run twice);
- a RUNNING job whose process is gone is finished from the exit status its shepherd wrote (or
  FAILED when there is none);
- a PREEMPTED job holding a process (checkpointed or stopped), or one QUEUED again whose resume
  was cut short, is suspended again (the scheduler resumes it when there is room), or FAILED if
  its process is gone;
- a cancelled job whose processes still run is killed, and so is whatever the last attempt of a
  job that is not running left behind (found by its cgroup or its token): its GPUs wait for it.

A job the recovery cannot act on is logged and left as it is; the daemon starts all the same.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from neuronetes_agent.daemon.hostpids import start_ticks

from .checkpoint import STATE_RUNNING
from .jobs import FINAL, Job, JobState
from .launcher import alive, find_token
from .scheduler import Scheduler

__all__ = ["recover"]

log = logging.getLogger(__name__)
S = JobState


def recover(sched: Scheduler) -> list[str]:
    """Reconcile every unfinished job with the processes; returns one line per action taken."""
    done: list[str] = []
    now = sched.clock()
    with sched.lock:
        over: list[Job] = []
        for job in sched.store.jobs():
            try:
                _recover(sched, job, now, done, over)
            except Exception as exc:  # one job must not keep the daemon from starting
                log.exception("recovery: job %s", job.id)
                done.append(f"{job.id}: not recovered ({exc})")
        for job in sched.launcher.leftovers(over):
            sched.launcher.kill(job)
            sched.ending[job.id] = (job, now)
            done.append(f"{job.id}: processes of attempt {job.attempt} outlived it: killed")
    for line in done:
        log.info("recovery: %s", line)
    return done


def _recover(sched: Scheduler, job: Job, now: float, done: list[str], over: list[Job]) -> None:
    if job.state is S.RUNNING and job.pid == 0:
        pid = find_token(job.token) if job.token else None
        if pid is None:
            if sched.launcher.exit_file(job).exists():
                sched.reap(job, now)
                done.append(f"{job.id}: finished while the daemon was down ({job.state.value})")
            else:
                sched.store.transition(
                    job,
                    S.FAILED,
                    "the daemon stopped while starting it; not started again so that it never runs twice",
                    now,
                )
                done.append(f"{job.id}: FAILED (launch interrupted)")
                over.append(job)
            return
        sched.store.update(job, pid=pid, pid_start=start_ticks(Path("/proc"), pid) or 0)
    if job.state is S.RUNNING:
        if not alive(job.pid, job.pid_start):
            sched.reap(job, now)
            done.append(f"{job.id}: ended while the daemon was down ({job.state.value}: {job.reason})")
            return
        sched.launcher.signal(job, signal.SIGCONT)
        for pid in sched.cuda_pids(job):
            if sched.ckpt.state(pid) != STATE_RUNNING:
                sched.ckpt.resume(pid)
        if job.suspended == "signalled":
            sched.coop_deadline[job.id] = now + sched.config.cooperative_deadline_s
        done.append(f"{job.id}: re-adopted (pid {job.pid})")
    elif job.state in (S.PREEMPTED, S.QUEUED) and job.suspended:  # QUEUED: a resume was cut short
        if not alive(job.pid, job.pid_start):
            sched.store.transition(job, S.FAILED, "its process ended while the daemon was down", now)
            done.append(f"{job.id}: FAILED (preempted process gone)")
            over.append(job)
            return
        if job.suspended == "checkpoint":
            for pid in sched.cuda_pids(job):
                if sched.ckpt.state(pid) == STATE_RUNNING:
                    sched.ckpt.suspend(pid)
        else:
            sched.launcher.signal(job, signal.SIGSTOP)
        done.append(f"{job.id}: re-adopted, still preempted ({job.suspended})")
    elif job.state in FINAL and job.pid and alive(job.pid, job.pid_start):
        sched.launcher.kill(job, spare_shepherd=False)
        sched.ending[job.id] = (job, now)
        done.append(f"{job.id}: {job.state.value} but still running: killed")
    elif job.attempt > 0 and job.id not in sched.ending:
        over.append(job)  # its last attempt is over: anything of it left is found below
