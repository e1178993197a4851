"""The command lines of the dev cluster's host processes, as pure functions of one `Layout`.

Every component listens on 127.0.0.1 only. NeuroNetes' kube-scheduler (the
``neuronetes-scheduler`` profile) and the extender come in pairs (one pair per ``--schedulers``):
pair *i* is ``kube-scheduler-i`` beside ``extender-i`` on its own loopback port; with one pair
the names carry no number (``kube-scheduler``, ``extender``). The cluster's own scheduler (the
``default-scheduler`` profile) is the process ``default-scheduler``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from neuronetes.devcluster.tools import Toolchain
from neuronetes.profiles import KWOK_ANNOTATION

__all__ = [
    "NODE_IP",
    "POD_CIDR",
    "POD_TOKENS",
    "REAL_NODE_LABEL",
    "SERVICE_CIDR",
    "Layout",
    "StatePaths",
    "apiserver_argv",
    "controller_manager_argv",
    "default_scheduler_argv",
    "etcd_argv",
    "extender_argv",
    "feature_gates_flag",
    "kwok_argv",
    "pair_names",
    "scheduler_argv",
]

SERVICE_CIDR: Final = "10.0.0.0/24"
POD_CIDR: Final = "10.64.0.0/12"
NODE_IP: Final = "10.255.0.1"
"""The address kwok gives every simulated node (the chart runner serves their kubelet's logs)."""
POD_TOKENS: Final = "--enable-admission-plugins=ServiceAccount"
"""kube-apiserver's flag that gives pods their service-account token volumes (real nodes' pods)."""
REAL_NODE_LABEL: Final = "dev.neuronetes.io/real-node"
"""Label of the real nodes (a kubelet of their own runs their pods: the chart runner leaves them
alone) and, in chart mode, the key of their NoSchedule taint (`neuronetes.devcluster.realchart`)."""


def pair_names(index: int, count: int) -> tuple[str, str, str]:
    """(kube-scheduler's process name, the extender's, the suffix of their ports' keys)."""
    suffix = "" if count == 1 else f"-{index + 1}"
    return f"kube-scheduler{suffix}", f"extender{suffix}", suffix


def feature_gates_flag(gates: Mapping[str, bool]) -> list[str]:
    """``--feature-gates=A=true,B=false`` (nothing for no gates)."""
    if not gates:
        return []
    return [
        "--feature-gates=" + ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))
    ]


@dataclass(frozen=True)
class StatePaths:
    """The files of one cluster's state folder."""

    state_dir: Path

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig."""
        return self.state_dir / "kubeconfig"

    @property
    def extender_kubeconfig(self) -> Path:
        """The extender's kubeconfig (its ServiceAccount's token)."""
        return self.state_dir / "extender.kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        """kube-scheduler's kubeconfig (``system:kube-scheduler``)."""
        return self.state_dir / "scheduler.kubeconfig"

    @property
    def ca_file(self) -> Path:
        """The CA bundle that verifies the API server (its self-signed serving certificate)."""
        return self.pki / "apiserver" / "apiserver.crt"


@dataclass(frozen=True)
class Layout(StatePaths):
    """Where one cluster's files are and which ports its components listen on."""

    name: str
    ports: Mapping[str, int]
    tools: Toolchain

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd']}"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def default_scheduler_config(self) -> Path:
        return self.state_dir / "default-scheduler-config.json"

    def scheduler_config(self, index: int, count: int) -> Path:
        return self.state_dir / f"scheduler-config{pair_names(index, count)[2]}.json"

    @property
    def extender_settings(self) -> Path:
        return self.state_dir / "extender-settings.json"


def etcd_argv(at: Layout) -> list[str]:
    peer = f"http://127.0.0.1:{at.ports['etcd_peer']}"
    return [
        str(at.tools.etcd),
        f"--name={at.name}",
        f"--data-dir={at.state_dir / 'etcd'}",
        f"--listen-client-urls={at.etcd_url}",
        f"--advertise-client-urls={at.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={at.name}={peer}",
        "--unsafe-no-fsync",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver_argv(at: Layout, *, feature_gates: Mapping[str, bool], extra: Sequence[str]) -> list[str]:
    return [
        str(at.tools.kube_apiserver),
        f"--etcd-servers={at.etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={at.ports['apiserver']}",
        f"--cert-dir={at.pki / 'apiserver'}",
        f"--token-auth-file={at.pki / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        "--anonymous-auth=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={at.pki / 'sa.pub'}",
        f"--service-account-signing-key-file={at.pki / 'sa.key'}",
        # Endpoints may not hold loopback addresses: no reconciler for the `kubernetes` service.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        # kwok pods run nothing: no service-account token volumes, no wait for the default SA
        # (unless real nodes run the chart's pods: `realnodes.apiserver_args`).
        *(() if POD_TOKENS in extra else ("--disable-admission-plugins=ServiceAccount",)),
        "--profiling=false",
        "--v=1",
        *feature_gates_flag(feature_gates),
        *extra,
    ]


def controller_manager_argv(at: Layout) -> list[str]:
    kc = str(at.kubeconfig)
    return [
        str(at.tools.kube_controller_manager),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={at.ports['controller_manager']}",
        f"--cert-dir={at.pki / 'controller-manager'}",
        "--leader-elect=false",
        f"--service-account-private-key-file={at.pki / 'sa.key'}",
        f"--root-ca-file={at.ca_file}",
        "--use-service-account-credentials=false",
        f"--cluster-cidr={POD_CIDR}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--profiling=false",
        "--v=1",
    ]


def _kube_scheduler(at: Layout, config: Path, port_key: str, gates: Mapping[str, bool]) -> list[str]:
    kc = str(at.scheduler_kubeconfig)
    return [
        str(at.tools.kube_scheduler),
        f"--config={config}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={at.ports[port_key]}",
        f"--cert-dir={at.pki / port_key}",
        *feature_gates_flag(gates),
        "--v=2",
    ]


def default_scheduler_argv(at: Layout, *, feature_gates: Mapping[str, bool]) -> list[str]:
    """The cluster's own kube-scheduler (``default-scheduler`` profile only)."""
    return _kube_scheduler(at, at.default_scheduler_config, "default_scheduler", feature_gates)


def scheduler_argv(at: Layout, index: int, count: int, *, feature_gates: Mapping[str, bool]) -> list[str]:
    """NeuroNetes' kube-scheduler of pair `index` (``neuronetes-scheduler`` profile)."""
    suffix = pair_names(index, count)[2]
    return _kube_scheduler(at, at.scheduler_config(index, count), "scheduler" + suffix, feature_gates)


def extender_argv(at: Layout, index: int, count: int) -> list[str]:
    """``neuronetes extender serve`` on its pair's loopback port, as the extender's identity."""
    suffix = pair_names(index, count)[2]
    return [
        sys.executable,
        "-m",
        "neuronetes.cli",
        "extender",
        "serve",
        "--kubeconfig",
        str(at.extender_kubeconfig),
        "--host",
        "127.0.0.1",
        "--port",
        str(at.ports["extender" + suffix]),
        "--config",
        str(at.extender_settings),
    ]


def kwok_argv(at: Layout) -> list[str]:
    return [
        str(at.tools.kwok),
        f"--kubeconfig={at.kubeconfig}",
        f"--config={at.tools.kwok_stages}",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
        f"--server-address=127.0.0.1:{at.ports['kwok']}",
        f"--cidr={POD_CIDR}",
        f"--node-ip={NODE_IP}",
        "--node-lease-duration-seconds=40",
    ]
