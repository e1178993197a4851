"""The admission webhook's HTTPS server: AdmissionReview in, verdict out, and its dev certificate.

Four routes: ``/pods`` (mutating: sets the scheduler name, adds the ``neuronetes.io/carbon``
scheduling gate to time-shifted pool pods (`carbon_admission`), refuses what `admission.review_pod`
refuses, a ``neuronetes-*`` PriorityClass the namespace may not use (`tier_admission`) and what
would exceed the namespace's GPU quota (`quota_admission`)), ``/evictions`` and ``/events`` (the
node agent evicts, and records Events about, only pods of its own node: `agent_admission`) and
``/objects`` (validating: `validation.review_object` for AgentPool and GPUSlice, an AgentPool's
priority tier, a new GPUSlice's quota); ``/healthz`` answers 200. A malformed request gets a 4xx, never a 5xx.
Replicas on one host may listen on the same port (SO_REUSEPORT): the kernel spreads connections
over the live ones, so one replica dying leaves admission working, and with none left the API
server's ``failurePolicy: Fail`` refuses NeuroNetes pods and the node agent's evictions
(docs/webhook.md).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from .admission import ANNOTATION_SLICE, annotation_changes, asks_for_gpus, review_pod
from .agent_admission import PodReader, review_eviction, review_pod_event
from .apiread import ObjectLister
from .carbon_admission import PoolReader, carbon_gate_patch
from .quota_admission import review_pod_quota, review_slice_quota
from .slice_admission import SliceReader, review_slice_pod
from .tier_admission import NamespaceReader, review_pod_priority, review_pool_priority
from .tiers import DEFAULT_TIERS, PriorityTier
from .validation import review_object

__all__ = [
    "CERT_FILE",
    "KEY_FILE",
    "ClusterReads",
    "WebhookServer",
    "admission_response",
    "ensure_certificate",
]

log = logging.getLogger("neuronetes.webhook")
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
CA_FILE: Final = "ca.crt"
MAX_BODY: Final = 3 * 1024 * 1024  # the API server caps objects at 1.5 MiB; a review holds two
ROUTES: Final = ("/pods", "/evictions", "/events", "/objects")


def _respond(uid: str, refusals: Sequence[str], patch: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": not refusals}
    if refusals:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": "; ".join(refusals)}
    elif patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(patch)).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


@dataclass(frozen=True)
class ClusterReads:
    """What a replica reads besides the review, and the tiers it enforces (docs/webhook.md).

    `slices` reads the GPUSlice a pod names (`slice_admission.review_slice_pod`); `pods` the pod an
    Eviction or an Event names (`agent_admission`); `namespaces` a Namespace whose labels grant a
    priority tier (`tier_admission`); `quotas` lists a namespace's ResourceQuotas, GPUSlices and
    pods (`quota_admission`). Each missing one refuses what needs it (fail closed).
    """

    slices: SliceReader | None = None
    pods: PodReader | None = None
    namespaces: NamespaceReader | None = None
    quotas: ObjectLister | None = None
    tiers: tuple[PriorityTier, ...] = DEFAULT_TIERS
    pools: PoolReader | None = None
    """Reads the AgentPool a pod's ``neuronetes.io/pool`` label names (`carbon_admission`); missing or
    failing, pods are admitted without the carbon gate (fail open)."""


def admission_response(
    route: str,
    review: Mapping[str, Any],
    trusted: frozenset[str] = frozenset(),
    slices: SliceReader | None = None,
    pods: PodReader | None = None,
    reads: ClusterReads | None = None,
) -> dict[str, Any]:
    """The AdmissionReview answer for `review` on `route` (one of `ROUTES`).

    `trusted`: user names (``request.userInfo.username``) allowed to change NeuroNetes annotations
    of existing pods (the extender's and the agent's service accounts). `reads`: what the replica
    reads (`ClusterReads`); `slices` and `pods`, when given, stand for its readers of the same name.

    Raises:
        ValueError: not an AdmissionReview request (the server answers 400).
    """
    reads = reads or ClusterReads()
    if slices is not None or pods is not None:
        reads = replace(reads, slices=slices or reads.slices, pods=pods or reads.pods)
    request = review.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ValueError("not an admission.k8s.io/v1 AdmissionReview request (request.uid missing)")
    obj = request.get("object")
    if not isinstance(obj, Mapping):
        return _respond(request["uid"], [])  # DELETE and CONNECT carry no object: nothing to check
    namespace = str(request.get("namespace") or (obj.get("metadata") or {}).get("namespace") or "")
    if route == "/evictions":
        return _respond(request["uid"], *review_eviction(request, reads.pods))
    if route == "/events":
        return _respond(request["uid"], review_pod_event(request, reads.pods))
    if route == "/pods":
        return _review_pod(request, obj, namespace, trusted, reads)
    refusals = review_object(obj)
    if not refusals and obj.get("kind") == "AgentPool":
        refusals = review_pool_priority(obj, namespace, reads.tiers, reads.namespaces)
    elif not refusals and obj.get("kind") == "GPUSlice" and request.get("operation") == "CREATE":
        refusals = review_slice_quota(obj, namespace, reads.quotas)
    return _respond(request["uid"], refusals)


def _review_pod(
    request: Mapping[str, Any], obj: Mapping[str, Any], namespace: str, trusted: frozenset[str],
    reads: ClusterReads,
) -> dict[str, Any]:  # fmt: skip
    operation = request.get("operation")
    if operation == "UPDATE":
        old = request.get("oldObject")
        user = (request.get("userInfo") or {}).get("username")
        if not isinstance(old, Mapping) or user in trusted:
            return _respond(request["uid"], [])
        return _respond(request["uid"], annotation_changes(old, obj))
    if operation != "CREATE":
        return _respond(request["uid"], [])
    refusals = review_pod_priority(obj, namespace, reads.tiers, reads.namespaces)
    if refusals or not asks_for_gpus(obj):
        return _respond(request["uid"], refusals)
    patch: list[dict[str, Any]] = []
    if ANNOTATION_SLICE in ((obj.get("metadata") or {}).get("annotations") or {}):
        inside = review_slice_pod(obj, namespace, reads.slices)
        if inside.refusals:
            return _respond(request["uid"], inside.refusals)
        obj, patch = inside.pod, inside.patch
    verdict = review_pod(obj)
    refusals = verdict.refusals or review_pod_quota(obj, namespace, reads.quotas)
    if refusals:
        return _respond(request["uid"], refusals)
    gate = carbon_gate_patch(obj, namespace, reads.pools)
    return _respond(request["uid"], [], [*patch, *verdict.patch, *gate])


class _Handler(BaseHTTPRequestHandler):
    server_version = "neuronetes-webhook"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, code: int, body: Mapping[str, Any] | str) -> None:
        data = (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]  # the API server appends ?timeout=...

    def do_GET(self) -> None:
        if self.route == "/healthz":
            self._send(200, "ok")
        else:
            self._send(404, "not found")

    def do_POST(self) -> None:
        if self.route not in ROUTES:
            self._send(404, "not found")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            self._send(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
            return
        if length <= 0:
            self._send(400, "bad request: empty body")
            return
        if length > MAX_BODY:
            self.close_connection = True  # the body was not read
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY} bytes")
            return
        try:
            review = json.loads(self.rfile.read(length))
            if not isinstance(review, Mapping):
                raise ValueError("the body is not a JSON object")
            server: Any = self.server
            answer = admission_response(self.route, review, server.trusted, reads=server.reads)
        except (ValueError, UnicodeDecodeError) as exc:
            self._send(400, f"bad request: {exc}")
            return
        self._send(200, answer)


class _ReusePortServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-request (or mid-handshake) is not the server's error.
        log.debug("connection from %s ended: %s", client_address, sys.exc_info()[1])

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


class WebhookServer:
    """The HTTPS server of one webhook replica; `serve_forever` in the caller's thread."""

    def __init__(
        self,
        host: str,
        port: int,
        cert_dir: Path,
        trusted: frozenset[str] = frozenset(),
        reads: ClusterReads | None = None,
    ) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert_dir / CERT_FILE, cert_dir / KEY_FILE)
        self.httpd = _ReusePortServer((host, port), _Handler)
        self.httpd.trusted = trusted  # type: ignore[attr-defined]
        self.httpd.reads = reads or ClusterReads()  # type: ignore[attr-defined]
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.5)

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def ensure_certificate(cert_dir: Path, hosts: Sequence[str] = ("localhost", "127.0.0.1")) -> bytes:
    """A CA and a serving certificate for `hosts` in `cert_dir` (kept if present); the CA's PEM.

    For local clusters only: in a cluster, cert-manager (or the chart) provides the certificate.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_path, cert_path, key_path = cert_dir / CA_FILE, cert_dir / CERT_FILE, cert_dir / KEY_FILE
    if ca_path.exists() and cert_path.exists() and key_path.exists():
        return ca_path.read_bytes()
    cert_dir.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "neuronetes-webhook-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    key_path.touch(mode=0o600)
    key_path.write_bytes(key_pem)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    ca_path.write_bytes(ca_pem)
    return ca_pem
