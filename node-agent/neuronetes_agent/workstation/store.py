"""The daemon's state: one SQLite database in the state directory.

WAL journal with ``synchronous=FULL``: a transition is on disk before the daemon acts on it, so a
daemon killed with SIGKILL at any point restarts from what it last recorded (`recovery`). The
schema version is SQLite's ``user_version``; a database from a newer daemon is refused, never
rewritten. Tables: ``jobs`` (one row per job), ``transitions`` (every state change with time and
reason), ``gpus`` (administrator holds: drained, offline) and ``gpu_transitions`` (GPU state changes).

The database and its ``-wal`` and ``-shm`` files are created ``0600`` (SQLite gives the last two the
database's mode) and reached without following links (`statedir`). A row that is out of range
(a value no daemon writes, a type SQLite let through) is not loaded: it is reported once in the log
and in `Store.problems` (``status`` shows them), and every other job is served as usual.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from .jobs import FINAL, Job, JobSpec, JobState, Refused, check_transition
from .statedir import StateDir

__all__ = ["SCHEMA_VERSION", "GpuHold", "Store", "StoreError"]

log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 1
DB_NAME: Final = "state.db"
DB_FILES: Final = (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", f"{DB_NAME}-journal")

_SCHEMA: Final = """
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    command TEXT NOT NULL,
    priority INTEGER NOT NULL,
    gpus_wanted INTEGER NOT NULL,
    memory_bytes INTEGER NOT NULL,
    compute_percent INTEGER NOT NULL,
    checkpointable INTEGER NOT NULL,
    workdir TEXT NOT NULL,
    state TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    queued_at REAL NOT NULL,
    gpus TEXT NOT NULL DEFAULT '',
    pid INTEGER NOT NULL DEFAULT 0,
    pid_start INTEGER NOT NULL DEFAULT 0,
    token TEXT NOT NULL DEFAULT '',
    attempt INTEGER NOT NULL DEFAULT 0,
    resume INTEGER NOT NULL DEFAULT 0,
    suspended TEXT NOT NULL DEFAULT '',
    exit_code INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    started_at REAL NOT NULL DEFAULT 0,
    finished_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX jobs_by_name ON jobs(name);
