"""The GPU validation as a user runs it: ``hack/gpu-validate.sh --fake`` end to end (the real shim,
fake driver, workstation daemon and workloads as processes), and the runner going on past a check
that raises, kills its own process, hangs or does not exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from shim_build import REPO, build

from neuronetes.gpuvalidate.model import SCHEMA, load_table

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_fake_run_executes_every_check_and_writes_the_documented_document(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "gpu-validate.sh"), "--fake", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    doc = json.loads((out / "gpu-validate.json").read_text())
    table = (out / "gpu-validate.txt").read_text()
    assert table in proc.stdout  # the table is printed
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert doc["schema"] == SCHEMA and doc["mode"] == "fake"
    assert set(doc) >= {"started", "finished", "machine", "summary", "checks"}
    assert doc["machine"]["gpu"]["name"].startswith("fake GPU")
    checks = {c["id"]: c for c in doc["checks"]}
    assert list(checks) == [s.id for s in load_table()]
    for needs_gpu in ("discovery", "exporter"):
        assert checks[needs_gpu]["status"] == "skipped" and checks[needs_gpu]["reason"] == "skipped: no GPU"
    for runs in ("shim-memory", "shim-compute", "workstation-preemption", "reconciliation"):
        check = checks[runs]
        assert check["status"] == "pass", check
        assert all(set(s) == {"id", "status", "reason", "figures"} for s in check["subchecks"])
    memory = {s["id"]: s for s in checks["shim-memory"]["subchecks"]}
    # the driver-API sub-checks run over the fake; the frameworks' need a GPU
    assert memory["vmm.release-while-mapped"]["status"] == "pass"
    assert memory["vmm.driver"]["status"] == "pass"  # the fake models the real driver's VMM behaviour
    assert memory["torch"]["reason"] == "skipped: no GPU"
    compute = {s["id"]: s for s in checks["shim-compute"]["subchecks"]}
    two = compute["two-tenants.30-70"]  # run over the fake, not judged (it does not time-slice)
    assert two["status"] == "skipped" and two["figures"]["tenant_70"]["achieved_percent"] > 0
    assert compute["launch-overhead"]["figures"]["launches_per_s"]["no_shim"] > 0
    assert checks["workstation-preemption"]["figures"]["checkpoint_seconds"] is not None
    reconciliation = {s["id"]: s["status"] for s in checks["reconciliation"]["subchecks"]}
    assert reconciliation == dict.fromkeys(
        [
            "registered",
            "nvml.lists",
            "shimmed.clean",
            "unshimmed.found",
            "over-limit.found",
            "whole-and-mig.ignored",
            "grace.evicts",
        ],
        "pass",
    )
    assert (out / "gpu-validate.log").stat().st_size > 0


CHECKS = textwrap.dedent(
    """
    import os
    import time

    from neuronetes.gpuvalidate.model import Report

    def boom(ctx):
        raise RuntimeError("the check itself broke")

    def exits(ctx):
        os._exit(3)

    def hang(ctx):
        time.sleep(60)

    def fine(ctx):
        report = Report()
        report.check("ran", True, "ran after the others", mode=ctx.mode)
        return report

    def not_a_report(ctx):
        return 42

    def leaves_a_process(ctx):
        import subprocess
        proc = subprocess.Popen(["sleep", "300"], cwd=ctx.work, start_new_session=True)
        open(os.path.join(ctx.out, "leftover.pid"), "w").write(str(proc.pid))
        report = Report()
        report.check("left", True, "left a process behind")
        return report
    """
)


def runner_argv(out: Path, *extra: str) -> list[str]:
    """The runner over the shim built by make (what hack/gpu-validate.sh --fake passes it)."""
    release = build() / "release"
    return [
        sys.executable, "-m", "neuronetes.gpuvalidate", "--fake", "--out", str(out), *extra,
        "--shim", str(release / "lib" / "libneuronetes-cuda.so"),
        "--launch-probe", str(release / "launch_probe"),
        "--fake-lib-dir", str(release / "fake"),
    ]  # fmt: skip


def test_a_failing_check_never_stops_the_others(tmp_path: Path) -> None:
    release = build() / "release"
    (tmp_path / "gv_test_checks.py").write_text(CHECKS)
    rows = [
        ("boom", 30),
        ("exits", 30),
        ("hang", 2),
        ("nowhere", 30),
        ("not_a_report", 30),
        ("leaves_a_process", 30),
        ("fine", 30),
    ]
    table = tmp_path / "checks.toml"
    table.write_text(
        "".join(
            f'[[check]]\nid = "{name}"\ntitle = "{name}"\n'
            f'run = "{"no_such_module" if name == "nowhere" else "gv_test_checks"}:{name}"\n'
            f'modes = ["fake"]\ntimeout_s = {limit}\ngoal = "-"\n'
            for name, limit in rows
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "LD_LIBRARY_PATH": str(release / "fake"),
    }
    out = tmp_path / "out"
    proc = subprocess.run(
        runner_argv(out, "--table", str(table)),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    checks = {c["id"]: c for c in json.loads((out / "gpu-validate.json").read_text())["checks"]}
    assert list(checks) == [name for name, _ in rows]
    assert checks["boom"]["status"] == "error" and "the check itself broke" in checks["boom"]["reason"]
    assert checks["exits"]["status"] == "error" and "ended (3)" in checks["exits"]["reason"]
    assert checks["hang"]["status"] == "error" and "past its 2 s limit" in checks["hang"]["reason"]
    assert checks["nowhere"]["status"] == "error" and "no_such_module" in checks["nowhere"]["reason"]
    assert checks["not_a_report"]["status"] == "error" and "not a Report" in checks["not_a_report"]["reason"]
    assert checks["fine"]["status"] == "pass" and checks["fine"]["subchecks"][0]["figures"] == {
        "mode": "fake"
    }
    assert "Traceback" in (out / "gpu-validate.log").read_text()  # the broken check's traceback is kept
    # nothing a check started outlives it, even in a session of its own holding the check's output
    assert checks["leaves_a_process"]["status"] == "pass"
    leftover = int((out / "leftover.pid").read_text())
    assert (
        not Path(f"/proc/{leftover}").exists() or "Z" in Path(f"/proc/{leftover}/stat").read_text().split()[2]
    )


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "gpu-validate.sh"), "--frobnicate"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: unknown argument --frobnicate (see --help)"
    ]
    proc = subprocess.run(
        runner_argv(tmp_path, "--only", "nope"), capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: --only nope: no such check")
