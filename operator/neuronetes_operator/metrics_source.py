"""Where the autoscaler's numbers come from: Prometheus's HTTP API, or the pods' own /metrics.

Both give one `Reading` of a pool: the signals `neuronetes.autoscale.PoolSignals` holds, and which of
them are stale (missing, unreadable or older than ``metrics.stalenessSeconds``) with the reason.
The parsing (`parse_query_answer`, `parse_exposition`) and the arithmetic (`PodCounters`,
`pool_reading`) are pure; `PrometheusClient` and `scrape` do the HTTP, bounded in time and size.
docs/autoscaling.md ("The controller") states the PromQL.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from neuronetes.api.models import AutoscalingMetrics, MetricNames
from neuronetes.autoscale.signals import METRIC_NAMES

__all__ = [
    "FIRST_SCRAPE",
    "MetricsError",
    "PodCounters",
    "PodSample",
    "PrometheusClient",
    "Reading",
    "parse_exposition",
    "parse_query_answer",
    "pool_queries",
    "pool_reading",
    "prometheus_reading",
    "scrape",
]


class MetricsError(Exception):
    """A metric could not be read (no answer, an error answer, a body that is not what was asked)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of a pool: `PoolSignals`' metric fields, and those not to be trusted."""

    values: Mapping[str, float | None]
    stale: tuple[str, ...] = ()
    problem: str | None = None
    """Why metrics are stale, in one line (None: all fresh)."""


# ---- Prometheus -------------------------------------------------------------------------------------


def parse_query_answer(body: bytes) -> list[tuple[dict[str, str], float, float]]:
    """(labels, value, timestamp) of each sample of an /api/v1/query answer (vector or scalar).

    Raises:
        MetricsError: not JSON, ``status`` not success (Prometheus's ``error`` is the message), or a
            result type other than vector/scalar.
    """
    try:
        answer = json.loads(body)
    except ValueError as exc:
        raise MetricsError(f"Prometheus answered something that is not JSON: {exc}") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise MetricsError(f"Prometheus refused the query: {error or 'no status success'}")
    data = answer.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if result is None:
        raise MetricsError("Prometheus answered no result")
    try:
        if kind == "scalar":
            return [({}, float(result[1]), float(result[0]))]
        if kind == "vector":
            return [(dict(s.get("metric") or {}), float(s["value"][1]), float(s["value"][0])) for s in result]
    except (TypeError, KeyError, IndexError, ValueError) as exc:
        raise MetricsError(f"Prometheus answered a malformed {kind}: {exc}") from None
    raise MetricsError(f"Prometheus answered a {kind!r}, not an instant vector")


class PrometheusClient:
    """GET ``<url>/api/v1/query`` with a timeout; an answer is `parse_query_answer`'s."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, expr: str) -> list[tuple[dict[str, str], float, float]]:
        target = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(target, timeout=self.timeout_s) as answer:
                body = answer.read(16 << 20)
        except urllib.error.HTTPError as exc:  # 400/422 carry Prometheus's error in the JSON body
            body = exc.read(1 << 20)
            if not body:
                raise MetricsError(f"Prometheus at {self.url} answered HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise MetricsError(f"Prometheus at {self.url} did not answer: {exc}") from None
        return parse_query_answer(body)

    def scalar(self, expr: str) -> float | None:
        """The one value of an aggregated query (None: no series matched)."""
        samples = self.query(expr)
        return samples[0][1] if samples else None


def pod_selector(namespace: str, pods: Sequence[str]) -> str:
    """The PromQL label matchers of a pool's pods: ``namespace="ns",pod=~`a|b```.

    The regex is a raw (backtick) PromQL string, so its escapes reach RE2 as they are.
    """
    names = "|".join(re.escape(p) for p in sorted(pods)) or "^$"
    return f'namespace="{namespace}",pod=~`{names}`'


def pool_queries(names: MetricNames, selector: str, window_s: int) -> dict[str, str]:
    """The PromQL of each quantity a pool's reading is made of (docs/autoscaling.md lists them)."""
    sel, w = "{" + selector + "}", f"[{window_s}s]"
    queries = {
        "waiting_requests": f"sum({names.waiting_requests}{sel})",
        "running_requests": f"sum({names.running_requests}{sel})",
        "prefill_tokens_per_second": f"sum(rate({names.prompt_tokens}{sel}{w}))",
        "request_rate": f"sum(rate({names.request_prompt_tokens}_count{sel}{w}))",
        "kv_cache_usage": f"max({names.kv_cache_usage}{sel})",
        "kv_cache_usage_fallback": f"max({names.kv_cache_usage_fallback}{sel})",
        "prompt_tokens_sum": f"sum({names.request_prompt_tokens}_sum{sel})",
        "prompt_tokens_count": f"sum({names.request_prompt_tokens}_count{sel})",
        # The newest sample of the waiting gauge, the engine's heartbeat: older than the staleness
        # bound means the scrapes stopped (Prometheus keeps answering the last value for 5 min).
        "newest_sample": f"max(timestamp({names.waiting_requests}{sel}))",
    }
    if names.queued_prompt_tokens:
        queries["tokens_in_queue"] = f"sum({names.queued_prompt_tokens}{sel})"
    return queries


