"""Check "shim-memory": the shim's hard memory limit under the driver API, PyTorch, CuPy and a
workstation job, against NVML's own account of the process.

Every workload runs as its own process with the shim preloaded over a fresh 2 GiB region written by
the agent's region writer (the cluster's way), except the workstation sub-check, whose region the
workstation daemon writes for a ``--gpu-memory 2Gi`` job. The driver-API sub-checks run on a GPU and
over the fake driver; the PyTorch and CuPy ones need a GPU and the framework. ``vmm.driver`` runs
the VMM idiom without the shim: on a GPU it records what the real driver does, over the fake it
checks that the fake models exactly that (the shim's tests rely on it).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Final

from ..context import GIB, MIB, Context, WorkloadRun, offset_arg, parse_results
from ..model import Report
from .workstation import Workstation, WorkstationError

LIMIT: Final = 2 * GIB
OOM: Final = 2  # CUDA_ERROR_OUT_OF_MEMORY
NVML_GRAIN: Final = 2 * MIB  # NVML attributes memory in pages of this size
ATTRIBUTION_TOLERANCE: Final = 64 * MIB  # lazily loaded kernels after the context's cost was taken


class Runs:
    """The workloads this check ran (for the "no entry point refused" sub-check)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.all: list[WorkloadRun] = []

    def run(
        self,
        script: str,
        args: list[str],
        *,
        shim: bool = True,
        name: str = "",
        timeout: float = 120,
        env: dict[str, str] | None = None,
    ) -> WorkloadRun:
        region = self.ctx.region(name or script, LIMIT) if shim else None
        extra = offset_arg() if shim else []
        run = self.ctx.workload(
            script,
            [*args, "--limit", str(LIMIT), *extra],
            self.ctx.env(region, **(env or {})),
            timeout=timeout,
            name=name or script,
        )
        self.all.append(run)
        return run


def _delta(r: dict[str, Any], key: str, a: str, b: str) -> int | None:
    """The change of `key` from step `a` to step `b` (None when unknown). NVML not listing the process
    means it holds nothing: an attributed None is 0."""
    x, y = r.get(a, {}).get(key), r.get(b, {}).get(key)
    if key == "attributed":
        x, y = x or 0, y or 0
    return None if x is None or y is None else int(y) - int(x)


def check_reporting(report: Report, id: str, seen: dict[str, Any], total: int, free: int) -> None:
    charged = seen.get("charged")
    nvml = seen.get("nvml") or {}
    want_free = None if charged is None else LIMIT - int(charged)
    ok = total == LIMIT and free == want_free and nvml.get("total") == LIMIT and nvml.get("free") == want_free
    ok = ok and nvml.get("v2_total") == LIMIT and nvml.get("v2_free") == want_free
    report.check(
        id,
        ok,
        "total = the limit, free = limit − charged (CUDA and in-process NVML)"
        if ok
        else "reported memory is not the slice",
        total=total,
        free=free,
        charged=charged,
        nvml=nvml,
    )


def driver_subchecks(runs: Runs, report: Report) -> None:
    r = runs.run("driver_memory", ["report"], name="driver.report")
    if r.result.get("error") or r.returncode != 0:
        report.check("driver.reporting", False, r.why())
    else:
        check_reporting(report, "driver.reporting", r.result, r.result["total"], r.result["free"])

    r = runs.run("driver_memory", ["oom"], name="driver.oom")
    x = r.result
    ok = (
        r.returncode == 0
        and x.get("oom_rc") == OOM
        and x.get("big_rc") == OOM
        and x.get("realloc_rc") == 0
        and x.get("charged_at_oom") is not None
        and x["charged_at_oom"] <= LIMIT
        and x.get("chunks", 0) >= 4
    )
    report.check(
        "driver.oom-recover",
        ok,
        "refused with CUDA_ERROR_OUT_OF_MEMORY, then allocates again" if ok else r.why(),
        **{k: x.get(k) for k in ("chunks", "oom_rc", "big_rc", "realloc_rc", "charged_at_oom")},
    )

    for shim, id in ((False, "vmm.driver"), (True, "vmm.release-while-mapped")):
        r = runs.run("driver_memory", ["vmm"], shim=shim, name=id)
        vmm_subcheck(report, id, r, shim)

    r = runs.run("driver_memory", ["paths"], name="paths", timeout=180)
    if r.returncode != 0 or not r.result or r.result.get("error"):
        report.check("paths", False, r.why())
    else:
        for path in ("array", "mipmapped", "graph_node", "heap"):
            path_subcheck(report, path, r.result[path], r.result[f"{path}_over"])

    r = runs.run("driver_memory", ["exec1"], name="children.exec")
    phases = {res.get("phase"): res for res in r.results}
    one, two = phases.get(1, {}), phases.get(2, {})
    ok = one.get("alloc_rc") == 0 and two.get("alloc_rc") == 0 and two.get("over_rc") == OOM
    report.check(
        "children.exec",
        ok,
        "the exec'd image gets the limit afresh and no more" if ok else f"exec'd process: {r.why()}",
        before_exec=one,
        after_exec=two,
    )

    r = runs.run("driver_memory", ["spawn"], name="children.spawn")
    x = r.result
    child = x.get("child") or {}
    ok = x.get("parent_rc") == 0 and child.get("over_rc") == OOM and child.get("fit_rc") == 0
    report.check(
        "children.spawn",
        ok,
        "a spawned child shares the container's limit" if ok else r.why(),
        parent_rc=x.get("parent_rc"),
        child=child,
    )


