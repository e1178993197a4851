"""Workstation mode's pure parts: the job state machine, the store, admission, preemption planning."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from neuronetes.model import GpuHealth
from neuronetes_agent.daemon.devices import GpuProcess
from neuronetes_agent.workstation import admission as adm
from neuronetes_agent.workstation.gpus import GpuView
from neuronetes_agent.workstation.jobs import TRANSITIONS, Job, JobSpec, JobState, SpecError, parse_size
from neuronetes_agent.workstation.preemption import NoRoom, Plan, Rung, plan
from neuronetes_agent.workstation.store import SCHEMA_VERSION, Store, StoreError

pytestmark = pytest.mark.unit
S = JobState
GIB = 1 << 30


def view(
    index: int = 0,
    *,
    util: float = 0.0,
    state: GpuHealth = GpuHealth.AVAILABLE,
    drained: bool = False,
    processes: tuple[GpuProcess, ...] = (),
    used: int = 0,
) -> GpuView:
    return GpuView(f"GPU-{index}", index, "A100", 80 * GIB, used, util, 40.0, processes, state, "", drained)


def job(
    job_id: str,
    priority: int,
    state: JobState = S.QUEUED,
    *,
    queued_at: float = 0.0,
    gpus: tuple[str, ...] = (),
    memory: int = 0,
    compute: int = 100,
    checkpointable: bool = False,
    suspended: str = "",
) -> Job:
    spec = JobSpec(
        "true", priority, memory_bytes=memory, compute_percent=compute, checkpointable=checkpointable
    )
    return Job(job_id, spec, state, queued_at, queued_at, gpus=gpus, suspended=suspended)


def test_transition_table_is_the_documented_machine() -> None:
    assert TRANSITIONS[S.PENDING] == {S.QUEUED, S.CANCELLED, S.FAILED}
    assert TRANSITIONS[S.RUNNING] == {S.COMPLETED, S.FAILED, S.CANCELLED, S.PREEMPTED}
    assert TRANSITIONS[S.PREEMPTED] == {S.QUEUED, S.CANCELLED, S.FAILED}
    assert all(not TRANSITIONS[s] for s in (S.COMPLETED, S.FAILED, S.CANCELLED))


def test_store_refuses_illegal_moves_and_records_history(tmp_path: Path) -> None:
    store = Store(tmp_path)
    j = store.add_job(JobSpec("sleep 1", 5, name="a"), 1.0)
    assert store.transition(j, S.RUNNING, "skip the queue", 2.0) is not None  # PENDING → RUNNING: refused
    assert store.transition(j, S.QUEUED, "queued", 2.0) is None
    assert store.transition(j, S.RUNNING, "started", 3.0, pid=42, gpus=("GPU-0",)) is None
    assert store.transition(j, S.PREEMPTED, "preempted", 4.0, suspended="checkpoint") is None
    assert store.transition(j, S.COMPLETED, "done", 5.0) is not None  # PREEMPTED → COMPLETED: refused
    again = Store(tmp_path).find("a")
    assert again is not None and again.state is S.PREEMPTED and again.pid == 42 and again.gpus == ("GPU-0",)
    assert [(h[1], h[2]) for h in again.history] == [
        ("", "PENDING"),
        ("PENDING", "QUEUED"),
        ("QUEUED", "RUNNING"),
        ("RUNNING", "PREEMPTED"),
    ]
    assert (tmp_path / "state.db").stat().st_mode & 0o777 == 0o600


def test_store_refuses_a_newer_schema(tmp_path: Path) -> None:
    import sqlite3

    Store(tmp_path).close()
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer"):
        Store(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"), [("8Gi", 8 * GIB), ("8GiB", 8 * GIB), ("512Mi", 512 << 20), ("1G", 10**9)]
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1Gi", "0", "8Gb"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(SpecError, match="bad size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"priority": -1}, "bad priority"),
        ({"priority": 1001}, "bad priority"),
        ({"name": "Bad Name"}, "bad name"),
        ({"memory_bytes": GIB, "compute_percent": 0}, "compute share"),
        ({"compute_percent": 50}, "needs --gpu-memory"),
        ({"gpus": 0}, "GPU count"),
    ],
)
def test_bad_specs(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"command": "true", "priority": 1, **kwargs}
    with pytest.raises(SpecError, match=message):
        JobSpec(**fields)  # type: ignore[arg-type]


def test_aging_lets_an_old_low_priority_job_overtake() -> None:
    """A low-priority job gains a point per aging interval; a stream of fresh high-priority jobs
    does not keep it waiting for ever."""
    old = job("old", 1, queued_at=0.0)
    assert [j.id for j in adm.queue_order([old, job("new", 5, queued_at=99.0)], 100.0, 60.0)] == [
        "new",
        "old",
    ]
    assert [j.id for j in adm.queue_order([old, job("new", 5, queued_at=399.0)], 400.0, 60.0)] == [
        "old",
        "new",
    ]


def test_admission_rules() -> None:
    settings = adm.Settings()
    j = job("j", 1)
    views = {"GPU-0": view()}
    assert isinstance(adm.place(j, list(views.values()), adm.loads([], views), {}, settings), adm.Admit)
    hot = view(util=81.0)
    held = adm.place(j, [hot], adm.loads([], {"GPU-0": hot}), {}, settings)
    assert isinstance(held, adm.Hold) and "above the cap 85 %" in held.reason and not held.blocked_by_jobs
    degraded = view(state=GpuHealth.DEGRADED)
    assert isinstance(adm.place(j, [degraded], adm.loads([], {"GPU-0": degraded}), {}, settings), adm.Hold)
    drained = view(drained=True)
    assert isinstance(adm.place(j, [drained], adm.loads([], {"GPU-0": drained}), {}, settings), adm.Hold)
    share = job("s", 1, memory=8 * GIB, compute=50)
    busy = view(processes=(GpuProcess(999, 75 * GIB),))
    held = adm.place(share, [busy], adm.loads([], {"GPU-0": busy}), {"GPU-0": 75 * GIB}, settings)
    assert isinstance(held, adm.Hold) and "did not start hold 75.0 GiB" in held.reason


def test_shares_pack_and_whole_gpus_are_exclusive() -> None:
    settings = adm.Settings()
    views = {"GPU-0": view()}
    a = job("a", 1, S.RUNNING, gpus=("GPU-0",), memory=20 * GIB, compute=50)
    b = job("b", 1, memory=20 * GIB, compute=50)
    c = job("c", 1, memory=20 * GIB, compute=10)
    assert isinstance(adm.place(b, list(views.values()), adm.loads([a], views), {}, settings), adm.Admit)
    b.state, b.gpus = S.RUNNING, ("GPU-0",)
    held = adm.place(c, list(views.values()), adm.loads([a, b], views), {}, settings)
    assert isinstance(held, adm.Hold) and held.blocked_by_jobs and "compute 100 %" in held.reason
    whole = job("w", 1)
    assert isinstance(adm.place(whole, list(views.values()), adm.loads([a], views), {}, settings), adm.Hold)


def test_preemption_plan_picks_the_ladder_and_never_equal_priority() -> None:
    settings = adm.Settings()
    views = [view()]
    low = job("low", 1, S.RUNNING, gpus=("GPU-0",))
    urgent = job("urgent", 10)
    # holding no GPU memory, stopping it makes room: the cheapest rung, whatever else applies
    chosen = plan(urgent, views, [low, urgent], {}, settings, lambda j: Rung.CHECKPOINT)
    assert isinstance(chosen, Plan) and [(v.id, r) for v, r in chosen.victims] == [("low", Rung.STOP)]
    # holding memory the urgent whole-GPU job needs: its checkpoint rung
    holding = {"low": {"GPU-0": 10 * GIB}}
    chosen = plan(urgent, views, [low, urgent], {}, settings, lambda j: Rung.CHECKPOINT, held=holding)
    assert isinstance(chosen, Plan) and [(v.id, r) for v, r in chosen.victims] == [("low", Rung.CHECKPOINT)]
    # a share that fits beside those 10 GiB: stopped after all
    part = job("part", 10, memory=20 * GIB, compute=50)
    chosen = plan(part, views, [low, part], {}, settings, lambda j: Rung.COOPERATIVE, held=holding)
    assert isinstance(chosen, Plan) and [(v.id, r) for v, r in chosen.victims] == [("low", Rung.STOP)]
    same = job("same", 1)
    refused = plan(same, views, [low, same], {}, settings, lambda j: Rung.CHECKPOINT)
    assert isinstance(refused, NoRoom) and refused.reason == (
        "GPU 0: job low has priority 1 ≥ 1: only lower-priority jobs are preempted"
    )
    # a share that fits beside a stopped share: stop/continue is enough
    small = job("small", 1, S.RUNNING, gpus=("GPU-0",), memory=10 * GIB, compute=80)
    share = job("share", 10, memory=10 * GIB, compute=50)
    chosen = plan(share, views, [small, share], {}, settings, lambda j: Rung.STOP)
    assert isinstance(chosen, Plan) and [(v.id, r) for v, r in chosen.victims] == [("small", Rung.STOP)]


def test_memory_no_listed_process_accounts_for_is_held_by_the_jobs_on_that_gpu() -> None:
    """NVML lists no processes under WSL or across PID namespaces: the used memory it cannot
    attribute counts against every job on that GPU (a stopped job never seems to leave room it
    may not leave); the driver's own few hundred MiB do not."""
    listed = view(used=int(0.3 * GIB))
    assert adm.measure([listed], {"a": frozenset({1})}, {"a": ("GPU-0",)}).held == {}
    unlisted = view(used=30 * GIB)
    measured = adm.measure([unlisted], {"a": frozenset({1}), "b": frozenset({2})}, {"a": ("GPU-0",)})
    assert measured.held == {"a": {"GPU-0": 30 * GIB}}


