"""The runtime's eviction: a workload whose soft-reserved arrays exceed the memory, against a run
with room for all of them.

Three tasks each keep four soft-reserved 64×64 fp32 arrays and update them tile by tile from one
another (matrix products, five rounds); the same computation runs with room for every array and
with room for five of the twelve, so blocks are evicted to host memory (pinned on CUDA) and reloaded
on access. Prints whether the results are byte for byte the same and the tight run's eviction and
reload counts (`neuronetes.gpuvalidate.checks.runtime.evicted_vs_roomy`, which the GPU validation
runs on each GPU backend).

    python bench/runtime_eviction.py [--backend numpy|torch|cupy] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from neuronetes.gpuvalidate.checks.runtime import evicted_vs_roomy


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("numpy", "torch", "cupy"), default="numpy")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    backend: Any = None  # a backend without device_memory(): the memory manager's NumPy path
    if args.backend != "numpy":
        from neuronetes.runtime import gpu_backends as g

        available = g.torch_available if args.backend == "torch" else g.cupy_available
        if not available():
            print(
                f"error: --backend {args.backend}: the framework or a CUDA device is missing", file=sys.stderr
            )
            return 1
        backend = g.TorchBackend() if args.backend == "torch" else g.CupyBackend()
    figures = {"backend": args.backend, **evicted_vs_roomy(backend)}
    print(
        f"{args.backend}: bit-identical to the unevicted run: {figures['identical']}; "
        f"evictions {figures['evictions']}, reloads {figures['reloads']}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if figures["identical"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
