"""The agent process: one node with real GPUs (NVML), or a fleet of simulated nodes.

`AgentProcess` owns the watches (Nodes, Pods, GPUNodes), one `NodeAgent` per served node, the
loop that ticks them, the NVML watchdog and the reset workers. In fleet mode
(``--simulate-nodes SELECTOR``) every Node matching the label selector is served with the
simulated backend of its profile (label ``node.kubernetes.io/instance-type``), so a kwok cluster
of a thousand nodes has live agents in one process. `start_fleet_agent` launches that process for
the dev cluster.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from kubernetes.client import ApiClient

from neuronetes import contracts as c
from neuronetes.profiles import LABEL_PROFILE, PROFILES

from .backstop import Backstop
from .containers import ContainerTender
from .devices import Discovery, DiscoveryError
from .inventory import (
    DEFAULT_SHIM_DIR,
    DEFAULT_STATE_DIR,
    HostDeviceNodes,
    InventoryWriter,
    ShimPaths,
    driver_files_from_cdi,
    install_shim,
)
from .kube import GPUNODES_PATH, Informer, Kube, KubeError
from .ledger import LedgerWriter
from .modelcache import HostModelCache, ModelCache, SimulatedModelCache, parse_model_list
from .node import NodeAgent
from .pods import pod_use
from .reconcile import Policy
from .regions import RegionKeeper
from .simulated import SimulatedGpus

__all__ = ["AGENT_VERSION", "AgentProcess", "AgentSettings", "start_fleet_agent"]

log = logging.getLogger("neuronetes_agent")

AGENT_VERSION: Final = "0.1.0"
BUILT_SHIM_LIBRARY: Final = (
    Path(__file__).resolve().parents[1] / "shim" / "build" / "release" / "lib" / "libneuronetes-cuda.so"
)
"""The library `make -C node-agent/shim` builds: the default of ``--shim-library``."""


class AgentSettings:
    """How the process runs (the CLI's flags)."""

    def __init__(
        self,
        *,
        node: str | None = None,
        simulate_nodes: str | None = None,
        interval_s: float = 1.0,
        heartbeat_s: float = 60.0,
        watchdog_s: float = 10.0,
        reset_seconds: float = 5.0,
        start_workers: int = 8,
        tick_workers: int = 16,
        region_dir: Path | None = None,
        state_dir: Path = DEFAULT_STATE_DIR,
        shim_library: Path | None = None,
        shim_dir: Path = DEFAULT_SHIM_DIR,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        reconcile: Policy | None = None,
        model_cache_dir: Path | None = Path(c.NODE_MODEL_CACHE_DIR),
        model_cache_every_s: float = 10.0,
    ) -> None:
        if (node is None) == (simulate_nodes is None):
            raise ValueError("give exactly one of --node (real GPUs) and --simulate-nodes (a fleet)")
        self.node = node
        self.simulate_nodes = simulate_nodes
        self.interval_s = interval_s
        self.heartbeat_s = heartbeat_s
        self.watchdog_s = watchdog_s
        self.reset_seconds = reset_seconds
        self.start_workers = start_workers
        self.tick_workers = tick_workers
        self.region_dir = region_dir  # shim regions are written only for real GPUs (--node)
        # --node only: the inventory file and the installed shim. A fleet serves simulated nodes
        # that have no host, so it writes neither.
        self.state_dir = state_dir
        self.shim_library = shim_library if shim_library is not None else BUILT_SHIM_LIBRARY
        self.shim_dir = shim_dir
        self.cgroup_root = cgroup_root  # --node: the host's cgroup mount (containers' processes)
        self.reconcile = reconcile if reconcile is not None else Policy()  # --node: NVML reconciliation
        # --node: the host model cache (None: none reported). Simulated nodes have their own
        # (`modelcache.SimulatedModelCache`).
        self.model_cache_dir = model_cache_dir
        self.model_cache_every_s = model_cache_every_s


class AgentProcess:
    """Serves its nodes until `stop()`."""

    def __init__(
        self,
        api: ApiClient,
        settings: AgentSettings,
        *,
        nvml_backend: Callable[[], Discovery] | None = None,
    ) -> None:
        self.kube = Kube(api)
        self.settings = settings
        self.agents: dict[str, NodeAgent] = {}
        self.lock = threading.Lock()
        self._nvml_backend = nvml_backend
        self._local: Discovery | None = None  # the NVML backend of --node
        self._inventory_file: InventoryWriter | None = None  # --node: the NRI plugin's device map
        self._stop = threading.Event()
        self._pending: dict[str, dict[str, Any]] = {}  # node name -> Node object, to start
        self._starting: set[str] = set()
        self._pods: dict[str, dict[str, Any]] = {}  # pod uid -> pod (the served nodes' pods)
        self._resets = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpu-reset")
        self._starter = ThreadPoolExecutor(
            max_workers=settings.start_workers, thread_name_prefix="node-start"
        )
        self.informers: list[Informer] = []
        self._pods_listed = threading.Event()  # the pod watch listed once (the ledger waits for it)
        self.started_at = time.monotonic()

    # ---- lifecycle -----------------------------------------------------------------------------

    def run(self) -> None:
        """Start the watches, then tick every node each interval until `stop()`. With ``--node``,
        raises `DiscoveryError` at once when NVML cannot be used (the DaemonSet restarts it)."""
        s = self.settings
        if s.node is not None:
            if self._nvml_backend is None:
                raise DiscoveryError("no NVML backend")
            self._local = self._nvml_backend()
            # Fail closed: without the shim (ShimError) or with an unusable CDI spec
            # (InventoryError) no inventory is written, so the plugin gives no GPU to anyone.
            try:
                shim: ShimPaths = install_shim(s.shim_library, s.shim_dir)
                driver = driver_files_from_cdi()
            except BaseException:
                self._local.close()
                raise
            self._inventory_file = InventoryWriter(s.node, s.state_dir, shim, HostDeviceNodes(), driver)
        node_query = (
            [("labelSelector", s.simulate_nodes or "")]
            if s.simulate_nodes
            else [("fieldSelector", f"metadata.name={s.node}")]
        )
        pod_query = [("fieldSelector", f"spec.nodeName={s.node}")] if s.node else []
        gpunode_query = [("fieldSelector", f"metadata.name={s.node}")] if s.node else []
        pods = Informer(self.kube, "/api/v1/pods", self._on_pod, query=pod_query)
        self._pods_listed = pods.synced
        self.informers = [
            Informer(self.kube, "/api/v1/nodes", self._on_node, query=node_query).start(),
            pods.start(),
            Informer(self.kube, GPUNODES_PATH, self._on_gpunode, query=gpunode_query).start(),
        ]
        watchdog = threading.Thread(target=self._watchdog, name="nvml-watchdog", daemon=True)
        watchdog.start()
        # Rounds run on the workers: a node's writes (heartbeats, transitions) wait on the API
        # server, and a thousand nodes' worth of them in one thread would not fit in a round.
        with ThreadPoolExecutor(max_workers=s.tick_workers, thread_name_prefix="tick") as ticks:
            while not self._stop.is_set():
                started = time.monotonic()
                self._start_pending()
                for _ in ticks.map(self._tick, list(self.agents.values())):
                    pass
                self._stop.wait(max(0.0, s.interval_s - (time.monotonic() - started)))
        watchdog.join(timeout=5)

    def _tick(self, agent: NodeAgent) -> None:
        if not self._stop.is_set():
            agent.tick()

    def request_stop(self) -> None:
        """Make `run` return after the current round (from any thread; never from a signal handler:
        `neuronetes.signals` says why)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop the watches, the backends and the workers (after `run` returned)."""
        self._stop.set()
        for informer in self.informers:
            informer.stop()
        with self.lock:
            agents = list(self.agents.values())
        for agent in agents:
            agent.backend.close()
        self._starter.shutdown(wait=True, cancel_futures=True)
        self._resets.shutdown(wait=True, cancel_futures=True)

    def published(self) -> int:
        """Nodes whose first publication is done."""
        return len(self.agents)

    # ---- watches -------------------------------------------------------------------------------

    def _on_node(self, kind: str, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        agent: NodeAgent | None = None
        with self.lock:
            if kind == "DELETED":
                self._pending.pop(name, None)
                agent = self.agents.pop(name, None)
                if agent is not None:
                    agent.backend.close()
            elif name not in self.agents and name not in self._starting:
                self._pending[name] = node
            else:
                agent = self.agents.get(name)
        if kind != "DELETED" and agent is not None and isinstance(agent.model_cache, SimulatedModelCache):
            with agent.lock:
                agent.model_cache.declare(_declared_models(node))

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"].get("uid", "")
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return
        use = None if kind == "DELETED" else pod_use(pod)
        with self.lock:
            if use is None:
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = pod
            agent = self.agents.get(node)
        if agent is None:
            return
        agent.set_pod(uid, use)
        preloaded = (pod["metadata"].get("annotations") or {}).get(c.ANNOTATION_PRELOAD_MODEL)
        succeeded = (pod.get("status") or {}).get("phase") == "Succeeded"
        if preloaded and succeeded and isinstance(agent.model_cache, SimulatedModelCache):
            with agent.lock:  # the pod wrote its own namespace's folder, the only one it mounts
                agent.model_cache.preloaded(str(pod["metadata"].get("namespace", "")), preloaded)

    def _on_gpunode(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            agent = self.agents.get(obj["metadata"]["name"])
        if agent is None:
            return
        if kind == "DELETED":
            agent.gpunode_deleted()
        else:
            agent.set_gpunode(obj)

    # ---- nodes ---------------------------------------------------------------------------------

    def _start_pending(self) -> None:
        with self.lock:
            pending, self._pending = self._pending, {}
            self._starting |= set(pending)
        for name, node in pending.items():
            self._starter.submit(self._start_node, name, node)

    def _backend(self, name: str, node: dict[str, Any]) -> Discovery | None:
        if self.settings.node is not None:
            return self._local
        profile_name = (node["metadata"].get("labels") or {}).get(LABEL_PROFILE, "")
        profile = PROFILES.get(profile_name)
        if profile is None or not profile.gpu_count:
            return None  # a CPU node or an unknown profile: nothing to serve
        return SimulatedGpus(profile, name, reset_seconds=self.settings.reset_seconds)

    def _model_cache(self, node: dict[str, Any]) -> ModelCache | None:
        s = self.settings
        if s.node is None:
            return SimulatedModelCache(_declared_models(node))
        if s.model_cache_dir is None:
            return None
        return HostModelCache(s.model_cache_dir, s.model_cache_every_s)

    def _start_node(self, name: str, node: dict[str, Any]) -> None:
        try:
            backend = self._backend(name, node)
            if backend is None:
                return
            s = self.settings
            regions = RegionKeeper(s.region_dir) if s.region_dir is not None and s.node is not None else None
            agent = NodeAgent(
                name,
                node["metadata"].get("uid", ""),
                backend,
                self.kube,
                self._resets,
                agent_version=AGENT_VERSION,
                heartbeat_s=s.heartbeat_s,
                model_cache=self._model_cache(node),
                regions=regions,
                inventory_file=self._inventory_file,
                # --node: the NRI plugin's other inputs and outputs (docs/node-injection.md)
                ledger=LedgerWriter(s.node, s.state_dir, ready=self._pods_listed.is_set, clock=time.monotonic)
                if s.node is not None
                else None,
                containers=ContainerTender(s.state_dir, regions, cgroup_root=s.cgroup_root, clock=time.time)
                if regions is not None
                else None,
                backstop=Backstop(s.reconcile, regions) if regions is not None else None,
            )
            with self.lock:
                pods = [p for p in self._pods.values() if p["spec"].get("nodeName") == name]
            for pod in pods:
                agent.set_pod(pod["metadata"]["uid"], pod_use(pod))
            agent.start(node)
            with self.lock:
                self.agents[name] = agent
                # Pods seen while starting.
                late = [p for p in self._pods.values() if p["spec"].get("nodeName") == name]
            for pod in late:
                agent.set_pod(pod["metadata"]["uid"], pod_use(pod))
        except (DiscoveryError, KubeError) as exc:
            log.warning("node %s: cannot start: %s; retrying", name, exc)
            with self.lock:
                self._pending.setdefault(name, node)
        finally:
            with self.lock:
                self._starting.discard(name)

    def _watchdog(self) -> None:
        while not self._stop.wait(1.0):
            for agent in list(self.agents.values()):
                if agent.watchdog(self.settings.watchdog_s):
                    log.error("node %s: NVML has hung for over %.0f s", agent.node, self.settings.watchdog_s)


def _declared_models(node: dict[str, Any]) -> set[str]:
    """The models a simulated Node's annotation says its cache holds."""
    annotations = node["metadata"].get("annotations") or {}
    return parse_model_list(annotations.get(c.ANNOTATION_SIMULATED_CACHED_MODELS))


def fleet_agent_argv(
    kubeconfig: Path, selector: str, *, metrics_port: int = 0, extra_args: Sequence[str] = ()
) -> list[str]:
    """``neuronetes agent run --simulate-nodes SELECTOR`` (the dev cluster's agent) as argv."""
    return [
        sys.executable,
        "-m",
        "neuronetes.cli",
        "agent",
        "run",
        "--kubeconfig",
        str(kubeconfig),
        "--simulate-nodes",
        selector,
        "--metrics-port",
        str(metrics_port),
        *extra_args,
    ]


def start_fleet_agent(
    kubeconfig: Path,
    selector: str,
    log_file: Path,
    *,
    metrics_port: int = 0,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Launch ``neuronetes agent run --simulate-nodes SELECTOR`` as a host process (the dev
    cluster's agent); its output goes to `log_file`. The caller stops it with SIGTERM."""
    cmd = fleet_agent_argv(kubeconfig, selector, metrics_port=metrics_port, extra_args=extra_args)
    out = log_file.open("ab")
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    finally:
        out.close()
