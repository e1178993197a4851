"""Check "workstation-preemption": urgent work preempts a job holding real GPU memory, by checkpoint.

The workstation daemon (NVML backend, the shim preloaded into its jobs) runs a low-priority job that
holds 20 GiB of PyTorch tensors (``ws_job.py hold``); a high-priority job that needs most of the GPU
(``ws_job.py urgent``: total − 13 GiB) is submitted. Both ask for the whole GPU, so the urgent one
runs only if the low one's memory leaves the GPU: stopping it is not enough (it would keep its
memory), so the daemon must take the checkpoint rung (the CUDA driver's checkpoint API), ``nvidia-smi``
must show the low job's memory gone, the urgent job must run, and the low job must resume with
the checksum of its tensors unchanged. The daemon's own checkpoint and restore latencies are
reported. Over the fake driver the same runs with the fake's checkpoint state machine, its NVML
standing in for ``nvidia-smi`` (memory there has no content, so no checksum).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Final

from ..context import GIB, Context, parse_results
from ..model import Report
from .workstation import Workstation, WorkstationError, pid_of_ready

HOLD_GIB: Final = 20
HEADROOM_GIB: Final = 13  # the urgent job asks total − this: it fits alone, never beside the held 20 GiB


def memory_of(ctx: Context, pid: int) -> int | None:
    """What the node's own tool shows for `pid` (bytes; None: not listed): nvidia-smi on a GPU, the
    fake's NVML otherwise."""
    if ctx.fake:
        return ctx.gpu_memory_of([pid]).get(pid)
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            try:
                return int(fields[1]) << 20
            except ValueError:
                return None
    return None


def run(ctx: Context) -> Report:
    report = Report()
    total_gib = ctx.gpu_total_bytes / GIB
    urgent_gib = int(total_gib - HEADROOM_GIB)
    if total_gib < HOLD_GIB + HEADROOM_GIB:
        report.skip(
            "preemption",
            f"skipped: the GPU has {total_gib:.0f} GiB; the check needs ≥ {HOLD_GIB + HEADROOM_GIB}",
        )
        return report
    job = ctx.module_argv("ws_job", [])
    fake = ["--fake"] if ctx.fake else []
    done = ctx.path("train.done")
    done.unlink(missing_ok=True)
    report.figures.update(hold_gib=HOLD_GIB, urgent_gib=urgent_gib)
    try:
        with Workstation(ctx, "ws-preempt") as ws:
            report.figures["checkpoint_api"] = ws.status()["daemon"]["checkpoint"]
            preempt(ctx, ws, report, job, fake, done, urgent_gib)
    except WorkstationError as exc:
        report.check("preemption", False, str(exc))
    return report


def preempt(
    ctx: Context,
    ws: Workstation,
    report: Report,
    job: list[str],
    fake: list[str],
    done: Path,
    urgent_gib: int,
) -> None:
    ws.submit("train", [*job, "hold", "--gib", str(HOLD_GIB), "--done", str(done), *fake], 1, "--gpus", "1")
    ws.wait_state("train", ("RUNNING",), 60)
    ws.wait_for(lambda: pid_of_ready(ws.stdout("train")) is not None, "the train job holding its memory", 120)
    pid = pid_of_ready(ws.stdout("train"))
    assert pid is not None
    held = memory_of(ctx, pid)
    report.figures["train_memory_before_bytes"] = held
    if ctx.fake and held:
        ws.measured(pid, held)  # what NVML would list: stopping it would leave too little

    # the urgent job holds its memory until told to finish, so the GPU can be looked at meanwhile
    urgent_done = ctx.path("urgent.done")
    urgent_done.unlink(missing_ok=True)
    submitted = time.monotonic()
    ws.submit(
        "urgent",
        [*job, "urgent", "--gib", str(urgent_gib), "--done", str(urgent_done), *fake],
        9,
        "--gpus",
        "1",
    )
    train = ws.wait_state("train", ("PREEMPTED",), 90)
    rung = train.get("suspended")
    ws.wait_for(lambda: not memory_of(ctx, pid), "the train job's memory to leave the GPU", 90)
    freed_after = time.monotonic() - submitted
    if ctx.fake:
        ws.measured(pid, 0)
    during = memory_of(ctx, pid)
    ok = rung == "checkpoint"
    report.check(
        "checkpoint.memory-freed",
        ok,
        f"suspended by the checkpoint rung; its memory left the GPU "
        f"{freed_after:.1f} s after the urgent job was submitted"
        if ok
        else f"suspended by the {rung} rung, not the checkpoint",
        rung=rung,
        reason=train.get("reason"),
        memory_before=held,
        memory_during=during,
    )
    report.figures["memory_freed_after_submit_s"] = round(freed_after, 2)

    ws.wait_state("urgent", ("RUNNING",), 30)
    ws.wait_for(
        lambda: pid_of_ready(ws.stdout("urgent")) is not None, "the urgent job to hold its memory", 120
    )
    urgent_pid = pid_of_ready(ws.stdout("urgent"))
    urgent_memory = memory_of(ctx, urgent_pid) if urgent_pid is not None else None
    urgent_done.touch()
    urgent = ws.wait_state("urgent", ("COMPLETED", "FAILED", "CANCELLED"), 120)
    results = parse_results(ws.stdout("urgent"))
    u = results[-1] if results else {}
    ok = urgent["state"] == "COMPLETED" and u.get("ok") is True
    report.check(
        "urgent.ran",
        ok,
        f"the urgent job got its {urgent_gib} GiB and ran"
        if ok
        else f"urgent job {urgent['state']}: {u.get('error') or urgent.get('reason')}",
        memory=urgent_memory,
        **u,
    )

    ws.wait_state("train", ("RUNNING",), 90)
    restored = ws.wait_for(
        lambda: (memory_of(ctx, pid) or 0) >= (held or 1) * 0.9, "the train job's memory back", 90
    )
    done.touch()
    train = ws.wait_state("train", ("COMPLETED", "FAILED", "CANCELLED"), 90)
    results = parse_results(ws.stdout("train"))
    t = results[-1] if results else {}
    ok = train["state"] == "COMPLETED" and t.get("unchanged") is True
    latencies: dict[str, Any] = ws.status()["daemon"].get("lastPreemptionSeconds", {})
    report.check(
        "train.resumed-unchanged",
        ok,
        "resumed; its tensors' checksum is unchanged"
        if ok
        else f"train job {train['state']}: {t or train.get('reason')}",
        restored_within_s=restored,
        **t,
    )
    report.figures["checkpoint_seconds"] = latencies.get("checkpoint")
    report.figures["restore_seconds"] = latencies.get("resume-checkpoint")
