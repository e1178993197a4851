"""PyTorch under a memory limit (run with the shim preloaded over a region, as a container would be):

    torch_memory.py --limit BYTES [--offset FILE:N] [--spawn]

Reports, as one RESULT object: the context's own cost (NVML's memory of this process minus what the
shim charged, after cuBLAS is loaded), what ``torch.cuda.mem_get_info`` and in-process NVML say
while a known amount is held, allocating past the limit (the exception's type, and that the process
then frees and allocates again), a vLLM-style cache sized to 90 % of the reported free memory and
then used, and NVML's peak memory of the process. With ``--spawn``, a ``multiprocessing`` child
(spawn) must be refused what would pass the container's limit together with the parent's memory.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
from typing import Any

import torch

from .cudadrv import Account, account, nvml_attributed, nvml_memory_info, out, region_used


def _alloc(nbytes: int) -> Any:
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def _child(queue: Any, limit: int, offset: Account | None) -> None:
    got: dict[str, Any] = {}
    try:
        _alloc(limit * 3 // 5)
        got["over"] = "allocated"
    except torch.cuda.OutOfMemoryError:
        got["over"] = "OutOfMemoryError"
    try:
        x = _alloc(limit // 5)
        x.fill_(1)
        torch.cuda.synchronize()
        got["fit"] = "allocated"
    except torch.cuda.OutOfMemoryError:
        got["fit"] = "OutOfMemoryError"
    got["charged"] = region_used(offset)
    queue.put(got)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=int, required=True)
    p.add_argument("--offset", type=account, default=None)
    p.add_argument("--spawn", action="store_true")
    args = p.parse_args()
    limit, offset = args.limit, args.offset
    r: dict[str, Any] = {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}

    # warm up: context, cuBLAS and its workspace, so the context's cost below is the steady one
    a = torch.randn(1024, 1024, device="cuda")
    float((a @ a).sum().item())
    torch.cuda.synchronize()
    charged0 = region_used(offset)
    attributed0 = nvml_attributed()
    r["context"] = {"charged": charged0, "attributed": attributed0, "reserved": torch.cuda.memory_reserved()}

    # what the process is told while it holds a quarter of the limit
    held = _alloc(limit // 4)
    free, total = torch.cuda.mem_get_info()
    r["report"] = {"free": free, "total": total, "charged": region_used(offset), "nvml": nvml_memory_info()}
    del held
    torch.cuda.empty_cache()

    # past the limit: the framework's own OOM, and the process goes on
    chunks: list[Any] = []
    r["oom"] = "none"
    try:
        for _ in range(64):
            chunks.append(_alloc(limit // 8))
    except torch.cuda.OutOfMemoryError as exc:
        r["oom"] = type(exc).__name__
    except Exception as exc:  # any other error is a failure to report, not to hide
        r["oom"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    r["chunks_before_oom"] = len(chunks)
    r["charged_at_oom"] = region_used(offset)
    r["attributed_at_oom"] = nvml_attributed()
    chunks.clear()
    torch.cuda.empty_cache()
    try:
        again = _alloc(limit // 2)
        again.fill_(3)
        torch.cuda.synchronize()
        r["recovered"] = int(again[:1024].sum().item()) == 3 * 1024
        del again
    except Exception as exc:
        r["recovered"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    torch.cuda.empty_cache()

    # vLLM's pattern: size a cache to 90 % of what is reported free, then use it
    free, total = torch.cuda.mem_get_info()
    try:
        cache = _alloc(int(free * 0.9))
        cache.fill_(1)
        b = torch.randn(2048, 2048, device="cuda")
        float((b @ b).sum().item())
        torch.cuda.synchronize()
        r["vllm"] = {
            "free": free,
            "total": total,
            "cache": cache.numel(),
            "ok": True,
            "charged": region_used(offset),
            "attributed": nvml_attributed(),
        }
        del cache
    except Exception as exc:
        r["vllm"] = {
            "free": free,
            "total": total,
            "ok": False,
            "error": f"{type(exc).__name__}: {str(exc)[:200]}",
        }
    torch.cuda.empty_cache()

    if args.spawn:
        parent = _alloc(limit * 3 // 5)
        parent.fill_(1)
        torch.cuda.synchronize()
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=_child, args=(queue, limit, offset))
        child.start()
        r["spawn"] = queue.get(timeout=90)
        child.join(30)
        r["spawn"]["exit"] = child.exitcode
        del parent
    r["peak_reserved"] = torch.cuda.max_memory_reserved()
    out(**r)


if __name__ == "__main__":
    main()
