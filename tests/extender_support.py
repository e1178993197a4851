"""Helpers shared by the extender tests: kube-scheduler-shaped objects, a fake API, an ASGI client.

Pods come from `pod_builder`, the tests' and benchmarks' one pod builder.

Importable from any test module (pytest's ``pythonpath`` holds ``tests/``).
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import anyio
import httpx
import msgspec
from pod_builder import container, manifest, new_uid, served

from neuronetes import contracts as c
from neuronetes.profiles import node_manifest, profile
from neuronetes_extender.bodies import NodeSet
from neuronetes_extender.cache import BindPlan, BindRefused, GpuCache
from neuronetes_extender.config import ExtenderSettings
from neuronetes_extender.kube import KubeError
from neuronetes_extender.service import ExtenderService
from neuronetes_extender.wire import ExtenderBindingArgs, ExtenderBindingResult, Node, Pod


def node_objects(spec: Mapping[str, int], prefix: str = "n") -> list[dict[str, Any]]:
    """Node objects as the API server serves them, ``{profile: count}``, named ``<prefix><profile>-<i>``."""
    out = []
    for name, count in spec.items():
        prof = profile(name)
        for i in range(count):
            manifest = node_manifest(prof.node_spec(f"{prefix}{name}-{i}"))
            # What the API server adds: uid, resourceVersion, managedFields, conditions.
            manifest["metadata"].update(
                {
                    "uid": new_uid(),
                    "resourceVersion": str(1000 + i),
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "managedFields": [{"manager": "kwok", "operation": "Update", "apiVersion": "v1"}],
                }
            )
            manifest["status"]["conditions"] = [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}
            ]
            out.append(manifest)
    return out


def pod_object(
    name: str,
    containers: Sequence[dict[str, Any]],
    *,
    init: Sequence[dict[str, Any]] = (),
    namespace: str = "default",
    priority: int = 0,
    uid: str | None = None,
    node: str = "",
) -> dict[str, Any]:
    """A pod as kube-scheduler sends it (full object, camelCase, fields the extender ignores too)."""
    pod = manifest(name, containers=containers, init=init, namespace=namespace, node=node, priority=priority)
    return served(pod, uid=uid)


def bound_with(
    pod: Mapping[str, Any], node: str, gpus: Mapping[int, tuple[int, int]], *, uuid_node: str | None = None
) -> dict[str, Any]:
    """`pod` bound to `node` with an assignment giving its container ``main`` GPU j ->
    (memoryMiB, computePercent); the UUIDs are the simulated ones of `uuid_node` (default `node`)."""
    out = copy.deepcopy(dict(pod))
    out["spec"]["nodeName"] = node
    out["status"]["phase"] = "Running"
    entries = [
        {"uuid": c.simulated_gpu_uuid(uuid_node or node, j), "index": j, "memoryMiB": m, "computePercent": p}
        for j, (m, p) in gpus.items()
    ]
    doc = {
        "version": 1,
        "node": node,
        "containers": {"main": {"gpus": entries, "priority": 0, "qos": "Guaranteed"}},
    }
    out["metadata"]["annotations"] = {c.ANNOTATION_ASSIGNED_GPUS: json.dumps(doc)}
    return out


def gpu_pod(name: str, gpus: int = 1, **kw: Any) -> dict[str, Any]:
    return pod_object(name, [container("main", {c.RESOURCE_GPU: gpus})], **kw)


def shared_pod(name: str, memory_mib: int, compute: int, **kw: Any) -> dict[str, Any]:
    limits = {c.RESOURCE_GPU_MEMORY: memory_mib, c.RESOURCE_GPU_COMPUTE: compute}
    return pod_object(name, [container("main", limits)], **kw)


def mig_pod(name: str, mig_profile: str, **kw: Any) -> dict[str, Any]:
    return pod_object(name, [container("main", {c.mig_resource_name(mig_profile): 1})], **kw)


def cpu_pod(name: str, **kw: Any) -> dict[str, Any]:
    return pod_object(name, [container("main")], **kw)


def names_request(pod: Mapping[str, Any] | Pod, names: Sequence[str]) -> NodeSet:
    """A filter/prioritize request for `pod` over `names` (``nodeCacheCapable: true``)."""
    as_pod = pod if isinstance(pod, Pod) else msgspec.convert(pod, Pod)
    return NodeSet(as_pod, list(names), None, True)


def bind_now(service: ExtenderService, args: ExtenderBindingArgs) -> tuple[ExtenderBindingResult, str]:
    """The async bind verb, run to completion from synchronous test code (any thread)."""
    return anyio.run(service.bind, args)


def planned(result: BindPlan | BindRefused) -> BindPlan:
    """The plan `GpuCache.prepare_bind` made, where it did not refuse the bind."""
    assert isinstance(result, BindPlan), result
    return result


def synced_cache(
    nodes: Sequence[Mapping[str, Any]], settings: ExtenderSettings | None = None, **kw: Any
) -> GpuCache:
    """A cache holding `nodes` and no pods, marked synced (no API server involved)."""
    cache = GpuCache(settings, **kw)
    cache.replace_nodes([msgspec.convert(n, Node) for n in nodes])
    cache.replace_pods([])
    cache.mark_synced("nodes")
    cache.mark_synced("pods")
    return cache


class OpenWatch:
    """A watch stream that yields nothing and stays open until closed; then it breaks."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def __enter__(self) -> OpenWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.closed.set()

    def __iter__(self) -> Iterator[bytes]:
        self.closed.wait()
        raise KubeError(0, "watch stream broken: connection reset")


