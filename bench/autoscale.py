"""Token/queue-driven autoscaling of an LLM inference pool against today's autoscalers, simulated.

One run compares, on the same workloads and the same replica model (bench/autoscale_sim/server.py:
vLLM continuous batching with chunked prefill and a KV-token budget, a 60 s cold start, parameters
from published Llama-3.1-8B / A100 measurements), the Kubernetes HPA on num_requests_waiting, the
vLLM production stack's KEDA pattern, AIBrix's APA and ours (neuronetes.autoscale.TokenAutoscaler),
each as its project documents it (bench/autoscale_sim/policies.py). Workloads: the Azure LLM
inference trace (conversation; CC-BY 4.0, Patel et al., Splitwise, ISCA 2024), time-compressed and
rate-scaled, and a seeded synthetic ramp. Per policy and workload it prints TTFT p50/p95/p99, SLO
attainment, replica-seconds, scale events and reversals, then a verdict line per workload.

    python bench/autoscale.py [--azure-trace PATH] [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autoscale_sim.policies import Policy, baselines, ours_policy
from autoscale_sim.run import REVERSAL_WINDOW_S, simulate, summarise, verdict
from autoscale_sim.server import ServerModel
from autoscale_sim.workloads import Workload, azure_trace, ramp

AZURE_TRACE = Path(__file__).resolve().parent / "data" / "azure-llm" / "AzureLLMInferenceTrace_conv.csv"

START_RPS_PER_REPLICA = 4.0  # about 80 % of what one replica sustains at the trace's median shape


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--azure-trace",
        type=Path,
        default=AZURE_TRACE,
        help="AzureLLMInferenceTrace_conv.csv (default: the copy in bench/data/azure-llm, CC-BY 4.0)",
    )
    parser.add_argument("--time-compress", type=float, default=1.0, help="divide the trace's arrival offsets")
    parser.add_argument("--rate-scale", type=float, default=6.0, help="multiply the trace's request rate")
    parser.add_argument(
        "--slo-ttft", type=float, default=2.0, help="TTFT objective, seconds (SLO attainment)"
    )
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--max-replicas", type=int, default=32)
    parser.add_argument(
        "--initial-replicas",
        type=int,
        default=0,
        help="replicas warm at the start; 0: what the first minute's arrivals need at "
        f"{START_RPS_PER_REPLICA:g} req/s a replica (the same for every policy)",
    )
    parser.add_argument("--cold-start", type=float, default=ServerModel().cold_start_s)
    parser.add_argument("--prefill-tps", type=float, default=ServerModel().prefill_tokens_per_s)
    parser.add_argument("--scrape", type=float, default=5.0, help="seconds between metric scrapes")
    parser.add_argument("--dt", type=float, default=0.1, help="simulation tick, seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default="hpa,keda,aibrix-apa,ours")
    parser.add_argument("--quick", action="store_true", help="a few minutes of each workload (the unit test)")
    parser.add_argument("--json", type=Path, help="write every figure, event and timeline here")
    args = parser.parse_args(argv)
    if args.time_compress <= 0 or args.rate_scale <= 0 or args.dt <= 0 or args.scrape <= 0:
        parser.error("--time-compress, --rate-scale, --dt and --scrape must be positive")
    if not 1 <= args.min_replicas <= args.max_replicas or args.initial_replicas > args.max_replicas:
        parser.error("need 1 <= --min-replicas <= --max-replicas and --initial-replicas <= --max-replicas")
    if args.azure_trace is not None and not args.azure_trace.is_file():
        parser.error(f"--azure-trace {args.azure_trace}: no such file")
    return args


def workloads(args: argparse.Namespace) -> list[Workload]:
    found = []
    if args.azure_trace is not None:
        limit = 600.0 if args.quick else None
        found.append(azure_trace(args.azure_trace, args.time_compress, args.rate_scale, args.seed, limit))
    phases = (60.0, 120.0, 120.0, 120.0, 120.0) if args.quick else (300.0, 600.0, 600.0, 600.0, 600.0)
    found.append(ramp(args.seed, phases_s=phases))
    return found


def policies(args: argparse.Namespace, model: ServerModel) -> tuple[list[Policy], list[str]]:
    wanted = [p.strip() for p in args.policies.split(",") if p.strip()]
    made: list[Policy] = [p for p in baselines(args.min_replicas, args.max_replicas) if p.name in wanted]
    notes = []
    if "ours" in wanted:
        ours = ours_policy(model, args.slo_ttft, args.min_replicas, args.max_replicas)
        if isinstance(ours, str):
            notes.append(f"ours: skipped: {ours}")
        else:
            made.append(ours)
    return made, notes


def initial_replicas(workload: Workload) -> int:
    first_minute = sum(1 for r in workload.requests if r.arrival < 60.0) / 60.0
    return max(1, math.ceil(first_minute / START_RPS_PER_REPLICA))


def simulated_row(
    args: argparse.Namespace, workload: Workload, policy: Policy, model: ServerModel, initial: int
) -> dict[str, Any]:
    """One policy's summary on one workload, simulated (``wall_s``: what the simulation took)."""
    started = time.perf_counter()
    run = simulate(
        workload,
        policy,
        model,
        initial_replicas=initial,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        dt=args.dt,
        scrape_s=args.scrape,
    )
    row = summarise(run, args.slo_ttft)
    row["wall_s"] = round(time.perf_counter() - started, 1)
    return row


