"""The autoscaling controller's own logic: reading Prometheus answers and text expositions, rates
and staleness (`neuronetes_operator.metrics_source`), and one pool's tick on a fake clock
(`neuronetes_operator.autoscaler.PoolState.step`). Prometheus answers come from a real HTTP server."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from neuronetes.api.models import Autoscaling, AutoscalingMetrics, MetricNames, ScalingBehavior
from neuronetes.autoscale import Bounds
from neuronetes_operator.autoscaler import LagAsk, PoolState, replica_counts, rotate
from neuronetes_operator.metrics_source import (
    FIRST_SCRAPE,
    MetricsError,
    PodCounters,
    PodSample,
    PrometheusClient,
    Reading,
    parse_exposition,
    parse_query_answer,
    pool_queries,
    pool_reading,
    prometheus_reading,
    scrape,
)

pytestmark = pytest.mark.unit

NAMES = MetricNames()

# ---- Prometheus answers ------------------------------------------------------------------------------


def test_a_vector_answer_gives_each_sample() -> None:
    body = json.dumps(
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {"pod": "p-0"}, "value": [1700.5, "42"]}]},
        }
    ).encode()
    assert parse_query_answer(body) == [({"pod": "p-0"}, 42.0, 1700.5)]


def test_a_scalar_answer_is_one_sample() -> None:
    body = b'{"status":"success","data":{"resultType":"scalar","result":[10,"3.5"]}}'
    assert parse_query_answer(body) == [({}, 3.5, 10.0)]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>", "not JSON"),
        (b'{"status":"error","error":"parse error at char 4"}', "parse error at char 4"),
        (b'{"status":"success","data":{"resultType":"matrix","result":[]}}', "'matrix'"),
        (b'{"status":"success","data":{"resultType":"vector","result":[{"value":[1]}]}}', "malformed"),
    ],
)
def test_a_bad_answer_is_one_clear_error(body: bytes, said: str) -> None:
    with pytest.raises(MetricsError, match=said):
        parse_query_answer(body)


def test_the_pool_queries_select_the_pools_pods_and_aggregate_as_documented() -> None:
    q = pool_queries(NAMES, 'namespace="ns",pod=~"a|b"', 30)
    sel = '{namespace="ns",pod=~"a|b"}'
    assert q["waiting_requests"] == f"sum(vllm:num_requests_waiting{sel})"
    assert q["prefill_tokens_per_second"] == f"sum(rate(vllm:prompt_tokens_total{sel}[30s]))"
    assert q["request_rate"] == f"sum(rate(vllm:request_prompt_tokens_count{sel}[30s]))"
    assert q["kv_cache_usage"] == f"max(vllm:kv_cache_usage_perc{sel})"
    assert "tokens_in_queue" not in q  # estimated from waiting × mean prompt length


class _Prometheus:
    """A real HTTP server answering /api/v1/query from a table: query → (value, timestamp)."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[float, float]] = {}
        self.queries: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                from urllib.parse import parse_qs, urlparse

                expr = parse_qs(urlparse(self.path).query)["query"][0]
                outer.queries.append(expr)
                found = next((v for k, v in outer.answers.items() if expr.startswith(k)), None)
                result = [] if found is None else [{"metric": {}, "value": [found[1], str(found[0])]}]
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def prom() -> Iterator[_Prometheus]:
    p = _Prometheus()
    yield p
    p.server.shutdown()


def _answer_pool(prom: _Prometheus, at: float) -> None:
    prom.answers.update(
        {
            "sum(vllm:num_requests_waiting": (4, at),
            "sum(vllm:num_requests_running": (2, at),
            "sum(rate(vllm:prompt_tokens_total": (3000, at),
            "sum(rate(vllm:request_prompt_tokens_count": (3, at),
            "max(vllm:kv_cache_usage_perc": (0.5, at),
            "sum(vllm:request_prompt_tokens_sum": (50_000, at),
            "sum(vllm:request_prompt_tokens_count": (100, at),
            "max(timestamp(vllm:num_requests_waiting": (at - 3, at),
        }
    )


