"""The GPU validation's pure parts: the check table, reports and their status, the nvidia-smi and
metrics parsers (on output recorded from an H100), the comparisons and the table."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from neuronetes import contracts as c
from neuronetes.gpuvalidate.checks import discovery, exporter
from neuronetes.gpuvalidate.context import parse_results, refusals
from neuronetes.gpuvalidate.model import (
    TABLE,
    CheckResult,
    CheckSpec,
    Report,
    TableError,
    load_table,
    summary,
)
from neuronetes.gpuvalidate.runner import missing_needs
from neuronetes.gpuvalidate.table import compact, render

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpu"
H100_UUID = "GPU-37dd3985-be58-d64b-dc09-7e4e263013fa"


def test_the_check_table_loads_with_every_check_the_issue_names() -> None:
    specs = load_table(TABLE)
    assert [s.id for s in specs] == [
        "discovery",
        "exporter",
        "shim-memory",
        "shim-compute",
        "workstation-preemption",
        "reconciliation",
        "runtime",
    ]
    assert all(s.goal and s.title and ":" in s.run for s in specs)
    assert {s.id for s in specs if "fake" in s.modes} == {
        "shim-memory",
        "shim-compute",
        "workstation-preemption",
        "reconciliation",
    }


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('id = "x"\ntitle = "t"\nrun = "m"\nmodes = ["gpu"]\ntimeout_s = 5\ngoal = "g"', "'run' must be"),
        ('id = "x"\ntitle = "t"\nrun = "m:f"\nmodes = ["tpu"]\ntimeout_s = 5\ngoal = "g"', "'modes' must"),
        ('id = "x"\ntitle = "t"\nrun = "m:f"\nmodes = ["gpu"]\ntimeout_s = 0\ngoal = "g"', "'timeout_s'"),
        (
            'id = "x"\ntitle = "t"\nrun = "m:f"\nmodes = ["gpu"]\nneeds = ["gpu"]\ntimeout_s = 5\ngoal = "g"',
            "need",
        ),
        (
            'id = "x"\ntitle = "t"\nrun = "m:f"\nmodes = ["gpu"]\ntimeout_s = 5\ngoal = "g"\nextra = 1',
            "unknown field",
        ),
        ('id = ""\ntitle = "t"\nrun = "m:f"\nmodes = ["gpu"]\ntimeout_s = 5\ngoal = "g"', "'id'"),
    ],
)
def test_a_bad_table_entry_is_refused_naming_the_field(tmp_path: Path, entry: str, message: str) -> None:
    table = tmp_path / "checks.toml"
    table.write_text(f"[[check]]\n{entry}\n")
    with pytest.raises(TableError, match=message):
        load_table(table)


def test_repeated_ids_and_an_empty_table_are_refused(tmp_path: Path) -> None:
    row = '[[check]]\nid = "x"\ntitle = "t"\nrun = "m:f"\nmodes = ["gpu"]\ntimeout_s = 5\ngoal = "g"\n'
    table = tmp_path / "checks.toml"
    table.write_text(row + row)
    with pytest.raises(TableError, match="repeat"):
        load_table(table)
    table.write_text("# nothing\n")
    with pytest.raises(TableError, match="no \\[\\[check\\]\\]"):
        load_table(table)


def spec(**kw: Any) -> CheckSpec:
    base: dict[str, Any] = dict(
        id="x", title="t", run="m:f", modes=("gpu",), needs=(), timeout_s=5.0, goal="g"
    )
    return CheckSpec(**{**base, **kw})


def test_status_is_derived_from_the_sub_checks() -> None:
    r = Report()
    statuses = [r.status]
    r.skip("a", "skipped: no GPU")
    statuses.append(r.status)
    assert r.check("b", True, "fine", figure=1) is True
    statuses.append(r.status)
    assert r.check("c", False, "broken") is False
    statuses.append(r.status)
    assert statuses == ["skipped", "skipped", "pass", "fail"]
    result = CheckResult.of(spec(), r, 1.234)
    assert result.status == "fail" and result.reason == "failed: c" and result.seconds == 1.23
    assert summary([result, CheckResult.not_run(spec(), "error", "error: x")]) == {
        "pass": 0,
        "fail": 1,
        "skipped": 0,
        "error": 1,
    }
    # a figure may be named like a parameter: the sub-check's own arguments are positional
    r.check("d", True, "ok", reason="a figure called reason", id="and one called id")
    assert r.findings[-1].figures == {"reason": "a figure called reason", "id": "and one called id"}


def test_missing_needs_say_what_to_install(tmp_path: Path) -> None:
    built = tmp_path / "lib.so"
    needs = ("cmd:surely-no-such-command", "py:surely_no_such_module", "py:json", "built:shim", "built:probe")
    missing = missing_needs(spec(needs=needs), {"shim": str(built), "probe": "/nonexistent"})
    assert missing == [
        "the command surely-no-such-command",
        "the Python module surely_no_such_module",
        "the shim build (it failed: see build.log)",
        "the probe build (it failed: see build.log)",
    ]
    built.write_bytes(b"\x7fELF")
    assert "the shim build" not in " ".join(missing_needs(spec(needs=needs), {"shim": str(built)}))


def test_workload_results_and_the_shims_refusals_are_read_from_its_output() -> None:
    out = 'noise\nRESULT {"a": 1}\nRESULT [1]\nRESULT {broken\nRESULT {"b": 2}\n'
    results = parse_results(out)
    assert results[0] == {"a": 1} and results[-1] == {"b": 2}
    assert "error" in results[1] and "error" in results[2]
    err = (
        'neuronetes-cuda[7]: cuGetProcAddress("cuX", 13000) returned a variant the shim does not wrap: '
        "refused\n"
        "other line\n"
    )
    assert refusals(err) == [err.splitlines()[0]]


def test_nvidia_smi_xml_of_an_h100() -> None:
    gpus = discovery.parse_smi_xml((FIXTURES / "h100-nvidia-smi-q-x.xml").read_text())
    assert gpus == [
        discovery.SmiGpu(
            uuid=H100_UUID,
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81559,
            mig_enabled=False,
            pci_bus_id="00000000:00:06.0",
            minor=0,
        )
    ]


def test_nvidia_smi_topology_numa_and_nvlink() -> None:
    h100 = discovery.parse_topology((FIXTURES / "h100-nvidia-smi-topo-m.txt").read_text())
    assert h100 == {0: {"numa": 0, "nvlink_peers": []}}
    two = (
        "\t\x1b[4mGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tNV18\tPXB\t0-15\t0\t\tN/A\n"
        "GPU1\tNV18\t X \tSYS\t16-31\t1\t\tN/A\n"
        "NIC0\tPXB\tSYS\t X \t\t\t\t\n"
    )
    assert discovery.parse_topology(two) == {
        0: {"numa": 0, "nvlink_peers": [1]},
        1: {"numa": 1, "nvlink_peers": [0]},
    }
    assert discovery.normal_bus_id("0000:3B:00.0") == "00000000:3b:00.0"


def test_discovery_comparison_names_each_differing_field() -> None:
    smi = discovery.parse_smi_xml((FIXTURES / "h100-nvidia-smi-q-x.xml").read_text())
    gpu = types.SimpleNamespace(
        index=0,
        uuid=H100_UUID,
        model="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        mig_enabled=False,
        pci_bus_id="00000000:00:06.0",
        minor=0,
        numa_node=-1,
        nvlink_peers=(),
    )
    [(index, fields)] = discovery.compare(types.SimpleNamespace(gpus=[gpu]), smi, {0: {"numa": 0}})
    assert index == 0
    assert [k for k, v in fields.items() if not v["equal"]] == ["numa_node", "nvlink_peers"]


def _metrics(uuid: str, util: float, used_mib: int, power: float) -> str:
    labels = f'Hostname="n",gpu="0",UUID="{uuid}",model_name="H100",namespace="",pod="",container=""'
    gpu = f'Hostname="n",gpu="0",UUID="{uuid}",model_name="H100"'
    return "\n".join(
        [
            f"# TYPE {c.METRIC_GPU_UTILIZATION} gauge",
            f"{c.METRIC_GPU_UTILIZATION}{{{labels}}} {util}",
            f"# TYPE {c.METRIC_GPU_MEMORY_USED} gauge",
            f"{c.METRIC_GPU_MEMORY_USED}{{{labels}}} {used_mib << 20}",
            f"# TYPE {c.METRIC_GPU_POWER} gauge",
            f"{c.METRIC_GPU_POWER}{{{labels}}} {power}",
            "# TYPE neuronetes_gpu_ecc_errors counter",
            f'neuronetes_gpu_ecc_errors_total{{{gpu},type="corrected"}} 0.0',
            f'neuronetes_gpu_ecc_errors_total{{{gpu},type="uncorrected"}} 0.0',
            "",
        ]
    )


def test_exporter_comparison_uses_each_metrics_tolerance() -> None:
    rounds = []
    for util, power in ((98.0, 400.0), (99.0, 410.0), (97.0, 405.0)):
        rounds.append(
            {
                "metrics": exporter.parse_metrics(_metrics(H100_UUID, util, 1000, power)),
                "smi": {
                    H100_UUID: {
                        "utilization.gpu": util + 1,
                        "memory.used": 1010.0,
                        "power.draw": power * 1.5,  # outside 25 %
                        "ecc.errors.corrected.volatile.total": 0.0,
                        "ecc.errors.uncorrected.volatile.total": 0.0,
                    }
                },
            }
        )
    report = Report()
    exporter.compare(report, rounds)
    by_id = {f.id: f for f in report.findings}
    assert by_id[f"utilization_percent[{H100_UUID[:12]}]"].status == "pass"
    assert by_id[f"memory_used_bytes[{H100_UUID[:12]}]"].status == "pass"
    assert by_id[f"power_watts[{H100_UUID[:12]}]"].status == "fail"
    assert by_id[f"ecc_errors[{H100_UUID[:12]}]"].status == "pass"
    # not exported at all: a failure that names the metric
    assert by_id[f"temperature_celsius[{H100_UUID[:12]}]"].status == "fail"
    assert by_id["present.neuronetes_gpu_ecc_errors"].status == "pass"
    assert by_id[f"present.{c.METRIC_GPU_HEALTH}"].status == "fail"


def test_the_table_shows_checks_sub_checks_and_figures() -> None:
    r = Report(figures={"seconds": 0.123456})
    r.check("quota.50", True, "achieved 49.1 %", achieved_percent=49.1234, nested={"a": [1, 2]})
    r.skip("torch", "skipped: no GPU")
    doc = {
        "mode": "fake",
        "started": "2026-11-26T00:00:00+00:00",
        "machine": {"gpu": {"name": "fake", "uuid": "GPU-x", "driver": "fake"}},
        "checks": [CheckResult.of(spec(id="shim-compute"), r, 2.0).to_json()],
        "summary": {"pass": 1, "fail": 0, "error": 0, "skipped": 0},
    }
    text = render(json.loads(json.dumps(doc)))
    assert (
        "shim-compute" in text and "PASS" in text and "quota.50" in text and "achieved_percent=49.12" in text
    )
    assert "skipped: no GPU" in text and text.endswith("1 passed, 0 failed, 0 errors, 0 skipped\n")
    assert compact({"a": {"b": 1.0, "c": None, "d": True}}) == "a={b: 1, c: none, d: true}"