def vmm_subcheck(report: Report, id: str, r: WorkloadRun, shim: bool) -> None:
    x = r.result
    if r.returncode != 0 or not x or x.get("error"):
        report.check(id, False, r.why())
        return
    size = int(x["size"])

    def grew(key: str, step: str) -> bool:
        d = _delta(x, key, "before", step)
        return d is not None and d >= size - NVML_GRAIN

    def back(key: str, step: str) -> bool:
        d = _delta(x, key, "before", step)
        return d is not None and abs(d) <= NVML_GRAIN

    figures = {
        step: x.get(step)
        for step in (
            "before",
            "mapped",
            "released_while_mapped",
            "unmapped",
            "retained_after_unmap",
            "retained_released",
        )
    }
    # the driver: memory stays allocated while mapped (or referenced) after cuMemRelease
    driver_ok = grew("attributed", "released_while_mapped") and back("attributed", "unmapped")
    driver_ok = driver_ok and (
        x.get("retain_rc") != 0
        or (grew("attributed", "retained_after_unmap") and back("attributed", "retained_released"))
    )
    if not shim:
        report.check(
            id,
            driver_ok,
            "the driver keeps a released handle's memory until its last unmap (and reference)"
            if driver_ok
            else "the driver's VMM behaviour differs from what the shim assumes",
            size=size,
            retain_rc=x.get("retain_rc"),
            **figures,
        )
        return
    charged_ok = (
        grew("charged", "mapped")
        and grew("charged", "released_while_mapped")
        and back("charged", "unmapped")
        and x.get("over_limit_rc") == OOM
    )
    if x.get("retain_rc") == 0:
        charged_ok = (
            charged_ok and grew("charged", "retained_after_unmap") and back("charged", "retained_released")
        )
    report.check(
        id,
        charged_ok,
        "charged from cuMemCreate until the last unmap and release, as the driver holds it"
        if charged_ok
        else "the shim's charge does not follow the memory the driver holds",
        size=size,
        over_limit_rc=x.get("over_limit_rc"),
        retain_rc=x.get("retain_rc"),
        **figures,
    )


def path_subcheck(report: Report, path: str, fit: dict[str, Any], over: dict[str, Any]) -> None:
    id = f"paths.{path}"
    if fit.get("error") or over.get("error"):
        report.check(id, False, f"the driver has no entry point {fit.get('error') or over.get('error')}")
        return
    charged = _delta(fit, "charged", "before", "held")
    attributed = _delta(fit, "attributed", "before", "held") or 0
    over_attributed = _delta(over, "attributed", "before", "held") or 0
    if fit["rc"] == 0:
        fit_ok = charged is not None and charged >= attributed - NVML_GRAIN and charged > 0
        returned = _delta(fit, "charged", "before", "after")
        fit_ok = fit_ok and returned is not None and returned == 0
        fit_says = "charged" if fit_ok else "allocated for free (NVML shows more than the shim charged)"
    else:
        fit_ok = fit["rc"] == OOM and attributed <= NVML_GRAIN
        fit_says = "refused" if fit_ok else f"failed with CUresult {fit['rc']}"
    over_ok = over["rc"] != 0 and over_attributed <= NVML_GRAIN
    ok = fit_ok and over_ok
    report.check(
        id,
        ok,
        f"{fit_says} within the limit; refused past it"
        if ok
        else f"{fit_says}; past the limit: CUresult {over['rc']}",
        fit_rc=fit["rc"],
        charged=charged,
        attributed=attributed,
        over_rc=over["rc"],
        over_attributed=over_attributed,
    )


