"""The NVML discovery backend: real GPUs through NVIDIA's ``nvidia-ml-py`` bindings (module ``pynvml``).

The module object is passed in (`NvmlGpus(pynvml)`), so the unit tests drive this code with a
small fake that mimics the bindings' call signatures and error classes; `load_nvml` imports the
real one. Calls a GPU does not support (``NVMLError_NotSupported``) become "unknown" values,
never errors: a T4 has no NVLink, a MIG GPU reports no utilization.

Topology: NVLink peers come from each active link's remote PCI bus id; a link whose far end is no
GPU of this node is an NVSwitch port, and every GPU with such links shares the switch domain.
Nominal bandwidth is active links × the per-link figure of the link's NVLink version. The CPU
socket of a GPU is the package of the first CPU in its NVML CPU affinity (sysfs). Its NUMA node is
the CPU NUMA node it is attached to — what ``nvidia-smi topo -m`` calls "NUMA Affinity": the first
node of NVML's memory affinity, else the PCI device's ``numa_node`` in sysfs. (NVML's
``nvmlDeviceGetNumaNodeId`` is something else: the node of the GPU's own memory on platforms where
the GPU is a NUMA node, such as Grace Hopper; elsewhere it is not supported.)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from neuronetes import mig

from .devices import DiscoveryError, GpuDevice, GpuLost, GpuProcess, GpuSample, Inventory, MigDevice, XidEvent

__all__ = ["NvmlGpus", "load_nvml", "socket_of_cpu"]

# Bidirectional GB/s per NVLink link by NVLink version (P100: 4×40, V100: 6×50, A100: 12×50,
# H100: 18×50, B200: 18×100 — NVIDIA's published per-GPU totals).
_LINK_GBPS: Final = {1: 40.0, 2: 50.0, 3: 50.0, 4: 50.0, 5: 100.0}
_CPU_MASK_WORDS: Final = 16  # 16 × 64 = 1024 CPUs
_NODE_MASK_WORDS: Final = 4  # 4 × 64 = 256 NUMA nodes
_XID_WAIT_MAX_MS: Final = 1000


def load_nvml() -> ModuleType:
    """Import ``pynvml`` (from ``nvidia-ml-py``) and initialise NVML. Raises `DiscoveryError`."""
    try:
        # By name: NVML is optional (no driver on a CPU node, a workstation or CI), untyped too.
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        raise DiscoveryError(f"NVML is not available: {exc}") from exc
    return nvml


def socket_of_cpu(cpu: int) -> int:
    """The physical package (socket) of a CPU, from sysfs (0 when unknown)."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id")
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def numa_of_pci(bus_id: str) -> int:
    """The NUMA node of a PCI device from sysfs (-1 when the platform has none or does not say)."""
    domain, _, rest = bus_id.lower().partition(":")
    path = Path(f"/sys/bus/pci/devices/{domain[-4:]}:{rest}/numa_node")
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return -1


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlGpus:
    """The `Discovery` backend of a node with NVIDIA GPUs."""

    def __init__(
        self,
        nvml: Any,
        *,
        socket_of: Callable[[int], int] = socket_of_cpu,
        numa_of_bus: Callable[[str], int] = numa_of_pci,
    ) -> None:
        self.nvml = nvml
        self._socket_of = socket_of
        self._numa_of_bus = numa_of_bus
        self._handles: dict[str, Any] = {}
        self._events: Any = None

    # ---- Discovery -----------------------------------------------------------------------------

    def scan(self) -> Inventory:
        n = self.nvml
        try:
            count = n.nvmlDeviceGetCount()
            handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            bus_ids = [_text(n.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
            links = [self._nvlinks(h) for h in handles]
            gpus = [self._device(i, h, bus_ids, links) for i, h in enumerate(handles)]
            driver = _text(n.nvmlSystemGetDriverVersion())
            cuda = n.nvmlSystemGetCudaDriverVersion()
        except n.NVMLError as exc:
            raise DiscoveryError(f"NVML discovery failed: {exc}") from exc
        self._handles = {g.uuid: h for g, h in zip(gpus, handles, strict=True)}
        return Inventory(
            gpus=tuple(_with_groups(gpus)),
            driver_version=driver,
            cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
        )

    def sample(self, uuid: str) -> GpuSample:
        n = self.nvml
        h = self._handle(uuid)
        try:
            mem = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
            procs = n.nvmlDeviceGetComputeRunningProcesses(h)
        except n.NVMLError_GpuIsLost as exc:
            raise GpuLost(uuid, f"GPU {uuid} has fallen off the bus: {exc}") from exc
        except n.NVMLError as exc:
            raise DiscoveryError(f"GPU {uuid}: {exc}") from exc
        util = self._optional(lambda: n.nvmlDeviceGetUtilizationRates(h).gpu)
        temp = self._optional(lambda: n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU))
        power_mw = self._optional(lambda: n.nvmlDeviceGetPowerUsage(h))
        ecc = [
            self._optional(partial(n.nvmlDeviceGetTotalEccErrors, h, kind, n.NVML_VOLATILE_ECC))
            for kind in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        ]
        throttle = self._optional(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
        return GpuSample(
            uuid=uuid,
            utilization_percent=None if util is None else float(util),
            memory_used_bytes=int(mem.used),
            memory_total_bytes=int(mem.total),
            temperature_celsius=None if temp is None else float(temp),
            power_watts=None if power_mw is None else power_mw / 1000.0,
            ecc_corrected_total=None if ecc[0] is None else int(ecc[0]),
            ecc_uncorrected_total=None if ecc[1] is None else int(ecc[1]),
            throttle_reasons=int(throttle or 0),
            processes=tuple(GpuProcess(int(p.pid), int(p.usedGpuMemory or 0)) for p in procs),
            memory_reserved_bytes=int(getattr(mem, "reserved", 0) or 0),
        )

    def wait_xids(self, timeout_s: float) -> list[XidEvent]:
        n = self.nvml
        if self._events is None:
            self._register_events()
        try:
            data = n.nvmlEventSetWait(self._events, int(min(timeout_s * 1000, _XID_WAIT_MAX_MS)))
        except n.NVMLError_Timeout:
            return []
        except n.NVMLError as exc:
            raise DiscoveryError(f"NVML event wait failed: {exc}") from exc
        uuid = self._uuid_of(data.device)
        return [XidEvent(uuid, int(data.eventData))] if uuid else []

    def reset(self, uuid: str) -> bool:
        # The Python bindings expose no GPU reset; the administrator resets the GPU
        # (nvidia-smi --gpu-reset) and runs `neuronetes online` (docs/gpu-health.md).
        return False

    def apply_mig(self, uuid: str, enabled: bool, counts: Mapping[str, int]) -> str | None:
        # Reconfiguring MIG through NVML (mode change, GPU reset, instance creation) is left to
        # NVIDIA's mig-manager on real nodes for now; the agent reports the layout it finds.
        return "MIG reconfiguration on real GPUs is not supported by this agent; use NVIDIA's mig-manager"

    def relayout_mig(
        self, uuid: str, destroy: Sequence[tuple[str, int]], create: Sequence[tuple[str, int]]
    ) -> str | None:
        """Destroy and create GPU instances (each with one compute instance over all its compute
        slices) at their placements through NVML. Guards: the GPU must already be in MIG mode (the
        mode is never changed: that needs an idle GPU and often a reset, which is mig-manager's job
        with the node cordoned); an instance with a running process is never destroyed. Not yet run
        on a real MIG GPU: the simulated backend is what the tests drive (docs/gpu-health.md)."""
        n = self.nvml
        try:
            h = self._handle(uuid)
            current, _pending = n.nvmlDeviceGetMigMode(h)
            if current != n.NVML_DEVICE_MIG_ENABLE:
                return "the GPU is not in MIG mode; the agent never changes the mode"
            model = _text(n.nvmlDeviceGetName(h))
            catalog = mig.catalog_for(model)
            by_start = {d.start: d for d in self._mig_devices(h, model)}
            for profile, start in destroy:
                device = by_start.get(start)
                if device is None or device.profile != profile:
                    return f"no MIG instance {profile}@{start} to destroy"
                handle = n.nvmlDeviceGetHandleByUUID(device.uuid)
                if n.nvmlDeviceGetComputeRunningProcesses(handle):
                    return f"MIG instance {profile}@{start} has running processes"
                gpu_instance = n.nvmlDeviceGetGpuInstanceById(h, device.gpu_instance_id)
                n.nvmlComputeInstanceDestroy(
                    n.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, device.compute_instance_id)
                )
                n.nvmlGpuInstanceDestroy(gpu_instance)
            for profile, start in create:
                prof = catalog.profile(profile)
                constant = _GPU_INSTANCE_PROFILES.get(
                    (prof.compute_slices, prof.memory_slices, prof.media_extensions)
                )
                if constant is None:
                    return f"no NVML GPU instance profile for {profile}"
                info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, getattr(n, constant))
                placement = n.c_nvmlGpuInstancePlacement_t()
                placement.start, placement.size = start, prof.memory_slices
                gpu_instance = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, placement)
                ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gpu_instance,
                    getattr(n, f"NVML_COMPUTE_INSTANCE_PROFILE_{prof.compute_slices}_SLICE"),
                    n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
                n.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_info.id)
        except (n.NVMLError, KeyError, ValueError) as exc:
            return f"NVML: {exc}"
        return None

    def close(self) -> None:
        n = self.nvml
        try:
            if self._events is not None:
                n.nvmlEventSetFree(self._events)
            n.nvmlShutdown()
        except n.NVMLError:
            pass

    # ---- internals -----------------------------------------------------------------------------

    def _optional(self, read: Callable[[], Any]) -> Any:
        """A reading the GPU may not support: None for NotSupported (and NotFound)."""
        try:
            return read()
        except (self.nvml.NVMLError_NotSupported, self.nvml.NVMLError_NotFound):
            return None

    def _handle(self, uuid: str) -> Any:
        if uuid not in self._handles:
            self.scan()
        try:
            return self._handles[uuid]
        except KeyError:
            raise GpuLost(uuid, f"GPU {uuid} is no longer listed by NVML") from None

    def _uuid_of(self, handle: Any) -> str:
        try:
            return _text(self.nvml.nvmlDeviceGetUUID(handle))
        except self.nvml.NVMLError:
            return ""

    def _register_events(self) -> None:
        n = self.nvml
        if not self._handles:
            self.scan()
        try:
            events = n.nvmlEventSetCreate()
            for h in self._handles.values():
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, events)
        except n.NVMLError as exc:
            raise DiscoveryError(f"cannot register for XID events: {exc}") from exc
        self._events = events

    def _nvlinks(self, h: Any) -> list[tuple[str, int]]:
        """(remote bus id, NVLink version) of each active link."""
        n = self.nvml
        out: list[tuple[str, int]] = []
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                if n.nvmlDeviceGetNvLinkState(h, link) != n.NVML_FEATURE_ENABLED:
                    continue
                remote = _text(n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower()
                version = int(n.nvmlDeviceGetNvLinkVersion(h, link))
            except n.NVMLError_NotSupported:
                break  # no NVLink on this GPU
            except n.NVMLError_InvalidArgument:
                break  # past the GPU's last link
            out.append((remote, version))
        return out

    def _device(
        self, index: int, h: Any, bus_ids: list[str], links: list[list[tuple[str, int]]]
    ) -> GpuDevice:
        n = self.nvml
        uuid = _text(n.nvmlDeviceGetUUID(h))
        model = _text(n.nvmlDeviceGetName(h))
        total = int(n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).total)
        nodes = self._optional(
            lambda: n.nvmlDeviceGetMemoryAffinity(h, _NODE_MASK_WORDS, n.NVML_AFFINITY_SCOPE_NODE)
        )
        numa = next(
            (w * 64 + b for w, word in enumerate(nodes or ()) for b in range(64) if int(word) >> b & 1), None
        )
        if numa is None:
            numa = self._numa_of_bus(bus_ids[index])
        mask = self._optional(lambda: n.nvmlDeviceGetCpuAffinity(h, _CPU_MASK_WORDS))
        cpus = tuple(w * 64 + b for w, word in enumerate(mask or ()) for b in range(64) if int(word) >> b & 1)
        pcie = self._optional(lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h))
        mine = links[index]
        peers = _peers(index, bus_ids, links)
        bandwidth = sum(_LINK_GBPS.get(v, 50.0) for _, v in mine)
        mig_mode = self._optional(lambda: n.nvmlDeviceGetMigMode(h))
        mig_enabled = bool(mig_mode) and mig_mode[0] == n.NVML_DEVICE_MIG_ENABLE
        return GpuDevice(
            index=index,
            uuid=uuid,
            model=model,
            memory_mib=total >> 20,
            numa_node=numa,
            socket=self._socket_of(cpus[0]) if cpus else 0,
            cpu_affinity=cpus,
            pcie_gen=int(pcie) if pcie else 1,
            nvlink_group=-1,  # filled by _with_groups
            nvlink_peers=peers,
            nvlink_bandwidth_gbps=bandwidth,
            mig_capable=mig_mode is not None,
            mig_enabled=mig_enabled,
            mig_devices=self._mig_devices(h, model) if mig_enabled else (),
            minor=int(n.nvmlDeviceGetMinorNumber(h)),
            pci_bus_id=bus_ids[index],
        )

    def _mig_devices(self, h: Any, model: str) -> tuple[MigDevice, ...]:
        n = self.nvml
        out: list[MigDevice] = []
        for slot in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except n.NVMLError_NotFound:
                continue  # an empty slot
            gi = int(n.nvmlDeviceGetGpuInstanceId(m))
            placement = n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(h, gi)).placement
            attrs = n.nvmlDeviceGetAttributes(m)
            out.append(
                MigDevice(
                    uuid=_text(n.nvmlDeviceGetUUID(m)),
                    profile=_profile_name(model, attrs, int(placement.size)),
                    start=int(placement.start),
                    size=int(placement.size),
                    gpu_instance_id=gi,
                    compute_instance_id=int(n.nvmlDeviceGetComputeInstanceId(m)),
                    memory_mib=int(n.nvmlDeviceGetMemoryInfo(m, version=n.nvmlMemory_v2).total) >> 20,
                )
            )
        return tuple(sorted(out, key=lambda d: d.start))


