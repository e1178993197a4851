"""A fake vLLM replica and the pool of them behind a router, in discrete time.

The replica model (one GPU, one vLLM engine; `ServerModel`'s defaults):

- Continuous batching with chunked prefill. Each engine iteration carries one decode token for
  every decoding sequence plus up to ``max_batched_tokens - decoding`` prompt tokens, first come
  first served; it lasts ``decode_step_base_s + decode_step_per_seq_s * decoding +
  prompt_tokens / prefill_tokens_per_s``. Within a tick of the simulation the batch is treated as
  a fluid: time advances to the next event (a prompt fully prefilled, a sequence finished, or the
  end of the tick), so tick length does not change the result beyond arrival rounding.
- The first token of a request is produced by the iteration that finishes its prompt: its TTFT is
  that moment minus its arrival. A request is only taken into the batch after it arrived (at the
  start of the next tick), and its prompt is processed at most at ``prefill_tokens_per_s``, so TTFT
  is never below ``prompt / prefill_tokens_per_s``.
- KV budget: a request enters the batch when its prompt plus its output fit in the free KV tokens
  (and fewer than ``max_num_seqs`` run); otherwise it waits (``num_requests_waiting``). vLLM
  allocates KV as tokens are produced and preempts when it runs out; reserving the whole request at
  admission is the preemption-free simplification. The reported ``kv_cache_usage_perc`` is the KV
  actually written (prompt tokens prefilled plus tokens generated).
- A new replica serves ``cold_start_s`` after it is created (pod start, weights, CUDA graphs) and
  counts as a GPU from creation. A replica being removed leaves the router at once and finishes
  every request it holds (graceful drain), counting as a GPU until it is empty.

Parameters, for Llama-3.1-8B-Instruct in bf16 on one NVIDIA A100 40GB with vLLM (bench/README.md,
"Autoscaling LLM inference pools", has the derivations):

- ``decode_step_base_s`` 13.3 ms and ``decode_step_per_seq_s`` 0.41 ms: fitted to a published vLLM
  0.23 concurrency sweep of that model on that GPU (1024-token prompts, 128-token outputs): about
  75 tokens/s for one sequence (13.3 ms a step) and 6.6 x the throughput at 8 concurrent sequences
  (8 sequences in 16.2 ms a step). J. Musgrave, "vLLM throughput-latency sweep on NVIDIA A100",
  https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on
- ``kv_capacity_tokens`` 150,000: Llama-3-8B keeps 128 KiB of KV a token (32 layers x 8 KV heads x
  128 dims x K and V x 2 bytes); vLLM logged 13,248 blocks of 16 tokens (211,968 tokens, 25.9 GiB)
  for Meta-Llama-3-8B-Instruct on a 48 GB A6000 at the default 0.9 memory utilisation
  (vllm-project/vllm pull request 4454). The A100 40GB has 8 GB less, 0.9 x 8 GB = 7.2 GB = 55,000
  tokens fewer: about 157,000, rounded down to 150,000.
- ``prefill_tokens_per_s`` 8,000: not a measurement: 41 % of the A100's dense bf16 peak
  (312 TFLOPS) at 2 x 8.03e9 FLOP a prompt token, a model-FLOPs utilisation typical of prefill at
  vLLM's default chunk. Stated as an assumption; ``--prefill-tps`` changes it for every policy.
- ``max_num_seqs`` 256 and ``max_batched_tokens`` 2048: vLLM's defaults for online serving with
  chunked prefill.
- ``cold_start_s`` 60: the task's default; a pod start plus loading 16 GB of weights.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

# vLLM's buckets for vllm:time_to_first_token_seconds (seconds).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)


@dataclass(frozen=True, slots=True)
class ServerModel:
    prefill_tokens_per_s: float = 8000.0
    decode_step_base_s: float = 0.0133
    decode_step_per_seq_s: float = 0.00041
    kv_capacity_tokens: int = 150_000
    max_num_seqs: int = 256
    max_batched_tokens: int = 2048
    cold_start_s: float = 60.0


@dataclass(slots=True)
class Request:
    rid: int
    arrival: float
    prompt: int
    output: int
    replica: int = -1
    first_token: float = math.nan
    finished: float = math.nan
    served: int = 0  # how many replicas produced its first token (an invariant: exactly one)

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    """What one replica's /metrics says at a scrape (vLLM's names, less the prefix)."""

    index: int
    num_requests_waiting: int
    num_requests_running: int
    prompt_tokens_total: float
    generation_tokens_total: float
    kv_cache_usage_perc: float
    waiting_prompt_tokens: int  # prompt tokens of the waiting requests
    ttft_bucket_counts: tuple[int, ...]  # cumulative, one per TTFT_BUCKETS bound, then +Inf
    ttft_count: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape of every serving replica, and the router's arrival counter."""

    at: float
    replicas: tuple[ReplicaMetrics, ...]
    arrivals_total: int

    def total(self, name: str) -> float:
        return float(sum(getattr(m, name) for m in self.replicas))