CREATE INDEX jobs_by_state ON jobs(state);
CREATE TABLE transitions (
    job_id TEXT NOT NULL REFERENCES jobs(id),
    at REAL NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX transitions_by_job ON transitions(job_id);
CREATE TABLE gpus (
    uuid TEXT PRIMARY KEY,
    drained INTEGER NOT NULL DEFAULT 0,
    offline INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT '',
    reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE gpu_transitions (
    uuid TEXT NOT NULL,
    at REAL NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    reason TEXT NOT NULL
);
"""

# Columns a caller may change with `Store.update` (everything but identity, spec and state).
_MUTABLE: Final = frozenset(
    {
        "gpus",
        "pid",
        "pid_start",
        "token",
        "attempt",
        "resume",
        "suspended",
        "exit_code",
        "reason",
        "started_at",
        "finished_at",
        "queued_at",
    }
)


class StoreError(RuntimeError):
    """The database cannot be used (unreadable, from a newer daemon)."""


class GpuHold:
    """Administrator holds on one GPU, as stored."""

    __slots__ = ("drained", "offline")

    def __init__(self, drained: bool = False, offline: bool = False) -> None:
        self.drained = drained
        self.offline = offline


class Store:
    """Jobs and GPU holds in ``<state_dir>/state.db``. Thread-safe (one connection, one lock)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / DB_NAME
        self.problems: dict[str, str] = {}  # rows not loaded: job id (or row number) → why
        state = None
        try:
            state = StateDir(state_dir)
            state.make_private(DB_FILES, create=DB_NAME)
        except OSError as exc:
            raise StoreError(str(exc)) from None
        finally:
            if state is not None:
                state.close()
        old = os.umask(0o077)  # SQLite creates -wal and -shm (with the database's mode, 0600)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"state database {self.path}: {exc}") from exc
        finally:
            os.umask(old)
        self._lock = threading.RLock()

    def _migrate(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"schema version {version} is newer than this daemon's ({SCHEMA_VERSION}): upgrade the daemon"
            )
        if version == 0:
            self._db.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- jobs ------------------------------------------------------------------------------------

    def add_job(self, spec: JobSpec, now: float) -> Job:
        """Store a new job, PENDING (with its first history entry)."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO jobs (id, name, command, priority, gpus_wanted, memory_bytes, compute_percent,"
                " checkpointable, workdir, state, submitted_at, queued_at)"
                " VALUES ('', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    spec.name,
                    spec.command,
                    spec.priority,
                    spec.gpus,
                    spec.memory_bytes,
                    spec.compute_percent,
                    int(spec.checkpointable),
                    spec.workdir,
                    JobState.PENDING.value,
                    now,
                    now,
                ),
            )
            job_id = f"j{cur.lastrowid}"
            db.execute("UPDATE jobs SET id = ? WHERE seq = ?", (job_id, cur.lastrowid))
            db.execute(
                "INSERT INTO transitions VALUES (?, ?, '', ?, 'submitted')",
                (job_id, now, JobState.PENDING.value),
            )
        return Job(job_id, spec, JobState.PENDING, now, now, history=[(now, "", "PENDING", "submitted")])

    def transition(self, job: Job, to: JobState, reason: str, now: float, **fields: Any) -> Refused | None:
        """Move `job` to `to` (with `fields` changed in the same transaction) if the table allows it."""
        refused = check_transition(job.id, job.state, to)
        if refused is not None:
            return refused
        fields["reason"] = reason
        if to in FINAL:
            fields.setdefault("finished_at", now)
        sets, values = self._assignments(fields)
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET state = ?, {sets} WHERE id = ?", (to.value, *values, job.id))
            db.execute(
                "INSERT INTO transitions VALUES (?, ?, ?, ?, ?)",
                (job.id, now, job.state.value, to.value, reason),
            )
        job.history.append((now, job.state.value, to.value, reason))
        job.state = to
        self._apply(job, fields)
        return None

    def update(self, job: Job, **fields: Any) -> None:
        """Change a job's process or placement fields (no state change)."""
        sets, values = self._assignments(fields)
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*values, job.id))
        self._apply(job, fields)

    @staticmethod
    def _assignments(fields: dict[str, Any]) -> tuple[str, list[Any]]:
        unknown = set(fields) - _MUTABLE
        if unknown:
            raise ValueError(f"not a mutable job field: {sorted(unknown)}")
        values = [
            ",".join(v) if k == "gpus" else (int(v) if isinstance(v, bool) else v) for k, v in fields.items()
        ]
        return ", ".join(f"{k} = ?" for k in fields), values

    @staticmethod
    def _apply(job: Job, fields: dict[str, Any]) -> None:
        for key, value in fields.items():
            setattr(job, key, tuple(value) if key == "gpus" else value)

    def jobs(self, *, states: frozenset[JobState] | None = None) -> list[Job]:
        """Jobs in submission order (those in `states` only, when given), with their history."""
        if states is None:
            return self._select("ORDER BY seq", [])
        marks = ", ".join("?" * len(states))
        return self._select(f"WHERE state IN ({marks}) ORDER BY seq", [s.value for s in states])

    def find(self, name_or_id: str) -> Job | None:
        """A job by id, else the newest job with that name."""
        found = self._select("WHERE id = ?", [name_or_id]) or self._select(
            "WHERE name = ? ORDER BY seq DESC LIMIT 1", [name_or_id]
        )
        return found[0] if found else None

    def _select(self, clause: str, args: list[Any]) -> list[Job]:
        with self._lock:
            cur = self._db.execute(f"SELECT * FROM jobs {clause}", args)
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
            history: dict[str, list[tuple[float, str, str, str]]] = {}
            ids = [row["id"] for row in rows]
            for chunk in range(0, len(ids), 500):  # SQLite's limit on bound parameters
                part = ids[chunk : chunk + 500]
                marks = ", ".join("?" * len(part))
                query = f"SELECT * FROM transitions WHERE job_id IN ({marks}) ORDER BY rowid"
                for job_id, at, frm, to, why in self._db.execute(query, part):
                    history.setdefault(job_id, []).append((at, frm, to, why))
        jobs: list[Job] = []
        for row in rows:
            try:
                jobs.append(_job_of(row, history))
            except (ValueError, TypeError, KeyError) as exc:
                self._problem(row, exc)
        return jobs

    def _problem(self, row: dict[str, Any], exc: Exception) -> None:
        key = row["id"] if isinstance(row.get("id"), str) else f"row {row.get('seq')}"
        if key not in self.problems:
            self.problems[key] = f"job {key} not loaded: {exc}"
            log.warning("state database %s: %s", self.path, self.problems[key])

    # ---- GPUs ------------------------------------------------------------------------------------

    def gpu_holds(self) -> dict[str, GpuHold]:
        with self._lock:
            rows = self._db.execute("SELECT uuid, drained, offline FROM gpus").fetchall()
        return {u: GpuHold(bool(d), bool(o)) for u, d, o in rows}

    def set_gpu_hold(self, uuid: str, *, drained: bool, offline: bool) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO gpus (uuid, drained, offline) VALUES (?, ?, ?)"
                " ON CONFLICT(uuid) DO UPDATE SET drained = excluded.drained, offline = excluded.offline",
                (uuid, int(drained), int(offline)),
            )

    def record_gpu_state(self, uuid: str, state: str, reason: str, now: float) -> None:
        """Record the GPU's state when it changed since the last record."""
        with self._tx() as db:
            row = db.execute("SELECT state FROM gpus WHERE uuid = ?", (uuid,)).fetchone()
            before = row[0] if row else ""
            if before == state:
                return
            db.execute(
                "INSERT INTO gpus (uuid, state, reason) VALUES (?, ?, ?)"
                " ON CONFLICT(uuid) DO UPDATE SET state = excluded.state, reason = excluded.reason",
                (uuid, state, reason),
            )
            db.execute(
                "INSERT INTO gpu_transitions VALUES (?, ?, ?, ?, ?)", (uuid, now, before, state, reason)
            )

    def gpu_history(self, uuid: str) -> list[tuple[float, str, str, str]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT at, from_state, to_state, reason FROM gpu_transitions WHERE uuid = ? ORDER BY rowid",
                (uuid,),
            ).fetchall()
        return [(float(a), str(f), str(t), str(r)) for a, f, t, r in rows]


