"""What the cluster benchmarks share: raw JSON requests to a dev cluster's API server over
keep-alive connections, a watch that records when each pod of a namespace is bound, the one pod
template, Prometheus histograms read from scrapes (quantiles as ``histogram_quantile`` computes
them), the API server's own ``POST pods/binding`` latency, kube-scheduler's metrics, per-process
CPU from ``/proc``, and waiting until every node is usable.

Used by `e2e_throughput.py` (pods/s with and without the extender) and `steady.py` (bind latency
at a steady arrival rate).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from neuronetes import contracts as c
from neuronetes.devcluster import DevCluster, procs
from neuronetes.profiles import KWOK_TAINT

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pod_builder import manifest

HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f">> {msg}", file=sys.stderr, flush=True)


# ---- the API server over keep-alive connections ------------------------------------------------


class Api:
    """Raw JSON requests to the dev cluster's API server, one keep-alive connection per thread."""

    def __init__(self, dev: DevCluster) -> None:
        api = dev.api()
        self.host, port = api.server.removeprefix("https://").rsplit(":", 1)
        self.port = int(port)
        self.token = api.token
        self.context = api.context
        self._local = threading.local()

    def connection(self, timeout: float | None = 60.0) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=timeout)

    def headers(self, content_type: str = "application/json") -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json",
            "Content-Type": content_type,
        }

    def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        for attempt in range(2):
            conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self.connection()
            try:
                conn.request(method, path, body=body, headers=self.headers(content_type))
                response = conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def call(self, method: str, path: str, body: Any = None, ok: Sequence[int] = (200, 201)) -> Any:
        status, data = self.request(method, path, None if body is None else json.dumps(body).encode())
        if status not in ok:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data[:300].decode(errors='replace')}")
        return json.loads(data) if data else None


# ---- watching binds --------------------------------------------------------------------------


class _Meta(msgspec.Struct):
    name: str = ""
    resourceVersion: str = ""  # the API's spelling


class _Spec(msgspec.Struct):
    nodeName: str = ""


