"""A fake vLLM pool served for real: one process, many replicas, each on its own loopback port.

Every replica is `server.Replica` — the simulator's replica model (continuous batching, chunked
prefill, a KV-token budget, a cold start) — held in a `server.Pool` and stepped in wall-clock time
by one engine loop every ``tick`` seconds. Requests that arrive during a tick join their replica at
its end, as the simulator rounds arrivals up to its next tick. ``time_scale`` runs the model's
clock that many times faster than the wall clock (every duration below, the cold start included,
is in model seconds; 1, the default, is real time).

Each replica, on 127.0.0.1:<its port>:

- ``POST /v1/completions`` with ``{"prompt_tokens": 1020, "max_tokens": 129}`` (or an OpenAI-like
  ``"prompt"`` string, one token a word; ``max_tokens`` defaults to 16): answered when the request
  finishes, with its ``ttft_s`` and ``latency_s`` (model seconds from its arrival) and usage;
- ``GET /metrics``: vLLM's metrics in the Prometheus text format (`exposition`).

A starting replica answers 503 until its cold start has passed; a draining one answers 503 to new
completions, finishes what it holds, then closes its port.

The control port (127.0.0.1 too): ``GET /replicas`` lists every replica (port, state, created,
ready and stopped times, requests held) with the model clock's ``now``; ``POST /replicas`` with
``{"count": N}`` scales to N at the next tick (new ones cold-start; removed ones drain, starting
ones first, then the newest — a ReplicaSet's order) and answers the new list.

``python bench/fake_vllm_pool.py --help`` starts one; its first stdout line is the JSON of
``GET /replicas``, ports included.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .http1 import Answer as HttpAnswer
from .http1 import HttpError, HttpRequest, json_answer, serve
from .server import TTFT_BUCKETS, Pool, Replica, Request, ServerModel

HOST = "127.0.0.1"
MAX_TOKENS = 131_072  # per field of a request: a long model context
# vLLM's 1-2-5 buckets for vllm:request_prompt_tokens, up to that context.
PROMPT_BUCKETS = tuple(m * 10**e for e in range(6) for m in (1, 2, 5) if m * 10**e <= MAX_TOKENS)
# Not a vLLM metric: the prompt tokens of the waiting requests, which the simulator's policies read
# (the operator reads it when an AgentPool names it in metrics.queries.queuedPromptTokens).
QUEUED_PROMPT_TOKENS = "sim:num_prompt_tokens_waiting"


@dataclass(slots=True)
class Endpoint:
    """One replica's port and what its /metrics adds to the model's counters."""

    replica: Replica
    server: asyncio.Server | None = None
    port: int = 0
    inbox: list[Request] = field(default_factory=list)  # arrived during the current tick
    answers: dict[int, asyncio.Future[Request]] = field(default_factory=dict)
    prompt_bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(PROMPT_BUCKETS) + 1))
    prompt_sum: int = 0

    def finished(self, request: Request) -> None:
        """vLLM observes a request's prompt length when it finishes."""
        self.prompt_bucket_counts[
            next((i for i, b in enumerate(PROMPT_BUCKETS) if request.prompt <= b), -1)
        ] += 1
        self.prompt_sum += request.prompt
        answer = self.answers.pop(request.rid, None)
        if answer is not None and not answer.done():
            answer.set_result(request)


def _histogram(name: str, bounds: tuple[float, ...], counts: list[int], total: float) -> list[str]:
    lines, cumulative = [f"# TYPE {name} histogram"], 0
    for bound, count in zip((*bounds, math.inf), counts, strict=True):
        cumulative += count
        le = "+Inf" if math.isinf(bound) else f"{float(bound)}"
        lines.append(f'{name}_bucket{{model_name="sim",le="{le}"}} {cumulative}')
    lines.append(f'{name}_count{{model_name="sim"}} {cumulative}')
    lines.append(f'{name}_sum{{model_name="sim"}} {total}')
    return lines


