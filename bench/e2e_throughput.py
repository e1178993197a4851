"""Pods/s through the real kube-scheduler with and without the NeuroNetes extender, on one kwok cluster.

One local control plane (`neuronetes.devcluster.DevCluster`, named ``bench-e2e-<pid>``) with
``--nodes`` simulated 8-GPU nodes (``--profile``, DGX A100 80GB by default). Two batches of
``--pods`` identical pods (``schedulerName: neuronetes-scheduler``, ``neuronetes.io/gpu: 1``,
100m CPU, 128Mi, tolerating the kwok taint), each in its own namespace, go through:

1. kube-scheduler calling the extender (filter, prioritize, bind, preempt; the extender runs as a
   separate ``neuronetes extender serve`` process, its GPU cache fed by list+watch);
2. kube-scheduler alone (the same ``neuronetes-scheduler`` profile, no extender; the extender
   process is stopped first, so it takes no CPU).

Before each run every node must be Ready and free of the ``node.kubernetes.io/not-ready`` taint
the API server gives new nodes (kube-controller-manager lifts it slowly; ``--lift-taints`` lifts
it here). The first batch stays bound during the second (the cluster has room for both), and the
runs go in this order so the extender never sees GPU pods bound without its assignment annotation.

How a batch is timed (``--mode``):

- ``backlog`` (default): kube-scheduler is stopped, the whole batch is created, then kube-scheduler
  is started (with or without the extender) and drains it. Throughput is (pods − 1) / (last bind
  − first bind), the bind times being when a watch on the namespace first sees ``spec.nodeName``:
  the scheduler's own rate, free of how fast this client creates pods and of the scheduler's
  start-up.
- ``stream``: kube-scheduler runs; the batch is created from a thread pool as fast as the API
  server takes it. Throughput is pods / (last bind − first create).

``added_ms_per_pod`` is 1000 / with − 1000 / without. The extender's own per-verb latency comes
from its ``neuronetes_scheduler_latency_seconds`` histogram (the difference of two scrapes around
the run), kube-scheduler's from its ``/metrics``, and the CPU seconds every process used during
each run from ``/proc``. The cluster is always torn down and purged, leaving no process.

``--nodes`` takes a comma-separated list (one fresh cluster per size, one summary line each).

A bind's time is printed in parts: the extender's bind handler, its Binding POST (the extender's
``neuronetes_scheduler_api_latency_seconds``), the API server's own ``POST pods/binding`` latency
(its ``apiserver_request_duration_seconds``, each run) and kube-scheduler's default binder in the
run without the extender. ``--profile-extender DIR`` samples the extender with py-spy during its
run and prints its CPU per pod by stage (`extender_profile`); ``--skip-without`` runs only the
batch through the extender.

    python bench/e2e_throughput.py --nodes 300,1000 --pods 2000 --json OUT
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
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
from neuronetes.devcluster import DevCluster, ExtenderConfig, procs
from neuronetes.devcluster.procs import interrupt_on
from neuronetes.devcluster.profiles import KWOK_TAINT, PROFILES, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from extender_harness import ExtenderProcess
from pod_builder import manifest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extender_profile import SpyRecorder, breakdown, format_breakdown

HOST = "127.0.0.1"
EXTENDER_LATENCY = c.METRIC_SCHEDULER_LATENCY
SCHEDULER_HISTOGRAMS = (
    "scheduler_scheduling_attempt_duration_seconds",
    "scheduler_scheduling_algorithm_duration_seconds",
    "scheduler_pod_scheduling_sli_duration_seconds",
)
EXTENSION_POINTS = "scheduler_framework_extension_point_duration_seconds"
"""kube-scheduler's own Bind (the default binder: the run without the extender; with an extender
that binds, kube-scheduler records no Bind extension point)."""
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


# ---- the extender process --------------------------------------------------------------------


def start_extender(kubeconfig: Path, workdir: Path, config: Path | None, nodes: int) -> ExtenderProcess:
    """The extender in its own process, ready once its cache holds `nodes` nodes."""
    if config is None:
        config = workdir / "extender.json"
        config.write_text("{}\n")
    ext = ExtenderProcess(kubeconfig, workdir, config, host=HOST, log_level="warning")

    def cached() -> bool:
        return gauge(scrape(f"{ext.url}/metrics"), c.METRIC_CACHE_NODES) >= nodes

    ext.start(timeout=300, ready=cached)
    return ext


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


def start_profile(ns: argparse.Namespace, ext_proc: ExtenderProcess | None, nodes: int) -> SpyRecorder | None:
    """py-spy on the extender for this run (`--profile-extender`), or None."""
    if ns.profile_extender is None or ext_proc is None or ext_proc.proc is None:
        return None
    spy = SpyRecorder(ext_proc.proc.pid, ns.profile_extender / f"extender-{nodes}-nodes.txt")
    return spy if spy.start() else None


@contextlib.contextmanager
def watching(api: Api, namespace: str, expected: int) -> Iterator[BindWatch]:
    watch = BindWatch(api, namespace, expected)
    try:
        yield watch
    finally:
        watch.stop()


def run_batch(
    dev: DevCluster,
    api: Api,
    *,
    label: str,
    namespace: str,
    extender: ExtenderConfig | None,
    ext_proc: ExtenderProcess | None,
    ns: argparse.Namespace,
    nodes: int,
) -> dict[str, Any]:
    """Schedule one batch of `ns.pods` pods on `nodes` nodes; its figures (times in seconds,
    latencies in ms)."""
    log(f"{label}: namespace {namespace}, {ns.pods} pods, mode {ns.mode}")
    api.call(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    waited = wait_usable(api, nodes, ns.timeout, lift=ns.lift_taints, workers=ns.create_workers)
    if waited > 1:
        log(f"{label}: all {nodes} nodes usable after {waited:.0f} s")
    extra = {"extender": ext_proc.proc.pid} if ext_proc is not None and ext_proc.proc is not None else {}
    ext_before = scrape(f"{ext_proc.url}/metrics") if ext_proc is not None else None
    api_before = binding_latency_text(api)
    with watching(api, namespace, ns.pods) as watch:
        if ns.mode == "backlog":
            stop_scheduler(dev)
            first_create, create_s = create_pods(api, namespace, ns.pods, ns.gpus_per_pod, ns.create_workers)
            log(f"{label}: {ns.pods} pods created in {create_s:.1f} s, kube-scheduler stopped; starting it")
            spy = start_profile(ns, ext_proc, nodes)
            cpu0 = cpu_sample(dev, extra)
            t_start = time.monotonic()
            dev.set_extender(extender, timeout_s=120)
            t_ready = time.monotonic()
        else:
            dev.set_extender(extender, timeout_s=120)
            spy = start_profile(ns, ext_proc, nodes)
            cpu0 = cpu_sample(dev, extra)
            t_start = t_ready = time.monotonic()
            first_create, create_s = create_pods(api, namespace, ns.pods, ns.gpus_per_pod, ns.create_workers)
            log(f"{label}: {ns.pods} pods created in {create_s:.1f} s")
        if not watch.wait(ns.timeout):
            raise RuntimeError(
                f"{label}: only {len(watch.bound_at)} of {ns.pods} pods bound after {ns.timeout:.0f} s\n"
                + (f"extender log:\n{ext_proc.tail()}" if ext_proc is not None else "")
            )
        cpu1 = cpu_sample(dev, extra)
        recorded = spy.stop() if spy is not None else None
    api_after = binding_latency_text(api)
    usable_after, taints_after = node_taints(list_nodes(api))
    binds = sorted(watch.bound_at.values())
    first_bind, last_bind = binds[0], binds[-1]
    if ns.mode == "backlog":
        span = last_bind - first_bind
        pods_per_s = (ns.pods - 1) / span if span > 0 else math.inf
    else:
        span = last_bind - first_create
        pods_per_s = ns.pods / span
    out: dict[str, Any] = {
        "pods_per_s": round(pods_per_s, 2),
        "ms_per_pod": round(1000 / pods_per_s, 3),
        "measured_s": round(span, 3),
        "create_s": round(create_s, 3),
        "create_pods_per_s": round(ns.pods / create_s, 1),
        "scheduler_start_s": round(t_ready - t_start, 3),
        "start_to_first_bind_s": round(first_bind - t_start, 3),
        "start_to_last_bind_s": round(last_bind - t_start, 3),
        "nodes_used": len(set(watch.nodes.values())),
        "waited_for_taints_s": round(waited, 1),
        "usable_nodes_after": usable_after,
        "taints_after": taints_after,
        "cpu_s": cpu_delta(cpu0, cpu1),
        "apiserver_binding_ms": binding_latency_ms(api_before, api_after),
    }
    if recorded is not None:
        out["extender_profile"] = {
            "raw": str(recorded.raw),
            "cpu_s_by_stage": {k: round(v, 4) for k, v in breakdown(recorded).items()},
            "cpu_s_by_thread": recorded.cpu_by_thread,
            "system_s_by_thread": recorded.system_by_thread,
        }
    # kube-scheduler restarted for this run: its counters cover this batch (and nothing earlier).
    text = scheduler_metrics(dev, api.token)
    if text is not None:
        sched: dict[str, Any] = {}
        for metric in SCHEDULER_HISTOGRAMS:
            h = histograms(text, metric, profile=c.SCHEDULER_NAME) or histograms(text, metric)
            merged = sum_hists(h.values())
            if merged.count:
                sched[metric.removeprefix("scheduler_").removesuffix("_seconds") + "_ms"] = (
                    merged.summary_ms()
                )
        bind = histograms(text, EXTENSION_POINTS, extension_point="Bind")
        merged_bind = sum_hists(bind.values())
        if merged_bind.count:
            sched["bind_extension_point_ms"] = merged_bind.summary_ms()
        sched["schedule_attempts"] = {
            k: int(v) for k, v in counters(text, "scheduler_schedule_attempts_total", "result").items()
        }
        out["kube_scheduler"] = sched
    if ext_proc is not None and ext_before is not None:
        after = scrape(f"{ext_proc.url}/metrics")
        before_h = histograms(ext_before, EXTENDER_LATENCY, "verb")
        verbs = {
            verb: h.minus(before_h.get(verb)).summary_ms()
            for verb, h in sorted(histograms(after, EXTENDER_LATENCY, "verb").items())
        }
        out["extender_verbs_ms"] = {v: s for v, s in verbs.items() if s["count"]}
        before_api = histograms(ext_before, c.METRIC_API_LATENCY, "call")
        calls = {
            call: h.minus(before_api.get(call)).summary_ms()
            for call, h in sorted(histograms(after, c.METRIC_API_LATENCY, "call").items())
        }
        out["extender_api_ms"] = {k: v for k, v in calls.items() if v["count"]}
        before_r = histograms(ext_before, EXTENDER_LATENCY, "result")
        out["extender_results"] = {
            r: int(h.count - (before_r[r].count if r in before_r else 0.0))
            for r, h in sorted(histograms(after, EXTENDER_LATENCY, "result").items())
            if h.count - (before_r[r].count if r in before_r else 0.0)
        }
    log(f"{label}: {pods_per_s:.1f} pods/s ({span:.2f} s measured)")
    return out


# ---- the benchmark ---------------------------------------------------------------------------


def num(x: Any, width: int, digits: int = 2) -> str:
    return f"{x:>{width}.{digits}f}" if isinstance(x, int | float) else f"{'-':>{width}}"


def print_table(result: dict[str, Any]) -> None:
    runs = result["runs"]
    header = (
        f"{'run':<17} | {'pods/s':>8} {'ms/pod':>7} | {'measured s':>10} | {'create/s':>8} | "
        f"{'attempt p50':>11} {'p99':>7} | {'algorithm p50':>13} {'p99':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, r in runs.items():
        ks = r.get("kube_scheduler", {})
        att = ks.get("scheduling_attempt_duration_ms", {})
        alg = ks.get("scheduling_algorithm_duration_ms", {})
        print(
            f"{name:<17} | {num(r['pods_per_s'], 8, 1)} {num(r['ms_per_pod'], 7)} | "
            f"{num(r['measured_s'], 10)} | {num(r['create_pods_per_s'], 8, 0)} | "
            f"{num(att.get('p50'), 11)} {num(att.get('p99'), 7)} | "
            f"{num(alg.get('p50'), 13)} {num(alg.get('p99'), 7)}"
        )
    print(
        f"ratio {result['ratio']:.3f}  added {result['added_ms_per_pod']:.2f} ms/pod  "
        f"({result['nodes']} nodes, {result['pods']} pods per run, mode {result['mode']}; "
        "kube-scheduler latencies in ms)"
    )
    verbs = runs["with_extender"].get("extender_verbs_ms", {})
    if verbs:
        parts = [
            f"{v} n={s['count']} mean {num(s['mean'], 0)} p50 {num(s['p50'], 0)} p99 {num(s['p99'], 0)}"
            for v, s in verbs.items()
        ]
        print("extender verbs (ms, its own histogram): " + "; ".join(parts))
    names = sorted({k for r in runs.values() for k in r["cpu_s"]})
    cpu = "; ".join(f"{n} " + "/".join(f"{r['cpu_s'].get(n, 0.0):.1f}" for r in runs.values()) for n in names)
    print(f"CPU seconds during each run ({' / '.join(runs)}): {cpu}")
    print_binds(result)
    profile = runs["with_extender"].get("extender_profile")
    if profile is not None:
        print(
            f"extender CPU by stage (threads' CPU shared by py-spy GIL samples; stacks in {profile['raw']}):"
        )
        for line in format_breakdown(profile["cpu_s_by_stage"], result["pods"]):
            print(line)
        threads = ", ".join(
            f"{tid}: {cpu:.2f} s ({profile['system_s_by_thread'].get(tid, 0.0):.2f} in the kernel)"
            for tid, cpu in sorted(profile["cpu_s_by_thread"].items(), key=lambda kv: -kv[1])
        )
        print(f"  CPU by thread (the first is the event loop's): {threads}")
    print(summary(result))


def print_binds(result: dict[str, Any]) -> None:
    """The extender's bind handler (its own histogram: from its body read to its answer, the API
    call included) beside kube-scheduler's default binder in the run without the extender (the
    same API server, the same load: how long a Binding takes there without us)."""
    runs = result["runs"]
    ours = runs["with_extender"].get("extender_verbs_ms", {}).get("bind", {})
    api = runs["with_extender"].get("extender_api_ms", {}).get("binding", {})
    default = runs.get("without_extender", {}).get("kube_scheduler", {}).get("bind_extension_point_ms", {})
    parts = [f"extender bind handler p50 {num(ours.get('p50'), 0)} p99 {num(ours.get('p99'), 0)}"]
    if api:
        parts.append(f"of which its Binding POST p50 {num(api.get('p50'), 0)} p99 {num(api.get('p99'), 0)}")
    parts.append(
        f"kube-scheduler's default binder (run without) mean {num(default.get('mean'), 0)} "
        f"p50 {quantile_text(default, 'p50')} p99 {quantile_text(default, 'p99')}"
    )
    for name, r in runs.items():
        inside = r.get("apiserver_binding_ms") or {}
        parts.append(
            f"inside the API server ({name}) mean {num(inside.get('mean'), 0)} "
            f"p50 {quantile_text(inside, 'p50')} p99 {quantile_text(inside, 'p99')}"
        )
    print("bind (ms): " + "; ".join(parts))


def quantile_text(summary: dict[str, Any], q: str) -> str:
    """A quantile in ms, or "> B" when it lies past the histogram's last finite bucket B."""
    value = summary.get(q)
    if value is None:
        return "-"
    return f"> {value:.0f}" if summary.get(f"{q}_beyond") else f"{value:.0f}"