_GPU_INSTANCE_PROFILES: Final = {
    # (compute slices, memory slices, media extensions) -> NVML's GPU instance profile
    (7, 8, False): "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
    (4, 4, False): "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    (3, 4, False): "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    (2, 2, False): "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
    (1, 2, False): "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
    (1, 1, False): "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
    (1, 1, True): "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1",
}


def _profile_name(model: str, attrs: Any, size: int) -> str:
    """The catalog's name of a MIG instance: compute slices, placement size, media extensions."""
    media = bool(attrs.sharedJpegCount or attrs.sharedOfaCount)
    compute = int(attrs.gpuInstanceSliceCount)
    try:
        catalog = mig.catalog_for(model)
    except mig.UnsupportedGpuError:
        catalog = None
    for p in catalog or ():
        if p.compute_slices == compute and p.memory_slices == size and p.media_extensions == media:
            return p.name
    gb = max(1, round(int(attrs.memorySizeMB) / 1024))
    return f"{compute}g.{gb}gb" + ("+me" if media else "")


def _peers(index: int, bus_ids: list[str], links: list[list[tuple[str, int]]]) -> tuple[int, ...]:
    """GPUs reached over NVLink: directly (remote end is that GPU) or through an NVSwitch
    (remote end is no GPU: every other GPU with a switch link is a peer)."""
    gpu_of = {bus: k for k, bus in enumerate(bus_ids)}
    direct = {gpu_of[r] for r, _ in links[index] if r in gpu_of}
    switched = any(r not in gpu_of for r, _ in links[index])
    if switched:
        direct |= {k for k, ls in enumerate(links) if any(r not in gpu_of for r, _ in ls)}
    direct.discard(index)
    return tuple(sorted(direct))


def _with_groups(gpus: list[GpuDevice]) -> list[GpuDevice]:
    """Number the NVLink-connected components (groups) in index order; -1 for PCIe-only GPUs."""
    group_of: dict[int, int] = {}
    next_group = 0
    for g in gpus:
        if g.index in group_of or not g.nvlink_peers:
            continue
        stack, seen = [g.index], {g.index}
        while stack:
            k = stack.pop()
            for p in gpus[k].nvlink_peers:
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        for k in seen:
            group_of[k] = next_group
        next_group += 1
    return [replace(g, nvlink_group=group_of.get(g.index, -1)) for g in gpus]
