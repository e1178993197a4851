"""The agent's hand-off to the NRI plugin beyond the inventory (docs/node-injection.md): the node
ledger it writes for the plugin's cross-check, and the container records the plugin writes that
tell the agent where each container's processes are (cgroup path forms, host-PID registration,
dead-slot reclaim, region removal) — ending with the whole poll loop on a fake cgroup tree, a fake
``/proc`` and the simulated NVML backend.

The ledger's cross-language check runs the plugin's own reader and cross-check
(`node-agent/nri/cmd/ledger-check`) on what the Python agent wrote; the container record's
format is pinned by `tests/fixtures/container-record.json`, which the Go writer's test produces
byte for byte (as JSON) and this file decodes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from nri_tools import build_nri_tool
from pod_builder import node_view
from region_fakes import MIB, claim, fake_process

from neuronetes.agent import region as shim
from neuronetes.agent.daemon.containers import RECORDS_DIR, ContainerTender, cgroup_dir, read_records
from neuronetes.agent.daemon.hostpids import start_ticks
from neuronetes.agent.daemon.ledger import LEDGER_FILE, LedgerWriter
from neuronetes.agent.daemon.node import NodeAgent
from neuronetes.agent.daemon.pods import PodUse, pod_use
from neuronetes.agent.daemon.regions import RegionKeeper
from neuronetes.agent.daemon.simulated import SimulatedGpus
from neuronetes.devcluster.profiles import LABEL_PROFILE, PROFILES

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
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


# ---- container records ------------------------------------------------------------------------


def test_the_record_the_plugin_writes_is_what_the_agent_reads(tmp_path: Path) -> None:
    records = tmp_path / RECORDS_DIR
    records.mkdir()
    shutil.copy(FIXTURES / "container-record.json", records / f"{UID_A}.trainer.json")
    (records / f".{UID_A}.trainer.json.77.tmp").write_text("{")  # the plugin's temporary file
    found, errors = read_records(records)
    assert errors == []
    (r,) = found
    assert (r.pod_uid, r.namespace, r.pod, r.container) == (UID_A, "team-a", "trainer-0", "trainer")
    assert r.container_id == CONTAINER_ID and r.cgroups_path.endswith(f":cri-containerd:{CONTAINER_ID}")
    assert r.region_dir == f"/run/neuronetes/containers/{UID_A}/trainer"
    assert r.written_at.timestamp() == 1795435200.0  # 2026-11-23T12:00:00Z
    # Go writes time.Time with up to nine fractional digits
    doc = json.loads((FIXTURES / "container-record.json").read_text())
    (records / f"{UID_A}.trainer.json").write_text(
        json.dumps(doc | {"writtenAt": "2026-11-23T12:00:00.123456789Z"})
    )
    ((r,), _) = read_records(records)
    assert abs(r.written_at.timestamp() - 1795435200.123457) < 1e-6


@pytest.mark.parametrize(
    ("name", "change", "says"),
    [
        (f"{UID_A}.other.json", {}, "do not match its name"),
        (f"{UID_A}.trainer.json", {"version": 2}, "version 2"),
        (f"{UID_A}.trainer.json", {"pid": 7}, "unknown field"),
        (f"{UID_A}.trainer.json", {"cgroupsPath": ""}, "no cgroupsPath"),
        (f"{UID_A}.trainer.json", {"writtenAt": "yesterday"}, "datetime"),
    ],
)
def test_a_record_that_is_not_one_is_reported_and_skipped(
    tmp_path: Path, name: str, change: dict[str, Any], says: str
) -> None:
    doc = json.loads((FIXTURES / "container-record.json").read_text()) | change
    (tmp_path / name).write_text(json.dumps(doc))
    found, errors = read_records(tmp_path)
    assert found == [] and len(errors) == 1 and says in errors[0], errors


def test_a_symlinked_or_huge_record_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.json").write_text((FIXTURES / "container-record.json").read_text())
    (tmp_path / f"{UID_A}.trainer.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / f"{UID_B}.big.json").write_text(" " * 20000)
    found, errors = read_records(tmp_path)
    assert found == [] and len(errors) == 2 and all("regular file" in e for e in errors)
    assert read_records(tmp_path / "absent") == ([], [])


# ---- cgroup path forms ------------------------------------------------------------------------


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


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    ("cgroups_path", "rel"),
    [
        (SYSTEMD_PATH, SYSTEMD_DIR),  # kubelet and containerd with the systemd cgroup driver
        (CGROUPFS_PATH, CGROUPFS_PATH.lstrip("/")),  # with the cgroupfs driver
        ("kubepods.slice:cri-o:abc", "kubepods.slice/cri-o-abc.scope"),
        (":cri-containerd:abc", "system.slice/cri-containerd-abc.scope"),  # runc's default slice
        ("-.slice::abc", "abc.scope"),  # the root slice, no prefix
    ],
)
def test_both_cgroup_path_forms_resolve_on_v1_and_v2(
    tmp_path: Path, version: int, cgroups_path: str, rel: str
) -> None:
    root = tmp_path / "sys-fs-cgroup"
    expected = cgroup_tree(root, version, rel, 4242)
    if version == 1:
        expected = root / "pids" / rel  # the first hierarchy every container joins
    assert cgroup_dir(cgroups_path, root) == expected


@pytest.mark.parametrize(
    "cgroups_path",
    [
        "",
        "kubepods.slice:cri-containerd",  # two parts
        "kubepods.slice:a:b:c",
        "kubepods:cri-containerd:abc",  # not a slice
        "kubepods--burstable.slice:cri-containerd:abc",  # empty slice component
        "kubepods.slice:cri-containerd:../../etc",
        "kubepods.slice:cri-containerd:sub.slice",
        "/../../etc",
        "relative/path",
    ],
)
def test_a_cgroup_path_of_no_known_form_resolves_to_nothing(tmp_path: Path, cgroups_path: str) -> None:
    root = tmp_path / "cg"
    cgroup_tree(root, 2, "etc", 1)
    cgroup_tree(root, 2, "kubepods.slice/cri-containerd-abc.scope", 1)
    assert cgroup_dir(cgroups_path, root) is None


def test_a_cgroup_that_is_not_there_yet_resolves_to_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    cgroup_tree(root, 2, "other", 1)
    assert cgroup_dir(SYSTEMD_PATH, root) is None
    assert cgroup_dir(CGROUPFS_PATH, tmp_path / "v1-without-hierarchies") is None


# ---- the node ledger --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ledger_doc(tmp_path: Path) -> dict[str, Any]:
    return dict(json.loads((tmp_path / LEDGER_FILE).read_text()))


def test_the_ledger_pins_the_first_assignment_and_keeps_order_across_restarts(tmp_path: Path) -> None:
    gpus = gpus_of()
    inventory = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE).scan()
    clock = Clock()
    ready = False
    writer = LedgerWriter(NODE, tmp_path, ready=lambda: ready, clock=clock)
    a = use(pod(UID_A, "a", [(gpus[0].uuid, 0, 81920, 100)]))
    b = use(pod(UID_B, "b", [(gpus[1].uuid, 1, 20480, 25)]))
    assert not writer.refresh({UID_A: a}, inventory)  # the pod watch has not listed yet
    assert not (tmp_path / LEDGER_FILE).exists()

    ready = True
    assert writer.refresh({UID_A: a, UID_B: b}, inventory)
    doc = ledger_doc(tmp_path)
    assert (doc["version"], doc["node"], doc["generation"]) == (1, NODE, 1)
    assert [p["uid"] for p in doc["pods"]] == [UID_A, UID_B]
    assert doc["pods"][0] == {"uid": UID_A, "namespace": "ml", "name": "a", "assignment": a.annotation}
    assert doc["gpus"][0] == {"uuid": gpus[0].uuid, "memoryMiB": gpus[0].memory_mib}
    assert (tmp_path / LEDGER_FILE).stat().st_mode & 0o777 == 0o644

    # unchanged: not rewritten until due; then rewritten with the next generation
    assert not writer.refresh({UID_A: a, UID_B: b}, inventory)
    clock.now += 11
    assert writer.refresh({UID_A: a, UID_B: b}, inventory)
    assert ledger_doc(tmp_path)["generation"] == 2

    # the annotation patched after bind: ignored, counted once
    patched = use(pod(UID_A, "a", [(gpus[2].uuid, 2, 81920, 100)]))
    writer.refresh({UID_A: patched, UID_B: b}, inventory)
    writer.refresh({UID_A: patched, UID_B: b}, inventory)
    assert writer.ignored_changes == 1
    assert ledger_doc(tmp_path)["pods"][0]["assignment"] == a.annotation

    # a restarted agent continues the order, the pinned annotation and the generation
    again = LedgerWriter(NODE, tmp_path, ready=lambda: True, clock=clock)
    assert again.refresh({UID_B: b, UID_A: patched}, inventory)
    doc = ledger_doc(tmp_path)
    assert [p["uid"] for p in doc["pods"]] == [UID_A, UID_B] and doc["generation"] == 3
    assert doc["pods"][0]["assignment"] == a.annotation

    # a pod that finished or was deleted leaves
    again.refresh({UID_B: b}, inventory)
    assert [p["uid"] for p in ledger_doc(tmp_path)["pods"]] == [UID_B]


def test_a_foreign_or_broken_ledger_file_is_not_resumed(tmp_path: Path) -> None:
    inventory = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE).scan()
    (tmp_path / LEDGER_FILE).write_text('{"version": 1, "node": "other"')
    writer = LedgerWriter(NODE, tmp_path, ready=lambda: True, clock=Clock())
    assert writer.refresh({}, inventory)
    assert ledger_doc(tmp_path)["generation"] == 1


@pytest.fixture(scope="session")
def ledger_check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nri_tool("ledger-check", tmp_path_factory.mktemp("go"))


def test_the_plugin_admits_from_the_agents_ledger_and_refuses_a_double_booking(
    tmp_path: Path, ledger_check: Path
) -> None:
    gpus = gpus_of()
    inventory = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE).scan()
    uid_c = "3c9d1e2f-1111-4222-8333-444455556666"
    pods = {
        UID_A: use(pod(UID_A, "a", [(gpus[0].uuid, 0, gpus[0].memory_mib, 100)])),
        UID_B: use(pod(UID_B, "b", [(gpus[1].uuid, 1, 40960, 50)])),
        # a later pod given GPU 0 again (a double booking) and a slice that no longer fits on GPU 1
        uid_c: use(pod(uid_c, "c", [(gpus[0].uuid, 0, 1024, 10), (gpus[1].uuid, 1, 50000, 50)])),
    }
    LedgerWriter(NODE, tmp_path, ready=lambda: True, clock=Clock()).refresh(pods, inventory)
    out = subprocess.run(
        [str(ledger_check), str(tmp_path / LEDGER_FILE), NODE, UID_A, UID_B, uid_c],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr  # the plugin's strict reader accepts what the agent wrote
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"OK node={NODE} generation=1 gpus=8 pods=3"), lines
    assert lines[1:3] == [f"admit {UID_A}", f"admit {UID_B}"]
    assert lines[3].startswith(f"refuse {uid_c}: GPU {gpus[0].uuid} is held whole by pod ml/a"), lines


# ---- the poll loop, end to end ----------------------------------------------------------------


class QuietKube:
    """The API server stand-in; Events are kept (the hand-off's warnings become Events)."""

    def __init__(self) -> None:
        self.gpunode: dict[str, Any] = {"metadata": {"name": NODE, "generation": 1}, "spec": {}}
        self.events: list[tuple[str, str]] = []

    def ensure_gpunode(self, node: str, node_uid: str) -> dict[str, Any]:
        return self.gpunode

    def node_event(self, node: str, node_uid: str, kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

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
    state: Path, cgroup_root: Path, proc: Path, wall: Callable[[], float], *, with_ledger: bool
) -> tuple[NodeAgent, SimulatedGpus, QuietKube]:
    """The agent of a node with (simulated) GPUs, its regions, records and ledger under `state`."""
    sim = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE)
    regions = RegionKeeper(state / "containers")
    kube = QuietKube()
    agent = NodeAgent(
        NODE,
        "node-uid",
        sim,
        kube,  # type: ignore[arg-type]
        ThreadPoolExecutor(1),
        agent_version="t",
        regions=regions,
        ledger=LedgerWriter(NODE, state, ready=lambda: True, clock=time.monotonic) if with_ledger else None,
        containers=ContainerTender(state, regions, cgroup_root=cgroup_root, proc_root=proc, clock=wall),
    )
    agent.start()
    return agent, sim, kube


