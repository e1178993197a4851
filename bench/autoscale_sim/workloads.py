"""The request streams: the Azure LLM inference trace (conversation) and a synthetic ramp.

Azure trace: ``AzureLLMInferenceTrace_conv.csv`` (TIMESTAMP, ContextTokens, GeneratedTokens), one
hour of a production conversation service, 19,365 requests, from github.com/Azure/AzurePublicDataset
(CC-BY 4.0; Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting",
ISCA 2024). It is read where it lies (``--azure-trace``); nothing of it is copied here. Its hour
is time-compressed by ``time_compress`` (arrival offsets divided) and rate-scaled by
``rate_scale``: each request appears floor(rate_scale) times, plus once more with probability
equal to the fractional part, each copy after the first shifted by a uniform 0-1 s (seeded), so the
shape of the hour is kept and the rate multiplied.

Ramp: Poisson arrivals whose rate goes low → high → low in straight lines (seeded), with prompt and
output lengths drawn from log-normal distributions near the trace's medians (1,020 and 129 tokens).
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path

from .server import Request


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    requests: tuple[Request, ...]  # templates: the run copies them, so every policy gets the same
    duration_s: float
    description: str


def _timestamp(text: str) -> datetime:
    # "2023-11-16 18:15:46.6805900": seven fractional digits, one more than fromisoformat takes.
    head, _, fraction = text.partition(".")
    return datetime.fromisoformat(f"{head}.{(fraction + '000000')[:6]}")


def azure_trace(
    path: Path, time_compress: float, rate_scale: float, seed: int, limit_s: float | None = None
) -> Workload:
    rows = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            rows.append(
                (_timestamp(row["TIMESTAMP"]), int(row["ContextTokens"]), int(row["GeneratedTokens"]))
            )
    if not rows:
        raise ValueError(f"{path}: no requests")
    start = min(r[0] for r in rows)
    rng = random.Random(seed)
    whole, fraction = int(rate_scale), rate_scale - int(rate_scale)
    arrivals: list[tuple[float, int, int]] = []
    for stamp, prompt, output in rows:
        at = (stamp - start).total_seconds() / time_compress
        if limit_s is not None and at >= limit_s:
            continue
        copies = whole + (1 if rng.random() < fraction else 0)
        for copy in range(copies):
            shift = 0.0 if copy == 0 else rng.random()
            arrivals.append((at + shift, max(1, prompt), max(1, output)))
    arrivals.sort()
    requests = tuple(Request(i, at, prompt, output) for i, (at, prompt, output) in enumerate(arrivals))
    duration = max(a[0] for a in arrivals) + 1.0 if limit_s is None else limit_s
    description = (
        f"Azure LLM inference trace 2023, conversation (CC-BY 4.0, Patel et al., Splitwise, ISCA 2024): "
        f"{len(rows)} requests, time compressed x{time_compress:g}, rate scaled x{rate_scale:g} "
        f"-> {len(requests)} requests over {duration:.0f} s"
    )
    return Workload("azure-conv", requests, duration, description)


def ramp(
    seed: int,
    low_rps: float = 2.0,
    high_rps: float = 30.0,
    phases_s: tuple[float, ...] = (300, 600, 600, 600, 600),
) -> Workload:
    """Rate: low for phases[0], up to high over phases[1], high for phases[2], down over phases[3],
    low for phases[4]."""
    rng = random.Random(seed)
    edges = [0.0]
    for length in phases_s:
        edges.append(edges[-1] + length)
    points = [
        (edges[0], low_rps),
        (edges[1], low_rps),
        (edges[2], high_rps),
        (edges[3], high_rps),
        (edges[4], low_rps),
        (edges[5], low_rps),
    ]

    def rate(t: float) -> float:
        for (t0, r0), (t1, r1) in pairwise(points):
            if t <= t1:
                return r0 + (r1 - r0) * (t - t0) / (t1 - t0) if t1 > t0 else r1
        return low_rps

    # Thinning (Lewis-Shedler) against the peak rate.
    requests: list[Request] = []
    t, end = 0.0, edges[-1]
    while True:
        t += rng.expovariate(high_rps)
        if t >= end:
            break
        if rng.random() * high_rps <= rate(t):
            prompt = int(min(8192, max(16, rng.lognormvariate(math.log(1020), 0.8))))
            output = int(min(1024, max(1, rng.lognormvariate(math.log(129), 0.8))))
            requests.append(Request(len(requests), t, prompt, output))
    description = (
        f"synthetic ramp (seeded): {low_rps:g} -> {high_rps:g} -> {low_rps:g} req/s, phases "
        f"{'/'.join(f'{p:g}' for p in phases_s)} s, log-normal prompts (median 1020) and outputs "
        f"(median 129) -> {len(requests)} requests over {end:.0f} s"
    )
    return Workload("ramp", tuple(requests), end, description)


def step_load(
    rate_before: float,
    rate_after: float,
    at_s: float,
    duration_s: float,
    prompt: int,
    output: int,
    stop_s: float | None = None,
) -> Workload:
    """Evenly spaced requests of one shape whose rate steps at `at_s` and, given `stop_s`, stop
    there (for the HPA check)."""
    requests: list[Request] = []
    t = 0.0
    end = duration_s if stop_s is None else min(stop_s, duration_s)
    while t < end:
        requests.append(Request(len(requests), t, prompt, output))
        t += 1.0 / (rate_before if t < at_s else rate_after)
    return Workload(
        "step", tuple(requests), duration_s, f"step {rate_before:g} -> {rate_after:g} req/s at {at_s:g} s"
    )
