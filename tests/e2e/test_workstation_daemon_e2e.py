"""The workstation daemon as a user starts it (docs/workstation.md, "The daemon", "The state
directory"): its default state directory and the one rule that finds it, its defaults in
``status``, one daemon per state directory, jobs that outlive a SIGTERM, its options reaching the
scheduler, and the cooperative deadline. Real daemon processes through the installed scripts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from workstation_harness import fake_driver, kill_leftovers, process_alive, running_daemon, wait_for

from neuronetes_agent.workstation import client
from neuronetes_agent.workstation import protocol as p

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent


def _names(listed: str) -> set[str]:
    """Field names as docs/workstation.md lists them, separated by spaces."""
    return set(listed.split())


DAEMON_FIELDS = _names(
    "pid backend checkpoint utilizationCapPercent headroomPercent agingSeconds lastPreemptionSeconds"
    " containment logMaxBytes problems"
)


def _user_env(tmp: Path) -> dict[str, str]:
    """A user with no $NEURONETES_STATE_DIR and no kubeconfig, whose $XDG_STATE_HOME is `tmp/xdg`."""
    dropped = ("NEURONETES_STATE_DIR", "KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return {**env, "HOME": str(tmp / "home"), "XDG_STATE_HOME": str(tmp / "xdg")}


def _run(env: dict[str, str], script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / script), *argv], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _start(env: dict[str, str], state_dir: Path, *argv: str) -> subprocess.Popen[bytes]:
    daemon = subprocess.Popen(
        [str(BIN / argv[0]), *argv[1:]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for(lambda: client.daemon_live(state_dir), f"the daemon answers in {state_dir}", timeout=30)
    return daemon


def _terminate(daemon: subprocess.Popen[bytes]) -> None:
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(20)


def _describe(state_dir: Path, job: str) -> dict[str, Any]:
    reply = client.call(state_dir, p.Describe(job=job))
    assert isinstance(reply, p.Ok), reply
    return dict(reply.result)


def _admission(daemon: dict[str, Any]) -> tuple[float, float, float]:
    """`status`'s admission settings: the cap, the headroom and the aging interval."""
    return daemon["utilizationCapPercent"], daemon["headroomPercent"], daemon["agingSeconds"]


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_default_state_directory_the_defaults_one_daemon_and_jobs_that_outlive_it(
    tmp_path: Path,
) -> None:
    """`neuronetes agent run --workstation` with nothing else: `$XDG_STATE_HOME/neuronetes`, created
    0700; `status` with no --state-dir finds it (a daemon answering in the default state directory)
    and shows the documented defaults; a second daemon there exits with one line; SIGTERM leaves the
    job running and the next daemon — the hidden `--standalone` alias, found through
    $NEURONETES_STATE_DIR — re-adopts it."""
    env = _user_env(tmp_path)
    state = tmp_path / "xdg" / "neuronetes"
    first = _start(env, state, "neuronetes", "agent", "run", "--workstation")
    second: subprocess.Popen[bytes] | None = None
    try:
        assert _mode(state) == 0o700
        shown = _run(env, "neuronetes", "status", "-o", "json")
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        daemon = status["daemon"]
        assert set(daemon) == DAEMON_FIELDS
        assert _admission(daemon) == (85, 5, 60)
        assert daemon["logMaxBytes"] == 64 << 20 and daemon["problems"] == []
        # the default driver library, named once whether or not this machine has it
        assert daemon["checkpoint"].startswith("available") or daemon["checkpoint"].startswith(
            "unavailable: no CUDA driver (libcuda.so.1: "
        ), daemon["checkpoint"]
        if daemon["backend"] != "nvml":  # no NVML here: one simulated GPU, and status says why
            assert daemon["backend"].startswith("simulated: ") and len(status["gpus"]) == 1, daemon

        again = _run(env, "neuronetes-agent", "--workstation")
        assert again.returncode == 1 and again.stderr.count("\n") == 1, again.stderr
        # the lock file still names the first daemon: truncated only once the lock is held
        assert f"a workstation daemon (pid {first.pid}) already runs for {state}" in again.stderr

        submitted = _run(env, "neuronetes", "submit", "--cmd", "sleep 60", "--name", "long", "-o", "json")
        assert submitted.returncode == 0, submitted.stderr
        wait_for(lambda: _describe(state, "long")["state"] == "RUNNING", "the job runs")
        long = _describe(state, "long")
        _terminate(first)
        assert process_alive(long["pid"]), "SIGTERM to the daemon stopped its job"

        named = {**env, "NEURONETES_STATE_DIR": str(state), "XDG_STATE_HOME": str(tmp_path / "elsewhere")}
        second = _start(named, state, "neuronetes-agent", "--standalone")
        adopted = json.loads(_run(named, "neuronetes", "jobs", "describe", "long", "-o", "json").stdout)
        assert (adopted["state"], adopted["pid"], adopted["attempt"]) == ("RUNNING", long["pid"], 1)
        # every directory of a job is 0700, its logs 0600
        job_dir = state / "jobs" / long["id"]
        for directory in (state / "jobs", job_dir, job_dir / "region", job_dir / "checkpoint"):
            assert _mode(directory) == 0o700, directory
        for log in ("stdout.log", "stderr.log"):
            assert _mode(job_dir / log) == 0o600, log
        assert _run(named, "neuronetes", "jobs", "kill", "long").returncode == 0
        wait_for(lambda: not process_alive(long["pid"]), "the killed job's processes gone")
        wait_for(lambda: (job_dir / "exit-1").exists(), "the shepherd's exit file")
        assert _mode(job_dir / "exit-1") == 0o600
    finally:
        for daemon_proc in (first, second):
            if daemon_proc is not None and daemon_proc.poll() is None:
                _terminate(daemon_proc)
        kill_leftovers(state)


