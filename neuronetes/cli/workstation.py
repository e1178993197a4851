"""Workstation mode in the CLI: reaching the daemon, running it, and its verbs.

- the reach: `target_state_dir` is the ONE rule for the verbs that exist for a cluster and a
  workstation (``status``, ``health``, ``drain``, ``offline``, ``online``; docs/workstation.md,
  "CLI"); `call` sends one request to the daemon over its socket in the state directory;
- the daemon: ``agent run --workstation`` takes `WORKSTATION_OPTIONS` and runs `run_workstation`;
- the verbs: ``submit``, ``jobs …``, ``cancel``, ``watch``, and the workstation side of ``status``,
  ``health``, ``drain``, ``offline``, ``online`` (`neuronetes.cli.cluster`). Specs are validated here
  with the daemon's own rules before anything is sent, so a bad priority or size is refused even
  when no daemon runs.

One module for the one mode (about 600 lines): the verbs' tables, the daemon's options and the
reach change together. The workstation package (`neuronetes_agent.workstation`) is imported inside
the functions that use it: ``neuronetes --help`` and the cluster verbs never load it.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import click

from .output import CliError, emit, output_option, rows_of, stdout_console
from .root import group

if TYPE_CHECKING:
    from neuronetes_agent.workstation.protocol import GpuAction, Request

__all__ = [
    "STATE_DIR",
    "WORKSTATION_KEYS",
    "WORKSTATION_OPTIONS",
    "call",
    "cancel",
    "gpu_admin",
    "jobs",
    "no_daemon_either",
    "run_workstation",
    "show_health",
    "show_status",
    "state_dir_of",
    "submit",
    "target_state_dir",
    "watch",
]

STATE_DIR = click.option(
    "--state-dir",
    metavar="DIR",
    help="the workstation daemon's state directory (default: $NEURONETES_STATE_DIR, else "
    "$XDG_STATE_HOME/neuronetes)",
)


# ---- reaching the daemon -------------------------------------------------------------------------


def target_state_dir(option: str | None, kubeconfig: str | None = None) -> Path | None:
    """THE target rule for verbs that exist for both: the workstation's state directory, or None
    for the cluster. In order: ``--state-dir`` → workstation; ``--kubeconfig`` → cluster;
    ``$NEURONETES_STATE_DIR`` set → workstation; a daemon answering in the default state
    directory → workstation; otherwise the cluster."""
    from neuronetes_agent.workstation import client

    if option:
        return Path(option).expanduser()
    if kubeconfig:
        return None
    path, named = client.state_dir_from(None)
    return path if named or client.daemon_live(path) else None


def no_daemon_either() -> str:
    """What a cluster verb adds to a kubeconfig error when the target rule fell through to the
    cluster: the workstation it tried first, and how to start a daemon there."""
    from neuronetes_agent.workstation import client

    path = client.state_dir_from(None)[0]
    return (
        f"the target was the cluster: no --state-dir, no $NEURONETES_STATE_DIR and no workstation "
        f"daemon answers in {path} (start one: neuronetes agent run --workstation)"
    )


def state_dir_of(option: str | None) -> Path:
    from neuronetes_agent.workstation import client

    return client.state_dir_from(option)[0]


def call(state_dir: Path, request: Request) -> Any:
    """The daemon's answer to `request` (its JSON result), or CliError with its one-line error."""
    from neuronetes_agent.workstation import client, protocol

    reply = client.call(state_dir, request)
    if isinstance(reply, protocol.Err):
        raise CliError(reply.message)
    return reply.result


# ---- the daemon (`agent run --workstation`) -----------------------------------------------------