def prometheus_reading(
    client: PrometheusClient,
    spec: AutoscalingMetrics,
    namespace: str,
    pods: Sequence[str],
    window_s: int,
    now: float,
) -> Reading:
    """A pool's reading from Prometheus (``now``: wall-clock seconds, Prometheus's clock)."""
    found: dict[str, float | None] = {}
    try:
        for key, expr in pool_queries(spec.queries, pod_selector(namespace, pods), window_s).items():
            found[key] = client.scalar(expr)
    except MetricsError as exc:
        return Reading(dict.fromkeys(METRIC_NAMES), METRIC_NAMES, str(exc))
    if found["kv_cache_usage"] is None:
        found["kv_cache_usage"] = found["kv_cache_usage_fallback"]
    values = _signals(found, spec.queries)
    newest = found["newest_sample"]
    if newest is None:
        return _with_missing(values, f"no series of {spec.queries.waiting_requests} for the pool's pods")
    age = now - newest
    if age > spec.staleness_seconds:
        return Reading(values, METRIC_NAMES, f"the pool's newest sample is {age:.0f}s old")
    return _with_missing(values, None)


# ---- the pods' /metrics -----------------------------------------------------------------------------


FIRST_SCRAPE = "rates need a second scrape"
"""The problem of a pool's first reading from its pods (held, without a Warning)."""


@dataclass(frozen=True, slots=True)
class PodSample:
    """What one pod's /metrics said (None: the pod does not export that metric)."""

    waiting: float | None = None
    running: float | None = None
    prompt_tokens: float | None = None
    request_count: float | None = None
    request_prompt_sum: float | None = None
    kv_cache_usage: float | None = None
    queued_prompt_tokens: float | None = None


def parse_exposition(text: str, names: MetricNames) -> PodSample:
    """One pod's Prometheus text exposition, summed over its series (an engine may label by model).

    Raises:
        MetricsError: the text is not the exposition format.
    """
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if math.isfinite(sample.value):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"not the Prometheus text format: {exc}") from None
    counter = names.prompt_tokens
    kv = totals.get(names.kv_cache_usage, totals.get(names.kv_cache_usage_fallback))
    return PodSample(
        waiting=totals.get(names.waiting_requests),
        running=totals.get(names.running_requests),
        # The parser names a counter's sample with _total whether or not the family had it.
        prompt_tokens=totals.get(counter, totals.get(f"{counter.removesuffix('_total')}_total")),
        request_count=totals.get(f"{names.request_prompt_tokens}_count"),
        request_prompt_sum=totals.get(f"{names.request_prompt_tokens}_sum"),
        kv_cache_usage=kv,
        queued_prompt_tokens=totals.get(names.queued_prompt_tokens) if names.queued_prompt_tokens else None,
    )


