"""The extender's edge: who may connect, what bodies do to the loop, honest readiness, Events."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from extender_harness import ExtenderThread, free_port, terminate
from extender_support import (
    AsgiClient,
    FakeApi,
    OpenWatch,
    gpu_pod,
    metric_value,
    node_objects,
    synced_cache,
)

from neuronetes import contracts as c
from neuronetes_extender.app import create_app
from neuronetes_extender.bodies import BodyDecoder, decode_nodes_request
from neuronetes_extender.config import ExtenderSettings
from neuronetes_extender.events import REPORTING_CONTROLLER, EventRecorder, PodRef
from neuronetes_extender.kube import KubeError
from neuronetes_extender.server import ListenError, ListenPolicy, listen_policy
from neuronetes_extender.service import ExtenderService
from neuronetes_extender.watch import Reflector, WatchHealth
from neuronetes_extender.wire import Node, NodeList

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
JSON = {"content-type": "application/json"}
NODES = node_objects({"dgx-a100-80gb": 2})
NAMES = [n["metadata"]["name"] for n in NODES]


# ---- closed by default --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    d = tmp_path_factory.mktemp("pki")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", "/CN=kube-scheduler")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        extra = ["-extfile", "san.ext"] if name == "server" else []
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", *extra)  # fmt: skip
    return {k: str(d / k) for k in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def test_a_remote_listen_address_needs_client_certificates(certs: dict[str, str]) -> None:
    assert listen_policy("127.0.0.1", 1).host == "127.0.0.1"
    assert listen_policy("::1", 1).host == "::1"
    for host in ("0.0.0.0", "10.0.0.7", "extender.example"):
        with pytest.raises(ListenError, match="refusing to listen"):
            listen_policy(host, 1)
        # HTTPS without client authentication is still open to anyone who reaches the port.
        with pytest.raises(ListenError, match="refusing to listen"):
            listen_policy(
                host, 1, tls_cert_file=certs["server.crt"], tls_private_key_file=certs["server.key"]
            )
        tls = listen_policy(
            host,
            1,
            tls_cert_file=certs["server.crt"],
            tls_private_key_file=certs["server.key"],
            client_ca_file=certs["ca.crt"],
        )
        assert tls.https and tls.uvicorn_ssl()["ssl_ca_certs"] == certs["ca.crt"]
        assert listen_policy(host, 1, insecure_allow_remote=True).host == host
    with pytest.raises(ListenError, match="go together"):
        listen_policy("127.0.0.1", 1, tls_cert_file=certs["server.crt"])
    with pytest.raises(ListenError, match="no such file"):
        listen_policy("127.0.0.1", 1, tls_cert_file="/nonexistent", tls_private_key_file=certs["server.key"])


def test_serve_refuses_an_unauthenticated_remote_bind_with_one_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "neuronetes.cli", "extender", "serve", "--host", "0.0.0.0", "--port", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "refusing to listen on 0.0.0.0" in lines[0], run.stderr


def test_https_with_client_certificates_refuses_a_client_without_one(certs: dict[str, str]) -> None:
    cache = synced_cache(NODES)
    app = create_app(ExtenderService(cache, FakeApi(cache=cache)))
    policy = ListenPolicy("127.0.0.1", free_port(), certs["server.crt"], certs["server.key"], certs["ca.crt"])
    authenticated = ssl.create_default_context(cafile=certs["ca.crt"])
    authenticated.load_cert_chain(certs["client.crt"], certs["client.key"])
    with ExtenderThread(app, policy=policy) as server:
        with httpx.Client(verify=authenticated) as client:
            assert client.get(f"{server.url}/healthz").text == "ok"
        anonymous_tls = ssl.create_default_context(cafile=certs["ca.crt"])
        with httpx.Client(verify=anonymous_tls) as anonymous, pytest.raises(httpx.TransportError):
            anonymous.post(
                f"{server.url}/bind",
                content=b'{"PodName":"p","PodNamespace":"default","Node":"n"}',
                headers=JSON,
            )


# ---- bad bodies -------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt", "bind"])
def test_deeply_nested_json_is_400(verb: str) -> None:
    cache = synced_cache(NODES)
    client = AsgiClient(create_app(ExtenderService(cache, FakeApi(cache=cache))))
    deep = b"[" * 1000 + b"]" * 1000
    bodies = [
        b'{"Pod":' + deep + b"}",
        # Inside a field decoded as free-form JSON (spec.workloadRef), the decoder recurses.
        b'{"Pod":{"spec":{"workloadRef":{"x":' + deep + b'}}},"NodeNames":[]}',
        b'{"PodName":' + deep + b"}",
    ]
    for body in bodies:
        assert len(body) <= 2100
        response = client.post(f"/{verb}", content=body, headers=JSON)
        assert response.status_code == 400, (verb, response.status_code, response.text[:200])
        assert response.json()["Error"].startswith(f"invalid {verb} request")


def _nodes_body(pod: str, items: str) -> bytes:
    """A filter body in full-object mode, from the pod's JSON and the items array's JSON text."""
    return f'{{"Pod": {pod}, "Nodes": {{"metadata": {{}}, "items": {items}}}, "NodeNames": null}}'.encode()


def test_a_body_decoded_in_the_worker_process_answers_like_one_decoded_inline() -> None:
    pod = gpu_pod("p")
    # Pretty-printed items and a duplicate: the spans must still cut each node exactly.
    items = ",\n  ".join(json.dumps(n, indent=1) for n in [*NODES, NODES[0]])
    body = _nodes_body(json.dumps(pod), "[\n  " + items + "\n]")
    inline = decode_nodes_request(body)
    decoder = BodyDecoder(inline_bytes=0)
    try:
        spanned = anyio.run(decoder.nodes_request, [body[:1000], body[1000:5000], body[5000:]])
    finally:
        decoder.stop()
    assert spanned.names == inline.names == NAMES
    assert spanned.raw is not None and inline.raw is not None
    for name in NAMES:
        assert msgspec.json.decode(spanned.raw[name]) == msgspec.json.decode(inline.raw[name])
    assert spanned.pod == inline.pod


@pytest.fixture()
def fake_server(tmp_path: Path) -> Iterator[str]:
    """The extender app over a fake cache, served by uvicorn in its own process."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO / "tests"))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests" / "extender_harness.py"),
            "--port",
            str(port),
            "--max-body-bytes",
            str(80 * 1024 * 1024),
        ],
        cwd=tmp_path,
        env=env,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with httpx.Client() as c:
                if c.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the fake extender did not start")
        time.sleep(0.1)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        terminate(proc)


