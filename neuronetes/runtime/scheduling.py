"""The cooperative scheduler: admission by QoS policy, pacing per window by measured tile time,
priorities, slices; one tile runs at a time, chosen between tiles.

Guarantees (docs/runtime.md states them with the admission table):

- A task with bandwidth b runs in-share tiles while its measured time in the current window is
  below b × window minus the debt of earlier windows (a tile that overran its allowance is carried
  as debt), so over many windows a paced task gets b of the time, give or take one tile.
- ``guaranteed`` tasks run only in-share; ``burstable`` ones run in-share and then on leftovers;
  ``best_effort`` ones only on leftovers (under their bandwidth, if they name one). Leftovers are
  what the partition's (the slice's, or the whole scheduler's) bandwidth leaves in the window once
  no in-share task is ready; a leftover tile is asked to end before the window does and before the
  next known wake-up of a task with allowance left.
- Order between ready tasks: class (guaranteed, burstable, best_effort), then the slice's priority,
  then the task's, then the least time used in this window, then submission order.
- When no task can run (all paced, waiting or queued) the loop sleeps until the next window or
  wake-up (`submit` from another thread wakes it), so it burns no core while everything is paced.

Longer than most modules on purpose: admission, pacing, the partitions and the statistics all read
and write the same window and task state under one lock; split, each part would reach into the
others' internals.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from neuronetes.runtime.backends import Backend, select_backend
from neuronetes.runtime.errors import AdmissionError, InvalidArgument, RuntimeErrorBase
from neuronetes.runtime.limits import ContainerLimits, container_limits
from neuronetes.runtime.memory import MemoryManager
from neuronetes.runtime.metrics import export
from neuronetes.runtime.tiles import TaskBody, ThreadBody, TileOutcome, _local, body_for

log = logging.getLogger("neuronetes.runtime")

Policy = Literal["guaranteed", "burstable", "best_effort"]
POLICIES: tuple[Policy, ...] = ("guaranteed", "burstable", "best_effort")
_RANK = {"guaranteed": 0, "burstable": 1, "best_effort": 2}
# Task states as stats() reports them.
QUEUED, RUNNING, PACED, WAITING, FINISHED, FAILED = (
    "queued",
    "running",
    "paced",
    "waiting",
    "finished",
    "failed",
)
_EPS = 1e-9


class MemoryPool(Protocol):
    """What the scheduler uses of ``neuronetes.runtime.memory.MemoryManager``."""

    def free_bytes(self) -> int: ...

    def reserve(self, owner: str, nbytes: int | None, hard: bool) -> None: ...

    def release(self, owner: str) -> None: ...

    def usage(self, owner: str) -> int: ...

    def charged(self, owner: str) -> int: ...

    def evictions(self, owner: str) -> int: ...

    def array(self, owner: str, shape: Any, dtype: Any) -> Any: ...


def _memory_manager(capacity_bytes: int, backend: Backend) -> MemoryPool:
    return MemoryManager(capacity_bytes, backend)


def _check_memory(memory: object, what: str = "memory") -> int:
    if memory is None:
        return 0
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
        raise InvalidArgument(what, f"must be a number of bytes >= 0 or None, got {memory!r}")
    return memory


def _check_bandwidth(bandwidth: object, what: str = "bandwidth") -> float | None:
    if bandwidth is None:
        return None
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, int | float) or not 0 < bandwidth <= 1:
        raise InvalidArgument(what, f"must be a share in (0, 1] or None, got {bandwidth!r}")
    return float(bandwidth)


def _check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidArgument("priority", f"must be an integer, got {priority!r}")
    return priority


@dataclass(eq=False, slots=True)
class Partition:
    """Where tasks take memory and bandwidth from: the scheduler's root, or a slice. `bandwidth` is
    its share of the device; `reserved` the shares its guaranteed and burstable tasks hold."""

    name: str
    memory_bytes: int
    bandwidth: float
    priority: int
    pool: MemoryPool
    reserved: float = 0.0
    used_s: float = 0.0  # measured tile time in the current window
    debt_s: float = 0.0

    def bandwidth_free(self) -> float:
        return max(0.0, self.bandwidth - self.reserved)

    def allowance_s(self, window_s: float) -> float:
        return self.bandwidth * window_s - self.debt_s


@dataclass(eq=False, slots=True)
class Task:
    """A submitted task; `Scheduler.task(task_id)` returns it. `run_micro_kernel()` runs one tile;
    `array(shape, dtype)` allocates a runtime array charged to the task; `result()` is what the
    task returned (or raises what it raised)."""

    id: str
    policy: Policy
    memory: int
    bandwidth: float | None
    priority: int
    partition: Partition
    seq: int
    _sched: Scheduler
    body: TaskBody | None = None
    state: str = QUEUED
    tiles: int = 0
    pacing_delays: int = 0
    share_used_s: float = 0.0  # in-share time in the current window
    used_s: float = 0.0  # all time in the current window
    debt_s: float = 0.0
    last_window_share: float = 0.0
    total_s: float = 0.0
    wake_at: float = 0.0
    delayed_window: int = -1
    evictions_at_end: int = 0
    error: BaseException | None = None
    value: Any = None
    fn: Callable[..., Any] | None = field(default=None, repr=False)
    # Made once at admission so that running a tile allocates nothing: the body's bound
    # `run_tile` and the task's stream context on the scheduler thread (None where the backend's
    # is a no-op).
    tile_call: Callable[[], TileOutcome] | None = field(default=None, repr=False)
    stream: contextlib.AbstractContextManager[Any] | None = field(default=None, repr=False)
    share: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        # The bandwidth the task runs in-share on (best_effort: none); read for every tile, so
        # computed once (bandwidth and policy never change).
        self.share = self.bandwidth if self.bandwidth is not None and self.policy != "best_effort" else 0.0

    def allowance_s(self, window_s: float) -> float:
        return self.share * window_s - self.debt_s

    def run_micro_kernel(self) -> bool:
        """Run one tile now, whatever the pacing (its time is still charged to the window), for
        callers who drive the loop themselves. Returns whether the task has more tiles.

        Raises:
            RuntimeErrorBase: the task is still queued (not admitted).
        """
        return self._sched._run_now(self)

    def array(self, shape: Any, dtype: Any) -> Any:
        """A runtime array of the task's partition's pool, charged to the task."""
        return self.partition.pool.array(self.id, shape, dtype)

    def stats(self) -> dict[str, Any]:
        return self._sched.stats(self.id)

    def result(self) -> Any:
        """The task's return value once finished; re-raises its exception if it failed."""
        if self.error is not None:
            raise self.error
        if self.state != FINISHED:
            raise RuntimeErrorBase(f"{self.id} has not finished (state {self.state})")
        return self.value


