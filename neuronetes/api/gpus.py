"""The GPU models NeuroNetes knows: what ``gpuRequirements.type`` may name.

A pool's type is matched against the node label ``neuronetes.io/gpu-type``, which the node agent
(and the dev cluster's simulated nodes) set to the GPU's *family*: the first word of the model
name, upper-cased (``NVIDIA A100-SXM4-80GB`` → ``A100``; `neuronetes.profiles.gpu_type_label`).
The pods' node affinity names the type as written and upper-cased, so ``a100`` and ``A100`` both
match and ``A100-80GB`` matches no node: the memory size is ``gpuRequirements.memory``.

`GPU_FAMILIES` is the catalog: per family, the memory sizes it is sold with (GB, the classes of
`neuronetes.api.units`); the MIG profiles of the MIG-capable ones are `neuronetes.mig`'s catalogs
and the NVLink figures `neuronetes.api.units.NOMINAL_NVLINK_GBPS`. The admission webhook refuses
a type naming no family here, and the operator reports a pool of a known family that no node has
(condition ``NoMatchingNodes``). A GPU family missing here is added here (one line).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["GPU_FAMILIES", "family_of", "type_problem"]

# fmt: off
GPU_FAMILIES: Final[dict[str, tuple[int, ...]]] = {
    # data centre: Blackwell, Hopper
    "GB300": (288,), "B300": (288,), "GB200": (192,), "B200": (180, 192), "B100": (192,),
    "GH200": (96, 144), "H200": (141,), "H100": (80, 94, 96), "H800": (80,), "H20": (96,),
    # Ada, Ampere
    "L40S": (48,), "L40": (48,), "L20": (48,), "L4": (24,),
    "A100": (40, 80), "A800": (40, 80), "A40": (48,), "A30": (24,), "A16": (16,), "A10G": (24,),
    "A10": (24,), "A2": (16,),
    # Turing, Volta, Pascal
    "T4": (16,), "V100": (16, 32), "P100": (12, 16), "P40": (24,), "P4": (8,),
    # workstation and consumer cards, as NVML names them (``NVIDIA RTX A6000``, ``NVIDIA GeForce
    # RTX 4090``): their first word is the family label
    "RTX": (16, 20, 24, 32, 48), "GEFORCE": (8, 10, 11, 12, 16, 24, 32), "QUADRO": (16, 24, 48),
    "TITAN": (12, 24),
}
# fmt: on
"""Every GPU family NeuroNetes knows (the ``neuronetes.io/gpu-type`` label value) → its memory sizes, GB."""


def family_of(gpu_type: str) -> str:
    """The family label a pool's type is compared with (``a100`` → ``A100``)."""
    return gpu_type.strip().upper()


def type_problem(gpu_type: str) -> str | None:
    """Why `gpu_type` names no known GPU family (None: it names one), saying what to write."""
    family = family_of(gpu_type)
    if family in GPU_FAMILIES:
        return None
    head = re.split(r"[\s_-]+", re.sub(r"^NVIDIA[\s_-]+", "", family))[0]
    if head in GPU_FAMILIES and head != family:
        sizes = " or ".join(f"{gb}Gi" for gb in GPU_FAMILIES[head])
        return (
            f"{gpu_type!r} is a model, not a GPU type: nodes are labelled with the family; write "
            f"{head!r} (and gpuRequirements.memory, e.g. {sizes}, for its size)"
        )
    return f"{gpu_type!r} is no GPU model NeuroNetes knows; use one of {', '.join(sorted(GPU_FAMILIES))}"