class FakeApi:
    """The Binder protocol over an in-memory pod store, with the API server's binding semantics.

    `bind` refuses (409) a pod already bound or a UID that does not match; `fail_next` injects
    failures. With `cache`, every binding is also delivered to it as a watch event would be.
    It takes Events too (the `EventPoster` protocol): `events` holds their bodies.
    """

    def __init__(self, pods: Sequence[Mapping[str, Any]] = (), cache: GpuCache | None = None) -> None:
        self._lock = threading.Lock()
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.bindings: list[tuple[str, str, dict[str, str]]] = []
        self.cache = cache
        self.failures: list[KubeError] = []
        self.fail_pods: dict[str, KubeError] = {}  # pod name -> the error its (first) bind gets
        for pod in pods:
            self.add(pod)
        self.events: list[dict[str, Any]] = []

    async def post(self, path: str, body: dict[str, Any]) -> bytes:
        with self._lock:
            self.events.append(body)
        return b"{}"

    def add(self, pod: Mapping[str, Any]) -> None:
        with self._lock:
            meta = pod["metadata"]
            self.pods[(meta["namespace"], meta["name"])] = copy.deepcopy(dict(pod))

    def fail_next(self, status: int, message: str = "injected") -> None:
        with self._lock:
            self.failures.append(KubeError(status, message))

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        with self._lock:
            if self.failures:
                raise self.failures.pop(0)
            if name in self.fail_pods:
                raise self.fail_pods.pop(name)
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise KubeError(404, f'pods "{name}" not found')
            if uid and pod["metadata"]["uid"] != uid:
                raise KubeError(409, "Precondition failed: UID in precondition does not match")
            if pod["spec"].get("nodeName"):
                raise KubeError(409, f"pod {name} is already assigned to node {pod['spec']['nodeName']!r}")
            pod["spec"]["nodeName"] = node
            pod["metadata"].setdefault("annotations", {}).update(annotations)
            pod["status"]["phase"] = "Running"
            self.bindings.append((f"{namespace}/{name}", node, dict(annotations)))
            bound = copy.deepcopy(pod)
        if self.cache is not None:
            self.cache.upsert_pod(msgspec.convert(bound, Pod))

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        with self._lock:
            pod = self.pods.get((namespace, name))
            return None if pod is None else msgspec.convert(copy.deepcopy(pod), Pod)

    def delete(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            pod = self.pods.pop((namespace, name), None)
        if pod is not None and self.cache is not None:
            self.cache.delete_pod(msgspec.convert(pod, Pod))
        return pod

    def bound(self) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(p) for p in self.pods.values() if p["spec"].get("nodeName")]


class FakeClock:
    """A monotonic clock the test moves."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class AsgiClient:
    """A synchronous HTTP client for an ASGI app, in-process (httpx over ASGITransport)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
                return await client.request(method, url, **kwargs)

        return anyio.run(go)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`, from exposition text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != name:
            continue
        pairs = {p for p in rest.rstrip("}").split(",") if p}
        if all(f'{k}="{v}"' in pairs for k, v in labels.items()):
            total += float(value)
    return total