_WORKSTATION: Final = (
    click.option("--simulate-gpus", type=click.IntRange(1, 8), help="--workstation: simulate N GPUs"),
    click.option(
        "--utilization-cap", type=click.FloatRange(1, 90), help="--workstation: admission cap, percent (85)"
    ),
    click.option(
        "--headroom", type=click.FloatRange(0, 89), help="--workstation: safety headroom, percent (5)"
    ),
    click.option(
        "--aging-seconds",
        type=click.FloatRange(min=0, min_open=True),
        help="--workstation: a waiting job gains one priority point per this many seconds (60)",
    ),
    click.option(
        "--checkpoint-deadline",
        type=click.FloatRange(min=0, min_open=True),
        help="--workstation: seconds a --checkpointable job has to exit after SIGUSR1 (30)",
    ),
    click.option(
        "--cuda-driver", metavar="PATH", help="--workstation: the CUDA driver library (libcuda.so.1)"
    ),
    click.option(
        "--containment",
        type=click.Choice(["auto", "cgroup2", "cgroup1", "subreaper"]),
        help="--workstation: how each attempt is contained (auto: the first usable cgroup, else subreaper)",
    ),
    click.option(
        "--log-max-size",
        metavar="SIZE",
        help="--workstation: each job log is rotated to one .1 file at this size (64Mi; at least 1Mi)",
    ),
    click.option(
        "--max-clients",
        type=click.IntRange(1, 1024),
        help="--workstation: connections served at once; one more gets a busy reply (16)",
    ),
)
WORKSTATION_KEYS: Final = (
    "simulate_gpus",
    "utilization_cap",
    "headroom",
    "aging_seconds",
    "checkpoint_deadline",
    "cuda_driver",
    "containment",
    "log_max_size",
    "max_clients",
)


def WORKSTATION_OPTIONS(func: Any) -> Any:  # a decorator, named like the other option constants
    for option in reversed(_WORKSTATION):
        func = option(func)
    return func


def run_workstation(state_dir: str | None, shim_library: str | None, log_level: str, **opts: Any) -> int:
    """Run the workstation daemon until SIGTERM/SIGINT."""
    from neuronetes_agent.workstation.jobs import parse_size
    from neuronetes_agent.workstation.main import DaemonOptions, run_daemon
    from neuronetes_agent.workstation.server import check_socket_path

    given = {k: v for k, v in opts.items() if v is not None}
    directory = state_dir_of(state_dir)
    try:  # the daemon's checks of its own command line: a bad one is a usage error (exit 2)
        if "log_max_size" in given:
            parse_size(given["log_max_size"], "--log-max-size")
        if shim_library and not Path(shim_library).is_file():  # an input file named on the line
            raise ValueError(f"--shim-library {shim_library}: no such file")
        check_socket_path(directory)
    except ValueError as exc:  # jobs.SpecError is one
        raise click.UsageError(str(exc)) from None
    return run_daemon(
        DaemonOptions(
            state_dir=directory,
            shim_library=Path(shim_library) if shim_library else None,
            log_level=log_level,
            **given,
        )
    )


# ---- the verbs' tables ---------------------------------------------------------------------------

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


