"""What the runtime's GPU backend says it may use (the runtime check, under the shim):

    runtime_capacity.py torch|cupy

Makes the backend on device 0 and prints ``RESULT {"backend", "capacity_bytes"}``: under the shim
the framework reads the container's free memory, so the capacity is at most the region's limit.
"""

from __future__ import annotations

import sys

from neuronetes.runtime.gpu_backends import CupyBackend, TorchBackend

from .cudadrv import out


def main() -> None:
    name = sys.argv[1]
    backend = TorchBackend() if name == "torch" else CupyBackend()
    out(backend=backend.name, capacity_bytes=backend.memory_capacity())


if __name__ == "__main__":
    main()
