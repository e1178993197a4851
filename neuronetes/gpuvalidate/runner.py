"""The runner: ``python -m neuronetes.gpuvalidate [--fake] --out DIR --shim LIB --launch-probe BIN``.

`hack/gpu-validate.sh` builds the artefacts and calls this. It reads the check table, finds the GPU
under test (NVML, or the fake's NVML in fake mode), then runs every check in a process of its own
(`child`) with the table's time limit: a check that does not apply to the mode is "skipped: no GPU",
one whose needs are missing is "skipped: needs …", one that crashes or overruns is "error", and the
next one runs regardless. It writes ``gpu-validate.json`` (docs/gpu-validation.md), the same table
as text (``gpu-validate.txt``) and every workload's output (``gpu-validate.log``) to the output
folder, prints the table, and exits 0 only when no check failed or erred.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .context import Context, python_env
from .model import SCHEMA, TABLE, CheckResult, CheckSpec, Finding, Report, TableError, load_table, summary
from .table import render

__all__ = ["main", "missing_needs"]

_FAKE_MEMORY_BYTES = 80 << 30  # the fake GPU's size in fake mode (an H100's order)


def missing_needs(spec: CheckSpec, built: dict[str, str]) -> list[str]:
    """The needs of `spec` this machine lacks, each said as what to install or build."""
    missing: list[str] = []
    for need in spec.needs:
        kind, _, name = need.partition(":")
        if kind == "cmd" and shutil.which(name) is None:
            missing.append(f"the command {name}")
        elif kind == "py" and importlib.util.find_spec(name) is None:  # a probe: optional, not imported here
            missing.append(f"the Python module {name}")
        elif kind == "built" and not Path(built.get(name, "")).is_file():
            missing.append(f"the {name} build (it failed: see build.log)")
    return missing


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _command(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def source(repo: Path) -> dict[str, Any]:
    """The checkout that ran: its commit and whether the working tree differs from it (None where
    no git history came along, as on a machine that got a copy of the tree)."""
    commit = _command(["git", "-C", str(repo), "rev-parse", "HEAD"]) or None
    dirty = bool(_command(["git", "-C", str(repo), "status", "--porcelain"])) if commit else None
    return {"commit": commit, "dirty": dirty}


def machine(gpu: dict[str, Any]) -> dict[str, Any]:
    """What ran the validation: host, GPU, driver, toolchain and framework versions."""
    nvcc = _command(["nvcc", "--version"]).splitlines()
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "gpu": gpu,
        "nvcc": nvcc[-1] if nvcc else None,
        "packages": {
            name: _version(dist)
            for name, dist in (
                ("torch", "torch"),
                ("cupy", "cupy-cuda13x"),
                ("cupy12", "cupy-cuda12x"),
                ("nvidia-ml-py", "nvidia-ml-py"),
                ("prometheus-client", "prometheus-client"),
            )
            if _version(dist) is not None
        },
    }


def find_gpu(fake: bool) -> dict[str, Any]:
    """The GPU under test (index 0) through NVML: the real one, or the fake's. Raises RuntimeError."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError, ...
        raise RuntimeError(
            f"NVML is not available ({exc}); run with --fake on a machine without a GPU"
        ) from exc
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            raise RuntimeError("NVML lists no GPU")
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        total = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
        if fake:
            return {
                "uuid": str(uuid),
                "name": "fake GPU (node-agent/shim/fake)",
                "memory_total_bytes": total,
                "driver": "fake",
                "cuda_driver": None,
                "count": int(pynvml.nvmlDeviceGetCount()),
            }
        return {
            "uuid": str(uuid),
            "name": str(pynvml.nvmlDeviceGetName(h)),
            "memory_total_bytes": total,
            "driver": str(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": int(pynvml.nvmlSystemGetCudaDriverVersion()),
            "count": int(pynvml.nvmlDeviceGetCount()),
        }
    finally:
        pynvml.nvmlShutdown()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def sweep(work: Path) -> int:
    """Kill every process still working in `work` (its cwd is there): a check's workloads, daemons
    and jobs all run from its folder, so none outlives the check, even one that was killed. Returns
    how many it killed."""
    killed = 0
    root = str(work.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root + os.sep):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


def run_check(spec: CheckSpec, ctx: Context) -> CheckResult:
    """Run one check in its own process; never raises."""
    missing = missing_needs(spec, {"shim": ctx.shim, "launch_probe": ctx.launch_probe})
    if ctx.mode not in spec.modes:
        reason = "skipped: no GPU" if ctx.fake else "skipped: runs in fake mode only"
        return CheckResult.not_run(spec, "skipped", reason)
    if missing:
        return CheckResult.not_run(spec, "skipped", "skipped: needs " + ", ".join(missing))
    Path(ctx.work).mkdir(parents=True, exist_ok=True)
    context_file = Path(ctx.work) / "context.json"
    result_file = Path(ctx.work) / "result.json"
    context_file.write_text(ctx.to_json())
    result_file.unlink(missing_ok=True)
    argv = [ctx.python, "-m", "neuronetes.gpuvalidate.child", spec.run, str(context_file), str(result_file)]
    started = time.monotonic()
    # output to files, not pipes: a stray process holding a pipe would stall the runner
    out_file, err_file = Path(ctx.work) / "check.stdout", Path(ctx.work) / "check.stderr"
    with open(out_file, "w") as out_f, open(err_file, "w") as err_f:
        proc = subprocess.Popen(
            argv, env=ctx.base_env, stdout=out_f, stderr=err_f, cwd=ctx.work, start_new_session=True
        )
        try:
            proc.wait(timeout=spec.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            timed_out = True
    left = sweep(Path(ctx.work))
    out, err = out_file.read_text(errors="replace"), err_file.read_text(errors="replace")
    what = f"killed at {spec.timeout_s:.0f} s" if timed_out else f"rc {proc.returncode}"
    ctx.append_log(f"check {spec.id} process ({what}; {left} leftover processes killed)", out, err)
    if timed_out:
        seconds = time.monotonic() - started
        return CheckResult.not_run(
            spec, "error", f"error: ran past its {spec.timeout_s:.0f} s limit", seconds
        )
    seconds = time.monotonic() - started
    try:
        raw = json.loads(result_file.read_text())
    except (OSError, ValueError):
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return CheckResult.not_run(
            spec, "error", f"error: the check's process ended ({proc.returncode}): {tail}", seconds
        )
    if "error" in raw:
        ctx.append_log(f"check {spec.id} raised", "", str(raw.get("traceback", "")))
        return CheckResult.not_run(spec, "error", f"error: {raw['error']}", seconds)
    report = Report([Finding(**f) for f in raw["findings"]], raw["figures"])
    return CheckResult.of(spec, report, seconds)


def _write(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=1, default=str) + "\n")
    tmp.replace(path)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu-validate", description=__doc__.splitlines()[0])
    p.add_argument("--fake", action="store_true", help="run over the fake driver (no GPU needed)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--shim", type=Path, required=True, help="the built libneuronetes-cuda.so")
    p.add_argument("--launch-probe", type=Path, required=True, help="the built launch_probe")
    p.add_argument(
        "--fake-lib-dir", type=Path, default=None, help="the fake libcuda.so.1 / libnvidia-ml.so.1"
    )
    p.add_argument("--only", default="", help="comma-separated check ids (default: every check)")
    p.add_argument("--table", type=Path, default=TABLE, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        specs = load_table(args.table)
    except (TableError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    wanted = [w for w in args.only.split(",") if w]
    unknown = sorted(set(wanted) - {s.id for s in specs})
    if unknown:
        print(
            f"error: --only {','.join(unknown)}: no such check (known: {', '.join(s.id for s in specs)})",
            file=sys.stderr,
        )
        return 2
    if wanted:
        specs = [s for s in specs if s.id in wanted]
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    log = out / "gpu-validate.log"
    log.write_text("")
    mode = "fake" if args.fake else "gpu"
    base_env = python_env()
    if args.fake:
        if args.fake_lib_dir is None:
            print("error: --fake needs --fake-lib-dir", file=sys.stderr)
            return 2
        lib = str(args.fake_lib_dir.resolve())
        base_env["LD_LIBRARY_PATH"] = ":".join(p for p in (lib, base_env.get("LD_LIBRARY_PATH", "")) if p)
        base_env["FAKE_CUDA_MEM_BYTES"] = str(_FAKE_MEMORY_BYTES)
        base_env["FAKE_CUDA_STATE"] = str(work / "runner.fake-gpu")
        os.environ.update({k: base_env[k] for k in ("FAKE_CUDA_MEM_BYTES", "FAKE_CUDA_STATE")})
    started = datetime.now(UTC)
    try:
        gpu = find_gpu(args.fake)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    template = Context(
        mode=mode,
        repo=str(Path(__file__).resolve().parents[2]),
        out=str(out),
        work=str(work),
        log=str(log),
        shim=str(args.shim.resolve()),
        launch_probe=str(args.launch_probe.resolve()),
        fake_lib_dir=str(args.fake_lib_dir.resolve()) if args.fake_lib_dir else "",
        python=sys.executable,
        gpu_uuid=gpu["uuid"],
        gpu_name=gpu["name"],
        gpu_total_bytes=gpu["memory_total_bytes"],
        base_env=base_env,
    )
    results: list[CheckResult] = []
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": mode,
        "started": started.isoformat(timespec="seconds"),
        "finished": None,  # None while it runs: a run killed midway leaves the checks done so far
        "machine": machine(gpu),
        "source": source(Path(template.repo)),
        "summary": summary(results),
        "checks": [],
    }
    for spec in specs:
        check_work = work / spec.id
        env = dict(base_env)
        if args.fake:  # each check gets a fresh fake GPU
            env["FAKE_CUDA_STATE"] = str(check_work / "fake-gpu.state")
        ctx = replace(template, work=str(check_work), base_env=env)
        print(f">> {spec.id}: {spec.title}", file=sys.stderr, flush=True)
        result = run_check(spec, ctx)
        print(f"   {result.status} ({result.seconds:.1f} s): {result.reason}", file=sys.stderr, flush=True)
        results.append(result)
        document.update(summary=summary(results), checks=[r.to_json() for r in results])
        _write(out / "gpu-validate.json", document)
    document["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    _write(out / "gpu-validate.json", document)
    text = render(document)
    (out / "gpu-validate.txt").write_text(text)
    print(text)
    counts = document["summary"]
    return 0 if counts["fail"] == 0 and counts["error"] == 0 else 1
