"""The simulated discovery backend: a node profile's GPUs plus a fault-injection API.

The hardware is what `neuronetes.profiles` describes for the node (the same GPUs, UUIDs,
NUMA nodes, NVLink groups and MIG layout the dev cluster and the placement engine use), so a kwok
node served by the agent looks exactly like the profile says. Faults — XID events, ECC counts,
temperature, utilization, power, processes holding memory, a GPU falling off the bus, a hung
driver — are injected per GPU and surface through the same `Discovery` calls the NVML backend
answers, so everything above the backend runs unchanged.

State is kept small (one `_GpuFaults` per GPU, created on first injection) because one fleet agent
holds thousands of these.
"""

from __future__ import annotations

import threading
import time
import uuid as _uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from neuronetes import mig
from neuronetes.profiles import TopologyProfile

from .devices import GpuDevice, GpuLost, GpuProcess, GpuSample, Inventory, MigDevice, XidEvent

__all__ = ["CUDA_VERSION", "DRIVER_VERSION", "SimulatedGpus", "simulated_mig_uuid"]

DRIVER_VERSION: Final = "580.95.05"
CUDA_VERSION: Final = "13.0"
_MIG_NAMESPACE: Final = _uuid.UUID("3b0d3c8a-9a43-4c1e-8f0b-6d6967000000")
_IDLE_TEMPERATURE_C: Final = 34.0
_IDLE_POWER_W: Final = 61.0
_INTEGER_FIELDS: Final = frozenset({"xid", "eccCorrected", "eccUncorrected"})
_INJECTABLE: Final = _INTEGER_FIELDS | {"temperatureCelsius", "utilizationPercent", "powerWatts", "offTheBus"}


def simulated_mig_uuid(gpu_uuid: str, start: int, profile: str) -> str:
    """A stable ``MIG-…`` UUID for a simulated MIG instance (NVML's format since driver R470)."""
    return f"MIG-{_uuid.uuid5(_MIG_NAMESPACE, f'{gpu_uuid}/{start}/{profile}')}"


@dataclass(slots=True)
class _GpuFaults:
    temperature_c: float = _IDLE_TEMPERATURE_C
    utilization: float = 0.0
    power_w: float = _IDLE_POWER_W
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    throttle_reasons: int = 0
    processes: dict[int, int] = field(default_factory=dict)  # pid -> bytes
    lost: bool = False


