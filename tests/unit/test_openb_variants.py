"""bench/openb_variants.py: derived workloads hold the asked mix and stay readable traces."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from neuronetes.sim.trace import load_pods

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench" / "openb_variants.py"


@pytest.fixture(scope="module")
def variants() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openb_variants", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(cpu: int, gpus: int, milli: int) -> dict[str, str]:
    return {
        "name": "p",
        "cpu_milli": str(cpu),
        "memory_mib": "1024",
        "num_gpu": str(gpus),
        "gpu_milli": str(milli),
        "gpu_spec": "",
    }


ROWS = (
    [_row(4000, 0, 0)] * 20
    + [_row(8000, 1, 1000)] * 50
    + [_row(4000, 1, 500)] * 20
    + [_row(4000, 1, 250)] * 5
    + [_row(32000, 4, 1000)] * 4
    + [_row(64000, 8, 1000)] * 1
)


def _fraction(
    variants: ModuleType, rows: list[dict[str, str]], keep: Callable[[dict[str, str]], bool]
) -> float:
    demand = variants._demand
    return float(sum(demand(r) for r in rows if keep(r)) / sum(demand(r) for r in rows))


@pytest.mark.parametrize("fraction", [0.2, 0.6, 0.8])
def test_share_variant_holds_the_share_of_demand_and_the_pod_count(
    variants: ModuleType, fraction: float
) -> None:
    rows = ROWS * 50  # 5,000 pods: sampling noise well under the tolerance
    out = variants.share_variant(rows, fraction, random.Random(1))
    assert len(out) == len(rows)
    assert sum(1 for r in out if r["num_gpu"] == "0") == 20 * 50  # CPU-only pods kept
    assert _fraction(variants, out, variants._is_share) == pytest.approx(fraction, abs=0.03)
    with pytest.raises(ValueError):
        variants.share_variant(ROWS, 1.0, random.Random(1))
    with pytest.raises(ValueError, match="both"):  # nothing to resample from
        variants.share_variant([r for r in ROWS if not variants._is_share(r)], 0.5, random.Random(1))


def test_multi_variant_adds_multi_gpu_pods_until_their_share(variants: ModuleType) -> None:
    out = variants.multi_variant(ROWS, 0.5, random.Random(2))
    assert len(out) > len(ROWS)
    assert _fraction(variants, out, variants._is_multi) >= 0.5
    # Only multi-GPU pods were added.
    assert sum(1 for r in out if not variants._is_multi(r)) == sum(
        1 for r in ROWS if not variants._is_multi(r)
    )
    with pytest.raises(ValueError, match="no multi-GPU"):
        variants.multi_variant([r for r in ROWS if not variants._is_multi(r)], 0.5, random.Random(2))


def _node(model: str, gpus: int, cpu: int) -> dict[str, str]:
    return {"sn": model, "cpu_milli": str(cpu), "memory_mib": "1", "gpu": str(gpus), "model": model}


def test_spec_variant_pins_pods_to_models_that_can_host_them(variants: ModuleType) -> None:
    nodes = [_node("V100", 8, 96000), _node("T4", 2, 32000)]
    out = variants.spec_variant(ROWS, nodes, 1.0, random.Random(3), list_share=0.0)
    gpu_pods = [r for r in out if r["num_gpu"] != "0"]
    assert all(r["gpu_spec"] in {"V100", "T4"} for r in gpu_pods)
    # Pods T4 nodes cannot hold (4 or 8 GPUs, or more CPU than 32 cores) go to V100 only.
    assert all(r["gpu_spec"] == "V100" for r in gpu_pods if int(r["num_gpu"]) > 2)
    assert all(r["gpu_spec"] == "" for r in out if r["num_gpu"] == "0")


def test_spec_variant_follows_the_model_mix_keeps_the_shape_mix_and_lists_some_models(
    variants: ModuleType,
) -> None:
    # 30 T4 nodes, 10 P100, 10 V100 (V100 alone can host the 4- and 8-GPU pods).
    nodes = [_node("T4", 2, 64000)] * 30 + [_node("P100", 2, 64000)] * 10 + [_node("V100", 8, 96000)] * 10
    rows = ROWS * 40
    out = variants.spec_variant(rows, nodes, 0.3, random.Random(5))
    gpu_rows = [r for r in out if r["num_gpu"] != "0"]
    pinned = [r for r in gpu_rows if r["gpu_spec"]]
    assert len(pinned) == round(0.3 * len(gpu_rows))
    # Pinned pods are drawn uniformly: their shape mix is the GPU pods' own.
    for gpus in ("1", "4"):
        share_all = sum(r["num_gpu"] == gpus for r in gpu_rows) / len(gpu_rows)
        share_pinned = sum(r["num_gpu"] == gpus for r in pinned) / len(pinned)
        assert share_pinned == pytest.approx(share_all, abs=0.04)
    lists = [r["gpu_spec"].split("|") for r in pinned]
    several = [m for m in lists if len(m) > 1]
    assert len(several) / len(lists) == pytest.approx(variants.LIST_SHARE, abs=0.04)
    assert all(len(m) in (2, 3) and len(set(m)) == len(m) and m == sorted(m) for m in several)
    # One-model pins of small pods follow the node counts (30 : 10 : 10).
    small = [m[0] for r, m in zip(pinned, lists, strict=True) if len(m) == 1 and r["num_gpu"] == "1"]
    assert small.count("T4") / len(small) == pytest.approx(0.6, abs=0.06)
    assert small.count("P100") / len(small) == pytest.approx(0.2, abs=0.06)
    # Every listed model can host the pod.
    big = [m for r, m in zip(pinned, lists, strict=True) if int(r["num_gpu"]) > 2]
    assert big and all(m == ["V100"] for m in big)
    by_gpus = variants.spec_variant(rows, nodes, 0.3, random.Random(5), "gpus", 0.0)
    small_gpus = [r["gpu_spec"] for r in by_gpus if r["gpu_spec"] and r["num_gpu"] == "1"]
    assert small_gpus.count("V100") / len(small_gpus) == pytest.approx(80 / 160, abs=0.06)
    with pytest.raises(ValueError, match="list share"):
        variants.spec_variant(rows, nodes, 0.3, random.Random(5), list_share=1.5)


def test_written_variants_load_as_traces(variants: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "openb_pod_list_x.csv"
    variants.write_rows(path, variants.share_variant(ROWS, 0.5, random.Random(4)))
    pods = load_pods(path)
    assert len(pods) == len(ROWS)
    assert len({p.name for p in pods}) == len(pods)