def test_the_daemon_options_reach_the_scheduler(tmp_path: Path) -> None:
    """--utilization-cap, --headroom, --aging-seconds, --log-max-size and --max-clients show in
    `status` and act: the cap and headroom in a waiting job's reason, aging in its effective
    priority, the client limit in a busy reply."""
    options = ("--utilization-cap", "50", "--headroom", "10", "--aging-seconds", "1")
    with running_daemon(tmp_path, *options, "--log-max-size", "2Mi", "--max-clients", "2") as d:
        daemon = d.call(p.Status())["daemon"]
        assert _admission(daemon) == (50, 10, 1)
        assert daemon["logMaxBytes"] == 2 << 20

        d.simulate(fault={"utilizationPercent": 45})
        d.call(p.Submit(command="true", priority=1, name="held"))
        wait_for(
            lambda: "utilization 45 % + headroom 10 % is above the cap 50 %" in d.job("held")["reason"],
            "held by the configured cap",
            show=lambda: d.job("held"),
        )
        # one point per second waited: the effective priority grows while the job waits
        wait_for(
            lambda: d.job("held")["effectivePriority"] >= 3,
            "the waiting job ages",
            show=lambda: d.job("held"),
        )
        assert d.job("held")["priority"] == 1 and d.state("held") == "QUEUED"
        d.simulate(fault={"utilizationPercent": 10})
        d.wait_state("held", "COMPLETED")

        path = str(d.state_dir / "daemon.sock")
        idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        try:
            for s in idle:
                s.connect(path)
            # The client's own call: the daemon answers "busy" and closes, maybe before it reads the
            # request (the client's send then fails with a broken pipe; the answer is still read).
            for _ in range(20):
                reply = client.call(d.state_dir, p.Ping(), timeout_s=10)
                assert isinstance(reply, p.Err) and reply.code == "busy", reply
        finally:
            for s in idle:
                s.close()


def test_a_daemon_flooded_with_sigchld_keeps_scheduling_and_stops_on_sigterm(tmp_path: Path) -> None:
    """Every stop, continue and exit of a job's shepherd sends the daemon SIGCHLD, at any point of
    its loop. However many arrive, and wherever, the daemon keeps reaping and starting jobs and
    still ends on SIGTERM (a handler that took a lock the loop holds hung it for good)."""
    with running_daemon(tmp_path, "--interval", "0.001") as d:  # the loop waits and wakes all the time
        assert d.proc is not None
        d.submit("during", 1, 20, step_s=0.01)
        for _ in range(5000):  # a signal a millisecond: a few seconds of shepherds stopping and ending
            os.kill(d.proc.pid, signal.SIGCHLD)
            time.sleep(0.001)
        assert d.proc.poll() is None, d.log.read_text()[-2000:]
        d.wait_state("during", "COMPLETED", timeout=60)
        d.submit("after", 1, 1)
        d.wait_state("after", "COMPLETED", timeout=60)
        d.proc.terminate()
        assert d.proc.wait(60) == 0


def test_a_job_that_does_not_exit_by_the_checkpoint_deadline_is_killed_and_restarts_afresh(
    tmp_path: Path,
) -> None:
    """--checkpoint-deadline 1: a --checkpointable job that ignores SIGUSR1 is SIGKILLed after 1 s,
    PREEMPTED, and its next attempt starts with NEURONETES_RESUME=0."""
    with running_daemon(tmp_path, "--checkpoint-deadline", "1") as d:
        stubborn = "trap '' USR1; echo attempt resume=$NEURONETES_RESUME; exec sleep 30"
        d.call(p.Submit(command=stubborn, priority=1, name="stubborn", checkpointable=True))
        first = d.wait_state("stubborn", "RUNNING")
        wait_for(lambda: d.stdout("stubborn") == ["attempt resume=0"], "the trap set (its line written)")
        d.measured("stubborn", 8 << 30)  # stopped, it would keep them: the urgent whole-GPU job needs them
        d.call(p.Submit(command="true", priority=9, name="urgent"))
        preempted = d.wait_state("stubborn", "PREEMPTED")
        assert (
            preempted["reason"]
            == f"exited with status {128 + signal.SIGKILL} after SIGUSR1; restarts from the beginning"
        )
        assert not process_alive(first["pid"])
        d.wait_state("urgent", "COMPLETED")
        again = d.wait_state("stubborn", "RUNNING")
        assert again["attempt"] == 2
        wait_for(
            lambda: len(d.stdout("stubborn")) == 2,
            "the second attempt's line",
            show=lambda: d.stdout("stubborn"),
        )
        assert d.stdout("stubborn") == ["attempt resume=0", "attempt resume=0"]
        d.call(p.Cancel(job="stubborn", force=True))


