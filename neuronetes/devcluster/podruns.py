"""The pods the chart runner runs, and the lookups over them that other servers ask for.

`PodRun` is one pod the runner (`neuronetes.devcluster.chartrun`) follows: the pod as last read,
its plan, its processes, and the node agents its containers stand for: `is_node_agent` tells
them, and one process serves them all (`fleet_launch`: the first agent's command, over the nodes).
The lookups take a snapshot of those and change nothing: `resolve_address` for the API server's
egress proxy (`neuronetes.devcluster.egress`: a Service or pod address → the process serving it)
and `find_log` for the kubelet log server (`neuronetes.devcluster.podlogs`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from neuronetes.devcluster.hostprocs import Proc
from neuronetes.devcluster.podplan import ContainerLaunch, Credentials, PodPlan

__all__ = ["FLEET", "PodRun", "find_log", "fleet_launch", "is_node_agent", "resolve_address"]

FLEET: Final = "node-agent-fleet"
"""The name of the one process that serves every node agent pod (simulated nodes, fleet mode)."""


def is_node_agent(launch: ContainerLaunch) -> bool:
    """``neuronetes agent run --node NODE``: one node's agent."""
    argv = list(launch.argv)
    has_node = "--node" in argv or any(a.startswith("--node=") for a in argv)
    return has_node and any(argv[i : i + 2] == ["agent", "run"] for i in range(len(argv)))


def fleet_launch(
    first: ContainerLaunch, nodes: Sequence[str], kubeconfig: Path | None = None
) -> ContainerLaunch:
    """`first`'s agent, serving `nodes` (simulated) instead of its own node, with the credentials
    of `kubeconfig` (the fleet's own identity) when given."""
    selector = f"kubernetes.io/hostname in ({','.join(sorted(nodes))})"
    argv: list[str] = []
    skip = False
    for a in first.argv:
        if skip:
            skip = False
            continue
        if a == "--node":
            argv += ["--simulate-nodes", selector]
            skip = True
        elif a.startswith("--node="):
            argv += ["--simulate-nodes", selector]
        else:
            argv.append(a)
    env = dict(first.env) if kubeconfig is None else {**first.env, "KUBECONFIG": str(kubeconfig)}
    return replace(first, name=FLEET, argv=tuple(argv), env=env)


@dataclass
class PodRun:
    pod: dict[str, Any]
    credentials: Credentials | None
    plan: PodPlan
    procs: dict[str, Proc] = field(default_factory=dict)
    agents: dict[str, ContainerLaunch] = field(default_factory=dict)
    reported: bool | None = None

    @property
    def key(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta['namespace']}_{meta['name']}"


def _labels_match(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def resolve_address(
    services: Sequence[Mapping[str, Any]],
    runs: Sequence[PodRun],
    host: str,
    port: int,
    *,
    turns: Iterator[int],
    kubelet: tuple[str, int],
) -> tuple[str, int] | None:
    """A Service's cluster IP and port → a pod of it that runs (round robin by `turns`); a pod IP →
    its loopback address; the simulated nodes' address (`kubelet`: address and the log server's
    port, 0 when none) → the log server; loopback (the real nodes' kubelets) → itself."""
    node_ip, kubelet_port = kubelet
    for svc in services:
        spec = svc.get("spec") or {}
        if spec.get("clusterIP") != host:
            continue
        for p in spec.get("ports") or ():
            if int(p.get("port", 0)) != port:
                continue
            target = p.get("targetPort", port)
            ns = svc["metadata"]["namespace"]
            ready = [
                r
                for r in runs
                if r.pod["metadata"]["namespace"] == ns
                and _labels_match(spec.get("selector") or {}, r.pod["metadata"].get("labels") or {})
                and any(pr.alive() for pr in r.procs.values())
            ]
            if not ready:
                return None
            run = ready[next(turns) % len(ready)]
            return run.plan.address, _container_port(run.pod, target)
    for run in runs:
        if (run.pod.get("status") or {}).get("podIP") == host:
            return run.plan.address, port
    if host == node_ip and kubelet_port:
        return "127.0.0.1", kubelet_port  # every simulated node's kubelet: `podlogs`
    if host == "127.0.0.1":
        return host, port  # a real node's kubelet (its InternalIP: `neuronetes.devcluster.realnodes`)
    return None


def find_log(
    runs: Sequence[PodRun], fleet: Proc | None, namespace: str, pod: str, container: str
) -> Path | None:
    """The log file of a container the runner runs (an agent pod's agent: the `fleet`'s)."""
    for run in runs:
        meta = run.pod["metadata"]
        if (meta["namespace"], meta["name"]) != (namespace, pod):
            continue
        if container in run.procs:
            return run.procs[container].log_file
        if container in {launch.name for launch in run.agents.values()} and fleet is not None:
            return fleet.log_file
    return None


def _container_port(pod: Mapping[str, Any], target: int | str) -> int:
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for ctr in pod["spec"].get("containers") or ():
        for p in ctr.get("ports") or ():
            if p.get("name") == target:
                return int(p["containerPort"])
    return 0