_INTS: Final = (
    ("priority", 0, 1 << 31),
    ("gpus_wanted", 0, 1 << 31),
    ("memory_bytes", 0, 1 << 63),
    ("compute_percent", 0, 101),
    ("checkpointable", 0, 2),
    ("pid", 0, 1 << 22),  # the kernel's PID_MAX_LIMIT
    ("pid_start", 0, 1 << 63),
    ("attempt", 0, 1 << 31),
    ("resume", 0, 2),
)
_TEXTS: Final = ("id", "name", "command", "workdir", "state", "gpus", "token", "suspended", "reason")
_TIMES: Final = ("submitted_at", "queued_at", "started_at", "finished_at")
_SUSPENDED: Final = frozenset({"", "checkpoint", "stopped", "signalled"})


def _check_row(row: dict[str, Any]) -> None:
    """Raise ValueError naming the first value of `row` no daemon would have written."""
    for name, low, high in _INTS:
        value = row[name]
        if type(value) is not int or not low <= value < high:
            raise ValueError(f"{name} {value!r} is out of range")
    for name in _TEXTS:
        if type(row[name]) is not str:
            raise ValueError(f"{name} {row[name]!r} is not text")
    for name in _TIMES:
        value = row[name]
        if type(value) not in (int, float) or not math.isfinite(value):
            raise ValueError(f"{name} {value!r} is not a time")
    code = row["exit_code"]
    if code is not None and (type(code) is not int or not -(1 << 31) <= code < 1 << 31):
        raise ValueError(f"exit_code {code!r} is out of range")
    if row["suspended"] not in _SUSPENDED:
        raise ValueError(f"suspended {row['suspended']!r} is not a way to hold a job")


def _job_of(row: dict[str, Any], history: dict[str, list[tuple[float, str, str, str]]]) -> Job:
    _check_row(row)
    spec = JobSpec(
        command=row["command"],
        priority=row["priority"],
        name=row["name"],
        gpus=row["gpus_wanted"],
        memory_bytes=row["memory_bytes"],
        compute_percent=row["compute_percent"],
        checkpointable=bool(row["checkpointable"]),
        workdir=row["workdir"],
    )
    return Job(
        id=row["id"],
        spec=spec,
        state=JobState(row["state"]),
        submitted_at=row["submitted_at"],
        queued_at=row["queued_at"],
        gpus=tuple(g for g in row["gpus"].split(",") if g),
        pid=row["pid"],
        pid_start=row["pid_start"],
        token=row["token"],
        attempt=row["attempt"],
        resume=bool(row["resume"]),
        suspended=row["suspended"],
        exit_code=row["exit_code"],
        reason=row["reason"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        history=history.get(row["id"], []),
    )