class Replica:
    def __init__(self, index: int, model: ServerModel, created: float, ready_at: float) -> None:
        self.index = index
        self.model = model
        self.created = created
        self.ready_at = ready_at
        self.draining = False
        self.stopped_at: float | None = None
        self.waiting: deque[Request] = deque()
        self.waiting_prompt_tokens = 0
        self.prefilling: deque[list[float | Request]] = deque()  # [request, prompt tokens left]
        self.prefill_pending = 0.0
        # (decode clock at its finish, rid, decode clock at its start, request)
        self.decoding: list[tuple[float, int, float, Request]] = []
        self.clock = 0.0  # decode iterations run so far: every decoding sequence gains one token each
        self.kv_reserved = 0
        self.decode_prompt_sum = 0
        self.decode_start_sum = 0.0
        self.prompt_tokens_total = 0.0
        self.generation_tokens_total = 0.0
        self.ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0

    def serving(self, now: float) -> bool:
        return now >= self.ready_at and not self.draining and self.stopped_at is None

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + self.running

    def enqueue(self, request: Request) -> None:
        request.replica = self.index
        self.waiting.append(request)
        self.waiting_prompt_tokens += request.prompt

    def kv_used(self) -> float:
        prefilled = sum(r.prompt - left for r, left in self.prefilling)  # type: ignore[union-attr,operator,misc]
        decoded = len(self.decoding) * self.clock - self.decode_start_sum
        return float(prefilled) + self.decode_prompt_sum + decoded

    def metrics(self) -> ReplicaMetrics:
        cumulative, total = [], 0
        for count in self.ttft_counts:
            total += count
            cumulative.append(total)
        return ReplicaMetrics(
            index=self.index,
            num_requests_waiting=len(self.waiting),
            num_requests_running=self.running,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            # Clamped to 0..1: the running sums behind kv_used() can round a hair below 0 when empty.
            kv_cache_usage_perc=min(1.0, max(0.0, self.kv_used() / self.model.kv_capacity_tokens)),
            waiting_prompt_tokens=self.waiting_prompt_tokens,
            ttft_bucket_counts=tuple(cumulative),
            ttft_count=total,
        )

    def _admit(self) -> None:
        model = self.model
        while self.waiting and self.running < model.max_num_seqs:
            head = self.waiting[0]
            need = head.prompt + head.output
            if self.kv_reserved + need > model.kv_capacity_tokens and self.running:
                return  # wait for KV; a lone request larger than the budget still runs
            self.waiting.popleft()
            self.waiting_prompt_tokens -= head.prompt
            self.kv_reserved += need
            self.prefilling.append([head, float(head.prompt)])
            self.prefill_pending += head.prompt

    def _finish(self, request: Request, at: float, done: list[Request]) -> None:
        request.finished = at
        self.kv_reserved -= request.prompt + request.output
        done.append(request)

    def _first_token(self, request: Request, at: float, done: list[Request]) -> None:
        request.first_token = at
        request.served += 1
        ttft = at - request.arrival
        bucket = next((i for i, bound in enumerate(TTFT_BUCKETS) if ttft <= bound), len(TTFT_BUCKETS))
        self.ttft_counts[bucket] += 1
        self.ttft_sum += ttft
        self.generation_tokens_total += 1
        if request.output <= 1:
            self._finish(request, at, done)
            return
        heapq.heappush(self.decoding, (self.clock + request.output - 1, request.rid, self.clock, request))
        self.decode_prompt_sum += request.prompt
        self.decode_start_sum += self.clock

    def step(self, now: float, dt: float, done: list[Request]) -> None:
        """Run the engine from `now` for `dt` seconds."""
        model = self.model
        self._admit()
        elapsed = 0.0
        while elapsed < dt:
            at = now + elapsed
            while self.decoding and self.decoding[0][0] <= self.clock + 1e-9:
                _, _, started, request = heapq.heappop(self.decoding)
                self.decode_prompt_sum -= request.prompt
                self.decode_start_sum -= started
                self._finish(request, at, done)
                self._admit()
            decoding = len(self.decoding)
            if decoding == 0 and not self.prefilling:
                return
            chunk = (
                min(self.prefill_pending, max(0, model.max_batched_tokens - decoding))
                if self.prefilling
                else 0.0
            )
            iteration = (
                model.decode_step_base_s
                + model.decode_step_per_seq_s * decoding
                + chunk / model.prefill_tokens_per_s
            )
            iterations = (dt - elapsed) / iteration
            if chunk > 0:
                head_left = float(self.prefilling[0][1])  # type: ignore[arg-type]
                iterations = min(iterations, head_left / chunk)
            if decoding:
                iterations = min(iterations, self.decoding[0][0] - self.clock)
            elapsed += iterations * iteration
            self.clock += iterations
            self.generation_tokens_total += iterations * decoding
            if chunk > 0:
                consumed = iterations * chunk
                self.prompt_tokens_total += consumed
                self.prefill_pending -= consumed
                head = self.prefilling[0]
                head[1] = float(head[1]) - consumed  # type: ignore[arg-type]
                if float(head[1]) <= 1e-6:  # type: ignore[arg-type]
                    self.prefilling.popleft()
                    self.prefill_pending -= float(head[1])  # type: ignore[arg-type]
                    if not self.prefilling:
                        self.prefill_pending = 0.0  # no float residue left behind
                    self._first_token(head[0], now + min(elapsed, dt), done)  # type: ignore[arg-type]
                    self._admit()


