"""Workstation mode: preempt and resume latency per rung of the preemption ladder.

Starts a real workstation daemon (``neuronetes-agent --workstation``, simulated GPU, the fake CUDA
driver of node-agent/shim/fake as its checkpoint API) and, N times per rung, runs a low-priority
job, submits an urgent one and lets it finish. From the daemon's own transition timestamps:

- preempt latency: urgent job submitted → low job PREEMPTED (the GPU is free for the urgent job);
- resume latency: urgent job's process exited → low job RUNNING again.

Rungs: ``checkpoint`` (a CUDA job holding ``--mib`` MiB, transparent checkpoint), ``cooperative``
(a ``--checkpointable`` job that saves and exits on SIGUSR1, restarted with NEURONETES_RESUME=1),
``stop`` (a GPU share stopped and continued). Prints one JSON object: per rung, median and p99 in
milliseconds. Figures include the daemon's loop and the job processes' own start-up and are
wall-clock measurements on this machine (see bench/README.md).

    python bench/workstation.py [--runs 20] [--mib 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "fixtures" / "workstation" / "gpu_job.py"
FAKE = REPO / "node-agent" / "shim" / "build" / "release" / "fake"

from neuronetes_agent.workstation import client  # noqa: E402
from neuronetes_agent.workstation import protocol as p  # noqa: E402


def _call(state: Path, request: Any) -> Any:
    reply = client.call(state, request)
    if not isinstance(reply, p.Ok):
        raise SystemExit(f"daemon: {reply}")
    return reply.result


def _wait(state: Path, job: str, want: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc: dict[str, Any] = _call(state, p.Describe(job=job))
        if doc["state"] == want:
            return doc
        time.sleep(0.02)
    raise SystemExit(f"job {job} never reached {want}")


def _at(doc: dict[str, Any], to: str, nth: int = 1) -> float:
    times = [float(h["at"]) for h in doc["history"] if h["to"] == to]
    return times[nth - 1]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


_RUNG_SAYS = {
    "checkpoint": "transparent CUDA checkpoint",
    "cooperative": "saved and exited",
    "stop": "SIGSTOP",
}


def _one(state: Path, rung: str, k: int, mib: int) -> tuple[float, float]:
    base = f"{sys.executable} {JOB}"
    low: dict[str, Any] = {
        "command": f"{base} 100000 --step-s 0.01",
        "priority": 1,
        "name": f"{rung}-low-{k}",
    }
    high: dict[str, Any] = {"command": f"{base} 1 --step-s 0.01", "priority": 10, "name": f"{rung}-high-{k}"}
    if rung == "checkpoint":
        low["command"] += f" --mib {mib}"
        high["command"] += " --mib 64"
    elif rung == "cooperative":
        low["checkpointable"] = True
    else:
        low.update(gpu_memory="8Gi", gpu_compute=70)
        high.update(gpu_memory="8Gi", gpu_compute=40)
    _call(state, p.Submit(**low))
    running = _wait(state, low["name"], "RUNNING")
    time.sleep(0.3)  # running (and, for checkpoint, holding its memory)
    if rung != "stop":  # what NVML would list for it: stopping it would not make room
        gpu = _call(state, p.Status())["gpus"][0]["uuid"]
        held = p.SimulatedProcess(pid=running["pid"], bytes=max(mib, 1024) << 20)
        _call(state, p.Simulate(gpu=gpu, process=held))
    urgent = _call(state, p.Submit(**high))
    low_doc = _wait(state, low["name"], "PREEMPTED")
    how = low_doc["reason"]
    if _RUNG_SAYS[rung] not in how:
        raise SystemExit(f"{rung}: the daemon took another rung: {how}")
    preempt = _at(low_doc, "PREEMPTED") - float(urgent["submittedAt"])
    high_doc = _wait(state, high["name"], "COMPLETED")
    low_doc = _wait(state, low["name"], "RUNNING")
    # from the urgent job's exit (its shepherd's exit file) to the low job running again
    exited = (state / "jobs" / high_doc["id"] / "exit-1").stat().st_mtime
    resume = _at(low_doc, "RUNNING", 2) - exited
    _call(state, p.Cancel(job=low["name"], force=True))
    _wait(state, low["name"], "CANCELLED")
    return preempt, resume


def _kill_jobs_of(state: Path) -> None:
    """Jobs outlive their daemon on purpose; the benchmark's must not outlive the benchmark."""
    mark = f"NEURONETES_CHECKPOINT_DIR={state}/jobs/".encode()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark in Path(f"/proc/{entry}/environ").read_bytes():
                os.kill(int(entry), signal.SIGKILL)
        except OSError:
            continue


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--mib", type=int, default=1024, help="GPU memory of the checkpointed job")
    args = parser.parse_args()
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(REPO / "node-agent" / "shim"),
            f"PYTHON={sys.executable}",
            str(FAKE / "libcuda.so.1"),
        ],
        check=True,
    )
    with tempfile.TemporaryDirectory(prefix="nn-ws-bench-") as tmp:
        state = Path(tmp) / "state"
        env = {
            **os.environ,
            "FAKE_CUDA_STATE": f"{tmp}/fake.state",
            "FAKE_LIBCUDA": str(FAKE / "libcuda.so.1"),
        }
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from neuronetes.cli.agent import agent_main; raise SystemExit(agent_main())",
                "--workstation",
                "--state-dir",
                str(state),
                "--simulate-gpus",
                "1",
                "--cuda-driver",
                str(FAKE / "libcuda.so.1"),
                "--log-level",
                "warning",
            ],
            env=env,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not client.daemon_live(state):
                if time.monotonic() > deadline:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.1)
            report: dict[str, Any] = {"runs": args.runs, "checkpoint_mib": args.mib}
            for rung in ("checkpoint", "cooperative", "stop"):
                pairs = [_one(state, rung, k, args.mib) for k in range(args.runs)]
                for name, values in (
                    ("preempt_ms", [a for a, _ in pairs]),
                    ("resume_ms", [b for _, b in pairs]),
                ):
                    ms = [v * 1000 for v in values]
                    report.setdefault(rung, {})[name] = {
                        "median": round(statistics.median(ms), 1),
                        "p99": round(_percentile(ms, 0.99), 1),
                    }
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(30)
            _kill_jobs_of(state)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
