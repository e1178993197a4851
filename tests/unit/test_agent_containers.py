"""The container records the NRI plugin writes and what the agent does with them
(docs/contracts.md "The container records", docs/gpu-health.md "Shim regions"): the record's format
(pinned by `tests/fixtures/container-record.json`, which the Go writer's test produces), both
cgroup path forms on cgroup v1 and v2, and the whole poll loop on a fake cgroup tree, a fake
``/proc`` and the simulated NVML backend — host PIDs registered, dead slots ordered reclaimed once NVML
shows the memory released, regions removed when the last container is gone — and once on this
machine's real cgroup tree and ``/proc``."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from handoff_support import (
    CGROUPFS_PATH,
    CONTAINER_ID,
    FIXTURES,
    SYSTEMD_DIR,
    SYSTEMD_PATH,
    UID_A,
    UID_B,
    Clock,
    cgroup_tree,
    ledger_doc,
    pod,
    real_node_agent,
    use,
    write_record,
)
from prometheus_client import CollectorRegistry, generate_latest
from region_fakes import MIB, apply_orders, claim, fake_process

from neuronetes import contracts as c
from neuronetes_agent import region as shim
from neuronetes_agent.daemon.containers import RECORDS_DIR, ContainerTender, cgroup_dir, read_records
from neuronetes_agent.daemon.exporter import AgentCollector
from neuronetes_agent.daemon.hostpids import start_ticks
from neuronetes_agent.daemon.regions import RegionKeeper

pytestmark = pytest.mark.unit

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


# ---- the poll loop, end to end ----------------------------------------------------------------


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
    region_path = regions.directory(UID_A, "trainer")
    assert regions.control_path(UID_A, "trainer").is_file()  # the region, and the ledger the plugin checks
    assert regions.state_path(UID_A, "trainer").is_file()
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

    def slots() -> list[tuple[int, int, int]]:
        """(state the shim wrote, host PID and reclaim order the agent wrote) of the first slots."""
        with shim.open_region(region_path, writable=False) as r:
            control, state = r.snapshot_control(), r.read_state()
        return [
            (
                int(state.procs[i].state),
                int(control.procs[i].host_pid),
                int(control.procs[i].reclaim_claim_seq),
            )
            for i in range(3)
        ]

    assert slots() == [(shim.SLOT_ACTIVE, 4242, 0), (shim.SLOT_ACTIVE, 4300, 0), (shim.SLOT_ACTIVE, 0, 0)]
    assert regions.registered_host_pids(UID_A, "trainer") == {4242, 4300}

    # process 4300 dies: its slot stays charged while NVML shows its memory, then is ordered freed
    shutil.rmtree(proc / "4300")
    (cgroup / "cgroup.procs").write_text("4242\n")
    agent.tick()
    assert slots()[1] == (shim.SLOT_ACTIVE, 4300, 0)  # no order: the driver still holds its memory
    sim.set_process(gpu.uuid, 4300, 0)
    agent.tick()
    assert slots()[1] == (shim.SLOT_ACTIVE, 4300, 2) and agent.counters.slots_reclaimed == 1
    agent.tick()
    assert agent.counters.slots_reclaimed == 1  # ordered once
    with shim.open_region(region_path) as r:
        assert apply_orders(r) == [1]  # the shim's next lock frees it
    assert slots()[1][0] == shim.SLOT_FREE
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(lambda: [agent]))
    exported = generate_latest(registry).decode()
    assert f'{c.METRIC_AGENT_SLOTS_RECLAIMED}{{Hostname="{agent.node}"}} 1.0' in exported

    # the pod is deleted from the API server while its container still runs: the region stays
    agent.set_pod(UID_A, None)
    agent.tick()
    agent.tick()
    assert regions.control_path(UID_A, "trainer").is_file()
    assert ledger_doc(state)["pods"] == []
    # the container is gone (cgroup removed; the plugin did not remove the record: it was down)
    shutil.rmtree(cg)
    agent.tick()
    agent.tick()
    assert not region_path.parent.exists()
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
    region_path = regions.directory(UID_A, "main")
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
        assert region.snapshot_control().procs[0].host_pid == me
    assert regions.registered_host_pids(UID_A, "main") == {me}