@pytest.mark.parametrize(
    ("version", "cgroups_path", "rel"),
    [(2, SYSTEMD_PATH, SYSTEMD_DIR), (1, CGROUPFS_PATH, CGROUPFS_PATH[1:])],
)
def test_the_poll_loop_registers_host_pids_reclaims_and_removes_regions(
    tmp_path: Path, version: int, cgroups_path: str, rel: str
) -> None:
    state, cg, proc = tmp_path / "run-neuronetes", tmp_path / "sys-fs-cgroup", tmp_path / "proc"
    wall = Clock()
    wall.now = time.time()
    agent, sim, kube = real_node_agent(state, cg, proc, wall, with_ledger=True)
    regions = agent.regions
    assert regions is not None
    gpu = sim.scan().gpus[0]
    agent.set_pod(UID_A, use(pod(UID_A, "trainer-0", [(gpu.uuid, 0, 81920, 100)], container="trainer")))
    agent.tick()
    region_path = regions.path(UID_A, "trainer")
    assert region_path.is_file()  # the region, and the ledger the plugin checks it against
    assert [p["uid"] for p in ledger_doc(state)["pods"]] == [UID_A]

    # the container starts: the plugin's record, its cgroup with two processes, the shim's slots
    write_record(state, UID_A, "trainer", cgroups_path, wall.now)
    cgroup = cgroup_tree(cg, version, rel, 4242, 4300)
    fake_process(proc, 4242, (4242, 1), 5000)
    fake_process(proc, 4300, (4300, 2), 5100)
    fake_process(proc, 4400, (4400, 3), 5200)  # claims a slot, but is not in the container's cgroup
    with shim.open_region(region_path) as region:
        claim(region, 0, 1, 5000, used_mib=300)
        claim(region, 1, 2, 5100, used_mib=100)
        claim(region, 2, 3, 5200, used_mib=10)
    sim.set_process(gpu.uuid, 4242, 300 * MIB)
    sim.set_process(gpu.uuid, 4300, 100 * MIB)
    agent.tick()

    def slots() -> list[tuple[int, int]]:
        with shim.open_region(region_path, writable=False) as r:
            view = r.snapshot()
        return [(int(view.procs[i].state), int(view.procs[i].host_pid)) for i in range(3)]

    assert slots() == [(shim.SLOT_ACTIVE, 4242), (shim.SLOT_ACTIVE, 4300), (shim.SLOT_ACTIVE, 0)]

    # process 4300 dies: its slot stays charged while NVML shows its memory, then is freed
    shutil.rmtree(proc / "4300")
    (cgroup / "cgroup.procs").write_text("4242\n")
    agent.tick()
    assert slots()[1] == (shim.SLOT_DEAD, 4300)
    sim.set_process(gpu.uuid, 4300, 0)
    agent.tick()
    assert slots()[1][0] == shim.SLOT_FREE and agent.counters.slots_reclaimed == 1

    # the pod is deleted from the API server while its container still runs: the region stays
    agent.set_pod(UID_A, None)
    agent.tick()
    agent.tick()
    assert region_path.is_file()
    assert ledger_doc(state)["pods"] == []
    # the container is gone (cgroup removed; the plugin did not remove the record: it was down)
    shutil.rmtree(cg)
    agent.tick()
    agent.tick()
    assert not region_path.parent.parent.exists()
    assert (state / RECORDS_DIR / f"{UID_A}.trainer.json").exists()  # within the grace time
    wall.now += 61
    agent.tick()
    assert not (state / RECORDS_DIR / f"{UID_A}.trainer.json").exists()
    assert all(r != "GPUContainerHandoff" for r, _ in kube.events), kube.events
    sim.close()


