"""What every check is given: the mode, the built artefacts, the GPU under test, and the ways to run a
workload under the shim exactly as the agent would.

`Context` is plain data (written as JSON by the runner, read by each check's process). Its methods
are the helpers the checks share: a region written by the agent's own region writer (the cluster's
way; `workstation=True` for the workstation's), the environment that preloads the shim, a workload
run as its own process whose ``RESULT {json}`` lines are its answer, and NVML's per-process memory.
In fake mode every process also gets the fake driver (``LD_LIBRARY_PATH``) and the check's own fake
GPU account (``FAKE_CUDA_STATE``), so the fake's NVML is the oracle where the real one would be.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = ["GIB", "MIB", "Context", "WorkloadRun", "offset_arg", "used_offset"]

MIB: Final = 1 << 20
GIB: Final = 1 << 30
WORKLOADS: Final = f"{__package__}.workloads"  # run as modules: python -m WORKLOADS.<name>
REFUSED_MARK: Final = "does not wrap: refused"


def used_offset() -> tuple[str, int]:
    """Where ``devices[0].memory_used_bytes`` lives: the file of the region directory (the
    container's state file) and the byte offset in it. A workload reads the shim's account there at
    the moment it reports (``--offset FILE:OFFSET``; the directory is ``NEURONETES_REGION_DIR``)."""
    from neuronetes_agent import region as r

    return r.STATE_NAME, r.field_offset(r.NnState, "devices") + r.field_offset(
        r.NnDeviceUsage, "memory_used_bytes"
    )


def offset_arg() -> list[str]:
    """The workloads' ``--offset FILE:OFFSET`` argument for `used_offset()`."""
    name, at = used_offset()
    return ["--offset", f"{name}:{at}"]


@dataclass(frozen=True, slots=True)
class WorkloadRun:
    """A finished workload: exit status, its RESULT objects, and the shim's refusals it printed."""

    name: str
    returncode: int | None  # None: killed at its time limit
    results: list[dict[str, Any]]
    stderr_tail: str
    seconds: float
    refusals: list[str] = field(default_factory=list)

    @property
    def result(self) -> dict[str, Any]:
        """The last RESULT object ({} when it printed none)."""
        return self.results[-1] if self.results else {}

    def why(self) -> str:
        """One line on how it ended, for a failure's reason."""
        if self.returncode is None:
            return f"{self.name}: killed after {self.seconds:.0f} s"
        error = self.result.get("error")
        if error:
            return f"{self.name}: {error}"
        tail = self.stderr_tail.strip().splitlines()[-1:] or ["(no output)"]
        return f"{self.name}: exit {self.returncode}: {tail[0][:300]}"


@dataclass(frozen=True, slots=True)
class Context:
    """The run as a check sees it (JSON-serialisable)."""

    mode: str  # "gpu" | "fake"
    repo: str
    out: str  # the output folder
    work: str  # this check's scratch folder
    log: str  # the log file every workload's output is appended to
    shim: str  # libneuronetes-cuda.so
    launch_probe: str
    fake_lib_dir: str  # fake libcuda.so.1 / libnvidia-ml.so.1 ("" on a GPU)
    python: str
    gpu_uuid: str
    gpu_name: str
    gpu_total_bytes: int
    base_env: dict[str, str]  # what every process of the check starts from

    # ---- (de)serialising

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Context:
        return cls(**json.loads(text))

    @property
    def fake(self) -> bool:
        return self.mode == "fake"

    def path(self, name: str) -> Path:
        p = Path(self.work) / name
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    # ---- regions and environments

    def region(
        self,
        name: str,
        limit_bytes: int,
        *,
        share: int = 100,
        workstation: bool = False,
        at: Path | None = None,
    ) -> Path:
        """A region (its directory: control and state files) for the GPU under test, written by the
        agent's region writer (admitted), at ``regions/NAME`` of the check's folder or at `at`."""
        from neuronetes_agent import region as r

        path = self.path(f"regions/{name}") if at is None else at
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            shutil.rmtree(path)
        device = r.DeviceLimit(self.gpu_uuid, limit_bytes, self.gpu_total_bytes, compute_share_percent=share)
        r.create_region(path, [device], admitted=True, workstation=workstation).close()
        return path

    def region_figures(self, path: Path) -> dict[str, int]:
        """The device's account as the shim left it (the state file, read as the agent reads it)."""
        from neuronetes_agent import region as r

        with r.open_region(path, writable=False) as reg:
            snap = reg.read_state()
        d = snap.devices[0]
        return {
            "used_bytes": int(d.memory_used_bytes),
            "peak_bytes": int(d.memory_peak_bytes),
            "oom_refusals": int(d.oom_refusals_total),
            "kernel_ns": int(d.kernel_ns_total),
            "throttled_ns": int(d.throttled_ns_total),
        }

    def env(self, region: Path | None = None, **extra: str) -> dict[str, str]:
        """A process's environment: the shim preloaded over `region` (None: no shim), plus `extra`."""
        env = dict(self.base_env)
        if region is not None:
            env["LD_PRELOAD"] = self.shim
            env["NEURONETES_REGION_DIR"] = str(region)
        env.update(extra)
        return env

    # ---- workloads

    def workload(
        self,
        script: str,
        args: Sequence[str],
        env: Mapping[str, str],
        *,
        timeout: float = 120,
        name: str | None = None,
    ) -> WorkloadRun:
        """Run the workload module `script` with ARGS (or the launch probe for ``script="launch_probe"``)."""
        argv = [self.launch_probe, *args] if script == "launch_probe" else self.module_argv(script, args)
        label = name or f"{script} {' '.join(args)}".strip()
        started = time.monotonic()
        try:
            proc = subprocess.run(
                argv, env=dict(env), capture_output=True, text=True, timeout=timeout, cwd=self.work
            )
            rc: int | None = proc.returncode
            out, err = proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc = None
            out = _text(exc.stdout)
            err = _text(exc.stderr)
        seconds = time.monotonic() - started
        self.append_log(f"workload {label} (rc {rc}, {seconds:.1f} s)", out, err)
        return WorkloadRun(label, rc, parse_results(out), err[-2000:], seconds, refusals(err))

    @contextlib.contextmanager
    def background(
        self, script: str, args: Sequence[str], env: Mapping[str, str], *, name: str | None = None
    ) -> Iterator[subprocess.Popen[str]]:
        """A workload left running while the body runs; terminated (then killed) after it."""
        argv = self.module_argv(script, args)
        proc = subprocess.Popen(
            argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.work
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
            try:
                out, err = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            self.append_log(f"background {name or script} (rc {proc.returncode})", out, err)

    def module_argv(self, script: str, args: Sequence[str]) -> list[str]:
        """The command line of workload `script` (a module of this package's ``workloads``)."""
        return [self.python, "-u", "-m", f"{WORKLOADS}.{script}", *args]

    def append_log(self, title: str, out: str, err: str) -> None:
        with open(self.log, "a") as f:
            f.write(f"\n--- [{os.path.basename(self.work)}] {title}\n")
            if out.strip():
                f.write(out[-20000:])
            if err.strip():
                f.write("\n[stderr]\n" + err[-20000:])

    # ---- NVML, as the node sees it (the process list is never the shim's: it is not hooked)

    def gpu_memory_of(self, pids: Sequence[int]) -> dict[int, int]:
        """NVML's GPU memory of each of `pids` that it lists (bytes)."""
        wanted = set(pids)
        return {pid: used for pid, used in self.gpu_processes().items() if pid in wanted}

    def gpu_processes(self) -> dict[int, int]:
        """NVML's running compute processes of the GPU under test, host PID -> bytes (what the
        agent reads into `GpuSample.processes`)."""
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = (
                pynvml.nvmlDeviceGetHandleByUUID(self.gpu_uuid)
                if not self.fake
                else (pynvml.nvmlDeviceGetHandleByIndex(0))
            )
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            out: dict[int, int] = {}
            for p in procs:
                out[int(p.pid)] = out.get(int(p.pid), 0) + int(p.usedGpuMemory or 0)
            return out
        finally:
            pynvml.nvmlShutdown()


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def parse_results(stdout: str) -> list[dict[str, Any]]:
    """Every ``RESULT {json}`` line of a workload's output (a line that is no JSON object is kept as
    an error, so a broken workload fails its check rather than vanishing)."""
    results: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        if not line.startswith("RESULT "):
            continue
        try:
            value = json.loads(line[len("RESULT ") :])
        except ValueError as exc:
            value = {"error": f"unreadable RESULT line: {exc}"}
        results.append(value if isinstance(value, dict) else {"error": "RESULT is no JSON object"})
    return results


def refusals(stderr: str) -> list[str]:
    """The shim's "refused" lines (an entry point it handed out as not found)."""
    return sorted({line.strip() for line in stderr.splitlines() if REFUSED_MARK in line})


def python_env() -> dict[str, str]:
    """This process's environment minus what would leak the runner's shim or region into a check."""
    return {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "NEURONETES_REGION_DIR")}
