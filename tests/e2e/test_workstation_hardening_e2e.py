"""The workstation daemon against a job's own children and a careless or hostile neighbour: a real
daemon process (docs/workstation.md: "Containment", "Limits", "The state directory"; the
workstation part of docs/threat-model.md)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workstation_harness import (
    Daemon,
    kill_leftovers,
    peak_rss,
    process_alive,
    running_daemon,
    wait_for,
)

from neuronetes_agent.workstation import client, containment
from neuronetes_agent.workstation import protocol as p

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
ESCAPER = REPO / "tests" / "fixtures" / "workstation" / "escaper.py"


def _kind(mode: str, tmp: Path) -> str | None:
    """What the daemon would contain attempts with when asked for `mode`, or None (unusable)."""
    try:
        found = containment.detect(mode, tmp / "probe")
    except ValueError:
        return None
    found.cleanup()
    return found.kind


@pytest.mark.parametrize("mode", [None, "cgroup1", "subreaper"], ids=["default", "cgroup1", "subreaper"])
def test_nothing_a_job_started_outlives_it_nor_gets_its_gpu_handed_on(
    tmp_path: Path, mode: str | None
) -> None:
    """A job's grandchild that left its group and session (setsid, double fork) and dropped its
    token: gone when the job completes, is cancelled or is killed; the next job waiting for the GPU
    does not start while it lives."""
    expected = _kind(mode or "auto", tmp_path)
    if expected is None:
        pytest.skip(f"no writable {mode} hierarchy on this machine")
    extra = ("--containment", mode) if mode else ()
    with running_daemon(tmp_path, *extra) as d:
        for end in ("complete", "cancel", "kill"):
            pidfile = tmp_path / f"{end}.pid"
            command = f"{sys.executable} {ESCAPER} {pidfile} {'exit' if end == 'complete' else 'wait'}"
            d.call(p.Submit(command=command, priority=1, name=f"escaper-{end}"))
            wait_for(pidfile.exists, f"the {end} job's escaped grandchild")
            escaped = int(pidfile.read_text())
            assert process_alive(escaped) or end == "complete"
            d.call(p.Submit(command="true", priority=1, name=f"next-{end}"))  # waits for the GPU
            if end != "complete":
                d.call(p.Cancel(job=f"escaper-{end}", force=end == "kill"))
            deadline = time.monotonic() + 15
            while True:
                # The state first, then the process: alive after RUNNING was read means alive while
                # the next job ran (the other order races a dying process's last moments).
                state = d.state(f"next-{end}")
                if not process_alive(escaped):
                    break
                assert state == "QUEUED", f"the GPU was handed on while {escaped} lived"
                assert time.monotonic() < deadline, f"{end}: the escaped process {escaped} outlived its job"
                time.sleep(0.02)
            assert d.wait_state(f"next-{end}", "COMPLETED")["exitCode"] == 0
            assert d.state(f"escaper-{end}") == ("COMPLETED" if end == "complete" else "CANCELLED")
        for base in containment.base_dirs(d.state_dir):  # every attempt's cgroup removed with it
            assert [c.name for c in base.iterdir() if c.is_dir()] == []
        assert d.call(p.Status())["daemon"]["containment"].startswith(expected)


def test_a_slow_client_is_cut_off_and_extra_clients_are_told_busy(tmp_path: Path) -> None:
    """The request deadline is for the whole request (a client trickling a byte a second is cut off
    after 10 s), and a 17th client while 16 hold connections gets one busy reply at once."""
    with running_daemon(tmp_path) as d:
        path = str(d.state_dir / "daemon.sock")
        idle = []
        for _ in range(16):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            idle.append(s)
        try:
            started = time.monotonic()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as extra:
                extra.connect(path)
                extra.settimeout(5)
                extra.sendall(b'{"op": "ping"}\n')
                reply = json.loads(extra.makefile("rb").readline())
            assert reply["ok"] is False and reply["error"] == "busy", reply
            assert time.monotonic() - started < 2
        finally:
            for s in idle:
                s.close()
        wait_for(lambda: d.call(p.Ping())["pid"] > 0, "served again once the idle clients left")

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
            slow.settimeout(30)
            slow.connect(path)
            started = time.monotonic()
            reply_bytes = b""
            for byte in b'{"op": "ping"                                   ':
                try:
                    slow.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    break
                if time.monotonic() - started > 20:
                    break
                slow.settimeout(1)
                try:
                    reply_bytes = slow.recv(4096)
                except TimeoutError:
                    continue
                break
            elapsed = time.monotonic() - started
        assert elapsed < 13, f"a client trickling a byte a second held the daemon {elapsed:.0f} s"
        reply = json.loads(reply_bytes)
        assert reply["error"] == "bad_request" and "not complete within 10 s" in reply["message"]
        assert d.call(p.Ping())["pid"] == d.proc.pid  # type: ignore[union-attr]


def test_a_log_tail_costs_the_daemon_no_more_than_its_bound(tmp_path: Path) -> None:
    """`logs --tail 10` on a 64 MB log of NULs (no line break, as a runaway job leaves it) costs
    the daemon a few MiB, not the log's size."""
    with running_daemon(tmp_path) as d:
        d.call(p.Submit(command="true", priority=1, name="quiet"))
        d.wait_state("quiet", "COMPLETED")
        huge = d.state_dir / "jobs" / "j1" / "stdout.log"
        with open(huge, "r+b") as f:
            f.truncate(64 << 20)
        before = peak_rss(d.proc.pid)  # type: ignore[union-attr]
        lines = d.call(p.Logs(job="quiet", tail=10))["lines"]
        grown = peak_rss(d.proc.pid) - before  # type: ignore[union-attr]
        assert grown < 32 << 20, f"tailing a 64 MB log took the daemon {grown >> 20} MiB more"
        assert len(lines) == 1 and lines[0].startswith("…") and "cut to 4096" in lines[0]


