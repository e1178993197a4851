"""Who may do what in the dev cluster: the admin, kube-scheduler and the extender's own identity.

The admin is a static-token user in ``system:masters`` (kube-apiserver's ``--token-auth-file``);
kube-controller-manager and kwok use it. kube-scheduler runs as its stock identity
``system:kube-scheduler`` (a second static token; the bootstrap RBAC grants it what it needs).
The extender runs as the ServiceAccount ``neuronetes-system/neuronetes-scheduler`` with a
ClusterRole holding exactly the calls its code makes (the extender's modules ``kube``, ``watch``,
``reservations`` and ``service``), and a token from the TokenRequest API in a kubeconfig of its
own. `EXTENDER_USERNAME` (from `neuronetes.contracts`) is the one name the
admission policies in ``manifests/policies/`` trust to write ``neuronetes.io/assigned-gpus``; a unit
test checks that the policy file names the same identity.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Final

from neuronetes.contracts import EXTENDER_SERVICE_ACCOUNT, EXTENDER_USERNAME, GROUP
from neuronetes.contracts import SYSTEM_NAMESPACE as EXTENDER_NAMESPACE
from neuronetes.devcluster.api import Api

__all__ = [
    "ADMIN_GROUP",
    "ADMIN_USER",
    "EXTENDER_NAMESPACE",
    "EXTENDER_SERVICE_ACCOUNT",
    "EXTENDER_TOKEN_SECONDS",
    "EXTENDER_USERNAME",
    "FIELD_MANAGER",
    "SCHEDULER_USER",
    "extender_identity",
    "extender_rules",
    "generate_service_account_key",
    "install_extender_identity",
    "kubeconfig",
    "scheduler_lease_access",
    "static_tokens",
    "token_request",
    "write_private",
]

ADMIN_USER: Final = "neuronetes-admin"
ADMIN_GROUP: Final = "system:masters"
SCHEDULER_USER: Final = "system:kube-scheduler"
"""kube-scheduler's stock identity: the API server's bootstrap RBAC binds the ClusterRoles
``system:kube-scheduler`` and ``system:volume-scheduler`` (and the role that reads the
authentication ConfigMap) to this user."""
EXTENDER_TOKEN_SECONDS: Final = 7 * 24 * 3600
"""The extender's token outlives any dev cluster (the API server signs it; nothing refreshes it)."""
_ROLE: Final = "neuronetes:scheduler-extender"
FIELD_MANAGER: Final = "neuronetes-devcluster"
"""The field manager of what the dev cluster applies."""


def extender_rules() -> list[dict[str, Any]]:
    """The extender's ClusterRole rules: what each call site needs, nothing more.

    - nodes, gpunodes, gpuslices: the informers (list+watch; a Bound slice reserves GPU share);
    - pods: the informer (list+watch), the bind path's re-read of one pod (get), and the nudge
      that makes kube-scheduler retry a pod once GPUs were released (patch);
    - pods/binding create: the bind verb (the Binding carries the assignment annotation);
    - pods/eviction create: the preemption controller evicts its victims (PDBs honoured);
    - policy poddisruptionbudgets: the informer (list+watch) that orders those victims (fewest
      PDB violations first);
    - events.k8s.io events create: placement and gang-barrier Events;
    - gangreservations: the informer (list+watch), server-side apply of the reservations it
      holds (patch; create: an apply that creates the object), deletion when a group ends, and
      their status (patch);
    - podgroups of scheduling-plugins and Volcano: gang sizes and timeouts, from a watch.
    """
    watch = ["list", "watch"]
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": watch},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", *watch, "patch"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": watch},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
        {
            "apiGroups": [GROUP],
            "resources": ["gangreservations"],
            "verbs": [*watch, "create", "patch", "delete"],
        },
        {"apiGroups": [GROUP], "resources": ["gangreservations/status"], "verbs": ["patch"]},
        {"apiGroups": [GROUP], "resources": ["gpunodes", "gpuslices"], "verbs": watch},
        {
            "apiGroups": ["scheduling.x-k8s.io", "scheduling.volcano.sh"],
            "resources": ["podgroups"],
            "verbs": watch,
        },
    ]


def scheduler_lease_access(lease: str) -> list[dict[str, Any]]:
    """Lets ``system:kube-scheduler`` hold NeuroNetes' Lease too (its stock role names only
    the ``kube-scheduler`` Lease; it may create leases, not update another's)."""
    meta = {"name": f"neuronetes:scheduler-lease-{lease}", "namespace": "kube-system"}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [lease],
                    "verbs": ["get", "update"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": meta["name"]},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": SCHEDULER_USER}],
        },
    ]


def extender_identity() -> list[dict[str, Any]]:
    """Namespace, ServiceAccount, ClusterRole and ClusterRoleBinding of the extender."""
    labels = {"app.kubernetes.io/name": "neuronetes", "app.kubernetes.io/component": "scheduler-extender"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": EXTENDER_NAMESPACE, "labels": labels}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": EXTENDER_SERVICE_ACCOUNT, "namespace": EXTENDER_NAMESPACE, "labels": labels},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": _ROLE, "labels": labels},
            "rules": extender_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": _ROLE, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": _ROLE},
            "subjects": [
                {"kind": "ServiceAccount", "name": EXTENDER_SERVICE_ACCOUNT, "namespace": EXTENDER_NAMESPACE}
            ],
        },
    ]


def static_tokens(admin: str, scheduler: str) -> str:
    """kube-apiserver's ``--token-auth-file``: the admin and kube-scheduler's stock identity."""
    return (
        f'{admin},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n{scheduler},{SCHEDULER_USER},{SCHEDULER_USER}\n'
    )


def token_request(seconds: int = EXTENDER_TOKEN_SECONDS) -> tuple[str, dict[str, Any]]:
    """(path, body) of the TokenRequest for the extender's ServiceAccount."""
    path = f"/api/v1/namespaces/{EXTENDER_NAMESPACE}/serviceaccounts/{EXTENDER_SERVICE_ACCOUNT}/token"
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds},
    }
    return path, body


def kubeconfig(
    *, name: str, server: str, ca_pem: bytes, token: str, user: str = ADMIN_USER
) -> dict[str, Any]:
    """A kubeconfig with one bearer-token user (the admin by default); CA inline."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": f"{name}-{user}", "user": {"token": token}}],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": name, "user": f"{name}-{user}", "namespace": "default"},
            }
        ],
        "current-context": name,
        "preferences": {},
    }


def write_private(path: Path, text: str) -> None:
    """Write a file readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def generate_service_account_key(private: Path, public: Path) -> None:
    """An RSA key pair for service-account tokens, made with the ``openssl`` command."""
    try:
        subprocess.run(
            [
                "openssl",
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                str(private),
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)],
            check=True,
            capture_output=True,
        )
    except FileNotFoundError:
        raise RuntimeError("the openssl command is needed to generate the service-account key") from None
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"openssl failed: {exc.stderr.decode(errors='replace').strip()}") from None
    private.chmod(0o600)


def install_extender_identity(api: Api, path: Path, *, cluster: str, ca_pem: bytes) -> None:
    """Apply the extender's identity objects and write a kubeconfig with its token to `path`."""
    for obj in extender_identity():
        api.apply(obj, field_manager=FIELD_MANAGER)
    request_path, body = token_request()
    got = api.request("POST", request_path, body)
    doc = kubeconfig(
        name=cluster,
        server=api.server,
        ca_pem=ca_pem,
        token=got["status"]["token"],
        user=EXTENDER_SERVICE_ACCOUNT,
    )
    write_private(path, json.dumps(doc, indent=2) + "\n")
