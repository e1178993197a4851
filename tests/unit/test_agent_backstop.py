"""NVML reconciliation in the agent (`neuronetes_agent.daemon.backstop` and `NodeAgent`; docs/gpu-health.md
"Reconciliation"): the agent of a node with simulated GPUs, real shim regions, the NRI plugin's
container records, a cgroup tree as the kernel shows it and a fake ``/proc``. A process in a
shared-GPU container that NVML lists but that holds no registered slot gets its pod evicted after
the grace, with a Warning Event on the pod and ``neuronetes_slice_evictions_total``; the same on a
whole-GPU pod, and a process of another pod, do nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from handoff_support import UID_A, UID_B, Clock, cgroup_tree, pod, real_node_agent, use, write_record
from prometheus_client import CollectorRegistry, generate_latest
from region_fakes import MIB, claim, fake_process

from neuronetes import contracts as c
from neuronetes_agent import region as shim
from neuronetes_agent.daemon.backstop import cgroup_members
from neuronetes_agent.daemon.exporter import AgentCollector
from neuronetes_agent.daemon.node import NodeAgent
from neuronetes_agent.daemon.reconcile import Mode, Policy

pytestmark = pytest.mark.unit

GIB = 1 << 30
UID_C = "c0ffee00-0000-4000-8000-0000000000cc"
SLICE = "/kubepods/burstable/pod{uid}/{cid}"


def cgroups_path(uid: str, cid: str) -> str:
    return SLICE.format(uid=uid, cid=cid)


def exported(agent: NodeAgent) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(lambda: [agent]))
    return generate_latest(registry).decode()


@pytest.mark.parametrize("mode", [Mode.ENFORCE, Mode.REPORT])
def test_an_unshimmed_process_on_a_shared_gpu_gets_its_pod_evicted_a_whole_gpu_pod_does_not(
    tmp_path: Path, mode: Mode
) -> None:
    state, cg, proc = tmp_path / "run-neuronetes", tmp_path / "sys-fs-cgroup", tmp_path / "proc"
    wall, mono = Clock(), Clock()
    wall.now = time.time()
    agent, sim, kube = real_node_agent(
        state, cg, proc, wall, with_ledger=False, reconcile=(Policy(mode=mode, grace_s=30), mono)
    )
    regions = agent.regions
    assert regions is not None
    gpus = sim.scan().gpus
    shared, whole = gpus[0], gpus[1]
    # A: a 10 GiB slice of GPU 0; B: GPU 1 whole; C: a 20 GiB slice of GPU 0 beside A
    agent.set_pod(UID_A, use(pod(UID_A, "slice-a", [(shared.uuid, 0, 10240, 30)], container="trainer")))
    agent.set_pod(UID_B, use(pod(UID_B, "whole-b", [(whole.uuid, 1, whole.memory_mib, 100)])))
    agent.set_pod(UID_C, use(pod(UID_C, "slice-c", [(shared.uuid, 0, 20480, 50)])))
    agent.tick()  # the regions

    # the containers start: records, cgroups, processes
    cgroup_tree(cg, 2, "")
    for uid, name, cid, pids in (
        (UID_A, "trainer", "a" * 64, (4242, 4300)),
        (UID_B, "main", "b" * 64, (5000,)),
        (UID_C, "main", "c" * 64, (6000,)),
    ):
        write_record(state, uid, name, cgroups_path(uid, cid), wall.now)
        cgroup_tree(cg, 2, cgroups_path(uid, cid).lstrip("/"), *pids)
        for pid in pids:
            fake_process(proc, pid, (pid, pid - 4000), 9000 + pid)
    with shim.open_region(regions.directory(UID_A, "trainer")) as region:
        claim(region, 0, 242, 13242, used_mib=300)  # 4242 runs the shim; 4300 does not
    with shim.open_region(regions.directory(UID_C, "main")) as region:
        claim(region, 0, 2000, 15000, used_mib=1024)
    sim.set_process(shared.uuid, 4242, 300 * MIB)
    sim.set_process(shared.uuid, 4300, 3 * GIB)  # a static binary: NVML sees it, the region does not
    sim.set_process(shared.uuid, 6000, 1 * GIB)  # the neighbour, shimmed
    sim.set_process(whole.uuid, 5000, 40 * GIB)  # unshimmed too, but on a GPU nobody shares

    agent.tick()  # first seen: within the grace
    mono.now += 29
    agent.tick()
    assert kube.evictions == [] and kube.pod_events == []
    assert regions.registered_host_pids(UID_A, "trainer") == {4242}

    mono.now += 1
    agent.tick()  # 30 s: acted on
    agent.tick()  # once: the Event and the count are not repeated, the eviction waits its retry interval
    ((namespace, name, kind, reason, message),) = kube.pod_events
    assert (namespace, name, kind, reason) == ("ml", "slice-a", "Warning", "GPUUnshimmedProcess")
    assert "process 4300" in message and f"{3 * GIB} bytes" in message and f"{10240 * MIB} bytes" in message
    assert any(r == "GPUUnshimmedProcess" and "ml/slice-a" in m for r, m in kube.events)
    labels = f'Hostname="{agent.node}",namespace="ml",pod="slice-a",reason="unshimmed"'
    line = f"{c.METRIC_SLICE_EVICTIONS}{{{labels}}} 1.0"
    assert line in exported(agent)
    assert agent.counters.slice_evictions == {("ml", "slice-a", "unshimmed"): 1}
    if mode is Mode.ENFORCE:
        assert kube.evictions == [("ml", "slice-a")]
        assert "evicting the pod" in message
        assert any(
            r == "GPUPodEvicted" and "NVML reconciliation" in m and "4300" in m for r, m in kube.events
        )
    else:
        assert kube.evictions == [] and "not evicted" in message
    sim.close()


def test_over_the_limit_with_the_shim_in_every_process_is_found(tmp_path: Path) -> None:
    """A tenant that resets its usage in its own state file (its limit is in the agent's read-only
    control file): the shim lets it allocate, NVML shows it."""
    state, cg, proc = tmp_path / "state", tmp_path / "cg", tmp_path / "proc"
    wall, mono = Clock(), Clock()
    wall.now = time.time()
    agent, sim, kube = real_node_agent(
        state, cg, proc, wall, with_ledger=False, reconcile=(Policy(grace_s=0), mono)
    )
    gpu = sim.scan().gpus[0]
    agent.set_pod(UID_A, use(pod(UID_A, "greedy", [(gpu.uuid, 0, 4096, 25)])))
    agent.tick()
    write_record(state, UID_A, "main", cgroups_path(UID_A, "a" * 64), wall.now)
    cgroup_tree(cg, 1, cgroups_path(UID_A, "a" * 64).lstrip("/"), 4242)  # cgroup v1 this time
    fake_process(proc, 4242, (4242, 1), 5000)
    assert agent.regions is not None
    with shim.open_region(agent.regions.directory(UID_A, "main")) as region:
        claim(region, 0, 1, 5000, used_mib=100)
    sim.set_process(gpu.uuid, 4242, 4096 * MIB + GIB + 64 * MIB)  # exactly the tolerance: not over
    agent.tick()
    assert kube.evictions == []
    sim.set_process(gpu.uuid, 4242, 6 * GIB)
    agent.tick()
    assert kube.evictions == [("ml", "greedy")]
    ((_, _, _, reason, message),) = kube.pod_events
    assert reason == "GPUMemoryOverLimit" and f"{6 * GIB} bytes" in message and "[4242]" in message
    assert agent.counters.slice_evictions == {("ml", "greedy", "over_limit"): 1}
    sim.close()


def test_a_container_without_a_record_is_not_judged(tmp_path: Path) -> None:
    """No record, no cgroup: the agent cannot tell whose a process is, and never guesses."""
    wall, mono = Clock(), Clock()
    agent, sim, kube = real_node_agent(
        tmp_path / "s",
        tmp_path / "cg",
        tmp_path / "p",
        wall,
        with_ledger=False,
        reconcile=(Policy(grace_s=0), mono),
    )
    gpu = sim.scan().gpus[0]
    agent.set_pod(UID_A, use(pod(UID_A, "slice-a", [(gpu.uuid, 0, 1024, 10)])))
    sim.set_process(gpu.uuid, 4300, 30 * GIB)
    agent.tick()
    agent.tick()
    assert kube.evictions == [] and kube.pod_events == []
    sim.close()


def test_a_process_hidden_in_a_child_cgroup_is_still_the_containers(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    cgroup_tree(root, 2, "pod/ctr", 1, 2)
    cgroup_tree(root, 2, "pod/ctr/hidden/deeper", 3)
    cgroup_tree(root, 2, "pod/other", 4)
    assert cgroup_members(root / "pod" / "ctr") == {1, 2, 3}
    assert cgroup_members(root / "pod" / "ctr", limit=1) == {1, 2}
    assert cgroup_members(root / "absent") == frozenset()