def torch_subchecks(runs: Runs, report: Report, figures: dict[str, Any]) -> None:
    for label, env in (
        ("torch", {}),
        ("torch-expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ):
        r = runs.run(
            "torch_memory", ["--spawn"] if label == "torch" else [], name=label, timeout=180, env=env
        )
        x = r.result
        if r.returncode != 0 or not x:
            report.check(f"{label}.oom-recover", False, r.why())
            continue
        framework_subchecks(report, label, x, oom_type="OutOfMemoryError")
        ctx_cost = _context_cost(x)
        if ctx_cost is not None:
            figures[f"{label}_context_overhead_mib"] = round(ctx_cost / MIB, 1)
        vllm = x.get("vllm") or {}
        ok = bool(vllm.get("ok")) and vllm.get("charged") is not None and vllm["charged"] <= LIMIT
        report.check(
            f"{label}.vllm-probe",
            ok,
            "a cache of 90 % of reported free memory fits and runs"
            if ok
            else "the cache sized from reported free memory did not fit the limit",
            **vllm,
        )
        peak = max(
            (v for v in (x.get("attributed_at_oom"), vllm.get("attributed")) if v is not None), default=None
        )
        ok = peak is not None and ctx_cost is not None and peak <= LIMIT + ctx_cost + ATTRIBUTION_TOLERANCE
        report.check(
            f"{label}.nvml-attributed",
            ok,
            "NVML never attributes more than limit + the context's own cost"
            if ok
            else "NVML attributes more to the process than the limit allows",
            peak_attributed=peak,
            limit=LIMIT,
            context_overhead=ctx_cost,
        )
        if "spawn" in x:
            s = x["spawn"]
            ok = s.get("over") == "OutOfMemoryError" and s.get("fit") == "allocated"
            report.check(
                f"{label}.spawn",
                ok,
                "a spawned child shares the limit" if ok else "the child escaped the container's limit",
                **s,
            )


def _context_cost(x: dict[str, Any]) -> int | None:
    c = x.get("context") or {}
    if c.get("attributed") is None or c.get("charged") is None:
        return None
    return int(c["attributed"]) - int(c["charged"])


def framework_subchecks(report: Report, label: str, x: dict[str, Any], oom_type: str) -> None:
    ok = (
        x.get("oom") == oom_type
        and x.get("recovered") is True
        and x.get("chunks_before_oom", 0) >= 4
        and x.get("charged_at_oom") is not None
        and x["charged_at_oom"] <= LIMIT
    )
    report.check(
        f"{label}.oom-recover",
        ok,
        f"{oom_type} past the limit; the process frees and allocates again"
        if ok
        else "no clean out-of-memory error and recovery",
        oom=x.get("oom"),
        chunks=x.get("chunks_before_oom"),
        charged_at_oom=x.get("charged_at_oom"),
        recovered=x.get("recovered"),
    )
    seen = x.get("report") or {}
    check_reporting(report, f"{label}.reporting", seen, int(seen.get("total", -1)), int(seen.get("free", -1)))


def cupy_subchecks(runs: Runs, report: Report) -> None:
    r = runs.run("cupy_memory", [], name="cupy", timeout=120)
    if r.returncode != 0 or not r.result:
        report.check("cupy.oom-recover", False, r.why())
        return
    framework_subchecks(report, "cupy", r.result, oom_type="OutOfMemoryError")


def workstation_subcheck(ctx: Context, report: Report) -> None:
    """The workstation's way: the daemon writes the region (a workstation region) and sets the environment."""
    script = "torch_memory" if not ctx.fake else "driver_memory"
    args = [
        *([] if script == "torch_memory" else ["oom"]),
        "--limit",
        str(LIMIT),
        *offset_arg(),
    ]
    try:
        with Workstation(ctx, "ws-memory") as ws:
            ws.submit(
                "memory", ctx.module_argv(script, args), 5, "--gpu-memory", "2Gi", "--gpu-compute", "100"
            )
            job = ws.wait_state("memory", ("COMPLETED", "FAILED", "CANCELLED"), 150)
            text = ws.stdout("memory")
    except WorkstationError as exc:
        report.check("workstation.limit", False, str(exc))
        return
    results = parse_results(text)
    x = results[-1] if results else {}
    if script == "torch_memory":
        ok = job["state"] == "COMPLETED" and x.get("oom") == "OutOfMemoryError" and x.get("recovered") is True
        seen = x.get("report") or {}
        ok = ok and seen.get("total") == LIMIT
    else:
        ok = job["state"] == "COMPLETED" and x.get("oom_rc") == OOM and x.get("realloc_rc") == 0
    report.check(
        "workstation.limit",
        ok,
        "a --gpu-memory 2Gi job is held to 2 GiB and recovers"
        if ok
        else f"job {job['state']}: {job.get('reason', '')}",
        state=job["state"],
        **{k: x.get(k) for k in ("oom", "oom_rc", "recovered", "chunks_before_oom", "chunks")},
    )


def run(ctx: Context) -> Report:
    report = Report(figures={"limit_bytes": LIMIT})
    runs = Runs(ctx)
    driver_subchecks(runs, report)
    if ctx.fake:
        report.skip("torch", "skipped: no GPU")
        report.skip("cupy", "skipped: no GPU")
    else:
        # Probes, not imports: PyTorch and CuPy are optional; their workloads import them in a child.
        if importlib.util.find_spec("torch") is None:
            report.skip("torch", "skipped: needs PyTorch (import torch)")
        else:
            torch_subchecks(runs, report, report.figures)
        if importlib.util.find_spec("cupy") is None:
            report.skip("cupy", "skipped: needs CuPy (import cupy)")
        else:
            cupy_subchecks(runs, report)
    workstation_subcheck(ctx, report)
    refused = sorted({line for r in runs.all for line in r.refusals})
    report.check(
        "lookup.no-refusals",
        not refused,
        "no entry point was refused by the shim" if not refused else f"{len(refused)} entry point(s) refused",
        refused=refused,
    )
    return report
