"""neuronetes.api.units: GPU memory classes and nominal NVLink bandwidth."""

from __future__ import annotations

import doctest

import pytest

from neuronetes.api import units
from neuronetes.api.units import (
    bandwidth_gbps,
    bandwidth_satisfies,
    gpu_memory_class_min_mib,
    gpu_memory_satisfies,
    nominal_nvlink_gbps,
    slice_memory_mib,
)
from neuronetes.quantity import QuantityError

pytestmark = pytest.mark.unit

# What NVML reports (MiB) for common GPUs.
A100_80GB = 81920
H100_80GB = 81559
A100_40GB = 40960
L40S = 46068
A6000 = 49140
A10 = 23028
L4 = 23034
T4 = 15360


def test_doctests() -> None:
    result = doctest.testmod(units)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize(
    ("q", "gbps"),
    [
        ("600Gi", 600.0),  # the seed's A100 example: GB/s nominal, not 644 GB/s
        ("600G", 600.0),
        ("600e9", 600.0),
        (600_000_000_000, 600.0),
        ("900Gi", 900.0),
        ("1.8Ti", 1800.0),
        ("1800G", 1800.0),
        ("300000Mi", 300.0),
        ("64Gi", 64.0),
    ],
)
def test_bandwidth_reads_binary_suffixes_as_decimal(q: str | int, gbps: float) -> None:
    assert bandwidth_gbps(q) == pytest.approx(gbps)


@pytest.mark.parametrize("q", ["0", "-600Gi", "lots", ""])
def test_bandwidth_refuses_non_positive_or_invalid(q: str) -> None:
    with pytest.raises(QuantityError):
        bandwidth_gbps(q)


@pytest.mark.parametrize(
    ("model", "gbps"),
    [
        ("NVIDIA A100-SXM4-80GB", 600.0),
        ("A100-SXM4-40GB", 600.0),
        ("NVIDIA H100 80GB HBM3", 900.0),
        ("NVIDIA H200", 900.0),
        ("NVIDIA B200", 1800.0),
        ("Tesla V100-SXM2-32GB", 300.0),
        ("NVIDIA A100-PCIE-40GB", 0.0),
        ("NVIDIA H100 PCIe", 0.0),
        ("Tesla T4", 0.0),
        ("NVIDIA RTX A1000", 0.0),  # not an A100
        ("NVIDIA L40S", 0.0),
    ],
)
def test_nominal_nvlink(model: str, gbps: float) -> None:
    assert nominal_nvlink_gbps(model) == gbps


def test_seed_tensor_parallel_example_places_on_a100_and_h100_nvlink() -> None:
    assert bandwidth_satisfies("600Gi", nominal_nvlink_gbps("A100-SXM4-80GB"))
    assert bandwidth_satisfies("600Gi", nominal_nvlink_gbps("H100 80GB HBM3"))
    assert not bandwidth_satisfies("600Gi", nominal_nvlink_gbps("Tesla V100-SXM2-32GB"))
    assert not bandwidth_satisfies("600Gi", nominal_nvlink_gbps("Tesla T4"))
    assert not bandwidth_satisfies("900Gi", 600.0)


@pytest.mark.parametrize(
    ("request_q", "gpu_mib", "fits"),
    [
        ("80Gi", A100_80GB, True),
        ("80Gi", H100_80GB, True),  # 79.6 GiB reported: still the 80 GB class
        ("80Gi", A6000, False),
        ("80Gi", A100_40GB, False),
        ("48Gi", A6000, True),
        ("48Gi", L40S, True),
        ("40Gi", A100_40GB, True),
        ("40Gi", A100_80GB, True),  # a bigger GPU satisfies a smaller class
        ("40Gi", A10, False),
        ("24Gi", A10, True),
        ("24Gi", L4, True),
        ("16Gi", T4, True),
        ("24Gi", T4, False),
        ("80G", H100_80GB, True),  # decimal spelling
    ],
)
def test_gpu_memory_class(request_q: str, gpu_mib: int, fits: bool) -> None:
    assert gpu_memory_satisfies(request_q, gpu_mib) is fits


def test_memory_tolerance_separates_neighbouring_classes() -> None:
    # The smallest step between marketed sizes (40 -> 48, 20 %) is far above the 7 % tolerance.
    for small, big in [(16, 24), (24, 40), (40, 48), (48, 80), (80, 94), (94, 141)]:
        assert gpu_memory_class_min_mib(f"{big}Gi") > small * 1024


def test_slice_memory_is_exact() -> None:
    assert slice_memory_mib("10Gi") == 10240
    assert slice_memory_mib("10G") == 9537  # 10e9 bytes rounded up to MiB
    assert slice_memory_mib(1) == 1
    with pytest.raises(QuantityError):
        slice_memory_mib("0")
