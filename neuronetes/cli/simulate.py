"""``neuronetes simulate``: replay a pod trace (CSV files, or a live cluster's snapshot) through the
placement engine under each policy.

Everything the command line names is checked before the first seed is replayed (a replay takes
minutes): the policies, the seeds, the trace files, ``--compare``'s results file and the folders
``--json``, ``--plot`` and ``--save-trace`` write to. A bad one is a usage error (exit 2)."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import click

from neuronetes.engine.policy import POLICIES
from neuronetes.model import NodeSpec, PodRequest
from neuronetes.sim import report
from neuronetes.sim.simulate import RunResult, parse_seeds, summarise
from neuronetes.sim.simulate import simulate as simulate_one
from neuronetes.sim.trace import TraceError, load_nodes, load_pods

from .output import CliError, emit, output_option, progress

__all__ = ["simulate"]

Job = tuple[Sequence[NodeSpec], Sequence[PodRequest], str, int, float]


def _run_one(job: Job) -> RunResult:
    nodes, pods, policy, seed, tune = job
    return simulate_one(nodes, pods, policy, seed, tune)


def _policies(spec: str) -> list[str]:
    policies = [p.strip() for p in spec.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            raise click.BadParameter(
                f"unknown policy {p!r}; choose from {', '.join(POLICIES)}", param_hint="--policy"
            )
    if not policies:
        raise click.BadParameter("no policy given", param_hint="--policy")
    return policies


def _seeds(spec: str) -> list[int]:
    try:
        return parse_seeds(spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--seeds") from None


def _compare(directory: str, trace: str) -> dict[str, list[list[float]]]:
    """The paper's results for `trace`, read before the replay so that a bad --compare costs nothing."""
    try:
        return report.load_expected(directory, trace)
    except OSError as exc:
        raise click.BadParameter(
            f"{exc.filename or directory}: {exc.strerror or exc}", param_hint="--compare"
        ) from None
    except (KeyError, ValueError) as exc:
        raise click.BadParameter(
            f"{directory}/analysis_allo_discrete.csv is not the paper's results file ({exc})",
            param_hint="--compare",
        ) from None


def _writable(path: str | None, option: str, *, folder: bool = False) -> None:
    """Refuse, before the replay, a path the command could not write after it: an existing folder
    where a file goes (or a file where a folder goes), or a place under a file or without write access."""
    if not path:
        return
    target = Path(path)
    if target.exists() and target.is_dir() != folder:
        what = "a folder" if target.is_dir() else "a file"
        raise click.BadParameter(f"{path} is {what}", param_hint=option)
    ancestor = target if folder and target.is_dir() else target.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise click.BadParameter(f"{path}: {ancestor} is not a folder", param_hint=option)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{path}: cannot write in {ancestor}", param_hint=option)


