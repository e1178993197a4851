"""bench/openb_variants.py: derived workloads hold the asked mix and stay readable traces."""

from __future__ import annotations

import importlib.util
import random
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


def _fraction(variants, rows, keep) -> float:
    demand = variants._demand
    return sum(demand(r) for r in rows if keep(r)) / sum(demand(r) for r in rows)


@pytest.mark.parametrize("fraction", [0.2, 0.6, 0.8])
def test_share_variant_holds_the_share_of_demand_and_the_pod_count(variants, fraction) -> None:
    rows = ROWS * 50  # 5,000 pods: sampling noise well under the tolerance
    out = variants.share_variant(rows, fraction, random.Random(1))
    assert len(out) == len(rows)
    assert sum(1 for r in out if r["num_gpu"] == "0") == 20 * 50  # CPU-only pods kept
    assert _fraction(variants, out, variants._is_share) == pytest.approx(fraction, abs=0.03)
    with pytest.raises(ValueError):
        variants.share_variant(ROWS, 1.0, random.Random(1))
    with pytest.raises(ValueError, match="both"):  # nothing to resample from
        variants.share_variant([r for r in ROWS if not variants._is_share(r)], 0.5, random.Random(1))


def test_multi_variant_adds_multi_gpu_pods_until_their_share(variants) -> None:
    out = variants.multi_variant(ROWS, 0.5, random.Random(2))
    assert len(out) > len(ROWS)
    assert _fraction(variants, out, variants._is_multi) >= 0.5
    # Only multi-GPU pods were added.
    assert sum(1 for r in out if not variants._is_multi(r)) == sum(
        1 for r in ROWS if not variants._is_multi(r)
    )
    with pytest.raises(ValueError, match="no multi-GPU"):
        variants.multi_variant([r for r in ROWS if not variants._is_multi(r)], 0.5, random.Random(2))


def test_spec_variant_pins_pods_to_models_that_can_host_them(variants) -> None:
    nodes = [
        {"sn": "a", "cpu_milli": "96000", "memory_mib": "1", "gpu": "8", "model": "V100"},
        {"sn": "b", "cpu_milli": "32000", "memory_mib": "1", "gpu": "2", "model": "T4"},
    ]
    out = variants.spec_variant(ROWS, nodes, 1.0, random.Random(3))
    gpu_pods = [r for r in out if r["num_gpu"] != "0"]
    assert all(r["gpu_spec"] in {"V100", "T4"} for r in gpu_pods)
    # Pods T4 nodes cannot hold (4 or 8 GPUs, or more CPU than 32 cores) go to V100 only.
    assert all(r["gpu_spec"] == "V100" for r in gpu_pods if int(r["num_gpu"]) > 2)
    assert all(r["gpu_spec"] == "" for r in out if r["num_gpu"] == "0")


def test_written_variants_load_as_traces(variants, tmp_path) -> None:
    path = tmp_path / "openb_pod_list_x.csv"
    variants.write_rows(path, variants.share_variant(ROWS, 0.5, random.Random(4)))
    pods = load_pods(path)
    assert len(pods) == len(ROWS)
    assert len({p.name for p in pods}) == len(pods)
