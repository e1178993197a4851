"""Memory through the CUDA driver API, run with or without the shim (real driver or the fake):

    driver_memory.py MODE --limit BYTES [--offset FILE:N]

MODE: ``report`` (what cuMemGetInfo and in-process NVML say while a quarter is held), ``oom``
(allocate until refused, then recover), ``vmm`` (cuMemCreate → cuMemMap → cuMemRelease while mapped
→ cuMemUnmap, and a retained handle), ``paths`` (CUDA arrays, mipmapped arrays, a graph memory
node, the device malloc heap: each within and past the limit), ``exec1``/``exec2`` (allocate, exec
itself, allocate again), ``spawn`` (a multiprocessing child shares the container's limit). Each step
records the shim's account (``--offset FILE:N`` in the region directory) and NVML's memory of this process.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from typing import Any

from .cudadrv import (
    SUCCESS,
    Account,
    Driver,
    account,
    account_arg,
    nvml_attributed,
    nvml_memory_info,
    out,
    region_used,
)

MIB = 1 << 20


def reading(offset: Account | None) -> dict[str, int | None]:
    return {"charged": region_used(offset), "attributed": nvml_attributed()}


def report(d: Driver, limit: int, offset: Account | None) -> None:
    rc, _ = d.alloc(limit // 4)
    charged = region_used(offset)
    free, total = d.mem_get_info()
    out(alloc_rc=rc, charged=charged, free=free, total=total, nvml=nvml_memory_info())


def oom(d: Driver, limit: int, offset: Account | None) -> None:
    chunk = limit // 8
    ptrs: list[int] = []
    rc = SUCCESS
    while len(ptrs) < 16:
        rc, p = d.alloc(chunk)
        if rc != SUCCESS:
            break
        ptrs.append(p)
    charged_at_oom = region_used(offset)
    big_rc, _ = d.alloc(2 * limit)
    for p in ptrs:
        d.free(p)
    realloc_rc, p = d.alloc(limit // 2)
    if realloc_rc == SUCCESS:
        d.free(p)
    out(
        chunk=chunk,
        chunks=len(ptrs),
        oom_rc=rc,
        charged_at_oom=charged_at_oom,
        big_rc=big_rc,
        realloc_rc=realloc_rc,
        charged_after=region_used(offset),
    )


def vmm(d: Driver, limit: int, offset: Account | None) -> None:
    g = d.granularity()
    size = (256 * MIB + g - 1) // g * g
    steps: dict[str, Any] = {"before": reading(offset)}
    rc, handle = d.vmm_create(size)
    if rc != SUCCESS:
        out(error=f"cuMemCreate({size}) returned CUresult {rc}")
        return
    va = d.vmm_reserve(size)
    steps["map_rc"] = d.vmm_map(va, size, handle)
    steps["mapped"] = reading(offset)
    steps["release_rc"] = d.vmm_release(handle)
    steps["released_while_mapped"] = reading(offset)
    steps["unmap_rc"] = d.vmm_unmap(va, size)
    steps["unmapped"] = reading(offset)
    d.vmm_address_free(va, size)
    # a retained handle keeps the memory after the creator's release and the unmap
    rc, handle = d.vmm_create(size)
    va = d.vmm_reserve(size)
    d.vmm_map(va, size, handle)
    retain_rc, retained = d.vmm_retain(va) if d.has("cuMemRetainAllocationHandle") else (None, 0)
    steps["retain_rc"] = retain_rc
    d.vmm_release(handle)
    d.vmm_unmap(va, size)
    steps["retained_after_unmap"] = reading(offset)
    if retain_rc == SUCCESS:
        d.vmm_release(retained)
    steps["retained_released"] = reading(offset)
    d.vmm_address_free(va, size)
    over_rc, over = d.vmm_create((limit // g + 1) * g)
    if over_rc == SUCCESS:
        d.vmm_release(over)
    out(size=size, over_limit_rc=over_rc, **steps)


def _path(d: Driver, offset: Account | None, make: Any, undo: Any) -> dict[str, Any]:
    before = reading(offset)
    try:
        rc, handle = make()
    except AttributeError as exc:  # the driver has no such entry point
        return {"rc": None, "error": str(exc).rsplit(":", 1)[-1].strip()}
    held = reading(offset)
    undo_rc = undo(handle) if rc == SUCCESS else None
    after = reading(offset)
    return {"rc": rc, "before": before, "held": held, "after": after, "undo_rc": undo_rc}


def paths(d: Driver, limit: int, offset: Account | None) -> None:
    fit, big = 256 * MIB, 2 * limit
    result: dict[str, Any] = {}
    # float4 (16 bytes) elements; 8192 x 2048 = 256 MiB
    result["array"] = _path(d, offset, lambda: d.array_create(8192, fit // (8192 * 16)), d.array_destroy)
    result["array_over"] = _path(
        d, offset, lambda: d.array_create(16384, big // (16384 * 16)), d.array_destroy
    )
    result["mipmapped"] = _path(d, offset, lambda: d.mipmapped_create(4096, 4096, 4), d.mipmapped_destroy)
    side = 1 << (((big // 16 - 1).bit_length() + 1) // 2)  # the smallest power of two with side² × 16 ≥ big
    result["mipmapped_over"] = _path(
        d, offset, lambda: d.mipmapped_create(side, side, 2), d.mipmapped_destroy
    )

    def graph(size: int) -> tuple[int, int]:
        rc, ptr, _exec = d.graph_alloc_launch(size)
        return rc, ptr

    result["graph_node"] = _path(d, offset, lambda: graph(fit), d.free_async)
    result["graph_node_over"] = _path(d, offset, lambda: graph(big), d.free_async)
    default_heap = d.get_heap_limit()

    def heap(size: int) -> tuple[int, int]:
        return d.set_heap_limit(size), 0

    result["heap"] = _path(d, offset, lambda: heap(fit), lambda _h: d.set_heap_limit(default_heap))
    result["heap_over"] = _path(d, offset, lambda: heap(big), lambda _h: d.set_heap_limit(default_heap))
    out(fit=fit, big=big, default_heap=default_heap, **result)


def exec1(d: Driver, limit: int, offset: Account | None) -> None:
    rc, _ = d.alloc(limit * 3 // 4)
    out(phase=1, pid=os.getpid(), alloc_rc=rc, charged=region_used(offset))
    sys.stdout.flush()
    argv = [
        sys.executable,
        "-u",
        "-m",
        __spec__.name if __spec__ else __name__,
        "exec2",
        "--limit",
        str(limit),
    ]
    os.execv(sys.executable, argv + account_arg(offset))


def exec2(d: Driver, limit: int, offset: Account | None) -> None:
    rc, _ = d.alloc(limit * 3 // 4)
    over_rc, _ = d.alloc(limit // 2)
    out(phase=2, pid=os.getpid(), alloc_rc=rc, over_rc=over_rc, charged=region_used(offset))


def _child(queue: Any, limit: int, offset: Account | None) -> None:
    d = Driver()
    over_rc, _ = d.alloc(limit * 3 // 5)
    fit_rc, _ = d.alloc(limit // 5)
    queue.put({"over_rc": over_rc, "fit_rc": fit_rc, "charged": region_used(offset)})


def spawn(d: Driver, limit: int, offset: Account | None) -> None:
    rc, _ = d.alloc(limit * 3 // 5)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue, limit, offset))
    child.start()
    got = queue.get(timeout=60)
    child.join(30)
    out(parent_rc=rc, child=got, child_exit=child.exitcode)


MODES = {
    "report": report,
    "oom": oom,
    "vmm": vmm,
    "paths": paths,
    "exec1": exec1,
    "exec2": exec2,
    "spawn": spawn,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--limit", type=int, required=True)
    p.add_argument("--offset", type=account, default=None)
    args = p.parse_args()
    MODES[args.mode](Driver(), args.limit, args.offset)


if __name__ == "__main__":
    main()
