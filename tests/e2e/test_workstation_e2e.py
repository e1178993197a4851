"""Workstation mode end to end: a real daemon, real job processes, the simulated GPU backend and the
fake CUDA driver (docs/workstation.md). No cluster: these tests need no control plane."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from workstation_harness import JOB, MIB, Daemon, kill_leftovers, process_alive, running_daemon, wait_for

from neuronetes_agent.workstation import client
from neuronetes_agent.workstation import protocol as p

pytestmark = pytest.mark.e2e


def _states(history: list[dict[str, object]]) -> list[object]:
    return [h["to"] for h in history]


def test_preemption_story(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A low-priority job holding GPU memory runs; an urgent whole-GPU one arrives → the low one
    is PREEMPTED (transparent checkpoint: its GPU memory leaves the GPU), the urgent one RUNNING;
    once the urgent one COMPLETED the low one resumes where it was (memory restored) and
    completes."""
    with running_daemon(tmp_path) as d:
        d.submit("low", 1, 40, mib=1000)
        d.wait_state("low", "RUNNING")
        wait_for(lambda: d.memory.used() == 1000 * MIB, "the low job's 1000 MiB on the GPU")
        listed = d.cli_json(capsys, "jobs", "list")
        assert [(j["name"], j["state"]) for j in listed] == [("low", "RUNNING")]
        # stopped, it would keep them, and the urgent whole-GPU job needs them
        d.measured("low", 1000 * MIB)

        d.submit("high", 10, 10, mib=300)
        low = d.wait_state("low", "PREEMPTED")
        assert "transparent CUDA checkpoint" in low["reason"] and low["suspended"] == "checkpoint"
        d.wait_state("high", "RUNNING")
        wait_for(
            lambda: d.memory.used() == 300 * MIB,
            "only the urgent job's memory on the GPU",
            show=d.memory.used,
        )
        status = d.cli_json(capsys, "status")
        assert {j["name"]: j["state"] for j in status["jobs"]} == {"low": "PREEMPTED", "high": "RUNNING"}
        assert status["daemon"]["checkpoint"].startswith("available")

        d.wait_state("high", "COMPLETED")
        d.wait_state("low", "RUNNING")
        wait_for(lambda: d.memory.used() == 1000 * MIB, "the low job's memory restored", show=d.memory.used)
        low = d.wait_state("low", "COMPLETED")
        assert _states(low["history"]) == [
            "PENDING",
            "QUEUED",
            "RUNNING",
            "PREEMPTED",
            "QUEUED",
            "RUNNING",
            "COMPLETED",
        ]
        out = d.stdout("low")
        assert out[0] == "ready from 0 resume=0" and out[-1] == "done 40"
        assert [line for line in out if line.startswith("step")] == [f"step {k}" for k in range(40)]
        assert len(d.runs_of()) == 2  # one start each: the low job was resumed, not restarted
        code, table, _ = d.cli(capsys, "status", "--all")
        assert code == 0 and "COMPLETED" in table and "high" in table
        everything = d.cli_json(capsys, "jobs", "list", "--all")
        assert [(j["name"], j["state"], j["exitCode"]) for j in everything] == [
            ("low", "COMPLETED", 0),
            ("high", "COMPLETED", 0),
        ]