def write_report(path: Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        print(f"\nwrote {path}")


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'policy':<11} {'TTFT p50':>8} {'p95':>7} {'p99':>7} {'SLO att.':>8} {'replica-s':>10} "
        f"{'mean':>5} {'peak':>4} {'events':>6} {'revers.':>7}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['policy']:<11} {r['ttft_p50_s']:>8.2f} {r['ttft_p95_s']:>7.2f} {r['ttft_p99_s']:>7.2f} "
            f"{100 * r['slo_attainment']:>7.2f}% {r['replica_seconds']:>10.0f} {r['mean_replicas']:>5.1f} "
            f"{r['peak_replicas']:>4} {r['scale_events']:>6} {r['reversals']:>7}"
        )
    return "\n".join(lines)


def verdict_line(v: dict[str, Any]) -> str:
    def mark(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return (
        f"verdict {v['workload']}: vs {v['best_baseline']} (best baseline attainment): attainment "
        f"{100 * v['attainment_ours']:.2f}% vs {100 * v['attainment_best']:.2f}% (goal >=: "
        f"{mark(v['attainment_met'])}); replica-seconds {100 * v['replica_seconds_share']:.1f}% of its "
        f"(goal <= 85%: {mark(v['replica_seconds_met'])}); reversals {v['reversals_ours']} "
        f"(goal 0: {mark(v['reversals_met'])})"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    model = ServerModel(prefill_tokens_per_s=args.prefill_tps, cold_start_s=args.cold_start)
    print(f"model: {model}")
    print(
        f"SLO: TTFT <= {args.slo_ttft:g} s; replicas {args.min_replicas}..{args.max_replicas}; "
        f"scrape every {args.scrape:g} s; tick {args.dt:g} s; reversal window {REVERSAL_WINDOW_S:g} s"
    )
    report: dict[str, Any] = {
        "model": asdict(model),
        "args": {k: str(v) for k, v in vars(args).items()},
        "workloads": [],
        "verdicts": [],
    }
    _, notes = policies(args, model)
    for note in notes:
        print(note)
    for workload in workloads(args):
        print(f"\n== {workload.name}: {workload.description}")
        rows = []
        initial = args.initial_replicas or initial_replicas(workload)
        initial = min(max(initial, args.min_replicas), args.max_replicas)
        print(f"start: {initial} warm replicas")
        for policy in policies(args, model)[0]:  # fresh policy state for every workload
            rows.append(simulated_row(args, workload, policy, model, initial))
        print(table(rows))
        ours = next((r for r in rows if r["policy"] == "ours"), None)
        if ours is not None:
            print(f"ours' rules: {dict(sorted(ours['rules'].items(), key=lambda kv: -kv[1]))}")
        v = verdict(rows)
        if v is not None:
            print(verdict_line(v))
            report["verdicts"].append(v)
        report["workloads"].append(
            {
                "name": workload.name,
                "description": workload.description,
                "duration_s": workload.duration_s,
                "results": rows,
            }
        )
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