@dataclass(slots=True)
class Pool:
    """The replicas of one pool, the router in front of them and the metric scrapes."""

    model: ServerModel
    replicas: list[Replica] = field(default_factory=list)
    backlog: deque[Request] = field(default_factory=deque)  # arrived while no replica served
    arrivals_total: int = 0

    @classmethod
    def warm(cls, model: ServerModel, replicas: int) -> Pool:
        pool = cls(model)
        pool.replicas = [Replica(i, model, 0.0, 0.0) for i in range(replicas)]
        return pool

    def active(self) -> list[Replica]:
        """Replicas the pool's spec.replicas counts: created and not being removed."""
        return [r for r in self.replicas if not r.draining and r.stopped_at is None]

    def alive(self, now: float) -> int:
        """Replicas holding a GPU now (starting, serving or draining)."""
        return sum(1 for r in self.replicas if r.created <= now and r.stopped_at is None)

    def counts(self, now: float) -> tuple[int, int, int]:
        """(desired, ready, starting)."""
        active = self.active()
        ready = sum(1 for r in active if r.serving(now))
        return len(active), ready, len(active) - ready

    def scale_to(self, desired: int, now: float) -> None:
        active = self.active()
        for _ in range(desired - len(active)):
            index = len(self.replicas)
            self.replicas.append(Replica(index, self.model, now, now + self.model.cold_start_s))
        if desired < len(active):
            # The ReplicaSet's order: pods not ready before ready ones, then the newest first.
            victims = sorted(active, key=lambda r: (r.serving(now), -r.created, -r.index))
            for replica in victims[: len(active) - desired]:
                replica.draining = True
                if not replica.serving(now) and now < replica.ready_at:
                    replica.stopped_at = now  # still starting: it holds no request

    def route(self, request: Request, now: float) -> None:
        """Least outstanding requests among the serving replicas (ties: the lowest index)."""
        serving = [r for r in self.replicas if r.serving(now)]
        if not serving:
            self.backlog.append(request)
            return
        min(serving, key=lambda r: (r.outstanding, r.index)).enqueue(request)

    def step(self, now: float, dt: float, arrivals: list[Request], done: list[Request]) -> None:
        self.arrivals_total += len(arrivals)
        pending = list(self.backlog) + arrivals
        self.backlog.clear()
        for request in pending:
            self.route(request, now)
        self.advance(now, dt, done)

    def advance(self, now: float, dt: float, done: list[Request]) -> None:
        """Run every started replica's engine from `now` for `dt`; a drained one stops."""
        for replica in self.replicas:
            if replica.stopped_at is not None or now < replica.ready_at:
                continue
            replica.step(now, dt, done)
            if replica.draining and replica.outstanding == 0:
                replica.stopped_at = now + dt

    def scrape(self, now: float) -> Snapshot:
        serving = tuple(r.metrics() for r in self.replicas if r.serving(now))
        return Snapshot(now, serving, self.arrivals_total)

    def replica_seconds(self, end: float) -> float:
        return sum((r.stopped_at if r.stopped_at is not None else end) - r.created for r in self.replicas)
