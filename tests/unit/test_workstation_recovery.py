"""Restart recovery at the points the e2e story cannot time: the daemon died between recording a
launch and the process appearing, and a cancelled job that outlived its daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from workstation_support import workstation_scheduler

from neuronetes_agent.workstation.jobs import JobSpec, JobState
from neuronetes_agent.workstation.launcher import alive
from neuronetes_agent.workstation.recovery import recover
from neuronetes_agent.workstation.scheduler import Scheduler

pytestmark = pytest.mark.unit
S = JobState


@pytest.fixture
def sched(tmp_path: Path) -> Iterator[Scheduler]:
    with workstation_scheduler(tmp_path) as scheduler:
        yield scheduler


def _recorded_launch(sched: Scheduler, token: str) -> str:
    """A job recorded RUNNING with no PID yet (the daemon died right after the record)."""
    job = sched.store.add_job(JobSpec("sleep 30", 1), 1.0)
    sched.store.transition(job, S.QUEUED, "queued", 1.0)
    sched.store.transition(job, S.RUNNING, "started", 2.0, token=token, attempt=1)
    return job.id


def test_a_launch_that_never_happened_fails_and_is_not_started_again(sched: Scheduler) -> None:
    job_id = _recorded_launch(sched, "j1.1.dead")
    recover(sched)
    job = sched.store.find(job_id)
    assert job is not None and job.state is S.FAILED and "never runs twice" in job.reason
    sched.tick()
    assert job.attempt == 1 and sched.store.find(job_id).state is S.FAILED  # type: ignore[union-attr]


def test_a_launch_that_happened_is_found_by_its_token_and_adopted(sched: Scheduler) -> None:
    token = f"j1.1.{os.getpid()}"
    proc = subprocess.Popen(
        ["sleep", "30"], env={**os.environ, "NEURONETES_JOB_TOKEN": token}, start_new_session=True
    )
    try:
        job_id = _recorded_launch(sched, token)
        recover(sched)
        job = sched.store.find(job_id)
        assert (
            job is not None
            and job.state is S.RUNNING
            and job.pid == proc.pid
            and alive(job.pid, job.pid_start)
        )
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while sched.store.find(job_id).state is S.RUNNING and time.monotonic() < deadline:  # type: ignore[union-attr]
        sched.tick()
        time.sleep(0.05)
    job = sched.store.find(job_id)
    assert job is not None and job.state is S.FAILED and job.exit_code == -1  # no shepherd: no exit status


def test_a_cancelled_job_that_outlived_its_daemon_is_killed(sched: Scheduler) -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        job = sched.store.add_job(JobSpec("sleep 30", 1), 1.0)
        sched.store.transition(job, S.QUEUED, "queued", 1.0)
        ticks = Path(f"/proc/{proc.pid}/stat").read_text()
        start = int(ticks[ticks.rfind(")") + 2 :].split()[19])
        sched.store.transition(job, S.RUNNING, "started", 2.0, pid=proc.pid, pid_start=start)
        sched.store.transition(job, S.CANCELLED, "cancelled", 3.0)
        recover(sched)
        assert proc.wait(5) == -signal.SIGKILL
    finally:
        proc.kill()


def _proc_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def test_a_stopped_job_whose_resume_was_cut_short_stays_stopped_then_is_continued(sched: Scheduler) -> None:
    """The daemon died after requeueing a stopped job to resume it, before its SIGCONT: the next
    daemon keeps it stopped (its processes are the job's, not leftovers) and continues it."""
    token = f"j1.1.{os.getpid()}"
    proc = subprocess.Popen(
        ["sleep", "30"], env={**os.environ, "NEURONETES_JOB_TOKEN": token}, start_new_session=True
    )
    try:
        job = sched.store.add_job(JobSpec("sleep 30", 1), 1.0)
        sched.store.transition(job, S.QUEUED, "queued", 1.0)
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
        start = int(stat[stat.rfind(")") + 2 :].split()[19])
        gpu = sched.gpus.devices[0].uuid
        sched.store.transition(
            job, S.RUNNING, "started", 2.0, token=token, attempt=1, gpus=(gpu,), pid=proc.pid, pid_start=start
        )
        sched.store.transition(job, S.PREEMPTED, "stopped", 3.0, suspended="stopped")
        os.killpg(proc.pid, signal.SIGSTOP)
        sched.store.transition(job, S.QUEUED, "requeued: room for it again", 4.0)  # the daemon dies here

        assert recover(sched) == [f"{job.id}: re-adopted, still preempted (stopped)"]
        assert proc.poll() is None and _proc_state(proc.pid) == "T"
        sched.tick()
        again = sched.store.find(job.id)
        assert again is not None and again.state is S.RUNNING and again.reason == "continued (SIGCONT)"
        deadline = time.monotonic() + 5
        while _proc_state(proc.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _proc_state(proc.pid) != "T" and again.attempt == 1
    finally:
        proc.kill()
        proc.wait()


def _running(sched: Scheduler, proc: subprocess.Popen[bytes], start: int) -> str:
    """A job recorded RUNNING on `proc` with the given /proc start time."""
    job = sched.store.add_job(JobSpec("sleep 30", 1), 1.0)
    sched.store.transition(job, S.QUEUED, "queued", 1.0)
    gpu = sched.gpus.devices[0].uuid
    sched.store.transition(
        job, S.RUNNING, "started", 2.0, attempt=1, gpus=(gpu,), pid=proc.pid, pid_start=start
    )
    return job.id


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[19])


def test_a_reused_pid_is_another_process_and_is_left_alone(sched: Scheduler) -> None:
    """The recorded PID is alive but started at another time: not the job's. The job ends (no exit
    status was recorded: −1) and the process that now has its PID is never signalled."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        job_id = _running(sched, proc, _start_time(proc.pid) + 1)
        recover(sched)
        job = sched.store.find(job_id)
        assert job is not None and job.state is S.FAILED and job.exit_code == -1
        assert proc.poll() is None and _proc_state(proc.pid) == "S"
    finally:
        proc.kill()
        proc.wait()


def test_a_running_job_left_half_preempted_is_put_back_to_running(sched: Scheduler) -> None:
    """The daemon died after stopping a job, before recording it PREEMPTED: the next daemon
    re-adopts it and continues it."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        job_id = _running(sched, proc, _start_time(proc.pid))
        os.killpg(proc.pid, signal.SIGSTOP)
        assert recover(sched) == [f"{job_id}: re-adopted (pid {proc.pid})"]
        deadline = time.monotonic() + 5
        while _proc_state(proc.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _proc_state(proc.pid) != "T" and sched.store.find(job_id).state is S.RUNNING  # type: ignore[union-attr]
    finally:
        proc.kill()
        proc.wait()


def test_a_preempted_job_whose_process_is_gone_fails(sched: Scheduler) -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    job_id = _running(sched, proc, _start_time(proc.pid))
    job = sched.store.find(job_id)
    assert job is not None
    sched.store.transition(job, S.PREEMPTED, "stopped", 3.0, suspended="stopped")
    proc.kill()
    proc.wait()
    assert recover(sched) == [f"{job_id}: FAILED (preempted process gone)"]
    failed = sched.store.find(job_id)
    assert failed is not None and failed.state is S.FAILED
    assert failed.reason == "its process ended while the daemon was down"
