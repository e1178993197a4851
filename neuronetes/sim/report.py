"""Side-by-side tables against the FGD paper's published results, and allocation plots."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from neuronetes.sim.simulate import REPORT_POINTS, RunResult

PAPER_POLICY = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}


def load_expected(directory: str | Path, workload: str) -> dict[str, list[list[float]]]:
    """Paper results for one workload: paper policy name → per-seed allocated % at 0..130 arrived."""
    path = Path(directory) / "analysis_allo_discrete.csv"
    out: dict[str, list[list[float]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["workload"] != workload:
                continue
            out.setdefault(row["sc_policy"], []).append([float(row[str(p)]) for p in range(131)])
    return out


def paper_median_unallocated(expected: dict[str, list[list[float]]], policy: str, point: int) -> float | None:
    runs = expected.get(PAPER_POLICY.get(policy, ""), [])
    if not runs:
        return None
    return statistics.median(100.0 - r[point] for r in runs)


def table(
    trace: str, results: Mapping[str, Sequence[RunResult]], expected: dict[str, list[list[float]]] | None
) -> str:
    head = f"{'policy':<11}" + "".join(f"{f'unalloc@{p}%':>14}" for p in REPORT_POINTS)
    if expected is not None:
        head += f"{'paper@100%':>12}{'delta':>8}"
    lines = [f"trace: {trace}", head, "-" * len(head)]
    for policy, runs in results.items():
        meds = [statistics.median(r.unallocated(p) for r in runs) for p in REPORT_POINTS]
        line = f"{policy:<11}" + "".join(f"{m:>14.2f}" for m in meds)
        if expected is not None:
            paper = paper_median_unallocated(expected, policy, 100)
            if paper is None:
                fgd = paper_median_unallocated(expected, "fgd", 100)
                line += f"{'-':>12}" + (f"{meds[1] - fgd:>+8.2f}" if fgd is not None else f"{'-':>8}")
            else:
                line += f"{paper:>12.2f}{meds[1] - paper:>+8.2f}"
        lines.append(line)
    if expected is not None:
        lines.append(
            "delta: ours − paper for the same policy; for policies the paper lacks, ours − paper FGD."
        )
    return "\n".join(lines)


def plot(
    path: str | Path,
    trace: str,
    results: Mapping[str, Sequence[RunResult]],
    expected: dict[str, list[list[float]]] | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    xs = list(range(131))
    for policy, runs in results.items():
        med = [statistics.median(r.allocated_pct[x] for r in runs) for x in xs]
        ax.plot(xs, med, label=policy)
    if expected:
        for policy in results:
            runs_p = expected.get(PAPER_POLICY.get(policy, ""), [])
            if runs_p:
                ax.plot(
                    xs, [statistics.median(r[x] for r in runs_p) for x in xs], "--", label=f"{policy} (paper)"
                )
    ax.plot(xs, [min(x, 100) for x in xs], ":", color="grey", label="ideal")
    ax.set_xlabel("arrived GPU requests (% of cluster GPUs)")
    ax.set_ylabel("allocated GPUs (% of cluster GPUs)")
    ax.set_title(f"allocation vs arrival — {trace}")
    ax.set_xlim(60, 130)
    ax.set_ylim(60, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
