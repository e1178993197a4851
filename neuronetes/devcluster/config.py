"""Configuration documents of the dev cluster: kubeconfig, scheduler configuration, credentials."""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from neuronetes import mig
from neuronetes.contracts import RESOURCE_GPU, RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY, SCHEDULER_NAME
from neuronetes.devcluster.profiles import mig_resource_name

__all__ = [
    "ADMIN_GROUP",
    "ADMIN_USER",
    "EXTENDER_URL_ENV",
    "ExtenderConfig",
    "default_managed_resources",
    "generate_service_account_key",
    "kubeconfig",
    "scheduler_config",
    "write_private",
]

ADMIN_USER: Final = "neuronetes-admin"
ADMIN_GROUP: Final = "system:masters"
EXTENDER_URL_ENV: Final = "NEURONETES_EXTENDER_URL"


def default_managed_resources() -> tuple[str, ...]:
    """Every NeuroNetes extended resource: kube-scheduler calls the extender only for pods asking
    for one of them, and still checks node totals itself (``ignoredByScheduler: false``)."""
    names = [RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_COMPUTE]
    for catalog in mig.catalogs():
        for name in catalog.names:
            resource = mig_resource_name(name)
            if resource not in names:
                names.append(resource)
    return tuple(names)


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """kube-scheduler's extender entry for the NeuroNetes extender (fails closed: not ignorable)."""

    url: str
    filter_verb: str | None = "filter"
    prioritize_verb: str | None = "prioritize"
    bind_verb: str | None = "bind"
    preempt_verb: str | None = "preempt"
    weight: int = 1
    http_timeout_s: float = 5.0
    bind_http_timeout_s: float = 130.0
    """The bind entry's timeout: a gang member's bind waits at the barrier (up to the extender's
    ``bindWaitSeconds``, 110 s by default) until every member has reached bind."""
    node_cache_capable: bool = True
    ignorable: bool = False
    managed_resources: tuple[str, ...] = field(default_factory=default_managed_resources)

    @classmethod
    def from_url(cls, url: str | None) -> ExtenderConfig | None:
        """An extender at `url` with the default verbs; None for no (or an empty) URL."""
        return cls(url=url.rstrip("/")) if url else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ExtenderConfig | None:
        """The extender named by ``$NEURONETES_EXTENDER_URL`` (None when unset or empty)."""
        return cls.from_url((os.environ if env is None else env).get(EXTENDER_URL_ENV))

    def _entry(self, http_timeout_s: float, *, ignorable: bool) -> dict[str, Any]:
        return {
            "urlPrefix": self.url,
            "enableHTTPS": self.url.startswith("https://"),
            "httpTimeout": f"{http_timeout_s:g}s",
            "nodeCacheCapable": self.node_cache_capable,
            "ignorable": ignorable,
        }

    def to_json(self) -> dict[str, Any]:
        doc = self._entry(self.http_timeout_s, ignorable=self.ignorable)
        doc["managedResources"] = [{"name": r, "ignoredByScheduler": False} for r in self.managed_resources]
        if self.filter_verb:
            doc["filterVerb"] = self.filter_verb
        if self.prioritize_verb:
            doc["prioritizeVerb"] = self.prioritize_verb
            doc["weight"] = self.weight
        if self.preempt_verb:
            doc["preemptVerb"] = self.preempt_verb
        return doc

    def entries(self) -> list[dict[str, Any]]:
        """kube-scheduler's ``extenders`` list: the decision verbs, and bind on its own entry.

        Bind gets a second entry (same URL) so its long timeout (the gang barrier) does not
        become the filter's: a hung filter must fail fast. That entry manages no resources, so
        it binds every pod this kube-scheduler schedules (pods without GPUs just get bound).
        """
        out = [self.to_json()]
        if self.bind_verb:
            out.append(self._entry(self.bind_http_timeout_s, ignorable=False) | {"bindVerb": self.bind_verb})
        return out


def scheduler_config(kubeconfig_path: Path, extender: ExtenderConfig | None) -> dict[str, Any]:
    """KubeSchedulerConfiguration with the stock profile and the ``neuronetes-scheduler`` one.

    The NeuroNetes profile scores every feasible node (``percentageOfNodesToScore: 100``: the
    engine wants the global view) and packs with NodeResourcesFit's MostAllocated strategy, so
    kube-scheduler's own scores do not undo the extender's packing (DESIGN.md §3).
    """
    fit_args = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "NodeResourcesFitArgs",
        "scoringStrategy": {
            "type": "MostAllocated",
            "resources": [
                {"name": "cpu", "weight": 1},
                {"name": "memory", "weight": 1},
                {"name": RESOURCE_GPU, "weight": 3},
                {"name": RESOURCE_GPU_MEMORY, "weight": 2},
            ],
        },
    }
    doc: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_path), "qps": 200, "burst": 400},
        "leaderElection": {"leaderElect": False},
        "percentageOfNodesToScore": 100,
        "profiles": [
            {"schedulerName": "default-scheduler"},
            {
                "schedulerName": SCHEDULER_NAME,
                "percentageOfNodesToScore": 100,
                "pluginConfig": [{"name": "NodeResourcesFit", "args": fit_args}],
            },
        ],
    }
    if extender is not None:
        doc["extenders"] = extender.entries()
    return doc


def kubeconfig(*, name: str, server: str, ca_pem: bytes, token: str) -> dict[str, Any]:
    """An admin kubeconfig (bearer token of a ``system:masters`` user; CA inline)."""
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
        "users": [{"name": f"{name}-{ADMIN_USER}", "user": {"token": token}}],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": name, "user": f"{name}-{ADMIN_USER}", "namespace": "default"},
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