def scrape(url: str, timeout_s: float, max_bytes: int, names: MetricNames) -> PodSample:
    """GET a pod's /metrics (at most ``max_bytes``, ``timeout_s``) and parse it.

    Raises:
        MetricsError: no answer, not 200, a body over ``max_bytes``, or not the text format.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            body = answer.read(max_bytes + 1)
    except (OSError, ValueError) as exc:
        raise MetricsError(f"{url}: {exc}") from None
    if len(body) > max_bytes:
        raise MetricsError(f"{url}: body over {max_bytes} bytes")
    return parse_exposition(body.decode("utf-8", "replace"), names)


@dataclass(slots=True)
class PodCounters:
    """The previous scrape's counters of each pod, for rates between two scrapes."""

    at: float | None = None
    prompt_tokens: dict[str, float] = field(default_factory=dict)
    requests: dict[str, float] = field(default_factory=dict)

    def rates(self, now: float, samples: Mapping[str, PodSample]) -> tuple[float | None, float | None]:
        """(prompt tokens/s, requests/s) of the pool since the last call; None on the first.

        Only pods in both scrapes count; a counter lower than before (a restarted engine) counts
        from zero.
        """
        previous_at, tokens_before, requests_before = self.at, self.prompt_tokens, self.requests
        self.at = now
        self.prompt_tokens = {p: s.prompt_tokens for p, s in samples.items() if s.prompt_tokens is not None}
        self.requests = {p: s.request_count for p, s in samples.items() if s.request_count is not None}
        if previous_at is None or now <= previous_at:
            return None, None
        dt = now - previous_at
        return (
            _increase(tokens_before, self.prompt_tokens, dt),
            _increase(requests_before, self.requests, dt),
        )


def _increase(before: Mapping[str, float], after: Mapping[str, float], dt: float) -> float | None:
    common = before.keys() & after.keys()
    if not common and after:
        return None
    return sum(after[p] - before[p] if after[p] >= before[p] else after[p] for p in common) / dt


def pool_reading(
    samples: Mapping[str, PodSample],
    failed: Mapping[str, str],
    rates: tuple[float | None, float | None],
    names: MetricNames,
) -> Reading:
    """The pool's reading from its pods' scrapes: gauges summed, KV use the highest, the rates given.

    ``failed``: the ready pods whose scrape failed (pod → why); any makes every metric stale (the sums
    would be short, and a short queue must not scale down).
    """

    def total(attr: str) -> float | None:
        found = [getattr(s, attr) for s in samples.values() if getattr(s, attr) is not None]
        return sum(found) if found else None

    kv = [s.kv_cache_usage for s in samples.values() if s.kv_cache_usage is not None]
    found = {
        "waiting_requests": total("waiting"),
        "running_requests": total("running"),
        "prefill_tokens_per_second": rates[0],
        "request_rate": rates[1],
        "kv_cache_usage": max(kv) if kv else None,
        "prompt_tokens_sum": total("request_prompt_sum"),
        "prompt_tokens_count": total("request_count"),
    }
    if names.queued_prompt_tokens:
        found["tokens_in_queue"] = total("queued_prompt_tokens")
    values = _signals(found, names)
    if failed:
        pod, why = sorted(failed.items())[0]
        return Reading(values, METRIC_NAMES, f"{len(failed)} ready pod(s) not scraped ({pod}: {why})")
    if not samples:
        return _with_missing(values, "no pod answered")
    if rates[1] is None:
        return _with_missing(values, FIRST_SCRAPE)
    return _with_missing(values, None)


# ---- shared ---------------------------------------------------------------------------------------


def _signals(found: Mapping[str, float | None], names: MetricNames) -> dict[str, float | None]:
    """`PoolSignals`' metric fields from the raw quantities; tokens_in_queue estimated when the engine
    exports no queued-token gauge: waiting requests × the mean prompt length so far."""
    waiting = found.get("waiting_requests")
    if names.queued_prompt_tokens:
        tokens = found.get("tokens_in_queue")
    elif waiting is None:
        tokens = None
    elif waiting == 0:
        tokens = 0.0
    else:
        count, total = found.get("prompt_tokens_count"), found.get("prompt_tokens_sum")
        tokens = waiting * total / count if count and total is not None else None
    values = {
        "tokens_in_queue": tokens,
        "prefill_tokens_per_second": found.get("prefill_tokens_per_second"),
        "waiting_requests": waiting,
        "running_requests": found.get("running_requests"),
        "kv_cache_usage": found.get("kv_cache_usage"),
        "request_rate": found.get("request_rate"),
    }
    return {k: (None if v is None or not math.isfinite(v) else max(v, 0.0)) for k, v in values.items()}


# The metrics whose absence is worth a warning; a throughput or KV use the engine does not export
# is not (the spec's tokensPerSecond and the waiting-requests saturation stand in).
_NEEDED: tuple[str, ...] = ("tokens_in_queue", "waiting_requests", "running_requests", "request_rate")


def _with_missing(values: Mapping[str, float | None], problem: str | None) -> Reading:
    missing = tuple(n for n in _NEEDED if values.get(n) is None)
    if problem is None and missing:
        problem = f"missing: {', '.join(missing)}"
    return Reading(values, missing, problem)
