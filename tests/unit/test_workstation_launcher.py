"""What a workstation job is started with: its devices, the shim's workstation-mode contract, its own
variables, and an argv that lets SIGUSR1 reach the program."""

from __future__ import annotations

from pathlib import Path

import pytest

from neuronetes.model import GpuHealth
from neuronetes_agent import region as shim
from neuronetes_agent.workstation.commands import command_argv
from neuronetes_agent.workstation.gpus import GpuView
from neuronetes_agent.workstation.jobs import Job, JobSpec, JobState
from neuronetes_agent.workstation.launcher import Launcher

pytestmark = pytest.mark.unit
GIB = 1 << 30


def _gpu(index: int) -> GpuView:
    return GpuView(f"GPU-{index}", index, "A100", 80 * GIB, 0, 0.0, 40.0, (), GpuHealth.AVAILABLE, "", False)


def test_a_share_gets_its_limits_through_env_and_a_workstation_region(tmp_path: Path) -> None:
    launcher = Launcher(tmp_path, shim_library=tmp_path / "libneuronetes-cuda.so")
    job = Job(
        "j1", JobSpec("x", 3, name="infer", memory_bytes=8 * GIB, compute_percent=40), JobState.QUEUED, 0, 0
    )
    (tmp_path / "jobs" / "j1").mkdir(parents=True)
    env = launcher.environment(job, [_gpu(1)], "tok")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == str(8 * GIB) and env["CUDA_DEVICE_SM_LIMIT"] == "40"
    assert env["LD_PRELOAD"].startswith(str(tmp_path / "libneuronetes-cuda.so"))
    assert env["NEURONETES_JOB_TOKEN"] == "tok" and env["NEURONETES_RESUME"] == "0"
    assert "NEURONETES_REGION_PATH" not in env  # the shim reads NEURONETES_REGION_DIR
    launcher.write_region(job, [_gpu(1)])
    with shim.open_region(env["NEURONETES_REGION_DIR"], writable=False) as region:
        view = region.snapshot_control()
        assert view.header.flags & shim.REGION_F_WORKSTATION and view.container.control & shim.CTL_ADMITTED
        device = view.devices[0]
        assert view.container.device_count == 1
        assert device.uuid == b"GPU-1" and device.memory_limit_bytes == 8 * GIB
        assert device.compute_share_percent == 40 and device.host_index == 1
        assert region.read_state().usage.memory_used_bytes == 0
    for name in (shim.CONTROL_NAME, shim.STATE_NAME):
        assert (tmp_path / "jobs" / "j1" / "region" / name).stat().st_mode & 0o777 == 0o600
    # the next attempt gets a fresh region; one of major version 1 (a file) is replaced
    launcher.write_region(job, [_gpu(1)])
    (tmp_path / "jobs" / "j2").mkdir()
    old = Job("j2", JobSpec("x", 3), JobState.QUEUED, 0, 0)
    (tmp_path / "jobs" / "j2" / "region").write_bytes(b"\0" * 65536)
    launcher.write_region(old, [_gpu(0)])
    assert (tmp_path / "jobs" / "j2" / "region" / shim.CONTROL_NAME).is_file()


def test_whole_gpus_set_no_share_variables(tmp_path: Path) -> None:
    job = Job("j2", JobSpec("x", 3, gpus=2), JobState.QUEUED, 0, 0, resume=True)
    env = Launcher(tmp_path).environment(job, [_gpu(0), _gpu(1)], "tok")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0,GPU-1" and env["NEURONETES_RESUME"] == "1"
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in env and "CUDA_DEVICE_SM_LIMIT" not in env


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ('python train.py --name "a b"', ["python", "train.py", "--name", "a b"]),
        ("python a.py | tee log", ["/bin/sh", "-c", "python a.py | tee log"]),
        ("X=1 python a.py", ["/bin/sh", "-c", "X=1 python a.py"]),
        ("echo 'unbalanced", ["/bin/sh", "-c", "echo 'unbalanced"]),
    ],
)
def test_commands_without_shell_syntax_run_directly(command: str, argv: list[str]) -> None:
    assert command_argv(command) == argv


def test_the_shepherd_records_the_status_and_ends_the_group(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    exit_file = tmp_path / "exit-1"
    pid_file = tmp_path / "left-behind"
    command = f"sleep 30 & echo $! > {pid_file}; exit 3"
    shepherd = subprocess.run(
        [
            sys.executable,
            "-m",
            "neuronetes_agent.workstation.shepherd",
            str(exit_file),
            "--",
            "/bin/sh",
            "-c",
            command,
        ],
        start_new_session=True,
        timeout=30,
        check=False,
    )
    assert shepherd.returncode == -9 and exit_file.read_text() == "3\n"
    left = int(pid_file.read_text())

    def gone() -> bool:
        try:
            stat = Path(f"/proc/{left}/stat").read_text()
        except OSError:
            return True
        return stat[stat.rfind(")") + 2] == "Z"

    deadline = time.monotonic() + 5
    while not gone():
        assert time.monotonic() < deadline, "the background process outlived its job"
        time.sleep(0.05)
