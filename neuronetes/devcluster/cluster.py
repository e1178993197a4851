"""A local Kubernetes control plane on loopback with simulated GPU nodes, and NeuroNetes beside it.

etcd, kube-apiserver, kube-controller-manager (optional), the cluster's kube-scheduler (process
``default-scheduler``, the stock profile), NeuroNetes' kube-scheduler (the ``neuronetes-scheduler``
profile) and kwok (running the nodes annotated ``kwok.x-k8s.io/node=fake``) run as host processes,
each in its own process group, and so does the NeuroNetes extender when the cluster runs its own:
one extender beside each NeuroNetes kube-scheduler, under its own ServiceAccount
(`neuronetes.devcluster.access`), configured by the documents of `neuronetes.devcluster.config`.
With two or more schedulers, kube-scheduler's leader election picks the active pair; the
standby's extender keeps its watches (a warm cache) and takes over with it.

Everything a cluster owns lives in its state folder, ``~/.cache/neuronetes/clusters/<name>/``:
``state.json`` (ports, process records), ``kubeconfig`` (admin), ``scheduler.kubeconfig``,
``extender.kubeconfig``, the rendered configurations, ``logs/<component>.log``, credentials and
etcd's data.

A cluster is started fresh by `DevCluster.up` (no state is kept from an earlier run) and
`DevCluster.down` stops every process it started; both may be called from any process (the CLI,
a pytest session) and `down` is idempotent.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from neuronetes.devcluster import components as cmd
from neuronetes.devcluster import procs
from neuronetes.devcluster.api import Api, ApiError, KubectlError, free_ports, run_kubectl
from neuronetes.devcluster.chartmode import ChartOps, ChartRelease, chart_extenders, pick_loopback_net
from neuronetes.devcluster.config import ExtenderConfig
from neuronetes.devcluster.nodes import create_nodes
from neuronetes.devcluster.realnodes import RealNodes, missing_requirements, node_names, remove_cgroups
from neuronetes.devcluster.realnodes import apiserver_args as real_apiserver_args
from neuronetes.devcluster.startup import Startup, apply_crds, apply_manifests
from neuronetes.devcluster.state import ClusterError, RunState, StateStore, check_name
from neuronetes.devcluster.status import ClusterStatus, component_statuses, leader_index, probes
from neuronetes.devcluster.supervisor import Supervisor
from neuronetes.devcluster.tools import (
    REPO_ROOT,
    BuildError,
    Toolchain,
    build,
    cache_root,
    want_controller_manager,
)
from neuronetes.model import NodeSpec
from neuronetes.profiles import REGION, ZONES, parse_node_counts, profile

__all__ = ["ApiError", "ClusterError", "DevCluster", "KubectlError", "check_name", "parse_node_counts"]

POLICIES_DIR: Final = REPO_ROOT / "manifests" / "policies"


Log = Callable[[str], None]


class DevCluster:
    """One named local cluster. Cheap to construct: it only points at the state folder."""

    def __init__(
        self,
        name: str = "dev",
        *,
        state_root: Path | None = None,
        tools: Toolchain | None = None,
        log: Log | None = None,
    ) -> None:
        check_name(name)
        self.name = name
        self.state_dir = (state_root or cache_root() / "clusters") / name
        self.tools = tools or Toolchain.pinned()
        self.log: Log = log or (lambda _: None)
        self.paths = cmd.StatePaths(self.state_dir)
        self.store = StateStore(name, self.state_dir)
        self.sup = Supervisor(self.store)
        self._prefix_next: dict[str, int] = {}

    # ---- paths ---------------------------------------------------------------------------------
    def _layout(self, state: RunState) -> cmd.Layout:
        return cmd.Layout(self.state_dir, self.name, state.ports, self.tools)

    @property
    def kubeconfig(self) -> Path:
        return self.paths.kubeconfig

    @property
    def extender_kubeconfig(self) -> Path:
        """The extender's credentials (its ServiceAccount's token), written when the cluster is up."""
        return self.paths.extender_kubeconfig

    @property
    def ca_file(self) -> Path:
        return self.paths.ca_file

    @property
    def log_dir(self) -> Path:
        return self.sup.log_dir

    def _token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    def api(self) -> Api:
        """A small JSON client for the running cluster's API server (admin credentials)."""
        state = self.store.running()
        return Api(self._layout(state).server, self._token(), self.ca_file)

    # ---- lifecycle -----------------------------------------------------------------------------
    def is_up(self) -> bool:
        state = self.store.load()
        return state is not None and all(procs.is_running(r) for r in state.processes.values())

    def up(
        self,
        *,
        nodes: Sequence[tuple[str, int]] = (),
        extender: ExtenderConfig | None = None,
        run_extender: bool = False,
        run_agent: bool = False,
        run_operator: bool = False,
        schedulers: int = 1,
        feature_gates: Mapping[str, bool] | None = None,
        extender_overrides: Mapping[str, Any] | None = None,
        controller_manager: bool | None = None,
        crds_dir: Path | None = REPO_ROOT / "crds",
        policies_dir: Path | None = None,
        auto_build: bool = False,
        apiserver_args: Sequence[str] = (),
        timeout_s: float = 90.0,
        chart: ChartRelease | None = None,
        install_chart: bool = True,
        real_nodes: int = 0,
    ) -> float:
        """Start the cluster (fresh state); return the seconds it took.

        `extender` points kube-scheduler at an external extender; `run_extender` starts one
        beside each kube-scheduler instead (``neuronetes extender serve`` as the extender's
        ServiceAccount, settings from `neuronetes.devcluster.config.extender_settings` with
        `extender_overrides`). `schedulers` > 1 runs that many kube-scheduler (+ extender)
        pairs with leader election. `run_agent` / `run_operator` start the node agent in fleet
        mode / the operator and two webhook replicas (`neuronetes.devcluster.addons`).
        `feature_gates` go to kube-apiserver and kube-scheduler.
        `policies_dir`: ValidatingAdmissionPolicy manifests to apply (``manifests/policies``).
        `chart`: chart mode (`neuronetes.devcluster.chartmode`): NeuroNetes — CRDs, policies,
        identities and every component — comes from ``helm install`` of this release, its pods
        run by the chart runner; the other NeuroNetes arguments must be left at their defaults.
        `install_chart` False: chart mode without the release (``helm install`` it yourself).
        `real_nodes`: that many real nodes (`neuronetes.devcluster.realnodes`; chart mode: `realchart`).

        Raises `ClusterError` when it is already running (`down` it first) or fails to start
        (everything started is stopped again), `BuildError` when binaries are missing and
        `auto_build` is off or the build fails, `ValueError` for a shape that makes no sense.
        """
        if chart is not None:
            if run_extender or run_agent or run_operator or extender is not None or schedulers != 1:
                raise ValueError("chart mode: NeuroNetes comes from the chart, not from the cluster's own")
            crds_dir, policies_dir, schedulers = None, None, 0
        elif schedulers < 1:
            raise ValueError("schedulers: at least 1")
        if run_extender and extender is not None:
            raise ValueError("either an external extender or one run by the cluster, not both")
        t0 = time.monotonic()
        if controller_manager is None:
            controller_manager = want_controller_manager()
        with self.store.locked():
            old = self.store.load()
            if old is not None:
                if old.processes and all(procs.is_running(r) for r in old.processes.values()):
                    raise ClusterError(f"cluster {self.name!r} is already running; `down` it first")
                self.sup.stop(old)
            missing = self.tools.missing(controller_manager=controller_manager)
            missing += [p for p in self.tools.node_binaries() if real_nodes and not p.exists()]
            if chart is not None and not self.tools.helm.exists():
                missing.append(self.tools.helm)
            if missing:
                if not auto_build:
                    raise BuildError(
                        "control-plane binaries missing (run hack/build-control-plane.sh): "
                        + ", ".join(map(str, missing))
                    )
                self.log("building the control plane (hack/build-control-plane.sh)")
                self.tools = build()
            if real_nodes and (why := missing_requirements(self.tools, chart=chart is not None)):
                raise ClusterError("real nodes cannot run here: " + "; ".join(why))
            self.store.wipe()
            keys = ["etcd", "etcd_peer", "apiserver", "controller_manager", "default_scheduler", "kwok"]
            for _, _, sfx in (cmd.pair_names(i, schedulers) for i in range(schedulers)):
                keys += ["scheduler" + sfx] + (["extender" + sfx] if run_extender else [])
            keys += (["agent_metrics"] if run_agent else []) + (["webhook"] if run_operator else [])
            state = RunState(
                name=self.name,
                ports=dict(zip(keys, free_ports(len(keys)), strict=True)),
                versions={
                    "kubernetes": self.tools.versions.kubernetes,
                    "etcd": self.tools.versions.etcd,
                    "kwok": self.tools.versions.kwok,
                },
                extender=extender.to_json() if extender else None,
                run_extender=run_extender,
                run_agent=run_agent,
                run_operator=run_operator,
                schedulers=schedulers,
                feature_gates=dict(feature_gates or {}),
                controller_manager=controller_manager,
                started_at=time.time(),
                chart=None if chart is None else {**chart.to_json(), "net": pick_loopback_net()},
            )
            node_args = real_apiserver_args(self.paths.pki, chart=chart is not None) if real_nodes else []
            startup = Startup(self.sup, self._layout(state), state, self.log, self.kubectl)
            try:
                startup.run(
                    extender,
                    dict(extender_overrides or {}),
                    crds_dir,
                    policies_dir,
                    [*apiserver_args, *node_args],
                    time.monotonic() + timeout_s,
                )
            except BaseException:
                self.sup.stop(state)
                self.store.retire(state)
                raise
        try:
            if chart is not None:
                ChartOps(self).prepare()
            if real_nodes:  # before the chart: its agent DaemonSet lands on them at install
                RealNodes(self).start(
                    node_names(real_nodes), timeout_s=max(120.0, timeout_s), chart=chart is not None
                )
            if chart is not None and install_chart:
                ChartOps(self).install(timeout_s=max(60.0, timeout_s))
            for prof, count in nodes:
                if count:
                    self.add_nodes(prof, count, prof)
        except BaseException:
            self.down()
            raise
        return time.monotonic() - t0

    def tail(self, name: str, lines: int = 25) -> str:
        """The last `lines` lines of a component's log."""
        return self.sup.tail(name, lines)

    def set_extender(self, extender: ExtenderConfig | None, *, timeout_s: float = 30.0) -> None:
        """Restart kube-scheduler with `extender` (None: no extender) on the running cluster.

        Only for a cluster with one kube-scheduler that does not run its own extender.
        """
        with self.store.locked():
            state = self.store.running()
            if state.schedulers != 1 or state.run_extender:
                raise ClusterError(
                    f"cluster {self.name!r} runs its own extender(s); set_extender is for one kube-scheduler"
                )
            procs.stop_all([state.processes["kube-scheduler"]])
            self.sup.reap()
            state.extender = extender.to_json() if extender else None
            Startup(self.sup, self._layout(state), state, self.log, self.kubectl).spawn_pairs(extender)
            self.sup.wait(
                state,
                "kube-scheduler",
                probes(state, self._token())["kube-scheduler"],
                time.monotonic() + timeout_s,
            )

    def apply_manifests(self, folder: Path) -> list[Path]:
        """Server-side apply every YAML file in `folder` (not its subfolders)."""
        return apply_manifests(self.kubectl, folder, self.log)

    def apply_crds(self, crds_dir: Path, *, timeout_s: float = 60.0) -> list[Path]:
        """Server-side apply every YAML file in `crds_dir` and wait until the CRDs are Established."""
        return apply_crds(self.kubectl, crds_dir, self.log, timeout_s=timeout_s)

    def down(self, *, grace_s: float = 10.0) -> list[str]:
        """Stop every process this cluster started (idempotent); return the components stopped.

        The state folder (logs, kubeconfig) stays until the next `up`.
        """
        if not self.store.file.exists():
            return []  # never started, or already down (and no lock file is left behind)
        with self.store.locked():
            state = self.store.load()
            if state is None:
                return []
            running = [n for n, r in state.processes.items() if procs.is_running(r)]
            self.sup.stop(state, grace_s=grace_s)
            remove_cgroups(self.name)  # real nodes' (their processes are gone now)
            self.store.retire(state)
            return running

    def kill(self, *names: str) -> None:
        """SIGKILL the named processes (a crash, for failover tests); `down` still cleans up."""
        self.sup.kill(self.store.running(), names)

    def restart(self, name: str, *, timeout_s: float = 60.0) -> None:
        """Start a process again with its recorded command line (SIGTERM first if it still runs)
        and wait until it is healthy: a crashed extender or kube-scheduler rejoins."""
        with self.store.locked():
            state = self.store.running()
            self.sup.restart(state, name, probes(state, self._token())[name], time.monotonic() + timeout_s)

    def purge(self) -> None:
        """`down`, then delete the state folder (logs included) and the lock file."""
        self.down()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.store.lock_file.unlink(missing_ok=True)

    def processes(self) -> list[procs.ProcessRecord]:
        """Records of the processes of the current run and of the last stopped one."""
        return self.store.records()

    def leftover_processes(self) -> list[int]:
        """Live processes in the process groups of this cluster's last run (empty after `down`)."""
        self.sup.reap()
        return procs.survivors(self.processes())

    # ---- status --------------------------------------------------------------------------------
    def status(self) -> ClusterStatus:
        state = self.store.load()
        if state is None:
            return ClusterStatus(self.name, self.state_dir, None, None, {}, (), False, None, None, ())
        comps = component_statuses(state, self._token())
        api_ok = any(c.name == "kube-apiserver" and c.healthy for c in comps)
        version: str | None = None
        n_nodes: int | None = None
        if api_ok:
            with contextlib.suppress(ApiError, OSError, ValueError):
                api = self.api()
                version = str(api.request("GET", "/version")["gitVersion"])
                n_nodes = len(api.request("GET", "/api/v1/nodes")["items"])
        return ClusterStatus(
            name=self.name,
            state_dir=self.state_dir,
            kubeconfig=self.kubeconfig if self.kubeconfig.exists() else None,
            server=self._layout(state).server,
            versions=state.versions,
            components=tuple(comps),
            api_healthy=api_ok,
            api_version=version,
            nodes=n_nodes,
            extender_urls=tuple(chart_extenders(self.paths) if state.chart else state.extender_urls()),
            chart_release=str(state.chart["release"]) if state.chart else None,
        )

    def leader(self) -> int | None:
        """The index of the kube-scheduler pair holding the lease (None: none holds it now)."""
        return leader_index(self.store.running(), self._token())

    def pair(self, index: int) -> tuple[str, str]:
        """(kube-scheduler's, the extender's) process names of pair `index`."""
        state = self.store.running()
        scheduler, extender, _ = state.pairs()[index]
        return scheduler, extender

    # ---- clients -------------------------------------------------------------------------------
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this cluster; with `check`, fail with its stderr."""
        return run_kubectl(
            self.tools.kubectl, self.kubeconfig, args, input=input, check=check, timeout=timeout
        )

    # ---- nodes ---------------------------------------------------------------------------------
    def create_nodes(self, specs: Sequence[NodeSpec], *, wait_ready_s: float = 60.0) -> list[str]:
        """Create simulated (kwok) nodes for `specs` and wait until kwok reports them Ready."""
        return create_nodes(self.api(), specs, wait_ready_s=wait_ready_s, kwok_log=lambda: self.tail("kwok"))

    def add_nodes(
        self,
        profile_name: str,
        count: int,
        prefix: str,
        *,
        spot: bool = False,
        zones: Sequence[str] = ZONES,
        region: str = REGION,
        labels: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Create `count` simulated nodes of a named profile, ``<prefix>-<i>``, Ready on return.

        Zones are assigned round-robin from `zones`. Numbering continues across calls with the
        same prefix on this object.
        """
        prof = profile(profile_name)
        start = self._prefix_next.get(prefix, 0)
        specs = [
            prof.node_spec(
                f"{prefix}-{i}",
                zone=zones[i % len(zones)] if zones else "",
                region=region,
                spot=spot,
                labels=labels,
            )
            for i in range(start, start + count)
        ]
        self._prefix_next[prefix] = start + count
        self.log(f"adding {count} {profile_name} node(s) {prefix}-{start}..{prefix}-{start + count - 1}")
        return self.create_nodes(specs)
