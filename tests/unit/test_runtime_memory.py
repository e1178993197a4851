"""The runtime's memory manager on the NumPy backend: hard reservations as pools admitted or refused
with the shortfall named, soft blocks evicted least-recently-used first and reloaded on access, the
counts, results bit-identical to an unevicted run, and bad input named."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

from neuronetes.runtime.errors import AdmissionError
from neuronetes.runtime.memory import MemoryManager, RuntimeArray

pytestmark = pytest.mark.unit

T = TypeVar("T")
KIB = 1024


class CpuBackend:
    """The smallest backend the manager runs on: NumPy arrays, the host clock, no streams."""

    name = "numpy"
    xp = np

    def time_tile(self, fn: Callable[[], T]) -> tuple[T, float]:
        started = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - started

    def memory_capacity(self) -> int:
        return 1 << 30

    @contextlib.contextmanager
    def stream(self, high_priority: bool) -> Iterator[None]:
        yield


def manager(capacity: int) -> MemoryManager:
    return MemoryManager(capacity, CpuBackend())


def block(mm: MemoryManager, owner: str, kib: int = 1) -> RuntimeArray:
    """An array of `kib` KiB (float64)."""
    return mm.array(owner, kib * KIB // 8, np.float64)


# ---- hard reservations


def test_a_hard_reservation_that_fits_is_carved_and_one_over_free_is_refused_naming_the_shortfall() -> None:
    mm = manager(1024 * KIB)
    mm.reserve("guaranteed-a", 600 * KIB, hard=True)
    assert mm.free_bytes() == 424 * KIB
    with pytest.raises(
        AdmissionError,
        match=(
            r"hard memory reservation for 'guaranteed-b' not admitted: memory 614400 bytes requested, "
            r"434176 free: short by 180224 bytes \(424Ki free of 1Mi\)"
        ),
    ):
        mm.reserve("guaranteed-b", 600 * KIB, hard=True)
    assert "guaranteed-b" not in mm.owners()
    mm.reserve("guaranteed-b", 424 * KIB, hard=True)  # exactly what is left
    assert mm.free_bytes() == 0
    mm.release("guaranteed-a")
    assert mm.free_bytes() == 600 * KIB


def test_a_soft_reservation_is_always_accepted_even_over_the_capacity() -> None:
    mm = manager(64 * KIB)
    mm.reserve("hard", 64 * KIB, hard=True)
    mm.reserve("soft", 10 * 1024 * KIB, hard=False)
    mm.reserve("leftovers", None, hard=False)
    assert mm.owners() == ["hard", "soft", "leftovers"]
    assert mm.reserved("soft") == 10 * 1024 * KIB and mm.reserved("leftovers") is None
    with pytest.raises(MemoryError, match="exceeds the memory hard reservations leave"):
        block(mm, "soft")  # no soft area left: the soft owner's arrays have nowhere to live


def test_a_hard_pool_holds_its_arrays_exactly_and_refuses_one_more() -> None:
    mm = manager(1024 * KIB)
    mm.reserve("g", 4 * KIB, hard=True)
    arrays = [block(mm, "g") for _ in range(4)]
    assert mm.usage("g") == 4 * KIB
    with pytest.raises(MemoryError, match=r"hard reservation of 'g' has no room for 1Ki: 0 B of 4Ki free"):
        block(mm, "g")
    arrays[1].free()
    again = block(mm, "g")  # the freed block's room is reused
    assert again.resident and mm.usage("g") == 4 * KIB
    assert not again.get().any()  # new arrays are zero-filled, also where an array was before


def test_a_hard_reservation_evicts_soft_blocks_to_take_its_share_and_never_loses_its_own() -> None:
    mm = manager(8 * KIB)
    mm.reserve("best-effort", None, hard=False)
    soft = [block(mm, "best-effort") for _ in range(8)]
    for i, a in enumerate(soft):
        a.put(float(i))
    mm.reserve("guaranteed", 3 * KIB, hard=True)
    assert [a.resident for a in soft] == [False] * 3 + [True] * 5  # the three least recently made
    assert mm.evictions("best-effort") == 3 and mm.usage("best-effort") == 5 * KIB
    hard = [block(mm, "guaranteed") for _ in range(3)]
    for a in soft:  # the soft owner cycles through its arrays: only its own blocks move
        assert a.get()[0] == soft.index(a)
    assert all(h.resident for h in hard) and mm.evictions("guaranteed") == 0
    # a cyclic scan over 8 arrays in room for 5 is LRU's worst case: every access reloads
    assert mm.reloads("best-effort") == 8 and mm.evictions("best-effort") == 11
    assert mm.soft_resident_bytes() == 5 * KIB


# ---- soft eviction and reload


def test_soft_blocks_are_evicted_least_recently_used_first_within_the_owners_cap() -> None:
    mm = manager(1024 * KIB)
    mm.reserve("t", 3 * KIB, hard=False)
    a, b, c = (block(mm, "t") for _ in range(3))
    a.get()  # order now b, c, a
    d = block(mm, "t")
    assert (a.resident, b.resident, c.resident, d.resident) == (True, False, True, True)
    c.put(1.0)  # order now a, d, c
    e = block(mm, "t")
    assert (a.resident, c.resident, d.resident, e.resident) == (False, True, True, True)
    assert mm.evictions("t") == 2 and mm.reloads("t") == 0 and mm.usage("t") == 3 * KIB


def test_eviction_across_soft_owners_follows_one_lru_order_and_leaves_pinned_blocks() -> None:
    mm = manager(4 * KIB)
    mm.reserve("x", None, hard=False)
    mm.reserve("y", None, hard=False)
    x1, y1, x2, y2 = block(mm, "x"), block(mm, "y"), block(mm, "x"), block(mm, "y")
    with mm.pinned(x1):
        y3 = block(mm, "y")  # x1 is the least recent but pinned: y1 goes
        assert (x1.resident, y1.resident) == (True, False)
        x3 = block(mm, "x")  # then x2
        assert not x2.resident
        assert mm.evictions("x") == 1 and mm.evictions("y") == 1
    with mm.pinned(x1, y2, y3, x3), pytest.raises(MemoryError, match="pinned arrays hold it"):
        block(mm, "y")
    y4 = block(mm, "y")  # unpinned again: x1, now least recent, is evicted
    assert not x1.resident and y4.resident


def test_an_evicted_array_is_reloaded_on_access_with_its_in_place_updates_and_counted() -> None:
    mm = manager(2 * KIB)
    mm.reserve("t", None, hard=False)
    first = block(mm, "t")
    first.put(np.arange(128, dtype=np.float64))
    live = first.get()
    live *= 3  # in place, on the block's storage
    other = block(mm, "t")
    third = block(mm, "t")  # evicts `first`
    assert (first.resident, mm.evictions("t")) == (False, 1)
    assert np.array_equal(first.to_numpy(), np.arange(128) * 3.0)  # read from host, not reloaded
    assert (first.resident, mm.reloads("t")) == (False, 0)
    assert np.array_equal(first.get(), np.arange(128) * 3.0)
    assert (first.resident, other.resident, third.resident, mm.reloads("t")) == (True, False, True, 1)
    other.put(7.0)  # overwritten whole: placed again without a reload
    assert other.resident and mm.reloads("t") == 1 and float(other.get()[5]) == 7.0


def _workload(mm: MemoryManager, owners: int = 3, arrays: int = 4, rounds: int = 6) -> list[bytes]:
    """Soft-reserved arrays updated tile by tile from each other (sums, products, transcendental
    functions: anything a lost or stale byte would change)."""
    rng = np.random.default_rng(29)
    data: dict[str, list[RuntimeArray]] = {}
    for o in range(owners):
        name = f"task-{o}"
        mm.reserve(name, 6 * 2 * KIB, hard=False)  # each owner's cap: fewer than its arrays
        data[name] = []
        for _ in range(arrays):
            arr = mm.array(name, (16, 16), np.float64)  # 2 KiB each
            arr.put(rng.standard_normal((16, 16)))
            data[name].append(arr)
    for r in range(rounds):
        for arrs in data.values():
            for i in range(arrays):
                with mm.pinned(arrs[i], arrs[(i + 1) % arrays]) as (x, y):
                    x += np.sin(y) @ y.T * 1e-2 + r
                    np.tanh(x, out=x)
    return [a.to_numpy().tobytes() for arrs in data.values() for a in arrs]


def test_results_are_bit_identical_to_an_unevicted_run() -> None:
    roomy = manager(1024 * KIB)
    expected = _workload(roomy)
    tight = manager(5 * 2 * KIB)  # room for 5 of the 12 arrays
    got = _workload(tight)
    owners = [f"task-{o}" for o in range(3)]
    assert sum(roomy.evictions(o) for o in owners) == 0
    assert all(tight.evictions(o) > 0 and tight.reloads(o) > 0 for o in owners)
    assert got == expected


# ---- lifetime


def test_release_and_garbage_collection_give_the_memory_back() -> None:
    mm = manager(4 * KIB)
    mm.reserve("s", None, hard=False)
    kept = block(mm, "s")
    dropped = block(mm, "s")
    del dropped
    gc.collect()
    assert mm.usage("s") == 1 * KIB  # the collected array's block is gone at the next call
    mm.reserve("g", 3 * KIB, hard=True)
    assert kept.resident and mm.evictions("s") == 0
    mm.release("s")
    with pytest.raises(ValueError, match="freed or its owner released"):
        kept.get()
    with pytest.raises(ValueError, match="owner 's' has no reservation"):
        mm.usage("s")
    mm.release("g")
    assert mm.free_bytes() == 4 * KIB and mm.owners() == []


# ---- bad input


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda mm: MemoryManager(-1, CpuBackend()), "capacity_bytes must be a non-negative int, got -1"),
        (lambda mm: MemoryManager(True, CpuBackend()), "capacity_bytes must be a non-negative int, got True"),
        (lambda mm: mm.reserve("t", -5, hard=False), "nbytes must be a non-negative int, got -5"),
        (lambda mm: mm.reserve("t", 1.5, hard=True), "nbytes must be a non-negative int, got 1.5"),
        (lambda mm: mm.reserve("t", None, hard=True), "nbytes must be an int for a hard reservation"),
        (lambda mm: mm.reserve("", 1, hard=True), "owner must be a non-empty string"),
        (lambda mm: mm.reserve("t", 1, hard="yes"), "hard must be a bool, got 'yes'"),
        (lambda mm: mm.reserve("have", 1, hard=False), "owner 'have' already has a reservation"),
        (
            lambda mm: mm.array("nobody", 4, np.float32),
            "owner 'nobody' has no reservation: reserve\\(\\) first",
        ),
        (
            lambda mm: mm.array("have", (4, -1), np.float32),
            "shape must hold non-negative ints, got \\(4, -1\\)",
        ),
        (lambda mm: mm.array("have", "4", np.float32), "shape must be an int or a sequence of ints"),
        (lambda mm: mm.array("have", 4, None), "dtype must be a NumPy dtype .* got None"),
        (lambda mm: mm.array("have", 4, "no-such-type"), "dtype must be a NumPy dtype"),
        (lambda mm: mm.array("have", 4, object), "dtype must be a fixed-size numeric dtype"),
        (lambda mm: mm.release("nobody"), "owner 'nobody' has no reservation"),
        (
            lambda mm: mm.pinned(np.zeros(3)).__enter__(),
            "arrays must be RuntimeArrays of this manager, got ndarray",
        ),
    ],
)
def test_bad_input_is_one_clear_error_naming_the_argument(
    call: Callable[[MemoryManager], Any], message: str
) -> None:
    mm = manager(1024 * KIB)
    mm.reserve("have", None, hard=False)
    with pytest.raises(ValueError, match=message):
        call(mm)


def test_an_array_over_its_owners_soft_cap_is_refused() -> None:
    mm = manager(1024 * KIB)
    mm.reserve("t", 1 * KIB, hard=False)
    with pytest.raises(MemoryError, match=r"an array of 2Ki exceeds the soft reservation of 't' \(1Ki\)"):
        block(mm, "t", kib=2)


def test_the_gpu_checks_eviction_comparison_holds_on_numpy() -> None:
    from neuronetes.gpuvalidate.checks.runtime import evicted_vs_roomy

    got = evicted_vs_roomy(CpuBackend())
    assert got["identical"] is True
    assert got["evictions"] > 0 and got["reloads"] > 0
