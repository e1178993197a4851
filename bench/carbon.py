"""Carbon-aware time shifting on an hourly intensity trace: the gate's releases vs an oracle vs none.

    python bench/carbon.py [--days 30] [--jobs 400] [--seed 7] [--forecast-error 0.04]

The trace is SYNTHETIC (no public hourly intensity trace is in the repository's data): a documented
diurnal profile of a grid with solar and wind — a base of 420 gCO2eq/kWh, a midday solar dip
scaled by each day's cloudiness, an evening peak, lower weekends, and a wind term that wanders
(AR(1)) — clipped to 40..700 (bench/README.md, "Carbon-aware time shifting"). Deferrable jobs (one
GPU at 400 W, 1-4 h of run time) arrive at random hours with a deadline 0-12 h of slack after
arrival + run time. Each job's emissions are its energy × the TRUE intensity of the hours it runs.

- **none**: every job starts when it arrives.
- **oracle**: every job starts at the hour, within its slack, whose run has the lowest true mean
  intensity (perfect forecast).
- **gate**: every hour, `neuronetes.carbon.release.release_reason` — the controller's own function
  — decides for each waiting job, seeing only what a forecast source would know then: the current
  intensity exactly and a 24-hour forecast whose error grows with the horizon (relative error
  drawn from N(0, e·sqrt(k)) for k hours ahead, e = --forecast-error, capped at 30 %). Variants:
  with the forecast rule and a clean-energy window, forecast only, and current value only
  (threshold + deadline, no forecast).

Prints savings vs none per policy, the share of the oracle's savings, and missed deadlines.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from neuronetes.carbon.intensity import IntensityReading
from neuronetes.carbon.release import GatedPod, GatePolicy, release_reason

START = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday
GPU_KW = 0.4
FORECAST_HOURS = 24


def synthetic_trace(days: int, rng: random.Random) -> list[float]:
    """Hourly gCO2eq/kWh: base, solar dip × cloudiness, evening peak, weekend, AR(1) wind."""
    out, wind = [], 0.0
    for day in range(days):
        sun = rng.uniform(0.3, 1.0)  # this day's clear-sky share
        weekend = 30.0 if (START + timedelta(days=day)).weekday() >= 5 else 0.0
        for hour in range(24):
            wind = 0.9 * wind + rng.gauss(0, 18)
            solar = 260 * sun * max(0.0, math.sin(math.pi * (hour - 6) / 12))
            evening = 60 * math.exp(-(((hour - 19.5) / 1.5) ** 2))
            out.append(min(700.0, max(40.0, 420 - solar + evening - weekend + wind)))
    return out


@dataclass(frozen=True)
class Job:
    arrival: int
    runtime: int
    slack: int

    @property
    def latest_start(self) -> int:
        return self.arrival + self.slack


def jobs(count: int, hours: int, rng: random.Random) -> list[Job]:
    out = []
    for _ in range(count):
        runtime, slack = rng.randint(1, 4), rng.randint(0, 12)
        out.append(Job(rng.randrange(0, hours - runtime - slack - FORECAST_HOURS), runtime, slack))
    return out


def grams(trace: list[float], job: Job, start: int) -> float:
    return GPU_KW * sum(trace[start : start + job.runtime])


def oracle_start(trace: list[float], job: Job) -> int:
    return min(range(job.arrival, job.latest_start + 1), key=lambda s: grams(trace, job, s))


def forecast(
    trace: list[float], now: int, error: float, rng: random.Random
) -> tuple[tuple[datetime, float], ...]:
    points = []
    for k in range(1, FORECAST_HOURS + 1):
        if now + k >= len(trace):
            break
        noise = max(-0.3, min(0.3, rng.gauss(0, error * math.sqrt(k))))
        points.append((START + timedelta(hours=now + k), trace[now + k] * (1 + noise)))
    return tuple(points)


def gate_starts(
    trace: list[float], work: list[Job], policy: GatePolicy, error: float, seed: int, use_forecast: bool
) -> dict[int, int]:
    """Each job's start under the controller's release rule, ticking hourly."""
    rng = random.Random(seed)
    waiting = dict(enumerate(work))
    starts: dict[int, int] = {}
    for now in range(len(trace)):
        arriving = [i for i, j in waiting.items() if j.arrival <= now]
        if not arriving:
            continue
        at = START + timedelta(hours=now)
        ahead = forecast(trace, now, error, rng) if use_forecast else ()
        reading = IntensityReading(trace[now], at, ahead, "trace")
        for i in arriving:
            job = waiting[i]
            pod = GatedPod(
                created=START + timedelta(hours=job.arrival),
                deadline=START + timedelta(hours=job.latest_start + job.runtime),
                expected_runtime_s=job.runtime * 3600.0,
            )
            if release_reason(pod, policy, reading, at, 3600.0) is not None:
                starts[i] = now
                del waiting[i]
    return starts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--forecast-error", type=float, default=0.04)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    trace = synthetic_trace(args.days, rng)
    work = jobs(args.jobs, len(trace), rng)
    none = sum(grams(trace, j, j.arrival) for j in work)
    oracle = sum(grams(trace, j, oracle_start(trace, j)) for j in work)
    mean = sum(trace) / len(trace)
    print(
        f"synthetic trace: {args.days} days, mean {mean:.0f} gCO2/kWh, min {min(trace):.0f}, "
        f"max {max(trace):.0f}; {len(work)} jobs, forecast error {args.forecast_error:.0%}·sqrt(h)"
    )
    print(f"{'policy':<48} {'kgCO2':>8} {'saved':>7} {'of oracle':>9} {'missed':>6}")
    print(f"{'none (start on arrival)':<48} {none / 1000:8.1f} {0:6.1%} {'':>9} {0:6d}")
    oracle_saved = (none - oracle) / none
    print(f"{'oracle (perfect forecast)':<48} {oracle / 1000:8.1f} {oracle_saved:6.1%} {1:9.0%} {0:6d}")
    big = 24 * 3600.0  # maxDelay never binds here: every job has a deadline
    variants = [
        ("gate: forecast + deadline", GatePolicy(None, max_delay_s=big), True),
        ("gate: window 10:00-15:00 + forecast + deadline", GatePolicy("10:00-15:00", max_delay_s=big), True),
        (
            "gate: max 200 g + forecast + deadline",
            GatePolicy(None, max_carbon_intensity=200, max_delay_s=big),
            True,
        ),
        (
            "gate: max 200 g + deadline (no forecast)",
            GatePolicy(None, max_carbon_intensity=200, max_delay_s=big),
            False,
        ),
    ]
    for name, policy, use_forecast in variants:
        starts = gate_starts(trace, work, policy, args.forecast_error, args.seed, use_forecast)
        ours = sum(grams(trace, j, starts[i]) for i, j in enumerate(work))
        missed = sum(1 for i, j in enumerate(work) if starts[i] > j.latest_start)
        share = (none - ours) / (none - oracle) if none > oracle else 1.0
        print(f"{name:<48} {ours / 1000:8.1f} {(none - ours) / none:6.1%} {share:9.0%} {missed:6d}")


if __name__ == "__main__":
    main()
