"""Chart mode: NeuroNetes installed on the dev cluster by its Helm chart, its pods run as host processes.

`DevCluster.up(chart=ChartRelease())` starts the control plane without NeuroNetes processes of
its own (no extender pair, agent, operator or webhook; no CRDs, policies or identities applied
by the cluster), with kube-apiserver's ``cluster`` egress through the chart runner's proxy
(`neuronetes.devcluster.egress`), and the chart runner (`neuronetes.devcluster.chartrun`) as a
supervised process. Then it adds the system node — a simulated node without GPUs and without
kwok's taint, where the chart's Deployments land as on any cluster's CPU nodes — and
``helm install``s the chart from the checkout with ``hack/local-values.yaml`` (what a local
cluster needs: the agent tolerates the simulated GPU nodes' taint, pool pods too, short leader
election). With real nodes (`neuronetes.devcluster.realchart`) the agent DaemonSet's pods on them
are real containers, run by their kubelet (``hack/real-node-values.yaml`` on top). `ChartOps`
upgrades and uninstalls the release and waits until its pods run and its admission policies are
enforced (`neuronetes.devcluster.policyprobe`).
"""

from __future__ import annotations

import json
import os
import random
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from neuronetes.api.models import DEFAULT_MAX_REPLICAS
from neuronetes.devcluster import components as cmd
from neuronetes.devcluster.components import REAL_NODE_LABEL
from neuronetes.devcluster.egress import egress_selector_config
from neuronetes.devcluster.policyprobe import PolicyProbe, policy_names, probes_for, wait_enforced
from neuronetes.devcluster.state import ClusterError, RunState
from neuronetes.devcluster.supervisor import Supervisor
from neuronetes.devcluster.tools import REPO_ROOT
from neuronetes.profiles import node_manifest, profile

if TYPE_CHECKING:
    from neuronetes.devcluster.cluster import DevCluster

__all__ = [
    "CHART_DIR",
    "LOCAL_VALUES",
    "RUNNER",
    "SYSTEM_NODE",
    "ChartOps",
    "ChartRelease",
    "HelmError",
    "chart_extenders",
    "egress_flags",
    "pick_loopback_net",
    "runner_argv",
    "start_runner",
    "system_node_manifest",
]

CHART_DIR: Final = REPO_ROOT / "helm" / "neuronetes"
LOCAL_VALUES: Final = REPO_ROOT / "hack" / "local-values.yaml"
RUNNER: Final = "chart-runner"
SYSTEM_NODE: Final = "system-0"
RELEASE_LABEL: Final = "app.kubernetes.io/instance"
CHART_LABEL: Final = "app.kubernetes.io/name=neuronetes"
"""The runner runs the pods of every release of the chart (any release name works)."""
REAL_NODES: Final = f"/api/v1/nodes?labelSelector={REAL_NODE_LABEL}"


class HelmError(ClusterError):
    """helm failed; the message carries its output."""


@dataclass(frozen=True, slots=True)
class ChartRelease:
    """A release of the chart: where the chart is and the values it is installed with."""

    name: str = "neuronetes"
    namespace: str = "neuronetes-system"
    chart: Path = CHART_DIR
    values: tuple[Path, ...] = (LOCAL_VALUES,)
    set_values: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "release": self.name,
            "namespace": self.namespace,
            "chart": str(self.chart),
            "values": [str(v) for v in self.values],
            "set": list(self.set_values),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ChartRelease:
        return cls(
            name=str(doc["release"]),
            namespace=str(doc["namespace"]),
            chart=Path(doc["chart"]),
            values=tuple(Path(v) for v in doc.get("values") or ()),
            set_values=tuple(str(s) for s in doc.get("set") or ()),
        )

    @property
    def selector(self) -> str:
        return f"{RELEASE_LABEL}={self.name}"


# ---- start-up pieces (called by `neuronetes.devcluster.startup`) -------------------------------


def _runner_root(at: cmd.StatePaths) -> Path:
    return at.state_dir / "chart"


def _egress_socket(at: cmd.StatePaths) -> Path:
    return at.state_dir / "egress.sock"


def egress_flags(at: cmd.StatePaths) -> list[str]:
    """Write kube-apiserver's egress configuration; the flag that makes it read it."""
    path = at.state_dir / "egress-selector.json"
    path.write_text(json.dumps(egress_selector_config(_egress_socket(at)), indent=2) + "\n")
    return [f"--egress-selector-config-file={path}"]


def _used_loopback_nets() -> set[int]:
    """Second octets of 127.x addresses something on this host listens on (/proc/net/tcp)."""
    used: set[int] = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return used
    for line in lines:
        local = line.split()[1].split(":")[0]
        octets = bytes.fromhex(local)[::-1]  # little-endian on x86 and arm
        if octets[0] == 127:
            used.add(octets[1])
    return used