class _Obj(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


class _Event(msgspec.Struct):
    type: str
    object: _Obj


class _Taint(msgspec.Struct, omit_defaults=True):
    key: str
    value: str = ""
    effect: str = ""


class _Condition(msgspec.Struct):
    type: str
    status: str


class _NodeSpec(msgspec.Struct):
    taints: list[_Taint] = []


class _NodeStatus(msgspec.Struct):
    conditions: list[_Condition] = []


class _Node(msgspec.Struct):
    metadata: _Meta
    spec: _NodeSpec = msgspec.field(default_factory=_NodeSpec)
    status: _NodeStatus = msgspec.field(default_factory=_NodeStatus)


class _NodeList(msgspec.Struct):
    items: list[_Node]


class BindWatch:
    """Watches one namespace's pods and records when each is first seen with ``spec.nodeName``."""

    def __init__(self, api: Api, namespace: str, expected: int) -> None:
        self.api = api
        self.namespace = namespace
        self.expected = expected
        self.bound_at: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._stop = False
        self._conn: http.client.HTTPSConnection | None = None
        listing = api.call("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1")
        self._rv = str(listing["metadata"]["resourceVersion"])
        self._decoder = msgspec.json.Decoder(_Event)
        self._thread = threading.Thread(target=self._run, name=f"watch-{namespace}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop and not self.done.is_set():
                self._watch_once()
        except BaseException as exc:  # reported by wait()
            if not self._stop:
                self.error = exc
                self.done.set()

    def _watch_once(self) -> None:
        path = (
            f"/api/v1/namespaces/{self.namespace}/pods?watch=1&resourceVersion={self._rv}"
            "&allowWatchBookmarks=true&timeoutSeconds=1800"
        )
        conn = self._conn = self.api.connection(timeout=None)
        try:
            conn.request("GET", path, headers=self.api.headers())
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(
                    f"watch {self.namespace}: HTTP {response.status}: {response.read()[:300]!r}"
                )
            while line := response.readline():
                now = time.monotonic()
                event = self._decoder.decode(line)
                obj = event.object
                if event.type == "ERROR":
                    raise RuntimeError(f"watch {self.namespace}: {line[:300]!r}")
                if obj.metadata.resourceVersion:
                    self._rv = obj.metadata.resourceVersion
                if event.type == "BOOKMARK":
                    continue
                if obj.spec.nodeName and obj.metadata.name not in self.bound_at:
                    self.bound_at[obj.metadata.name] = now
                    self.nodes[obj.metadata.name] = obj.spec.nodeName
                    if len(self.bound_at) >= self.expected:
                        self.done.set()
                        return
        finally:
            conn.close()

    def wait(self, timeout: float) -> bool:
        self.done.wait(timeout)
        if self.error is not None:
            raise RuntimeError(f"watching {self.namespace} failed: {self.error}") from self.error
        return len(self.bound_at) >= self.expected

    def stop(self) -> None:
        self._stop = True
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)


# ---- pods ------------------------------------------------------------------------------------


def pod_manifest(name: str, namespace: str, gpus: int) -> dict[str, Any]:
    """The one pod template of both runs: whole GPUs through the extender's managed resource."""
    pod = manifest(name, {c.RESOURCE_GPU: gpus}, namespace=namespace, labels={"app": "bench-e2e"})
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return pod


def create_pods(api: Api, namespace: str, count: int, gpus: int, workers: int) -> tuple[float, float]:
    """Create `count` pods from `workers` threads; (monotonic time of the first create, seconds)."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    bodies = [json.dumps(pod_manifest(f"p-{k:05d}", namespace, gpus)).encode() for k in range(count)]

    def create(body: bytes) -> None:
        status, data = api.request("POST", path, body)
        if status != 201:
            raise RuntimeError(f"creating a pod: HTTP {status}: {data[:300].decode(errors='replace')}")

    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(create, bodies):
            pass
    return t0, time.monotonic() - t0


def delete_pods(api: Api, namespaces: Sequence[str], timeout: float) -> float:
    """Delete every pod of `namespaces` (kwok removes them at once: no kubelet, no grace) and wait
    until they are gone; the seconds it took."""
    t0 = time.monotonic()
    for namespace in namespaces:
        api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods", ok=(200, 404))
    while any(
        api.call("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1")["items"] for namespace in namespaces
    ):
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"pods of {', '.join(namespaces)} still there after {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - t0


# ---- metrics ---------------------------------------------------------------------------------


@dataclass
class Hist:
    """A Prometheus histogram (cumulative buckets by upper bound), summed over other labels."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def minus(self, other: Hist | None) -> Hist:
        if other is None:
            return self
        return Hist(
            {le: v - other.buckets.get(le, 0.0) for le, v in self.buckets.items()},
            self.sum - other.sum,
            self.count - other.count,
        )

    def beyond(self, q: float) -> bool:
        """Whether quantile `q` lies past the last finite bucket (`quantile` gives that bound)."""
        finite = [v for le, v in self.buckets.items() if not math.isinf(le)]
        return self.count > 0 and bool(finite) and max(finite) < q * self.count

    def quantile(self, q: float) -> float:
        """histogram_quantile: linear within the bucket; the last finite bound past it."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le in sorted(self.buckets):
            cum = self.buckets[le]
            if cum >= rank:
                if math.isinf(le):
                    return lower
                inside = cum - below
                return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
            lower, below = le, cum
        return lower

    def summary_ms(self) -> dict[str, Any]:
        """count, and mean/p50/p99 in ms (None without observations: JSON has no NaN)."""
        if self.count <= 0:
            return {"count": 0, "mean": None, "p50": None, "p99": None}
        return {
            "count": int(self.count),
            "mean": round(self.sum / self.count * 1000, 3),
            "p50": round(self.quantile(0.5) * 1000, 3),
            "p99": round(self.quantile(0.99) * 1000, 3),
            "p50_beyond": self.beyond(0.5),
            "p99_beyond": self.beyond(0.99),
        }


def sum_hists(parts: Iterable[Hist]) -> Hist:
    merged = Hist()
    for part in parts:
        merged = Hist(
            {le: merged.buckets.get(le, 0.0) + v for le, v in part.buckets.items()},
            merged.sum + part.sum,
            merged.count + part.count,
        )
    return merged


def histograms(text: str, metric: str, by: str | None = None, **where: str) -> dict[str, Hist]:
    """Histogram `metric` from exposition `text`, keyed by the value of label `by` ("" for none)."""
    out: dict[str, Hist] = {}
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for s in family.samples:
            if any(s.labels.get(k) != v for k, v in where.items()):
                continue
            h = out.setdefault(s.labels.get(by, "") if by else "", Hist())
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                h.buckets[le] = h.buckets.get(le, 0.0) + s.value
            elif s.name.endswith("_sum"):
                h.sum += s.value
            elif s.name.endswith("_count"):
                h.count += s.value
    return out


def histogram_deltas(before: str, after: str, metric: str, by: str) -> dict[str, Hist]:
    """Histogram `metric` by label `by` over the interval between two scrapes (after − before),
    sorted by label value."""
    earlier = histograms(before, metric, by)
    return {key: h.minus(earlier.get(key)) for key, h in sorted(histograms(after, metric, by).items())}


EXTENSION_POINTS = "scheduler_framework_extension_point_duration_seconds"


def default_binder(text: str | None) -> Hist:
    """kube-scheduler's own Bind (its default binder) from its /metrics; with an extender that
    binds, kube-scheduler records no Bind extension point (empty)."""
    if text is None:
        return Hist()
    return sum_hists(histograms(text, EXTENSION_POINTS, extension_point="Bind").values())


def counters(text: str, metric: str, by: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == metric.removesuffix("_total"):
            for s in family.samples:
                if s.name.endswith("_total"):
                    key = s.labels.get(by, "")
                    out[key] = out.get(key, 0.0) + s.value
    return out


def gauge(text: str, metric: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == metric:
            return float(sum(s.value for s in family.samples))
    return math.nan


def scrape(url: str, *, token: str | None = None, context: ssl.SSLContext | None = None) -> str:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=30, context=context) as response:
        return str(response.read().decode())


APISERVER_LATENCY = "apiserver_request_duration_seconds"


def binding_latency_text(api: Api) -> str | None:
    """The API server's own latency histogram of ``POST pods/binding`` (its /metrics lines for it:
    the whole exposition is megabytes), None when unreachable."""
    try:
        status, data = api.request("GET", "/metrics")
    except (OSError, http.client.HTTPException) as exc:
        log(f"kube-apiserver metrics unavailable: {exc}")
        return None
    if status != 200:
        log(f"kube-apiserver metrics unavailable: HTTP {status}")
        return None
    keep = [
        line
        for line in data.decode().splitlines()
        if line.startswith(("# HELP " + APISERVER_LATENCY + " ", "# TYPE " + APISERVER_LATENCY + " "))
        or (
            line.startswith(APISERVER_LATENCY)
            and 'resource="pods"' in line
            and 'subresource="binding"' in line
            and 'verb="POST"' in line
        )
    ]
    return "\n".join(keep) + "\n"


def binding_latency_ms(before: str | None, after: str | None) -> dict[str, Any] | None:
    """The API server's ``POST pods/binding`` latency between two scrapes (count, mean, p50, p99)."""
    if before is None or after is None:
        return None
    h = sum_hists(histograms(after, APISERVER_LATENCY).values())
    return h.minus(sum_hists(histograms(before, APISERVER_LATENCY).values())).summary_ms()


