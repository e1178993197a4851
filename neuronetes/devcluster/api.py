"""Talking to the dev cluster: a small JSON client for the API server, kubectl, health probes.

The client (the core `neuronetes.kube.KubeClient`) verifies the API server's certificate and sends
a bearer token; the probes are for the loopback health endpoints of the components (some serve
self-signed certificates).
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from neuronetes.kube.client import APPLY, KubeClient, KubeError, token_api_client

__all__ = [
    "Api",
    "ApiError",
    "KubectlError",
    "free_ports",
    "http_ok",
    "insecure_context",
    "object_path",
    "run_kubectl",
]


class KubectlError(subprocess.CalledProcessError):
    """kubectl failed; the message carries its stderr."""

    def __str__(self) -> str:
        err = (self.stderr or "").strip() if isinstance(self.stderr, str) else ""
        return f"{super().__str__()}\n{err}" if err else super().__str__()


def run_kubectl(
    kubectl: Path,
    kubeconfig: Path,
    args: Sequence[str],
    *,
    input: str | None = None,
    check: bool = True,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run `kubectl` with `kubeconfig`; with `check`, raise `KubectlError` carrying its stderr."""
    command = [str(kubectl), f"--kubeconfig={kubeconfig}", *args]
    proc = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise KubectlError(proc.returncode, command, proc.stdout, proc.stderr)
    return proc


class ApiError(KubeError):
    """A request to the API server failed with an HTTP status (one without any answer is an
    `OSError`, as urllib's were)."""

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.message}"


REQUEST_TIMEOUT_S: Final = 30.0


def free_ports(n: int) -> list[int]:
    """`n` distinct free TCP ports on 127.0.0.1 (held open until all are picked)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def insecure_context() -> ssl.SSLContext:
    """For loopback health probes of components serving self-signed certificates only."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_ok(url: str, *, context: ssl.SSLContext | None = None, token: str | None = None) -> tuple[bool, str]:
    """(whether `url` answers 200, the start of its body or why not)."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2, context=context) as resp:
            body = resp.read(4096).decode(errors="replace")
            return resp.status == 200, body.strip()
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return False, str(exc)


class Api:
    """A minimal JSON client for the API server (bearer token, verified TLS): the core
    `KubeClient` over an `ApiClient` for `server`."""

    def __init__(self, server: str, token: str, ca_file: Path) -> None:
        self.server = server
        self.token = token
        self.context = ssl.create_default_context(cafile=str(ca_file))  # for health probes
        self.client = KubeClient(token_api_client(server, token, ca_file), timeout=REQUEST_TIMEOUT_S)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> Any:
        """One call; the parsed JSON answer (None when empty). Raises `ApiError` for an HTTP
        status, `ConnectionError` when the server did not answer."""
        try:
            raw = self.client.request(method, path, body=body, timeout=timeout, content_type=content_type)
        except KubeError as exc:
            if not exc.status:
                raise ConnectionError(exc.message) from None
            raise ApiError(exc.status, exc.message, exc.reason) from None
        return json.loads(raw) if raw else None

    def apply(self, obj: dict[str, Any], *, field_manager: str) -> Any:
        """Server-side apply of one object (forced: this manager owns what it sets)."""
        return self.request(
            "PATCH",
            f"{object_path(obj)}?fieldManager={field_manager}&force=true",
            obj,
            content_type=APPLY,
        )


# apiVersion, kind → plural resource, for the kinds the dev cluster applies itself.
_RESOURCES = {
    "Namespace": "namespaces",
    "ServiceAccount": "serviceaccounts",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}


def object_path(obj: dict[str, Any]) -> str:
    """The REST path of `obj` (one of the kinds in `_RESOURCES`)."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    try:
        plural = _RESOURCES[kind]
    except KeyError:
        raise ValueError(f"the dev cluster does not apply objects of kind {kind}") from None
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    meta = obj["metadata"]
    ns = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
    return f"{prefix}{ns}/{plural}/{meta['name']}"
