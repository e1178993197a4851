"""The agent's host-PID registration and dead-slot reclaim orders on real region files and fake /proc
trees (docs/contracts.md "Host PIDs", "Dead processes"): the agent reads the container's state
file into a private copy and writes only its own control file; `region_fakes.apply_orders` plays
the shim freeing an ordered slot at its next lock."""

from __future__ import annotations

from pathlib import Path

import pytest
from region_fakes import MIB, apply_orders, claim, fake_process, state_file

from neuronetes_agent import region as shim
from neuronetes_agent.daemon import hostpids
from neuronetes_agent.daemon.devices import GpuProcess
from neuronetes_agent.daemon.regions import RegionKeeper

pytestmark = pytest.mark.unit

UUID = "GPU-fa4e0000-0000-4000-8000-000000000000"


def new_region(path: Path) -> shim.Region:
    path.parent.mkdir(parents=True, exist_ok=True)
    return shim.create_region(path, [shim.DeviceLimit.from_mib(UUID, 1024, 8192)])


def cgroup(tmp_path: Path, *pids: int) -> Path:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("".join(f"{p}\n" for p in pids))
    return procs


def host_pids(region: shim.Region) -> list[int]:
    return [int(region.control.procs[i].host_pid) for i in range(4)]


def register(region: shim.Region, cgroup_procs: Path, proc: Path) -> int:
    return hostpids.register_host_pids(region, region.read_state(), cgroup_procs, proc)


def reclaim(region: shim.Region, is_alive, holds) -> list[int]:  # type: ignore[no-untyped-def]
    return hostpids.reclaim_dead(region, region.read_state(), is_alive, holds)


def slot_states(region: shim.Region, n: int = 3) -> list[int]:
    state = region.read_state()
    return [int(state.procs[i].state) for i in range(n)]


def test_start_time_is_field_22_even_with_parentheses_in_the_name(tmp_path: Path) -> None:
    fake_process(tmp_path, 50, (50, 7), 987654)
    assert hostpids.start_ticks(tmp_path, 50) == 987654
    assert hostpids.start_ticks(tmp_path, 51) is None