def _healthz_worst_while_sending(server: str, workdir: Path) -> float:
    """Send body.json as a filter from another process; the worst /healthz latency meanwhile."""
    host, port = server.split(":")
    # The sender is its own process, so this one only measures.
    sender = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import http.client, sys\n"
                f"c = http.client.HTTPConnection({host!r}, {port}, timeout=120)\n"
                "body = open('body.json', 'rb').read()\n"
                "c.request('POST', '/filter', body=body, headers={'Content-Type': 'application/json'})\n"
                "r = c.getresponse(); data = r.read()\n"
                "sys.exit(0 if r.status == 200 and b'big-' in data else 1)\n"
            ),
        ],
        cwd=workdir,
    )
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    latencies = []
    try:
        while sender.poll() is None:
            started = time.perf_counter()
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            latencies.append(time.perf_counter() - started)
            assert response.status == 200
            time.sleep(0.005)
    finally:
        conn.close()
        if sender.poll() is None:
            sender.kill()
    assert sender.wait() == 0, "the 60 MB filter request did not get its answer"
    assert len(latencies) > 20
    return max(latencies)


def test_a_60_mb_body_does_not_delay_healthz_beyond_50_ms(fake_server: str, tmp_path: Path) -> None:
    """The body is read, decoded (worker process) and decided while /healthz is probed every 5 ms.

    A shared CI machine can deschedule the server for longer than 50 ms on its own, so the body
    goes up to three times and one run must stay within the bound: a stall of the extender's own
    (a 60 MB decode or copy on the loop takes 100s of ms here) fails all three.
    """
    template = json.dumps(NODES[0])
    name = NODES[0]["metadata"]["name"]
    items = [
        template.replace(f'"{name}"', f'"big-{i:06d}"') for i in range(60 * 1024 * 1024 // len(template) + 1)
    ]
    body = _nodes_body(json.dumps(gpu_pod("p")), "[" + ",".join(items) + "]")
    assert len(body) >= 60_000_000
    (tmp_path / "body.json").write_bytes(body)
    worst: list[float] = []
    for _ in range(3):
        worst.append(_healthz_worst_while_sending(fake_server, tmp_path))
        if worst[-1] <= 0.050:
            break
    assert min(worst) <= 0.050, f"/healthz took {[round(w * 1000, 1) for w in worst]} ms (worst per run)"


# ---- honest readiness -------------------------------------------------------------------------------


class _ListApi:
    """Serves an empty node list and a watch that stays open, or fails everything while `down`."""

    def __init__(self) -> None:
        self.down = False
        self.streams: list[OpenWatch] = []

    def get(self, path: str, query: Any = (), *, timeout: float | None = None) -> bytes:
        if self.down:
            raise KubeError(0, "connection refused")
        return msgspec.json.encode({"metadata": {"resourceVersion": "1"}, "items": []})

    def watch(self, path: str, query: Any, *, read_timeout: float) -> OpenWatch:
        if self.down:
            raise KubeError(0, "connection refused")
        stream = OpenWatch()
        self.streams.append(stream)
        return stream

    def cut(self) -> None:
        self.down = True
        for stream in self.streams:
            stream.close()


def test_a_broken_watch_fails_readiness_and_the_filter_after_the_limit() -> None:
    cache = synced_cache(NODES, ExtenderSettings(max_watch_staleness_seconds=0.3))
    api = _ListApi()
    reflector: Reflector[Node] = Reflector(
        api,
        "nodes",
        "/api/v1/nodes",
        Node,
        NodeList,
        on_replace=lambda _: None,
        on_upsert=lambda _: None,
        on_delete=lambda _: None,
        on_synced=lambda: None,
        on_heard=lambda: None,
        max_backoff=0.2,
    )
    health = WatchHealth()
    health.add(reflector)
    service = ExtenderService(cache, FakeApi(cache=cache), health=health)
    client = AsgiClient(create_app(service))
    filter_body = json.dumps({"Pod": gpu_pod("p"), "NodeNames": NAMES})
    reflector.start()
    try:
        deadline = time.monotonic() + 5
        while reflector.relists == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.get("/readyz").status_code == 200
        assert client.post("/filter", content=filter_body, headers=JSON).json()["Error"] == ""
        api.cut()
        time.sleep(0.1)
        assert client.get("/readyz").status_code == 200  # broken, but not for longer than the limit
        time.sleep(0.4)
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "watch broken (nodes for" in ready.text
        answer = client.post("/filter", content=filter_body, headers=JSON).json()
        assert "watch broken" in answer["Error"] and not answer["NodeNames"]
        scrape = client.get("/metrics").text
        assert metric_value(scrape, c.METRIC_WATCH_BROKEN, resource="nodes") > 0.3
        api.down = False  # the API server is back: the next relist heals the watch
        deadline = time.monotonic() + 5
        while health.broken() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.get("/readyz").status_code == 200
    finally:
        reflector.stop()


# ---- Events -----------------------------------------------------------------------------------------


class _Poster:
    def __init__(self) -> None:
        self.posted: list[tuple[str, dict[str, Any]]] = []

    async def post(self, path: str, body: dict[str, Any]) -> bytes:
        self.posted.append((path, body))
        return b"{}"


def test_events_for_one_pod_and_reason_collapse_and_are_posted_with_our_controller() -> None:
    poster = _Poster()
    events = EventRecorder(poster, instance="ext-0")
    pod = PodRef("team", "worker-0", "uid-0")
    for k in range(1, 5):
        events.record(pod, "GangWaiting", f"{k} of 4 members at the bind barrier", action="Bind")
    events.record(PodRef("team", "worker-1"), "GpusAssigned", "node n1, GPUs 0 (GPU-a)", action="Bind")
    anyio.run(events.drain, 5.0)
    assert len(poster.posted) == 2
    path, body = poster.posted[0]
    assert path == "/apis/events.k8s.io/v1/namespaces/team/events"
    assert body["note"] == "4 of 4 members at the bind barrier"  # the latest message won
    assert body["reportingController"] == REPORTING_CONTROLLER and body["reportingInstance"] == "ext-0"
    assert body["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team",
        "name": "worker-0",
        "uid": "uid-0",
    }
    assert body["eventTime"].endswith("Z") and body["type"] == "Normal"


def test_a_storm_of_events_is_bounded() -> None:
    events = EventRecorder(_Poster(), max_pending=100)
    for k in range(1000):
        events.record(PodRef("ns", f"p{k}"), "GpusAssigned", "x", action="Bind")
    assert events.pending() == 100 and events.dropped == 900


def test_a_bind_records_the_placement_event_with_node_and_gpus() -> None:
    cache = synced_cache(NODES)
    api = FakeApi(cache=cache)
    poster = _Poster()
    service = ExtenderService(cache, api, events=EventRecorder(poster))
    client = AsgiClient(create_app(service))
    pod = gpu_pod("placed", 2)
    api.add(pod)
    answer = client.post("/filter", content=json.dumps({"Pod": pod, "NodeNames": NAMES}), headers=JSON).json()
    node = answer["NodeNames"][0]
    meta = pod["metadata"]
    bind = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    assert client.post("/bind", content=json.dumps(bind), headers=JSON).json() == {"Error": ""}
    anyio.run(service.events.drain, 5.0)
    [(_, event)] = poster.posted
    assert event["reason"] == "GpusAssigned" and event["regarding"]["name"] == "placed"
    assert event["note"].startswith(f"node {node}, gpus ") and "; " in event["note"]  # score terms


# ---- the gang barrier, async ------------------------------------------------------------------------


def _gang_member(name: str) -> dict[str, Any]:
    pod = gpu_pod(name, 1)
    pod["metadata"]["labels"].update({c.LABEL_GANG: "pair", c.LABEL_GANG_SIZE: "2"})
    return pod


def _bind_body(pod: dict[str, Any], node: str) -> str:
    meta = pod["metadata"]
    return json.dumps(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    )


def test_a_gang_member_waits_at_the_barrier_without_a_thread_and_says_how_many_are_there() -> None:
    cache = synced_cache(NODES)
    api = FakeApi(cache=cache)
    poster = _Poster()
    service = ExtenderService(cache, api, events=EventRecorder(poster))
    client = AsgiClient(create_app(service))
    pods = [_gang_member("pair-0"), _gang_member("pair-1")]
    nodes = []
    for pod in pods:
        api.add(pod)
        answer = client.post(
            "/filter", content=json.dumps({"Pod": pod, "NodeNames": NAMES}), headers=JSON
        ).json()
        nodes.append(answer["NodeNames"][0])
    threads_before = threading.active_count()
    first: dict[str, Any] = {}
    waiter = threading.Thread(
        target=lambda: first.update(
            client.post("/bind", content=_bind_body(pods[0], nodes[0]), headers=JSON).json()
        )
    )
    waiter.start()
    deadline = time.monotonic() + 5
    while service.barrier.waiting() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.barrier.waiting() == 1 and not first
    assert threading.active_count() == threads_before + 1  # the request's own, nothing parked besides
    assert client.post("/bind", content=_bind_body(pods[1], nodes[1]), headers=JSON).json() == {"Error": ""}
    waiter.join(5)
    assert first == {"Error": ""} and len(api.bindings) == 2
    anyio.run(service.events.drain, 5.0)
    notes = [e["note"] for _, e in poster.posted if e["reason"] == "GangWaiting"]
    assert notes == ["1 of 2 members at the bind barrier (gang default/pair)"]


def test_shutdown_fails_a_waiting_bind_at_once() -> None:
    cache = synced_cache(NODES, ExtenderSettings(bind_wait_seconds=100))
    api = FakeApi(cache=cache)
    service = ExtenderService(cache, api)
    client = AsgiClient(create_app(service))
    pod = _gang_member("pair-0")
    api.add(pod)
    node = client.post("/filter", content=json.dumps({"Pod": pod, "NodeNames": NAMES}), headers=JSON).json()[
        "NodeNames"
    ][0]
    answer: dict[str, Any] = {}
    waiter = threading.Thread(
        target=lambda: answer.update(client.post("/bind", content=_bind_body(pod, node), headers=JSON).json())
    )
    waiter.start()
    deadline = time.monotonic() + 5
    while service.barrier.waiting() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    service.barrier.fail_all("the extender is shutting down")
    waiter.join(5)
    assert time.monotonic() - started < 1.0
    assert "shutting down" in answer["Error"] and api.bindings == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.0.0.0:9464", ("0.0.0.0", 9464)), ("[::]:9464", ("::", 9464)), (":9464", ("0.0.0.0", 9464))],
)
def test_metrics_bind_address_parses(text: str, expected: tuple[str, int]) -> None:
    from neuronetes_extender.server import parse_bind_address

    assert parse_bind_address(text) == expected


@pytest.mark.parametrize("text", ["9464", "host:", "host:http", "host:70000"])
def test_metrics_bind_address_refuses_malformed(text: str) -> None:
    from neuronetes_extender.server import parse_bind_address

    with pytest.raises(ListenError, match="metrics-bind-address"):
        parse_bind_address(text)