def measure(ns: argparse.Namespace, nodes: int) -> dict[str, Any] | None:
    """One cluster of `nodes` nodes, both runs; None when processes were left behind."""
    dev = DevCluster(f"bench-e2e-{os.getpid()}-{nodes}", log=log)
    workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    ext_proc: ExtenderProcess | None = None
    leftover: list[int] = []
    t_total = time.monotonic()
    try:
        seconds = dev.up(
            controller_manager=False if ns.no_controller_manager else None,
            apiserver_args=ns.apiserver_arg,
        )
        log(f"cluster {dev.name} up in {seconds:.1f} s ({dev.state_dir})")
        t0 = time.monotonic()
        for start in range(0, nodes, 250):
            dev.add_nodes(ns.profile, min(250, nodes - start), "gpu")
        log(f"{nodes} {ns.profile} nodes Ready in {time.monotonic() - t0:.1f} s")
        api = Api(dev)

        ext_proc = start_extender(dev.kubeconfig, workdir, ns.extender_config, nodes)
        log(f"extender at {ext_proc.url} ready with {nodes} nodes cached")
        with_ext = run_batch(
            dev,
            api,
            label="with extender",
            namespace="bench-with",
            extender=ExtenderConfig(url=ext_proc.url),
            ext_proc=ext_proc,
            ns=ns,
            nodes=nodes,
        )
        ext_proc.stop()
        runs = {"with_extender": with_ext}
        if not ns.skip_without:
            runs["without_extender"] = run_batch(
                dev,
                api,
                label="without extender",
                namespace="bench-without",
                extender=None,
                ext_proc=None,
                ns=ns,
                nodes=nodes,
            )
        w = with_ext["pods_per_s"]
        wo = runs["without_extender"]["pods_per_s"] if "without_extender" in runs else math.nan
        extender_cpu_s = with_ext["cpu_s"].get("extender")
        result: dict[str, Any] = {
            "with_extender_pods_per_s": w,
            "without_extender_pods_per_s": wo,
            "ratio": round(w / wo, 4),
            "added_ms_per_pod": round(1000 / w - 1000 / wo, 3),
            "extender_cpu_ms_per_pod": (
                round(1000 * extender_cpu_s / ns.pods, 3) if extender_cpu_s is not None else None
            ),
            "nodes": nodes,
            "pods": ns.pods,
            "profile": ns.profile,
            "gpus_per_pod": ns.gpus_per_pod,
            "mode": ns.mode,
            "controller_manager": not ns.no_controller_manager,
            "lifted_taints": ns.lift_taints,
            "cpus": os.cpu_count(),
            "extender_verbs_ms": with_ext.get("extender_verbs_ms", {}),
            "runs": runs,
        }
    finally:
        if ext_proc is not None:
            ext_proc.stop()
        dev.down()
        leftover = dev.leftover_processes()
        if ns.logs is not None:
            logs = ns.logs / str(nodes)
            logs.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copytree(dev.log_dir, logs / "cluster", dirs_exist_ok=True)
            for extender_log in workdir.glob("extender*.log"):  # one per start of the extender
                with contextlib.suppress(OSError):
                    shutil.copy2(extender_log, logs / extender_log.name)
        dev.purge()
        shutil.rmtree(workdir, ignore_errors=True)
        log(f"cluster {dev.name} down and purged after {time.monotonic() - t_total:.0f} s")
    if leftover:
        print(f"error: processes of {dev.name} left after down: {leftover}", file=sys.stderr)
        return None
    result["seconds"] = round(time.monotonic() - t_total, 1)
    return result


