"""How the API's quantities map onto hardware: GPU memory classes and NVLink bandwidth.

Two values of the scheduler guide's examples cannot be read literally (docs/agentpool.md):

* **GPU memory.** ``gpuRequirements.memory: 80Gi`` means "an 80 GB GPU", but GPUs report a little
  less than their marketing size: an H100 80GB reports 81559 MiB (79.6 GiB), an A10 24GB 23028 MiB,
  a T4 16GB 15360 MiB. A whole-GPU memory request therefore names a *class*: a request of ``N`` is
  satisfied by a GPU that reports at least ``N × (1 − GPU_MEMORY_CLASS_TOLERANCE)`` (7 %). 7 % covers
  the worst real shortfall (T4 6.25 %, A10 6.3 %) and is far below the step between classes
  (16 → 24 → 40 → 48 → 80 GB), so ``80Gi`` never lands on a 48 GB GPU. Slice memory
  (``GPUSlice.spec.memory``) is an allocation, not a class, and is exact: :func:`slice_memory_mib`.

* **NVLink bandwidth.** ``topology.minBandwidth: 600Gi`` is meant as A100 NVLink's nominal 600 GB/s,
  yet 600 GiB/s is 644 GB/s, more than any A100 has. Vendors quote link bandwidth in decimal units and
  users copy the number, so a bandwidth quantity is converted to nominal GB/s reading a binary suffix
  as its decimal counterpart (``Gi`` = ``G`` = 10⁹ bytes/s): ``600Gi`` → 600 GB/s. Numbers without a
  suffix and decimal suffixes are bytes/s (``600G`` = ``600e9`` → 600 GB/s). The result is compared
  with the nominal per-GPU figure of :data:`NOMINAL_NVLINK_GBPS`, the unit of
  ``GPUNode.status.gpus[].nvlinkBandwidthGBps`` and of the engine's ``min_bandwidth_gbps``.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Final

from neuronetes.quantity import QuantityError, QuantityLike, parse_quantity

__all__ = [
    "BANDWIDTH_EPSILON_GBPS",
    "GPU_MEMORY_CLASSES_GB",
    "GPU_MEMORY_CLASS_TOLERANCE",
    "MAX_GPU_MEMORY_GB",
    "MAX_NVLINK_GBPS",
    "NOMINAL_NVLINK_GBPS",
    "bandwidth_gbps",
    "bandwidth_satisfies",
    "gpu_memory_class_labels",
    "gpu_memory_class_min_mib",
    "gpu_memory_satisfies",
    "nominal_nvlink_gbps",
    "slice_memory_mib",
]

_MIB: Final = 1 << 20
_GB: Final = 10**9

GPU_MEMORY_CLASS_TOLERANCE: Final = Fraction(7, 100)
"""A GPU may report this fraction less memory than a whole-GPU request names and still satisfy it."""

GPU_MEMORY_CLASSES_GB: Final = (
    *(4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80),
    *(94, 96, 141, 144, 180, 192, 288),
)
"""Marketing sizes of GPU memory in GB, read as Gi in labels and requests (``80Gi``): the values of the
node label ``neuronetes.io/gpu-memory`` (a GPU is labelled with the largest class it satisfies)."""

MAX_GPU_MEMORY_GB: Final = GPU_MEMORY_CLASSES_GB[-1]
"""The most memory any GPU model has (GB300: 288 GB); a larger request can never be satisfied. The CRDs
repeat it as ``288Gi`` in their CEL bounds (tests/unit/test_operator_validation.py checks they agree)."""

BANDWIDTH_EPSILON_GBPS: Final = 1e-6
"""Float slack when comparing GB/s figures (both sides are nominal, so equality must pass)."""

NOMINAL_NVLINK_GBPS: Final[dict[str, float]] = {
    # Total NVLink bandwidth per GPU (both directions), as NVIDIA's datasheets give it.
    "GB200": 1800.0,
    "B200": 1800.0,
    "B100": 1800.0,
    "H200": 900.0,
    "H100": 900.0,
    "H800": 400.0,
    "A100": 600.0,
    "A800": 400.0,
    "V100": 300.0,
    "P100": 160.0,
}
"""Nominal per-GPU NVLink bandwidth in decimal GB/s by GPU family (a PCIe card has no NVLink)."""

MAX_NVLINK_GBPS: Final = max(NOMINAL_NVLINK_GBPS.values())
"""The most NVLink bandwidth any GPU has; a larger ``minBandwidth`` can never be satisfied."""

# A quantity string with a binary suffix; reading the suffix as decimal is one character less.
_BINARY_SUFFIX_RE: Final = re.compile(
    r"^(?P<number>\s*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>[KMGTPE])i\s*$"
)
_DECIMAL_OF_BINARY: Final = {"K": "k", "M": "M", "G": "G", "T": "T", "P": "P", "E": "E"}


def _positive(value: Fraction, what: str, q: QuantityLike) -> Fraction:
    if value <= 0:
        raise QuantityError(f"invalid {what} {q!r}: must be positive")
    return value


def bandwidth_gbps(q: QuantityLike) -> float:
    """A bandwidth quantity in nominal decimal GB/s; binary suffixes read as decimal.

    >>> bandwidth_gbps("600Gi"), bandwidth_gbps("600G"), bandwidth_gbps("900e9"), bandwidth_gbps("1.8Ti")
    (600.0, 600.0, 900.0, 1800.0)
    """
    if isinstance(q, str):
        match = _BINARY_SUFFIX_RE.match(q)
        if match is not None:
            q = match["number"].strip() + _DECIMAL_OF_BINARY[match["suffix"]]
    return float(_positive(parse_quantity(q), "bandwidth", q) / _GB)


def nominal_nvlink_gbps(gpu_model: str) -> float:
    """Nominal NVLink bandwidth of a GPU model (NVML name or family), 0.0 when it has no NVLink.

    PCIe variants (names containing ``PCIE``) have at most a bridge; they report 0 here and the agent
    fills in what NVML measures for bridged pairs.

    >>> nominal_nvlink_gbps("NVIDIA A100-SXM4-80GB"), nominal_nvlink_gbps("H100 80GB HBM3")
    (600.0, 900.0)
    >>> nominal_nvlink_gbps("Tesla T4"), nominal_nvlink_gbps("NVIDIA H100 PCIe")
    (0.0, 0.0)
    """
    name = gpu_model.upper()
    if "PCIE" in name:
        return 0.0
    tokens = re.split(r"[^A-Z0-9]+", name)
    for family, gbps in NOMINAL_NVLINK_GBPS.items():
        if any(t == family or (t.startswith(family) and not t[len(family)].isdigit()) for t in tokens):
            return gbps
    return 0.0


def bandwidth_satisfies(request: QuantityLike, nominal_gbps: float) -> bool:
    """Whether a GPU (or NVLink group) with ``nominal_gbps`` meets a ``minBandwidth`` request.

    >>> bandwidth_satisfies("600Gi", nominal_nvlink_gbps("A100-SXM4-80GB"))
    True
    >>> bandwidth_satisfies("900Gi", 600.0)
    False
    """
    return nominal_gbps + BANDWIDTH_EPSILON_GBPS >= bandwidth_gbps(request)


def gpu_memory_class_min_mib(q: QuantityLike) -> int:
    """The least memory (MiB, as NVML reports it) a GPU may have and satisfy a whole-GPU request ``q``.

    >>> gpu_memory_class_min_mib("80Gi"), gpu_memory_class_min_mib("40Gi"), gpu_memory_class_min_mib("16Gi")
    (76186, 38093, 15238)
    """
    mib = _positive(parse_quantity(q), "GPU memory", q) / _MIB
    return math.ceil(mib * (1 - GPU_MEMORY_CLASS_TOLERANCE))


def gpu_memory_class_labels(q: QuantityLike) -> tuple[str, ...]:
    """The ``neuronetes.io/gpu-memory`` label values of the GPUs a whole-GPU request ``q`` accepts.

    A node is labelled with the largest class its GPUs satisfy, so the classes at least ``q`` are the
    ones whose GPUs satisfy ``q`` (empty when no GPU model has that much memory).

    >>> gpu_memory_class_labels("141Gi")
    ('141Gi', '144Gi', '180Gi', '192Gi', '288Gi')
    >>> gpu_memory_class_labels("70Gi")[:2], gpu_memory_class_labels("1Ti")
    (('80Gi', '94Gi'), ())
    """
    least = gpu_memory_class_min_mib(q)
    return tuple(f"{gb}Gi" for gb in GPU_MEMORY_CLASSES_GB if gb * 1024 >= least)


def gpu_memory_satisfies(request: QuantityLike, gpu_memory_mib: int) -> bool:
    """Whether a GPU reporting ``gpu_memory_mib`` MiB is of the class ``request`` names.

    >>> gpu_memory_satisfies("80Gi", 81559), gpu_memory_satisfies("80Gi", 49140)
    (True, False)
    """
    return gpu_memory_mib >= gpu_memory_class_min_mib(request)


def slice_memory_mib(q: QuantityLike) -> int:
    """Exact GPU memory of a slice in MiB (the unit of ``neuronetes.io/gpu-memory``), rounded up.

    >>> slice_memory_mib("10Gi"), slice_memory_mib("1G"), slice_memory_mib(1)
    (10240, 954, 1)
    """
    return math.ceil(_positive(parse_quantity(q), "GPU memory", q) / _MIB)
