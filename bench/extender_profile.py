"""Where the extender's CPU goes: py-spy samples of the running process, sorted into stages.

`bench/e2e_throughput.py --profile-extender DIR` attaches `SpyRecorder` to the extender process for
the run through it (py-spy samples every thread's Python stack from outside the process, so the
extender runs unchanged and is not slowed by its own profiler). `breakdown` sorts the busy samples
into the stages of one pod's path (`STAGES`: the first stage whose rule matches a stack takes the
sample) and `format_breakdown` prints each stage's share and its CPU milliseconds per pod (share ×
the extender's measured CPU per pod).

py-spy is a development dependency (``neuronetes[dev]``); without it the profile is skipped with
a message. The raw samples (py-spy's collapsed-stack format, one ``frame;frame;… count`` line per
stack) stay in DIR, readable by any flame-graph tool.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["STAGES", "Profile", "SpyRecorder", "breakdown", "format_breakdown", "py_spy", "thread_cpu"]

RATE_HZ: Final = 250
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter, else on PATH, else None."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def thread_cpu(pid: int, *, system_only: bool = False) -> dict[int, float]:
    """CPU seconds (user + system, or system only) of each thread of `pid`, by thread id (empty
    when it is gone)."""
    out: dict[int, float] = {}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return out
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        rest = raw[raw.rindex(")") + 2 :].split()
        out[tid] = (int(rest[12]) + (0 if system_only else int(rest[11]))) / CLK_TCK
    return out


@dataclass
class Profile:
    """A recording: py-spy's raw stacks and each thread's CPU seconds over the same window."""

    raw: Path
    cpu_by_thread: dict[int, float]
    system_by_thread: dict[int, float]
    """Of `cpu_by_thread`, the seconds in the kernel (system calls: socket reads and writes)."""


class SpyRecorder:
    """py-spy recording process `pid` (the thread holding the GIL) into `out` until `stop`."""

    def __init__(self, pid: int, out: Path, *, rate: int = RATE_HZ) -> None:
        self.pid = pid
        self.out = out
        self.rate = rate
        self._proc: subprocess.Popen[bytes] | None = None
        self._cpu0: dict[int, float] = {}
        self._sys0: dict[int, float] = {}

    def start(self) -> bool:
        exe = py_spy()
        if exe is None:
            print(">> py-spy not installed (pip install 'neuronetes[dev]'): no profile", file=sys.stderr)
            return False
        self.out.parent.mkdir(parents=True, exist_ok=True)
        argv = [exe, "record", "--pid", str(self.pid), "--rate", str(self.rate), "--format", "raw"]
        # --gil: only the thread holding the GIL is sampled, i.e. the Python work of the process
        # (threads blocked in a read, or the loop waiting in epoll, hold no GIL and are not busy);
        # --nonblocking: never pause the extender to read its stacks (its timings stay its own).
        argv += ["--gil", "--nonblocking", "--threads", "--full-filenames", "--output", str(self.out)]
        self._cpu0 = thread_cpu(self.pid)
        self._sys0 = thread_cpu(self.pid, system_only=True)
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return True

    def stop(self, timeout: float = 30.0) -> Profile | None:
        """Stop sampling (SIGINT makes py-spy write its file); the recording, or None."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        cpu1 = thread_cpu(self.pid)
        sys1 = thread_cpu(self.pid, system_only=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if not self.out.is_file():
            print(f">> py-spy wrote no profile: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
            return None
        cpu = {tid: round(v - self._cpu0.get(tid, 0.0), 3) for tid, v in cpu1.items()}
        system = {tid: round(v - self._sys0.get(tid, 0.0), 3) for tid, v in sys1.items()}
        return Profile(
            self.out,
            {tid: v for tid, v in cpu.items() if v > 0},
            {tid: v for tid, v in system.items() if v > 0},
        )


# ---- stages ------------------------------------------------------------------------------------

Stack = Sequence[str]
"""One sample's frames, root first: ``function (path:line)``."""


def _has(stack: Stack, *parts: str) -> bool:
    return any(part in frame for frame in stack for part in parts)


def _in(stack: Stack, path: str, function: str | None = None) -> bool:
    """A frame of `function` (any, when None) in a file whose path ends with `path`."""
    for frame in stack:
        name, _, where = frame.partition(" (")
        file = where.rsplit(":", 1)[0]
        if file.endswith(path) and (function is None or name.rsplit(".", 1)[-1] == function):
            return True
    return False


def _leaf_in(stack: Stack, path: str) -> bool:
    return bool(stack) and stack[-1].partition(" (")[2].rsplit(":", 1)[0].endswith(path)


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    rule: Callable[[Stack], bool]
    syscall: bool = False
    """Samples here sit in a socket system call: the thread's kernel time is theirs."""


def _watch(stack: Stack) -> bool:
    return _in(stack, "extender/neuronetes_extender/watch.py")


def _bind(stack: Stack) -> bool:
    return _in(stack, "extender/neuronetes_extender/service.py", "bind")


STAGES: Final[tuple[Stage, ...]] = (
    Stage(
        "metrics scrape (the benchmark's)",
        lambda s: _in(s, "extender/neuronetes_extender/metrics.py", "render"),
    ),
    Stage(
        "watch: read stream (kernel)",
        lambda s: _watch(s) and _in(s, "extender/neuronetes_extender/kube.py", "__iter__"),
        syscall=True,
    ),
    Stage(
        "watch: apply (PodInfo, cache)",
        lambda s: (
            _watch(s) and _has(s, "on_upsert", "upsert_pod", "delete_pod", "replace_pods", "upsert_node")
        ),
    ),
    Stage(
        "watch: decode event",
        lambda s: _watch(s) and _in(s, "extender/neuronetes_extender/watch.py", "_event"),
    ),
    Stage("watch: other (list, reconnect)", _watch),
    Stage("other threads (reservations, groups)", lambda s: _in(s, "threading.py", "_bootstrap")),
    Stage(
        "events: post (async, off the bind path)", lambda s: _in(s, "extender/neuronetes_extender/events.py")
    ),
    Stage("bind: API call (http1)", lambda s: _bind(s) and _in(s, "extender/neuronetes_extender/http1.py")),
    Stage(
        "bind: API call (kube.py headers, body)",
        lambda s: _bind(s) and _in(s, "extender/neuronetes_extender/kube.py"),
    ),
    Stage(
        "bind: cache (prepare, done)", lambda s: _bind(s) and _in(s, "extender/neuronetes_extender/cache.py")
    ),
    Stage("bind: other", _bind),
    Stage("filter: pod info", lambda s: _in(s, "extender/neuronetes_extender/service.py", "_pod_info")),
    Stage(
        "filter: decision (cache)",
        lambda s: (
            _in(s, "extender/neuronetes_extender/service.py", "filter")
            and _in(s, "extender/neuronetes_extender/cache.py")
        ),
    ),
    Stage("filter: other", lambda s: _in(s, "extender/neuronetes_extender/service.py", "filter")),
    Stage("prioritize", lambda s: _in(s, "extender/neuronetes_extender/service.py", "prioritize")),
    Stage(
        "body decode",
        lambda s: (
            _in(s, "extender/neuronetes_extender/bodies.py")
            or _in(s, "extender/neuronetes_extender/app.py", "bind_verb")
        ),
    ),
    Stage(
        "verb glue, answer encode",
        lambda s: (
            _leaf_in(s, "extender/neuronetes_extender/app.py")
            or _in(s, "extender/neuronetes_extender/wire.py", "encode")
        ),
    ),
    Stage(
        "metrics observe",
        lambda s: _in(s, "extender/neuronetes_extender/metrics.py") or _has(s, "prometheus_client"),
    ),
    Stage(
        "HTTP: answer socket writes (kernel)",
        lambda s: _in(s[-1:], "uvicorn/protocols/http/httptools_impl.py", "send"),
        syscall=True,
    ),
    Stage(
        "HTTP: FastAPI/Starlette",
        lambda s: _has(s, "/fastapi/", "/starlette/") or _in(s, "extender/neuronetes_extender/app.py"),
    ),
    Stage("HTTP: uvicorn", lambda s: _has(s, "/uvicorn/", "httptools", "/h11/")),
    Stage("event loop (asyncio, uvloop)", lambda s: _has(s, "/asyncio/", "uvloop")),
)
OTHER: Final = "other"
UNSAMPLED: Final = "threads that ran no Python (TLS, C libraries)"
KERNEL: Final = "kernel, other system calls"


def _stack(line: str) -> tuple[int | None, list[str], int]:
    """(thread id, frames, count) of one line of py-spy's raw output."""
    frames, _, count = line.rstrip("\n").rpartition(" ")
    parts = frames.split(";")
    tid: int | None = None
    if parts and parts[0].startswith("thread ("):
        head = parts.pop(0)
        tid = int(head[len("thread (") : head.index(")")], 0)
    if parts and parts[0].startswith("process "):
        parts = parts[1:]
    return tid, parts, int(count)


def breakdown(profile: Profile) -> dict[str, float]:
    """CPU seconds per stage (`STAGES`, then "other").

    A sample is a moment some thread held the GIL. On a loaded machine a thread also holds it
    while preempted, and it is preempted most right after a system call that wakes another
    process (a socket write to kube-scheduler), so samples are not CPU. Each thread's measured
    CPU is therefore shared out in two parts: its kernel seconds over its system-call stages
    (`Stage.syscall`) by their samples, and its user seconds over its other stages by theirs.
    Kernel time with no system-call sample, and the CPU of threads never sampled (they ran no
    Python), get lines of their own.
    """
    syscall = {s.name for s in STAGES if s.syscall}
    per_thread: dict[int | None, Counter[str]] = {}
    for line in profile.raw.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        tid, stack, count = _stack(line)
        stage = next((s.name for s in STAGES if s.rule(stack)), OTHER)
        per_thread.setdefault(tid, Counter())[stage] += count
    out: dict[str, float] = {}

    def share(seconds: float, samples: dict[str, int], rest: str) -> None:
        total = sum(samples.values())
        if total == 0:
            out[rest] = out.get(rest, 0.0) + seconds
            return
        for stage, n in samples.items():
            out[stage] = out.get(stage, 0.0) + seconds * n / total

    for tid, cpu in profile.cpu_by_thread.items():
        samples = per_thread.get(tid)
        if not samples:
            out[UNSAMPLED] = out.get(UNSAMPLED, 0.0) + cpu
            continue
        kernel = min(cpu, profile.system_by_thread.get(tid, 0.0))
        share(kernel, {k: n for k, n in samples.items() if k in syscall}, KERNEL)
        share(cpu - kernel, {k: n for k, n in samples.items() if k not in syscall}, OTHER)
    return out


def format_breakdown(seconds: dict[str, float], pods: int) -> list[str]:
    """One line per stage, in path order: CPU seconds, share, and CPU ms per pod."""
    total = sum(seconds.values())
    if total <= 0:
        return ["(no CPU recorded)"]
    lines = []
    for name in [s.name for s in STAGES] + [OTHER, KERNEL, UNSAMPLED]:
        t = seconds.get(name, 0.0)
        if t <= 0:
            continue
        lines.append(f"  {name:<48} {t:7.3f} s {100 * t / total:5.1f} %  {1000 * t / pods:6.3f} ms/pod")
    lines.append(f"  {'total':<48} {total:7.3f} s {100.0:5.1f} %  {1000 * total / pods:6.3f} ms/pod")
    return lines
