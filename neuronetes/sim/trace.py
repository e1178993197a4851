"""Reading Alibaba openb-format node and pod lists into the core model."""

from __future__ import annotations

import csv
from pathlib import Path

from neuronetes.model import MILLI_PER_GPU, GpuSpec, NodeSpec, PodRequest

# Usable memory per GPU model code found in the openb traces (MiB); unknown codes get 16 GiB.
GPU_MEMORY_MIB: dict[str, int] = {
    "P4": 7611,
    "2080": 11019,
    "1080": 11178,
    "M40": 11448,
    "T4": 15109,
    "V100M16": 16160,
    "P100": 16280,
    "A10": 22731,
    "3090": 24268,
    "V100M32": 32510,
    "A100": 81251,
}
_DEFAULT_GPU_MEMORY_MIB = 16384


class TraceError(ValueError):
    """A trace file is missing a column or holds a value that cannot be read."""


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
        return list(reader)


def _int(row: dict[str, str], col: str, path: Path, line: int) -> int:
    raw = (row.get(col) or "").strip()
    if raw in ("", "nan"):
        return 0
    try:
        return int(float(raw))
    except ValueError:
        raise TraceError(f"{path}:{line}: column {col!r} is not a number: {raw!r}") from None


def load_nodes(path: str | Path) -> list[NodeSpec]:
    p = Path(path)
    nodes = []
    for k, row in enumerate(_rows(p, ("sn", "cpu_milli", "memory_mib", "gpu", "model")), start=2):
        model = (row["model"] or "").strip()
        model = "" if model == "nan" else model
        n_gpu = _int(row, "gpu", p, k)
        mem = GPU_MEMORY_MIB.get(model, _DEFAULT_GPU_MEMORY_MIB)
        gpus = tuple(
            GpuSpec(index=j, uuid=f"GPU-{row['sn']}-{j}", model=model, memory_mib=mem) for j in range(n_gpu)
        )
        nodes.append(NodeSpec(row["sn"], _int(row, "cpu_milli", p, k), _int(row, "memory_mib", p, k), gpus))
    return nodes


def load_pods(path: str | Path) -> list[PodRequest]:
    """Pods from an openb pod list (the 11-column lists and the 5-column multigpu lists)."""
    p = Path(path)
    pods = []
    for k, row in enumerate(_rows(p, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")), start=2):
        n_gpu = _int(row, "num_gpu", p, k)
        milli = _int(row, "gpu_milli", p, k) if n_gpu else MILLI_PER_GPU
        if n_gpu and not 0 < milli <= MILLI_PER_GPU:
            raise TraceError(f"{p}:{k}: gpu_milli {milli} out of range 1..1000")
        spec = (row.get("gpu_spec") or "").strip()
        models = tuple(sorted({m for m in spec.split("|") if m and m != "nan"})) if n_gpu else ()
        pods.append(
            PodRequest(
                name=row["name"],
                cpu_milli=_int(row, "cpu_milli", p, k),
                memory_mib=_int(row, "memory_mib", p, k),
                gpus=n_gpu,
                gpu_milli=milli,
                gpu_models=models,
            )
        )
    return pods
