"""The workstation preemption check's two jobs (run by the workstation daemon):

    ws_job.py hold --gib N --done FILE [--fake]     the low-priority job: holds N GiB of tensors
    ws_job.py urgent --gib N --done FILE [--fake]   the urgent job: needs N GiB at once

``hold`` fills N GiB with random data and takes its checksum, prints ``READY <pid>``, then computes
a little every 0.2 s (each step is a CUDA call, so a checkpointed process waits in it) until FILE
exists; then it takes the checksum again and reports both. ``urgent`` allocates N GiB, writes and
reads it, prints ``READY <pid>`` and keeps it until FILE exists (so the check sees the GPU while it
runs), then reports. ``--fake``: the same through the fake driver (memory has no content there, so
no checksum).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from .cudadrv import SUCCESS, Driver, out

GIB = 1 << 30


def checksum(x: Any) -> float:
    """The float64 sum of a tensor, 64 Mi elements at a time: a whole float64 copy of 20 GiB of fp32
    would be 40 GiB more on the GPU (``torch.sum(x, dtype=float64)`` makes one)."""
    import torch

    step = 64 << 20
    total = sum(float(x[i : i + step].double().sum().item()) for i in range(0, x.numel(), step))
    torch.cuda.empty_cache()  # the chunks' blocks go back to the driver: the job holds its tensors only
    return total


def hold_torch(gib: float, done: str) -> None:
    import torch

    x = torch.randn(int(gib * GIB) // 4, device="cuda")
    before = checksum(x)
    print(f"READY {os.getpid()}", flush=True)
    steps = 0
    while not os.path.exists(done):
        y = x[: 1 << 20] * 2.0
        torch.cuda.synchronize()
        del y
        steps += 1
        time.sleep(0.2)
    after = checksum(x)
    out(before=before, after=after, unchanged=before == after, steps=steps, gib=gib)


def hold_fake(gib: float, done: str) -> None:
    d = Driver()
    rc, _ = d.alloc(int(gib * GIB))
    if rc != SUCCESS:
        out(error=f"cuMemAlloc_v2({gib} GiB) returned CUresult {rc}")
        return
    print(f"READY {os.getpid()}", flush=True)
    steps = 0
    while not os.path.exists(done):
        d.mem_get_info()  # a CUDA call: waits while the process is locked by the checkpoint
        steps += 1
        time.sleep(0.2)
    out(before=None, after=None, unchanged=True, steps=steps, gib=gib)


def urgent(gib: float, done: str, fake: bool) -> None:
    started = time.monotonic()
    r: dict[str, Any] = {"gib": gib}
    held: Any = None
    if fake:
        rc, held = Driver().alloc(int(gib * GIB))
        r["ok"] = rc == SUCCESS
        r["rc"] = rc
    else:
        import torch

        try:
            held = torch.ones(int(gib * GIB) // 4, device="cuda")
            r["ok"] = float(held[: 1 << 20].sum().item()) == float(1 << 20)
        except torch.cuda.OutOfMemoryError as exc:
            r["ok"] = False
            r["error"] = str(exc)[:200]
    r["seconds"] = time.monotonic() - started
    print(f"READY {os.getpid()}", flush=True)
    while r["ok"] and not os.path.exists(done):
        time.sleep(0.1)
    out(**r)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=("hold", "urgent"))
    p.add_argument("--gib", type=float, required=True)
    p.add_argument("--done", default="")
    p.add_argument("--fake", action="store_true")
    args = p.parse_args()
    if args.role == "hold":
        (hold_fake if args.fake else hold_torch)(args.gib, args.done)
    else:
        urgent(args.gib, args.done, args.fake)


if __name__ == "__main__":
    main()
