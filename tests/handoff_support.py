"""What the agent's hand-off tests share (tests/unit/test_agent_ledger.py, test_agent_containers.py,
test_agent_backstop.py): a node, pods bound to it, the container record the NRI plugin writes, a
cgroup mount as the kernel shows it, and the agent of a node with (simulated) GPUs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pod_builder import node_view

from neuronetes.profiles import PROFILES
from neuronetes_agent.daemon.backstop import Backstop
from neuronetes_agent.daemon.containers import RECORDS_DIR, ContainerTender
from neuronetes_agent.daemon.ledger import LEDGER_FILE, LedgerWriter
from neuronetes_agent.daemon.node import NodeAgent
from neuronetes_agent.daemon.pods import PodUse, pod_use
from neuronetes_agent.daemon.reconcile import Policy
from neuronetes_agent.daemon.regions import RegionKeeper
from neuronetes_agent.daemon.simulated import SimulatedGpus

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NODE = "gpu-node-1"
UID_A = "0b6f3c8e-4c1d-4f57-9a1e-2f0c4a1b9d77"
UID_B = "6f1c2d3e-0000-4000-8000-00000000beef"
CONTAINER_ID = "5f2a9c0d7e1b4a3c8d6e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"
SYSTEMD_PATH = f"kubepods-burstable-pod{UID_A.replace('-', '_')}.slice:cri-containerd:{CONTAINER_ID}"
SYSTEMD_DIR = (
    "kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID_A.replace('-', '_')}.slice/cri-containerd-{CONTAINER_ID}.scope"
)
CGROUPFS_PATH = f"/kubepods/burstable/pod{UID_A}/{CONTAINER_ID}"


def gpus_of(profile: str = "dgx-a100-80gb") -> list[Any]:
    return list(SimulatedGpus(PROFILES[profile], NODE).scan().gpus)


def pod(
    uid: str, name: str, gpus: list[tuple[str, int, int, int]], container: str = "main"
) -> dict[str, object]:
    """A pod bound to NODE whose container gets `gpus` ((uuid, index, memoryMiB, computePercent))."""
    entries = [{"uuid": u, "index": i, "memoryMiB": m, "computePercent": p} for u, i, m, p in gpus]
    return node_view(NODE, uid, name, {container: entries})


def use(p: dict[str, Any]) -> PodUse:
    u = pod_use(p)
    assert u is not None
    return u


def cgroup_tree(root: Path, version: int, rel: str, *pids: int) -> Path:
    """A cgroup mount as the kernel shows it: v2 one hierarchy with cgroup.controllers at its root;
    v1 one directory per controller (the container's cgroup in each)."""
    if version == 2:
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        dirs = [root / rel]
    else:
        dirs = [root / h / rel for h in ("memory", "pids", "cpu,cpuacct")]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return dirs[0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ledger_doc(tmp_path: Path) -> dict[str, Any]:
    return dict(json.loads((tmp_path / LEDGER_FILE).read_text()))


class QuietKube:
    """The API server stand-in; Events and evictions are kept (the hand-off's warnings become
    Events)."""

    def __init__(self) -> None:
        self.gpunode: dict[str, Any] = {"metadata": {"name": NODE, "generation": 1}, "spec": {}}
        self.events: list[tuple[str, str]] = []
        self.pod_events: list[tuple[str, str, str, str, str]] = []  # (namespace, pod, type, reason, message)
        self.evictions: list[tuple[str, str]] = []

    def ensure_gpunode(self, node: str, node_uid: str) -> dict[str, Any]:
        return self.gpunode

    def node_event(self, node: str, node_uid: str, kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def pod_event(
        self, namespace: str, name: str, uid: str, node: str, kind: str, reason: str, message: str
    ) -> None:
        self.pod_events.append((namespace, name, kind, reason, message))

    def evict(self, namespace: str, name: str) -> int:
        self.evictions.append((namespace, name))
        return 201

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: 201


def write_record(state: Path, uid: str, container: str, cgroups_path: str, written_at: float) -> Path:
    """What the plugin writes at CreateContainer (node-agent/nri/records)."""
    doc = json.loads((FIXTURES / "container-record.json").read_text()) | {
        "podUID": uid,
        "container": container,
        "cgroupsPath": cgroups_path,
        "regionDir": str(state / "containers" / uid / container),
        "writtenAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(written_at)),
    }
    path = state / RECORDS_DIR / f"{uid}.{container}.json"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def real_node_agent(
    state: Path,
    cgroup_root: Path,
    proc: Path,
    wall: Callable[[], float],
    *,
    with_ledger: bool,
    reconcile: tuple[Policy, Callable[[], float]] | None = None,
) -> tuple[NodeAgent, SimulatedGpus, QuietKube]:
    """The agent of a node with (simulated) GPUs, its regions, records and ledger under `state`;
    with `reconcile` (policy, monotonic clock), NVML reconciliation too."""
    sim = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE)
    regions = RegionKeeper(state / "containers")
    kube = QuietKube()
    agent = NodeAgent(
        NODE,
        "node-uid",
        sim,
        kube,
        ThreadPoolExecutor(1),
        agent_version="t",
        regions=regions,
        ledger=LedgerWriter(NODE, state, ready=lambda: True, clock=time.monotonic) if with_ledger else None,
        containers=ContainerTender(state, regions, cgroup_root=cgroup_root, proc_root=proc, clock=wall),
        backstop=Backstop(reconcile[0], regions, clock=reconcile[1]) if reconcile is not None else None,
    )
    agent.start()
    return agent, sim, kube