# docs/workstation.md, "Protocol": a job's fields and a GPU's, as the document lists them
JOB_FIELDS = _names(
    "id name state priority effectivePriority command request checkpointable gpus pid attempt"
    " suspended exitCode reason submittedAt startedAt finishedAt"
)
GPU_FIELDS = _names(
    "uuid index model state reason drained utilizationPercent temperatureCelsius memoryTotalBytes"
    " memoryUsedBytes processes jobs"
)


def test_the_replies_have_the_documented_fields_and_cancel_kills_after_its_grace(tmp_path: Path) -> None:
    """The shapes of docs/workstation.md's Protocol table; the attempt's cgroup recorded where the
    daemon contains attempts in one; a job that ignores SIGTERM is SIGKILLed after cancel's grace."""
    with running_daemon(tmp_path) as d:
        assert set(d.call(p.Ping())) == {"pid", "backend", "checkpoint"}
        stubborn = "trap '' TERM; echo $$; exec sleep 60"  # its PID: the sleep's, after the exec
        d.call(p.Submit(command=stubborn, priority=0, name="stubborn"))
        job = d.wait_state("stubborn", "RUNNING")
        wait_for(lambda: len(d.stdout("stubborn")) == 1, "the trap set (its line written)")
        command_pid = int(d.stdout("stubborn")[0])
        status = d.call(p.Status())
        assert set(status["jobs"][0]) == JOB_FIELDS and set(status["gpus"][0]) == GPU_FIELDS
        assert set(job) == JOB_FIELDS | {"logs", "history"}
        assert set(job["history"][0]) == {"at", "from", "to", "reason"}
        tail = d.call(p.Logs(job="stubborn", tail=5))
        assert set(tail) == {"job", "path", "state", "lines", "offset"} and tail["job"] == job["id"]
        follow = d.call(p.Logs(job="stubborn", after=0))
        assert (
            set(follow) == {"job", "path", "state", "data", "offset"} and follow["data"] == f"{command_pid}\n"
        )
        gpu = d.call(p.Health(gpu="0"))
        assert set(gpu) == GPU_FIELDS | {"history"} and gpu["jobs"] == [job["id"]]
        assert set(d.call(p.GpuAdmin(gpu="0", action="drain"))) == {"gpu", "message"}
        assert d.call(p.Simulate(gpu="0", fault={"utilizationPercent": 1}))["gpu"] == gpu["uuid"]
        assert (
            f"attempts contained by {status['daemon']['containment']}" in d.log.read_text()
        )  # said at start
        if status["daemon"]["containment"].startswith("cgroup"):
            recorded = (d.state_dir / "jobs" / job["id"] / "cgroup-1").read_text().strip()
            assert recorded.endswith(f"/{job['id']}.1") and f"/neuronetes-{os.getuid()}-" in recorded

        cancelled = d.call(p.Cancel(job="stubborn", force=False))
        assert cancelled["state"] == "CANCELLED" and cancelled["reason"] == "cancelled (SIGTERM) by the user"
        wait_for(lambda: not process_alive(command_pid), "SIGKILL after the grace", timeout=20)
        wait_for(lambda: not process_alive(job["pid"]), "the shepherd gone too")


def test_without_simulate_gpus_the_daemon_uses_nvml_or_says_why_it_simulates(tmp_path: Path) -> None:
    """No --simulate-gpus: NVML (here the fake driver's, on the library path). Where NVML cannot
    list the GPUs the daemon runs on one simulated GPU and says why, in the log and in `status`;
    on NVML, fault injection is refused (`unsupported`)."""
    _, nvml = fake_driver()
    env = {
        **_user_env(tmp_path),
        "LD_LIBRARY_PATH": str(nvml.parent),
        "FAKE_CUDA_STATE": str(tmp_path / "fake-gpu.state"),
        "FAKE_CUDA_MEM_BYTES": str(80 << 30),
    }
    state = tmp_path / "state"
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            [str(BIN / "neuronetes-agent"), "--workstation", "--state-dir", str(state)],
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    try:
        wait_for(lambda: client.daemon_live(state), "the daemon answers", timeout=30, show=log.read_text)
        reply = client.call(state, p.Status())
        assert isinstance(reply, p.Ok), reply
        backend = reply.result["daemon"]["backend"]
        if backend == "nvml":
            refused = client.call(state, p.Simulate(gpu="0", fault={"xid": 48}))
            assert isinstance(refused, p.Err) and refused.code == "unsupported", refused
        else:
            assert backend.startswith("simulated: NVML") and len(reply.result["gpus"]) == 1, backend
            assert "running on the simulated backend (1 GPU)" in log.read_text()
    finally:
        _terminate(daemon)
        kill_leftovers(state)