def _stop(j: Job) -> Rung:
    return Rung.STOP


def test_stop_rung_fits_beside_what_the_stopped_job_holds_measured() -> None:
    """A stopped job frees its compute, not its memory: it is stopped when the urgent job fits
    beside the memory its processes hold (measured), not beside its request."""
    settings = adm.Settings()
    views = [view()]
    low = job("low", 1, S.RUNNING, gpus=("GPU-0",))  # a whole GPU, holding nothing measured
    share = job("share", 10, memory=8 * GIB, compute=50)
    nothing: dict[str, dict[str, int]] = {}
    for measured in (nothing, {"low": {"GPU-0": 70 * GIB}}):
        chosen = plan(share, views, [low, share], {}, settings, _stop, held=measured)
        assert isinstance(chosen, Plan) and [(v.id, r) for v, r in chosen.victims] == [("low", Rung.STOP)]
    # the same share does not fit beside 75 GiB: the missing rung is named
    held = {"low": {"GPU-0": 75 * GIB}}
    refused = plan(share, views, [low, share], {}, settings, _stop, held=held, why_not_saved=lambda j: "why")
    assert isinstance(refused, NoRoom) and refused.reason == (
        "job low holds 75.0 GiB and cannot be checkpointed: why; stopped, it would leave 5.0 GiB"
        " on GPU 0 and this job needs 8.0 GiB"
    )
    # the checkpoint rungs free the memory: they make room where stopping does not
    chosen = plan(share, views, [low, share], {}, settings, lambda j: Rung.COOPERATIVE, held=held)
    assert isinstance(chosen, Plan) and [r for _, r in chosen.victims] == [Rung.COOPERATIVE]


