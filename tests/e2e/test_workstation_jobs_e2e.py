"""What a workstation job sees and how it ends (docs/workstation.md, "Jobs", "Job environment",
"Admission"): its environment and working directory, exit statuses, stderr, names and ids, the
CLI's yaml and --checkpointable, and backfill. A real daemon on the simulated backend, the CLI
through its click entry point."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml
from workstation_harness import running_daemon, wait_for

from neuronetes_agent.workstation import protocol as p

pytestmark = pytest.mark.e2e

GIB = 1 << 30


def _environment(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_a_job_runs_where_submit_ran_with_the_documented_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with running_daemon(tmp_path) as d:
        gpu = d.gpu()
        for name, share in (("whole", ()), ("share", ("--gpu-memory", "8Gi", "--gpu-compute", "30"))):
            code, _, err = d.cli(capsys, "submit", "--cmd", "pwd; env", "--name", name, *share)
            assert code == 0, err
            d.wait_state(name, "COMPLETED")
        whole, share_job = d.job("whole"), d.job("share")
        out = d.stdout("whole")
        assert out[0] == str(work)  # the directory submit was run from
        env = _environment(out[1:])
        job_dir = d.state_dir / "jobs" / whole["id"]
        assert env["CUDA_VISIBLE_DEVICES"] == gpu
        assert env["NEURONETES_JOB_ID"] == whole["id"] and env["NEURONETES_JOB_NAME"] == "whole"
        assert env["NEURONETES_JOB_TOKEN"] and env["NEURONETES_RESUME"] == "0"
        assert Path(env["NEURONETES_CHECKPOINT_DIR"]) == job_dir / "checkpoint"
        region = Path(env["NEURONETES_REGION_DIR"])
        assert (
            region == job_dir / "region" and (region / "control").is_file() and (region / "state").is_file()
        )
        assert (
            "CUDA_DEVICE_MEMORY_LIMIT" not in env and "LD_PRELOAD" not in env
        )  # no share, no --shim-library

        shared = _environment(d.stdout("share")[1:])
        assert shared["CUDA_DEVICE_MEMORY_LIMIT"] == str(8 * GIB) and shared["CUDA_DEVICE_SM_LIMIT"] == "30"
        assert shared["NEURONETES_JOB_TOKEN"] != env["NEURONETES_JOB_TOKEN"]
        assert share_job["request"] == {"gpuMemoryBytes": 8 * GIB, "gpuComputePercent": 30}


def test_the_shim_library_is_preloaded_into_every_job(tmp_path: Path) -> None:
    library = tmp_path / "libshim-stand-in.so"
    library.write_bytes(b"")  # the loader names it and goes on; what the job sees is the point
    with running_daemon(tmp_path, "--shim-library", str(library)) as d:
        d.call(p.Submit(command="env", priority=0, name="preloaded"))
        d.wait_state("preloaded", "COMPLETED")
        assert _environment(d.stdout("preloaded"))["LD_PRELOAD"] == str(library)


def test_exit_statuses_stderr_and_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0 is COMPLETED, anything else FAILED with its status (128+N for signal N, 127 for a program
    the shell cannot find); --stderr shows the other stream; a name is the newest job of that name,
    an id the job itself."""
    with running_daemon(tmp_path) as d:
        for name, command, state, code in [
            ("ok", "echo out; echo err >&2", "COMPLETED", 0),
            ("three", "true; exit 3", "FAILED", 3),
            ("signalled", "kill -TERM $$", "FAILED", 128 + signal.SIGTERM),
            ("missing", "no-such-program-here && true", "FAILED", 127),
        ]:
            d.call(p.Submit(command=command, priority=0, name=name))
            ended = d.wait_state(name, state)
            assert ended["exitCode"] == code, ended
        assert d.cli(capsys, "jobs", "logs", "ok")[1] == "out\n"
        assert d.cli(capsys, "jobs", "logs", "ok", "--stderr")[1] == "err\n"
        assert "not found" in d.cli(capsys, "jobs", "logs", "missing", "--stderr")[1]

        d.call(p.Submit(command="true", priority=0, name="same"))
        d.call(p.Submit(command="true", priority=0, name="same"))
        ids = [j["id"] for j in d.call(p.ListJobs(all=True)) if j["name"] == "same"]
        assert len(ids) == 2
        assert d.cli_json(capsys, "jobs", "describe", "same")["id"] == ids[-1]  # the newest of the name
        assert d.cli_json(capsys, "jobs", "describe", ids[0])["id"] == ids[0]


def test_yaml_checkpointable_and_backfill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`-o yaml`; `submit --checkpointable`; a lower job starts where it fits while a higher one
    that cannot preempt waits (backfill)."""
    with running_daemon(tmp_path) as d:
        code, _, err = d.cli(
            capsys, "submit", "--cmd", "sleep 60", "--name", "big", "--priority", "9",
            "--gpu-memory", "60Gi", "--gpu-compute", "50", "--checkpointable",
        )  # fmt: skip
        assert code == 0, err
        d.wait_state("big", "RUNNING")
        code, out, _ = d.cli(capsys, "jobs", "list", "-o", "yaml")
        listed = yaml.safe_load(out)
        assert code == 0 and [(j["name"], j["checkpointable"]) for j in listed] == [("big", True)]
        code, out, _ = d.cli(capsys, "jobs", "describe", "big")
        assert code == 0 and any(line.split() == ["checkpointable", "yes"] for line in out.splitlines())

        # 30 GiB does not fit beside 60 of 80, and a priority-5 job may not preempt a priority-9 one
        d.call(p.Submit(command="sleep 60", priority=5, name="ahead", gpu_memory="30Gi", gpu_compute=20))
        wait_for(
            lambda: "waiting" in d.job("ahead")["reason"], "the higher job waits", show=lambda: d.job("ahead")
        )
        d.call(p.Submit(command="sleep 60", priority=1, name="filler", gpu_memory="10Gi", gpu_compute=20))
        d.wait_state("filler", "RUNNING")
        assert d.state("ahead") == "QUEUED"
        for name in ("big", "ahead", "filler"):
            d.call(p.Cancel(job=name, force=True))


def test_a_log_that_is_a_fifo_or_a_link_fails_the_job_and_blocks_nothing(tmp_path: Path) -> None:
    """The daemon opens a job's log only as a regular file of the user's: a FIFO (which would block
    an open) or a symbolic link where `stdout.log` goes fails the job with one reason, and the
    daemon goes on serving."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    with running_daemon(tmp_path) as d:
        for job_id, plant in (
            ("j1", lambda log: os.mkfifo(log, 0o600)),
            ("j2", lambda log: log.symlink_to(victim)),
        ):
            job_dir = d.state_dir / "jobs" / job_id
            job_dir.mkdir(mode=0o700, parents=True)
            plant(job_dir / "stdout.log")
            d.call(p.Submit(command="true", priority=0))
            failed = d.wait_state(job_id, "FAILED")
            assert failed["reason"].startswith("cannot start: ") and "stdout.log" in failed["reason"]
        assert "is not a regular file of yours" in d.job("j1")["reason"]
        assert "is a symbolic link" in d.job("j2")["reason"]
        assert victim.read_text() == "precious\n"
        d.call(p.Submit(command="true", priority=0, name="after"))
        d.wait_state("after", "COMPLETED")
