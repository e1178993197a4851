"""XID classification, thermal and ECC rules, the GPU state machine, and the simulated backend."""

from __future__ import annotations

import time

import msgspec
import pytest

from neuronetes import contracts as c
from neuronetes.api import models as m
from neuronetes.model import GpuHealth
from neuronetes.profiles import PROFILES, node_labels, node_resources
from neuronetes_agent.daemon.devices import GpuLost
from neuronetes_agent.daemon.health import GpuHealthState, Phase, Recovery, Usage, classify_xid
from neuronetes_agent.daemon.publish import gpu_capacity, gpu_labels, gpunode_status
from neuronetes_agent.daemon.simulated import SimulatedGpus

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_application_xids_change_nothing(xid: int) -> None:
    assert classify_xid(xid)[0] is Recovery.IGNORE
    h = GpuHealthState()
    h.on_xid(xid)
    assert h.state(Usage(1, 1)) == (GpuHealth.IN_USE, "") and h.last_xid == xid


@pytest.mark.parametrize(
    ("xid", "recovery"),
    [
        (48, Recovery.RESET),
        (64, Recovery.RESET),
        (74, Recovery.RESET),
        (95, Recovery.RESET),
        (79, Recovery.REBOOT),
        (63, Recovery.DRAIN),
        (94, Recovery.DRAIN),
        (92, Recovery.WARN),
        (9999, Recovery.DRAIN),
    ],
)
def test_catalog(xid: int, recovery: Recovery) -> None:
    assert classify_xid(xid)[0] is recovery


def test_critical_xid_evicts_then_resets_then_returns() -> None:
    h = GpuHealthState()
    busy, empty = Usage(1, 1), Usage()
    h.on_xid(48)
    assert h.state(busy)[0] is GpuHealth.OFFLINE and "XID 48" in h.state(busy)[1]
    assert h.needs_eviction(busy) and not h.ready_to_reset(busy)
    assert not h.needs_eviction(empty) and h.ready_to_reset(empty)
    h.reset_started()
    assert h.state(empty)[0] is GpuHealth.RESETTING
    h.reset_finished(True)
    assert h.state(empty) == (GpuHealth.AVAILABLE, "")


def test_failed_reset_stays_offline_until_online() -> None:
    h = GpuHealthState()
    h.on_xid(74)
    h.reset_started()
    h.reset_finished(False)
    assert h.fault is not None and h.fault.phase is Phase.FAILED
    assert h.state(Usage())[0] is GpuHealth.OFFLINE and not h.ready_to_reset(Usage())
    h.on_online()
    assert h.state(Usage())[0] is GpuHealth.AVAILABLE


def test_off_the_bus_needs_a_reboot_and_drain_waits_for_users() -> None:
    h = GpuHealthState()
    h.on_xid(79)
    assert h.lost and h.state(Usage())[0] is GpuHealth.OFFLINE and not h.ready_to_reset(Usage())
    d = GpuHealthState()
    d.on_xid(63)
    assert d.state(Usage(1, 1))[0] is GpuHealth.DEGRADED and not d.needs_eviction(Usage(1, 1))
    assert d.ready_to_reset(Usage())
    d.on_xid(48)  # a worse fault replaces the milder one
    assert d.fault is not None and d.fault.recovery is Recovery.RESET


def test_thermal_pause_with_hysteresis_and_usage_states() -> None:
    h = GpuHealthState()
    assert h.state(Usage(1, 0))[0] is GpuHealth.ALLOCATED
    h.on_temperature(90)
    assert h.state(Usage(1, 1))[0] is GpuHealth.DEGRADED
    h.on_temperature(83)  # still above the resume threshold
    assert h.state(Usage())[0] is GpuHealth.DEGRADED
    h.on_temperature(79)
    assert h.state(Usage(1, 1))[0] is GpuHealth.IN_USE


def test_simulated_dgx_a100_inventory() -> None:
    sim = SimulatedGpus(PROFILES["dgx-a100-80gb"], "dgx-0")
    started = time.perf_counter()
    inv = sim.scan()
    assert time.perf_counter() - started < 1.0
    assert len(inv.gpus) == 8
    assert [g.uuid for g in inv.gpus] == [c.simulated_gpu_uuid("dgx-0", k) for k in range(8)]
    assert all(g.nvlink_peers == tuple(k for k in range(8) if k != g.index) for g in inv.gpus)
    assert {g.numa_node for g in inv.gpus} == {0, 1} and {g.socket for g in inv.gpus} == {0, 1}
    assert inv.gpus[0].nvlink_bandwidth_gbps == 600.0 and not inv.gpus[0].mig_enabled