def test_whole_gpu_jobs_are_exclusive_in_compute_and_a_stopped_job_does_not_compute() -> None:
    settings = adm.Settings()
    views = {"GPU-0": view()}
    urgent = job("urgent", 10)  # a whole GPU
    low = job("low", 1, S.RUNNING, gpus=("GPU-0",))
    held = adm.place(urgent, list(views.values()), adm.loads([low], views), {}, settings)
    assert isinstance(held, adm.Hold) and held.reason == "GPU 0 is held by job low" and held.blocked_by_jobs
    chosen = plan(urgent, list(views.values()), [low, urgent], {}, settings, _stop)
    assert isinstance(chosen, Plan) and [(v.id, r) for v, r in chosen.victims] == [("low", Rung.STOP)]
    # stopped and holding nothing: the whole-GPU job starts beside it
    low.state, low.suspended = S.PREEMPTED, "stopped"
    admit = adm.place(urgent, list(views.values()), adm.loads([low], views), {}, settings)
    assert isinstance(admit, adm.Admit)
    # stopped and holding memory: a whole-GPU job needs all of it, a share only its own
    measured = {"low": {"GPU-0": 1 * GIB}}
    held = adm.place(urgent, list(views.values()), adm.loads([low], views, (), measured), {}, settings)
    assert isinstance(held, adm.Hold) and held.reason == (
        "GPU 0: needs 80.0 GiB, 79.0 GiB free (job low holds 1.0 GiB, stopped)"
    )
    share = job("share", 10, memory=8 * GIB, compute=100)
    load = adm.loads([low], views, (), measured)
    assert isinstance(adm.place(share, list(views.values()), load, {}, settings), adm.Admit)
    # the stopped job resumes only once no job of the daemon computes on its GPU
    urgent.state, urgent.gpus = S.RUNNING, ("GPU-0",)
    held = adm.place(low, list(views.values()), adm.loads([low, urgent], views, (), measured), {}, settings)
    assert isinstance(held, adm.Hold) and held.reason == "GPU 0 is held by job urgent"
    urgent.state = S.COMPLETED
    resumed = adm.place(
        low, list(views.values()), adm.loads([low, urgent], views, (), measured), {}, settings
    )
    assert isinstance(resumed, adm.Admit)
    # outside processes never keep a whole-GPU job off a GPU the daemon's jobs leave empty
    busy = {"GPU-0": view(processes=(GpuProcess(999, 10 * GIB),))}
    outside = adm.place(urgent, list(busy.values()), adm.loads([], busy), {"GPU-0": 10 * GIB}, settings)
    assert isinstance(outside, adm.Admit)