def node_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of node counts: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("node counts must be >= 1")
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--nodes", type=node_counts, default=[1000], help="GPU node counts, comma-separated (default 1000)"
    )
    ap.add_argument("--pods", type=int, default=2000, help="pods per run (default 2000)")
    ap.add_argument("--profile", default="dgx-a100-80gb", choices=sorted(PROFILES), help="node profile")
    ap.add_argument("--gpus-per-pod", type=int, default=1)
    ap.add_argument("--mode", choices=("backlog", "stream"), default="backlog", help="how a batch is timed")
    ap.add_argument("--create-workers", type=int, default=8, help="threads creating pods")
    ap.add_argument("--extender-config", type=Path, help="the extender's settings file (default: built-in)")
    ap.add_argument(
        "--no-controller-manager",
        action="store_true",
        help="run without kube-controller-manager (implies --lift-taints)",
    )
    ap.add_argument(
        "--lift-taints",
        action="store_true",
        help="lift the new nodes' not-ready taints here instead of waiting for kube-controller-manager",
    )
    ap.add_argument(
        "--apiserver-arg", action="append", default=[], help="extra kube-apiserver flag (repeatable)"
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one batch may take to bind")
    ap.add_argument(
        "--logs", type=Path, help="copy the cluster's and the extender's logs here (per size) before purging"
    )
    ap.add_argument("--json", type=Path, help="write the results here (a list, one per size)")
    ap.add_argument(
        "--profile-extender",
        type=Path,
        metavar="DIR",
        help="sample the extender with py-spy during its run; print its CPU by stage (raw stacks in DIR)",
    )
    ap.add_argument(
        "--skip-without", action="store_true", help="only the run through the extender (no ratio)"
    )
    ns = ap.parse_args()
    ns.lift_taints = ns.lift_taints or ns.no_controller_manager
    prof = profile(ns.profile)
    if ns.pods < 2:
        ap.error("--pods must be >= 2")
    for nodes in ns.nodes:
        if prof.gpu_count * nodes < 2 * ns.pods * ns.gpus_per_pod:
            batches = f"two batches of {ns.pods} × {ns.gpus_per_pod}"
            ap.error(f"{nodes} × {prof.gpu_count} GPUs cannot hold {batches}")

    interrupt_on(signal.SIGTERM, signal.SIGHUP)  # the cluster is still torn down (finally)
    results = []
    for nodes in ns.nodes:
        result = measure(ns, nodes)
        if result is None:
            return 1
        print_table(result)
        results.append(result)
    if len(results) > 1:
        print("summary: " + "; ".join(summary(r) for r in results))
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def summary(result: dict[str, Any]) -> str:
    bind = result["extender_verbs_ms"].get("bind", {})
    return (
        f"{result['nodes']} nodes: {result['with_extender_pods_per_s']:.1f} vs "
        f"{result['without_extender_pods_per_s']:.1f} pods/s, ratio {result['ratio']:.2f}, "
        f"bind p50 {num(bind.get('p50'), 0)} p99 {num(bind.get('p99'), 0)} ms, "
        f"extender CPU {num(result['extender_cpu_ms_per_pod'], 0)} ms/pod"
    )


if __name__ == "__main__":
    sys.exit(main())