def pick_loopback_net() -> int:
    """A /16 of 127.0.0.0/8 no one listens in (the pods' addresses, `podplan.pod_address`)."""
    free = sorted(set(range(2, 255)) - _used_loopback_nets())
    if not free:
        raise ClusterError("no free 127.N.0.0/16 loopback network for the chart's pods")
    return random.choice(free)


def runner_argv(at: cmd.Layout, state: RunState) -> list[str]:
    assert state.chart is not None
    return [
        sys.executable,
        "-m",
        "neuronetes.devcluster.chartrun",
        f"--server={at.server}",
        f"--token-file={at.state_dir / 'token'}",
        f"--ca-file={at.ca_file}",
        f"--root={_runner_root(at)}",
        f"--selector={CHART_LABEL}",
        f"--kube-scheduler={at.tools.kube_scheduler}",
        f"--egress-socket={_egress_socket(at)}",
        f"--loopback-net={state.chart['net']}",
    ]


def start_runner(sup: Supervisor, state: RunState, at: cmd.Layout) -> None:
    sup.spawn(state, RUNNER, runner_argv(at, state))


def system_node_manifest() -> dict[str, Any]:
    """The node the chart's Deployments land on: kwok runs it, no GPUs, no taint."""
    spec = profile("cpu-only").node_spec(SYSTEM_NODE, zone="", region="", spot=False)
    node = node_manifest(spec)
    node["spec"].pop("taints", None)
    node["metadata"]["labels"]["node-role.kubernetes.io/system"] = ""
    return node


# ---- the release ---------------------------------------------------------------------------------


class ChartOps:
    """helm against one running chart-mode cluster, and what its runner reports."""

    def __init__(self, dev: DevCluster) -> None:
        self.dev = dev
        state = dev.store.running()
        if state.chart is None:
            raise ClusterError(f"cluster {dev.name!r} does not run in chart mode")
        self.release = ChartRelease.from_json(state.chart)
        self.runner_root = _runner_root(dev.paths)

    def helm(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """The pinned helm with this cluster's admin kubeconfig (its caches in the state folder)."""
        home = self.dev.state_dir / "helm"
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        command = [str(self.dev.tools.helm), f"--kubeconfig={self.dev.kubeconfig}", *args]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise HelmError(f"helm {' '.join(args[:2])} failed: {(proc.stderr or proc.stdout).strip()}")
        return proc

    def _values_args(self) -> list[str]:
        args: list[str] = []
        for v in self.release.values:
            args += ["-f", str(v)]
        for s in self.release.set_values:
            args += ["--set", s]
        return args

    def prepare(self) -> None:
        """Add the system node, where the chart's Deployments land."""
        self.dev.api().request("POST", "/api/v1/nodes", system_node_manifest())

    def install(self, *, timeout_s: float = 180.0) -> None:
        """``helm install --wait``, then wait until every pod runs and the chart's admission
        policies are enforced (`wait_policies`)."""
        r = self.release
        self.dev.log(f"helm install {r.name} {r.chart} -n {r.namespace}")
        self.helm(
            "install", r.name, str(r.chart), "-n", r.namespace, "--create-namespace",
            "--wait", f"--timeout={int(timeout_s)}s", *self._values_args(),
        )  # fmt: skip
        self.wait_running(timeout_s=timeout_s)
        self.wait_policies(timeout_s=timeout_s)

    def upgrade(self, *values_args: str, timeout_s: float = 180.0) -> None:
        """``helm upgrade`` with the release's values and `values_args` (helm's ``--set``,
        ``--set-json``, ``-f`` … flags) on top; wait until it runs."""
        r = self.release
        self.helm(
            "upgrade", r.name, str(r.chart), "-n", r.namespace, "--wait", f"--timeout={int(timeout_s)}s",
            *self._values_args(), *values_args,
        )  # fmt: skip
        self.wait_running(timeout_s=timeout_s)
        self.wait_policies(timeout_s=timeout_s)

    def policy_probes(self) -> list[PolicyProbe]:
        """The probes of the chart's admission policies, as this release installed them (its agent's
        user, its ``agentPools.maxReplicas``)."""
        r = self.release
        rbac = msgspec.yaml.decode((r.chart / "files" / "rbac.yaml").read_bytes())
        agent = rbac["components"]["agent"]["serviceAccount"]
        got = self.helm("get", "values", r.name, "-n", r.namespace, "--all", "-o", "json")
        values = json.loads(got.stdout)
        return probes_for(
            policy_names(r.chart / "files" / "policies"),
            agent_user=f"system:serviceaccount:{r.namespace}:{agent}",
            max_replicas=int((values.get("agentPools") or {}).get("maxReplicas", DEFAULT_MAX_REPLICAS)),
        )

    def wait_policies(self, *, timeout_s: float = 60.0) -> float:
        """Until the API server enforces every admission policy of the chart: helm's ``--wait``
        does not wait for policies, and the API server loads them a while after they are created
        (`neuronetes.devcluster.policyprobe`). Returns the seconds waited."""
        return wait_enforced(self.dev.kubectl, self.policy_probes(), timeout_s=timeout_s, log=self.dev.log)

    def uninstall(self, *, timeout_s: float = 120.0) -> None:
        r = self.release
        self.helm("uninstall", r.name, "-n", r.namespace, "--wait", f"--timeout={int(timeout_s)}s")

    def runner_state(self) -> dict[str, Any]:
        """``runner.json``: the pods the runner runs, their processes, the agent fleet, errors."""
        return runner_state(self.runner_root)

    def _not_running(self) -> list[str]:
        """What keeps the release from running: pods not run yet, dead processes, unready extenders."""
        pods = self.dev.api().request(
            "GET", f"/api/v1/namespaces/{self.release.namespace}/pods?labelSelector={self.release.selector}"
        )["items"]
        state = self.runner_state()
        real = {n["metadata"]["name"] for n in self.dev.api().request("GET", REAL_NODES)["items"]}
        missing = []
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") or pod.get("status", {}).get("phase") != "Running":
                missing.append(f"pod {meta['name']} not Running")
                continue
            if pod["spec"].get("nodeName") in real:  # its kubelet runs it: its containers Ready
                conds = {c["type"]: c["status"] for c in pod["status"].get("conditions") or ()}
                if conds.get("Ready") != "True":
                    missing.append(f"pod {meta['name']} not Ready on real node {pod['spec']['nodeName']}")
                continue
            run = state["pods"].get(meta["uid"])
            if run is None:
                missing.append(f"pod {meta['name']}: {state['errors'].get(meta['uid'], 'not started')}")
                continue
            missing += [f"{meta['name']}/{n}" for n, c in run["containers"].items() if c["pid"] is None]
            missing += [f"{meta['name']}/{n}: {why}" for n, why in _unready(run).items()]
            if run["agentOf"] and (state["fleet"] is None or state["fleet"]["pid"] is None):
                missing.append(f"{meta['name']}: agent fleet")
        return missing

    def wait_running(self, *, timeout_s: float = 120.0) -> None:
        """Until every pod of the release runs its processes and the extenders are ready."""
        deadline = time.monotonic() + timeout_s
        while True:
            missing = self._not_running()
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the release's pods are not running after {timeout_s:.0f}s: {', '.join(missing[:6])}\n"
                    + self.dev.tail(RUNNER)
                )
            time.sleep(0.5)

    def leftovers(self) -> list[str]:
        """Every object with the release's label, namespaced or not (CRDs excepted), as kind/name."""
        out = self.dev.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
        kinds = ",".join(
            k
            for k in out
            if k not in ("customresourcedefinitions.apiextensions.k8s.io", "events", "events.events.k8s.io")
        )
        got = self.dev.kubectl(
            "get", kinds, "-A", "-l", self.release.selector, "-o", "name", "--ignore-not-found"
        ).stdout.split()
        return got


