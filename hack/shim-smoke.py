"""Smoke test of the image's shim (run by hack/build-image-contents.sh smoke, with the staged
venv's python, the staged shim in LD_PRELOAD and the fake driver on LD_LIBRARY_PATH).

The venv's own region writer (the agent's `neuronetes_agent.region`) gives fake GPU 0 a 64 MiB
limit; through the shim, a 32 MiB allocation succeeds and a 64 MiB one more is refused with
CUDA_ERROR_OUT_OF_MEMORY, and the device reports the limit as its size. Exits non-zero with one
line on stderr otherwise.
"""

from __future__ import annotations

import ctypes
import os
import sys

from neuronetes_agent import region as r

MIB = 1 << 20
FAKE_GPU0 = "GPU-fa4e0000-0000-4000-8000-000000000000"  # the fake driver's device 0
CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY = 0, 2


def check(what: str, rc: int, want: int = CUDA_SUCCESS) -> None:
    if rc != want:
        sys.exit(f"shim smoke: {what} returned {rc}, expected {want}")


def main() -> None:
    if "libneuronetes-cuda.so" not in os.environ.get("LD_PRELOAD", ""):
        sys.exit("shim smoke: run with the shim in LD_PRELOAD")
    r.create_region(
        os.environ["NEURONETES_REGION_DIR"], [r.DeviceLimit(FAKE_GPU0, 64 * MIB, 80 << 30)], admitted=True
    )
    cuda = ctypes.CDLL("libcuda.so.1")
    check("cuInit", cuda.cuInit(0))
    ctx = ctypes.c_void_p()
    check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0))
    check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx))
    total = ctypes.c_size_t()
    check("cuDeviceTotalMem_v2", cuda.cuDeviceTotalMem_v2(ctypes.byref(total), 0))
    if total.value != 64 * MIB:
        sys.exit(f"shim smoke: the device reports {total.value} bytes, not the 64 MiB limit")
    ptr = ctypes.c_uint64()
    check("cuMemAlloc_v2(32 MiB)", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(32 * MIB)))
    check(
        "cuMemAlloc_v2(64 MiB) over the limit",
        cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 * MIB)),
        CUDA_ERROR_OUT_OF_MEMORY,
    )


if __name__ == "__main__":
    main()
