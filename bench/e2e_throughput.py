"""Pods/s through the real kube-scheduler with and without the NeuroNetes extender, on one kwok cluster.

One local control plane (`neuronetes.devcluster.DevCluster`, named ``bench-e2e-<pid>``) with
``--nodes`` simulated 8-GPU nodes (``--profile``, DGX A100 80GB by default). Two batches of
``--pods`` identical pods (``schedulerName: neuronetes-scheduler``, ``neuronetes.io/gpu: 1``,
100m CPU, 128Mi, tolerating the kwok taint), each in its own namespace, go through:

1. kube-scheduler calling the extender (filter, prioritize, bind, preempt; the extender runs as a
   separate ``neuronetes extender serve`` process, its GPU cache fed by list+watch);
2. kube-scheduler alone (the same ``neuronetes-scheduler`` profile, no extender; the extender
   process is stopped first, so it takes no CPU).

Before each run every node must be Ready and free of the ``node.kubernetes.io/not-ready`` taint
the API server gives new nodes (kube-controller-manager lifts it slowly; ``--lift-taints`` lifts
it here). The first batch stays bound during the second (the cluster has room for both), and the
runs go in this order so the extender never sees GPU pods bound without its assignment annotation.

How a batch is timed (``--mode``):

- ``backlog`` (default): kube-scheduler is stopped, the whole batch is created, then kube-scheduler
  is started (with or without the extender) and drains it. Throughput is (pods − 1) / (last bind
  − first bind), the bind times being when a watch on the namespace first sees ``spec.nodeName``:
  the scheduler's own rate, free of how fast this client creates pods and of the scheduler's
  start-up.
- ``stream``: kube-scheduler runs; the batch is created from a thread pool as fast as the API
  server takes it. Throughput is pods / (last bind − first create).

``added_ms_per_pod`` is 1000 / with − 1000 / without. The extender's own per-verb latency comes
from its ``neuronetes_scheduler_latency_seconds`` histogram (the difference of two scrapes around
the run), kube-scheduler's from its ``/metrics``, and the CPU seconds every process used during
each run from ``/proc``. The cluster is always torn down and purged, leaving no process.

``--nodes`` takes a comma-separated list (one fresh cluster per size, one summary line each).

A bind's time is printed in parts: the extender's bind handler, its Binding POST (the extender's
``neuronetes_scheduler_api_latency_seconds``), the API server's own ``POST pods/binding`` latency
(its ``apiserver_request_duration_seconds``, each run) and kube-scheduler's default binder in the
run without the extender. ``--profile-extender DIR`` samples the extender with py-spy during its
run and prints its CPU per pod by stage (`extender_profile`); ``--skip-without`` runs only the
batch through the extender.

After each backlog run, with kube-scheduler still running as it was, a steady-rate phase
(`steady.py`: ``--steady-pods`` pods at ``--steady-rate`` pods/s, 0 pods to skip it) measures
bind latency where binds do not queue behind a backlog: what a bind costs, not how long the
drain's queue was. Every run's pods stay bound, so the nodes must hold two backlogs and two
steady phases (1,000 + 200 pods of one GPU twice fit 300 DGX nodes).

The module's length is the benchmark's one flow (both runs, their figures, the printing); what
the cluster benchmarks share is in `kube_bench.py`.

    python bench/e2e_throughput.py --nodes 300,1000 --json OUT
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from neuronetes import contracts as c
from neuronetes.devcluster import DevCluster, ExtenderConfig
from neuronetes.devcluster.procs import interrupt_on
from neuronetes.profiles import PROFILES, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from extender_harness import ExtenderProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extender_profile import SpyRecorder, breakdown, format_breakdown
from kube_bench import (
    HOST,
    Api,
    binding_latency_ms,
    binding_latency_text,
    counters,
    cpu_delta,
    cpu_sample,
    cpus_in_use,
    create_pods,
    default_binder,
    delete_pods,
    gauge,
    histogram_deltas,
    histograms,
    list_nodes,
    log,
    node_taints,
    scheduler_metrics,
    scrape,
    stop_scheduler,
    sum_hists,
    wait_usable,
    watching,
)
from steady import run_steady

EXTENDER_LATENCY = c.METRIC_SCHEDULER_LATENCY
SCHEDULER_HISTOGRAMS = (
    "scheduler_scheduling_attempt_duration_seconds",
    "scheduler_scheduling_algorithm_duration_seconds",
    "scheduler_pod_scheduling_sli_duration_seconds",
)


# ---- the extender process --------------------------------------------------------------------


def start_extender(kubeconfig: Path, workdir: Path, config: Path | None, nodes: int) -> ExtenderProcess:
    """The extender in its own process, ready once its cache holds `nodes` nodes."""
    if config is None:
        config = workdir / "extender.json"
        config.write_text("{}\n")
    ext = ExtenderProcess(kubeconfig, workdir, config, host=HOST, log_level="warning")

    def cached() -> bool:
        return gauge(scrape(f"{ext.url}/metrics"), c.METRIC_CACHE_NODES) >= nodes

    ext.start(timeout=300, ready=cached)
    return ext


# ---- one run ---------------------------------------------------------------------------------


def start_profile(ns: argparse.Namespace, ext_proc: ExtenderProcess | None, nodes: int) -> SpyRecorder | None:
    """py-spy on the extender for this run (`--profile-extender`), or None."""
    if ns.profile_extender is None or ext_proc is None or ext_proc.proc is None:
        return None
    spy = SpyRecorder(ext_proc.proc.pid, ns.profile_extender / f"extender-{nodes}-nodes.txt")
    return spy if spy.start() else None


def run_batch(
    dev: DevCluster,
    api: Api,
    *,
    label: str,
    namespace: str,
    extender: ExtenderConfig | None,
    ext_proc: ExtenderProcess | None,
    ns: argparse.Namespace,
    nodes: int,
) -> dict[str, Any]:
    """Schedule one batch of `ns.pods` pods on `nodes` nodes; its figures (times in seconds,
    latencies in ms)."""
    log(f"{label}: namespace {namespace}, {ns.pods} pods, mode {ns.mode}")
    api.call(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    waited = wait_usable(api, nodes, ns.timeout, lift=ns.lift_taints, workers=ns.create_workers)
    if waited > 1:
        log(f"{label}: all {nodes} nodes usable after {waited:.0f} s")
    extra = {"extender": ext_proc.proc.pid} if ext_proc is not None and ext_proc.proc is not None else {}
    idle = cpus_in_use(dev, extra, 2.0)  # the cluster at rest: what `steady` waits to return to
    ext_before = scrape(f"{ext_proc.url}/metrics") if ext_proc is not None else None
    api_before = binding_latency_text(api)
    with watching(api, namespace, ns.pods) as watch:
        if ns.mode == "backlog":
            stop_scheduler(dev)
            first_create, create_s = create_pods(api, namespace, ns.pods, ns.gpus_per_pod, ns.create_workers)
            log(f"{label}: {ns.pods} pods created in {create_s:.1f} s, kube-scheduler stopped; starting it")
            spy = start_profile(ns, ext_proc, nodes)
            cpu0 = cpu_sample(dev, extra)
            t_start = time.monotonic()
            dev.set_extender(extender, timeout_s=120)
            t_ready = time.monotonic()
        else:
            dev.set_extender(extender, timeout_s=120)
            spy = start_profile(ns, ext_proc, nodes)
            cpu0 = cpu_sample(dev, extra)
            t_start = t_ready = time.monotonic()
            first_create, create_s = create_pods(api, namespace, ns.pods, ns.gpus_per_pod, ns.create_workers)
            log(f"{label}: {ns.pods} pods created in {create_s:.1f} s")
        if not watch.wait(ns.timeout):
            raise RuntimeError(
                f"{label}: only {len(watch.bound_at)} of {ns.pods} pods bound after {ns.timeout:.0f} s\n"
                + (f"extender log:\n{ext_proc.tail()}" if ext_proc is not None else "")
            )
        cpu1 = cpu_sample(dev, extra)
        recorded = spy.stop() if spy is not None else None
    api_after = binding_latency_text(api)
    usable_after, taints_after = node_taints(list_nodes(api))
    binds = sorted(watch.bound_at.values())
    first_bind, last_bind = binds[0], binds[-1]
    if ns.mode == "backlog":
        span = last_bind - first_bind
        pods_per_s = (ns.pods - 1) / span if span > 0 else math.inf
    else:
        span = last_bind - first_create
        pods_per_s = ns.pods / span
    out: dict[str, Any] = {
        "pods_per_s": round(pods_per_s, 2),
        "ms_per_pod": round(1000 / pods_per_s, 3),
        "measured_s": round(span, 3),
        "create_s": round(create_s, 3),
        "create_pods_per_s": round(ns.pods / create_s, 1),
        "scheduler_start_s": round(t_ready - t_start, 3),
        "start_to_first_bind_s": round(first_bind - t_start, 3),
        "start_to_last_bind_s": round(last_bind - t_start, 3),
        "nodes_used": len(set(watch.nodes.values())),
        "waited_for_taints_s": round(waited, 1),
        "usable_nodes_after": usable_after,
        "taints_after": taints_after,
        "cpu_s": cpu_delta(cpu0, cpu1),
        "apiserver_binding_ms": binding_latency_ms(api_before, api_after),
        "idle_cpus": round(idle, 3),
    }
    if recorded is not None:
        out["extender_profile"] = {
            "raw": str(recorded.raw),
            "cpu_s_by_stage": {k: round(v, 4) for k, v in breakdown(recorded).items()},
            "cpu_s_by_thread": recorded.cpu_by_thread,
            "system_s_by_thread": recorded.system_by_thread,
        }
    # kube-scheduler restarted for this run: its counters cover this batch (and nothing earlier).
    text = scheduler_metrics(dev, api.token)
    if text is not None:
        sched: dict[str, Any] = {}
        for metric in SCHEDULER_HISTOGRAMS:
            h = histograms(text, metric, profile=c.SCHEDULER_NAME) or histograms(text, metric)
            merged = sum_hists(h.values())
            if merged.count:
                sched[metric.removeprefix("scheduler_").removesuffix("_seconds") + "_ms"] = (
                    merged.summary_ms()
                )
        bind = default_binder(text)
        if bind.count:
            sched["bind_extension_point_ms"] = bind.summary_ms()
        sched["schedule_attempts"] = {
            k: int(v) for k, v in counters(text, "scheduler_schedule_attempts_total", "result").items()
        }
        out["kube_scheduler"] = sched
    if ext_proc is not None and ext_before is not None:
        after = scrape(f"{ext_proc.url}/metrics")
        verbs = histogram_deltas(ext_before, after, EXTENDER_LATENCY, "verb")
        out["extender_verbs_ms"] = {v: h.summary_ms() for v, h in verbs.items() if h.count}
        calls = histogram_deltas(ext_before, after, c.METRIC_API_LATENCY, "call")
        out["extender_api_ms"] = {k: h.summary_ms() for k, h in calls.items() if h.count}
        results = histogram_deltas(ext_before, after, EXTENDER_LATENCY, "result")
        out["extender_results"] = {r: int(h.count) for r, h in results.items() if h.count}
    log(f"{label}: {pods_per_s:.1f} pods/s ({span:.2f} s measured)")
    return out


# ---- the benchmark ---------------------------------------------------------------------------


def num(x: Any, width: int, digits: int = 2) -> str:
    return f"{x:>{width}.{digits}f}" if isinstance(x, int | float) else f"{'-':>{width}}"


def print_table(result: dict[str, Any]) -> None:
    runs = result["runs"]
    header = (
        f"{'run':<17} | {'pods/s':>8} {'ms/pod':>7} | {'measured s':>10} | {'create/s':>8} | "
        f"{'attempt p50':>11} {'p99':>7} | {'algorithm p50':>13} {'p99':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, r in runs.items():
        ks = r.get("kube_scheduler", {})
        att = ks.get("scheduling_attempt_duration_ms", {})
        alg = ks.get("scheduling_algorithm_duration_ms", {})
        print(
            f"{name:<17} | {num(r['pods_per_s'], 8, 1)} {num(r['ms_per_pod'], 7)} | "
            f"{num(r['measured_s'], 10)} | {num(r['create_pods_per_s'], 8, 0)} | "
            f"{num(att.get('p50'), 11)} {num(att.get('p99'), 7)} | "
            f"{num(alg.get('p50'), 13)} {num(alg.get('p99'), 7)}"
        )
    if result.get("repeat", 1) > 1:
        ratios = ", ".join(f"{r:.3f}" for r in result["ratios"])
        print(f"pairs: {result['repeat']}, ratios in order {ratios}; the median pair's figures follow")
    print(
        f"ratio {result['ratio']:.3f}  added {result['added_ms_per_pod']:.2f} ms/pod  "
        f"({result['nodes']} nodes, {result['pods']} pods per run, mode {result['mode']}; "
        "kube-scheduler latencies in ms)"
    )
    verbs = runs["with_extender"].get("extender_verbs_ms", {})
    if verbs:
        parts = [
            f"{v} n={s['count']} mean {num(s['mean'], 0)} p50 {num(s['p50'], 0)} p99 {num(s['p99'], 0)}"
            for v, s in verbs.items()
        ]
        print("extender verbs (ms, its own histogram): " + "; ".join(parts))
    names = sorted({k for r in runs.values() for k in r["cpu_s"]})
    cpu = "; ".join(f"{n} " + "/".join(f"{r['cpu_s'].get(n, 0.0):.1f}" for r in runs.values()) for n in names)
    print(f"CPU seconds during each run ({' / '.join(runs)}): {cpu}")
    print_binds(result)
    print_steady(result)
    profile = runs["with_extender"].get("extender_profile")
    if profile is not None:
        print(
            f"extender CPU by stage (threads' CPU shared by py-spy GIL samples; stacks in {profile['raw']}):"
        )
        for line in format_breakdown(profile["cpu_s_by_stage"], result["pods"]):
            print(line)
        threads = ", ".join(
            f"{tid}: {cpu:.2f} s ({profile['system_s_by_thread'].get(tid, 0.0):.2f} in the kernel)"
            for tid, cpu in sorted(profile["cpu_s_by_thread"].items(), key=lambda kv: -kv[1])
        )
        print(f"  CPU by thread (the first is the event loop's): {threads}")
    print(summary(result))


def print_binds(result: dict[str, Any]) -> None:
    """The extender's bind handler (its own histogram: from its body read to its answer, the API
    call included) beside kube-scheduler's default binder in the run without the extender (the
    same API server, the same load: how long a Binding takes there without us)."""
    runs = result["runs"]
    ours = runs["with_extender"].get("extender_verbs_ms", {}).get("bind", {})
    api = runs["with_extender"].get("extender_api_ms", {}).get("binding", {})
    default = runs.get("without_extender", {}).get("kube_scheduler", {}).get("bind_extension_point_ms", {})
    parts = [f"extender bind handler p50 {num(ours.get('p50'), 0)} p99 {num(ours.get('p99'), 0)}"]
    if api:
        parts.append(f"of which its Binding POST p50 {num(api.get('p50'), 0)} p99 {num(api.get('p99'), 0)}")
    parts.append(
        f"kube-scheduler's default binder (run without) mean {num(default.get('mean'), 0)} "
        f"p50 {quantile_text(default, 'p50')} p99 {quantile_text(default, 'p99')}"
    )
    for name, r in runs.items():
        inside = r.get("apiserver_binding_ms") or {}
        parts.append(
            f"inside the API server ({name}) mean {num(inside.get('mean'), 0)} "
            f"p50 {quantile_text(inside, 'p50')} p99 {quantile_text(inside, 'p99')}"
        )
    print("bind (ms): " + "; ".join(parts))


def print_steady(result: dict[str, Any]) -> None:
    """The steady-rate phases (`steady.py`): bind latency when binds do not queue behind a backlog."""
    for name, r in result["runs"].items():
        s = r.get("steady")
        if not s:
            continue
        c2b, bind, inside = s["create_to_bound_ms"], s["bind_ms"], s["apiserver_binding_ms"] or {}
        which = "extender bind handler" if "binding_post_ms" in s else "kube-scheduler's default binder"
        parts = [
            f"create→bound p50 {num(c2b['p50'], 0)} p99 {num(c2b['p99'], 0)} max {num(c2b['max'], 0)}",
            f"{which} {quantiles(bind)}",
        ]
        if "binding_post_ms" in s:
            post = s["binding_post_ms"]
            parts.append(f"its Binding POST {quantiles(post)}")
        parts.append(f"inside the API server {quantiles(inside)}")
        print(
            f"steady {name} ({s['pods']} pods at {s['rate_achieved']} of {s['rate_asked']:g} pods/s; ms): "
            + "; ".join(parts)
        )


def quantiles(summary: dict[str, Any]) -> str:
    return f"p50 {quantile_text(summary, 'p50')} p99 {quantile_text(summary, 'p99')}"


def quantile_text(summary: dict[str, Any], q: str) -> str:
    """A quantile in ms, or "> B" when it lies past the histogram's last finite bucket B."""
    value = summary.get(q)
    if value is None:
        return "-"
    return f"> {value:.0f}" if summary.get(f"{q}_beyond") else f"{value:.0f}"


