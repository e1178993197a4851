"""The extender's one Kubernetes API client: a blocking side for the reflectors, an async side
for everything on the request path.

The `kubernetes` package supplies configuration (kubeconfig, in-cluster service account, token
refresh); from that one configuration come both transports. `KubeApi` (blocking, urllib3 through
the official client) lists and watches in the reflector threads. `AsyncKube` (lean HTTP/1.1 with
keep-alive, `neuronetes_extender.http1`) posts Bindings and Events from the event loop, so a bind
never waits for a pool thread. Bodies are read raw and decoded with msgspec into the lean structs
of `neuronetes_extender.wire` (the client's own model deserialisation is far too slow for a
5,000-node list, and mis-decodes Binding responses).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import quote, urlencode

import msgspec
import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

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

_JSON: Final = "application/json"
_APPLY: Final = "application/apply-patch+yaml"  # JSON is YAML: the client sends it as JSON
_AUTH: Final = ["BearerToken"]


class KubeError(RuntimeError):
    """An API call that failed; `status` is the HTTP status (0: no response at all)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status or 'no response'}: {message}" if status else message)
        self.status = status
        self.message = message

    @property
    def ambiguous(self) -> bool:
        """The request may or may not have taken effect (no response, timeout, server error)."""
        return self.status == 0 or self.status == 429 or self.status >= 500


class _Status(msgspec.Struct):
    message: str = ""
    reason: str = ""
    code: int = 0


def _status_error(code: int, body: bytes | str | None, reason: str) -> KubeError:
    message = reason
    if body:
        try:
            status = msgspec.json.decode(body if isinstance(body, bytes) else body.encode(), type=_Status)
            message = status.message or status.reason or message
        except msgspec.DecodeError:
            message = str(body)[:500]
    return KubeError(code, message)


def _error(exc: ApiException) -> KubeError:
    return _status_error(int(exc.status or 0), exc.body, exc.reason or "")


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


def load_api_client(kubeconfig: str | Path | None = None) -> Any:
    """A `kubernetes.client.ApiClient`: from `kubeconfig`, else in-cluster, else ``~/.kube/config``.

    Raises:
        KubeError: no configuration could be loaded.
    """
    try:
        if kubeconfig is not None:
            return k8s_config.new_client_from_config(config_file=str(kubeconfig))
        try:
            k8s_config.load_incluster_config()
        except k8s_config.ConfigException:
            return k8s_config.new_client_from_config()
        return k8s_client.ApiClient()
    except (k8s_config.ConfigException, OSError) as exc:
        raise KubeError(0, f"no usable Kubernetes configuration: {exc}") from None


class KubeApi:
    """Raw JSON requests through a `kubernetes.client.ApiClient` (thread-safe; the reflectors')."""

    def __init__(self, api_client: Any, *, timeout: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout = timeout
        # One connection per reflector thread (nodes, pods, GPUNodes, reservations, PodGroups).
        pool = getattr(api_client.rest_client, "pool_manager", None)
        if pool is not None and getattr(pool, "connection_pool_kw", None) is not None:
            pool.connection_pool_kw["maxsize"] = max(pool.connection_pool_kw.get("maxsize") or 1, 8)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | Path | None = None) -> KubeApi:
        return cls(load_api_client(kubeconfig))

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        timeout: float | tuple[float, float] | None = None,
        content_type: str = _JSON,
    ) -> urllib3.BaseHTTPResponse:
        headers = {"Accept": _JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            response: urllib3.BaseHTTPResponse = self.api_client.call_api(
                path,
                method,
                query_params=list(query),
                header_params=headers,
                body=body,
                auth_settings=_AUTH,
                _preload_content=False,
                _request_timeout=timeout if timeout is not None else self.timeout,
            )
        except ApiException as exc:
            raise _error(exc) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, f"{method} {path}: {exc}") from None
        return response

    def _body(self, method: str, path: str, response: urllib3.BaseHTTPResponse) -> bytes:
        try:
            return bytes(response.data)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, f"{method} {path}: {exc}") from None
        finally:
            response.release_conn()

    def get(self, path: str, query: Sequence[tuple[str, str]] = (), *, timeout: float | None = None) -> bytes:
        return self._body("GET", path, self._call("GET", path, query=query, timeout=timeout))

    def post(self, path: str, body: Mapping[str, Any], *, timeout: float | None = None) -> bytes:
        return self._body("POST", path, self._call("POST", path, body=dict(body), timeout=timeout))

    def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, timeout: float | None = None
    ) -> bytes:
        """Server-side apply of `body` at `path` (forced: this manager owns the fields it sets)."""
        query = [("fieldManager", field_manager), ("force", "true")]
        response = self._call(
            "PATCH", path, query=query, body=dict(body), timeout=timeout, content_type=_APPLY
        )
        return self._body("PATCH", path, response)

    def merge_patch(self, path: str, body: Mapping[str, Any], *, timeout: float | None = None) -> bytes:
        response = self._call(
            "PATCH", path, body=dict(body), timeout=timeout, content_type="application/merge-patch+json"
        )
        return self._body("PATCH", path, response)

    def delete(self, path: str, *, timeout: float | None = None) -> bytes:
        return self._body("DELETE", path, self._call("DELETE", path, timeout=timeout))

    def watch(self, path: str, query: Sequence[tuple[str, str]], *, read_timeout: float) -> WatchStream:
        """A watch stream (iterate its lines; `close` it, from any thread, to end it)."""
        response = self._call("GET", path, query=query, timeout=(self.timeout, read_timeout))
        return WatchStream(response)


class WatchStream:
    """The lines of one watch response."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response
        self._closed = False

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            shutdown = getattr(self._response, "shutdown", None)
            if shutdown is not None:
                shutdown()  # unblocks a reader in another thread (urllib3 >= 2.3)
            self._response.release_conn()
        except Exception:  # pragma: no cover - best effort on a broken connection
            log.debug("closing a watch connection failed", exc_info=True)

    def __iter__(self) -> Iterator[bytes]:
        buffer = b""
        try:
            for chunk in self._response.stream(64 * 1024, decode_content=True):
                buffer += chunk
                while True:
                    cut = buffer.find(b"\n")
                    if cut < 0:
                        break
                    line, buffer = buffer[:cut], buffer[cut + 1 :]
                    if line.strip():
                        yield line
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if self._closed:
                return
            raise KubeError(0, f"watch stream broken: {exc}") from None
        if buffer.strip():
            yield buffer


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
        headers = {"Accept": _JSON}
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
        content_type: str = _JSON,
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
            raise _status_error(response.status, response.body, response.reason)
        return response.body

    async def post(self, path: str, body: Mapping[str, Any]) -> bytes:
        return await self.request("POST", path, body=msgspec.json.encode(body))

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> bytes:
        return await self.request(
            "PATCH", path, body=msgspec.json.encode(body), content_type="application/merge-patch+json"
        )

    async def apply(self, path: str, body: Mapping[str, Any], *, field_manager: str) -> bytes:
        """Server-side apply of `body` at `path` (forced: this manager owns the fields it sets)."""
        query = [("fieldManager", field_manager), ("force", "true")]
        return await self.request(
            "PATCH", path, body=msgspec.json.encode(body), query=query, content_type=_APPLY
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