def test_logs_are_capped_on_disk_and_tailed_across_the_rotation(tmp_path: Path) -> None:
    """A job writing 3 MiB under a 1 MiB cap leaves a current and one rotated file of 1 MiB each;
    a tail longer than the current file continues into the rotated one."""
    with running_daemon(tmp_path, "--log-max-size", "1Mi") as d:
        script = tmp_path / "chatty.py"  # 3 Mi of 1 KiB lines
        script.write_text(
            "import sys\nfor i in range(3 * 1024):\n    sys.stdout.write(f'{i:08d} ' + 'x' * 1014 + '\\n')\n"
        )
        d.call(p.Submit(command=f"{sys.executable} {script}", priority=1, name="chatty"))
        d.wait_state("chatty", "COMPLETED")
        job_dir = d.state_dir / "jobs" / "j1"
        current, rotated = job_dir / "stdout.log", job_dir / "stdout.log.1"
        assert current.stat().st_size == rotated.stat().st_size == 1 << 20  # the first MiB rotated away
        lines = d.call(p.Logs(job="chatty", tail=3))["lines"]
        assert [line[:8] for line in lines] == ["00003069", "00003070", "00003071"]
        spanning = d.call(p.Logs(job="chatty", tail=2000))["lines"]
        assert len(spanning) == 2000 and spanning[0].startswith("00001072")
        assert spanning[-1].startswith("00003071")


def test_one_bad_row_does_not_keep_the_daemon_from_starting(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    try:
        d.start()
        d.submit("first", 1, 1)
        d.submit("second", 1, 1)
        d.wait_state("second", "COMPLETED")
        d.stop()
        db = sqlite3.connect(d.state_dir / "state.db")
        db.execute("UPDATE jobs SET priority = 5000 WHERE id = 'j1'")  # a finished job, out of range
        db.commit()
        db.close()
        d.start()
        problems = d.call(p.Status(all=True))["daemon"]["problems"]
        assert len(problems) == 1 and "j1" in problems[0] and "priority" in problems[0], problems
        assert [j["name"] for j in d.call(p.ListJobs(all=True))] == ["second"]
        d.submit("third", 1, 1)
        d.wait_state("third", "COMPLETED")
        assert "j1 not loaded" in d.log.read_text()
    finally:
        d.stop()
        kill_leftovers(d.state_dir)


def test_names_never_shadow_ids_and_sizes_are_whole_mebibytes(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d:
        d.submit("a", 1, 1)
        for fields, says in [
            ({"name": "j2"}, "form of job ids"),
            ({"gpu_memory": "0.5", "gpu_compute": 10}, "--gpu-memory: bad size '0.5': at least 1Mi"),
            ({"gpu_memory": "1023Ki", "gpu_compute": 10}, "--gpu-memory"),
        ]:
            reply = client.call(d.state_dir, p.Submit(command="true", priority=1, **fields))  # type: ignore[arg-type]
            assert isinstance(reply, p.Err) and reply.code == "invalid" and says in reply.message, reply
        assert [j["id"] for j in d.call(p.ListJobs(all=True))] == ["j1"]
        assert d.call(p.Submit(command="true", priority=1, name="j2x", gpu_memory="1Mi", gpu_compute=10))


def test_the_daemon_refuses_a_state_directory_others_may_write(tmp_path: Path) -> None:
    """Another user with write access to the state directory could plant links or replace the
    socket: the daemon refuses it with one line, and the files it names are not touched."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chmod(state, 0o777)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state / "daemon.lock").symlink_to(victim)
    d = Daemon(tmp_path)
    agent = Path(sys.executable).parent / "neuronetes-agent"
    argv = [str(agent), "--workstation", "--simulate-gpus", "1", "--state-dir", str(state)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=d.env, check=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "writable by its group or by others" in result.stderr
    assert victim.read_text() == "precious\n"

    os.chmod(state, 0o700)  # the user's own directory, with a link in it all the same
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=d.env, check=False)
    assert result.returncode == 1 and "symbolic link" in result.stderr and result.stderr.count("\n") == 1
    assert victim.read_text() == "precious\n"
