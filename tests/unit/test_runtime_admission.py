"""The runtime's admission table (docs/runtime.md, "Admission"), one test per row, and the container
limits the scheduler never promises more than (a region the node agent's own code writes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_fakes import FakeClock, busy, fake_scheduler

from neuronetes import runtime
from neuronetes.runtime import limits
from neuronetes_agent.region import (
    DeviceLimit,
    NnContainer,
    NnControl,
    NnDeviceControl,
    NnFileHeader,
    create_region,
    field_offset,
)

MIB = 1 << 20


def _sched(clock: FakeClock, memory: int = 100 * MIB) -> runtime.Scheduler:
    environ = {"CUDA_DEVICE_MEMORY_LIMIT": str(memory)}  # a fixed capacity whatever the machine
    return fake_scheduler(clock, environ=environ)


def test_row1_guaranteed_that_fits_is_admitted_with_hard_memory_and_reserved_bandwidth() -> None:
    clock = FakeClock()
    sched = _sched(clock)
    task_id = sched.submit(busy(clock, 0.001, tiles=2), memory=10 * MIB, bandwidth=0.5, policy="guaranteed")
    assert sched.stats(task_id)["state"] == "running"
    assert sched.stats(task_id)["memory_usage"] == 10 * MIB
    assert sched.root.reserved == pytest.approx(0.5)


def test_row2_guaranteed_over_free_memory_is_rejected_naming_the_shortfall() -> None:
    clock = FakeClock()
    sched = _sched(clock)
    sched.submit(busy(clock, 0.001), memory=70 * MIB, bandwidth=0.2, policy="guaranteed")
    with pytest.raises(runtime.AdmissionError, match=f"memory .* short by {10 * MIB} bytes") as caught:
        sched.submit(busy(clock, 0.001), memory=40 * MIB, bandwidth=0.2, policy="guaranteed")
    assert caught.value.resource == "memory" and caught.value.shortfall == 10 * MIB


def test_row3_guaranteed_over_free_bandwidth_is_rejected_naming_the_shortfall() -> None:
    clock = FakeClock()
    sched = _sched(clock)
    sched.submit(busy(clock, 0.001), bandwidth=0.7, policy="guaranteed")
    with pytest.raises(
        runtime.AdmissionError, match=r"bandwidth 0.5 requested, 0.3 free: short by 0.2"
    ) as caught:
        sched.submit(busy(clock, 0.001), bandwidth=0.5, policy="guaranteed")
    assert caught.value.resource == "bandwidth"


def test_row4_guaranteed_without_bandwidth_is_a_bad_argument() -> None:
    with pytest.raises(runtime.InvalidArgument, match=r"^bandwidth: a guaranteed task needs"):
        _sched(FakeClock()).submit(lambda: None, policy="guaranteed")


def test_row5_burstable_that_fits_is_admitted_with_hard_memory() -> None:
    clock = FakeClock()
    sched = _sched(clock)
    task_id = sched.submit(busy(clock, 0.001, tiles=2), memory=10 * MIB, bandwidth=0.3, policy="burstable")
    assert sched.stats(task_id)["state"] == "running" and sched.root.reserved == pytest.approx(0.3)


def test_row6_burstable_over_free_memory_is_queued_until_a_finish_frees_it() -> None:
    clock = FakeClock()
    sched = _sched(clock)
    holder = sched.submit(busy(clock, 0.001, tiles=5), memory=80 * MIB, bandwidth=0.5, policy="guaranteed")
    waiter = sched.submit(busy(clock, 0.001, tiles=5), memory=40 * MIB, policy="burstable")
    assert sched.stats(waiter)["state"] == "queued" and sched.stats(waiter)["queue_position"] == 0
    sched.run(until=holder)
    sched.step()
    assert sched.stats(waiter)["queue_position"] is None
    sched.run()
    assert sched.stats(waiter)["state"] == "finished" and sched.stats(waiter)["tiles_executed"] == 6


def test_row7_burstable_over_free_bandwidth_is_queued_until_a_share_frees() -> None:
    clock = FakeClock()
    sched = _sched(clock)
    holder = sched.submit(busy(clock, 0.001, tiles=3), bandwidth=0.8, policy="guaranteed")
    waiter = sched.submit(busy(clock, 0.001, tiles=3), bandwidth=0.4, policy="burstable")
    assert sched.stats(waiter)["state"] == "queued"
    sched.run()
    assert sched.stats(holder)["state"] == sched.stats(waiter)["state"] == "finished"


def test_row8_best_effort_that_fits_is_admitted_soft_and_its_bandwidth_is_not_reserved() -> None:
    clock = FakeClock()
    sched = _sched(clock)
    task_id = sched.submit(busy(clock, 0.001, tiles=2), memory=10 * MIB, bandwidth=0.9)
    assert sched.stats(task_id)["state"] == "running" and sched.root.reserved == 0
    sched.submit(busy(clock, 0.001), bandwidth=0.5, policy="guaranteed")  # the 0.9 cap reserved nothing


def test_row9_best_effort_over_free_memory_is_queued() -> None:
    clock = FakeClock()
    sched = _sched(clock)
    sched.submit(busy(clock, 0.001, tiles=3), memory=90 * MIB, bandwidth=0.1, policy="guaranteed")
    waiter = sched.submit(busy(clock, 0.001, tiles=3), memory=20 * MIB)
    assert sched.stats(waiter)["state"] == "queued"
    sched.run()
    assert sched.stats(waiter)["state"] == "finished"


@pytest.mark.parametrize("policy", ["burstable", "best_effort"])
def test_row10_any_task_asking_more_memory_than_its_pool_holds_is_rejected(policy: str) -> None:
    with pytest.raises(runtime.AdmissionError, match="more than its pool holds"):
        _sched(FakeClock()).submit(lambda: None, memory=101 * MIB, policy=policy)


def test_row11_a_share_over_the_partitions_whole_bandwidth_is_rejected() -> None:
    clock = FakeClock()
    sched = _sched(clock)
    sched.create_slice("small", bandwidth=0.3)
    with pytest.raises(runtime.AdmissionError, match="more than its partition has"):
        sched.submit(lambda: None, bandwidth=0.4, policy="burstable", slice="small")


def test_the_control_file_offsets_are_the_agents() -> None:
    assert field_offset(NnFileHeader, "magic") == limits.OFF_MAGIC
    assert field_offset(NnFileHeader, "version_major") == limits.OFF_VERSION_MAJOR
    assert field_offset(NnFileHeader, "flags") == limits.OFF_FLAGS
    container = field_offset(NnControl, "container")
    assert container + field_offset(NnContainer, "memory_limit_bytes") == limits.OFF_CONTAINER_MEMORY_LIMIT
    assert container + field_offset(NnContainer, "device_count") == limits.OFF_CONTAINER_DEVICE_COUNT
    assert field_offset(NnControl, "devices") == limits.OFF_DEVICES
    assert field_offset(NnDeviceControl, "memory_limit_bytes") == limits.OFF_DEVICE_MEMORY_LIMIT
    assert field_offset(NnDeviceControl, "memory_total_bytes") == limits.OFF_DEVICE_MEMORY_TOTAL
    assert field_offset(NnDeviceControl, "compute_share_percent") == limits.OFF_DEVICE_COMPUTE_SHARE
    assert field_offset(NnDeviceControl, "flags") == limits.OFF_DEVICE_FLAGS


@pytest.mark.skipif(Path(limits.REGION_DIR, "control").exists(), reason="this machine has a real region")
def test_inside_a_slice_the_scheduler_promises_no_more_than_the_containers_limits(tmp_path: Path) -> None:
    device = DeviceLimit(
        "GPU-0000", memory_limit_bytes=64 * MIB, memory_total_bytes=80 * 1024 * MIB, compute_share_percent=30
    )
    create_region(tmp_path, [device], memory_limit_bytes=48 * MIB, admitted=True).close()
    clock = FakeClock()
    sched = fake_scheduler(
        clock, environ={"NEURONETES_REGION_DIR": str(tmp_path), "CUDA_DEVICE_SM_LIMIT": "10"}
    )
    assert sched.root.memory_bytes == 48 * MIB and sched.root.bandwidth == pytest.approx(0.3)
    assert sched.limits.source == str(tmp_path / "control")  # a cluster region: the variables are ignored
    with pytest.raises(runtime.AdmissionError, match="bandwidth"):
        sched.submit(lambda: None, bandwidth=0.4, policy="guaranteed")
    with pytest.raises(runtime.AdmissionError, match="memory"):
        sched.submit(lambda: None, memory=49 * MIB, bandwidth=0.1, policy="guaranteed")
    # Leftovers stay inside the container's share too: a lone best_effort task gets 30 %.
    task_id = sched.submit(busy(clock, 0.001))
    sched.run(until=1.0)
    assert sched.task(task_id).total_s == pytest.approx(0.3, abs=0.002)


@pytest.mark.skipif(Path(limits.REGION_DIR, "control").exists(), reason="this machine has a real region")
def test_a_workstation_region_is_narrowed_by_the_variables_and_a_broken_one_fails_closed(
    tmp_path: Path,
) -> None:
    device = DeviceLimit(
        "GPU-0000", memory_limit_bytes=64 * MIB, memory_total_bytes=80 * 1024 * MIB, compute_share_percent=50
    )
    create_region(tmp_path, [device], admitted=True, workstation=True).close()
    found = runtime.container_limits(
        {
            "NEURONETES_REGION_DIR": str(tmp_path),
            "CUDA_DEVICE_MEMORY_LIMIT": "16m",
            "CUDA_DEVICE_SM_LIMIT_0": "20",
        }
    )
    assert found.memory_bytes == 16 * MIB and found.bandwidth == pytest.approx(0.2)
    with pytest.raises(runtime.InvalidArgument, match=r"^CUDA_DEVICE_SM_LIMIT: "):
        runtime.container_limits({"CUDA_DEVICE_SM_LIMIT": "150"})
    (tmp_path / "control").write_bytes(b"\0" * limits.CONTROL_SIZE)
    with pytest.raises(runtime.ContainerLimitsError, match="bad magic"):
        runtime.container_limits({"NEURONETES_REGION_DIR": str(tmp_path)})
    assert runtime.container_limits({}) == runtime.ContainerLimits()
