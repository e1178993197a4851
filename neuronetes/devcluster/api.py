"""Talking to the dev cluster: a small JSON client for the API server, kubectl, health probes.

The client verifies the API server's certificate and sends a bearer token; the probes are for
the loopback health endpoints of the components (some serve self-signed certificates).
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
from typing import Any

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


class ApiError(RuntimeError):
    """A request to the API server failed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


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
    """A minimal JSON client for the API server (bearer token, verified TLS)."""

    def __init__(self, server: str, token: str, ca_file: Path) -> None:
        self.server = server
        self.token = token
        self.context = ssl.create_default_context(cafile=str(ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                message = str(json.loads(text).get("message", text))
            except ValueError:
                message = text
            raise ApiError(exc.code, message) from None
        return json.loads(raw) if raw else None

    def apply(self, obj: dict[str, Any], *, field_manager: str) -> Any:
        """Server-side apply of one object (forced: this manager owns what it sets)."""
        return self.request(
            "PATCH",
            f"{object_path(obj)}?fieldManager={field_manager}&force=true",
            obj,
            content_type="application/apply-patch+yaml",
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
