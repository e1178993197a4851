"""Workstation mode's story as written, with plain ``sleep`` commands on the simulated backend and
no checkpoint API (no CUDA driver, no --checkpointable): training is stopped for the urgent job and
continued after it, with no manual intervention; and when the stopped job's measured memory would
leave no room, the urgent job waits and says which rung is missing (docs/workstation.md,
"Preemption ladder")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from workstation_harness import Daemon, process_alive, running_daemon, wait_for

pytestmark = pytest.mark.e2e

GIB = 1 << 30


def _submit(
    d: Daemon, capsys: pytest.CaptureFixture[str], name: str, command: str, priority: int, *extra: str
) -> None:
    code, _, err = d.cli(
        capsys, "submit", "--cmd", command, "--priority", str(priority), "--name", name, *extra
    )
    assert code == 0, err


def _moves(job: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["to"], h["reason"]) for h in job["history"]]


def test_training_is_stopped_for_the_urgent_job_and_continued_after_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_daemon(tmp_path, cuda_driver=tmp_path / "no-libcuda.so.1") as d:
        assert d.cli_json(capsys, "status")["daemon"]["checkpoint"].startswith("unavailable")
        _submit(d, capsys, "train", "sleep 8", 1)
        train = d.wait_state("train", "RUNNING")
        _submit(d, capsys, "urgent", "sleep 2", 9)

        stopped = d.wait_state("train", "PREEMPTED")
        assert stopped["suspended"] == "stopped"
        assert stopped["reason"] == (
            "preempted for job j2 (priority 9): stopped (SIGSTOP): its compute is free, the 0.0 GiB"
            " of GPU memory it holds stay allocated"
        )
        urgent = d.wait_state("urgent", "RUNNING")
        assert urgent["reason"] == "started on GPU 0"
        assert process_alive(train["pid"])  # stopped, not ended
        listed = {j["name"]: j["state"] for j in d.cli_json(capsys, "status")["jobs"]}
        assert listed == {"train": "PREEMPTED", "urgent": "RUNNING"}

        urgent = d.wait_state("urgent", "COMPLETED")
        assert urgent["reason"] == "exited with status 0" and urgent["exitCode"] == 0
        train = d.wait_state("train", "COMPLETED", timeout=20)
        assert _moves(train) == [
            ("PENDING", "submitted"),
            ("QUEUED", "queued"),
            ("RUNNING", "started on GPU 0"),
            ("PREEMPTED", stopped["reason"]),
            ("QUEUED", "requeued: room for it again"),
            ("RUNNING", "continued (SIGCONT)"),
            ("COMPLETED", "exited with status 0"),
        ]
        assert train["attempt"] == 1  # continued, never restarted

        # finished jobs: `jobs list` leaves them out, `--all` shows them; ids and names alike
        assert d.cli_json(capsys, "jobs", "list") == []
        finished = d.cli_json(capsys, "jobs", "list", "--all")
        assert [(j["id"], j["name"], j["state"]) for j in finished] == [
            ("j1", "train", "COMPLETED"),
            ("j2", "urgent", "COMPLETED"),
        ]
        assert d.cli_json(capsys, "jobs", "describe", "j1") == d.cli_json(capsys, "jobs", "describe", "train")


def test_the_urgent_job_says_which_rung_is_missing_when_stopping_leaves_no_room(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_daemon(tmp_path, cuda_driver=tmp_path / "no-libcuda.so.1") as d:
        _submit(d, capsys, "train", "sleep 600", 1)
        train = d.wait_state("train", "RUNNING")
        d.simulate(process={"pid": train["pid"], "bytes": 70 * GIB})  # what NVML measures of it

        _submit(d, capsys, "urgent", "sleep 2", 9)  # a whole GPU: stopped, train would keep 70 GiB
        missing = (
            "job j1 holds 70.0 GiB and cannot be checkpointed: it was not submitted --checkpointable"
            " and the driver has no checkpoint API"
        )
        wait_for(
            lambda: missing in d.job("urgent")["reason"],
            "the urgent job's reason",
            show=lambda: d.job("urgent"),
        )
        urgent = d.job("urgent")
        assert urgent["state"] == "QUEUED" and urgent["reason"] == (
            f"waiting: GPU 0 is held by job j1; preemption cannot make room: {missing}; stopped, it"
            " would leave 10.0 GiB on GPU 0 and this job needs 80.0 GiB"
        )
        assert d.state("train") == "RUNNING"
        shown = {j["name"]: j["reason"] for j in d.cli_json(capsys, "status")["jobs"]}
        assert missing in shown["urgent"]
        code, table, _ = d.cli(capsys, "status")
        assert code == 0 and "QUEUED" in table and "waiting" in table

        # a share that fits beside the 70 GiB train holds: train is stopped for it
        _submit(d, capsys, "fits", "sleep 2", 9, "--gpu-memory", "8Gi", "--gpu-compute", "50")
        stopped = d.wait_state("train", "PREEMPTED")
        assert "the 70.0 GiB of GPU memory it holds stay allocated" in stopped["reason"]
        d.wait_state("fits", "COMPLETED")
        # the whole-GPU urgent job still does not fit beside the stopped train: train goes on
        d.wait_state("train", "RUNNING")
        assert d.state("urgent") == "QUEUED"

        d.simulate(process={"pid": train["pid"], "bytes": 0})
        d.wait_state("train", "PREEMPTED")  # now stopping it leaves the whole GPU free
        d.wait_state("urgent", "COMPLETED")
        d.wait_state("train", "RUNNING")
        assert d.cli(capsys, "jobs", "kill", "train")[0] == 0
        wait_for(lambda: not process_alive(train["pid"]), "the killed job's processes gone")