def steady(
    dev: DevCluster,
    api: Api,
    ns: argparse.Namespace,
    label: str,
    namespace: str,
    ext: ExtenderProcess | None,
    idle: float,
) -> dict[str, Any]:
    """The steady-rate phase after a backlog run (`steady.run_steady`), kube-scheduler still running."""
    return run_steady(
        dev,
        api,
        label=label,
        namespace=namespace,
        count=ns.steady_pods,
        rate=ns.steady_rate,
        gpus=ns.gpus_per_pod,
        extender_url=ext.url if ext is not None else None,
        extra={"extender": ext.proc.pid} if ext is not None and ext.proc is not None else {},
        idle=idle,
        timeout=ns.timeout,
    )


def one_pair(
    dev: DevCluster, api: Api, ns: argparse.Namespace, nodes: int, workdir: Path, rep: int, procs: list[Any]
) -> dict[str, Any]:
    """Pair `rep`: a fresh extender, the backlog run through it (then its steady phase), the extender
    stopped, the backlog run without it (then its steady phase); the pair's figures."""
    suffix = f"-{rep}" if ns.repeat > 1 else ""
    ext_proc = start_extender(dev.kubeconfig, workdir, ns.extender_config, nodes)
    procs.append(ext_proc)
    log(f"pair {rep + 1}/{ns.repeat}: extender at {ext_proc.url} ready with {nodes} nodes cached")
    with_ext = run_batch(
        dev,
        api,
        label="with extender",
        namespace=f"bench-with{suffix}",
        extender=ExtenderConfig(url=ext_proc.url),
        ext_proc=ext_proc,
        ns=ns,
        nodes=nodes,
    )
    if ns.steady_pods:
        with_ext["steady"] = steady(
            dev, api, ns, "with extender", f"bench-with-steady{suffix}", ext_proc, with_ext["idle_cpus"]
        )
    ext_proc.stop()
    runs = {"with_extender": with_ext}
    if not ns.skip_without:
        without = runs["without_extender"] = run_batch(
            dev,
            api,
            label="without extender",
            namespace=f"bench-without{suffix}",
            extender=None,
            ext_proc=None,
            ns=ns,
            nodes=nodes,
        )
        if ns.steady_pods:
            without["steady"] = steady(
                dev, api, ns, "without extender", f"bench-without-steady{suffix}", None, without["idle_cpus"]
            )
    w = with_ext["pods_per_s"]
    wo = runs["without_extender"]["pods_per_s"] if "without_extender" in runs else math.nan
    extender_cpu_s = with_ext["cpu_s"].get("extender")
    return {
        "with_extender_pods_per_s": w,
        "without_extender_pods_per_s": wo,
        "ratio": round(w / wo, 4),
        "added_ms_per_pod": round(1000 / w - 1000 / wo, 3),
        "extender_cpu_ms_per_pod": (
            round(1000 * extender_cpu_s / ns.pods, 3) if extender_cpu_s is not None else None
        ),
        "extender_verbs_ms": with_ext.get("extender_verbs_ms", {}),
        "runs": runs,
        "namespaces": [
            f"bench-with{suffix}",
            f"bench-with-steady{suffix}",
            f"bench-without{suffix}",
            f"bench-without-steady{suffix}",
        ],
    }