def test_cancel_and_kill_in_every_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_daemon(tmp_path) as d:
        d.submit("base", 5, 10_000, mib=100)
        d.wait_state("base", "RUNNING")
        d.submit("q1", 1, 5)
        d.submit("q2", 1, 5)
        d.wait_state("q1", "QUEUED")
        assert d.cli(capsys, "cancel", "q1")[0] == 0  # queued: cancel
        assert d.cli(capsys, "jobs", "kill", "q2")[0] == 0  # queued: kill
        assert d.state("q1") == d.state("q2") == "CANCELLED"

        d.submit("urgent", 9, 10_000, mib=100)
        base = d.wait_state("base", "PREEMPTED")
        urgent = d.wait_state("urgent", "RUNNING")
        assert d.cli(capsys, "jobs", "cancel", "base")[0] == 0  # preempted: cancel
        assert d.wait_state("base", "CANCELLED")["reason"] == "cancelled (SIGTERM) by the user"
        wait_for(lambda: not process_alive(base["pid"]), "the preempted job's processes gone")
        assert d.cli(capsys, "jobs", "kill", "urgent")[0] == 0  # running: kill
        assert d.state("urgent") == "CANCELLED"
        wait_for(lambda: not process_alive(urgent["pid"]), "the killed job's processes gone")

        d.submit("base2", 5, 10_000, mib=100)
        d.wait_state("base2", "RUNNING")
        d.submit("urgent2", 9, 10_000, mib=100)
        base2 = d.wait_state("base2", "PREEMPTED")
        urgent2 = d.wait_state("urgent2", "RUNNING")
        assert d.cli(capsys, "jobs", "kill", "base2")[0] == 0  # preempted: kill
        assert d.cli(capsys, "cancel", "urgent2")[0] == 0  # running: cancel
        for job in (base2, urgent2):

            def gone(pid: int = job["pid"]) -> bool:
                return not process_alive(pid)

            wait_for(gone, f"{job['name']} gone")
        wait_for(lambda: d.memory.used() == 0, "every job's GPU memory released", show=d.memory.used)
        code, _, err = d.cli(capsys, "cancel", "urgent2")
        assert code == 1 and err.strip() == "error: job j6 is already CANCELLED"
        states = {j["name"]: j["state"] for j in d.cli_json(capsys, "jobs", "list", "--all")}
        assert set(states.values()) == {"CANCELLED"}


def test_daemon_killed_at_every_point_of_the_story(tmp_path: Path) -> None:
    """SIGKILL the daemon while the low job runs, while it is preempted, and while the urgent job
    finishes unobserved: no job lost, none run twice, running jobs re-adopted."""
    d = Daemon(tmp_path)
    try:
        d.start()
        d.submit("low", 1, 60, mib=500)
        low = d.wait_state("low", "RUNNING")
        d.kill()  # 1: while the low job runs
        d.start()
        again = d.wait_state("low", "RUNNING")
        assert again["pid"] == low["pid"] and again["attempt"] == 1  # re-adopted, not restarted
        wait_for(lambda: d.memory.used() == 500 * MIB, "the low job's 500 MiB on the GPU")
        d.measured("low", 500 * MIB)  # stopping it would not free them: it is checkpointed

        d.submit("high", 10, 100_000, mib=200)
        d.wait_state("low", "PREEMPTED")
        high = d.wait_state("high", "RUNNING")
        d.kill()  # 2: low preempted (checkpointed), high running
        d.start()
        assert d.state("low") == "PREEMPTED" and d.job("high")["pid"] == high["pid"]
        wait_for(
            lambda: d.memory.used() == 200 * MIB, "the preempted job still off the GPU", show=d.memory.used
        )

        d.kill()  # 3: the urgent job finishes while no daemon watches (SIGUSR1: it saves, exits 0)
        os.killpg(high["pid"], signal.SIGUSR1)
        wait_for(lambda: not process_alive(high["pid"]), "the urgent job's end")
        d.start()
        high = d.wait_state("high", "COMPLETED")
        assert high["exitCode"] == 0
        d.wait_state("low", "RUNNING")
        low = d.wait_state("low", "COMPLETED", timeout=20)
        out = d.stdout("low")
        assert [line for line in out if line.startswith("step")] == [f"step {k}" for k in range(60)]
        runs = d.runs_of()
        assert len(runs) == 2 and len({r.split()[0] for r in runs}) == 2, runs  # each job started once
        assert [j["state"] for j in d.call(p.ListJobs(all=True))] == ["COMPLETED", "COMPLETED"]
    finally:
        d.stop()
        kill_leftovers(d.state_dir)


