"""bench/fake_vllm_pool.py, the fake vLLM pool served over HTTP, started as a real process and spoken
to over HTTP; and bench/autoscale_live.py's quick run. No timing is asserted: every time compared is
the pool's own clock, reported in its answers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import autoscale_live  # noqa: E402
from autoscale_sim import live_server  # noqa: E402

PREFILL_TPS = 8000.0


class LivePool:
    def __init__(self, process: subprocess.Popen[str], listing: dict[str, Any]) -> None:
        self.process = process
        self.control = listing["control_port"]
        self.ports = {r["index"]: r["port"] for r in listing["replicas"]}

    def http(self, port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                status, payload = answer.status, answer.read()
                kind = answer.headers.get("Content-Type", "")
        except urllib.error.HTTPError as error:
            status, payload, kind = error.code, error.read(), error.headers.get("Content-Type", "")
        return status, json.loads(payload) if "json" in kind else payload.decode()

    def complete(self, replica: int, **body: Any) -> tuple[int, Any]:
        return self.http(self.ports[replica], "POST", "/v1/completions", json.dumps(body).encode())

    def metrics(self, replica: int) -> dict[str, float]:
        status, text = self.http(self.ports[replica], "GET", "/metrics")
        assert status == 200
        return {
            s.name + json.dumps(s.labels.get("le", "")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def listing(self) -> dict[str, Any]:
        status, body = self.http(self.control, "GET", "/replicas")
        assert status == 200
        replicas: dict[str, Any] = body
        return replicas

    def scale(self, count: Any) -> tuple[int, Any]:
        status, body = self.http(self.control, "POST", "/replicas", json.dumps({"count": count}).encode())
        if status == 200:
            self.ports.update({r["index"]: r["port"] for r in body["replicas"]})
        return status, body


def metric(found: dict[str, float], name: str, le: str = "") -> float:
    return found[name + json.dumps(le)]


def wait_until(check: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.02)
    pytest.fail(f"never: {what}")


@pytest.fixture
def start_pool() -> Iterator[Callable[..., LivePool]]:
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> LivePool:
        process = subprocess.Popen(
            [sys.executable, str(BENCH / "fake_vllm_pool.py"), *args], stdout=subprocess.PIPE, text=True
        )
        started.append(process)
        assert process.stdout is not None
        return LivePool(process, json.loads(process.stdout.readline()))

    yield start
    for process in started:
        process.terminate()
        assert process.wait(timeout=30) == 0  # SIGTERM is a clean stop


def test_answers_carry_ttft_and_latency_and_the_counters_grow_by_the_tokens_sent(
    start_pool: Callable[..., LivePool],
) -> None:
    pool = start_pool("--replicas", "2", "--time-scale", "10")
    shapes = [(1020, 129), (300, 40), (2500, 7), (64, 1)]
    with ThreadPoolExecutor(len(shapes)) as threads:
        answers = list(threads.map(lambda s: pool.complete(0, prompt_tokens=s[0], max_tokens=s[1]), shapes))
    status, words = pool.complete(0, prompt="one two three four five", max_tokens=3)
    assert status == 200 and words["usage"]["prompt_tokens"] == 5
    answers.append((status, words))
    shapes.append((5, 3))
    for (status, body), (prompt, output) in zip(answers, shapes, strict=True):
        assert status == 200 and body["replica"] == 0
        assert body["usage"] == {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
        }
        assert body["ttft_s"] >= prompt / PREFILL_TPS  # the prefill alone takes that long
        assert body["latency_s"] >= body["ttft_s"] > 0
        assert body["ttft_s"] == pytest.approx(body["first_token_s"] - body["arrival_s"])
    found = pool.metrics(0)
    assert metric(found, "vllm:prompt_tokens_total") == sum(p for p, _ in shapes)
    assert metric(found, "vllm:generation_tokens_total") == sum(o for _, o in shapes)
    assert metric(found, "vllm:request_prompt_tokens_count") == len(shapes)
    assert metric(found, "vllm:request_prompt_tokens_sum") == sum(p for p, _ in shapes)
    assert metric(found, "vllm:request_prompt_tokens_bucket", "100.0") == 2  # 5 and 64 tokens
    assert metric(found, "vllm:time_to_first_token_seconds_count") == len(shapes)
    assert metric(found, "vllm:time_to_first_token_seconds_sum") == pytest.approx(
        sum(body["ttft_s"] for _, body in answers)
    )
    for gauge in (
        "num_requests_waiting",
        "num_requests_running",
        "kv_cache_usage_perc",
        "gpu_cache_usage_perc",
    ):
        assert metric(found, f"vllm:{gauge}") == 0
    idle = pool.metrics(1)
    assert metric(idle, "vllm:prompt_tokens_total") == metric(idle, "vllm:request_prompt_tokens_count") == 0


def test_requests_past_the_kv_budget_wait_until_one_finishes(start_pool: Callable[..., LivePool]) -> None:
    pool = start_pool("--replicas", "1", "--time-scale", "10", "--kv-tokens", "8000")
    seen_waiting: list[float] = []

    def watch() -> bool:
        found = pool.metrics(0)
        seen_waiting.append(metric(found, "vllm:num_requests_waiting"))
        return seen_waiting[-1] == 1 and metric(found, "vllm:num_requests_running") == 2

    with ThreadPoolExecutor(3) as threads:
        # 1000 + 3000 tokens each: two fit in 8000, the third waits for KV.
        first_two = [threads.submit(pool.complete, 0, prompt_tokens=1000, max_tokens=3000) for _ in range(2)]
        wait_until(lambda: pool.listing()["replicas"][0]["outstanding"] == 2, "two requests held")
        third = threads.submit(pool.complete, 0, prompt_tokens=1000, max_tokens=3000)
        wait_until(watch, "the third request waiting while two run")
        answers = [f.result()[1] for f in first_two]
        status, waited = third.result()
    assert status == 200
    assert waited["first_token_s"] >= min(a["finished_s"] for a in answers)
    assert metric(pool.metrics(0), "vllm:num_requests_waiting") == 0


def test_a_new_replica_answers_503_until_its_cold_start_has_passed(
    start_pool: Callable[..., LivePool],
) -> None:
    pool = start_pool("--replicas", "1", "--time-scale", "10", "--cold-start", "30")
    status, listing = pool.scale(2)
    assert status == 200
    new = listing["replicas"][1]
    assert new["state"] == "starting" and new["ready_at_s"] == pytest.approx(new["created_s"] + 30)
    status, refused = pool.complete(1, prompt_tokens=10, max_tokens=2)
    assert status == 503 and "starting" in refused["error"]
    assert pool.http(pool.ports[1], "GET", "/metrics")[0] == 503
    answer = wait_until(
        lambda: (lambda a: a[1] if a[0] == 200 else None)(pool.complete(1, prompt_tokens=10, max_tokens=2)),
        "the new replica serving",
    )
    assert answer["arrival_s"] >= new["ready_at_s"]
    assert [r["state"] for r in pool.listing()["replicas"]] == ["ready", "ready"]


def test_removing_a_replica_drains_what_it_holds_then_closes_its_port(
    start_pool: Callable[..., LivePool],
) -> None:
    pool = start_pool("--replicas", "2", "--time-scale", "10")
    with ThreadPoolExecutor(1) as threads:
        held = threads.submit(pool.complete, 1, prompt_tokens=500, max_tokens=2000)
        wait_until(lambda: pool.listing()["replicas"][1]["outstanding"] == 1, "replica 1 holding a request")
        status, listing = pool.scale(1)  # the newest of equals goes: replica 1
        assert status == 200
        assert [r["state"] for r in listing["replicas"]] == ["ready", "draining"]
        status, refused = pool.complete(1, prompt_tokens=10, max_tokens=2)
        assert status == 503 and "draining" in refused["error"]
        status, finished = held.result()
    assert status == 200 and finished["usage"]["completion_tokens"] == 2000
    stopped = wait_until(lambda: pool.listing()["replicas"][1]["stopped_s"], "replica 1 stopped")
    assert stopped >= finished["finished_s"]
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{pool.ports[1]}/metrics", timeout=10)
    assert pool.complete(0, prompt_tokens=10, max_tokens=2)[0] == 200


def raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_malformed_requests_get_a_4xx_with_one_reason_and_the_pool_keeps_serving(
    start_pool: Callable[..., LivePool],
) -> None:
    pool = start_pool("--replicas", "1", "--max-replicas", "8")
    port = pool.ports[0]
    cases: list[tuple[int, str, str, bytes | None]] = [
        (400, "POST", "/v1/completions", b"{not json"),
        (400, "POST", "/v1/completions", b"[1, 2]"),
        (400, "POST", "/v1/completions", b"{}"),
        (400, "POST", "/v1/completions", b'{"prompt_tokens": 0}'),
        (400, "POST", "/v1/completions", b'{"prompt_tokens": "12"}'),
        (400, "POST", "/v1/completions", b'{"prompt_tokens": true}'),
        (400, "POST", "/v1/completions", b'{"prompt_tokens": 10, "max_tokens": 1000000}'),
        (400, "POST", "/v1/completions", b'{"prompt": ""}'),
        (413, "POST", "/v1/completions", b" " * (live_server.MAX_TOKENS)),
        (405, "GET", "/v1/completions", None),
        (404, "GET", "/v1/chat", None),
    ]
    for expected, method, path, body in cases:
        status, answer = pool.http(port, method, path, body)
        assert status == expected, (method, path, body and body[:40])
        assert set(answer) == {"error"} and "\n" not in answer["error"]
    for count in (-1, 9, "2", None):
        status, answer = pool.scale(count)
        assert status == 400 and "count must be an integer from 0 to 8" in answer["error"]
    assert pool.http(pool.control, "GET", "/other")[0] == 404
    assert raw_exchange(port, b"HELLO\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    chunked = b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert raw_exchange(port, chunked).startswith(b"HTTP/1.1 411 ")
    assert raw_exchange(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n").startswith(
        b"HTTP/1.1 431 "
    )
    assert pool.complete(0, prompt_tokens=10, max_tokens=2)[0] == 200
    assert pool.process.poll() is None


def test_bad_arguments_are_usage_errors() -> None:
    for main, argv in (
        (live_server.main, ["--time-scale", "0"]),
        (live_server.main, ["--replicas", "5", "--max-replicas", "2"]),
        (autoscale_live.main, ["--ramp-rps", "3"]),
        (autoscale_live.main, ["--time-scale", "-1"]),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2


@pytest.mark.slow
def test_quick_live_run_reports_each_policy_live_and_simulated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "autoscale_live.json"
    assert autoscale_live.main(["--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert [r["policy"] for r in report["live"]] == [r["policy"] for r in report["simulated"]]
    assert report["live"][0]["policy"] == "aibrix-apa"
    for live, simulated in zip(report["live"], report["simulated"], strict=True):
        assert live["requests"] == simulated["requests"] > 0
        assert live["served"] == live["requests"]  # every request answered over HTTP
        assert 0.0 <= live["slo_attainment"] <= 1.0
        assert live["ttft_p50_s"] <= live["ttft_p95_s"] <= live["ttft_p99_s"]
        assert live["replica_seconds"] > 0
        assert f"live - simulator, {live['policy']}: attainment" in printed
    assert "time: x5 (1 wall second = 5 model seconds" in printed