def test_a_record_naming_another_region_or_an_unknown_cgroup_form_is_reported(tmp_path: Path) -> None:
    state = tmp_path / "state"
    regions = RegionKeeper(tmp_path / "elsewhere")
    tender = ContainerTender(state, regions, cgroup_root=tmp_path / "cg", proc_root=tmp_path, clock=time.time)
    write_record(state, UID_A, "trainer", SYSTEMD_PATH, time.time())
    cgroup_tree(tmp_path / "cg", 2, SYSTEMD_DIR, 1)
    report = tender.tend({}, [])
    assert report.live == {UID_A} and report.registered == 0
    assert len(report.warnings) == 1 and "disagree" in report.warnings[0]
    write_record(state, UID_B, "main", "kubepods:cri-o:abc", time.time())
    report = tender.tend({}, [])
    assert len(report.warnings) == 2 and "'kubepods:cri-o:abc' is of no known form" in report.warnings[1]


def test_a_hand_off_warning_is_one_event_until_it_clears(tmp_path: Path) -> None:
    state = tmp_path / "state"
    agent, sim, kube = real_node_agent(
        state, tmp_path / "cg", tmp_path / "proc", time.time, with_ledger=False
    )
    bad = write_record(state, UID_A, "trainer", SYSTEMD_PATH, time.time())
    bad.write_text("{")

    def handoff_events() -> int:
        return sum(reason == "GPUContainerHandoff" for reason, _ in kube.events)

    agent.tick()
    agent.tick()
    assert handoff_events() == 1
    bad.unlink()
    agent.tick()
    bad.write_text("{")
    agent.tick()
    assert handoff_events() == 2
    sim.close()