def median_pair(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """The pair whose ratio is the median (the lower middle one for an even count)."""
    ranked = sorted(pairs, key=lambda p: (math.isnan(p["ratio"]), p["ratio"]))
    return ranked[(len(ranked) - 1) // 2]


def measure(ns: argparse.Namespace, nodes: int) -> dict[str, Any] | None:
    """One cluster of `nodes` nodes, `ns.repeat` pairs of runs; None when processes were left behind."""
    dev = DevCluster(f"bench-e2e-{os.getpid()}-{nodes}", log=log)
    workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    started: list[ExtenderProcess] = []
    leftover: list[int] = []
    t_total = time.monotonic()
    try:
        seconds = dev.up(
            controller_manager=False if ns.no_controller_manager else None,
            apiserver_args=ns.apiserver_arg,
        )
        log(f"cluster {dev.name} up in {seconds:.1f} s ({dev.state_dir})")
        t0 = time.monotonic()
        for start in range(0, nodes, 250):
            dev.add_nodes(ns.profile, min(250, nodes - start), "gpu")
        log(f"{nodes} {ns.profile} nodes Ready in {time.monotonic() - t0:.1f} s")
        api = Api(dev)
        pairs = []
        for rep in range(ns.repeat):
            pair = one_pair(dev, api, ns, nodes, workdir, rep, started)
            pairs.append(pair)
            if rep + 1 < ns.repeat:  # the next pair starts on an empty cluster
                gone_s = delete_pods(api, pair.pop("namespaces"), ns.timeout)
                log(f"pair {rep + 1}: its pods deleted in {gone_s:.1f} s")
            else:
                pair.pop("namespaces")
        result: dict[str, Any] = {
            **median_pair(pairs),
            "nodes": nodes,
            "pods": ns.pods,
            "profile": ns.profile,
            "gpus_per_pod": ns.gpus_per_pod,
            "mode": ns.mode,
            "controller_manager": not ns.no_controller_manager,
            "lifted_taints": ns.lift_taints,
            "cpus": os.cpu_count(),
            "repeat": ns.repeat,
            "ratios": [p["ratio"] for p in pairs],
            "pairs": pairs,
        }
    finally:
        for ext_proc in started:
            ext_proc.stop()
        dev.down()
        leftover = dev.leftover_processes()
        if ns.logs is not None:
            logs = ns.logs / str(nodes)
            logs.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copytree(dev.log_dir, logs / "cluster", dirs_exist_ok=True)
            for extender_log in workdir.glob("extender*.log"):  # one per start of the extender
                with contextlib.suppress(OSError):
                    shutil.copy2(extender_log, logs / extender_log.name)
        dev.purge()
        shutil.rmtree(workdir, ignore_errors=True)
        log(f"cluster {dev.name} down and purged after {time.monotonic() - t_total:.0f} s")
    if leftover:
        print(f"error: processes of {dev.name} left after down: {leftover}", file=sys.stderr)
        return None
    result["seconds"] = round(time.monotonic() - t_total, 1)
    return result


def node_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of node counts: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("node counts must be >= 1")
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--nodes", type=node_counts, default=[1000], help="GPU node counts, comma-separated (default 1000)"
    )
    ap.add_argument("--pods", type=int, default=1000, help="pods per backlog run (default 1000)")
    ap.add_argument(
        "--steady-pods",
        type=int,
        default=200,
        help="pods of the steady-rate phase after each backlog run (default 200; 0: no such phase)",
    )
    ap.add_argument(
        "--steady-rate", type=float, default=50.0, help="the steady phase's arrival rate, pods/s (default 50)"
    )
    ap.add_argument("--profile", default="dgx-a100-80gb", choices=sorted(PROFILES), help="node profile")
    ap.add_argument("--gpus-per-pod", type=int, default=1)
    ap.add_argument("--mode", choices=("backlog", "stream"), default="backlog", help="how a batch is timed")
    ap.add_argument("--create-workers", type=int, default=8, help="threads creating pods")
    ap.add_argument("--extender-config", type=Path, help="the extender's settings file (default: built-in)")
    ap.add_argument(
        "--no-controller-manager",
        action="store_true",
        help="run without kube-controller-manager (implies --lift-taints)",
    )
    ap.add_argument(
        "--lift-taints",
        action="store_true",
        help="lift the new nodes' not-ready taints here instead of waiting for kube-controller-manager",
    )
    ap.add_argument(
        "--apiserver-arg", action="append", default=[], help="extra kube-apiserver flag (repeatable)"
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one batch may take to bind")
    ap.add_argument(
        "--logs", type=Path, help="copy the cluster's and the extender's logs here (per size) before purging"
    )
    ap.add_argument("--json", type=Path, help="write the results here (a list, one per size)")
    ap.add_argument(
        "--profile-extender",
        type=Path,
        metavar="DIR",
        help="sample the extender with py-spy during its run; print its CPU by stage (raw stacks in DIR)",
    )
    ap.add_argument(
        "--skip-without", action="store_true", help="only the run through the extender (no ratio)"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="pairs of runs (with the extender, then without) per size; the median pair prints (default 3)",
    )
    ns = ap.parse_args()
    ns.lift_taints = ns.lift_taints or ns.no_controller_manager
    prof = profile(ns.profile)
    if ns.pods < 2:
        ap.error("--pods must be >= 2")
    if ns.repeat < 1:
        ap.error("--repeat must be >= 1")
    if ns.steady_pods < 0 or ns.steady_rate <= 0:
        ap.error("--steady-pods must be >= 0 and --steady-rate > 0")
    for nodes in ns.nodes:
        if prof.gpu_count * nodes < 2 * (ns.pods + ns.steady_pods) * ns.gpus_per_pod:
            batches = f"two runs of {ns.pods} + {ns.steady_pods} pods × {ns.gpus_per_pod} GPU"
            ap.error(f"{nodes} × {prof.gpu_count} GPUs cannot hold {batches}")

    interrupt_on(signal.SIGTERM, signal.SIGHUP)  # the cluster is still torn down (finally)
    results = []
    for nodes in ns.nodes:
        result = measure(ns, nodes)
        if result is None:
            return 1
        print_table(result)
        results.append(result)
    if len(results) > 1:
        print("summary: " + "; ".join(summary(r) for r in results))
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def summary(result: dict[str, Any]) -> str:
    bind = result["extender_verbs_ms"].get("bind", {})
    return (
        f"{result['nodes']} nodes: {result['with_extender_pods_per_s']:.1f} vs "
        f"{result['without_extender_pods_per_s']:.1f} pods/s, ratio {result['ratio']:.2f}"
        + (
            f" (median of {', '.join(f'{r:.2f}' for r in result['ratios'])})"
            if result.get("repeat", 1) > 1
            else ""
        )
        + ", "
        f"bind p50 {num(bind.get('p50'), 0)} p99 {num(bind.get('p99'), 0)} ms, "
        f"extender CPU {num(result['extender_cpu_ms_per_pod'], 0)} ms/pod" + steady_summary(result)
    )


def steady_summary(result: dict[str, Any]) -> str:
    steady = result["runs"]["with_extender"].get("steady")
    if not steady:
        return ""
    bind = steady["bind_ms"]
    without = result["runs"].get("without_extender", {}).get("steady", {}).get("bind_ms", {})
    return (
        f", at {steady['rate_asked']:g} pods/s bind p50 {quantile_text(bind, 'p50')} "
        f"p99 {quantile_text(bind, 'p99')} ms (default binder p99 {quantile_text(without, 'p99')})"
    )


if __name__ == "__main__":
    sys.exit(main())
