"""A compute loop whose throughput the pacing check compares with and without a quota:

    compute_loop.py {matmul|graph|fake|fake-graph} --seconds S [--start-at EPOCH]

``matmul``: PyTorch fp32 matrix products of 1024², 2048² and 4096² (kernels of about 0.1–5 ms on a
current GPU) in turn; ``graph``: the same products captured once into a CUDA graph and replayed;
``fake``/``fake-graph``: the fake driver's kernels of 0.1, 0.5, 2 and 5 ms (their first parameter),
launched directly or replayed from a captured graph. After warming up the loop waits until
``--start-at`` (so two tenants start together), runs for S seconds and reports the rounds per
second and each kernel's measured milliseconds.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Callable
from typing import Any

from .cudadrv import Driver, out

SIZES = (1024, 2048, 4096)
FAKE_NS = (100_000, 500_000, 2_000_000, 5_000_000)


def torch_round(graph: bool) -> tuple[Callable[[], None], Callable[[], None], dict[str, float]]:
    import torch

    mats = {n: torch.randn(n, n, device="cuda") for n in SIZES}
    outs = {n: torch.empty(n, n, device="cuda") for n in SIZES}

    def products() -> None:
        for n in SIZES:
            torch.matmul(mats[n], mats[n], out=outs[n])

    kernel_ms: dict[str, float] = {}
    for n in SIZES:
        torch.matmul(mats[n], mats[n], out=outs[n])
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        torch.matmul(mats[n], mats[n], out=outs[n])
        end.record()
        torch.cuda.synchronize()
        kernel_ms[str(n)] = float(begin.elapsed_time(end))
    step: Callable[[], None] = products
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            products()  # warm the side stream, as torch's graph docs require
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            products()
        step = g.replay
    return step, torch.cuda.synchronize, kernel_ms


def fake_round(graph: bool) -> tuple[Callable[[], None], Callable[[], None], dict[str, float]]:
    d = Driver()
    fn = ctypes.c_void_p(1)  # the fake driver: any handle is a kernel of its first parameter's ns
    params = [ctypes.c_uint64(ns) for ns in FAKE_NS]
    arrays = [(ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(p), ctypes.c_void_p)) for p in params]

    def launches() -> None:
        for a in arrays:
            rc = d.lib.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, d.stream, a, None)
            if rc != 0:
                raise RuntimeError(f"cuLaunchKernel returned CUresult {rc}")

    def sync() -> None:
        d.sync()

    step: Callable[[], None] = launches
    if graph:
        g, exec_ = ctypes.c_void_p(), ctypes.c_void_p()
        d.require("cuStreamBeginCapture_v2", d.lib.cuStreamBeginCapture_v2(d.stream, 0))
        launches()
        d.require("cuStreamEndCapture", d.lib.cuStreamEndCapture(d.stream, ctypes.byref(g)))
        d.require(
            "cuGraphInstantiateWithFlags",
            d.lib.cuGraphInstantiateWithFlags(ctypes.byref(exec_), g, ctypes.c_ulonglong(0)),
        )

        def replay() -> None:
            rc = d.lib.cuGraphLaunch(exec_, d.stream)
            if rc != 0:
                raise RuntimeError(f"cuGraphLaunch returned CUresult {rc}")

        step = replay
    return step, sync, {str(ns / 1e6): ns / 1e6 for ns in FAKE_NS}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=("matmul", "graph", "fake", "fake-graph"))
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--start-at", type=float, default=0.0)
    args = p.parse_args()
    graph = args.kind in ("graph", "fake-graph")
    make = fake_round if args.kind.startswith("fake") else torch_round
    step, sync, kernel_ms = make(graph)
    for _ in range(3):  # warm up (the shim's first measurement, lazy loading)
        step()
    sync()
    late = time.time() - args.start_at if args.start_at else 0.0
    while time.time() < args.start_at:
        time.sleep(0.005)
    rounds = 0
    begin = time.perf_counter()
    deadline = begin + args.seconds
    while time.perf_counter() < deadline:
        step()
        rounds += 1
        if rounds % 4 == 0:
            sync()  # bound the queue: throughput is what the GPU finished
    sync()
    elapsed = time.perf_counter() - begin
    result: dict[str, Any] = {
        "rounds": rounds,
        "seconds": elapsed,
        "rounds_per_s": rounds / elapsed,
        "kernel_ms": kernel_ms,
        "started_late_s": max(late, 0.0),
    }
    out(**result)


if __name__ == "__main__":
    main()
