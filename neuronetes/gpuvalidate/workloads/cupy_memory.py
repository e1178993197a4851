"""CuPy under a memory limit (with the shim preloaded over a region):

    cupy_memory.py --limit BYTES [--offset FILE:N]

One RESULT object: what ``cupy.cuda.runtime.memGetInfo`` and in-process NVML say while a quarter of
the limit is held, allocating past the limit (the exception's type), and that the process then frees
its pool and allocates and computes again.
"""

from __future__ import annotations

import argparse
from typing import Any

import cupy

from .cudadrv import account, nvml_attributed, nvml_memory_info, out, region_used


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=int, required=True)
    p.add_argument("--offset", type=account, default=None)
    args = p.parse_args()
    limit, offset = args.limit, args.offset
    pool = cupy.get_default_memory_pool()
    r: dict[str, Any] = {}
    held = cupy.empty(limit // 4, dtype=cupy.uint8)
    free, total = cupy.cuda.runtime.memGetInfo()
    r["report"] = {
        "free": int(free),
        "total": int(total),
        "charged": region_used(offset),
        "nvml": nvml_memory_info(),
        "pool": int(pool.total_bytes()),
    }
    del held
    pool.free_all_blocks()
    chunks: list[Any] = []
    r["oom"] = "none"
    try:
        for _ in range(64):
            chunks.append(cupy.empty(limit // 8, dtype=cupy.uint8))
    except cupy.cuda.memory.OutOfMemoryError as exc:
        r["oom"] = type(exc).__name__
    except Exception as exc:
        r["oom"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    r["chunks_before_oom"] = len(chunks)
    r["charged_at_oom"] = region_used(offset)
    r["attributed_at_oom"] = nvml_attributed()
    chunks.clear()
    pool.free_all_blocks()
    try:
        again = cupy.ones(limit // 2, dtype=cupy.uint8)
        r["recovered"] = int(again[:1024].sum()) == 1024
        del again
    except Exception as exc:
        r["recovered"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    out(**r)


if __name__ == "__main__":
    main()
