"""Derive openb-style workload variants from the default trace, to test that a policy generalises.

The openb repository ships variants of its default pod list that emphasise one kind of workload
(GPU-sharing, multi-GPU, CPU-only, GPU-type constraints). Only three of them are bundled here,
so a policy could fit those three by accident. This script derives more, the same way, from
`openb_pod_list_default.csv`, with a seed of its own:

- `gpushareXX`: the GPU pods resampled (with replacement, pod count kept) so that GPU-sharing
  pods hold XX % of the GPU demand; CPU-only pods kept as they are. (openb's gpushare40 keeps the
  default's 8,152 pods and its 1,088 CPU-only ones, with 40 % of GPU demand in shares.)
- `multigpuXX`: multi-GPU pods sampled and added until they hold XX % of the GPU demand; every
  default pod kept. (openb's multigpu20 keeps all 8,152 and adds 172.)
- `gpuspecXX`: XX % of the GPU pods (drawn uniformly, so the shape mix is kept) pinned to GPU
  models (`gpu_spec`): one model each, drawn by the node count of the models whose nodes can
  host the pod, so the models with the most nodes get the most pins; one pinned pod in five
  lists two or three models (`V100M16|P100|T4`). `--spec-weighting gpus` or `uniform` draws the
  models by GPU count or uniformly instead (files `gpuspecXX-gpus`, `gpuspecXX-uniform`): other
  pinning families, to check that a policy does not fit one.

    python bench/openb_variants.py --out out/variants [--seed 7] [--share 20,60,80] \
        [--multi 50] [--spec 5,10,20,33] [--spec-weighting nodes,gpus]

then, per written file F: `neuronetes simulate --nodes ... --pods F --policy fgd,default ...`.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, cast

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("NEURONETES_TRACE_DIR", ROOT.parent / "shared" / "data" / "openb" / "csv"))
COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")

Row = dict[str, str]


def _demand(row: Row) -> int:
    gpus = int(row["num_gpu"])
    return gpus * int(row["gpu_milli"]) if gpus else 0


def _is_share(row: Row) -> bool:
    return int(row["num_gpu"]) == 1 and int(row["gpu_milli"]) < 1000


def _is_multi(row: Row) -> bool:
    return int(row["num_gpu"]) >= 2


def read_rows(path: Path) -> list[Row]:
    with path.open(newline="") as fh:
        rows = [{c: (r.get(c) or "") for c in COLUMNS} for r in csv.DictReader(fh)]
    for r in rows:
        if r["gpu_spec"] == "nan":
            r["gpu_spec"] = ""
    return rows


def write_rows(path: Path, rows: Sequence[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for k, r in enumerate(rows):
            w.writerow({**r, "name": f"openb-pod-{k:04d}"})


def share_variant(rows: Sequence[Row], fraction: float, rng: random.Random) -> list[Row]:
    """GPU pods resampled so that shares hold `fraction` of GPU demand; pod count kept."""
    if not 0 < fraction < 1:
        raise ValueError("share fraction must be in (0, 1)")
    cpu = [r for r in rows if not int(r["num_gpu"])]
    share = [r for r in rows if _is_share(r)]
    other = [r for r in rows if int(r["num_gpu"]) and not _is_share(r)]
    if not share or not other:
        raise ValueError("the pod list needs both GPU-sharing and other GPU pods to resample")
    n = len(share) + len(other)
    m_share = sum(map(_demand, share)) / len(share)
    m_other = sum(map(_demand, other)) / len(other)
    # n_s * m_s / (n_s * m_s + (n - n_s) * m_o) = fraction
    n_share = round(fraction * n * m_other / (m_share * (1 - fraction) + fraction * m_other))
    n_share = min(max(n_share, 1), n - 1)
    picked = rng.choices(share, k=n_share) + rng.choices(other, k=n - n_share)
    out = cpu + picked
    rng.shuffle(out)
    return out


def multi_variant(rows: Sequence[Row], fraction: float, rng: random.Random) -> list[Row]:
    """Every pod kept, multi-GPU pods added until they hold `fraction` of GPU demand."""
    if not 0 < fraction < 1:
        raise ValueError("multi-GPU fraction must be in (0, 1)")
    multi = [r for r in rows if _is_multi(r)]
    if not multi:
        raise ValueError("the pod list has no multi-GPU pods to sample")
    out = list(rows)
    total = sum(map(_demand, out))
    held = sum(map(_demand, multi))
    while held < fraction * total:
        r = rng.choice(multi)
        out.append(dict(r))
        held += _demand(r)
        total += _demand(r)
    rng.shuffle(out)
    return out


Weighting = Literal["nodes", "gpus", "uniform"]
WEIGHTINGS: tuple[Weighting, ...] = ("nodes", "gpus", "uniform")
LIST_SHARE = 0.2
"""Share of pinned pods that list several models (the rest name one)."""


def _hosts(nodes: Sequence[Row], want: tuple[int, int], weighting: Weighting) -> dict[str, float]:
    """Models with nodes that can host `want` = (GPUs, CPU), each with its draw weight."""
    weight: dict[str, float] = {}
    for n in nodes:
        if n["model"] and int(n["gpu"]) >= want[0] and int(n["cpu_milli"]) >= want[1]:
            add = {"nodes": 1.0, "gpus": float(n["gpu"]), "uniform": 0.0}[weighting]
            weight[n["model"]] = weight.get(n["model"], 0.0) + add
    if weighting == "uniform":
        weight = dict.fromkeys(weight, 1.0)
    return weight


def _draw_models(weight: dict[str, float], k: int, rng: random.Random) -> list[str]:
    """`k` distinct models drawn by weight, without replacement."""
    pool = dict(weight)
    picked: list[str] = []
    while pool and len(picked) < k:
        models = sorted(pool)
        m = rng.choices(models, weights=[pool[x] for x in models])[0]
        picked.append(m)
        del pool[m]
    return sorted(picked)


def spec_variant(
    rows: Sequence[Row],
    nodes: Sequence[Row],
    fraction: float,
    rng: random.Random,
    weighting: Weighting = "nodes",
    list_share: float = LIST_SHARE,
) -> list[Row]:
    """`fraction` of GPU pods pinned to GPU models (`gpu_spec`), the way production pins them.

    The pinned pods are drawn uniformly from the GPU pods, so pinned and unpinned pods have the
    same shape mix. Each pinned pod's models are drawn among those with nodes that can host it
    (enough GPUs and CPU), in proportion to `weighting`: "nodes" (the cluster's model mix by
    node count: teams pin to the models they see most, so the models with the most nodes get
    the most pins), "gpus" (by GPU count), or "uniform". `list_share` of the pinned pods accept
    a list of two or three such models (`A|B|C`, drawn the same way), the rest one model.
    """
    if not 0 < fraction <= 1:
        raise ValueError("gpu-spec fraction must be in (0, 1]")
    if not 0 <= list_share <= 1:
        raise ValueError("list share must be in [0, 1]")
    out = [dict(r) for r in rows]
    gpu_pods = [r for r in out if int(r["num_gpu"])]
    hosts: dict[tuple[int, int], dict[str, float]] = {}  # (GPUs, CPU) → draw weight per model
    for r in rng.sample(gpu_pods, round(fraction * len(gpu_pods))):
        want = (int(r["num_gpu"]), int(r["cpu_milli"]))
        weight = hosts.get(want)
        if weight is None:
            weight = hosts[want] = _hosts(nodes, want, weighting)
        k = rng.choice((2, 3)) if rng.random() < list_share else 1
        if weight:
            r["gpu_spec"] = "|".join(_draw_models(weight, k, rng))
    return out


def _fractions(spec: str) -> list[int]:
    return [int(x) for x in spec.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "variants")
    ap.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    ap.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--share", default="20,60,80", help="gpushare variants, %% of GPU demand")
    ap.add_argument("--multi", default="50", help="multigpu variants, %% of GPU demand")
    ap.add_argument("--spec", default="5,10,20,33", help="gpuspec variants, %% of GPU pods")
    ap.add_argument(
        "--spec-weighting", default="nodes", help="gpuspec model draws: comma list of nodes, gpus, uniform"
    )
    ns = ap.parse_args(argv)
    rows = read_rows(ns.pods)
    with ns.nodes.open(newline="") as fh:
        nodes = list(csv.DictReader(fh))
    made: list[tuple[str, list[Row]]] = []
    for pct in _fractions(ns.share):
        made.append((f"gpushare{pct}", share_variant(rows, pct / 100, random.Random(ns.seed * 1000 + pct))))
    for pct in _fractions(ns.multi):
        made.append((f"multigpu{pct}", multi_variant(rows, pct / 100, random.Random(ns.seed * 2000 + pct))))
    for weighting in [w.strip() for w in ns.spec_weighting.split(",") if w.strip()]:
        if weighting not in WEIGHTINGS:
            ap.error(f"--spec-weighting: {weighting!r} is not one of {', '.join(WEIGHTINGS)}")
        suffix = "" if weighting == "nodes" else f"-{weighting}"
        for pct in _fractions(ns.spec):
            rng = random.Random(ns.seed * 3000 + pct)
            variant = spec_variant(rows, nodes, pct / 100, rng, cast(Weighting, weighting))
            made.append((f"gpuspec{pct}{suffix}", variant))
    for name, variant in made:
        path = ns.out / f"openb_pod_list_{name}_s{ns.seed}.csv"
        write_rows(path, variant)
        gpu = sum(map(_demand, variant))
        share = sum(_demand(r) for r in variant if _is_share(r))
        multi = sum(_demand(r) for r in variant if _is_multi(r))
        pinned = sum(_demand(r) for r in variant if r["gpu_spec"])
        print(
            f"{path}: {len(variant)} pods, GPU demand {gpu / 1000:.0f}, "
            f"shares {100 * share / gpu:.1f} %, multi-GPU {100 * multi / gpu:.1f} %, "
            f"pinned {100 * pinned / gpu:.1f} %"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