def runner_state(root: Path) -> dict[str, Any]:
    """The runner's ``runner.json`` under `root` (empty lists before it wrote one)."""
    try:
        doc: dict[str, Any] = json.loads((root / "runner.json").read_text())
    except (FileNotFoundError, ValueError):
        return {"pods": {}, "fleet": None, "errors": {}}
    return doc


def _extender_urls(run: dict[str, Any]) -> dict[str, str]:
    """Per running extender container of the pod `run` (``neuronetes extender serve``), its URL."""
    out: dict[str, str] = {}
    for name, ctr in run["containers"].items():
        argv = ctr["argv"]
        if "extender" not in argv or "serve" not in argv or ctr["pid"] is None:
            continue
        opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        out[name] = f"http://{opts.get('host', run['address'])}:{opts.get('port', '8888')}"
    return out


def chart_extenders(at: cmd.StatePaths) -> list[str]:
    """The extenders the chart's gpu-scheduler pods run beside their kube-scheduler, as
    ``URL (pod NAME)``, from the runner's ``runner.json`` (`neuronetes dev cluster status` in chart
    mode: the cluster itself runs no extender)."""
    runs = sorted(runner_state(_runner_root(at))["pods"].values(), key=lambda run: str(run.get("name", "")))
    return [f"{url} (pod {run.get('name', '?')})" for run in runs for url in _extender_urls(run).values()]


def _unready(run: dict[str, Any]) -> dict[str, str]:
    """Extender containers of `run` whose ``/readyz`` does not answer 200 yet."""
    out: dict[str, str] = {}
    for name, base in _extender_urls(run).items():
        url = f"{base}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    continue
        except (OSError, ssl.SSLError) as exc:
            out[name] = f"{url}: {exc}"
            continue
        out[name] = f"{url}: not ready"
    return out