def _load_trace(nodes: str | None, pods: str | None) -> tuple[list[NodeSpec], list[PodRequest]]:
    if not nodes or not pods:
        raise click.UsageError("give --nodes and --pods (CSV files), or --from-cluster")
    try:
        return load_nodes(nodes), load_pods(pods)
    except TraceError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        raise click.UsageError(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")) from None


def run_jobs(jobs: list[Job], workers: int, verbose: bool) -> list[RunResult]:
    """Every (policy, seed) replay, in `workers` processes, with a progress bar on a terminal."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    done: list[RunResult] = []
    with progress("replaying seeds", len(jobs)) as advance:
        if workers == 1:
            results = map(_run_one, jobs)
            for job, r in zip(jobs, results, strict=True):
                done.append(_report_one(job, r, verbose))
                advance(1)
        else:
            with ProcessPoolExecutor(workers) as pool:
                for job, r in zip(jobs, pool.map(_run_one, jobs), strict=True):
                    done.append(_report_one(job, r, verbose))
                    advance(1)
    return done


def _report_one(job: Job, r: RunResult, verbose: bool) -> RunResult:
    if verbose:
        click.echo(
            f"{job[2]:<11} seed {r.seed}: {r.seconds:6.1f}s  unallocated@100% {r.unallocated(100):6.2f}",
            err=True,
        )
    return r


def replay(
    trace: str,
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodRequest],
    policies: list[str],
    seeds: list[int],
    tune: float,
    workers: int,
    verbose: bool,
) -> dict[str, list[RunResult]]:
    jobs: list[Job] = [(nodes, pods, p, s, tune) for p in policies for s in seeds]
    results: dict[str, list[RunResult]] = {p: [] for p in policies}
    for job, r in zip(jobs, run_jobs(jobs, workers, verbose), strict=True):
        results[job[2]].append(r)
    return results


def results_document(trace: str, results: dict[str, list[RunResult]]) -> object:
    """What ``-o json`` prints and ``--json`` writes: per policy, each seed's unallocated GPU % at the
    report points (95, 100 and 130 % of the capacity arrived; not the whole curve, which only
    ``--plot`` draws) and their median over the seeds. One policy: its object; several: a list."""
    summaries = [summarise(trace, p, runs) for p, runs in results.items()]
    return summaries[0] if len(summaries) == 1 else summaries


@click.command(
    "simulate",
    short_help="Replay a trace (CSV files or the live cluster) under each policy.",
    help="Replay a pod trace through the placement engine (FGD protocol) under each policy: the "
    "CSV files of --nodes and --pods, or (--from-cluster) a snapshot of a live cluster's GPU nodes and "
    "GPU pods, to see how many GPUs each policy would leave unallocated there (docs/cli.md).",
)
@click.option("--nodes", metavar="CSV", help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
@click.option("--pods", metavar="CSV", help="pod list CSV (openb columns)")
@click.option(
    "--from-cluster", is_flag=True, help="snapshot the cluster's GPU nodes and pods instead of CSVs"
)
@click.option("--kubeconfig", help="--from-cluster: kubeconfig (default: in-cluster, else ~/.kube/config)")
@click.option("--save-trace", metavar="DIR", help="--from-cluster: also write the snapshot's two CSVs here")
@click.option(
    "--policy",
    default="default",
    show_default=True,
    help=f"policy or comma list: {', '.join(POLICIES)} (--from-cluster: all of them)",
)
@click.option("--seeds", default="42-51", show_default=True, help="seeds, e.g. 42-51 or 42,43")
@click.option(
    "--tune",
    type=click.FloatRange(min=0, min_open=True),
    default=1.3,
    show_default=True,
    help="inflate GPU requests to TUNE × capacity",
)
@click.option(
    "--json",
    "json_path",
    metavar="FILE",
    help="also write the results document (-o json) to FILE",
)
@click.option("--compare", metavar="DIR", help="folder with the paper's analysis_allo_discrete.csv")
@click.option("--plot", metavar="PNG", help="write an allocated-vs-arrived PNG here")
@click.option("--workers", type=click.IntRange(min=0), default=0, help="processes (default: CPU count)")
@click.option("-v", "--verbose", is_flag=True, help="one line per seed on stderr")
@output_option
def simulate(
    nodes: str | None,
    pods: str | None,
    from_cluster: bool,
    kubeconfig: str | None,
    save_trace: str | None,
    policy: str,
    seeds: str,
    tune: float,
    json_path: str | None,
    compare: str | None,
    plot: str | None,
    workers: int,
    verbose: bool,
    output: str,
) -> int:
    ctx = click.get_current_context()
    chosen = ctx.get_parameter_source("policy") is not click.core.ParameterSource.DEFAULT
    policies = _policies(policy) if chosen or not from_cluster else list(POLICIES)
    seed_list = _seeds(seeds)
    _writable(json_path, "--json")
    _writable(plot, "--plot")
    if plot and importlib.util.find_spec("matplotlib") is None:  # this machine's, not the command line's
        raise CliError("--plot needs matplotlib, which is not installed (pip install matplotlib)")
    if from_cluster:
        if nodes or pods:
            raise click.UsageError("--from-cluster replaces --nodes and --pods: give one or the other")
        _writable(save_trace, "--save-trace", folder=True)
        from .snapshot import snapshot_trace

        trace, node_specs, pod_specs = snapshot_trace(kubeconfig, save_trace)
    else:
        if kubeconfig or save_trace:
            raise click.UsageError("--kubeconfig and --save-trace go with --from-cluster")
        node_specs, pod_specs = _load_trace(nodes, pods)
        trace = Path(str(pods)).stem
    expected = _compare(compare, trace) if compare else None
    results = replay(trace, node_specs, pod_specs, policies, seed_list, tune, workers, verbose)
    document = results_document(trace, results)
    if output != "table":
        emit(output, document)
    else:
        click.echo(report.table(trace, results, expected))
        for p, runs in results.items():
            secs = [r.seconds for r in runs]
            click.echo(f"{p}: {len(runs)} seed(s), {min(secs):.1f}–{max(secs):.1f} s per seed")
        if from_cluster:
            from .snapshot import print_savings

            print_savings(results, sum(len(n.gpus) for n in node_specs))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(document, indent=2) + "\n")
    if plot:
        Path(plot).parent.mkdir(parents=True, exist_ok=True)
        report.plot(plot, trace, results, expected)
    return 0
