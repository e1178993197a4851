"""A fake vLLM metrics endpoint for the autoscaling e2e tests: one HTTP process, any number of pods.

``python tests/e2e/fake_vllm.py PORT`` serves, on 127.0.0.1:PORT,

- ``GET /pods/<name>/metrics``: pod ``<name>``'s vLLM metrics in the Prometheus text format
  (``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``,
  ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_prompt_tokens``
  and ``vllm:time_to_first_token_seconds`` histograms). A pod seen for the first time starts with
  the current load;
- ``POST /load`` with JSON ``{"pods": "chat-", "waiting": 40, "running": 2, "kv": 0.3,
  "requestsPerSecond": 5, "promptTokensPerRequest": 1000, "ttftSeconds": 0.2}`` (any subset): the
  load, per pod, from now on of every pod whose name starts with ``pods`` (other pods: idle).
  Counters grow at ``requestsPerSecond`` (× ``promptTokensPerRequest`` for prompt tokens);
- ``POST /queue`` with ``{"depth": 130}``: the gauge ``kafka_consumergroup_lag{consumergroup="workers",
  topic="tasks",partition="0"}`` on ``GET /queue/metrics`` (a ToolBinding's broker as its exporter
  shows it).

Prometheus scrapes one target per pod (``__metrics_path__`` set per target in a file_sd file), so
each series carries the pod's ``namespace`` and ``pod`` labels as in a cluster.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PROMPT_BUCKETS = (128, 512, 1024, 4096, 16384)


@dataclass
class PodLoad:
    """One pod's counters, advanced lazily from its load."""

    load: dict[str, float]
    at: float = field(default_factory=time.monotonic)
    requests: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0

    def advance(self, now: float) -> None:
        dt, self.at = now - self.at, now
        arrived = self.load["requestsPerSecond"] * dt
        self.requests += arrived
        self.prompt_tokens += arrived * self.load["promptTokensPerRequest"]
        self.generation_tokens += arrived * 64

    def exposition(self) -> str:
        load, n = self.load, self.requests
        ttft, prompt = load["ttftSeconds"], load["promptTokensPerRequest"]
        lines = [
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{model_name="fake"}} {load["waiting"]}',
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="fake"}} {load["running"]}',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{model_name="fake"}} {load["kv"]}',
            "# TYPE vllm:prompt_tokens counter",
            f'vllm:prompt_tokens_total{{model_name="fake"}} {self.prompt_tokens}',
            "# TYPE vllm:generation_tokens counter",
            f'vllm:generation_tokens_total{{model_name="fake"}} {self.generation_tokens}',
        ]
        for name, buckets, each in (
            ("vllm:time_to_first_token_seconds", BUCKETS, ttft),
            ("vllm:request_prompt_tokens", PROMPT_BUCKETS, prompt),
        ):
            lines.append(f"# TYPE {name} histogram")
            for le in buckets:
                lines.append(f'{name}_bucket{{model_name="fake",le="{le}"}} {n if each <= le else 0}')
            lines += [
                f'{name}_bucket{{model_name="fake",le="+Inf"}} {n}',
                f'{name}_count{{model_name="fake"}} {n}',
                f'{name}_sum{{model_name="fake"}} {n * each}',
            ]
        return "\n".join(lines) + "\n"


class FakeEngine:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle = {
            "waiting": 0.0,
            "running": 0.0,
            "kv": 0.0,
            "requestsPerSecond": 0.0,
            "promptTokensPerRequest": 1000.0,
            "ttftSeconds": 0.1,
        }
        self.loads: dict[str, dict[str, float]] = {}
        """Pod name prefix → the load of each pod it names."""
        self.pods: dict[str, PodLoad] = {}
        self.queue_depth = 0.0

    def load_of(self, pod: str) -> dict[str, float]:
        prefixes = [p for p in self.loads if pod.startswith(p)]
        return dict(self.loads[max(prefixes, key=len)] if prefixes else self.idle)

    def set_load(self, change: dict[str, Any]) -> dict[str, float]:
        prefix = str(change.get("pods", ""))
        with self.lock:
            now = time.monotonic()
            for pod in self.pods.values():
                pod.advance(now)
            load = self.loads.setdefault(prefix, dict(self.idle))
            load.update({k: float(v) for k, v in change.items() if k in self.idle})
            for name, pod in self.pods.items():
                pod.load = self.load_of(name)
            return dict(load)

    def metrics(self, pod: str) -> str:
        with self.lock:
            state = self.pods.setdefault(pod, PodLoad(self.load_of(pod)))
            state.advance(time.monotonic())
            return state.exposition()


def serve(port: int) -> None:
    engine = FakeEngine()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def _answer(self, code: int, body: str, kind: str = "text/plain; version=0.0.4") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            if len(parts) == 3 and parts[0] == "pods" and parts[2] == "metrics":
                self._answer(200, engine.metrics(parts[1]))
            elif self.path == "/queue/metrics":
                self._answer(
                    200,
                    "# TYPE kafka_consumergroup_lag gauge\n"
                    f'kafka_consumergroup_lag{{consumergroup="workers",topic="tasks",partition="0"}} '
                    f"{engine.queue_depth}\n",
                )
            else:
                self._answer(404, "not found\n")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/load":
                answer: Any = engine.set_load(body)
            elif self.path == "/queue":
                engine.queue_depth = answer = float(body["depth"])
            else:
                self._answer(404, "not found\n")
                return
            self._answer(200, json.dumps(answer), "application/json")

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
