"""The few Kubernetes API calls the extender makes, over the official client's transport.

The `kubernetes` package supplies configuration (kubeconfig, in-cluster service account), TLS,
authentication and connection pooling; bodies are read raw and decoded with msgspec into the
lean structs of `neuronetes.extender.wire` (the client's own model deserialisation is far too
slow for a 5,000-node list, and mis-decodes Binding responses).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import quote

import msgspec
import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from .wire import Pod, decoder

__all__ = ["Binder", "KubeApi", "KubeError", "WatchStream", "load_api_client"]

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


def _error(exc: ApiException) -> KubeError:
    body = exc.body
    message = exc.reason or ""
    if body:
        try:
            status = msgspec.json.decode(
                body if isinstance(body, bytes) else str(body).encode(), type=_Status
            )
            message = status.message or status.reason or message
        except msgspec.DecodeError:
            message = str(body)[:500]
    return KubeError(int(exc.status or 0), message)


class Binder(Protocol):
    """What the bind verb needs from the API server (a fake in unit tests)."""

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Post ``pods/binding``; raises `KubeError` (409: the pod is already bound)."""
        ...

    def get_pod(self, namespace: str, name: str) -> Pod | None:
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
    """Raw JSON requests through a `kubernetes.client.ApiClient` (thread-safe)."""

    def __init__(self, api_client: Any, *, timeout: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout = timeout
        # Binds come from a thread pool; let every thread keep a connection.
        pool = getattr(api_client.rest_client, "pool_manager", None)
        if pool is not None and getattr(pool, "connection_pool_kw", None) is not None:
            pool.connection_pool_kw["maxsize"] = max(pool.connection_pool_kw.get("maxsize") or 1, 32)

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

    # ---- the Binder protocol -----------------------------------------------------------------------
    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid  # the API server refuses the Binding if the pod was replaced meanwhile
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.post(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding", body)

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        try:
            data = self.get(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        try:
            pod: Pod = decoder(Pod).decode(data)
        except msgspec.DecodeError as exc:
            raise KubeError(0, f"pod {namespace}/{name}: undecodable response: {exc}") from None
        return pod


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