def test_admission_waits_for_utilization_heat_and_external_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_daemon(tmp_path) as d:
        d.simulate(fault={"utilizationPercent": 95})
        d.submit("busy", 1, 2)
        wait_for(
            lambda: "above the cap 85 %" in d.job("busy")["reason"],
            "held by the utilization cap",
            show=lambda: d.job("busy"),
        )
        assert d.state("busy") == "QUEUED"
        d.simulate(fault={"utilizationPercent": 10})
        d.wait_state("busy", "COMPLETED")

        d.simulate(fault={"temperatureCelsius": 91})
        d.submit("hot", 1, 2)
        wait_for(
            lambda: "temperature 91" in d.job("hot")["reason"],
            "held by the thermal pause",
            show=lambda: d.job("hot"),
        )
        d.simulate(fault={"temperatureCelsius": 60})
        d.wait_state("hot", "COMPLETED")

        d.simulate(process={"pid": 4242, "bytes": 76 << 30})  # a process the daemon did not start
        d.submit("share", 1, 2, gpu_memory="8Gi", gpu_compute=50)
        wait_for(
            lambda: "did not start hold 76.0 GiB" in d.job("share")["reason"],
            "held by external memory",
            show=lambda: d.job("share"),
        )
        assert d.call(p.Status())["gpus"][0]["processes"] == [{"pid": 4242, "usedMemoryBytes": 76 << 30}]
        d.simulate(process={"pid": 4242, "bytes": 0})
        d.wait_state("share", "COMPLETED")
        code, out, _ = d.cli(capsys, "watch", "--interval", "100ms", "--count", "3", "--all")
        assert code == 0 and "GPUs" in out and "Jobs" in out and "share" in out and "COMPLETED" in out


def test_cooperative_and_stop_rungs(tmp_path: Path) -> None:
    """No CUDA process: a --checkpointable job holding memory the urgent job needs saves on SIGUSR1
    and resumes from its step; a share that leaves room is stopped and continued."""
    with running_daemon(tmp_path) as d:
        d.submit("coop", 1, 40, checkpointable=True)
        d.wait_state("coop", "RUNNING")
        d.measured("coop", 8 << 30)  # stopped, it would keep them: the urgent whole-GPU job needs them
        wait_for(lambda: "step 5" in d.stdout("coop"), "some progress")
        d.submit("urgent", 10, 3)
        coop = d.wait_state("coop", "PREEMPTED")
        assert "cooperative checkpoint" in coop["reason"]
        d.wait_state("urgent", "COMPLETED")
        coop = d.wait_state("coop", "COMPLETED")
        assert coop["attempt"] == 2
        out = d.stdout("coop")
        saved = next(line for line in out if line.startswith("saved at step"))
        resumed_from = int(saved.split()[-1])
        assert f"ready from {resumed_from} resume=1" in out and out[-1] == "done 40"

        d.submit("small", 1, 40, gpu_memory="10Gi", gpu_compute=80)
        d.wait_state("small", "RUNNING")
        d.submit("share", 10, 3, gpu_memory="10Gi", gpu_compute=50)
        small = d.wait_state("small", "PREEMPTED")
        assert small["suspended"] == "stopped" and "SIGSTOP" in small["reason"]
        d.wait_state("share", "COMPLETED")
        d.wait_state("small", "COMPLETED")


def test_without_the_checkpoint_api_the_daemon_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_daemon(tmp_path, cuda_driver=tmp_path / "no-libcuda.so.1") as d:
        status = d.cli_json(capsys, "status")
        assert status["daemon"]["checkpoint"].startswith("unavailable: no CUDA driver")
        assert status["daemon"]["checkpoint"].count("no-libcuda.so.1") == 1  # the library named once
        d.submit("low", 1, 10_000)
        low = d.wait_state("low", "RUNNING")
        d.simulate(process={"pid": low["pid"], "bytes": 70 << 30})  # what NVML measures of it
        d.submit("high", 10, 2)  # whole GPU: stopping the low job would leave 10 GiB of 80
        wait_for(
            lambda: "held by job j1; preemption cannot make room" in d.job("high")["reason"],
            "the urgent job waits",
            show=lambda: d.job("high"),
        )
        assert "the driver has no checkpoint API" in d.job("high")["reason"]
        assert "transparent checkpoint unavailable (no CUDA driver (" in d.log.read_text()  # logged at start
        assert d.state("low") == "RUNNING"


