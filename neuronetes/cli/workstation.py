"""Workstation mode's verbs: ``submit``, ``jobs …``, ``cancel``, ``watch``, and the workstation
side of ``status``, ``health``, ``drain``, ``offline``, ``online`` (`neuronetes.cli.cluster`).

They talk to the workstation daemon (``neuronetes agent run --standalone``) over its socket in the
state directory (docs/workstation.md; `neuronetes.cli.standalone` finds it). Specs are validated
here with the daemon's own rules before anything is sent, so a bad priority or size is refused
even when no daemon runs.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Final

import click

from .output import CliError, emit, output_option, rows_of, stdout_console
from .standalone import STATE_DIR, call, standalone, state_dir_of, target_state_dir

__all__ = ["cancel", "gpu_admin", "jobs", "show_health", "show_status", "submit", "watch"]

_INTERVAL_RE: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m)?")
_SCALE: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}


def _age(since: float | None) -> str:
    if not since:
        return "-"
    s = max(0, int(time.time() - since))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _gpus(job: dict[str, Any]) -> str:
    return ",".join(u[:12] for u in job["gpus"]) or "-"


def _job_rows(jobs: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            j["id"],
            j["name"],
            j["state"],
            f"{j['priority']}/{j['effectivePriority']}",
            _gpus(j),
            j["attempt"],
            _age(j["submittedAt"]),
            j["reason"] or "-",
        ]
        for j in jobs
    ]


_JOB_COLUMNS: Final = ("ID", "NAME", "STATE", "PRIO/EFF", "GPUS", "ATTEMPT", "AGE", "REASON")
_GPU_COLUMNS: Final = ("INDEX", "UUID", "STATE", "UTIL%", "TEMP°C", "MEM USED", "JOBS", "REASON")


def _gpu_rows(gpus: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            g["index"],
            g["uuid"],
            g["state"] + (" (drained)" if g["drained"] else ""),
            f"{g['utilizationPercent']:.0f}",
            "-" if g["temperatureCelsius"] is None else f"{g['temperatureCelsius']:.0f}",
            f"{g['memoryUsedBytes'] / 2**30:.1f}/{g['memoryTotalBytes'] / 2**30:.0f} GiB",
            ",".join(g["jobs"]) or "-",
            g["reason"] or "-",
        ]
        for g in gpus
    ]


# ---- submit ---------------------------------------------------------------------------------------


@click.command("submit", help="Queue a job on the workstation (docs/workstation.md).")
@click.option("--cmd", "command", required=True, help="the command line (run by /bin/sh)")
@click.option("--priority", required=True, type=int, help="0-1000; higher runs first and may preempt lower")
@click.option(
    "--name", default="", help="a name to refer to the job by (lower-case, digits, . _ -; not j<number>)"
)
@click.option("--gpus", type=int, default=None, help="whole GPUs, exclusively (default 1)")
@click.option(
    "--gpu-memory", default="", metavar="SIZE", help="a GPU share: memory (8Gi, 512Mi; at least 1Mi)"
)
@click.option(
    "--gpu-compute", type=int, default=None, metavar="PCT", help="a GPU share: compute percent (1-100)"
)
@click.option(
    "--checkpointable", is_flag=True, help="the job saves and exits on SIGUSR1 (cooperative preemption)"
)
@STATE_DIR
@output_option
def submit(
    command: str,
    priority: int,
    name: str,
    gpus: int | None,
    gpu_memory: str,
    gpu_compute: int | None,
    checkpointable: bool,
    state_dir: str | None,
    output: str,
) -> None:
    jobs = standalone("jobs")
    if gpus is not None and (gpu_memory or gpu_compute is not None):
        raise click.UsageError("give either --gpus or a share (--gpu-memory and --gpu-compute), not both")
    if gpu_compute is not None and not gpu_memory:
        raise click.UsageError("--gpu-compute needs --gpu-memory (a share names both)")
    compute = 100 if gpu_compute is None else gpu_compute
    try:  # the daemon's own rules, checked before anything is sent
        memory = jobs.parse_size(gpu_memory, "--gpu-memory") if gpu_memory else 0
        jobs.JobSpec(command, priority, name, gpus or 1, memory, compute, checkpointable).check_new()
    except jobs.SpecError as exc:
        raise CliError(str(exc)) from None
    request = standalone("protocol").Submit(
        command=command,
        priority=priority,
        name=name,
        gpus=gpus or 1,
        gpu_memory=gpu_memory,
        gpu_compute=compute,
        checkpointable=checkpointable,
        workdir=os.getcwd(),
    )
    job = call(state_dir_of(state_dir), request)
    if output == "table":
        click.echo(f"job {job['id']} ({job['name']}) {job['state']}")
    else:
        emit(output, job)


# ---- status, health, watch -----------------------------------------------------------------------


def _workstation(option: str | None) -> Path:
    """The state directory of `watch` (a workstation-only view): as the target rule picks it, or the
    no-daemon line."""
    target = target_state_dir(option)
    if target is not None:
        return target
    path = state_dir_of(option)
    call(path, standalone("protocol").Ping())  # nobody answers there: raises the one-line error
    return path


def _status_tables(document: dict[str, Any]) -> tuple[Any, Any]:
    from rich.table import Table

    tables = []
    for title, columns, rows in (
        ("GPUs", _GPU_COLUMNS, _gpu_rows(document["gpus"])),
        ("Jobs", _JOB_COLUMNS, _job_rows(document["jobs"])),
    ):
        table = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
        for c in columns:
            table.add_column(c, overflow="fold")
        for row in rows:
            table.add_row(*(str(cell) for cell in row))
        tables.append(table)
    return tables[0], tables[1]


def _daemon_line(d: dict[str, Any]) -> str:
    return (
        f"daemon pid {d['pid']} · {d['backend']} · checkpoint {d['checkpoint']} · cap "
        f"{d['utilizationCapPercent']:.0f} % (headroom {d['headroomPercent']:.0f} %) · aging "
        f"{d['agingSeconds']:.0f}s"
    )


def show_status(state_dir: Path, all_: bool, output: str) -> int:
    """``status`` on the workstation: the daemon, its GPUs and its jobs (all: finished jobs too)."""
    document = call(state_dir, standalone("protocol").Status(all=all_))
    if output != "table":
        emit(output, document)
        return 0
    console = stdout_console()
    console.print(_daemon_line(document["daemon"]), markup=False)
    for table in _status_tables(document):
        console.print(table)
    return 0


def show_health(state_dir: Path, gpu_id: str | None, output: str) -> int:
    """``health`` on the workstation: every GPU, or one with its processes, jobs and state history."""
    protocol = standalone("protocol")
    if gpu_id is None:
        gpus = call(state_dir, protocol.Status())["gpus"]
        emit(output, {"gpus": gpus}, columns=_GPU_COLUMNS, rows=_gpu_rows(gpus))
        return 0
    gpu = call(state_dir, protocol.Health(gpu=gpu_id))
    if output != "table":
        emit(output, gpu)
        return 0
    emit("table", gpu, columns=_GPU_COLUMNS, rows=_gpu_rows([gpu]))
    procs = gpu["processes"]
    if procs:
        emit(
            "table",
            procs,
            columns=("PID", "MEMORY"),
            rows=[[p["pid"], f"{p['usedMemoryBytes'] / 2**30:.1f} GiB"] for p in procs],
            title="Processes",
        )
    _emit_history(gpu["history"])
    return 0


def _emit_history(history: list[dict[str, Any]]) -> None:
    """A GPU's or a job's state transitions: the last table of ``health --gpu-id`` and of
    ``jobs describe``."""
    rows = [
        [time.strftime("%H:%M:%S", time.localtime(h["at"])), h["from"] or "-", h["to"], h["reason"] or "-"]
        for h in history
    ]
    emit("table", history, columns=("AT", "FROM", "TO", "REASON"), rows=rows, title="History")


def parse_interval(text: str) -> float:
    match = _INTERVAL_RE.fullmatch(text.strip())
    if match is None or float(match[1]) <= 0:
        raise click.BadParameter(f"{text!r}: use a duration like 1s, 500ms or 2")
    return float(match[1]) * _SCALE[match[2]]


@click.command("watch", help="Status, redrawn in place every --interval.")
@click.option("--interval", default="1s", show_default=True, help="time between redraws (1s, 500ms)")
@click.option(
    "--count", type=click.IntRange(min=0), default=0, help="stop after this many redraws (0: never)"
)
@click.option("--all", "all_", is_flag=True, help="include finished jobs")
@STATE_DIR
def watch(interval: str, count: int, all_: bool, state_dir: str | None) -> None:
    from rich.console import Group
    from rich.live import Live

    seconds = parse_interval(interval)
    target = _workstation(state_dir)
    request = standalone("protocol").Status(all=all_)

    def frame() -> Group:
        document = call(target, request)
        return Group(_daemon_line(document["daemon"]), *_status_tables(document))

    with Live(frame(), console=stdout_console(), auto_refresh=False) as live:
        shown = 1
        while count == 0 or shown < count:
            time.sleep(seconds)
            live.update(frame(), refresh=True)
            shown += 1


# ---- jobs ---------------------------------------------------------------------------------------


@click.group("jobs", help="List, describe, cancel and kill workstation jobs.")
def jobs() -> None:
    pass


@jobs.command("list", help="Jobs waiting or running (--all: finished ones too).")
@click.option("--all", "all_", is_flag=True, help="include COMPLETED, FAILED and CANCELLED jobs")
@STATE_DIR
@output_option
def jobs_list(all_: bool, state_dir: str | None, output: str) -> None:
    items = call(state_dir_of(state_dir), standalone("protocol").ListJobs(all=all_))
    emit(output, items, columns=_JOB_COLUMNS, rows=_job_rows(items))


@jobs.command("describe", help="One job: spec, placement, process, logs and its state history.")
@click.argument("job")
@STATE_DIR
@output_option
def jobs_describe(job: str, state_dir: str | None, output: str) -> None:
    item = call(state_dir_of(state_dir), standalone("protocol").Describe(job=job))
    if output != "table":
        emit(output, item)
        return
    keys = (
        "id",
        "name",
        "state",
        "reason",
        "priority",
        "effectivePriority",
        "command",
        "request",
        "checkpointable",
        "gpus",
        "pid",
        "attempt",
        "suspended",
        "exitCode",
        "logs",
    )
    emit(
        "table",
        item,
        columns=("FIELD", "VALUE"),
        rows=rows_of([{"k": k, "v": item.get(k)} for k in keys], ("k", "v")),
    )
    _emit_history(item["history"])


def _cancel(job: str, state_dir: str | None, force: bool) -> None:
    item = call(state_dir_of(state_dir), standalone("protocol").Cancel(job=job, force=force))
    click.echo(f"job {item['id']} ({item['name']}) {item['state']}: {item['reason']}")


@jobs.command("cancel", help="Cancel a job: SIGTERM, then SIGKILL after a grace period.")
@click.argument("job")
@STATE_DIR
def jobs_cancel(job: str, state_dir: str | None) -> None:
    _cancel(job, state_dir, False)


@jobs.command("kill", help="Kill a job at once (SIGKILL).")
@click.argument("job")
@STATE_DIR
def jobs_kill(job: str, state_dir: str | None) -> None:
    _cancel(job, state_dir, True)


@jobs.command("logs", help="The last lines a job wrote (stdout, or --stderr).")
@click.argument("job")
@click.option("--stderr", is_flag=True, help="show stderr instead of stdout")
@click.option("--tail", type=click.IntRange(1, 10_000), default=100, show_default=True)
@STATE_DIR
def jobs_logs(job: str, stderr: bool, tail: int, state_dir: str | None) -> None:
    out = call(
        state_dir_of(state_dir),
        standalone("protocol").Logs(job=job, stream="stderr" if stderr else "stdout", tail=tail),
    )
    for line in out["lines"]:
        click.echo(line)


@click.command("cancel", help="Cancel a job (the same as `jobs cancel`).")
@click.argument("job")
@STATE_DIR
def cancel(job: str, state_dir: str | None) -> None:
    _cancel(job, state_dir, False)


# ---- GPU holds (the cluster verbs' workstation form) ---------------------------------------------


def gpu_admin(state_dir: Path, verb: str, gpu_id: str, force: bool) -> int:
    """``drain``/``offline``/``online`` on the workstation daemon."""
    out = call(state_dir, standalone("protocol").GpuAdmin(gpu=gpu_id, action=verb, force=force))
    click.echo(out["message"])
    return 0
