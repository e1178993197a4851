"""Drive one workload through a running fake vLLM pool (live_server) under one policy, over HTTP.

The bench's side of a live run, in the pool's model seconds (wall seconds x its time scale):

- requests leave at their arrival times, each to the serving replica with the fewest requests this
  client has outstanding on it (ties: the lowest index; the simulator's router); a 503 or a refused
  connection (a replica that started draining) sends it to another, and while no replica serves it
  waits, as in the simulator's backlog. Its TTFT runs from its arrival time here to the first token
  the replica reports, so routing and HTTP delays count;
- every ``scrape_s`` each ready replica's /metrics is read and parsed by the operator's
  `parse_exposition` into the simulator's `Snapshot`, the policies' only input; the pool's counts
  come from the control port's listing;
- a policy's answer is sent to the control port (``POST /replicas``).

The result is the simulator's `Run`, so `run.summarise` gives the same figures for both.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

from neuronetes.api.models import MetricNames
from neuronetes_operator.metrics_source import MetricsError, parse_exposition

from .http1 import call
from .live_server import QUEUED_PROMPT_TOKENS
from .policies import Policy, PoolState
from .run import Run
from .server import ReplicaMetrics, Request, Snapshot
from .workloads import Workload

NAMES = MetricNames(queued_prompt_tokens=QUEUED_PROMPT_TOKENS)


def replica_metrics(index: int, text: str) -> ReplicaMetrics:
    """One replica's /metrics as the simulator's scrape has it (the fields the policies read)."""
    sample = parse_exposition(text, NAMES)
    return ReplicaMetrics(
        index=index,
        num_requests_waiting=int(sample.waiting or 0),
        num_requests_running=int(sample.running or 0),
        prompt_tokens_total=sample.prompt_tokens or 0.0,
        generation_tokens_total=math.nan,  # no policy reads it; the operator's parser does not either
        kv_cache_usage_perc=sample.kv_cache_usage or 0.0,
        waiting_prompt_tokens=int(sample.queued_prompt_tokens or 0),
        ttft_bucket_counts=(),
        ttft_count=0,
    )


@dataclass(slots=True)
class LiveDriver:
    workload: Workload
    policy: Policy
    control_port: int
    time_scale: float
    min_replicas: int
    max_replicas: int
    scrape_s: float = 5.0
    dt: float = 0.1  # model seconds between the policy's looks (the simulator's tick)
    drain_limit_s: float = 600.0
    sample_every_s: float = 15.0
    started: float = field(default_factory=time.monotonic)
    offset: float = 0.0  # the pool's clock minus ours
    listing: list[dict[str, Any]] = field(default_factory=list)
    outstanding: dict[int, int] = field(default_factory=dict)
    arrivals: int = 0
    events: list[tuple[float, int, int]] = field(default_factory=list)
    timeline: list[tuple[float, int, int]] = field(default_factory=list)

    def now(self) -> float:
        return (time.monotonic() - self.started) * self.time_scale

    async def refresh(self, count: int | None = None) -> None:
        if count is None:
            status, body = await call(self.control_port, "GET", "/replicas")
        else:
            status, body = await call(self.control_port, "POST", "/replicas", {"count": count})
        if status != 200:
            raise RuntimeError(f"the pool's control port answered {status}: {body}")
        self.listing = body["replicas"]

    def serving(self) -> list[dict[str, Any]]:
        pool_now = self.now() + self.offset
        return [
            r for r in self.listing if r["state"] in ("starting", "ready") and pool_now >= r["ready_at_s"]
        ]

    def counts(self) -> PoolState:
        active = [r for r in self.listing if r["state"] in ("starting", "ready")]
        ready = len(self.serving())
        return PoolState(len(active), ready, len(active) - ready)

    async def send(self, request: Request, deadline: float) -> None:
        body = {"prompt_tokens": request.prompt, "max_tokens": request.output}
        while self.now() < deadline:
            serving = self.serving()
            if not serving:
                await asyncio.sleep(self.dt / self.time_scale)
                continue
            target = min(serving, key=lambda r: (self.outstanding.get(r["index"], 0), r["index"]))
            index = target["index"]
            self.outstanding[index] = self.outstanding.get(index, 0) + 1
            try:
                status, answer = await call(target["port"], "POST", "/v1/completions", body, timeout_s=3600.0)
            except OSError:
                status, answer = 0, None
            finally:
                self.outstanding[index] -= 1
            if status == 200:
                request.replica = index
                request.first_token = answer["first_token_s"] - self.offset
                request.finished = answer["finished_s"] - self.offset
                request.served = 1
                return
            await self.refresh()  # starting, draining or gone: the listing was behind

    async def dispatch(self, requests: list[Request], deadline: float) -> None:
        sends = []
        for request in requests:
            wait = (request.arrival - self.now()) / self.time_scale
            if wait > 0:
                await asyncio.sleep(wait)
            self.arrivals += 1
            sends.append(asyncio.create_task(self.send(request, deadline)))
        await asyncio.gather(*sends)

    async def scrape(self, at: float) -> Snapshot:
        await self.refresh()
        ready = [r for r in self.listing if r["state"] == "ready"]
        answers = await asyncio.gather(
            *(call(r["port"], "GET", "/metrics", timeout_s=5.0) for r in ready), return_exceptions=True
        )
        found = []
        for replica, answer in zip(ready, answers, strict=True):
            if isinstance(answer, BaseException) or answer[0] != 200:
                continue  # drained between the listing and the scrape
            try:
                found.append(replica_metrics(replica["index"], answer[1]))
            except MetricsError:
                continue
        return Snapshot(at, tuple(found), self.arrivals)

    def alive(self) -> int:
        return sum(1 for r in self.listing if r["state"] != "stopped")

    async def run(self) -> Run:
        _, body = await call(self.control_port, "GET", "/replicas")
        self.started = time.monotonic()
        self.offset = body["now"]
        self.listing = body["replicas"]
        requests = [Request(r.rid, r.arrival, r.prompt, r.output) for r in self.workload.requests]
        deadline = self.workload.duration_s + self.drain_limit_s
        prime = getattr(self.policy, "prime", None)
        if prime is not None:
            prime(0.0, self.counts().desired)
        traffic = asyncio.create_task(self.dispatch(requests, deadline))
        snapshot: Snapshot | None = None
        next_scrape, next_sample = 0.0, 0.0
        while not traffic.done():
            now = self.now()
            if now >= next_scrape:
                snapshot = await self.scrape(now)
                next_scrape += self.scrape_s
            state = self.counts()
            wanted = self.policy.decide(now, snapshot, state)
            if wanted is not None:
                wanted = min(max(wanted, self.min_replicas), self.max_replicas)
                if wanted != state.desired:
                    await self.refresh(wanted)
                    self.events.append((now, state.desired, wanted))
            if now >= next_sample:
                self.timeline.append((now, state.desired, self.alive()))
                next_sample += self.sample_every_s
            await asyncio.sleep(self.dt / self.time_scale)
        await traffic
        end = self.now()
        await self.refresh()
        # GPU-seconds of the run's window, on the pool's clock (its warm replicas predate the run).
        start_at, end_at = self.offset, self.offset + end
        replica_seconds = sum(
            max(
                0.0,
                min(r["stopped_s"] if r["stopped_s"] is not None else end_at, end_at)
                - max(r["created_s"], start_at),
            )
            for r in self.listing
        )
        rules = dict(getattr(self.policy, "rules", {}))
        return Run(
            self.policy.name,
            self.workload.name,
            requests,
            end,
            replica_seconds,
            replica_seconds,
            self.events,
            self.timeline,
            rules,
        )