def test_an_agent_for_a_real_node_hands_off_and_a_fleet_does_not(tmp_path: Path) -> None:
    from neuronetes.agent.daemon.fleet import AgentProcess, AgentSettings

    sim = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE)
    state = tmp_path / "state"
    settings = AgentSettings(
        node=NODE, state_dir=state, region_dir=state / "containers", cgroup_root=tmp_path
    )
    process = AgentProcess(None, settings)  # type: ignore[arg-type]
    process.kube, process._local = QuietKube(), sim  # type: ignore[assignment]
    process._start_node(NODE, {"metadata": {"name": NODE, "uid": "node-uid"}})
    agent = process.agents[NODE]
    assert agent.ledger is not None and agent.containers is not None
    assert agent.containers.cgroup_root == tmp_path and agent.containers.regions is agent.regions
    agent.tick()
    assert not (state / LEDGER_FILE).exists()  # the pod watch has not listed the node's pods yet
    process._pods_listed.set()
    agent.tick()
    assert ledger_doc(state)["node"] == NODE
    process.stop()

    fleet = AgentProcess(None, AgentSettings(simulate_nodes="x=y"))  # type: ignore[arg-type]
    fleet.kube = QuietKube()  # type: ignore[assignment]
    fleet._start_node(
        "sim-1",
        {"metadata": {"name": "sim-1", "labels": {LABEL_PROFILE: "dgx-a100-80gb"}}},
    )
    assert fleet.agents["sim-1"].ledger is None and fleet.agents["sim-1"].containers is None
    fleet.stop()


