"""What the agent knows about a node's GPUs, and the one interface every discovery backend offers.

`Discovery` is implemented by the NVML backend (`daemon.nvml`, real GPUs through ``nvidia-ml-py``)
and by the simulated backend (`daemon.simulated`, the dev cluster's node profiles plus fault
injection). Everything above it — health, publication, metrics — sees only these types.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "Discovery",
    "DiscoveryError",
    "GpuDevice",
    "GpuLost",
    "GpuProcess",
    "GpuRefError",
    "GpuSample",
    "Inventory",
    "MigDevice",
    "XidEvent",
    "match_gpu",
]


class DiscoveryError(RuntimeError):
    """The backend cannot read the GPUs at all (NVML missing, driver not loaded)."""


class GpuLost(DiscoveryError):
    """One GPU stopped answering (fallen off the bus); `uuid` names it."""

    def __init__(self, uuid: str, message: str) -> None:
        super().__init__(message)
        self.uuid = uuid


class GpuRefError(LookupError):
    """A ``--gpu-id`` that names no GPU, or more than one (`message`: the one line to show)."""

    def __init__(self, message: str, *, ambiguous: bool) -> None:
        super().__init__(message)
        self.message = message
        self.ambiguous = ambiguous


def match_gpu(ref: str, gpus: Iterable[tuple[int | None, str]], where: str) -> str:
    """The UUID of the GPU that `ref` names among `gpus` ((index, UUID); no index where an index
    means nothing, as across a cluster's nodes), the way ``nvidia-smi -i`` takes it: an index, a
    whole UUID, or a prefix of one UUID only (the tables print such prefixes). `where` ends the
    not-found line ("on this machine"). Raises GpuRefError, naming the matches of an ambiguous one."""
    ref = ref.strip()
    known = list(gpus)
    by_index = any(index is not None for index, _ in known)
    if ref.isdigit() and by_index:
        found = [uuid for index, uuid in known if index == int(ref)]
    else:
        found = [uuid for _, uuid in known if uuid == ref] or [
            uuid for _, uuid in known if ref and uuid.startswith(ref)
        ]
    found = list(dict.fromkeys(found))
    if len(found) == 1:
        return found[0]
    if found:
        raise GpuRefError(
            f"GPU {ref!r} is ambiguous: it starts {', '.join(found)}; give more of the UUID", ambiguous=True
        )
    forms = "an index, a UUID or a unique UUID prefix" if by_index else "a UUID or a unique UUID prefix"
    raise GpuRefError(f"no GPU {ref!r} {where} (give {forms})", ambiguous=False)


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance (a GPU instance with its compute instance) on a GPU in MIG mode."""

    uuid: str  # MIG-…
    profile: str  # canonical name, e.g. 1g.10gb
    start: int  # first memory slice of the placement
    size: int  # memory slices of the placement
    gpu_instance_id: int
    compute_instance_id: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU: everything placement needs, read once at discovery."""

    index: int
    uuid: str  # GPU-…
    model: str
    memory_mib: int
    numa_node: int  # -1 unknown
    socket: int
    cpu_affinity: tuple[int, ...]  # CPUs close to the GPU
    pcie_gen: int
    nvlink_group: int  # -1: PCIe only
    nvlink_peers: tuple[int, ...]  # indices reached over NVLink
    nvlink_bandwidth_gbps: float  # nominal, decimal GB/s (0 without NVLink)
    mig_capable: bool
    mig_enabled: bool
    mig_devices: tuple[MigDevice, ...] = ()
    minor: int = -1  # the device node is /dev/nvidia<minor> (NVML minorNumber); -1 unknown
    pci_bus_id: str = ""  # "0000:3b:00.0" form, lower-case ("" unknown)


@dataclass(frozen=True, slots=True)
class Inventory:
    """The node's GPUs and driver, as one discovery pass saw them."""

    gpus: tuple[GpuDevice, ...]
    driver_version: str
    cuda_version: str

    def by_uuid(self, uuid: str) -> GpuDevice | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU (NVML's running compute processes)."""

    pid: int
    used_memory_bytes: int


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Live readings of one GPU (fields the hardware does not report are None)."""

    uuid: str
    utilization_percent: float | None
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_celsius: float | None
    power_watts: float | None
    ecc_corrected_total: int | None  # volatile single-bit errors since the driver loaded
    ecc_uncorrected_total: int | None  # volatile double-bit errors
    throttle_reasons: int  # NVML clocks-event reason bit mask (0: none)
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)
    # the driver's own reservation (NVML v2): total = used + free + reserved, so free is not total − used
    memory_reserved_bytes: int = 0

    @property
    def memory_free_bytes(self) -> int:
        return max(0, self.memory_total_bytes - self.memory_used_bytes - self.memory_reserved_bytes)


@dataclass(frozen=True, slots=True)
class XidEvent:
    """An XID error the driver reported for one GPU."""

    uuid: str
    xid: int


class Discovery(Protocol):
    """A source of GPU facts: one per node (the NVML backend) or per simulated node."""

    def scan(self) -> Inventory:
        """Every GPU with its topology and MIG instances. Raises `DiscoveryError`."""
        ...

    def sample(self, uuid: str) -> GpuSample:
        """Live readings of one GPU. Raises `GpuLost` when the GPU does not answer."""
        ...

    def wait_xids(self, timeout_s: float) -> list[XidEvent]:
        """XID events that arrived, waiting up to `timeout_s` for the first. Raises `DiscoveryError`
        when the event source itself failed (the caller counts consecutive failures)."""
        ...

    def reset(self, uuid: str) -> bool:
        """Reset one GPU with no users left; True when it is healthy afterwards, False when the
        backend cannot reset it (the administrator resets it and runs ``neuronetes online``)."""
        ...

    def apply_mig(self, uuid: str, enabled: bool, counts: Mapping[str, int]) -> str | None:
        """Set the GPU's MIG mode and instances (the GPU has no users); None when done, else why
        not. `scan` shows the new layout afterwards."""
        ...

    def relayout_mig(
        self, uuid: str, destroy: Sequence[tuple[str, int]], create: Sequence[tuple[str, int]]
    ) -> str | None:
        """On a GPU in MIG mode, destroy the (profile, start) instances `destroy` and create those
        of `create` at their start slots, never changing the MIG mode and never destroying an
        instance that runs a process; None when done, else why not (what was done stays done).
        `scan` shows the new layout afterwards."""
        ...

    def close(self) -> None: ...
