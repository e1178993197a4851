"""Raw JSON requests to the API server through the official client's `ApiClient`.

The `kubernetes` package supplies what is hard to get right (kubeconfig, the in-cluster service
account, token refresh, TLS, client certificates); bodies are read raw and decoded by the caller
(the client's own model deserialisation is far too slow for a 5,000-node list, and mis-decodes
Binding responses). Every failure is a `KubeError` with the HTTP status (0: no response at all).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec
import msgspec.yaml
import urllib3

if TYPE_CHECKING:  # imported when a client is made: importing this module stays cheap
    from kubernetes.client import ApiClient

__all__ = [
    "APPLY",
    "JSON",
    "MERGE_PATCH",
    "KubeClient",
    "KubeError",
    "WatchStream",
    "load_api_client",
    "status_error",
    "token_api_client",
]

log = logging.getLogger(__name__)

JSON: Final = "application/json"
APPLY: Final = "application/apply-patch+yaml"  # JSON is YAML: the client sends it as JSON
MERGE_PATCH: Final = "application/merge-patch+json"
_AUTH: Final = ["BearerToken"]


class KubeError(RuntimeError):
    """An API call that failed.

    `status` is the HTTP status (0: no response at all); `message` what the API server said (its
    Status message), else why there was no answer; `reason` the HTTP reason phrase, or for status
    0 the transport's own reason (the refused connection, the unknown host).
    """

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.reason = reason

    @property
    def ambiguous(self) -> bool:
        """The request may or may not have taken effect (no response, timeout, server error)."""
        return self.status == 0 or self.status == 429 or self.status >= 500


class _Status(msgspec.Struct):
    message: str = ""
    reason: str = ""
    code: int = 0


def status_error(code: int, body: bytes | str | None, reason: str) -> KubeError:
    """The `KubeError` of an answer with HTTP status `code` (message from its Status body)."""
    message = reason
    if body:
        try:
            status = msgspec.json.decode(body if isinstance(body, bytes) else body.encode(), type=_Status)
            message = status.message or status.reason or message
        except msgspec.DecodeError:
            message = str(body)[:500]
    return KubeError(code, message, reason)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


_KUBECONFIG_KEYS: Final = ("clusters", "contexts", "users", "current-context")


def _kubeconfig_problem(path: Path) -> str | None:
    """Why the file `path` is no kubeconfig, on one line (None: it may be one). Checked before the
    client reads it, whose own failures on any other file are a YAML parser's or an
    ``AttributeError``'s words, not the file's."""
    try:
        text = path.read_bytes()
    except IsADirectoryError:
        return "a folder, not a kubeconfig file"
    except FileNotFoundError:
        return "no such file"
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        return _one_line(exc.strerror or exc)
    try:
        doc = msgspec.yaml.decode(text) if text.strip() else None
    except (msgspec.DecodeError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict) or not any(key in doc for key in _KUBECONFIG_KEYS):
        return "not a kubeconfig (a YAML mapping with clusters, users and contexts)"
    return None


def load_api_client(kubeconfig: str | Path | None = None) -> ApiClient:
    """An `ApiClient`: from `kubeconfig`, else in-cluster, else the default kubeconfig
    (``$KUBECONFIG`` or ``~/.kube/config``).

    Raises:
        KubeError: no configuration could be loaded (status 0; `reason`: why, on one line).
    """
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    if kubeconfig is not None and (problem := _kubeconfig_problem(Path(kubeconfig))) is not None:
        raise KubeError(0, f"kubeconfig {kubeconfig}: {problem}", problem)
    try:
        if kubeconfig is not None:
            return k8s_config.new_client_from_config(config_file=str(kubeconfig))
        try:
            k8s_config.load_incluster_config()
        except k8s_config.ConfigException:
            return k8s_config.new_client_from_config()
        return k8s_client.ApiClient()
    except (k8s_config.ConfigException, OSError, ValueError, TypeError) as exc:
        raise KubeError(0, f"no usable Kubernetes configuration: {exc}", _one_line(exc)) from None


def token_api_client(server: str, token: str, ca_file: str | Path) -> ApiClient:
    """An `ApiClient` for `server` with a bearer token and verified TLS (a cluster we started)."""
    from kubernetes import client as k8s_client

    configuration = k8s_client.Configuration()
    configuration.host = server
    # The header's whole value: older clients look the prefix up under another key than newer ones.
    configuration.api_key = {"authorization": f"Bearer {token}"}
    configuration.ssl_ca_cert = str(ca_file)
    configuration.verify_ssl = True
    return k8s_client.ApiClient(configuration)


class KubeClient:
    """Raw JSON requests through one `ApiClient` (thread-safe).

    `timeout` is every request's default (seconds); `connections`, when given, raises the
    connection pool to at least that many (one per watching thread, so no watch waits for
    another's connection).
    """

    def __init__(
        self, api_client: ApiClient, *, timeout: float = 10.0, connections: int | None = None
    ) -> None:
        self.api_client = api_client
        self.timeout = timeout
        if connections:
            self._pool_at_least(connections)

    def _pool_at_least(self, connections: int) -> None:
        pool = getattr(self.api_client.rest_client, "pool_manager", None)
        if pool is not None and getattr(pool, "connection_pool_kw", None) is not None:
            pool.connection_pool_kw["maxsize"] = max(pool.connection_pool_kw.get("maxsize") or 1, connections)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | Path | None = None, **kwargs: Any) -> KubeClient:
        return cls(load_api_client(kubeconfig), **kwargs)

    @property
    def server(self) -> str:
        return str(self.api_client.configuration.host)

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        timeout: float | tuple[float, float] | None = None,
        content_type: str = JSON,
    ) -> urllib3.BaseHTTPResponse:
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": JSON}
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
                _return_http_data_only=True,
                _request_timeout=timeout if timeout is not None else self.timeout,
            )
        except ApiException as exc:
            raise status_error(int(exc.status or 0), exc.body, exc.reason or "") from None
        except Exception as exc:  # urllib3's connection errors, of many types
            reason = _one_line(getattr(exc, "reason", None) or exc)
            raise KubeError(0, f"{method} {path}: {exc}", reason) from None
        return response

    def _body(self, method: str, path: str, response: urllib3.BaseHTTPResponse) -> bytes:
        try:
            return bytes(response.data)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, f"{method} {path}: {exc}", _one_line(exc)) from None
        finally:
            response.release_conn()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        timeout: float | None = None,
        content_type: str = JSON,
    ) -> bytes:
        """One call; the response body (raises `KubeError`)."""
        response = self._call(
            method, path, query=query, body=body, timeout=timeout, content_type=content_type
        )
        return self._body(method, path, response)

    def get(self, path: str, query: Sequence[tuple[str, str]] = (), *, timeout: float | None = None) -> bytes:
        return self.request("GET", path, query=query, timeout=timeout)

    def post(self, path: str, body: Mapping[str, Any], *, timeout: float | None = None) -> bytes:
        return self.request("POST", path, body=dict(body), timeout=timeout)

    def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, timeout: float | None = None
    ) -> bytes:
        """Server-side apply of `body` at `path` (forced: this manager owns the fields it sets)."""
        query = [("fieldManager", field_manager), ("force", "true")]
        return self.request("PATCH", path, query=query, body=dict(body), timeout=timeout, content_type=APPLY)

    def merge_patch(self, path: str, body: Mapping[str, Any], *, timeout: float | None = None) -> bytes:
        return self.request("PATCH", path, body=dict(body), timeout=timeout, content_type=MERGE_PATCH)

    def delete(self, path: str, *, timeout: float | None = None) -> bytes:
        return self.request("DELETE", path, timeout=timeout)

    def watch(self, path: str, query: Sequence[tuple[str, str]], *, read_timeout: float) -> WatchStream:
        """A watch stream (iterate its lines; `close` it, from any thread, to end it); connecting
        is bounded by the client's `timeout`, each read by `read_timeout`."""
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
            raise KubeError(0, f"watch stream broken: {exc}", _one_line(exc)) from None
        if buffer.strip():
            yield buffer
