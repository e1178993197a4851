"""Where the node inventory file's device numbers come from (`inventory.InventoryWriter` writes
the document): `HostDeviceNodes` reads the host's ``/dev`` and ``/proc`` (real GPUs),
`SimulatedDeviceNodes` makes deterministic ones after NVIDIA's numbering (simulated GPUs).
docs/gpu-health.md ("Node inventory file and shim") lists the sources of each number.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from .devices import GpuDevice, MigDevice

__all__ = [
    "CONTROL_DEVICES",
    "NVIDIA_MAJOR",
    "DeviceNode",
    "DeviceNodes",
    "HostDeviceNodes",
    "InventoryError",
    "SimulatedDeviceNodes",
]

NVIDIA_MAJOR: Final = 195  # the GPU and control device nodes' major (fixed by NVIDIA's driver)
CONTROL_DEVICES: Final = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class InventoryError(RuntimeError):
    """The inventory cannot be built (a device node or capability missing, a bad CDI spec)."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    path: str
    major: int
    minor: int

    def doc(self) -> dict[str, Any]:
        return {"path": self.path, "major": self.major, "minor": self.minor}


class DeviceNodes(Protocol):
    """Where the device numbers of the document come from."""

    def control(self) -> list[DeviceNode]: ...

    def gpu(self, gpu: GpuDevice) -> DeviceNode: ...

    def mig_caps(self, gpu: GpuDevice, inst: MigDevice) -> tuple[DeviceNode, DeviceNode]: ...


def _cap_minor_sim(gpu_minor: int, gi: int, ci: int | None) -> int:
    # NVIDIA's nvidia-caps numbering: 1 config, 2 monitor, then per GPU 15 GPU instances of one
    # access node and eight compute instances each.
    base = 3 + gpu_minor * 15 * 9 + gi * 9
    return base if ci is None else base + 1 + ci


class SimulatedDeviceNodes:
    """Deterministic device numbers for simulated GPUs (no device node exists)."""

    CAPS_MAJOR: Final = 511

    def control(self) -> list[DeviceNode]:
        return [DeviceNode(CONTROL_DEVICES[0], NVIDIA_MAJOR, 255), DeviceNode(CONTROL_DEVICES[1], 508, 0),
                DeviceNode(CONTROL_DEVICES[2], 508, 1)]  # fmt: skip

    def gpu(self, gpu: GpuDevice) -> DeviceNode:
        return DeviceNode(f"/dev/nvidia{gpu.minor}", NVIDIA_MAJOR, gpu.minor)

    def mig_caps(self, gpu: GpuDevice, inst: MigDevice) -> tuple[DeviceNode, DeviceNode]:
        gi, ci = inst.gpu_instance_id, inst.compute_instance_id
        return (self._cap(_cap_minor_sim(gpu.minor, gi, None)), self._cap(_cap_minor_sim(gpu.minor, gi, ci)))

    def _cap(self, minor: int) -> DeviceNode:
        return DeviceNode(f"/dev/nvidia-caps/nvidia-cap{minor}", self.CAPS_MAJOR, minor)


class HostDeviceNodes:
    """The host's device numbers: ``stat`` of the control nodes, the GPU's NVML minor number, and
    the MIG capability minors NVIDIA's driver lists under ``/proc/driver/nvidia/capabilities``."""

    def __init__(self, dev: Path = Path("/dev"), proc: Path = Path("/proc")) -> None:
        self.dev = dev
        self.proc = proc

    def control(self) -> list[DeviceNode]:
        out = []
        for path in CONTROL_DEVICES:
            host = self.dev / path.removeprefix("/dev/")
            try:
                st = os.stat(host)
            except OSError as exc:
                raise InventoryError(f"control device {host}: {exc.strerror}") from None
            out.append(DeviceNode(path, os.major(st.st_rdev), os.minor(st.st_rdev)))
        return out

    def gpu(self, gpu: GpuDevice) -> DeviceNode:
        if gpu.minor < 0:
            raise InventoryError(f"GPU {gpu.index} ({gpu.uuid}): NVML reported no minor number")
        return DeviceNode(f"/dev/nvidia{gpu.minor}", NVIDIA_MAJOR, gpu.minor)

    def mig_caps(self, gpu: GpuDevice, inst: MigDevice) -> tuple[DeviceNode, DeviceNode]:
        major = self._caps_major()
        gi_dir = self.proc / f"driver/nvidia/capabilities/gpu{gpu.minor}/mig/gi{inst.gpu_instance_id}"
        ci_dir = gi_dir / f"ci{inst.compute_instance_id}"
        gi_minor, ci_minor = self._file_minor(gi_dir / "access"), self._file_minor(ci_dir / "access")
        return (
            DeviceNode(f"/dev/nvidia-caps/nvidia-cap{gi_minor}", major, gi_minor),
            DeviceNode(f"/dev/nvidia-caps/nvidia-cap{ci_minor}", major, ci_minor),
        )

    def _caps_major(self) -> int:
        return _number_in(self.proc / "devices", r"^\s*(\d+)\s+nvidia-caps$", "the nvidia-caps major")

    def _file_minor(self, access: Path) -> int:
        return _number_in(access, r"^DeviceFileMinor:\s*(\d+)$", "a DeviceFileMinor")


def _number_in(file: Path, pattern: str, what: str) -> int:
    """The number `pattern` captures in a /proc file of the driver (MIG needs these)."""
    try:
        text = file.read_text()
    except OSError as exc:
        raise InventoryError(f"{file}: {exc.strerror}") from None
    found = re.search(pattern, text, re.M)
    if found is None:
        raise InventoryError(f"{file} names no {what}")
    return int(found.group(1))
