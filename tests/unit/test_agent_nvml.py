"""The NVML backend against a fake ``pynvml``: the real module's constants and error classes
(``nvidia-ml-py`` is installed; NVML itself is never initialised), fake functions with the real
call signatures that raise the real errors (NotSupported, NotFound, Timeout, GpuIsLost)."""

from __future__ import annotations

import inspect
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from neuronetes_agent.daemon.devices import DiscoveryError, GpuLost
from neuronetes_agent.daemon.nvml import NvmlGpus

pytestmark = pytest.mark.unit


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # the bindings map the code to its NVMLError_* subclass


@dataclass
class FakeGpu:
    uuid: str
    name: str
    bus: str
    total: int
    links: list[str]  # remote bus id per active link ([] + nvlink=False: no NVLink at all)
    nvlink: bool = True
    numa: int | None = 0
    cpus: tuple[int, ...] = (0, 1)
    mig: list[tuple[int, int, int, str]] | None = None  # (slot, start, size, uuid); None: no MIG support
    used: int = 0
    lost: bool = False
    procs: list[int] = field(default_factory=list)


class Handle:
    def __init__(self, gpu: FakeGpu, mig: tuple[int, int, int, str] | None = None) -> None:
        self.gpu, self.mig = gpu, mig


def fake_nvml(gpus: list[FakeGpu], events: list[tuple[int, int]] | None = None) -> Any:
    """A module object with the real constants and errors and fake functions."""
    mod = types.SimpleNamespace(
        **{k: v for k, v in vars(pynvml).items() if not callable(v) or isinstance(v, type)}
    )
    queue = list(events or ())

    def check(h: Handle) -> FakeGpu:
        if h.gpu.lost:
            raise err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return h.gpu

    def mem(handle: Handle, version: int | None = None) -> Any:
        g = check(handle)
        total = (handle.mig[2] * 5 << 30) if handle.mig else g.total
        reserved = 500 << 20 if version == pynvml.nvmlMemory_v2 else 0  # v2 splits out the driver's part
        return types.SimpleNamespace(
            total=total, used=g.used, free=total - g.used - reserved, reserved=reserved, version=version
        )

    def nvlink_state(device: Handle, link: int) -> int:
        if not device.gpu.nvlink:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 12:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(
            pynvml.NVML_FEATURE_ENABLED if link < len(device.gpu.links) else pynvml.NVML_FEATURE_DISABLED
        )

    def mig_mode(device: Handle) -> list[int]:
        if device.gpu.mig is None:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [1, 1] if device.gpu.mig else [0, 0]

    def mig_handle(device: Handle, index: int) -> Handle:
        for m in device.gpu.mig or ():
            if m[0] == index:
                return Handle(device.gpu, m)
        raise err(pynvml.NVML_ERROR_NOT_FOUND)

    def affinity(handle: Handle, cpuSetSize: int) -> list[int]:
        words = [0] * cpuSetSize
        for cpu in handle.gpu.cpus:
            words[cpu // 64] |= 1 << (cpu % 64)
        return words

    def memory_affinity(handle: Handle, nodeSetSize: int, scope: int) -> list[int]:
        assert scope == pynvml.NVML_AFFINITY_SCOPE_NODE
        if handle.gpu.numa is None:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        words = [0] * nodeSetSize
        words[handle.gpu.numa // 64] |= 1 << (handle.gpu.numa % 64)
        return words

    def util(handle: Handle) -> Any:
        if check(handle).mig:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=42, memory=10)

    def wait(eventSet: Any, timeoutms: int) -> Any:
        if not queue:
            raise err(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = queue.pop(0)
        return types.SimpleNamespace(device=Handle(gpus[index]), eventData=xid, eventType=8)

    fns: dict[str, Callable[..., Any]] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda index: Handle(gpus[index]),
        "nvmlDeviceGetUUID": lambda handle: handle.mig[3] if handle.mig else handle.gpu.uuid,
        "nvmlDeviceGetName": lambda handle: handle.gpu.name,
        "nvmlDeviceGetMinorNumber": lambda handle: gpus.index(handle.gpu),
        "nvmlDeviceGetPciInfo": lambda handle: types.SimpleNamespace(busId=handle.gpu.bus.encode()),
        "nvmlDeviceGetMemoryInfo": mem,
        "nvmlDeviceGetMemoryAffinity": memory_affinity,
        "nvmlDeviceGetCpuAffinity": affinity,
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda handle: 4,
        "nvmlDeviceGetNvLinkState": nvlink_state,
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda device, link: types.SimpleNamespace(
            busId=device.gpu.links[link].encode()
        ),
        "nvmlDeviceGetNvLinkVersion": lambda device, link: 3,
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda device: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetGpuInstanceId": lambda device: device.mig[0] + 1,
        "nvmlDeviceGetComputeInstanceId": lambda device: 0,
        "nvmlDeviceGetGpuInstanceById": lambda device, gpuInstanceId: next(
            m for m in device.gpu.mig if m[0] + 1 == gpuInstanceId
        ),
        "nvmlGpuInstanceGetInfo": lambda gpuInstance: types.SimpleNamespace(
            placement=types.SimpleNamespace(start=gpuInstance[1], size=gpuInstance[2])
        ),
        "nvmlDeviceGetAttributes": lambda device: types.SimpleNamespace(
            gpuInstanceSliceCount={1: 1, 2: 2, 4: 3}[device.mig[2]],
            memorySizeMB=device.mig[2] * 5 * 1024,
            sharedJpegCount=0,
            sharedOfaCount=0,
        ),
        "nvmlSystemGetDriverVersion": lambda: "580.95.05",
        "nvmlSystemGetCudaDriverVersion": lambda: 13000,
        "nvmlDeviceGetUtilizationRates": util,
        "nvmlDeviceGetTemperatureV": lambda handle, sensor, version=pynvml.nvmlTemperature_v1: 51,
        "nvmlDeviceGetPowerUsage": lambda handle: 250_000,
        "nvmlDeviceGetTotalEccErrors": lambda handle, errorType, counterType: 3 if errorType else 1,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda handle: 0,
        "nvmlDeviceGetComputeRunningProcesses": lambda handle: [
            types.SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in check(handle).procs
        ],
        "nvmlEventSetCreate": lambda: object(),
        "nvmlDeviceRegisterEvents": lambda handle, eventTypes, eventSet: None,
        "nvmlEventSetWait": wait,
        "nvmlEventSetFree": lambda eventSet: None,
    }
    for name, fn in fns.items():
        real = inspect.signature(getattr(pynvml, name))
        # Faithful: same parameter names as the real bindings.
        assert list(inspect.signature(fn).parameters) == list(real.parameters), name
        setattr(mod, name, fn)
    return mod


def dgx(n: int = 8) -> list[FakeGpu]:
    switches = [f"00000000:{0xA0 + s:02x}:00.0" for s in range(6)]
    return [
        FakeGpu(
            uuid=f"GPU-00000000-0000-0000-0000-{k:012d}",
            name="NVIDIA A100-SXM4-80GB",
            bus=f"00000000:{0x07 + 0x10 * k:02x}:00.0",
            total=81920 << 20,
            links=[switches[link % 6] for link in range(12)],
            numa=k * 2 // n,
            cpus=tuple(range(64 * (k * 2 // n), 64 * (k * 2 // n) + 64)),
        )
        for k in range(n)
    ]


def test_dgx_a100_topology_numa_and_bandwidth() -> None:
    backend = NvmlGpus(fake_nvml(dgx()), socket_of=lambda cpu: cpu // 64)
    started = time.perf_counter()
    inv = backend.scan()
    assert time.perf_counter() - started < 5  # sanity only; bench/agent.py measures
    assert [g.index for g in inv.gpus] == list(range(8))
    assert inv.driver_version == "580.95.05" and inv.cuda_version == "13.0"
    g0 = inv.gpus[0]
    assert g0.model == "NVIDIA A100-SXM4-80GB" and g0.memory_mib == 81920
    assert g0.nvlink_peers == (1, 2, 3, 4, 5, 6, 7)  # through the NVSwitches
    assert {g.nvlink_group for g in inv.gpus} == {0}
    assert g0.nvlink_bandwidth_gbps == 600.0
    assert {g.numa_node for g in inv.gpus} == {0, 1} and inv.gpus[7].socket == 1
    assert g0.mig_capable is False and g0.mig_enabled is False


def test_pcie_gpus_without_nvlink_or_numa() -> None:
    gpus = [
        FakeGpu(
            f"GPU-00000000-0000-0000-0001-{k:012d}",
            "Tesla T4",
            f"0000:{k + 1:02x}:00.0",
            15360 << 20,
            [],
            nvlink=False,
            numa=None,
        )
        for k in range(4)
    ]
    inv = NvmlGpus(fake_nvml(gpus), socket_of=lambda cpu: 0, numa_of_bus=lambda bus: -1).scan()
    assert all(
        g.nvlink_peers == () and g.nvlink_group == -1 and g.nvlink_bandwidth_gbps == 0 for g in inv.gpus
    )
    assert all(g.numa_node == -1 for g in inv.gpus)
    assert [g.pci_bus_id for g in inv.gpus] == [f"0000:{k + 1:02x}:00.0" for k in range(4)]


def test_numa_node_is_the_cpu_numa_affinity_else_the_pci_devices() -> None:
    """NVML's memory affinity (nvidia-smi topo's "NUMA Affinity") first; where NVML does not say (a
    VM), the PCI device's numa_node in sysfs."""
    gpus = dgx(2)
    gpus[1].numa = None
    seen: list[str] = []

    def sysfs(bus: str) -> int:
        seen.append(bus)
        return 3

    inv = NvmlGpus(fake_nvml(gpus), socket_of=lambda cpu: 0, numa_of_bus=sysfs).scan()
    assert [g.numa_node for g in inv.gpus] == [0, 3]
    assert seen == [gpus[1].bus.lower()]


def test_direct_nvlink_pairs_form_groups() -> None:
    gpus = dgx(4)
    for k, g in enumerate(gpus):
        g.links = [gpus[k ^ 1].bus] * 4  # bridged pairs 0-1, 2-3
    inv = NvmlGpus(fake_nvml(gpus), socket_of=lambda cpu: 0).scan()
    assert [g.nvlink_peers for g in inv.gpus] == [(1,), (0,), (3,), (2,)]
    assert [g.nvlink_group for g in inv.gpus] == [0, 0, 1, 1]
    assert inv.gpus[0].nvlink_bandwidth_gbps == 200.0


def test_mig_instances_with_empty_slots() -> None:
    gpus = dgx(1)
    gpus[0].name = "NVIDIA A100-SXM4-40GB"
    gpus[0].total = 40960 << 20
    gpus[0].mig = [
        (0, 4, 4, "MIG-11111111-1111-1111-1111-111111111111"),
        (3, 0, 1, "MIG-22222222-2222-2222-2222-222222222222"),
    ]
    inv = NvmlGpus(fake_nvml(gpus), socket_of=lambda cpu: 0).scan()
    g = inv.gpus[0]
    assert g.mig_capable and g.mig_enabled
    assert [(d.profile, d.start, d.size, d.uuid[:8]) for d in g.mig_devices] == [
        ("1g.5gb", 0, 1, "MIG-2222"),
        ("3g.20gb", 4, 4, "MIG-1111"),
    ]
    assert g.mig_devices[1].gpu_instance_id == 1


def test_sample_readings_and_unsupported_utilization() -> None:
    gpus = dgx(2)
    gpus[1].procs = [101, 102]
    backend = NvmlGpus(fake_nvml(gpus), socket_of=lambda cpu: 0)
    backend.scan()
    s = backend.sample(gpus[1].uuid)
    assert s.utilization_percent == 42 and s.temperature_celsius == 51 and s.power_watts == 250
    assert s.ecc_corrected_total == 1 and s.ecc_uncorrected_total == 3
    assert [p.pid for p in s.processes] == [101, 102]
    # free as NVML reports it: the driver's reservation is neither used nor free
    assert s.memory_free_bytes == gpus[1].total - gpus[1].used - (500 << 20)
    gpus[1].lost = True
    with pytest.raises(GpuLost) as lost:
        backend.sample(gpus[1].uuid)
    assert lost.value.uuid == gpus[1].uuid


def test_xid_events_and_timeout() -> None:
    gpus = dgx(2)
    backend = NvmlGpus(fake_nvml(gpus, events=[(1, 48)]), socket_of=lambda cpu: 0)
    events = backend.wait_xids(0.01)
    assert [(e.uuid, e.xid) for e in events] == [(gpus[1].uuid, 48)]
    assert backend.wait_xids(0.01) == []  # NVMLError_Timeout: nothing happened
    assert backend.reset(gpus[0].uuid) is False  # the bindings cannot reset a GPU


def test_nvml_failure_is_a_discovery_error() -> None:
    mod = fake_nvml(dgx(1))

    def broken() -> int:
        raise err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    mod.nvmlDeviceGetCount = broken
    with pytest.raises(DiscoveryError, match="NVML discovery failed"):
        NvmlGpus(mod).scan()
