"""The extender's Kubernetes API access: the core client for the reflectors, a lean async client
for everything on the request path.

The `kubernetes` package supplies configuration (kubeconfig, in-cluster service account, token
refresh); from that one configuration come both transports. `KubeApi` (the core
`neuronetes.kube.KubeClient`: blocking, urllib3 through the official client) lists and watches
in the reflector threads. `AsyncKube` (lean HTTP/1.1 with keep-alive, `neuronetes_extender.http1`)
posts Bindings and Events from the event loop, so a bind never waits for a pool thread: it stays
hand-written because it is the hot path — ``bench/e2e_throughput.py`` (bench/README.md, "Async
bind, lean client") measured 0.05 ms of CPU per request against 0.9 ms for httpx and more for the
Kubernetes client in a thread pool, and the profile of ``bench/e2e_throughput.py
--profile-extender`` puts the Binding POST at 0.10–0.11 ms per pod. Bodies are read raw and
decoded with msgspec into the lean structs of `neuronetes_extender.wire`.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import quote, urlencode

import msgspec

from neuronetes import contracts as c
from neuronetes.kube.client import (
    APPLY,
    JSON,
    MERGE_PATCH,
    KubeClient,
    KubeError,
    load_api_client,
    status_error,
)
from neuronetes.kube.client import WatchStream as WatchStream

from .http1 import Http1Pool
from .wire import Pod, decoder

__all__ = [
    "AsyncKube",
    "Binder",
    "KubeApi",
    "KubeError",
    "WatchStream",
    "binding_body",
    "load_api_client",
    "pod_path",
]

log = logging.getLogger(__name__)

REFLECTOR_CONNECTIONS: Final = 8
"""One connection per reflector thread (nodes, pods, GPUNodes, GPUSlices, reservations, PodGroups)."""


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def binding_body(namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> bytes:
    """A ``pods/binding`` body: the pod's UID (when known) makes the API server refuse a Binding
    for a pod that was replaced meanwhile."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = dict(annotations)
    return msgspec.json.encode(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
    )


class Binder(Protocol):
    """What the bind verb needs from the API server (a fake in unit tests); called on the loop."""

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """Post ``pods/binding``; raises `KubeError` (409: the pod is already bound)."""
        ...

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        """The pod, or None when it does not exist; raises `KubeError` otherwise."""
        ...


class KubeApi(KubeClient):
    """The core client with a connection for each reflector thread (thread-safe)."""

    def __init__(self, api_client: Any, *, timeout: float = 10.0) -> None:
        super().__init__(api_client, timeout=timeout, connections=REFLECTOR_CONNECTIONS)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | Path | None = None, **kwargs: Any) -> KubeApi:
        return cls(load_api_client(kubeconfig), **kwargs)


def _ssl_context(cfg: Any) -> ssl.SSLContext:
    """TLS as the kubeconfig says: its CA (or none when verification is off) and client cert."""
    if cfg.verify_ssl:
        context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    else:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return context


class AsyncKube:
    """The request-path API calls, async over keep-alive connections (one event loop).

    Built from the same `kubernetes` configuration as `KubeApi`; the bearer token is read per
    request through the configuration, so a rotated service-account token is picked up.
    """

    def __init__(self, configuration: Any, *, timeout: float = 10.0, max_connections: int = 32) -> None:
        self._cfg = configuration
        self._timeout = timeout
        self._max_connections = max_connections
        self._pool: Http1Pool | None = None

    @classmethod
    def of(cls, api: KubeApi) -> AsyncKube:
        return cls(api.api_client.configuration, timeout=api.timeout)

    def _http(self) -> Http1Pool:
        if self._pool is None:
            self._pool = Http1Pool(
                str(self._cfg.host),
                ssl_context=_ssl_context(self._cfg),
                max_connections=self._max_connections,
                timeout=self._timeout,
            )
        return self._pool

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": JSON}
        if content_type is not None:
            headers["Content-Type"] = content_type
        for auth in self._cfg.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        query: Sequence[tuple[str, str]] = (),
        content_type: str = JSON,
    ) -> bytes:
        """One call; the response body, or `KubeError` (status 0: no response at all)."""
        target = f"{path}?{urlencode(list(query))}" if query else path
        try:
            response = await self._http().request(
                method, target, self._headers(content_type if body is not None else None), body
            )
        except (OSError, TimeoutError) as exc:
            raise KubeError(0, f"{method} {path}: {exc or type(exc).__name__}") from None
        if response.status >= 300:
            raise status_error(response.status, response.body, response.reason)
        return response.body

    async def post(self, path: str, body: Mapping[str, Any]) -> bytes:
        return await self.request("POST", path, body=msgspec.json.encode(body))

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> bytes:
        return await self.request("PATCH", path, body=msgspec.json.encode(body), content_type=MERGE_PATCH)

    async def apply(self, path: str, body: Mapping[str, Any], *, field_manager: str) -> bytes:
        """Server-side apply of `body` at `path` (forced: this manager owns the fields it sets)."""
        query = [("fieldManager", field_manager), ("force", "true")]
        return await self.request(
            "PATCH", path, body=msgspec.json.encode(body), query=query, content_type=APPLY
        )

    async def delete(self, path: str) -> bytes:
        return await self.request("DELETE", path)

    # ---- the Binder protocol -----------------------------------------------------------------------
    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        body = binding_body(namespace, name, uid, node, annotations)
        await self.request("POST", pod_path(namespace, name) + "/binding", body=body)

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        try:
            data = await self.request("GET", pod_path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        try:
            pod: Pod = decoder(Pod).decode(data)
        except msgspec.DecodeError as exc:
            raise KubeError(0, f"pod {namespace}/{name}: undecodable response: {exc}") from None
        return pod


ANNOTATION_NUDGED_AT: Final = f"{c.GROUP}/nudged-at"
"""Touched on a pending pod so that kube-scheduler, which parks pods it found unschedulable until
they or the cluster change, retries it."""


def nudge_pod(api: KubeApi, namespace: str, name: str) -> bool:
    """Touch a pending pod (annotation `ANNOTATION_NUDGED_AT`): kube-scheduler retries a pod it
    parked as unschedulable when the pod changes. Whether it was touched (gone: not)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
    try:
        api.merge_patch(path, {"metadata": {"annotations": {ANNOTATION_NUDGED_AT: stamp}}})
    except KubeError as exc:
        if exc.status != 404:  # gone: nothing to retry
            log.warning("nudging pod %s/%s failed: %s", namespace, name, exc)
        return False
    return True