def exposition(endpoint: Endpoint) -> str:
    """One replica's /metrics, vLLM's names (vllm/engine/metrics.py), labelled model_name."""
    replica, m = endpoint.replica, endpoint.replica.metrics()
    gauges = (
        ("vllm:num_requests_waiting", m.num_requests_waiting),
        ("vllm:num_requests_running", m.num_requests_running),
        ("vllm:kv_cache_usage_perc", m.kv_cache_usage_perc),
        ("vllm:gpu_cache_usage_perc", m.kv_cache_usage_perc),
        (QUEUED_PROMPT_TOKENS, m.waiting_prompt_tokens),
    )
    lines = []
    for name, value in gauges:
        lines += [f"# TYPE {name} gauge", f'{name}{{model_name="sim"}} {value}']
    for name, value in (
        ("vllm:prompt_tokens", m.prompt_tokens_total),
        ("vllm:generation_tokens", m.generation_tokens_total),
    ):
        # The model counts tokens as a fluid: whole tokens once their work is done, up to float residue.
        lines += [f"# TYPE {name} counter", f'{name}_total{{model_name="sim"}} {round(value, 3)}']
    lines += _histogram(
        "vllm:request_prompt_tokens",
        tuple(float(b) for b in PROMPT_BUCKETS),
        endpoint.prompt_bucket_counts,
        endpoint.prompt_sum,
    )
    lines += _histogram(
        "vllm:time_to_first_token_seconds", TTFT_BUCKETS, replica.ttft_counts, replica.ttft_sum
    )
    return "\n".join(lines) + "\n"