def scheduler_metrics(dev: DevCluster, token: str) -> str | None:
    """kube-scheduler's /metrics (None when unreachable: the benchmark does not depend on it)."""
    try:
        port = int(json.loads((dev.state_dir / "state.json").read_text())["ports"]["scheduler"])
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        return scrape(f"https://{HOST}:{port}/metrics", token=token, context=insecure)
    except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
        log(f"kube-scheduler metrics unavailable: {exc}")
        return None


# ---- CPU accounting --------------------------------------------------------------------------


def cpu_of(pid: int) -> float | None:
    """User + system CPU seconds of `pid` (all its threads), None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def cpu_sample(dev: DevCluster, extra: dict[str, int]) -> dict[tuple[str, int], float]:
    pids = {(r.name, r.pid) for r in dev.processes() if procs.is_running(r)}
    pids |= {(name, pid) for name, pid in extra.items()}
    out = {k: v for k in pids if (v := cpu_of(k[1])) is not None}
    t = os.times()
    out[("bench client", os.getpid())] = t.user + t.system
    return out


def cpu_delta(before: dict[tuple[str, int], float], after: dict[tuple[str, int], float]) -> dict[str, float]:
    """CPU seconds per component between two samples (a process started in between counts from 0)."""
    out: dict[str, float] = {}
    for key, v in after.items():
        out[key[0]] = round(out.get(key[0], 0.0) + v - before.get(key, 0.0), 2)
    return dict(sorted(out.items()))


def cpus_in_use(dev: DevCluster, extra: dict[str, int], seconds: float = 1.0) -> float:
    """CPUs the cluster's processes (and `extra`; not this client) use over `seconds`."""
    before = cpu_sample(dev, extra)
    time.sleep(seconds)
    used = cpu_delta(before, cpu_sample(dev, extra))
    return sum(v for k, v in used.items() if k != "bench client") / seconds


