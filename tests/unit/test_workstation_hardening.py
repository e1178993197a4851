"""The workstation daemon's parts against a job's own children and another local user: the shepherd's
containment, the GPU held until an attempt is gone, the state directory's checks, private database
files, bounded log tails and rows that cannot be loaded (docs/workstation.md; docs/threat-model.md,
"Workstation daemon")."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from workstation_support import workstation_scheduler

from neuronetes_agent.workstation import logtail
from neuronetes_agent.workstation.client import call
from neuronetes_agent.workstation.containment import detect
from neuronetes_agent.workstation.gpus import Gpus, open_backend
from neuronetes_agent.workstation.jobs import Job, JobSpec, JobState, SpecError, parse_size
from neuronetes_agent.workstation.launcher import Launcher
from neuronetes_agent.workstation.main import _lock
from neuronetes_agent.workstation.protocol import Err, Ping
from neuronetes_agent.workstation.scheduler import Scheduler
from neuronetes_agent.workstation.statedir import StateDir, StateDirError
from neuronetes_agent.workstation.store import Store

pytestmark = pytest.mark.unit
S = JobState
REPO = Path(__file__).resolve().parents[2]
ESCAPER = REPO / "tests" / "fixtures" / "workstation" / "escaper.py"
OTHER = 65534  # another local user (nobody)


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2] not in "ZX"


def _root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") in ("1", "true", "TRUE", "True", "yes", "on"):
            pytest.fail("CI runs as root: this test must run there")
        pytest.skip("needs root, to act as another local user")


def as_other_user(action: Callable[[], None]) -> int:
    """Run `action` in a child process as uid and gid 65534; 0 when it raised nothing."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(OTHER)
            os.setuid(OTHER)
            action()
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory another user can reach (pytest's own is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="nn-ws-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ---- 1. containment --------------------------------------------------------------------------------


@pytest.mark.parametrize("log_max", [None, "65536"])
def test_the_shepherd_leaves_nothing_of_the_job_behind(tmp_path: Path, log_max: str | None) -> None:
    """A grandchild that left the job's group and session (setsid, double fork) and its token: the
    shepherd, a subreaper, kills it before it exits itself."""
    pidfile = tmp_path / "escaped.pid"
    options = ["--log-max", log_max] if log_max else []
    shepherd = subprocess.run(
        [
            sys.executable,
            "-m",
            "neuronetes_agent.workstation.shepherd",
            str(tmp_path / "exit-1"),
            *options,
            "--",
            sys.executable,
            str(ESCAPER),
            str(pidfile),
            "exit",
        ],
        start_new_session=True,
        timeout=30,
        check=False,
        capture_output=True,
    )
    escaped = int(pidfile.read_text())
    assert shepherd.returncode == -9 and (tmp_path / "exit-1").read_text() == "0\n"
    deadline = time.monotonic() + 2
    while _alive(escaped):
        if time.monotonic() > deadline:
            os.kill(escaped, 9)
            raise AssertionError(f"the escaped grandchild {escaped} outlived its job")
        time.sleep(0.02)


@pytest.fixture
def sched(tmp_path: Path) -> Iterator[Scheduler]:
    with workstation_scheduler(tmp_path) as scheduler:
        yield scheduler


def test_the_gpu_waits_until_every_process_of_an_ended_attempt_is_gone(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = sched.store.add_job(JobSpec("true", 1, name="first"), 1.0)
    sched.store.transition(first, S.QUEUED, "queued", 1.0)
    sched.tick()
    assert sched.store.find("first").state is S.RUNNING  # type: ignore[union-attr]
    left = {"over": False}
    settle = sched.launcher.settle
    monkeypatch.setattr(sched.launcher, "settle", lambda job: left["over"] and settle(job))
    deadline = time.monotonic() + 10
    while sched.store.find("first").state is S.RUNNING:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        sched.tick()
        time.sleep(0.02)
    assert sched.store.find("first").state is S.COMPLETED  # type: ignore[union-attr]
    second = sched.store.add_job(JobSpec("true", 1, name="second"), 2.0)
    sched.store.transition(second, S.QUEUED, "queued", 2.0)
    for _ in range(3):
        sched.tick()
    waiting = sched.store.find("second")
    assert waiting is not None and waiting.state is S.QUEUED
    assert "held by job j1 (its processes are exiting)" in waiting.reason
    left["over"] = True
    sched.tick()
    sched.tick()
    assert sched.store.find("second").state is S.RUNNING  # type: ignore[union-attr]


def test_a_cgroup_mode_the_user_may_not_use_is_refused_in_one_line(shared_tmp: Path) -> None:
    """`--containment cgroup2` (or `cgroup1`) where the daemon's user may not create cgroups: one
    line saying why, never a quiet fall back to another mode (`auto` falls back, and says so)."""
    _root()
    state = shared_tmp / "state"
    state.mkdir(mode=0o700)
    os.chown(state, OTHER, OTHER)

    def refused() -> None:
        for mode in ("cgroup2", "cgroup1"):
            try:
                detect(mode, state)
            except ValueError as exc:
                assert str(exc).startswith(f"--containment {mode}: ") and "\n" not in str(exc), exc
            else:
                raise AssertionError(f"{mode} accepted for a user who may not create cgroups")
        fallback = detect("auto", state)
        assert fallback.kind == "subreaper" and "cgroup" in fallback.describe()

    assert as_other_user(refused) == 0


# ---- 2. the state directory ------------------------------------------------------------------------


def test_a_state_directory_another_user_owns_or_may_write_is_refused(shared_tmp: Path) -> None:
    state = shared_tmp / "state"
    state.mkdir(mode=0o700)
    state.chmod(0o770)
    with pytest.raises(StateDirError, match=r"writable by its group or by others \(mode 0770\)"):
        StateDir(state)
    _root()
    state.chmod(0o700)
    os.chown(state, OTHER, OTHER)
    with pytest.raises(StateDirError, match=f"belongs to uid {OTHER}, not to you"):
        StateDir(state)


def test_links_another_user_planted_are_never_followed(shared_tmp: Path) -> None:
    """Another user, given a world-writable state directory, plants links to the victim's files:
    the daemon refuses the directory; once it is the user's own again, it refuses the links (the
    lock file, a job's log) and the directory the other user made, and never writes the victim."""
    _root()
    victim = shared_tmp / "victim"
    victim.write_text("precious\n")
    state = shared_tmp / "state"
    state.mkdir()
    state.chmod(0o777)

    def plant() -> None:
        (state / "daemon.lock").symlink_to(victim)
        (state / "jobs" / "j1").mkdir(parents=True)
        (state / "jobs" / "j1" / "stdout.log").symlink_to(victim)

    assert as_other_user(plant) == 0
    with pytest.raises(StateDirError, match="writable by its group or by others"):
        StateDir(state)
    state.chmod(0o700)
    with pytest.raises(StateDirError, match=r"daemon\.lock is a symbolic link"):
        _lock(StateDir(state))
    with pytest.raises(StateDirError, match=f"jobs belongs to uid {OTHER}"):
        Launcher(state)
    shutil.rmtree(state / "jobs")
    (state / "jobs" / "j1").mkdir(parents=True, mode=0o700)
    (state / "jobs" / "j1" / "stdout.log").symlink_to(victim)
    launcher = Launcher(state)
    job = Job("j1", JobSpec("true", 1), S.RUNNING, 0, 0, attempt=1)
    backend, _ = open_backend(1)
    try:
        store = Store(state)
        view = next(iter(Gpus(backend, store).refresh({}, 0.0).values()))
        with pytest.raises(StateDirError, match=r"stdout\.log is a symbolic link"):
            launcher.start(job, [view], "tok")
        store.close()
    finally:
        backend.close()
    assert victim.read_text() == "precious\n" and os.stat(victim).st_uid == 0


def test_the_database_its_wal_and_its_shm_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        state = tmp_path / "state"
        store = Store(state)
        job = store.add_job(JobSpec("env SECRET=1 true", 1), 1.0)
        store.transition(job, S.QUEUED, "queued", 1.0)
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
        store.close()
        for name in ("state.db", "state.db-wal", "state.db-shm"):  # left readable by an older daemon
            (state / name).touch()
            (state / name).chmod(0o644)
        Store(state).close()
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            if (state / name).exists():
                assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
    finally:
        os.umask(old)


def test_the_client_talks_only_to_a_socket_of_its_own(shared_tmp: Path) -> None:
    import socket

    state = shared_tmp / "state"
    state.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(state / "daemon.sock"))
        listener.listen()
        state.chmod(0o777)  # someone else could have replaced the socket
        reply = call(state, Ping(), timeout_s=2)
        assert isinstance(reply, Err) and reply.code == "unsafe" and "writable by" in reply.message
        state.chmod(0o700)
        _root()
        os.lchown(state / "daemon.sock", OTHER, OTHER)
        reply = call(state, Ping(), timeout_s=2)
        assert isinstance(reply, Err) and reply.code == "unsafe" and "not a socket of yours" in reply.message


# ---- 3. logs ---------------------------------------------------------------------------------------


def test_a_tail_reads_the_end_of_a_huge_log_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    with open(log, "wb") as f:
        f.truncate(200 << 20)  # 200 MB of NULs, no line break
        f.seek(0, 2)
        f.write(b"\n" + b"x" * 10_000 + b"\nlast\n")
    fd = os.open(log, os.O_RDONLY)
    try:
        tracemalloc.start()
        lines, scanned, whole = logtail.tail(fd, 10_000)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        os.close(fd)
    assert peak < 16 << 20 and scanned <= logtail.MAX_SCAN_BYTES and not whole
    assert lines[-1] == "last" and lines[-2].endswith("(10000 bytes, cut to 4096)")
    assert lines[0].startswith("…")  # the first line in reach, cut by the scan's bound


def test_a_tail_continues_into_the_rotated_log(tmp_path: Path) -> None:
    (tmp_path / "out.log.1").write_text("".join(f"{i}\n" for i in range(5)))
    (tmp_path / "out.log").write_text("5\n6\n")

    def open_log(name: str) -> int:
        return os.open(tmp_path / name, os.O_RDONLY)

    assert logtail.tail_rotated(open_log, "out.log", 4) == ["3", "4", "5", "6"]
    assert logtail.tail_rotated(open_log, "out.log", 100) == [str(i) for i in range(7)]
    assert logtail.tail_rotated(open_log, "missing.log", 3) == []


# ---- 5. rows, names, sizes -------------------------------------------------------------------------


def test_rows_out_of_range_are_reported_and_the_rest_load(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for name in ("a", "b", "c", "d"):
        job = store.add_job(JobSpec("true", 1, name=name), 1.0)
        store.transition(job, S.QUEUED, "queued", 1.0)
    store.close()
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("UPDATE jobs SET priority = 5000 WHERE id = 'j1'")
    db.execute("UPDATE jobs SET state = 'EXPLODED' WHERE id = 'j2'")
    db.execute("UPDATE jobs SET pid = 'many' WHERE id = 'j3'")
    db.commit()
    db.close()
    store = Store(tmp_path)
    assert [j.name for j in store.jobs()] == ["d"]
    assert store.find("a") is None and store.find("d") is not None
    assert sorted(store.problems) == ["j1", "j2", "j3"]
    assert "priority" in store.problems["j1"] and "pid 'many'" in store.problems["j3"]


@pytest.mark.parametrize("name", ["j2", "j0", "j123456"])
def test_a_new_job_may_not_be_named_like_an_id(name: str) -> None:
    with pytest.raises(SpecError, match="form of job ids"):
        JobSpec("true", 1, name=name).check_new()
    JobSpec("true", 1, name="j2x").check_new()
    assert JobSpec("true", 1, name=name).name == name  # a stored job so named still loads


@pytest.mark.parametrize("text", ["0.5", "1", "1023Ki", "1048575"])
def test_sizes_below_one_mebibyte_are_refused_naming_the_option(text: str) -> None:
    with pytest.raises(SpecError, match=f"--gpu-memory: bad size '{text}': at least 1Mi"):
        parse_size(text)
    assert parse_size("1Mi") == 1 << 20