def test_a_fresh_prometheus_reading_estimates_the_queued_tokens(prom: _Prometheus) -> None:
    _answer_pool(prom, 1000.0)
    r = prometheus_reading(PrometheusClient(prom.url, 2), AutoscalingMetrics(), "ns", ["p-0"], 60, 1000.0)
    assert r.stale == () and r.problem is None
    assert r.values["tokens_in_queue"] == 4 * 50_000 / 100  # waiting × mean prompt length
    assert r.values["prefill_tokens_per_second"] == 3000 and r.values["kv_cache_usage"] == 0.5
    assert all('{namespace="ns",pod=~`p\\-0`}' in q for q in prom.queries)


def test_samples_older_than_the_staleness_bound_are_all_stale(prom: _Prometheus) -> None:
    _answer_pool(prom, 1000.0)
    spec = AutoscalingMetrics(staleness_seconds=30)
    r = prometheus_reading(PrometheusClient(prom.url, 2), spec, "ns", ["p-0"], 60, 1000.0 + 60)
    assert set(r.stale) == set(r.values) and "s old" in (r.problem or "")


def test_no_series_for_the_pool_is_missing_metrics(prom: _Prometheus) -> None:
    r = prometheus_reading(PrometheusClient(prom.url, 2), AutoscalingMetrics(), "ns", ["p-0"], 60, 1000.0)
    assert "request_rate" in r.stale and "no series" in (r.problem or "")


def test_an_unreachable_prometheus_is_every_metric_stale(prom: _Prometheus) -> None:
    url = prom.url
    prom.server.shutdown()
    prom.server.server_close()
    r = prometheus_reading(PrometheusClient(url, 0.5), AutoscalingMetrics(), "ns", ["p-0"], 60, 1000.0)
    assert r.values["waiting_requests"] is None and len(r.stale) == 6
    assert "did not answer" in (r.problem or "")


# ---- the pods' /metrics ------------------------------------------------------------------------------