class SimulatedGpus:
    """The `Discovery` backend of one simulated node."""

    def __init__(self, profile: TopologyProfile, node: str, *, reset_seconds: float = 5.0) -> None:
        self.profile = profile
        self.node = node
        self.reset_seconds = reset_seconds
        self._faults: dict[str, _GpuFaults] = {}
        self._xids: deque[XidEvent] = deque()
        self._wake = threading.Condition()
        self._hang_until = 0.0
        self._closed = False
        self._inventory = self._build_inventory()
        self._by_uuid = {g.uuid: g for g in self._inventory.gpus}
        self._idle: dict[str, GpuSample] = {}
        self._busy_mig: set[str] = set()  # MIG instance UUIDs with a running process

    # ---- Discovery -----------------------------------------------------------------------------

    def scan(self) -> Inventory:
        self._maybe_hang()
        return self._inventory

    def sample(self, uuid: str) -> GpuSample:
        self._maybe_hang()
        gpu = self._gpu(uuid)
        f = self._faults.get(uuid)
        if f is None:  # an untouched GPU: the same idle reading every time (fleets hold thousands)
            idle = self._idle.get(uuid)
            if idle is None:
                idle = self._idle[uuid] = self._reading(gpu, _GpuFaults())
            return idle
        return self._reading(gpu, f)

    def _reading(self, gpu: GpuDevice, f: _GpuFaults) -> GpuSample:
        uuid = gpu.uuid
        if f.lost:
            raise GpuLost(uuid, f"GPU {uuid} has fallen off the bus")
        total = gpu.memory_mib << 20
        used = min(total, sum(f.processes.values()))
        return GpuSample(
            uuid=uuid,
            # NVML reports no utilization for a GPU in MIG mode.
            utilization_percent=None if gpu.mig_enabled else f.utilization,
            memory_used_bytes=used,
            memory_total_bytes=total,
            temperature_celsius=f.temperature_c,
            power_watts=f.power_w,
            ecc_corrected_total=f.ecc_corrected,
            ecc_uncorrected_total=f.ecc_uncorrected,
            throttle_reasons=f.throttle_reasons,
            processes=tuple(GpuProcess(pid, b) for pid, b in sorted(f.processes.items())),
        )

    def wait_xids(self, timeout_s: float) -> list[XidEvent]:
        with self._wake:
            if not self._xids and timeout_s > 0 and not self._closed:
                self._wake.wait(timeout_s)
            out = list(self._xids)
            self._xids.clear()
        return out

    def reset(self, uuid: str) -> bool:
        """A GPU reset: takes `reset_seconds`, clears volatile ECC counts and the GPU's processes;
        a GPU that fell off the bus cannot be reset (it needs the node rebooted)."""
        f = self._faults.get(uuid)
        if f is not None and f.lost:
            return False
        with self._wake:
            self._wake.wait_for(lambda: self._closed, self.reset_seconds)
        if f is not None:
            f.ecc_corrected = f.ecc_uncorrected = 0
            f.processes.clear()
            f.utilization = 0.0
        return not self._closed

    def apply_mig(self, uuid: str, enabled: bool, counts: Mapping[str, int]) -> str | None:
        """Reconfigure one GPU's MIG instances (placed as `neuronetes.mig` places them)."""
        gpu = self._gpu(uuid)
        if not gpu.mig_capable:
            return f"GPU {gpu.index} ({gpu.model}) does not support MIG"
        try:
            layout = mig.catalog_for(gpu.model).layout_from_counts(counts) if enabled else None
        except (KeyError, ValueError) as exc:
            return str(exc).strip("'\"")
        devices = _mig_devices(uuid, layout) if layout is not None else ()
        updated = replace(gpu, mig_enabled=enabled, mig_devices=devices)
        gpus = tuple(updated if g.uuid == uuid else g for g in self._inventory.gpus)
        self._inventory = replace(self._inventory, gpus=gpus)
        self._by_uuid[uuid] = updated
        self._idle.pop(uuid, None)
        return None

    def relayout_mig(
        self, uuid: str, destroy: Sequence[tuple[str, int]], create: Sequence[tuple[str, int]]
    ) -> str | None:
        """Destroy and create MIG instances at their start slots (the MIG mode stays as it is): each
        step checked as NVML would refuse it (a busy instance, a placement that does not fit); the
        steps before a refusal stay done. Kept instances keep their UUIDs."""
        gpu = self._gpu(uuid)
        if not gpu.mig_enabled:
            return f"GPU {gpu.index} is not in MIG mode"
        catalog = mig.catalog_for(gpu.model)
        layout = catalog.empty_layout()
        for d in gpu.mig_devices:
            layout = layout.place_at(d.profile, d.start)
        error: str | None = None
        for profile, start in destroy:
            device = next((d for d in gpu.mig_devices if (d.profile, d.start) == (profile, start)), None)
            if device is None:
                error = f"no MIG instance {profile}@{start} to destroy"
                break
            if device.uuid in self._busy_mig:
                error = f"MIG instance {profile}@{start} has running processes"
                break
            layout = layout.remove(start)
        if error is None:
            for profile, start in create:
                try:
                    layout = layout.place_at(profile, start)
                except (KeyError, ValueError) as exc:
                    error = str(exc).strip("'\"")
                    break
        updated = replace(gpu, mig_devices=_mig_devices(uuid, layout))
        self._inventory = replace(
            self._inventory, gpus=tuple(updated if g.uuid == uuid else g for g in self._inventory.gpus)
        )
        self._by_uuid[uuid] = updated
        return error

    def set_mig_process(self, mig_uuid: str, running: bool) -> None:
        """A process runs (or no longer runs) in the MIG instance `mig_uuid`."""
        if running:
            self._busy_mig.add(mig_uuid)
        else:
            self._busy_mig.discard(mig_uuid)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()

    # ---- fault injection -----------------------------------------------------------------------

    def inject_xid(self, uuid: str, xid: int) -> None:
        """The driver reports XID `xid` on the GPU (79 also takes it off the bus)."""
        self._gpu(uuid)
        if xid == 79:
            self._fault(uuid).lost = True
        with self._wake:
            self._xids.append(XidEvent(uuid, xid))
            self._wake.notify_all()

    def set_temperature(self, uuid: str, celsius: float) -> None:
        self._fault(uuid).temperature_c = celsius

    def set_utilization(self, uuid: str, percent: float) -> None:
        if not 0 <= percent <= 100:
            raise ValueError(f"utilization {percent} is not in 0-100")
        self._fault(uuid).utilization = percent

    def set_power(self, uuid: str, watts: float) -> None:
        self._fault(uuid).power_w = watts

    def add_ecc_errors(self, uuid: str, *, corrected: int = 0, uncorrected: int = 0) -> None:
        f = self._fault(uuid)
        f.ecc_corrected += corrected
        f.ecc_uncorrected += uncorrected

    def set_throttle_reasons(self, uuid: str, mask: int) -> None:
        self._fault(uuid).throttle_reasons = mask

    def set_process(self, uuid: str, pid: int, used_bytes: int) -> None:
        """A process holds `used_bytes` on the GPU (0 removes it)."""
        procs = self._fault(uuid).processes
        if used_bytes:
            procs[pid] = used_bytes
        else:
            procs.pop(pid, None)

    def fall_off_bus(self, uuid: str) -> None:
        """The GPU stops answering; the driver reports XID 79."""
        self.inject_xid(uuid, 79)

    def repair(self, uuid: str) -> None:
        """An administrator fixed the GPU (reseated, node rebooted): its faults are cleared."""
        self._faults.pop(uuid, None)

    def inject(self, uuid: str, fault: Mapping[str, Any]) -> str:
        """Apply one fault order (the dev CLI's ``inject`` request; docs/gpu-health.md):
        ``xid``, ``temperatureCelsius``, ``eccCorrected``/``eccUncorrected``,
        ``utilizationPercent``, ``powerWatts``, ``offTheBus``. Raises ValueError on a bad order."""
        self._gpu(uuid)
        unknown = set(fault) - _INJECTABLE
        if unknown or not fault:
            raise ValueError(f"unknown fault fields {sorted(unknown)}; use {sorted(_INJECTABLE)}")
        done: list[str] = []
        for key, value in fault.items():
            expected = bool if key == "offTheBus" else (int if key in _INTEGER_FIELDS else (int, float))
            if isinstance(value, bool) != (key == "offTheBus") or not isinstance(value, expected):
                raise ValueError(f"{key}: {value!r} is not a valid value")
            if key == "xid":
                self.inject_xid(uuid, int(value))
            elif key == "temperatureCelsius":
                self.set_temperature(uuid, float(value))
            elif key == "eccCorrected":
                self.add_ecc_errors(uuid, corrected=int(value))
            elif key == "eccUncorrected":
                self.add_ecc_errors(uuid, uncorrected=int(value))
            elif key == "utilizationPercent":
                self.set_utilization(uuid, float(value))
            elif key == "powerWatts":
                self.set_power(uuid, float(value))
            elif value:
                self.fall_off_bus(uuid)
            done.append(f"{key}={value}")
        return f"injected {', '.join(done)} on GPU {uuid}"

    def hang(self, seconds: float) -> None:
        """Every backend call blocks for `seconds` from now (a hung driver, for the watchdog)."""
        self._hang_until = time.monotonic() + seconds

    # ---- internals -----------------------------------------------------------------------------

    def _maybe_hang(self) -> None:
        left = self._hang_until - time.monotonic()
        if left > 0:
            with self._wake:
                self._wake.wait_for(lambda: self._closed, left)

    def _gpu(self, uuid: str) -> GpuDevice:
        try:
            return self._by_uuid[uuid]
        except KeyError:
            raise KeyError(f"node {self.node} has no GPU {uuid}") from None

    def _fault(self, uuid: str) -> _GpuFaults:
        self._gpu(uuid)
        return self._faults.setdefault(uuid, _GpuFaults())

    def _build_inventory(self) -> Inventory:
        p = self.profile
        layout = mig.catalog_for(p.gpu_model).layout_from_counts(p.mig_per_gpu) if p.mig_per_gpu else None
        gpus: list[GpuDevice] = []
        cpus_per_socket = max(1, p.cpu_milli // 1000 // max(1, p.sockets))
        for spec in p.gpus(self.node):
            first_cpu = spec.socket * cpus_per_socket
            device = GpuDevice(
                index=spec.index,
                uuid=spec.uuid,
                model=spec.model,
                memory_mib=spec.memory_mib,
                numa_node=spec.numa_node,
                socket=spec.socket,
                cpu_affinity=tuple(range(first_cpu, first_cpu + cpus_per_socket)),
                pcie_gen=spec.pcie_gen,
                nvlink_group=spec.nvlink_group,
                nvlink_peers=spec.nvlink_peers,
                nvlink_bandwidth_gbps=spec.nvlink_bandwidth_gbps,
                mig_capable=mig.is_mig_capable(spec.model),
                mig_enabled=spec.mig_enabled,
                minor=spec.index,  # deterministic: /dev/nvidia<index>, as on most real nodes
                pci_bus_id=f"00000000:{0x10 + spec.index:02x}:00.0",
            )
            if layout is not None and spec.mig_enabled:
                device = replace(device, mig_devices=_mig_devices(spec.uuid, layout))
            gpus.append(device)
        return Inventory(gpus=tuple(gpus), driver_version=DRIVER_VERSION, cuda_version=CUDA_VERSION)


def _mig_devices(gpu_uuid: str, layout: mig.MigLayout) -> tuple[MigDevice, ...]:
    return tuple(
        MigDevice(
            uuid=simulated_mig_uuid(gpu_uuid, inst.start, inst.profile.name),
            profile=inst.profile.name,
            start=inst.start,
            size=inst.profile.memory_slices,
            gpu_instance_id=k + 1,
            compute_instance_id=0,
            memory_mib=inst.profile.memory_mib,
        )
        for k, inst in enumerate(layout)
    )
