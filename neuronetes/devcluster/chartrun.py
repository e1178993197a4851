"""The chart runner: the kubelet of a dev cluster's chart pods, running their containers as host processes.

kwok marks pods Running without running anything. This process follows the pods of a Helm
release (label selector) that are Running on a node and, for each, does what a kubelet would:
asks the API server for the pod's ServiceAccount token (a TokenRequest bound to the pod),
materialises its volumes, starts each container's command as a host process with the plan of
`neuronetes.devcluster.podplan`, restarts a container that exits (``restartPolicy: Always``,
with back-off), rewrites a ConfigMap volume's files when the ConfigMap changes, reports the pod
condition `RUNNING_CONDITION` (kwok's Ready says nothing about processes), and stops the
processes when the pod goes (``helm upgrade`` rolls pods, ``helm uninstall`` deletes them).

Pods on real nodes (label ``dev.neuronetes.io/real-node``) are left to their kubelet.
Deviations: containers whose entry point this host cannot run are skipped with the reason (the NRI
plugin: no container runtime), and the node agent's pods (``neuronetes agent run --node NODE``,
one per GPU node) are served by one process in fleet mode (``--simulate-nodes
'kubernetes.io/hostname in (...)'`` over exactly the nodes that have a Running agent pod, the
first pod's arguments otherwise), restarted when that set of nodes changes: simulated nodes have
no NVML, and one Python process per node would not fit a workstation. The fleet runs as a
ServiceAccount of its own with the agent's roles (`neuronetes.devcluster.fleetauth`): an agent
pod's token names the pod's node, and the chart's policy holds such a token to that node.

It also serves the API server's egress proxy (`neuronetes.devcluster.egress`), resolving Service
and pod addresses to the processes it runs. ``runner.json`` in its root lists what runs (pods,
processes, argv, skipped containers and why); each container logs to ``logs/<ns>_<pod>_<container>.log``.
Its children share its process group, so stopping the runner's group stops them all.
The loop that changes things is here (pods, fleet, state); the pods it runs (`PodRun`) and the
read-only lookups over them, the egress proxy's addresses and the log server's files, are in
`neuronetes.devcluster.podruns`; processes and files in `neuronetes.devcluster.hostprocs`.

Run as ``python -m neuronetes.devcluster.chartrun`` (`neuronetes.devcluster.chartmode` starts it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from neuronetes.devcluster.api import Api, ApiError
from neuronetes.devcluster.components import NODE_IP, REAL_NODE_LABEL
from neuronetes.devcluster.egress import EgressProxy
from neuronetes.devcluster.fleetauth import fleet_credentials, fleet_service_account
from neuronetes.devcluster.hostprocs import Proc, declared_ports, listens, stop_procs, write_files
from neuronetes.devcluster.podfiles import kubeconfig_text
from neuronetes.devcluster.podlogs import LogServer
from neuronetes.devcluster.podplan import (
    Credentials,
    Entrypoints,
    HostFile,
    PlanError,
    PodPlan,
    automounts_token,
    plan_pod,
)
from neuronetes.devcluster.podruns import (
    FLEET,
    PodRun,
    find_log,
    fleet_launch,
    is_node_agent,
    resolve_address,
)
from neuronetes.signals import relay_signals

__all__ = ["FLEET", "RUNNING_CONDITION", "Runner", "fleet_launch", "is_node_agent", "main"]

log = logging.getLogger("neuronetes.chartrun")
TOKEN_SECONDS: Final = 24 * 3600
RUNNING_CONDITION: Final = "dev.neuronetes.io/HostProcesses"
"""The pod condition the runner sets: True once every container's process runs and each declared
TCP port accepts connections (kwok's Ready says nothing about processes)."""
FLEET_SETTLE_S: Final = 2.0
"""The agent fleet restarts once its node set has not changed for this long (nodes come in batches)."""


class Runner:
    def __init__(
        self,
        api: Api,
        *,
        root: Path,
        selector: str,
        entrypoints: Entrypoints,
        ca_pem: bytes,
        base_env: Mapping[str, str],
        net: int,
    ) -> None:
        self.api = api
        self.net = net
        self.root = root
        self.selector = selector
        self.entrypoints = entrypoints
        self.ca_pem = ca_pem
        self.base_env = dict(base_env)
        self.runs: dict[str, PodRun] = {}
        self.errors: dict[str, str] = {}
        self.fleet: Proc | None = None
        self._fleet_nodes: tuple[str, ...] = ()
        self._fleet_account: str | None = None
        self._fleet_seen: tuple[tuple[str, ...], float] = ((), 0.0)
        self._services: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._rr = itertools.count()
        self.node_ip = ""
        self.kubelet_port = 0

    # ---- reading the cluster ---------------------------------------------------------------------
    def _list(self, path: str) -> list[dict[str, Any]]:
        return list(self.api.request("GET", path).get("items") or [])

    def _namespace_objects(self, namespaces: set[str]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
        out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        # Not helm's release records (Secrets labelled owner=helm): large, and no pod mounts them.
        query = {"configmaps": "", "secrets": "?labelSelector=owner%21%3Dhelm", "serviceaccounts": ""}
        for ns in namespaces:
            out[ns] = {
                kind: {o["metadata"]["name"]: o for o in self._list(f"/api/v1/namespaces/{ns}/{kind}{q}")}
                for kind, q in query.items()
            }
        return out

    def _credentials(self, pod: dict[str, Any], sa: dict[str, Any] | None) -> Credentials | None:
        if not automounts_token(pod, sa):
            return None
        meta = pod["metadata"]
        name = pod["spec"].get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        got = self.api.request(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{name}/token", body
        )
        return Credentials(self.api.server, self.ca_pem, str(got["status"]["token"]))

    def _plan(
        self, pod: dict[str, Any], objs: dict[str, dict[str, dict[str, Any]]], creds: Credentials | None
    ) -> PodPlan:
        meta = pod["metadata"]
        return plan_pod(
            pod,
            config_maps=objs["configmaps"],
            secrets=objs["secrets"],
            credentials=creds,
            entrypoints=self.entrypoints,
            root=self.root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}",
            node_root=self.root / "nodes" / pod["spec"]["nodeName"],
            base_env=self.base_env,
            net=self.net,
        )

    # ---- one round -------------------------------------------------------------------------------
    def tick(self) -> None:
        pods = self._list(f"/api/v1/pods?labelSelector={self.selector}")
        services = self._list("/api/v1/services")
        # A real node's kubelet runs its pods itself (`neuronetes.devcluster.realchart`).
        real = {n["metadata"]["name"] for n in self._list(f"/api/v1/nodes?labelSelector={REAL_NODE_LABEL}")}
        wanted = {
            p["metadata"]["uid"]: p
            for p in pods
            if p["spec"].get("nodeName")
            and p["spec"]["nodeName"] not in real
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Running"
        }
        gone = [uid for uid in self.runs if uid not in wanted]
        if gone:
            with self._lock:
                stopping = [self.runs.pop(uid) for uid in gone]
            for run in stopping:
                log.info("pod %s gone: stopping %s", run.key, ", ".join(run.procs) or "nothing")
            stop_procs([p for run in stopping for p in run.procs.values()])
        for uid in list(self.errors):
            if uid not in wanted:
                del self.errors[uid]
        objs = self._namespace_objects({p["metadata"]["namespace"] for p in wanted.values()})
        now = time.monotonic()
        for uid, pod in wanted.items():
            try:
                self._sync_pod(uid, pod, objs[pod["metadata"]["namespace"]], now)
                self.errors.pop(uid, None)
            except (PlanError, ApiError, OSError) as exc:
                if self.errors.get(uid) != str(exc):
                    log.error("pod %s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], exc)
                self.errors[uid] = str(exc)
        with self._lock:
            self._services = services
        self._sync_fleet(now)
        self._write_state()

    def _sync_pod(
        self, uid: str, pod: dict[str, Any], objs: dict[str, dict[str, dict[str, Any]]], now: float
    ) -> None:
        run = self.runs.get(uid)
        if run is None:
            sa = objs["serviceaccounts"].get(pod["spec"].get("serviceAccountName") or "default")
            creds = self._credentials(pod, sa)
            plan = self._plan(pod, objs, creds)
            run = PodRun(pod, creds, plan)
            write_files(plan.files, plan.dirs)
            grace = min(10.0, float(pod["spec"].get("terminationGracePeriodSeconds", 30)))
            for launch in plan.containers:
                if is_node_agent(launch):
                    run.agents[str(pod["spec"]["nodeName"])] = launch
                    continue
                log_file = self.root / "logs" / f"{run.key}_{launch.name}.log"
                run.procs[launch.name] = Proc(launch, plan.root, log_file, grace)
            for s in plan.skipped:
                log.info("pod %s: container %s not run: %s", run.key, s.name, s.reason)
            with self._lock:
                self.runs[uid] = run
        else:
            run.pod = pod
            plan = self._plan(pod, objs, run.credentials)
            if write_files(plan.files, plan.dirs):
                log.info("pod %s: volume files updated", run.key)
        for proc in run.procs.values():
            proc.tend(now)
        self._report(run)

    def _report(self, run: PodRun) -> None:
        """Set the pod's `RUNNING_CONDITION` when it changes (what ``kubectl wait`` can wait for)."""
        running = all(p.alive() for p in run.procs.values()) and all(
            listens(run.plan.address, port) for port in declared_ports(run.pod, run.procs)
        )
        if run.agents:  # served by the fleet
            fleet = self.fleet
            running &= fleet is not None and fleet.alive() and set(run.agents) <= set(self._fleet_nodes)
        if running == run.reported:
            return
        meta = run.pod["metadata"]
        condition = {
            "type": RUNNING_CONDITION,
            "status": "True" if running else "False",
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "reason": "HostProcessesRunning" if running else "HostProcessesStarting",
        }
        self.api.request(
            "PATCH",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
            {"status": {"conditions": [condition]}},
            content_type="application/strategic-merge-patch+json",
        )
        run.reported = running

    def _sync_fleet(self, now: float) -> None:
        agents = sorted(
            ((node, launch, run) for run in self.runs.values() for node, launch in run.agents.items()),
            key=lambda t: t[0],
        )
        nodes = tuple(node for node, _, _ in agents)
        if nodes != self._fleet_seen[0]:
            self._fleet_seen = (nodes, now)
        settled = now - self._fleet_seen[1] >= FLEET_SETTLE_S
        if settled and nodes != self._fleet_nodes:
            if self.fleet is not None:
                log.info("agent fleet: node set changed, restarting")
                stop_procs([self.fleet])
                self.fleet = None
            if nodes:
                _, first, run = agents[0]
                kubeconfig = self._fleet_kubeconfig(run) if run.credentials is not None else None
                launch = fleet_launch(first, nodes, kubeconfig)
                self.fleet = Proc(launch, run.plan.root, self.root / "logs" / f"{FLEET}.log", 10.0)
                log.info("agent fleet for %d node(s)", len(nodes))
            self._fleet_nodes = nodes
        if self.fleet is not None:
            self.fleet.tend(now)

    def _fleet_kubeconfig(self, run: PodRun) -> Path:
        """The fleet's own identity (`fleetauth`): its kubeconfig, written under the runner's root."""
        meta, account = run.pod["metadata"], run.pod["spec"].get("serviceAccountName") or "default"
        creds = fleet_credentials(self.api, self.ca_pem, meta["namespace"], account, TOKEN_SECONDS)
        path = self.root / "fleet" / "kubeconfig"
        write_files([HostFile(path, kubeconfig_text(creds).encode(), 0o600)], [path.parent])
        self._fleet_account = f"{meta['namespace']}/{fleet_service_account(account)}"
        return path

    # ---- the egress proxy's resolver -------------------------------------------------------------
    def resolve(self, host: str, port: int) -> tuple[str, int] | None:
        """A Service's cluster IP and port → a pod of it that runs; a pod IP → its loopback address."""
        with self._lock:
            services = list(self._services)
            runs = list(self.runs.values())
        return resolve_address(
            services, runs, host, port, turns=self._rr, kubelet=(self.node_ip, self.kubelet_port)
        )

    def find_log(self, namespace: str, pod: str, container: str) -> Path | None:
        """The log file of a container the runner runs (an agent pod's agent: the fleet's)."""
        with self._lock:
            runs = list(self.runs.values())
            fleet = self.fleet
        return find_log(runs, fleet, namespace, pod, container)

    # ---- state -----------------------------------------------------------------------------------
    def _write_state(self) -> None:
        doc = {
            "pods": {
                uid: {
                    "namespace": r.pod["metadata"]["namespace"],
                    "name": r.pod["metadata"]["name"],
                    "node": r.pod["spec"]["nodeName"],
                    "address": r.plan.address,
                    "root": str(r.plan.root),
                    "containers": {n: p.to_json() for n, p in r.procs.items()},
                    "agentOf": sorted(r.agents),
                    "skipped": {s.name: s.reason for s in r.plan.skipped},
                }
                for uid, r in self.runs.items()
            },
            "fleet": None
            if self.fleet is None
            else {
                **self.fleet.to_json(),
                "nodes": list(self._fleet_nodes),
                "serviceAccount": self._fleet_account,
            },
            "errors": self.errors,
        }
        write_files([HostFile(self.root / "runner.json", (json.dumps(doc, indent=2) + "\n").encode())], [])

    def stop(self) -> None:
        with self._lock:
            runs, self.runs = list(self.runs.values()), {}
        procs = [p for r in runs for p in r.procs.values()] + ([self.fleet] if self.fleet else [])
        self.fleet = None
        stop_procs(procs)
        self._write_state()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m neuronetes.devcluster.chartrun", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--server", required=True, help="the API server URL")
    parser.add_argument("--token-file", required=True, help="an admin token (reads pods, requests tokens)")
    parser.add_argument("--ca-file", required=True, help="the CA that verifies the API server")
    parser.add_argument("--root", required=True, help="folder for the pods' files, logs and runner.json")
    parser.add_argument("--selector", required=True, help="label selector of the pods to run")
    parser.add_argument("--kube-scheduler", required=True, help="the kube-scheduler binary")
    parser.add_argument("--egress-socket", help="serve the API server's egress proxy on this Unix socket")
    parser.add_argument("--loopback-net", type=int, required=True, help="N of the pods' 127.N.0.0/16")
    parser.add_argument("--node-ip", default=NODE_IP, help="the simulated nodes' address (their kubelet)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between rounds")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    ca_file = Path(ns.ca_file)
    api = Api(ns.server, Path(ns.token_file).read_text().strip(), ca_file)
    root = Path(ns.root)
    root.mkdir(parents=True, exist_ok=True)
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    runner = Runner(
        api,
        root=root,
        selector=ns.selector,
        entrypoints=Entrypoints.for_host(Path(ns.kube_scheduler)),
        ca_pem=ca_file.read_bytes(),
        base_env=base_env,
        net=ns.loopback_net,
    )
    stop = threading.Event()
    relay_signals(lambda signum: stop.set(), (signal.SIGTERM, signal.SIGINT))
    logs = LogServer(root / "kubelet-certs", runner.find_log)
    runner.node_ip, runner.kubelet_port = ns.node_ip, logs.port
    proxy = EgressProxy(Path(ns.egress_socket), runner.resolve) if ns.egress_socket else None
    log.info("running the pods selected by %s", ns.selector)
    try:
        while not stop.is_set():
            try:
                runner.tick()
            except (ApiError, OSError) as exc:
                log.warning("round failed: %s", exc)
            stop.wait(ns.interval)
    finally:
        runner.stop()
        logs.close()
        if proxy is not None:
            proxy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