def test_a_cgroup_member_matching_pid_and_start_time_gets_its_host_pid(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_process(proc, 4242, (4242, 7), 1000)
    fake_process(proc, 4300, (4300, 100, 9), 1200)  # nested namespace: the innermost PID counts
    with new_region(tmp_path / "region") as region:
        claim(region, 0, 7, 1000)
        claim(region, 2, 9, 1200)
        assert register(region, cgroup(tmp_path, 4242, 4300), proc) == 2
        assert host_pids(region) == [4242, 0, 4300, 0]
        # the registration names the slot's claim and the start time the agent read itself
        assert (region.control.procs[2].claim_seq, region.control.procs[2].start_time_ticks) == (3, 1200)
        assert register(region, cgroup(tmp_path, 4242, 4300), proc) == 0


def test_a_process_outside_the_cgroup_is_never_registered(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_process(proc, 4242, (4242, 7), 1000)  # matches the slot, but is not in the container
    fake_process(proc, 5000, (5000, 8), 1000)
    with new_region(tmp_path / "region") as region:
        claim(region, 0, 7, 1000)
        assert register(region, cgroup(tmp_path, 5000), proc) == 0
        assert host_pids(region) == [0, 0, 0, 0]
        # A member whose NSpid does not start with the PID listed is not trusted either.
        fake_process(proc, 6000, (4242, 7), 1000)
        assert register(region, cgroup(tmp_path, 6000), proc) == 0
        assert register(region, tmp_path / "gone.procs", proc) == 0
        assert host_pids(region) == [0, 0, 0, 0]


def test_a_reused_pid_with_another_start_time_is_ignored(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_process(proc, 4242, (4242, 7), 2000)  # container PID 7 again, but a later process
    with new_region(tmp_path / "region") as region:
        claim(region, 0, 7, 1000)
        assert register(region, cgroup(tmp_path, 4242), proc) == 0
        assert host_pids(region) == [0, 0, 0, 0]


def test_a_dead_slot_stays_charged_until_the_driver_releases_it(tmp_path: Path) -> None:
    alive = {4242: 1000, 4300: 1200}
    driver = {4242: True}
    with new_region(tmp_path / "region") as region:
        claim(region, 0, 7, 1000, used_mib=300)
        claim(region, 1, 9, 1200, used_mib=100)
        claim(region, 2, 11, 1300, used_mib=50)  # never registered: left alone
        region.set_host_pid(0, 4242, claim_seq=1, start_time_ticks=1000)
        region.set_host_pid(1, 4300, claim_seq=2, start_time_ticks=1200)

        def is_alive(pid: int, start: int) -> bool:
            return alive.get(pid) == start

        def holds(pid: int) -> bool:
            return driver.get(pid, False)

        assert reclaim(region, is_alive, holds) == []
        assert slot_states(region) == [shim.SLOT_ACTIVE] * 3

        del alive[4242]
        assert reclaim(region, is_alive, holds) == []  # dead, but the driver still holds its memory
        assert region.control.procs[0].reclaim_claim_seq == 0
        assert region.read_state().usage.memory_used_bytes == 450 * MIB

        driver[4242] = False
        assert reclaim(region, is_alive, holds) == [0]
        assert (
            region.control.procs[0].reclaim_claim_seq == 1
            and region.control.container.reclaim_generation == 1
        )
        assert reclaim(region, is_alive, holds) == []  # ordered once
        assert apply_orders(region) == [0]  # the shim's next lock
        assert region.read_state().procs[0].state == shim.SLOT_FREE
        assert region.read_state().usage.memory_used_bytes == 150 * MIB
        assert slot_states(region)[1:] == [shim.SLOT_ACTIVE] * 2

        alive[4300] = 9999  # PID reused by another process: the one in the slot is gone
        assert reclaim(region, is_alive, holds) == [1]
        assert apply_orders(region) == [1]
        assert region.read_state().procs[2].state == shim.SLOT_ACTIVE


def test_reclaim_skips_a_slot_claimed_again_since_it_was_registered(tmp_path: Path) -> None:
    with new_region(tmp_path / "region") as region:
        claim(region, 0, 7, 1000, used_mib=10)  # claim 1
        region.set_host_pid(0, 4242, claim_seq=99, start_time_ticks=1000)  # another claim's PID
        assert reclaim(region, lambda pid, start: False, lambda pid: False) == []
        assert region.control.procs[0].reclaim_claim_seq == 0
        # ordered for claim 1; the slot is claimed again (claim 2) before the shim applied it
        region.set_host_pid(0, 4242, claim_seq=1, start_time_ticks=1000)
        assert reclaim(region, lambda pid, start: False, lambda pid: False) == [0]
        claim(region, 0, 8, 2000, used_mib=20)
        with state_file(region.state_path) as st:
            st.procs[0].claim_seq = 2
        assert apply_orders(region) == []
        assert region.read_state().procs[0].state == shim.SLOT_ACTIVE


def test_keeper_registers_and_reclaims_with_production_answers(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_process(proc, 4242, (4242, 7), 1000)
    keeper = RegionKeeper(tmp_path / "containers")
    with new_region(keeper.directory("uid-1", "main")) as region:
        claim(region, 0, 7, 1000, used_mib=64)
        claim(region, 1, 8, 1100, used_mib=32)  # registered earlier; its process is gone now
        region.set_host_pid(1, 4400, claim_seq=2, start_time_ticks=1100)
    nvml = hostpids.driver_holds_in([GpuProcess(4400, 32 * MIB), GpuProcess(4242, 64 * MIB)])
    assert keeper.tend("uid-1", "main", cgroup(tmp_path, 4242), nvml, proc) == []
    assert keeper.registered_host_pids("uid-1", "main") == {4242, 4400}
    released = hostpids.driver_holds_in([GpuProcess(4242, 64 * MIB), GpuProcess(4400, 0)])
    assert keeper.tend("uid-1", "main", None, released, proc) == [1]
    with shim.open_region(keeper.directory("uid-1", "main")) as region:
        assert apply_orders(region) == [1]  # what the shim does at its next lock
        control, state = region.snapshot_control(), region.read_state()
    assert control.procs[0].host_pid == 4242 and state.procs[0].state == shim.SLOT_ACTIVE
    assert state.procs[1].state == shim.SLOT_FREE
    assert state.usage.memory_used_bytes == 64 * MIB
    assert keeper.registered_host_pids("uid-1", "main") == {4242}