def wait_quiet(
    dev: DevCluster, extra: dict[str, int], idle: float, *, margin: float = 0.15, timeout: float = 120.0
) -> tuple[float, float]:
    """Until the cluster's processes (and `extra`) use no more than `idle` (what they used at rest:
    node heartbeats, leases) plus `margin` CPUs over a second: the aftermath of a run (kwok's
    status updates, the extender's queued Events) is over. (seconds waited, CPUs in use then)."""
    t0 = time.monotonic()
    while True:
        used = cpus_in_use(dev, extra)
        if used <= idle + margin or time.monotonic() - t0 > timeout:
            return time.monotonic() - t0, used


# ---- one run ---------------------------------------------------------------------------------


NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _ready(node: _Node) -> bool:
    return any(cond.type == "Ready" and cond.status == "True" for cond in node.status.conditions)


def list_nodes(api: Api) -> list[_Node]:
    status, data = api.request("GET", "/api/v1/nodes")
    if status != 200:
        raise RuntimeError(f"listing nodes: HTTP {status}")
    return msgspec.json.decode(data, type=_NodeList).items


def node_taints(nodes: Sequence[_Node]) -> tuple[int, dict[str, int]]:
    """(nodes our pods can use: Ready and no taint but kwok's, count of nodes per other taint)."""
    usable = 0
    taints: dict[str, int] = {}
    for node in nodes:
        other = {f"{t.key}:{t.effect}" for t in node.spec.taints if t.key != KWOK_TAINT["key"]}
        for t in other:
            taints[t] = taints.get(t, 0) + 1
        usable += _ready(node) and not other
    return usable, dict(sorted(taints.items()))


def lift_not_ready(api: Api, nodes: Sequence[_Node], workers: int) -> int:
    """Remove the not-ready taint from Ready nodes, as the node lifecycle controller would; the count.

    A merge patch replaces the taint list; the resourceVersion makes it fail (409, retried on the
    next pass) rather than overwrite a concurrent change.
    """
    todo = [n for n in nodes if _ready(n) and any(t.key == NOT_READY_TAINT for t in n.spec.taints)]

    def lift(node: _Node) -> bool:
        keep = [msgspec.to_builtins(t) for t in node.spec.taints if t.key != NOT_READY_TAINT]
        patch = {"metadata": {"resourceVersion": node.metadata.resourceVersion}, "spec": {"taints": keep}}
        status, _ = api.request(
            "PATCH",
            f"/api/v1/nodes/{node.metadata.name}",
            json.dumps(patch).encode(),
            content_type="application/merge-patch+json",
        )
        return status == 200

    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(lift, todo))


def wait_usable(api: Api, nodes: int, timeout: float, *, lift: bool, workers: int) -> float:
    """Until every node is Ready and untainted but for kwok's taint; the seconds it took.

    The API server's TaintNodesByCondition admission taints each new node
    ``node.kubernetes.io/not-ready:NoSchedule``; kube-controller-manager's node lifecycle
    controller lifts it once the node is Ready, at its client's QPS (~5 nodes/s here).
    Scheduling before that would measure the controller, not the scheduler. With `lift`, this
    process lifts the taints itself (without kube-controller-manager nothing else would).
    """
    t0 = time.monotonic()
    next_log = t0 + 10
    while True:
        items = list_nodes(api)
        usable, taints = node_taints(items)
        if usable >= nodes:
            return time.monotonic() - t0
        if lift and lift_not_ready(api, items, workers):
            continue
        now = time.monotonic()
        if now - t0 > timeout:
            raise RuntimeError(
                f"only {usable} of {nodes} nodes usable after {timeout:.0f} s: taints {taints}"
            )
        if now >= next_log:
            log(f"waiting for node taints to clear: {usable}/{nodes} usable, {taints}")
            next_log = now + 10
        time.sleep(1.0)


def stop_scheduler(dev: DevCluster) -> None:
    """Stop kube-scheduler (the next `DevCluster.set_extender` starts it again)."""
    procs.stop_all([r for r in dev.processes() if r.name == "kube-scheduler" and procs.is_running(r)])


@contextlib.contextmanager
def watching(api: Api, namespace: str, expected: int) -> Iterator[BindWatch]:
    watch = BindWatch(api, namespace, expected)
    try:
        yield watch
    finally:
        watch.stop()