def _tokens(body: dict[str, Any], key: str, default: int | None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
        raise HttpError(400, f"{key} must be an integer from 1 to {MAX_TOKENS}")
    return value


def completion_shape(body: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, output tokens) of a completion request."""
    if "prompt_tokens" in body:
        prompt = _tokens(body, "prompt_tokens", None)
    elif isinstance(body.get("prompt"), str):
        prompt = len(body["prompt"].split())
        if not 1 <= prompt <= MAX_TOKENS:
            raise HttpError(400, f"prompt must have 1 to {MAX_TOKENS} words")
    else:
        raise HttpError(400, "give prompt_tokens (an integer) or prompt (a string)")
    return prompt, _tokens(body, "max_tokens", 16)


class LivePool:
    def __init__(
        self, model: ServerModel, replicas: int, time_scale: float, tick_s: float, max_replicas: int
    ):
        self.model, self.time_scale, self.tick_s, self.max_replicas = model, time_scale, tick_s, max_replicas
        self.pool = Pool.warm(model, replicas)
        self.endpoints: dict[int, Endpoint] = {}
        self.started = time.monotonic()
        self.rids = itertools.count()
        self.wanted: int | None = None
        self.scaled = asyncio.Event()

    def now(self) -> float:
        return (time.monotonic() - self.started) * self.time_scale

    async def open_ports(self) -> None:
        for replica in self.pool.replicas:
            if replica.index not in self.endpoints and replica.stopped_at is None:
                endpoint = Endpoint(replica)

                async def handle(request: HttpRequest, endpoint: Endpoint = endpoint) -> HttpAnswer:
                    return await self.replica_answer(endpoint, request)

                endpoint.server = await serve(HOST, 0, handle)
                endpoint.port = endpoint.server.sockets[0].getsockname()[1]
                self.endpoints[replica.index] = endpoint

    def state(self, replica: Replica, now: float) -> str:
        if replica.stopped_at is not None:
            return "stopped"
        if replica.draining:
            return "draining"
        return "ready" if now >= replica.ready_at else "starting"

    def listing(self) -> dict[str, Any]:
        now = self.now()
        return {
            "now": now,
            "time_scale": self.time_scale,
            "cold_start_s": self.model.cold_start_s,
            "replicas": [
                {
                    "index": r.index,
                    "port": self.endpoints[r.index].port if r.index in self.endpoints else None,
                    "state": self.state(r, now),
                    "created_s": r.created,
                    "ready_at_s": r.ready_at,
                    "stopped_s": r.stopped_at,
                    "outstanding": r.outstanding,
                }
                for r in self.pool.replicas
            ],
        }

    async def replica_answer(self, endpoint: Endpoint, request: HttpRequest) -> HttpAnswer:
        replica, now = endpoint.replica, self.now()
        routes = {("POST", "/v1/completions"), ("GET", "/metrics")}
        if (request.method, request.path) not in routes:
            known = request.path in {path for _, path in routes}
            raise HttpError(405 if known else 404, f"{request.method} {request.path}: not served here")
        if replica.stopped_at is not None or (replica.draining and request.path != "/metrics"):
            raise HttpError(503, f"replica {replica.index} is draining")
        if now < replica.ready_at:
            raise HttpError(
                503, f"replica {replica.index} is starting: ready in {replica.ready_at - now:.1f} s"
            )
        if request.path == "/metrics":
            return 200, exposition(endpoint).encode(), "text/plain; version=0.0.4"
        prompt, output = completion_shape(request.json_object())
        pending = Request(next(self.rids), now, prompt, output)
        answer: asyncio.Future[Request] = asyncio.get_running_loop().create_future()
        endpoint.answers[pending.rid] = answer
        endpoint.inbox.append(pending)
        done = await answer
        return json_answer(
            {
                "id": f"cmpl-{done.rid}",
                "object": "text_completion",
                "replica": replica.index,
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": output,
                    "total_tokens": prompt + output,
                },
                "arrival_s": done.arrival,
                "first_token_s": done.first_token,
                "finished_s": done.finished,
                "ttft_s": done.ttft,
                "latency_s": done.finished - done.arrival,
            }
        )

    async def control_answer(self, request: HttpRequest) -> HttpAnswer:
        if request.path != "/replicas":
            raise HttpError(404, f"{request.path}: the control port serves /replicas")
        if request.method == "GET":
            return json_answer(self.listing())
        if request.method != "POST":
            raise HttpError(405, f"{request.method} /replicas: use GET or POST")
        count = request.json_object().get("count")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= self.max_replicas:
            raise HttpError(400, f"count must be an integer from 0 to {self.max_replicas}")
        self.wanted = count
        self.scaled.clear()
        await self.scaled.wait()  # the engine loop applies it at its next tick
        return json_answer(self.listing())

    async def engine(self) -> None:
        before = self.now()
        while True:
            await asyncio.sleep(self.tick_s)
            now = self.now()
            done: list[Request] = []
            self.pool.advance(before, now - before, done)
            for request in done:
                self.endpoints[request.replica].finished(request)
            for endpoint in self.endpoints.values():
                for request in endpoint.inbox:
                    endpoint.replica.enqueue(request)
                endpoint.inbox.clear()
            if self.wanted is not None:
                self.pool.scale_to(self.wanted, now)
                self.wanted = None
                await self.open_ports()
                self.scaled.set()
            for endpoint in self.endpoints.values():
                if endpoint.replica.stopped_at is not None and endpoint.server is not None:
                    endpoint.server.close()  # drained: its port refuses connections from now on
                    endpoint.server = None
            before = now


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = ServerModel()
    parser.add_argument("--replicas", type=int, default=1, help="ready replicas at the start")
    parser.add_argument("--max-replicas", type=int, default=64, help="the most POST /replicas may ask for")
    parser.add_argument("--cold-start", type=float, default=defaults.cold_start_s, help="model seconds")
    parser.add_argument("--prefill-tps", type=float, default=defaults.prefill_tokens_per_s)
    parser.add_argument(
        "--kv-tokens", type=int, default=defaults.kv_capacity_tokens, help="KV budget a replica"
    )
    parser.add_argument("--time-scale", type=float, default=1.0, help="model seconds a wall second")
    parser.add_argument("--tick", type=float, default=0.01, help="engine step, wall seconds")
    parser.add_argument("--control-port", type=int, default=0, help="0: the OS picks")
    args = parser.parse_args(argv)
    if not 0 <= args.replicas <= args.max_replicas:
        parser.error("need 0 <= --replicas <= --max-replicas")
    if min(args.prefill_tps, args.kv_tokens, args.time_scale, args.tick) <= 0 or args.cold_start < 0:
        parser.error(
            "--prefill-tps, --kv-tokens, --time-scale and --tick must be positive, --cold-start >= 0"
        )
    if not 0 <= args.control_port <= 65535:
        parser.error("--control-port must be 0..65535")
    return args


async def _main(args: argparse.Namespace) -> None:
    model = ServerModel(
        prefill_tokens_per_s=args.prefill_tps, kv_capacity_tokens=args.kv_tokens, cold_start_s=args.cold_start
    )
    live = LivePool(model, args.replicas, args.time_scale, args.tick, args.max_replicas)
    await live.open_ports()
    control = await serve(HOST, args.control_port, live.control_answer)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    listing = live.listing() | {"control_port": control.sockets[0].getsockname()[1]}
    print(json.dumps(listing), flush=True)
    engine = asyncio.create_task(live.engine())
    engine.add_done_callback(lambda _: stop.set())
    await stop.wait()
    if engine.done():
        engine.result()  # the engine loop failed: its error ends the process
    engine.cancel()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        asyncio.run(_main(args))
    except OSError as exc:
        print(f"fake vLLM pool: {exc}", file=sys.stderr)
        return 1
    return 0