@click.command(
    "submit",
    help="Queue a job on the workstation (docs/workstation.md). A command run directly must be found "
    "(on PATH, or an executable path) or it is refused here.",
)
@click.option(
    "--cmd", "command", required=True, help="the command line (run by /bin/sh if it uses its syntax)"
)
@click.option(
    "--priority",
    type=int,
    default=0,
    show_default=True,
    help="0-1000; higher runs first and may preempt lower (0, the lowest, preempts nothing)",
)
@click.option(
    "--name", default="", help="a name to refer to the job by (lower-case, digits, . _ -; not j<number>)"
)
@click.option("--gpus", type=int, default=None, help="whole GPUs, exclusively, 1-16 (default 1)")
@click.option(
    "--gpu-memory", default="", metavar="SIZE", help="a GPU share: memory (8Gi, 512Mi; at least 1Mi)"
)
@click.option(
    "--gpu-compute",
    type=int,
    default=None,
    metavar="PCT",
    help="a GPU share: compute percent (1-100; default: the share's part of the GPU's memory, rounded up)",
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
    from neuronetes_agent.workstation import jobs, protocol
    from neuronetes_agent.workstation.commands import missing_program

    if gpus is not None and (gpu_memory or gpu_compute is not None):
        raise click.UsageError("give either --gpus or a share (--gpu-memory and --gpu-compute), not both")
    if gpu_compute is not None and not gpu_memory:
        raise click.UsageError("--gpu-compute needs --gpu-memory (a share names both)")
    whole = 1 if gpus is None else gpus  # --gpus 0 stays 0: the spec refuses it
    try:  # the daemon's own rules, checked before anything is sent (a share's default is its own)
        memory = jobs.parse_size(gpu_memory, "--gpu-memory") if gpu_memory else 0
        compute = gpu_compute if gpu_compute is not None else (1 if memory else 100)
        jobs.JobSpec(command, priority, name, whole, memory, compute, checkpointable).check_new()
    except jobs.SpecError as exc:  # a bad value on the command line: usage (exit 2)
        raise click.UsageError(str(exc)) from None
    missing = missing_program(command, os.getcwd(), os.environ.get("PATH", os.defpath))
    if missing:
        raise CliError(missing)
    request = protocol.Submit(
        command=command,
        priority=priority,
        name=name,
        gpus=whole,
        gpu_memory=gpu_memory,
        gpu_compute=gpu_compute,
        checkpointable=checkpointable,
        workdir=os.getcwd(),
    )
    job = call(state_dir_of(state_dir), request)
    if output == "table":
        asked = _request_text(job["request"], gpu_compute is None)
        click.echo(f"job {job['id']} ({job['name']}) {job['state']}: {asked}, priority {job['priority']}")
    else:
        emit(output, job)


def _request_text(request: dict[str, Any], compute_defaulted: bool = False) -> str:
    """What a job asked for: ``1 GPU`` or ``8.0 GiB, 10 % compute`` (``submit``, ``jobs describe``)."""
    if "gpus" in request:
        return f"{request['gpus']} GPU" + ("s" if request["gpus"] != 1 else "")
    default = " (default: the share's part of the GPU's memory)" if compute_defaulted else ""
    return f"{request['gpuMemoryBytes'] / 2**30:.1f} GiB, {request['gpuComputePercent']} % compute{default}"


# ---- status, health, watch -----------------------------------------------------------------------


def _workstation(option: str | None) -> Path:
    """The state directory of `watch` (a workstation-only view): as the target rule picks it, or the
    no-daemon line."""
    from neuronetes_agent.workstation import protocol

    target = target_state_dir(option)
    if target is not None:
        return target
    path = state_dir_of(option)
    call(path, protocol.Ping())  # nobody answers there: raises the one-line error
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
    from neuronetes_agent.workstation import protocol

    document = call(state_dir, protocol.Status(all=all_))
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
    from neuronetes_agent.workstation import protocol

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

    from neuronetes_agent.workstation import protocol

    seconds = parse_interval(interval)
    target = _workstation(state_dir)
    request = protocol.Status(all=all_)

    def frame() -> Group:
        document = call(target, request)
        return Group(_daemon_line(document["daemon"]), *_status_tables(document))

    console = stdout_console()
    if not console.is_terminal:  # a pipe or a file: whole frames one after another, no cursor moves
        shown = 0
        while count == 0 or shown < count:
            if shown:
                time.sleep(seconds)
            console.print(frame())
            console.file.flush()
            shown += 1
        return
    with Live(frame(), console=console, auto_refresh=False) as live:
        shown = 1
        while count == 0 or shown < count:
            time.sleep(seconds)
            live.update(frame(), refresh=True)
            shown += 1


# ---- jobs ---------------------------------------------------------------------------------------


@group("jobs", help="List, describe, cancel and kill workstation jobs.")
def jobs() -> None:
    pass


@jobs.command("list", help="Jobs waiting or running (--all: finished ones too).")
@click.option("--all", "all_", is_flag=True, help="include COMPLETED, FAILED and CANCELLED jobs")
@STATE_DIR
@output_option
def jobs_list(all_: bool, state_dir: str | None, output: str) -> None:
    from neuronetes_agent.workstation import protocol

    items = call(state_dir_of(state_dir), protocol.ListJobs(all=all_))
    emit(output, items, columns=_JOB_COLUMNS, rows=_job_rows(items))


@jobs.command("describe", help="One job: spec, placement, process, logs and its state history.")
@click.argument("job")
@STATE_DIR
@output_option
def jobs_describe(job: str, state_dir: str | None, output: str) -> None:
    from neuronetes_agent.workstation import protocol

    item = call(state_dir_of(state_dir), protocol.Describe(job=job))
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
        rows=rows_of([{"k": k, "v": _value(k, item)} for k in keys], ("k", "v")),
    )
    _emit_history(item["history"])


