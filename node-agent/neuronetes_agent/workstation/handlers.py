"""One handler per protocol request, registered in `HANDLERS`; each returns a typed `Reply`.

Handlers are thin: they validate, call the scheduler under its lock and shape the answer
(job and GPU objects as documented in docs/workstation.md, "Protocol").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final

from neuronetes_agent.daemon.devices import GpuRefError

from . import admission as adm
from . import protocol as p
from .commands import missing_program
from .gpus import GpuView
from .jobs import ACTIVE, FINAL, Job, JobSpec, JobState, SpecError, parse_size, share_compute_default
from .logtail import MAX_LINES, log_size, read_after, tail_rotated
from .scheduler import Scheduler

__all__ = ["HANDLERS", "handle", "job_json"]

S = JobState
_MAX_TAIL: Final = MAX_LINES


def job_json(sched: Scheduler, job: Job, *, history: bool = False) -> dict[str, Any]:
    spec = job.spec
    out: dict[str, Any] = {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "priority": spec.priority,
        "effectivePriority": adm.effective_priority(job, sched.clock(), sched.config.settings.aging_s)
        if job.state in (S.QUEUED, S.PREEMPTED)
        else spec.priority,
        "command": spec.command,
        "request": {"gpus": spec.gpus}
        if spec.whole
        else {"gpuMemoryBytes": spec.memory_bytes, "gpuComputePercent": spec.compute_percent},
        "checkpointable": spec.checkpointable,
        "gpus": list(job.gpus),
        "pid": job.pid or None,
        "attempt": job.attempt,
        "suspended": job.suspended or None,
        "exitCode": job.exit_code,
        "reason": job.reason,
        "submittedAt": job.submitted_at,
        "startedAt": job.started_at or None,
        "finishedAt": job.finished_at or None,
    }
    if history:
        stdout, stderr = sched.log_paths(job)
        out["logs"] = {"stdout": str(stdout), "stderr": str(stderr)}
        out["history"] = [{"at": at, "from": f or None, "to": t, "reason": r} for at, f, t, r in job.history]
    return out


def gpu_json(view: GpuView, holders: list[str]) -> dict[str, Any]:
    return {
        "uuid": view.uuid,
        "index": view.index,
        "model": view.model,
        "state": view.state.value,
        "reason": view.reason,
        "drained": view.drained,
        "utilizationPercent": view.utilization_percent,
        "temperatureCelsius": view.temperature_celsius,
        "memoryTotalBytes": view.memory_total_bytes,
        "memoryUsedBytes": view.memory_used_bytes,
        "processes": [{"pid": pr.pid, "usedMemoryBytes": pr.used_memory_bytes} for pr in view.processes],
        "jobs": holders,
    }


def _holders(sched: Scheduler) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for job in sched.store.jobs(states=ACTIVE):
        for uuid in job.gpus:
            out.setdefault(uuid, []).append(job.id)
    return out


def _find(sched: Scheduler, name_or_id: str) -> Job | p.Err:
    job = sched.store.find(name_or_id)
    return job if job is not None else p.Err("not_found", f"no job {name_or_id!r} (no such id or name)")


def _uuid(sched: Scheduler, ref: str) -> str | p.Err:
    """The GPU `ref` names (index, UUID, unique UUID prefix; `Gpus.resolve`), or the one-line error."""
    try:
        return sched.gpus.resolve(ref)
    except GpuRefError as exc:
        return p.Err("invalid" if exc.ambiguous else "not_found", exc.message)


def _gpu(sched: Scheduler, ref: str) -> GpuView | p.Err:
    uuid = _uuid(sched, ref)
    if isinstance(uuid, p.Err):
        return uuid
    view = sched.gpus.views.get(uuid)
    return view if view is not None else p.Err("not_found", f"no GPU {ref!r} on this machine")


# ---- handlers ------------------------------------------------------------------------------------


def ping(sched: Scheduler, req: p.Ping) -> p.Reply:
    return p.Ok(
        {"pid": os.getpid(), "backend": sched.gpus_description, "checkpoint": _checkpoint_status(sched)}
    )


def submit(sched: Scheduler, req: p.Submit) -> p.Reply:
    total = max(d.memory_mib << 20 for d in sched.gpus.devices)
    try:
        memory = parse_size(req.gpu_memory, "--gpu-memory") if req.gpu_memory else 0
        compute = req.gpu_compute
        if compute is None:
            compute = share_compute_default(memory, total) if memory else 100
        spec = JobSpec(
            command=req.command,
            priority=req.priority,
            name=req.name,
            gpus=req.gpus,
            memory_bytes=memory,
            compute_percent=compute,
            checkpointable=req.checkpointable,
            workdir=req.workdir,
        ).check_new()
    except SpecError as exc:
        return p.Err("invalid", str(exc))
    missing = missing_program(spec.command, spec.workdir, os.environ.get("PATH", os.defpath))
    if missing:
        return p.Err("invalid", missing)
    if spec.whole and spec.gpus > len(sched.gpus.devices):
        return p.Err("invalid", f"--gpus {spec.gpus}: this machine has {len(sched.gpus.devices)} GPU(s)")
    if spec.memory_bytes > total:
        return p.Err(
            "invalid",
            f"--gpu-memory {req.gpu_memory}: more than a GPU of this machine has ({adm.gib(total)})",
        )
    with sched.lock:
        now = sched.clock()
        job = sched.store.add_job(spec, now)
        sched.store.transition(job, S.QUEUED, "queued", now)
    sched.wake.set()
    return p.Ok(job_json(sched, job))


def list_jobs(sched: Scheduler, req: p.ListJobs) -> p.Reply:
    with sched.lock:
        jobs = sched.store.jobs()
        return p.Ok([job_json(sched, j) for j in jobs if req.all or j.state not in FINAL])


def status(sched: Scheduler, req: p.Status) -> p.Reply:
    with sched.lock:
        holders = _holders(sched)
        gpus = [
            gpu_json(v, holders.get(v.uuid, []))
            for v in sorted(sched.gpus.views.values(), key=lambda v: v.index)
        ]
        jobs = [job_json(sched, j) for j in sched.store.jobs() if req.all or j.state not in FINAL]
        settings = sched.config.settings
        return p.Ok(
            {
                "daemon": {
                    "pid": os.getpid(),
                    "backend": sched.gpus_description,
                    "checkpoint": _checkpoint_status(sched),
                    "utilizationCapPercent": settings.cap_percent,
                    "headroomPercent": settings.headroom_percent,
                    "agingSeconds": settings.aging_s,
                    "lastPreemptionSeconds": dict(sched.last_preemption),
                    "containment": sched.launcher.containment.describe(),
                    "logMaxBytes": sched.launcher.log_max_bytes,
                    "problems": sorted(sched.store.problems.values()),
                },
                "gpus": gpus,
                "jobs": jobs,
            }
        )


def describe(sched: Scheduler, req: p.Describe) -> p.Reply:
    with sched.lock:
        job = _find(sched, req.job)
        return job if isinstance(job, p.Err) else p.Ok(job_json(sched, job, history=True))


def cancel(sched: Scheduler, req: p.Cancel) -> p.Reply:
    with sched.lock:
        job = _find(sched, req.job)
        if isinstance(job, p.Err):
            return job
        if job.state in FINAL:
            return p.Err("conflict", f"job {job.id} is already {job.state.value}")
        refused = sched.cancel(job, force=req.force)
        return p.Err("conflict", refused) if refused else p.Ok(job_json(sched, job))


def logs(sched: Scheduler, req: p.Logs) -> p.Reply:
    if not 0 < req.tail <= _MAX_TAIL:
        return p.Err("invalid", f"tail {req.tail}: use 1-{_MAX_TAIL} lines")
    with sched.lock:
        job = _find(sched, req.job)
        if isinstance(job, p.Err):
            return job
        path = sched.log_paths(job)[0 if req.stream == "stdout" else 1]
    state, job_id = sched.launcher.state, job.id

    def open_log(name: str) -> int:
        return state.open(["jobs", job_id, name], os.O_RDONLY)

    # `state` and `offset` let a follower go on from here and know when to stop
    where = {"job": job_id, "path": str(path), "state": job.state.value}
    try:
        if req.after is not None:
            data, offset = read_after(open_log, path.name, max(0, req.after))
            return p.Ok({**where, "data": data.decode(errors="replace"), "offset": offset})
        lines = tail_rotated(open_log, path.name, req.tail)
        return p.Ok({**where, "lines": lines, "offset": log_size(open_log, path.name)})
    except OSError as exc:  # a link or no regular file in its place: refused, never followed
        return p.Err("conflict", str(exc))


def health(sched: Scheduler, req: p.Health) -> p.Reply:
    with sched.lock:
        view = _gpu(sched, req.gpu)
        if isinstance(view, p.Err):
            return view
        out = gpu_json(view, _holders(sched).get(view.uuid, []))
        out["history"] = [
            {"at": at, "from": f or None, "to": t, "reason": r}
            for at, f, t, r in sched.store.gpu_history(view.uuid)
        ]
        return p.Ok(out)


def gpu_admin(sched: Scheduler, req: p.GpuAdmin) -> p.Reply:
    if req.force and req.action != "offline":
        return p.Err("invalid", f"force applies to offline only, not to {req.action}")
    with sched.lock:
        view = _gpu(sched, req.gpu)
        if isinstance(view, p.Err):
            return view
        users = [j for j in sched.store.jobs(states=ACTIVE) if view.uuid in j.gpus]
        if req.action == "drain":
            sched.store.set_gpu_hold(view.uuid, drained=True, offline=False)
            message = f"GPU {view.index} drained: running jobs continue, nothing new starts there"
        elif req.action == "offline":
            if users and not req.force:
                names = ", ".join(j.id for j in users)
                return p.Err(
                    "conflict", f"GPU {view.index} is used by job {names}: drain it, or --force to evict them"
                )
            for job in users:
                sched.evict(job, f"GPU {view.index} taken offline")
            sched.store.set_gpu_hold(view.uuid, drained=True, offline=True)
            sched.gpus.set_offline(view.uuid, True)
            message = f"GPU {view.index} offline" + (
                f", {len(users)} job(s) evicted and requeued" if users else ""
            )
        else:
            sched.store.set_gpu_hold(view.uuid, drained=False, offline=False)
            sched.gpus.set_offline(view.uuid, False)
            message = f"GPU {view.index} back in service"
    sched.wake.set()
    return p.Ok({"gpu": view.uuid, "message": message})


def simulate(sched: Scheduler, req: p.Simulate) -> p.Reply:
    sim = sched.gpus.simulated
    if sim is None:
        return p.Err("unsupported", "fault injection needs the simulated backend (--simulate-gpus N)")
    uuid = _uuid(sched, req.gpu)
    if isinstance(uuid, p.Err):
        return uuid
    done: list[str] = []
    try:
        if req.fault:
            done.append(sim.inject(uuid, req.fault))
        if req.process is not None:
            if req.process.pid <= 0 or req.process.bytes < 0:
                return p.Err("invalid", "process: pid must be positive and bytes not negative")
            sim.set_process(uuid, req.process.pid, req.process.bytes)
            done.append(f"process {req.process.pid} holds {req.process.bytes} bytes")
    except ValueError as exc:
        return p.Err("invalid", str(exc))
    sched.wake.set()
    return p.Ok({"gpu": uuid, "message": "; ".join(done) or "nothing to do"})


def _checkpoint_status(sched: Scheduler) -> str:
    return (
        f"available ({sched.ckpt.library})" if sched.ckpt.available else f"unavailable: {sched.ckpt.reason}"
    )


Handler = Callable[[Scheduler, Any], p.Reply]
HANDLERS: Final[dict[type, Handler]] = {
    p.Ping: ping,
    p.Submit: submit,
    p.ListJobs: list_jobs,
    p.Status: status,
    p.Describe: describe,
    p.Cancel: cancel,
    p.Logs: logs,
    p.Health: health,
    p.GpuAdmin: gpu_admin,
    p.Simulate: simulate,
}


def handle(sched: Scheduler, raw: bytes) -> bytes:
    request = p.decode_request(raw)
    if isinstance(request, p.Err):
        return p.encode_reply(request)
    return p.encode_reply(HANDLERS[type(request)](sched, request))
