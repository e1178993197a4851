"""Workstation mode's small rules the CLI relies on: GPUs named as ``nvidia-smi -i`` names them,
a followed log read forwards (across a rotation), a command found before it is queued, a share's
default compute, the checkpoint reason, ``jobs describe``'s values and the one rule that picks the
workstation or the cluster."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from neuronetes.cli.workstation import _value, target_state_dir
from neuronetes_agent.daemon.devices import GpuRefError, match_gpu
from neuronetes_agent.workstation.checkpoint import CudaCheckpoint
from neuronetes_agent.workstation.commands import missing_program
from neuronetes_agent.workstation.jobs import share_compute_default
from neuronetes_agent.workstation.logtail import MAX_SCAN_BYTES, log_size, read_after

pytestmark = pytest.mark.unit

A = "GPU-3f2a1b0c-0000-0000-0000-000000000000"
B = "GPU-3f2a9999-0000-0000-0000-000000000001"
LOCAL = [(0, A), (1, B)]


@pytest.mark.parametrize(("ref", "uuid"), [("0", A), ("1", B), (A, A), ("GPU-3f2a1", A), (" GPU-3f2a9 ", B)])
def test_a_gpu_by_index_uuid_or_unique_prefix(ref: str, uuid: str) -> None:
    assert match_gpu(ref, LOCAL, "on this machine") == uuid


def test_an_ambiguous_prefix_names_its_matches_and_an_unknown_gpu_is_not_found() -> None:
    with pytest.raises(GpuRefError) as ambiguous:
        match_gpu("GPU-3f2a", LOCAL, "on this machine")
    assert ambiguous.value.ambiguous and f"it starts {A}, {B}" in ambiguous.value.message
    for ref in ("2", "GPU-ff", ""):
        with pytest.raises(GpuRefError) as unknown:
            match_gpu(ref, LOCAL, "on this machine")
        assert not unknown.value.ambiguous and "on this machine (give an index" in unknown.value.message


def test_across_a_cluster_an_index_names_no_gpu() -> None:
    cluster = [(None, A), (None, B)]
    assert match_gpu("GPU-3f2a9", cluster, "") == B
    with pytest.raises(GpuRefError, match="give a UUID or a unique UUID prefix"):
        match_gpu("0", cluster, "")


def _opener(tmp_path: Path) -> Callable[[str], int]:
    def open_log(name: str) -> int:
        return os.open(tmp_path / name, os.O_RDONLY)

    return open_log


def test_following_reads_what_was_written_after_the_offset_and_across_a_rotation(tmp_path: Path) -> None:
    open_log = _opener(tmp_path)
    assert read_after(open_log, "stdout.log", 0) == (b"", 0) and log_size(open_log, "stdout.log") == 0
    log = tmp_path / "stdout.log"
    log.write_bytes(b"one\ntwo\n")
    data, offset = read_after(open_log, "stdout.log", 4)
    assert (data, offset) == (b"two\n", 8) and read_after(open_log, "stdout.log", offset) == (b"", 8)
    log.rename(tmp_path / "stdout.log.1")  # rotated: the old file gains its last line first
    with open(tmp_path / "stdout.log.1", "ab") as old:
        old.write(b"three\n")
    log.write_bytes(b"four\n")
    assert read_after(open_log, "stdout.log", offset) == (b"three\nfour\n", 5)


def test_following_reads_at_most_the_scan_bound_a_call(tmp_path: Path) -> None:
    (tmp_path / "big.log").write_bytes(b"x" * (MAX_SCAN_BYTES + 10))
    data, offset = read_after(_opener(tmp_path), "big.log", 0)
    assert len(data) == MAX_SCAN_BYTES == offset
    assert read_after(_opener(tmp_path), "big.log", offset) == (b"x" * 10, MAX_SCAN_BYTES + 10)


def test_a_command_run_directly_must_be_found(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    plain = tmp_path / "plain"
    plain.write_text("")
    path = str(tmp_path)
    assert missing_program("tool --flag", "/", path) is None
    assert missing_program("./tool", str(tmp_path), "") is None
    assert missing_program("nope", "/", path) == "command not found: 'nope' is not on PATH"
    assert missing_program("./plain", str(tmp_path), path) == (
        "command not found: './plain' is not an executable file"
    )
    assert missing_program("nope | cat", "/", path) is None  # the shell's to find
    assert missing_program("X=1 nope", "/", path) is None


@pytest.mark.parametrize(("memory", "gpu", "percent"), [(8, 80, 10), (1, 80, 2), (80, 80, 100), (0, 80, 1)])
def test_a_shares_default_compute_is_its_part_of_the_memory(memory: int, gpu: int, percent: int) -> None:
    assert share_compute_default(memory << 30, gpu << 30) == percent


def test_the_checkpoint_reason_names_the_library_once(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-libcuda.so.1")
    reason = CudaCheckpoint(missing).reason
    assert reason.startswith(f"no CUDA driver ({missing}: ") and reason.count(missing) == 1


def test_a_library_without_the_checkpoint_entry_points_says_which_is_missing() -> None:
    reason = CudaCheckpoint("libc.so.6").reason  # loads, and has none of the cuCheckpoint* calls
    assert reason.startswith("the CUDA driver libc.so.6 has no checkpoint API (cuCheckpoint")
    assert reason.endswith("; driver ≥ 570 needed)")


def test_describe_shows_values_not_reprs() -> None:
    job = {
        "request": {"gpuMemoryBytes": 8 << 30, "gpuComputePercent": 10},
        "gpus": ["GPU-a", "GPU-b"],
        "logs": {"stdout": "/s/out", "stderr": "/s/err"},
        "checkpointable": False,
        "pid": None,
        "reason": "",
        "attempt": 2,
    }
    values = {k: _value(k, job) for k in job}
    assert values == {
        "request": "8.0 GiB, 10 % compute",
        "gpus": "GPU-a, GPU-b",
        "logs": "/s/out (stdout), /s/err (stderr)",
        "checkpointable": "no",
        "pid": None,
        "reason": None,
        "attempt": "2",
    }
    assert _value("request", {"request": {"gpus": 2}}) == "2 GPUs"


def test_the_target_rule_in_its_documented_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--state-dir, then --kubeconfig, then $NEURONETES_STATE_DIR, then a daemon answering in the
    default state directory (none answers in this one: the cluster). The answering daemon's case
    runs a real daemon: tests/e2e/test_workstation_daemon_e2e.py."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("NEURONETES_STATE_DIR", str(tmp_path / "named"))
    assert target_state_dir(str(tmp_path / "given"), "kubeconfig") == tmp_path / "given"
    assert target_state_dir(None, "kubeconfig") is None
    assert target_state_dir(None) == tmp_path / "named"
    monkeypatch.delenv("NEURONETES_STATE_DIR")
    assert target_state_dir(None) is None
