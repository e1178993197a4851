"""How the API server proves itself to the real nodes' kubelets: a client certificate of its own.

A kubelet serves logs, exec and attach on its port; without a check anyone on the machine who can
reach loopback could run commands in its containers. The cluster makes a CA and a client
certificate for the API server (``pki/kubelet-client/``, owner only, made with ``openssl``); the
API server presents it (``--kubelet-client-certificate``) and each kubelet accepts only clients
whose certificate that CA signed (``authentication.x509.clientCAFile``, anonymous off). The
kubelet's own serving certificate is self-signed and not verified by the API server (loopback).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["apiserver_kubelet_client_args", "kubelet_client_ca"]

SUBJECT = "/O=system:masters/CN=kube-apiserver-kubelet-client"


def _folder(pki: Path) -> Path:
    return pki / "kubelet-client"


def kubelet_client_ca(pki: Path) -> Path:
    """The CA file a kubelet verifies the API server's client certificate with."""
    return _folder(pki) / "ca.crt"


def _openssl(*args: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    except FileNotFoundError:
        raise RuntimeError("the openssl command is needed for the kubelets' client CA") from None
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"openssl failed: {exc.stderr.decode(errors='replace').strip()}") from None


def apiserver_kubelet_client_args(pki: Path) -> list[str]:
    """Make the CA and the API server's client certificate; return kube-apiserver's flags."""
    d = _folder(pki)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (
        d / n for n in ("ca.key", "ca.crt", "client.key", "client.csr", "client.crt")
    )
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "365",
             "-subj", "/CN=neuronetes-dev-kubelet-client-ca")  # fmt: skip
    _openssl("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", SUBJECT)
    ext = d / "client.ext"
    ext.write_text("extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "365", "-extfile", str(ext))  # fmt: skip
    for f in (ca_key, key):
        f.chmod(0o600)
    return [f"--kubelet-client-certificate={cert}", f"--kubelet-client-key={key}"]