def test_simulated_mig_profile_and_publication_match_the_node_profile() -> None:
    profile = PROFILES["a100-40gb-mig"]
    inv = SimulatedGpus(profile, "mig-0").scan()
    g = inv.gpus[0]
    assert g.mig_enabled and sorted(d.profile for d in g.mig_devices) == [
        "1g.5gb",
        "1g.5gb",
        "2g.10gb",
        "3g.20gb",
    ]
    assert all(d.uuid.startswith("MIG-") for d in g.mig_devices)
    assert len({d.uuid for x in inv.gpus for d in x.mig_devices}) == 32
    spec = profile.node_spec("mig-0")
    expected = node_labels(spec)
    assert {k: v for k, v in gpu_labels("mig-0", inv).items()} == {
        k: expected.get(k) for k in gpu_labels("mig-0", inv)
    }
    everything = {g.uuid for g in inv.gpus}
    resources = {k: v for k, v in node_resources(spec).items() if k.startswith(c.RESOURCE_PREFIX)}
    assert gpu_capacity("mig-0", inv, everything) == resources
    # One GPU out: its MIG instances leave the capacity.
    fewer = gpu_capacity("mig-0", inv, everything - {inv.gpus[0].uuid})
    assert fewer[c.mig_resource_name("1g.5gb")] == "14" and fewer[c.mig_resource_name("3g.20gb")] == "7"


def test_gpunode_status_has_every_field_and_decodes() -> None:
    from datetime import UTC, datetime

    inv = SimulatedGpus(PROFILES["a100-40gb-mig"], "mig-0").scan()
    states = {inv.gpus[1].uuid: (GpuHealth.OFFLINE, "XID 48: double-bit ECC error")}
    allocations = {inv.gpus[0].uuid: [{"namespace": "a", "pod": "p", "container": "c", "memoryMiB": 0}]}
    status = gpunode_status(
        inv,
        states,
        allocations,
        agent_version="0.1.0",
        generation=3,
        heartbeat=datetime.now(UTC),
        nvml_ok=True,
    )
    decoded = msgspec.convert(status, m.GPUNodeStatus)
    assert decoded.gpu_count == 8 and decoded.healthy_gpus == 7
    # Every field the agent owns; migPlan is the operator's (its MIG layout controller).
    crd_fields = set(m.GPUNodeStatus.__struct_encode_fields__) - {"migPlan"}
    assert crd_fields <= set(status) and "migPlan" not in status
    gpu_fields = set(m.GpuInfo.__struct_encode_fields__)
    assert gpu_fields <= set(status["gpus"][0])
    assert status["gpus"][1]["health"] == "Offline"
    assert {x["type"]: x["status"] for x in status["conditions"]} == {
        "NVMLAvailable": "True",
        "Ready": "False",
    }


def test_fault_injection_api() -> None:
    sim = SimulatedGpus(PROFILES["t4x4-pcie"], "t4-0", reset_seconds=0.01)
    u = sim.scan().gpus[2].uuid
    sim.set_utilization(u, 70)
    sim.set_process(u, 4242, 2 << 30)
    sim.add_ecc_errors(u, corrected=5, uncorrected=1)
    assert "temperatureCelsius=91" in sim.inject(u, {"temperatureCelsius": 91})
    s = sim.sample(u)
    assert (s.utilization_percent, s.memory_used_bytes, s.temperature_celsius) == (70, 2 << 30, 91)
    assert (s.ecc_corrected_total, s.ecc_uncorrected_total) == (5, 1)
    sim.inject(u, {"xid": 48})
    assert [(e.uuid, e.xid) for e in sim.wait_xids(0)] == [(u, 48)]
    assert sim.reset(u) and sim.sample(u).ecc_uncorrected_total == 0
    sim.fall_off_bus(u)
    with pytest.raises(GpuLost):
        sim.sample(u)
    assert not sim.reset(u)
    sim.repair(u)
    assert sim.sample(u).memory_used_bytes == 0
    for bad in ({}, {"xid": "48"}, {"xid": True}, {"nope": 1}, {"offTheBus": 1}):
        with pytest.raises(ValueError):
            sim.inject(u, bad)
    with pytest.raises(KeyError):
        sim.inject("GPU-nope", {"xid": 48})
