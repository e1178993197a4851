"""The container's limits, where the process runs inside a NeuroNetes GPU slice: the scheduler never
promises its tasks more memory or bandwidth than these.

Two sources, as the CUDA shim reads them (docs/shim.md):

- the region's control file, ``/run/neuronetes/control`` (or ``$NEURONETES_REGION_DIR/control``
  where nothing exists at the fixed path): memory = the smallest of the container's limit, device
  0's limit and device 0's total; bandwidth = device 0's ``compute_share_percent`` / 100 (a MIG
  instance is not paced: 1.0);
- the HAMi-style variables ``CUDA_DEVICE_MEMORY_LIMIT[_0]`` (bytes, or a ``k``/``m``/``g`` suffix:
  KiB/MiB/GiB) and ``CUDA_DEVICE_SM_LIMIT[_0]`` (percent), which only narrow: read with a
  workstation region or with no region at all, ignored beside a cluster region as the shim ignores
  them.

The control file is read with fixed offsets of its version-2 layout (the core does not import the
node agent, whose ``region.py`` mirrors the C header; a unit test checks the offsets against it).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from neuronetes.runtime.errors import InvalidArgument, RuntimeErrorBase

REGION_DIR = "/run/neuronetes"
CONTROL_MAGIC = 0x4C52544E4F434E4E  # b"NNCONTRL" little-endian
CONTROL_SIZE = 16384
REGION_VERSION_MAJOR = 2
REGION_F_READY = 1 << 0
REGION_F_WORKSTATION = 1 << 1
DEV_F_MIG = 1 << 0
# Byte offsets in the control file (nn_control): header, container, device 0.
OFF_MAGIC = 0
OFF_VERSION_MAJOR = 8
OFF_FLAGS = 40
OFF_CONTAINER_MEMORY_LIMIT = 128
OFF_CONTAINER_DEVICE_COUNT = 156
OFF_DEVICES = 384
OFF_DEVICE_MEMORY_LIMIT = 64
OFF_DEVICE_MEMORY_TOTAL = 72
OFF_DEVICE_COMPUTE_SHARE = 80
OFF_DEVICE_FLAGS = 88

_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class ContainerLimitsError(RuntimeErrorBase):
    """A region control file exists but cannot be used; like the shim, the runtime fails closed."""


@dataclass(frozen=True, slots=True)
class ContainerLimits:
    """What the container may use: `memory_bytes` and `bandwidth` (a share in (0, 1]); None where
    nothing limits it. `source` says where the figures came from (a path, variables, or "none")."""

    memory_bytes: int | None = None
    bandwidth: float | None = None
    source: str = "none"


def _control_path(environ: Mapping[str, str]) -> Path | None:
    fixed = Path(REGION_DIR) / "control"
    if os.path.lexists(fixed):
        return fixed
    other = environ.get("NEURONETES_REGION_DIR")
    if other and os.path.lexists(Path(other) / "control"):
        return Path(other) / "control"
    return None


def _read_control(path: Path) -> tuple[int | None, float | None, bool]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ContainerLimitsError(f"{path}: cannot read the region's control file: {exc}") from None
    if len(data) != CONTROL_SIZE:
        raise ContainerLimitsError(f"{path}: {len(data)} bytes, expected {CONTROL_SIZE}")
    (magic,) = struct.unpack_from("<Q", data, OFF_MAGIC)
    (major,) = struct.unpack_from("<H", data, OFF_VERSION_MAJOR)
    (flags,) = struct.unpack_from("<I", data, OFF_FLAGS)
    if magic != CONTROL_MAGIC:
        raise ContainerLimitsError(f"{path}: not a NeuroNetes control file (bad magic)")
    if major != REGION_VERSION_MAJOR:
        raise ContainerLimitsError(
            f"{path}: region version {major} is not readable (major {REGION_VERSION_MAJOR})"
        )
    if not flags & REGION_F_READY:
        raise ContainerLimitsError(f"{path}: region is not ready")
    (container_limit,) = struct.unpack_from("<Q", data, OFF_CONTAINER_MEMORY_LIMIT)
    (device_count,) = struct.unpack_from("<I", data, OFF_CONTAINER_DEVICE_COUNT)
    if device_count < 1:
        raise ContainerLimitsError(f"{path}: region lists no device")
    device_limit, device_total, share, device_flags = struct.unpack_from(
        "<QQII", data, OFF_DEVICES + OFF_DEVICE_MEMORY_LIMIT
    )
    memory = min(v for v in (container_limit, device_limit, device_total) if v) if device_limit else None
    bandwidth = 1.0 if device_flags & DEV_F_MIG else min(max(share, 1), 100) / 100
    return memory, bandwidth, bool(flags & REGION_F_WORKSTATION)


def _env_bytes(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    scale = _SUFFIXES.get(raw[-1].lower(), 1)
    digits = raw[:-1] if raw[-1].lower() in _SUFFIXES else raw
    if not digits.isdigit() or int(digits) <= 0:
        raise InvalidArgument(
            name, f"expected a positive byte count with an optional k/m/g suffix, got {raw!r}"
        )
    return int(digits) * scale


def _env_share(environ: Mapping[str, str], name: str) -> float | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise InvalidArgument(name, f"expected a percentage 1..100, got {raw!r}")
    return int(raw) / 100


def _smallest(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def container_limits(environ: Mapping[str, str] | None = None) -> ContainerLimits:
    """The limits of the container this process runs in (see the module docstring), or no limits.

    Raises:
        ContainerLimitsError: a control file is there but unusable (wrong magic, version, size,
            not ready, no device).
        InvalidArgument: a limit variable that is not a number (named).
    """
    env = os.environ if environ is None else environ
    memory: int | None = None
    bandwidth: float | None = None
    sources: list[str] = []
    read_env = True
    path = _control_path(env)
    if path is not None:
        memory, bandwidth, workstation = _read_control(path)
        read_env = workstation
        sources.append(str(path))
    if read_env:
        env_memory = _smallest(
            _env_bytes(env, "CUDA_DEVICE_MEMORY_LIMIT"), _env_bytes(env, "CUDA_DEVICE_MEMORY_LIMIT_0")
        )
        env_share = _smallest(
            _env_share(env, "CUDA_DEVICE_SM_LIMIT"), _env_share(env, "CUDA_DEVICE_SM_LIMIT_0")
        )
        if env_memory is not None or env_share is not None:
            sources.append("CUDA_DEVICE_* variables")
        smallest_memory = _smallest(memory, env_memory)
        memory = None if smallest_memory is None else int(smallest_memory)
        bandwidth = _smallest(bandwidth, env_share)
    return ContainerLimits(memory, bandwidth, " + ".join(sources) or "none")