NEURONETES = str(Path(sys.executable).parent / "neuronetes")


def _script(state_dir: Path, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The installed `neuronetes` on this daemon, stdout a pipe (as a script or a log reads it)."""
    return subprocess.run(
        [NEURONETES, *argv, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_gpu_holds_and_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """drain/offline/online on the workstation, and the errors that need a live daemon, through the
    installed console script (one ``error:`` line, no traceback)."""
    with running_daemon(tmp_path) as d:
        gpu = d.gpu()

        def run(*argv: str) -> subprocess.CompletedProcess[str]:
            return _script(d.state_dir, *argv)

        for argv, says in [
            (["jobs", "describe", "nope"], "no job 'nope' (no such id or name)"),
            (["jobs", "kill", "nope"], "no such id or name"),
            (["cancel", "nope"], "no such id or name"),
            (["jobs", "logs", "nope"], "no such id or name"),
            (["health", "--gpu-id", "GPU-nope"], "no GPU 'GPU-nope'"),
        ]:
            result = run(*argv)
            assert result.returncode == 1 and result.stdout == "", (argv, result)
            assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
            assert says in result.stderr and "Traceback" not in result.stderr

        assert run("drain", "--gpu-id", gpu).returncode == 0
        d.submit("waits", 1, 2)
        wait_for(
            lambda: "drained" in d.job("waits")["reason"], "held by the drain", show=lambda: d.job("waits")
        )
        assert run("online", "--gpu-id", gpu).returncode == 0
        d.wait_state("waits", "COMPLETED")

        d.submit("busy", 1, 10_000, mib=100)
        busy = d.wait_state("busy", "RUNNING")
        refused = run("offline", "--gpu-id", gpu)
        assert refused.returncode == 1 and "used by job j2: drain it, or --force" in refused.stderr
        assert run("offline", "--gpu-id", gpu, "--force").returncode == 0
        evicted = d.wait_state("busy", "PREEMPTED")
        assert "evicted: GPU 0 taken offline" in evicted["reason"]
        wait_for(lambda: not process_alive(busy["pid"]), "the evicted job's processes gone")
        health = d.cli_json(capsys, "health", "--gpu-id", gpu)
        assert health["state"] == "Offline" and [h["to"] for h in health["history"]][-1] == "Offline"
        code, out, _ = d.cli(capsys, "health", "--gpu-id", gpu)
        assert code == 0 and "History" in out and "Offline" in out
        assert run("online", "--gpu-id", gpu).returncode == 0
        again = d.wait_state("busy", "RUNNING")
        assert again["attempt"] == 2  # started afresh
        code, out, _ = d.cli(capsys, "jobs", "describe", "busy")
        assert code == 0 and "evicted" in out and "History" in out


def test_bad_requests_get_one_error_reply_and_change_nothing(tmp_path: Path) -> None:
    import json
    import socket

    with running_daemon(tmp_path) as d:

        def raw(data: bytes) -> dict[str, object]:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(20)
                sock.connect(str(d.state_dir / "daemon.sock"))
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            assert reply.count(b"\n") == 1
            return dict(json.loads(reply))

        # Over 1 MiB: the daemon stops reading, answers and closes; the sender sees the connection
        # end (a reset, on a Unix socket with unread data) and the daemon goes on serving.
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            raw(b"[" * (4 << 20) + b"\n")

        for data, code in [
            (b"not json\n", "bad_request"),
            (b'{"op": "explode"}\n', "bad_request"),
            (b'{"op": "submit", "command": "true"}\n', "bad_request"),  # no priority
            (b'{"op": "submit", "command": "true", "priority": 1, "extra": 1}\n', "bad_request"),
            (b'{"op": "submit", "command": "true", "priority": "high"}\n', "bad_request"),
            (b'{"op": "submit", "command": "true", "priority": 1, "gpu_memory": "lots"}\n', "invalid"),
            (b'{"op": "submit", "command": "true", "priority": 1, "gpus": 4}\n', "invalid"),
            (b'{"op": "logs", "job": "x", "tail": 0}\n', "invalid"),
            (b'{"op": "gpu", "gpu": "GPU-x", "action": "drain", "force": true}\n', "invalid"),
            (b'{"op": "gpu", "gpu": "GPU-x", "action": "reset"}\n', "bad_request"),
            (b"\n", "bad_request"),
            (b"[" * 1000 + b"\n", "bad_request"),
        ]:
            reply = raw(data)
            assert reply["ok"] is False and reply["error"] == code, (data[:60], reply)
            assert "\n" not in str(reply["message"])
        assert (d.state_dir / "daemon.sock").stat().st_mode & 0o777 == 0o600
        assert d.call(p.ListJobs(all=True)) == []  # nothing was stored
        assert d.call(p.Ping())["pid"] == d.proc.pid  # type: ignore[union-attr]


def test_gpus_by_index_uuid_or_prefix_and_faults_through_the_daemon(tmp_path: Path) -> None:
    """--gpu-id as nvidia-smi -i takes it (index, UUID, unique prefix; an ambiguous prefix names
    its matches) in every verb, and dev inject-* on the daemon's simulated backend."""
    with running_daemon(tmp_path, "--simulate-gpus", "2") as d:
        gpus = d.call(p.Status())["gpus"]
        first, second = (g["uuid"] for g in gpus)
        common = os.path.commonprefix([first, second])  # noqa: RUF071  # UUIDs, not paths
        unique = first[: len(common) + 1]

        refused = _script(d.state_dir, "health", "--gpu-id", common)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert f"GPU {common!r} is ambiguous: it starts {first}, {second}" in refused.stderr
        for ref in ("0", first, unique):
            shown = _script(d.state_dir, "health", "--gpu-id", ref, "-o", "json")
            assert shown.returncode == 0 and json.loads(shown.stdout)["uuid"] == first, shown.stderr
        assert "GPU 1 drained" in _script(d.state_dir, "drain", "--gpu-id", "1").stdout
        online = _script(d.state_dir, "online", "--gpu-id", second[: len(common) + 1])
        assert "GPU 1 back in service" in online.stdout
        assert _script(d.state_dir, "offline", "--gpu-id", "7").stderr.startswith("error: no GPU '7'")

        hot = _script(d.state_dir, "dev", "inject-temperature", "--gpu-id", "1", "--celsius", "95")
        assert hot.returncode == 0 and hot.stdout.startswith(second), hot.stderr
        wait_for(lambda: d.call(p.Health(gpu=second))["state"] == "Degraded", "GPU 1 too hot")
        xid = _script(d.state_dir, "dev", "inject-xid", "--gpu-id", unique, "--xid", "48")
        assert xid.returncode == 0, xid.stderr
        wait_for(
            lambda: any("XID 48" in (h["reason"] or "") for h in d.call(p.Health(gpu=first))["history"]),
            "GPU 0's history records XID 48",
        )
        assert _script(d.state_dir, "dev", "inject-ecc", "--gpu-id", "0", "--corrected", "2").returncode == 0
        bad = _script(d.state_dir, "dev", "inject-xid", "--gpu-id", "0", "--xid", "0")
        # A bad value on the command line is a usage error (docs/cli.md, "Exit codes"), checked
        # before the daemon is asked.
        assert bad.returncode == 2 and "'--xid': 0 is not in the range 1<=x<=999" in bad.stderr


def test_submit_defaults_logs_follow_watch_and_describe(tmp_path: Path) -> None:
    """submit's documented defaults and refusals; jobs logs -f to the end; watch's whole frames
    on a pipe; jobs describe's values."""
    with running_daemon(tmp_path) as d:
        share = _script(d.state_dir, "submit", "--cmd", "true", "--gpu-memory", "8Gi", "--name", "s")
        assert share.returncode == 0, share.stderr
        assert share.stdout.strip().endswith(
            "8.0 GiB, 10 % compute (default: the share's part of the GPU's memory), priority 0"
        )
        assert d.job("s")["request"] == {"gpuMemoryBytes": 8 << 30, "gpuComputePercent": 10}
        assert d.job("s")["priority"] == 0
        # the daemon refuses what the CLI would (its own PATH)
        missing = client.call(d.state_dir, p.Submit(command="no-such-program-here", priority=1))
        assert isinstance(missing, p.Err) and missing.code == "invalid"
        assert missing.message == "command not found: 'no-such-program-here' is not on PATH"

        script = tmp_path / "count.sh"
        script.write_text("#!/bin/sh\nfor i in 1 2 3 4 5; do echo line $i; sleep 0.3; done\n")
        script.chmod(0o755)
        assert _script(d.state_dir, "drain", "--gpu-id", "0").returncode == 0  # the job waits first
        _script(d.state_dir, "submit", "--cmd", str(script), "--name", "counter", "--priority", "3")
        follower = subprocess.Popen(
            [NEURONETES, "jobs", "logs", "counter", "-f", "--state-dir", str(d.state_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: "drained" in d.job("counter")["reason"], "the job held by the drain")
        assert _script(d.state_dir, "online", "--gpu-id", "0").returncode == 0
        out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0, err
        assert out.splitlines() == [f"line {i}" for i in range(1, 6)]
        assert d.state("counter") == "COMPLETED"

        described = _script(d.state_dir, "jobs", "describe", "counter")
        assert described.returncode == 0 and "{" not in described.stdout and "None" not in described.stdout
        fields = described.stdout.split("History")[0].splitlines()
        rows = dict(line.split(None, 1) for line in fields if len(line.split(None, 1)) == 2)
        assert rows["request"].strip() == "1 GPU" and rows["checkpointable"].strip() == "no"
        assert rows["logs"].strip().endswith("stderr.log (stderr)")

        watched = _script(d.state_dir, "watch", "--count", "2", "--interval", "100ms", "--all")
        assert watched.returncode == 0 and watched.stdout.endswith("\n"), watched.stderr
        assert watched.stdout.count("daemon pid") == 2 and "\x1b[" not in watched.stdout


def test_watch_redraws_in_place_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal `watch` redraws one frame over the last (cursor moves and line erases, rich
    Live) and `--count N` stops after N frames; the pipe's whole frames are the test above."""
    import pty

    with running_daemon(tmp_path) as d:
        leader, follower = pty.openpty()
        argv = [NEURONETES, "watch", "--count", "3", "--interval", "100ms", "--state-dir", str(d.state_dir)]
        watcher = subprocess.Popen(
            argv, stdin=follower, stdout=follower, stderr=follower, env={**os.environ, "TERM": "xterm"}
        )
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not chunk:
                break
            shown += chunk
        os.close(leader)
        assert watcher.wait(30) == 0, shown
        text = shown.decode(errors="replace")
        # three frames (rich's Live draws the last once more as it stops), then the watcher exits
        assert text.count("daemon pid") in (3, 4), text
        assert "\x1b[2K" in text and "\x1b[1A" in text  # the frame erased and redrawn in place


def test_a_restore_that_does_not_fit_waits_checkpointed_until_it_does(tmp_path: Path) -> None:
    """Memory the daemon cannot see (a process NVML is not told of) takes the room back while the
    low job is checkpointed: its restore fails, it waits still checkpointed and says so, and it is
    restored once the room is free."""
    with running_daemon(tmp_path) as d:
        d.submit("low", 1, 100_000, mib=1000)
        d.wait_state("low", "RUNNING")
        wait_for(lambda: d.memory.used() == 1000 * MIB, "the low job's 1000 MiB on the GPU")
        d.measured("low", 1000 * MIB)
        d.submit("high", 10, 100_000, mib=300)
        d.wait_state("low", "PREEMPTED")
        d.wait_state("high", "RUNNING")
        wait_for(lambda: d.memory.used() == 300 * MIB, "the low job checkpointed off the GPU")
        outsider = subprocess.Popen(
            [sys.executable, str(JOB), "100000", "--mib", str(80 * 1024 - 300 - 100)],
            env=d.env,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for(lambda: d.memory.used() == (80 * 1024 - 100) * MIB, "the outsider's memory on the GPU")
            d.call(p.Cancel(job="high", force=True))
            wait_for(
                lambda: d.job("low")["reason"].startswith("waiting: restore failed: "),
                "the restore refused for lack of memory",
                show=lambda: d.job("low"),
            )
            low = d.job("low")
            assert (low["state"], low["suspended"]) == ("QUEUED", "checkpoint"), low
        finally:
            outsider.kill()
            outsider.wait()
        low = d.wait_state("low", "RUNNING")
        assert low["reason"] == "resumed: GPU memory restored from the checkpoint" and low["attempt"] == 1
        wait_for(lambda: d.memory.used() == 1000 * MIB, "the low job's memory restored", show=d.memory.used)
        d.call(p.Cancel(job="low", force=True))


def test_a_checkpoint_that_fails_falls_to_the_next_rung_and_is_logged(tmp_path: Path) -> None:
    """The driver refuses to lock the job's CUDA process (someone else holds it locked): a
    --checkpointable job gets the cooperative rung instead; one that is not stays running and says
    why. Both are logged."""
    import ctypes
    import shutil

    with running_daemon(tmp_path, "--checkpoint-deadline", "2") as d:
        driver = tmp_path / "libcuda.so.1"  # a copy: its state file is the daemon's GPU
        shutil.copyfile(d.cuda_driver, driver)
        cuda = ctypes.CDLL(str(driver))
        assert cuda.cuInit(0) == 0
        for name, checkpointable in (("plain", False), ("saver", True)):
            d.submit(name, 1, 100_000, mib=500, checkpointable=checkpointable)
            job_id = d.wait_state(name, "RUNNING")["id"]
            wait_for(lambda: d.memory.used() == 500 * MIB, f"{name}'s 500 MiB on the GPU", show=d.memory.used)
            # its CUDA process: the line it wrote as it started, under its attempt's token
            cuda_pid = int(next(r for r in d.runs_of() if r.startswith(f"{job_id}.")).split()[1])
            assert cuda.cuCheckpointProcessLock(ctypes.c_int(cuda_pid), None) == 0  # held elsewhere
            d.measured(name, 500 * MIB)  # stopping it would not free them
            d.submit(f"urgent-{name}", 10, 1)
            # the cooperative rung: SIGUSR1, then (its CUDA calls wait on the lock) SIGKILL at the deadline
            wanted = "not preempted: transparent checkpoint failed: " if name == "plain" else "after SIGUSR1"

            def stopped_for(name: str = name, wanted: str = wanted) -> bool:
                return wanted in d.job(name)["reason"]

            wait_for(stopped_for, f"{name}: {wanted}")
            assert f"job {d.job(name)['id']}: transparent checkpoint failed (cuCheckpointProcessLock" in (
                d.log.read_text()
            )
            if name == "plain":
                assert d.state("plain") == "RUNNING" and d.state("urgent-plain") == "QUEUED"
                d.call(p.Cancel(job="plain", force=True))
                d.wait_state("urgent-plain", "COMPLETED")
        d.wait_state("saver", "PREEMPTED")
        d.wait_state("urgent-saver", "COMPLETED")
        d.call(p.Cancel(job="saver", force=True))
