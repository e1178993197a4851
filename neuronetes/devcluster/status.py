"""How a running dev cluster is doing: each process's health, and which kube-scheduler leads."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from neuronetes.devcluster import procs
from neuronetes.devcluster.api import http_ok, insecure_context
from neuronetes.devcluster.realnodes import is_real_node_process
from neuronetes.devcluster.state import RunState

__all__ = [
    "ClusterStatus",
    "ComponentStatus",
    "Probe",
    "component_statuses",
    "is_leader",
    "leader_index",
    "probes",
]

Probe = Callable[[], tuple[bool, str]]
_LEADER: Final = re.compile(r'^leader_election_master_status\{name="kube-scheduler"\} 1$', re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    name: str
    pid: int
    running: bool
    healthy: bool | None
    """None: the component has no health endpoint we probe."""
    detail: str = ""
    leader: bool | None = None
    """kube-scheduler with leader election: whether it holds the lease (None: no election)."""


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    name: str
    state_dir: Path
    kubeconfig: Path | None
    server: str | None
    versions: dict[str, str]
    components: tuple[ComponentStatus, ...]
    api_healthy: bool
    api_version: str | None
    nodes: int | None
    extender_urls: tuple[str, ...]
    """The extender each kube-scheduler calls, in pair order (empty: none); chart mode: the
    extender each of the chart's gpu-scheduler pods runs, ``URL (pod NAME)``."""
    chart_release: str | None = None
    """Chart mode: the Helm release whose pods run NeuroNetes (None: the cluster runs it)."""

    @property
    def up(self) -> bool:
        return bool(self.components) and all(c.running for c in self.components) and self.api_healthy


def probes(state: RunState, token: str) -> dict[str, Probe]:
    """A health probe per process name of `state` (extenders: ``/readyz``, a synced cache)."""
    insecure = insecure_context()
    ports = state.ports

    def https(port_key: str) -> Probe:
        return lambda: http_ok(f"https://127.0.0.1:{ports[port_key]}/healthz", context=insecure)

    out: dict[str, Probe] = {
        "etcd": lambda: http_ok(f"http://127.0.0.1:{ports['etcd']}/health"),
        "kube-apiserver": lambda: http_ok(
            f"https://127.0.0.1:{ports['apiserver']}/readyz", context=insecure, token=token
        ),
        "kube-controller-manager": https("controller_manager"),
        "default-scheduler": https("default_scheduler"),
        "kwok": lambda: http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"),
    }
    for scheduler, extender, suffix in state.pairs():
        out[scheduler] = https("scheduler" + suffix)
        if state.run_extender:
            out[extender] = _plain(f"http://127.0.0.1:{ports['extender' + suffix]}/readyz")
    for key, port in ports.items():
        if key.startswith("kubelet_healthz-"):  # a real node: its kubelet's /healthz
            out["node-" + key.removeprefix("kubelet_healthz-")] = _plain(f"http://127.0.0.1:{port}/healthz")
    return out


def _plain(url: str) -> Probe:
    return lambda: http_ok(url)


def is_leader(scheduler_port: int, token: str) -> bool:
    """Whether the kube-scheduler on `scheduler_port` holds the lease (its /metrics says so)."""
    req = urllib.request.Request(f"https://127.0.0.1:{scheduler_port}/metrics")
    req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2, context=insecure_context()) as resp:
            text = resp.read().decode(errors="replace")
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return bool(_LEADER.search(text))


def component_statuses(state: RunState, token: str) -> list[ComponentStatus]:
    """Each recorded process: running, healthy, and (kube-scheduler with election) leading."""
    probe = probes(state, token)
    electing = state.schedulers > 1
    fixed = ("etcd", "kube-apiserver", "kube-controller-manager", "default-scheduler")
    # Chart mode: the chart runner, healthy while it runs (the pods' own state is its runner.json).
    order = [*fixed, *(n for pair in state.pairs() for n in pair[:2]), "kwok", "chart-runner"]
    order += sorted(n for n in state.processes if is_real_node_process(n))
    out: list[ComponentStatus] = []
    for name in order:
        rec = state.processes.get(name)
        if rec is None:
            continue
        running = procs.is_running(rec)
        check = probe.get(name, lambda: (True, "running"))
        healthy, detail = check() if running else (False, "not running")
        leader: bool | None = None
        if electing and name.startswith("kube-scheduler"):
            leader = running and is_leader(
                state.ports["scheduler" + name.removeprefix("kube-scheduler")], token
            )
        out.append(ComponentStatus(name, rec.pid, running, healthy, detail[:200], leader))
    return out


def leader_index(state: RunState, token: str) -> int | None:
    """The pair whose kube-scheduler holds the lease now (None: none does)."""
    for i, (name, _, sfx) in enumerate(state.pairs()):
        if procs.is_running(state.processes[name]) and is_leader(state.ports["scheduler" + sfx], token):
            return i
    return None