EXPOSITION = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 3
vllm:num_requests_waiting{model_name="b"} 1
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.25
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="a"} 12000
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{model_name="a",le="+Inf"} 10
vllm:request_prompt_tokens_count{model_name="a"} 10
vllm:request_prompt_tokens_sum{model_name="a"} 12000
"""


def test_the_text_exposition_is_summed_over_the_pods_series() -> None:
    s = parse_exposition(EXPOSITION, NAMES)
    assert (s.waiting, s.running, s.kv_cache_usage) == (4, 2, 0.25)
    assert (s.prompt_tokens, s.request_count, s.request_prompt_sum) == (12000, 10, 12000)


def test_the_older_kv_metric_stands_in() -> None:
    text = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.7\n"
    assert parse_exposition(text, NAMES).kv_cache_usage == 0.7


def test_text_that_is_not_the_exposition_format_is_an_error() -> None:
    with pytest.raises(MetricsError, match="not the Prometheus text format"):
        parse_exposition("vllm:num_requests_waiting{ 3\n", NAMES)


def test_rates_come_from_two_scrapes_and_survive_a_restarted_engine() -> None:
    counters = PodCounters()
    assert counters.rates(100.0, {"a": PodSample(prompt_tokens=1000, request_count=1)}) == (None, None)
    tokens, requests = counters.rates(110.0, {"a": PodSample(prompt_tokens=6000, request_count=11)})
    assert (tokens, requests) == (500.0, 1.0)
    # the engine restarted: its counter starts from zero again and counts from there
    tokens, _ = counters.rates(120.0, {"a": PodSample(prompt_tokens=2000, request_count=2)})
    assert tokens == 200.0


def test_the_first_scrape_holds_without_a_warning() -> None:
    first = pool_reading({"a": parse_exposition(EXPOSITION, NAMES)}, {}, (None, None), NAMES)
    assert first.stale == ("request_rate",) and first.problem == FIRST_SCRAPE
    step = _tick(PoolState(SPEC, 5.0), 1000.0, 3, first)
    assert step.rule == "hold:stale-metrics" and step.events == [] and step.conditions is None


def test_a_ready_pod_not_scraped_makes_the_pool_stale() -> None:
    samples = {"a": parse_exposition(EXPOSITION, NAMES)}
    fresh = pool_reading(samples, {}, (100.0, 1.0), NAMES)
    assert fresh.stale == () and fresh.values["tokens_in_queue"] == 4 * 1200
    short = pool_reading(samples, {"b": "connection refused"}, (100.0, 1.0), NAMES)
    assert len(short.stale) == 6 and "b: connection refused" in (short.problem or "")


# ---- one pool's tick ---------------------------------------------------------------------------------


def _pods(ready: int, starting: int = 0) -> list[dict[str, Any]]:
    def pod(i: int, is_ready: bool) -> dict[str, Any]:
        cond = [{"type": "Ready", "status": "True" if is_ready else "False"}]
        return {"metadata": {"name": f"p-{i}"}, "status": {"phase": "Running", "conditions": cond}}

    return [pod(i, True) for i in range(ready)] + [pod(ready + i, False) for i in range(starting)]


def _reading(tokens: float, tps: float, rate: float, stale: tuple[str, ...] = ()) -> Reading:
    values = {
        "tokens_in_queue": tokens,
        "prefill_tokens_per_second": tps,
        "waiting_requests": tokens / 1000,
        "running_requests": 1.0 if tps else 0.0,
        "kv_cache_usage": 0.2,
        "request_rate": rate,
    }
    return Reading(values, stale, "Prometheus did not answer" if stale else None)


SPEC = Autoscaling(
    ttft_ms=2000,
    cooldown_seconds=10,
    tokens_per_second=1000,
    behavior=ScalingBehavior(stabilization_window_seconds=0),
)
BOUNDS = Bounds(1, 8)


def _tick(state: PoolState, now: float, current: int, reading: Reading | None, **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        now=now,
        current=current,
        pods=_pods(current),
        bounds=BOUNDS,
        reading=reading,
        lag=None,
        conflict=None,
        conditions=[],
        generation=1,
    )
    args.update(kw)
    return state.step(**args)


def test_a_breach_scales_up_with_an_event_and_status_holding_the_numbers() -> None:
    state = PoolState(SPEC, 5.0)
    step = _tick(state, 1000.0, 2, _reading(tokens=20_000, tps=2000, rate=5))
    assert (step.desired, step.rule) == (4, "ttft-slo")  # 10 s expected TTFT > 2 s: the ×2 cap
    assert step.status["desiredReplicas"] == 4 and step.status["expectedTTFTSeconds"] == 10.0
    assert (
        step.status["nextDecisionTime"].endswith("Z") and step.status["inputs"]["tokens_in_queue"] == 20_000
    )
    (event,) = step.events
    assert event[:2] == ("Normal", "AutoscaledUp") and "2 -> 4 replicas by ttft-slo" in event[2]


def test_the_time_to_ready_is_observed_once_the_scaled_up_replicas_are_ready() -> None:
    state = PoolState(SPEC, 5.0)
    _tick(state, 1000.0, 2, _reading(tokens=20_000, tps=2000, rate=5))
    # A backlog still standing (no window in SPEC: an empty queue would be right-sized at once).
    backlog = _reading(3000, 2000, 5)
    starting = _tick(state, 1005.0, 4, backlog, pods=_pods(2, starting=2))
    assert starting.ready_after_s == []
    assert _tick(state, 1010.0, 4, backlog, pods=_pods(4)).ready_after_s == [10.0]
    assert _tick(state, 1015.0, 4, backlog, pods=_pods(4)).ready_after_s == []


def test_stale_metrics_hold_with_one_warning_per_change_and_a_condition() -> None:
    state = PoolState(SPEC, 5.0)
    stale = ("tokens_in_queue", "request_rate")
    first = _tick(state, 1000.0, 3, _reading(0, 0, 0, stale))
    assert (first.desired, first.rule) == (3, "hold:stale-metrics")
    assert [e[1] for e in first.events] == ["MetricsStale"]
    assert first.conditions is not None and first.conditions[0]["type"] == "MetricsStale"
    later = _tick(state, 1030.0, 3, _reading(0, 0, 0, stale), conditions=first.conditions)
    assert later.events == [] and later.conditions is None and later.desired == 3
    fresh = _tick(state, 1035.0, 3, _reading(0, 0, 0), conditions=first.conditions)
    assert fresh.conditions == []  # the condition goes with the problem


def test_an_idle_pool_steps_down_one_replica_after_the_cooldown_never_below_min() -> None:
    state = PoolState(SPEC, 5.0)
    current, now, seen = 3, 1000.0, []
    for _ in range(12):
        step = _tick(state, now, current, _reading(0, 0, 0))
        seen.append(step.desired)
        current, now = step.desired, now + 5
    assert seen[:2] == [3, 3]  # the first reading counts as a request: one cooldown first
    steps = [b - a for a, b in itertools.pairwise(seen) if a != b]
    assert steps == [-1, -1] and seen[-1] == BOUNDS.min_replicas


def test_another_autoscaler_makes_the_pool_passive() -> None:
    state = PoolState(SPEC, 5.0)
    hpa = "HorizontalPodAutoscaler ns/web"
    step = _tick(state, 1000.0, 2, None, conflict=hpa)
    assert (step.desired, step.rule) == (2, "hold:conflict") and step.status["conflict"] == hpa
    assert step.conditions is not None and step.conditions[0]["type"] == "AutoscalerConflict"
    assert [e[1] for e in step.events] == ["AutoscalerConflict"]
    assert _tick(state, 1005.0, 2, None, conflict=hpa, conditions=step.conditions).events == []


def test_a_bindings_lag_wins_when_it_asks_for_more() -> None:
    state = PoolState(SPEC, 5.0)
    lag = LagAsk(desired=6, lag=250, binding="tasks")
    step = _tick(state, 1000.0, 2, _reading(0, 0, 1), lag=lag)
    assert (step.desired, step.rule) == (6, "toolbinding-lag")
    assert "ToolBinding tasks" in step.events[0][2] and step.status["inputs"]["lag"] == 250


def test_a_pool_without_autoscaling_follows_only_its_bindings() -> None:
    state = PoolState(None, 5.0)
    assert _tick(state, 1000.0, 2, None).desired == 2
    assert _tick(state, 1005.0, 2, None, lag=LagAsk(desired=20, lag=900, binding="b")).desired == 8


def test_replica_counts_and_turns() -> None:
    pods = [
        *_pods(2, starting=1),
        {
            "metadata": {"name": "u"},
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            },
        },
        {"metadata": {"name": "gone", "deletionTimestamp": "x"}, "status": {}},
    ]
    counts = replica_counts(4, pods)
    assert (counts.ready, counts.starting, counts.unschedulable) == (2, 1, 1)
    served: list[int] = []
    turn = 0
    for _ in range(3):
        taken, turn = rotate(list(range(5)), turn, 2)
        served += taken
    assert served == [0, 1, 2, 3, 4, 0]


# ---- source: pods, against the fake engine process -------------------------------------------------


@pytest.fixture
def engine() -> Iterator[str]:
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = Path(__file__).parents[1] / "e2e" / "fake_vllm.py"
    proc = subprocess.Popen([sys.executable, str(fake), str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                scrape(f"{url}/pods/x/metrics", 1, 1 << 20, NAMES)
                break
            except MetricsError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_scraped_pods_give_sums_rates_and_a_bounded_body(engine: str) -> None:
    import urllib.request

    body = json.dumps({"pods": "chat-", "waiting": 3, "running": 1, "kv": 0.4, "requestsPerSecond": 10})
    urllib.request.urlopen(urllib.request.Request(f"{engine}/load", body.encode()), timeout=5).read()
    counters = PodCounters()
    pods = ("chat-0", "chat-1")
    first = {p: scrape(f"{engine}/pods/{p}/metrics", 2, 1 << 20, NAMES) for p in pods}
    counters.rates(0.0, first)  # the caller's clock: the second scrape is "2 s" later
    second = {p: scrape(f"{engine}/pods/{p}/metrics", 2, 1 << 20, NAMES) for p in pods}
    tokens_rate, requests_rate = counters.rates(2.0, second)
    assert (
        tokens_rate is not None
        and requests_rate is not None
        and tokens_rate == pytest.approx(requests_rate * 1000)
    )
    r = pool_reading(second, {}, (tokens_rate, requests_rate), NAMES)
    assert (r.values["waiting_requests"], r.values["running_requests"], r.values["kv_cache_usage"]) == (
        6,
        2,
        0.4,
    )
    assert r.values["tokens_in_queue"] == 6 * 1000 and r.stale == ()
    with pytest.raises(MetricsError, match="body over 1024 bytes"):
        scrape(f"{engine}/pods/chat-0/metrics", 2, 1024, NAMES)
