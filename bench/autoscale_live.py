"""The autoscaling benchmark run live: a real fake-vLLM pool over HTTP, checked against the simulator.

For each policy (default: AIBrix APA and ours) it starts bench/fake_vllm_pool.py — one process, one
loopback port a replica, the simulator's replica model stepped in wall-clock time — replays a
workload through a least-outstanding-requests router over HTTP, scrapes every replica's /metrics,
feeds the policy (the simulator's own classes; the text parsed by the operator's parse_exposition)
and scales the pool through its control port. Then it runs the same workload, model and policy in
the simulator. Time is compressed uniformly: the pool's model clock runs ``--time-scale`` times the
wall clock, and the workload, cold start, scrape interval and every policy period are in model
seconds, so the simulator runs the same parameters. It prints bench/autoscale.py's table for both.

    python bench/autoscale_live.py [--quick] [--policies aibrix-apa,ours] [--json OUT]

It runs in real time: the figures vary with the machine's load (a late engine tick or HTTP answer
is model time at x time-scale).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autoscale import AZURE_TRACE, initial_replicas, policies, simulated_row, table, write_report
from autoscale_sim.live_run import LiveDriver
from autoscale_sim.run import summarise
from autoscale_sim.server import ServerModel
from autoscale_sim.workloads import Workload, azure_trace, ramp

BENCH = Path(__file__).resolve().parent


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("ramp", "azure"), default="ramp")
    parser.add_argument("--ramp-rps", default="1,12", help="ramp: low,high requests a model second")
    parser.add_argument("--azure-trace", type=Path, default=AZURE_TRACE)
    parser.add_argument("--azure-minutes", type=float, default=10.0, help="azure: the trace's first minutes")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="azure: multiply the trace's rate")
    parser.add_argument("--time-scale", type=float, default=3.0, help="model seconds a wall second")
    parser.add_argument("--cold-start", type=float, default=ServerModel().cold_start_s, help="model seconds")
    parser.add_argument("--prefill-tps", type=float, default=ServerModel().prefill_tokens_per_s)
    parser.add_argument("--slo-ttft", type=float, default=2.0)
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--max-replicas", type=int, default=16)
    parser.add_argument("--scrape", type=float, default=5.0, help="model seconds between metric scrapes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default="aibrix-apa,ours")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="an 80 s ramp of 1 -> 6 req/s, 20 s cold start, at x5 (the unit test)",
    )
    parser.add_argument("--json", type=Path, help="write every figure, event and timeline here")
    args = parser.parse_args(argv)
    try:
        args.low_rps, args.high_rps = (float(x) for x in args.ramp_rps.split(","))
    except ValueError:
        parser.error(f"--ramp-rps {args.ramp_rps!r}: give low,high")
    if (
        min(args.time_scale, args.scrape, args.rate_scale, args.azure_minutes, args.low_rps, args.high_rps)
        <= 0
    ):
        parser.error("--time-scale, --scrape, --rate-scale, --azure-minutes and --ramp-rps must be positive")
    if not 1 <= args.min_replicas <= args.max_replicas:
        parser.error("need 1 <= --min-replicas <= --max-replicas")
    if args.workload == "azure" and not args.azure_trace.is_file():
        parser.error(f"--azure-trace {args.azure_trace}: no such file")
    args.dt = 0.1  # model seconds: the simulator's tick and the live policy loop's
    if args.quick:
        args.workload, args.time_scale, args.cold_start = "ramp", 5.0, 20.0
        args.low_rps, args.high_rps = 1.0, 6.0
    return args


def workload_of(args: argparse.Namespace) -> Workload:
    if args.workload == "azure":
        return azure_trace(args.azure_trace, 1.0, args.rate_scale, args.seed, 60.0 * args.azure_minutes)
    phases = (10.0, 20.0, 20.0, 20.0, 10.0) if args.quick else (60.0, 150.0, 120.0, 150.0, 60.0)
    return ramp(args.seed, args.low_rps, args.high_rps, phases)


def start_pool(args: argparse.Namespace, replicas: int) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, str(BENCH / "fake_vllm_pool.py"), "--replicas", str(replicas)]
    command += ["--max-replicas", str(args.max_replicas), "--cold-start", str(args.cold_start)]
    command += ["--prefill-tps", str(args.prefill_tps), "--time-scale", str(args.time_scale)]
    pool = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert pool.stdout is not None
    first = pool.stdout.readline()
    if not first:
        pool.wait()
        raise RuntimeError(f"the fake vLLM pool exited ({pool.returncode}) before it listened")
    return pool, int(json.loads(first)["control_port"])


def live_row(args: argparse.Namespace, workload: Workload, policy: Any, initial: int) -> dict[str, Any]:
    pool, control_port = start_pool(args, initial)
    try:
        driver = LiveDriver(
            workload,
            policy,
            control_port,
            args.time_scale,
            args.min_replicas,
            args.max_replicas,
            scrape_s=args.scrape,
            dt=args.dt,
        )
        started = time.perf_counter()
        run = asyncio.run(driver.run())
        row = summarise(run, args.slo_ttft)
        row["wall_s"] = round(time.perf_counter() - started, 1)
        return row
    finally:
        pool.terminate()
        pool.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    model = ServerModel(prefill_tokens_per_s=args.prefill_tps, cold_start_s=args.cold_start)
    workload = workload_of(args)
    initial = min(max(initial_replicas(workload), args.min_replicas), args.max_replicas)
    print(f"model: {model}")
    print(
        f"time: x{args.time_scale:g} (1 wall second = {args.time_scale:g} model seconds; the workload, "
        f"the {args.cold_start:g} s cold start, the {args.scrape:g} s scrapes and the policies' periods "
        f"are model seconds); SLO: TTFT <= {args.slo_ttft:g} s; "
        f"replicas {args.min_replicas}..{args.max_replicas}"
    )
    print(f"== {workload.name}: {workload.description}; start: {initial} warm replicas")
    made, notes = policies(args, model)
    for note in notes:
        print(note)
    live, simulated = [], []
    for policy in made:
        live.append(live_row(args, workload, policy, initial))
        print(f"  {policy.name}: live run took {live[-1]['wall_s']:g} s of wall time", flush=True)
    for policy in policies(args, model)[0]:  # fresh state for the simulator
        simulated.append(simulated_row(args, workload, policy, model, initial))
    print(f"\nlive (over HTTP, the pool in one process, time x{args.time_scale:g}):")
    print(table(live))
    print("simulator (the same workload, model and policies):")
    print(table(simulated))
    for lv, sim in zip(live, simulated, strict=True):
        attainment = 100 * (lv["slo_attainment"] - sim["slo_attainment"])
        cost = lv["replica_seconds"] - sim["replica_seconds"]
        print(
            f"live - simulator, {lv['policy']}: attainment {attainment:+.2f} points, replica-s {cost:+.0f}, "
            f"TTFT p95 {lv['ttft_p95_s'] - sim['ttft_p95_s']:+.2f} s"
        )
    report = {
        "model": asdict(model),
        "args": {k: str(v) for k, v in vars(args).items()},
        "workload": {"name": workload.name, "description": workload.description, "initial": initial},
        "live": live,
        "simulated": simulated,
    }
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