def _value(key: str, job: dict[str, Any]) -> str | None:
    """One field of `jobs describe` as a person reads it (None: shown as "-")."""
    value: Any = job.get(key)  # the job object's JSON (docs/workstation.md, "Protocol")
    if key == "request":
        return _request_text(value)
    if key == "logs":
        return f"{value['stdout']} (stdout), {value['stderr']} (stderr)" if value else None
    if key == "gpus":
        return ", ".join(value) or None
    if isinstance(value, bool):
        return "yes" if value else "no"
    return None if value is None or value == "" else str(value)


def _cancel(job: str, state_dir: str | None, force: bool) -> None:
    from neuronetes_agent.workstation import protocol

    item = call(state_dir_of(state_dir), protocol.Cancel(job=job, force=force))
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


_FOLLOW_S: Final = 0.5  # how often `jobs logs -f` asks for more


@jobs.command(
    "logs", help="The last lines a job wrote (stdout, or --stderr); -f: then follow it until it ends."
)
@click.argument("job")
@click.option("--stderr", is_flag=True, help="show stderr instead of stdout")
@click.option("--tail", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("-f", "--follow", is_flag=True, help="keep printing what the job writes until it has ended")
@STATE_DIR
def jobs_logs(job: str, stderr: bool, tail: int, follow: bool, state_dir: str | None) -> None:
    from neuronetes_agent.workstation import jobs as job_states
    from neuronetes_agent.workstation import protocol

    target = state_dir_of(state_dir)
    stream: Literal["stdout", "stderr"] = "stderr" if stderr else "stdout"
    out = call(target, protocol.Logs(job=job, stream=stream, tail=tail))
    for line in out["lines"]:
        click.echo(line)
    final = {s.value for s in job_states.FINAL}
    while follow:
        # by its id (a name may pass to a newer job); the state is read before the data, so a final
        # state with nothing new means nothing more comes
        more = call(target, protocol.Logs(job=out["job"], stream=stream, after=out["offset"]))
        if more["data"]:
            click.echo(more["data"], nl=False)
            sys.stdout.flush()
        elif more["state"] in final:
            return
        else:
            time.sleep(_FOLLOW_S)
        out = more


@click.command("cancel", help="Cancel a job (the same as `jobs cancel`).")
@click.argument("job")
@STATE_DIR
def cancel(job: str, state_dir: str | None) -> None:
    _cancel(job, state_dir, False)


# ---- GPU holds (the cluster verbs' workstation form) ---------------------------------------------


def gpu_admin(state_dir: Path, verb: GpuAction, gpu_id: str, force: bool) -> int:
    """``drain``/``offline``/``online`` on the workstation daemon."""
    from neuronetes_agent.workstation import protocol

    out = call(state_dir, protocol.GpuAdmin(gpu=gpu_id, action=verb, force=force))
    click.echo(out["message"])
    return 0
