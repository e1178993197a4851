"""The GPU backends where CI runs (no CuPy, no PyTorch, no GPU): the module imports and says the
backends are unavailable; on a GPU the GPU validation's `runtime` check runs them."""

from __future__ import annotations

import importlib.util

import pytest

from neuronetes.runtime import gpu_backends

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("module", "available"),
    [("cupy", gpu_backends.cupy_available), ("torch", gpu_backends.torch_available)],
)
def test_a_backend_whose_framework_is_missing_is_unavailable(module: str, available: object) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here: the GPU validation checks it")
    assert callable(available) and available() is False