def test_a_pod_deleted_while_the_watch_was_down_is_reported_deleted_at_the_relist() -> None:
    from neuronetes.agent.daemon.kube import Informer

    lists = [
        [pod(UID_A, "a", []), pod(UID_B, "b", [])],
        [pod(UID_B, "b", [])],  # a was deleted while the watch was broken
    ]

    class ListingKube:
        def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            return {"metadata": {"resourceVersion": "7"}, "items": lists.pop(0)}

    events: list[tuple[str, Any]] = []
    informer = Informer(ListingKube(), "/api/v1/pods", lambda k, o: events.append((k, o)))  # type: ignore[arg-type]
    informer._list()
    informer._list()
    assert [(k, o["metadata"]["uid"]) for k, o in events] == [
        ("SYNC", UID_A),
        ("SYNC", UID_B),
        ("SYNC", UID_B),
        ("DELETED", UID_A),
    ]
    assert events[-1][1] == {
        "metadata": {"name": "a", "namespace": "ml", "uid": UID_A},
        "spec": {"nodeName": NODE},
    }


def own_cgroup() -> str | None:
    """This process's cgroup path in a hierarchy `cgroup_dir` tries (v2, or v1 pids/memory/cpu,cpuacct/
    systemd), when it is not the root cgroup."""
    tried = {"", "pids", "memory", "cpu,cpuacct", "name=systemd"}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers in tried and path != "/":
            return path
    return None


def test_the_host_pid_of_a_real_process_is_found_through_its_real_cgroup(tmp_path: Path) -> None:
    """The kernel's own cgroup tree and /proc, not fakes: this test process is the container."""
    path = own_cgroup()
    if path is None:
        pytest.skip("this process is in the root cgroup: nothing to resolve")
    where = cgroup_dir(path, Path("/sys/fs/cgroup"))
    assert where is not None, path
    state = tmp_path / "state"
    regions = RegionKeeper(state / "containers")
    region_path = regions.path(UID_A, "main")
    region_path.parent.mkdir(parents=True)
    me = os.getpid()
    status = Path(f"/proc/{me}/status").read_text().splitlines()
    pid_in_container = int(next(line for line in status if line.startswith("NSpid:")).split()[-1])
    start = start_ticks(Path("/proc"), me)
    assert start is not None
    with shim.create_region(region_path, [shim.DeviceLimit.from_mib("GPU-" + UID_A, 1024, 8192)]) as region:
        claim(region, 0, pid_in_container, start, used_mib=64)  # what the shim in this process would write
    write_record(state, UID_A, "main", path, time.time())
    tender = ContainerTender(state, regions, clock=time.time)
    report = tender.tend({}, [])
    assert report.live == {UID_A} and report.registered == 1 and report.warnings == []
    with shim.open_region(region_path, writable=False) as region:
        assert region.snapshot().procs[0].host_pid == me
