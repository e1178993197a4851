"""Task bodies: how a submitted callable is cut into tiles (micro-kernels) with a yield point
between them.

- `tiled(fn, n, tile=…)` (or ``@tiled(n=…)``) splits ``range(n)`` into tiles and calls
  ``fn(start, stop)`` for each; the tile size adapts so a tile takes about `target_ms` (1 ms by
  default), and the scheduler may ask for a shorter one where a longer one would run into time
  that belongs to someone else (the end of a window, a guaranteed task's wake-up).
- A generator function: each ``yield`` ends a tile. ``yield`` with a number of seconds says the task
  needs no device until then (it is "waiting"; the scheduler does not call it early). Its
  ``return`` value is the task's result.
- Any other callable runs on a worker thread of its own, strictly handed over: it runs only while
  the scheduler thread waits for it, so exactly one tile runs at a time. `yield_task()` inside it
  ends a tile (``yield_task(seconds)``: waits like a generator's ``yield seconds``). A callable that
  never calls it is one tile. Outside a scheduled task `yield_task` returns at once, so the same
  loop also runs on its own.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, overload

from neuronetes.runtime.errors import InvalidArgument

DEFAULT_TARGET_MS = 1.0


@dataclass(frozen=True, slots=True)
class TileOutcome:
    """What one tile left: whether the task is done (`result` is its value), and for how many
    seconds it needs nothing (0: ready again at once)."""

    finished: bool = False
    wait_s: float = 0.0
    result: Any = None


_MORE = TileOutcome()
_FINISHED = TileOutcome(finished=True)
"""The outcomes of a tile with more to come and of the last tile (of a task with no result):
shared (they are frozen), one object fewer a tile."""


class TaskBody(Protocol):
    """One task's tiles. `run_tile` runs the next tile (the scheduler times it); `budget_s`, set by
    the scheduler before each tile (an attribute, not an argument, so that the scheduler can hand
    the backend the bound method made once, with no closure a tile), is the longest the scheduler
    wants it to take (None: no limit), which only adaptive tiles honour; `observe` hands back the
    measured time; `close` abandons the task."""

    budget_s: float | None

    def run_tile(self) -> TileOutcome: ...

    def observe(self, seconds: float) -> None: ...

    def close(self) -> None: ...


_local = threading.local()


def _wait_seconds(value: object, what: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidArgument(what, f"a tile may yield None or a number of seconds >= 0, got {value!r}")
    return float(value)


class TiledWorkload:
    """``range(n)`` cut into tiles of ``fn(start, stop)``: what `tiled` returns. Submitting it gives
    the scheduler adaptive tiles; calling it runs every tile in this thread, with `yield_task`
    between them (so inside a thread task it still yields)."""

    def __init__(
        self, fn: Callable[[int, int], object], n: int, tile: int | None, target_ms: float, adaptive: bool
    ):
        if not callable(fn):
            raise InvalidArgument("fn", f"must be callable, got {type(fn).__name__}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgument("n", f"must be an integer >= 0, got {n!r}")
        if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
            raise InvalidArgument("tile", f"must be an integer >= 1 or None, got {tile!r}")
        if isinstance(target_ms, bool) or not isinstance(target_ms, int | float) or not target_ms > 0:
            raise InvalidArgument("target_ms", f"must be a number > 0, got {target_ms!r}")
        self.fn = fn
        self.n = n
        self.tile = tile
        self.target_s = float(target_ms) / 1000
        self.adaptive = adaptive
        functools.update_wrapper(self, fn)

    def cursor(self) -> TiledCursor:
        return TiledCursor(self)

    def __call__(self) -> None:
        cursor = self.cursor()
        while not cursor.done:
            cursor.run_tile()
            yield_task()


class TiledCursor:
    """One run over a `TiledWorkload`'s range. Tile sizing: the first tile is `tile` items (1 when
    not given); each measured tile updates the time per item (a moving average), and the next tile
    is the number of items that fills the target (or the scheduler's budget, if shorter), at least
    1 and at most twice the last tile, so a mis-measured tile cannot make the next one huge."""

    def __init__(self, workload: TiledWorkload) -> None:
        self.workload = workload
        self.next_index = 0
        self.size = workload.tile or 1
        self.per_item_s: float | None = None
        self._last = 0
        self.budget_s: float | None = None

    @property
    def done(self) -> bool:
        return self.next_index >= self.workload.n

    def run_tile(self) -> TileOutcome:
        start, w = self.next_index, self.workload
        n = w.n
        if start >= n:
            return _FINISHED
        size, per_item = self.size, self.per_item_s
        if w.adaptive and per_item is not None and per_item > 0:
            # The target's size (growing at most twofold) is remembered; the budget only cuts this tile.
            size = self.size = max(1, min(int(w.target_s / per_item * (1 + 1e-9)), 2 * size))
            budget_s = self.budget_s
            if budget_s is not None:
                size = max(1, min(size, int(budget_s / per_item * (1 + 1e-9))))
        stop = min(start + size, n)
        w.fn(start, stop)
        self.next_index = stop
        self._last = stop - start
        return _MORE if stop < n else _FINISHED

    def observe(self, seconds: float) -> None:
        if self._last <= 0 or seconds <= 0:
            return
        per_item = seconds / self._last
        self.per_item_s = per_item if self.per_item_s is None else 0.5 * self.per_item_s + 0.5 * per_item

    def close(self) -> None:
        self.next_index = self.workload.n


class GeneratorBody:
    """A generator function's tiles: one ``next()`` each."""

    def __init__(self, fn: Callable[[], Generator[Any, None, Any]]) -> None:
        self._fn = fn
        self._gen: Generator[Any, None, Any] | None = None
        self.budget_s: float | None = None

    def run_tile(self) -> TileOutcome:
        if self._gen is None:
            self._gen = self._fn()
        try:
            value = next(self._gen)
        except StopIteration as stop:
            return TileOutcome(finished=True, result=stop.value)
        return TileOutcome(wait_s=_wait_seconds(value, "yield"))

    def observe(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        if self._gen is not None:
            self._gen.close()


class ThreadBody:
    """A plain callable on a worker thread, handed over tile by tile: the scheduler releases `_go`
    and waits on `_done`; the worker runs until `yield_task` (or its end) and hands back."""

    def __init__(self, fn: Callable[[], Any], enter: Callable[[], Any]) -> None:
        self._fn = fn
        self._enter = enter  # the task's stream context, entered on the worker for its whole life
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._outcome = TileOutcome()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.task: Any = None  # the scheduler's Task, for current_task() on the worker
        self.budget_s: float | None = None

    def _work(self) -> None:
        _local.body = self
        self._go.acquire()
        if self._closed:
            return
        try:
            with self._enter():
                result = self._fn()
            self._outcome = TileOutcome(finished=True, result=result)
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.release()

    def yield_point(self, wait_s: float) -> None:
        """Called on the worker by `yield_task`: end this tile and wait for the next."""
        self._outcome = TileOutcome(wait_s=wait_s)
        self._done.release()
        self._go.acquire()
        if self._closed:
            raise SystemExit  # unwinds the abandoned worker quietly

    def run_tile(self) -> TileOutcome:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="neuronetes-runtime-task", daemon=True)
            self._thread.start()
        self._go.release()
        self._done.acquire()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._outcome

    def observe(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive() and not self._closed:
            self._closed = True
            self._go.release()
        self._closed = True


def yield_task(seconds: float = 0.0) -> None:
    """End the current tile of a hand-written loop running as a scheduled task (a plain callable
    given to `submit`); with `seconds`, the task needs nothing for that long. Anywhere else —
    outside a task, in a generator task (which yields itself) — it returns at once."""
    wait_s = _wait_seconds(seconds, "seconds")
    body = getattr(_local, "body", None)
    if isinstance(body, ThreadBody):
        body.yield_point(wait_s)


@overload
def tiled(
    fn: Callable[[int, int], object],
    n: int,
    *,
    tile: int | None = None,
    target_ms: float = ...,
    adaptive: bool = ...,
) -> TiledWorkload: ...


@overload
def tiled(
    fn: None = None,
    n: int | None = None,
    *,
    tile: int | None = None,
    target_ms: float = ...,
    adaptive: bool = ...,
) -> Callable[[Callable[[int, int], object]], TiledWorkload]: ...


def tiled(
    fn: Callable[[int, int], object] | None = None,
    n: int | None = None,
    *,
    tile: int | None = None,
    target_ms: float = DEFAULT_TARGET_MS,
    adaptive: bool = True,
) -> TiledWorkload | Callable[[Callable[[int, int], object]], TiledWorkload]:
    """Split ``range(n)`` into tiles of ``fn(start, stop)``: ``runtime.tiled(fn, n, tile=64)`` or, as
    a decorator, ``@runtime.tiled(n=1_000_000)``. `tile` is the first tile's size (1 if None); with
    `adaptive` (the default) later tiles are sized to take about `target_ms`, else all are `tile`."""
    if fn is None:
        if n is None:
            raise InvalidArgument("n", "tiled needs the size of the range it splits")
        size = n

        def decorate(inner: Callable[[int, int], object]) -> TiledWorkload:
            return TiledWorkload(inner, size, tile, target_ms, adaptive)

        return decorate
    if n is None:
        raise InvalidArgument("n", "tiled needs the size of the range it splits")
    return TiledWorkload(fn, n, tile, target_ms, adaptive)


def body_for(fn: Callable[..., Any], enter: Callable[[], Any]) -> TaskBody:
    """The body that runs `fn`: adaptive tiles, a generator, or a worker thread (see the module)."""
    if isinstance(fn, TiledWorkload):
        return fn.cursor()
    if inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(getattr(fn, "__call__", None)):  # noqa: B004
        return GeneratorBody(fn)
    return ThreadBody(fn, enter)