def test_measured_memory_is_split_between_jobs_and_outside_processes() -> None:
    gpu = view(processes=(GpuProcess(10, 3 * GIB), GpuProcess(11, 1 * GIB), GpuProcess(99, 2 * GIB)))
    measured = adm.measure([gpu], {"a": frozenset({10, 11, 12}), "b": frozenset({20})})
    assert measured.external == {"GPU-0": 2 * GIB}
    assert measured.held == {"a": {"GPU-0": 4 * GIB}}


def test_whole_gpu_jobs_take_the_first_free_gpus() -> None:
    settings = adm.Settings()
    views = {f"GPU-{i}": view(i) for i in range(3)}
    busy = job("busy", 1, S.RUNNING, gpus=("GPU-0",))
    pair = Job("pair", JobSpec("true", 1, gpus=2), S.QUEUED, 0.0, 0.0)
    admit = adm.place(pair, list(views.values()), adm.loads([busy], views), {}, settings)
    assert isinstance(admit, adm.Admit) and [g.uuid for g in admit.gpus] == ["GPU-1", "GPU-2"]
    three = Job("three", JobSpec("true", 1, gpus=3), S.QUEUED, 0.0, 0.0)
    held = adm.place(three, list(views.values()), adm.loads([busy], views), {}, settings)
    assert isinstance(held, adm.Hold) and "held by job busy" in held.reason


def test_store_lists_by_state(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a = store.add_job(JobSpec("true", 1), 1.0)
    b = store.add_job(JobSpec("true", 2), 2.0)
    store.transition(b, S.QUEUED, "queued", 3.0)
    assert [j.id for j in store.jobs(states=frozenset({S.QUEUED}))] == [b.id]
    assert [j.id for j in store.jobs()] == [a.id, b.id]
    assert [h[2] for h in store.jobs(states=frozenset({S.QUEUED}))[0].history] == ["PENDING", "QUEUED"]


def test_ties_go_to_the_job_waiting_longest_and_aging_never_preempts() -> None:
    later, earlier = job("later", 3, queued_at=50.0), job("earlier", 3, queued_at=20.0)
    assert [j.id for j in adm.queue_order([later, earlier], 60.0, 60.0)] == ["earlier", "later"]
    # aged far past the running job's priority in the queue, it still preempts nobody
    aged = job("aged", 1, queued_at=0.0)
    assert adm.effective_priority(aged, 100_000.0, 60.0) > 5
    running = job("running", 5, S.RUNNING, gpus=("GPU-0",))
    refused = plan(aged, [view()], [running, aged], {}, adm.Settings(), lambda j: Rung.STOP)
    assert isinstance(refused, NoRoom) and "has priority 5 ≥ 1" in refused.reason


def test_victims_are_the_fewest_then_the_lowest_priority_then_the_most_recently_started() -> None:
    settings = adm.Settings()

    def running(job_id: str, priority: int, started_at: float, gpu: str, compute: int) -> Job:
        return replace(
            job(job_id, priority, S.RUNNING, gpus=(gpu,), memory=20 * GIB, compute=compute),
            started_at=started_at,
        )

    # one GPU, 90 % taken by three shares; the urgent share needs 40 %: one victim is enough
    a, b, c = (
        running("a", 1, 10.0, "GPU-0", 30),
        running("b", 2, 20.0, "GPU-0", 30),
        running("c", 1, 30.0, "GPU-0", 30),
    )
    urgent = job("urgent", 9, memory=20 * GIB, compute=40)
    chosen = plan(urgent, [view()], [a, b, c, urgent], {}, settings, lambda j: Rung.STOP)
    assert isinstance(chosen, Plan) and [v.id for v, _ in chosen.victims] == ["c"]
    # two GPUs: two priority-1 jobs on GPU 0, one priority-5 job on GPU 1: one victim beats two
    x, y = running("x", 1, 10.0, "GPU-0", 50), running("y", 1, 20.0, "GPU-0", 50)
    z = running("z", 5, 30.0, "GPU-1", 100)
    whole = job("whole", 9)
    chosen = plan(whole, [view(0), view(1)], [x, y, z, whole], {}, settings, lambda j: Rung.STOP)
    assert isinstance(chosen, Plan) and [v.id for v, _ in chosen.victims] == ["z"]