_names = itertools.count(1)


class Scheduler:
    """Runs tasks' tiles on one thread by QoS policy, priority and per-window pacing.

    `window_ms`: the pacing window; `tick_ms`: the longest one `step` runs tiles for, and how often
    the loop looks for work when nothing is scheduled; `backend`: "auto", "numpy", "cupy", "torch"
    or a `Backend`. Keyword-only extras: `clock`/`sleep` (tests give a fake clock), `registry`
    (a prometheus_client CollectorRegistry; None: the default registry), `metrics=False` to export
    none, `name` (the ``scheduler`` label), `environ` (where container limits are read from; None:
    ``os.environ``).
    """

    def __init__(
        self,
        window_ms: float = 10,
        tick_ms: float = 1,
        backend: str | Backend = "auto",
        *,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
        registry: Any = None,
        metrics: bool = True,
        name: str | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        for arg, value in (("window_ms", window_ms), ("tick_ms", tick_ms)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise InvalidArgument(arg, f"must be a number of milliseconds > 0, got {value!r}")
        self.window_s = float(window_ms) / 1000
        self.tick_s = float(tick_ms) / 1000
        self.backend = select_backend(backend)
        self._tile_clock: Callable[[], float] | None = getattr(self.backend, "tile_clock", None)
        self.limits: ContainerLimits = container_limits(environ)
        self.name = name or f"scheduler-{next(_names)}"
        self._clock = clock or time.perf_counter
        self._sleep = sleep
        self._wake = threading.Event()
        self._lock = threading.RLock()
        capacity = self.backend.memory_capacity()
        if self.limits.memory_bytes is not None:
            capacity = min(capacity, self.limits.memory_bytes)
        bandwidth = self.limits.bandwidth if self.limits.bandwidth is not None else 1.0
        self.root = Partition("", capacity, bandwidth, 0, _memory_manager(capacity, self.backend))
        self.slices: dict[str, Partition] = {}
        self._tasks: dict[str, Task] = {}
        self._queue: list[Task] = []
        self._live: list[Task] = []  # admitted, not finished
        # The last in-share pick and what `_pick` compares against (see `_pick`).
        self._streak: Task | None = None
        self._streak_wake = math.inf
        self._streak_rival_fraction = math.inf
        self._streak_rival_seq = 0
        self._seq = itertools.count(1)
        self._window_start = self._clock()
        self._window_index = 0
        self.tiles_total = 0
        self.pacing_delays_total = 0
        if metrics:
            export(self, registry)

    # ---- slices --------------------------------------------------------------------------------

    def create_slice(
        self, name: str, memory: int | None = None, bandwidth: float | None = None, priority: int = 0
    ) -> str:
        """A logical partition: `memory` bytes reserved (hard) from the scheduler's pool as its own
        pool, `bandwidth` reserved from the scheduler's share (its tasks' shares and leftovers stay
        within it), `priority` ordering its tasks before those of lower-priority slices in the same
        class, and its own streams. None: the slice shares the scheduler's memory / bandwidth.

        Raises:
            InvalidArgument: a bad or taken name, negative memory, bandwidth outside (0, 1].
            AdmissionError: the memory or bandwidth is not free.
        """
        if not isinstance(name, str) or not name or name in self.slices:
            raise InvalidArgument("name", f"a slice needs a new non-empty name, got {name!r}")
        nbytes = _check_memory(memory) if memory is not None else None
        share = _check_bandwidth(bandwidth)
        prio = _check_priority(priority)
        with self._lock:
            root = self.root
            if share is not None and share > root.bandwidth_free() + _EPS:
                raise AdmissionError("bandwidth", share, root.bandwidth_free(), what=f"slice {name}")
            pool, capacity = root.pool, root.memory_bytes
            if nbytes is not None:
                free = root.pool.free_bytes()
                if nbytes > free:
                    raise AdmissionError("memory", nbytes, free, what=f"slice {name}")
                root.pool.reserve(f"slice:{name}", nbytes, True)
                pool, capacity = _memory_manager(nbytes, self.backend), nbytes
            if share is not None:
                root.reserved += share
            self.slices[name] = Partition(
                name, capacity, share if share is not None else root.bandwidth, prio, pool
            )
        return name

    # ---- submission and admission --------------------------------------------------------------

    def submit(
        self,
        fn: Callable[..., Any],
        memory: int | None = None,
        bandwidth: float | None = None,
        policy: str = "best_effort",
        priority: int = 0,
        slice: str | None = None,
    ) -> str:
        """Submit a task; returns its id. See the admission table in docs/runtime.md.

        Raises:
            InvalidArgument: a bad argument (named): fn not callable, negative memory, bandwidth
                outside (0, 1], unknown policy, a guaranteed task without bandwidth, unknown slice.
            AdmissionError: a guaranteed task whose memory or bandwidth is not free, or any task
                asking for more than its partition has at all.
        """
        if not callable(fn):
            raise InvalidArgument("fn", f"must be callable, got {type(fn).__name__}")
        nbytes = _check_memory(memory)
        share = _check_bandwidth(bandwidth)
        if policy not in POLICIES:
            raise InvalidArgument("policy", f"must be one of {', '.join(POLICIES)}, got {policy!r}")
        prio = _check_priority(priority)
        if policy == "guaranteed" and share is None:
            raise InvalidArgument("bandwidth", "a guaranteed task needs a bandwidth share")
        with self._lock:
            if slice is None:
                part = self.root
            elif slice in self.slices:
                part = self.slices[slice]
            else:
                raise InvalidArgument("slice", f"no slice named {slice!r} (create_slice first)")
            seq = next(self._seq)
            task = Task(f"task-{seq}", policy, nbytes, share, prio, part, seq, self, fn=fn)
            if nbytes > part.memory_bytes:
                raise AdmissionError(
                    "memory", nbytes, part.memory_bytes, what=f"{policy} task (more than its pool holds)"
                )
            if task.share > part.bandwidth + _EPS:
                raise AdmissionError(
                    "bandwidth",
                    task.share,
                    part.bandwidth,
                    what=f"{policy} task (more than its partition has)",
                )
            if not self._admit(task, reject=policy == "guaranteed"):
                self._queue.append(task)
                self._queue.sort(key=self._queue_key)
            self._tasks[task.id] = task
        self._wake.set()
        return task.id

    @staticmethod
    def _queue_key(task: Task) -> tuple[int, int, int, int]:
        return (_RANK[task.policy], -task.partition.priority, -task.priority, task.seq)

    def _admit(self, task: Task, reject: bool) -> bool:
        """Admit `task` if its memory and bandwidth fit (reserving them); else raise (`reject`) or
        return False to leave it queued."""
        part = task.partition
        if task.share > part.bandwidth_free() + _EPS:
            if reject:
                raise AdmissionError(
                    "bandwidth", task.share, part.bandwidth_free(), what=f"{task.policy} task"
                )
            return False
        hard = task.policy != "best_effort"
        if not task.memory:
            # Nothing asked for: a soft reservation without a cap (its arrays may be evicted).
            part.pool.reserve(task.id, None, False)
        else:
            free = part.pool.free_bytes()
            if task.memory > free:
                if reject:
                    raise AdmissionError("memory", task.memory, free, what=f"{task.policy} task")
                return False
            try:
                part.pool.reserve(task.id, task.memory, hard)
            except AdmissionError:
                if reject:
                    raise
                return False
        part.reserved += task.share
        fn = task.fn
        assert fn is not None
        body = task.body = body_for(fn, lambda: self._stream(task))
        if isinstance(body, ThreadBody):
            body.task = task
        task.tile_call = body.run_tile
        stream = self._stream(task)
        task.stream = None if isinstance(stream, contextlib.nullcontext) else stream
        task.state = RUNNING
        task.wake_at = self._clock()
        self._live.append(task)
        self._streak = None  # a new candidate
        return True

    def _admit_queued(self) -> None:
        for task in list(self._queue):
            if self._admit(task, reject=False):
                self._queue.remove(task)

    # ---- pacing --------------------------------------------------------------------------------

    def _roll_window(self, now: float) -> None:
        passed = int((now - self._window_start + _EPS) // self.window_s)
        if passed <= 0:
            return
        w = self.window_s
        for task in self._live:
            # Debt left after this window's allowance, then paid by each further (idle) window.
            task.debt_s = max(0.0, task.share_used_s - task.allowance_s(w) - (passed - 1) * task.share * w)
            if task.share == 0:
                task.debt_s = 0.0
            task.last_window_share = task.used_s / w if passed == 1 else 0.0
            task.share_used_s = task.used_s = 0.0
        for part in (self.root, *self.slices.values()):
            part.debt_s = max(0.0, part.used_s - part.allowance_s(w) - (passed - 1) * part.bandwidth * w)
            part.used_s = 0.0
        self._window_start += passed * w
        self._window_index += passed
        self._streak = None  # fresh allowances reorder everyone

    def _in_share(self, task: Task) -> bool:
        return task.share > 0 and task.share_used_s < task.allowance_s(self.window_s) - _EPS

    def _leftover_room(self, task: Task) -> float:
        """Seconds of leftover time `task` may take in this window (0: none; inf: no limit). Only
        partitions with less than the whole device (a slice, a container's share) limit it."""
        if task.policy == "guaranteed":
            return 0.0
        w = self.window_s
        room = math.inf
        for part in {task.partition, self.root}:
            if part.bandwidth < 1.0:
                room = min(room, part.allowance_s(w) - part.used_s)
        if task.policy == "best_effort" and task.bandwidth is not None:
            room = min(room, task.bandwidth * w - task.used_s)
        return max(0.0, room)

    def _pick(self, now: float) -> tuple[Task, float | None] | None:
        """Roll the window, admit what fits, and return what `_choose(now)` would return.

        Without a new pass while the last pick was in-share and nothing that could change it has
        happened: since that pick, within the same window, only that task has been charged
        (`_account` forgets the pick when another is), no task has been admitted or finished, and
        no other task has woken (`_streak_wake`), so the other candidates and their order keys are
        what they were. The task is then picked again while it is awake and in-share and its key
        still sorts before the runner-up's (`_streak_rival_*`: its share-used fraction and
        sequence; inf when the runner-up is behind on class or priority, or there is none). The
        same expressions as `_choose`'s, so the floating-point results are the same too. Inline,
        because this runs between every two tiles and its time is time the tasks do not get."""
        w = self.window_s
        if now - self._window_start + _EPS >= w:  # else no whole window has passed: nothing to roll
            self._roll_window(now)
        if self._queue:
            self._admit_queued()
        task = self._streak
        if task is not None:
            awake_at = now + _EPS
            if task.wake_at <= awake_at and self._streak_wake > awake_at:
                share_w = task.share * w
                used = task.share_used_s
                if used < share_w - task.debt_s - _EPS:
                    fraction = used / share_w
                    rival = self._streak_rival_fraction
                    if fraction < rival or (fraction == rival and task.seq < self._streak_rival_seq):
                        return task, share_w - task.debt_s - used
        return self._choose(now)

    def _choose(self, now: float) -> tuple[Task, float | None] | None:
        """The task to run next and the longest its tile should take (None: any length). An
        in-share pick is remembered for `_pick`, with the runner-up and the next wake-up."""
        w = self.window_s
        # One pass, no intermediate lists: its cost is time the tasks do not get.
        best: Task | None = None
        best_key: tuple[float, ...] = ()
        rival_key: tuple[float, ...] | None = None
        awake_at = now + _EPS
        next_wake = math.inf
        for t in self._live:
            if t.wake_at > awake_at:
                next_wake = min(next_wake, t.wake_at)
                continue
            share = t.share
            if share <= 0 or t.share_used_s >= share * w - t.debt_s - _EPS:
                continue
            key = (_RANK[t.policy], -t.partition.priority, -t.priority, t.share_used_s / (share * w), t.seq)
            if best is None or key < best_key:
                rival_key = best_key if best is not None else None
                best, best_key = t, key
            elif rival_key is None or key < rival_key:
                rival_key = key
        if best is not None:
            self._streak, self._streak_wake = best, next_wake
            if rival_key is None or rival_key[:3] != best_key[:3]:
                self._streak_rival_fraction, self._streak_rival_seq = math.inf, 0
            else:
                self._streak_rival_fraction, self._streak_rival_seq = rival_key[3], int(rival_key[4])
            return best, best.allowance_s(w) - best.share_used_s
        self._streak = None
        awake = [t for t in self._live if t.wake_at <= awake_at]
        window_end = self._window_start + w
        leftover = [t for t in awake if self._leftover_room(t) > _EPS]
        self._count_delays([t for t in awake if t not in leftover])
        if not leftover:
            return None
        task = min(
            leftover, key=lambda t: (_RANK[t.policy], -t.partition.priority, -t.priority, t.used_s, t.seq)
        )
        # End before a task with a share gets fresh allowance (the window's end) and before a task
        # with allowance left wakes up; with no such task a leftover tile is only the target long.
        limits = [self._leftover_room(task)]
        if any(t.share > 0 for t in self._live):
            limits.append(window_end - now)
        limits += [t.wake_at - now for t in self._live if t.wake_at > now and self._in_share(t)]
        budget = min(limits)
        return task, None if budget == math.inf else max(budget, 0.0)

    def _count_delays(self, held: list[Task]) -> None:
        for task in held:
            if task.delayed_window != self._window_index:
                task.delayed_window = self._window_index
                task.pacing_delays += 1
                self.pacing_delays_total += 1

    # ---- running tiles -------------------------------------------------------------------------

    def _stream(self, task: Task) -> contextlib.AbstractContextManager[Any]:
        return self.backend.stream(task.policy == "guaranteed", task.partition.name)

    def _run_tile(self, task: Task, budget_s: float | None) -> tuple[TileOutcome | BaseException, float]:
        """Run one tile of `task`, outside the lock, timed by the backend: its outcome (or what it
        raised) and its measured seconds. Allocates nothing of its own (see `Task.tile_call`). A
        task without a stream on a backend with a host `tile_clock` (NumPy) is timed here, one call
        fewer between tiles, which is time no task gets."""
        tile_call, stream, body = task.tile_call, task.stream, task.body
        assert tile_call is not None and body is not None
        body.budget_s = budget_s
        _current.task = task
        try:
            if stream is None:  # the CPU's streams are no-ops: not entered at all
                host_clock = self._tile_clock
                if host_clock is None:
                    return self.backend.time_tile(tile_call)
                start = host_clock()
                outcome = tile_call()
                return outcome, host_clock() - start
            with stream:
                return self.backend.time_tile(tile_call)
        except BaseException as exc:
            return exc, 0.0
        finally:
            _current.task = None

    def _account(self, task: Task, outcome: TileOutcome | BaseException, seconds: float, now: float) -> None:
        """Under the lock, after a tile that ended at `now`: charge its time to the task (in-share
        while it had allowance left when the tile started), its partition and the root, and
        settle the task (finished, failed, waiting or ready again). Re-raises what is not an
        ``Exception``."""
        if task is not self._streak:
            self._streak = None  # another task's charge changes the order `_pick` relies on
        if isinstance(outcome, BaseException):
            task.error = outcome
            self._finish(task, FAILED)
            log.warning("%s failed: %r", task.id, outcome)
            if not isinstance(outcome, Exception):
                raise outcome
            return
        body = task.body
        assert body is not None
        body.observe(seconds)
        share = task.share
        if share > 0 and task.share_used_s < share * self.window_s - task.debt_s - _EPS:
            task.share_used_s += seconds
        task.tiles += 1
        self.tiles_total += 1
        task.used_s += seconds
        task.total_s += seconds
        part = task.partition
        part.used_s += seconds
        if part is not self.root:
            self.root.used_s += seconds
        if outcome.finished:
            task.value = outcome.result
            self._finish(task, FINISHED)
        elif outcome.wait_s > 0:
            task.wake_at = now + outcome.wait_s

    def _finish(self, task: Task, state: str) -> None:
        task.state = state
        self._streak = None
        if task in self._live:
            self._live.remove(task)
            part = task.partition
            task.evictions_at_end = part.pool.evictions(task.id)
            part.pool.release(task.id)
            part.reserved = max(0.0, part.reserved - task.share)
        if task.body is not None:
            task.body.close()
        task.fn = None

    def _run_now(self, task: Task) -> bool:
        with self._lock:
            if task.state == QUEUED:
                self._admit_queued()
                if task.state == QUEUED:
                    raise RuntimeErrorBase(f"{task.id} is queued (its memory or bandwidth is not free yet)")
            if task.state in (FINISHED, FAILED):
                return False
            self._roll_window(self._clock())
        outcome, seconds = self._run_tile(task, None)
        with self._lock:
            self._account(task, outcome, seconds, self._clock())
        return task.state not in (FINISHED, FAILED)

    def step(self) -> int:
        """One scheduling round: admit what fits from the queue, roll the pacing window, then run
        the chosen tiles one by one — each chosen as `_choose` would choose it — for up to a tick.
        Returns the number of tiles run (0: nothing could run now)."""
        return self._run_tiles(self.tick_s, None)

    def _run_tiles(self, max_s: float, stop: Callable[[], bool] | None) -> int:
        """Run chosen tiles back to back for up to `max_s`, or until nothing can run now or `stop()`
        (asked outside the lock after each tile; None: never). One lock acquisition a tile without
        `stop`: the last tile's accounting and the next choice share it. `run` calls this once for
        a stretch of work rather than `step` once a tick, because what is done between two tiles
        is time no task gets (bench/README.md, "Runtime library")."""
        clock, lock = self._clock, self._lock
        start = clock()
        with lock:
            chosen = self._pick(start)
        ran = 0
        while chosen is not None:
            task, budget = chosen
            outcome, seconds = self._run_tile(task, budget)
            now = clock()
            ran += 1
            with lock:
                self._account(task, outcome, seconds, now)
                if now - start >= max_s:
                    return ran
                if stop is None:
                    chosen = self._pick(now)
                    continue
            if stop():
                return ran
            with lock:
                chosen = self._pick(clock())
        return ran

    def _next_event(self, now: float) -> float:
        times = [self._window_start + self.window_s]
        times += [t.wake_at for t in self._live if t.wake_at > now]
        return min(times)

    def _idle(self, seconds: float) -> None:
        seconds = max(seconds, 1e-6)  # never a zero-length wait that would spin
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            self._wake.wait(seconds)
            self._wake.clear()

    def run(self, until: float | str | Callable[[], bool] | None = None) -> None:
        """Step until every task has finished, or until `until`: a number of seconds from now, a
        task id (until that task has finished) or a predicate. Between steps that ran nothing it
        sleeps until the next window or wake-up. Returns early, leaving them queued, when only
        queued tasks are left and nothing running could free room for them."""
        stop = self._until(until)
        # A deadline is checked under the lock with the tile's accounting; anything else is asked.
        timed = math.isfinite(self._deadline_left(until))
        while not stop():
            if (
                self._run_tiles(self._deadline_left(until), None)
                if timed
                else self._run_tiles(math.inf, stop)
            ):
                continue
            with self._lock:
                if not self._live:
                    if self._queue:
                        log.warning(
                            "%d task(s) queued that nothing running can make room for", len(self._queue)
                        )
                    return
                now = self._clock()
                pause = self._next_event(now) - now
            self._idle(min(pause, self._deadline_left(until)))

    def _deadline_left(self, until: object) -> float:
        if isinstance(until, int | float) and not isinstance(until, bool):
            return max(0.0, self._run_deadline - self._clock())
        return math.inf

    def _until(self, until: float | str | Callable[[], bool] | None) -> Callable[[], bool]:
        if until is None:
            return lambda: False
        if isinstance(until, str):
            task = self.task(until)
            return lambda: task.state in (FINISHED, FAILED)
        if isinstance(until, bool) or not (callable(until) or isinstance(until, int | float)):
            raise InvalidArgument("until", f"expected seconds, a task id or a predicate, got {until!r}")
        if callable(until):
            return until
        if until < 0:
            raise InvalidArgument("until", f"seconds must be >= 0, got {until!r}")
        self._run_deadline = self._clock() + float(until)
        return lambda: self._clock() >= self._run_deadline

    _run_deadline = math.inf

    # ---- telemetry -----------------------------------------------------------------------------

    def task(self, task_id: str) -> Task:
        """The task `task_id` names.

        Raises:
            InvalidArgument: no such task.
        """
        try:
            return self._tasks[task_id]
        except (KeyError, TypeError):
            raise InvalidArgument("task_id", f"no task {task_id!r}") from None

    def tasks(self) -> list[Task]:
        with self._lock:
            return list(self._tasks.values())

    def stats(self, task_id: str) -> dict[str, Any]:
        """The task's figures: `memory_usage` (bytes its pool charges it now), `bandwidth_usage`
        (its share of the last full window), `pacing_delay_count` (windows in which it was ready
        but held for lack of allowance), `tiles_executed`, `eviction_count`, `queue_position`
        (0-based among queued tasks; None once admitted) and `state` (queued, running, paced,
        waiting, finished, failed)."""
        task = self.task(task_id)
        with self._lock:
            live = task in self._live
            pool = task.partition.pool
            return {
                "memory_usage": pool.charged(task.id) if live else 0,
                "bandwidth_usage": task.last_window_share,
                "pacing_delay_count": task.pacing_delays,
                "tiles_executed": task.tiles,
                "eviction_count": pool.evictions(task.id) if live else task.evictions_at_end,
                "queue_position": self._queue.index(task) if task in self._queue else None,
                "state": self._state(task),
            }

    def _state(self, task: Task) -> str:
        if task.state != RUNNING:
            return task.state
        now = self._clock()
        if task.wake_at > now + _EPS:
            return WAITING
        if (
            task.delayed_window == self._window_index
            and not self._in_share(task)
            and self._leftover_room(task) <= _EPS
        ):
            return PACED
        return RUNNING

    def live_tasks(self) -> Iterator[Task]:
        with self._lock:
            yield from list(self._live)


class _Current(threading.local):
    task: Task | None = None


_current = _Current()


def current_task() -> Task | None:
    """The task whose tile is running on this thread (None outside a tile)."""
    body = getattr(_local, "body", None)
    if isinstance(body, ThreadBody):
        return getattr(body, "task", None)
    return _current.task
