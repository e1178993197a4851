"""A fake clock for the runtime's pacing tests: tiles advance it by what they "take", the scheduler
sleeps by advancing it, so every figure is exact and nothing depends on the machine's speed."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from neuronetes import runtime


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fake_scheduler(clock: FakeClock, **kw: Any) -> runtime.Scheduler:
    """A scheduler on the NumPy backend whose tiles and windows are timed by `clock`."""
    kw.setdefault("metrics", False)
    return runtime.Scheduler(
        backend=runtime.NumpyBackend(clock=clock), clock=clock, sleep=clock.advance, **kw
    )


def busy(clock: FakeClock, tile_s: float, tiles: int = 10**9) -> Callable[[], Generator[None, None, None]]:
    """A generator task of `tiles` tiles of `tile_s` seconds each."""

    def task() -> Generator[None, None, None]:
        for _ in range(tiles):
            clock.advance(tile_s)
            yield

    return task
