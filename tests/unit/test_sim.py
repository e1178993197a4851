"""The trace simulator: trace loading, workload tuning, seeds, the replay, summaries and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from neuronetes.cli import main
from neuronetes.engine import POLICIES
from neuronetes.model import NodeSpec, PodRequest
from neuronetes.sim import report
from neuronetes.sim.simulate import (
    MAX_POINT,
    REPORT_POINTS,
    RunResult,
    build_workload,
    parse_seeds,
    simulate,
    summarise,
)
from neuronetes.sim.trace import GPU_MEMORY_MIB, TraceError, load_nodes, load_pods

pytestmark = pytest.mark.unit

NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
node-a,32000,131072,2,T4
node-b,64000,262144,4,V100M32
node-c,16000,65536,1,MYSTERY
node-d,96000,393216,0,nan
"""

POD_COLUMNS_11 = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,"
    "qos,pod_phase,creation_time,deletion_time,scheduled_time"
)
PODS_11_CSV = f"""{POD_COLUMNS_11}
pod-1,4000,8192,1,500,,LS,Running,0,100,1
pod-2,8000,16384,2,1000,V100M32|V100M16,BE,Running,0,100,1
pod-3,2000,4096,0,0,nan,LS,Running,0,100,1
pod-4,1000,2048,1,250,T4|T4,LS,Running,0,100,1
pod-5,2000,4096,1,1000,nan,LS,Running,0,100,1
pod-6,,nan,1,300,,LS,Running,0,100,1
"""

PODS_5_CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli
mg-1,16000,65536,4,1000
mg-2,8000,32768,2,1000
mg-3,4000,8192,1,500
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- trace loading ------------------------------------------------------------------------------------
def test_load_nodes(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, "nodes.csv", NODES_CSV))
    assert [n.name for n in nodes] == ["node-a", "node-b", "node-c", "node-d"]
    a, b, c, d = nodes
    assert (a.cpu_milli, a.memory_mib, len(a.gpus), a.gpu_model) == (32000, 131072, 2, "T4")
    assert all(g.memory_mib == GPU_MEMORY_MIB["T4"] for g in a.gpus)
    assert [g.index for g in b.gpus] == [0, 1, 2, 3] and b.gpus[0].memory_mib == GPU_MEMORY_MIB["V100M32"]
    assert len({g.uuid for g in b.gpus}) == 4 and b.gpus[2].uuid == "GPU-node-b-2"
    assert c.gpus[0].memory_mib == 16384  # unknown codes get 16 GiB
    assert d.gpus == () and d.gpu_model == ""


def test_load_pods_from_an_11_column_list(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "pods.csv", PODS_11_CSV))
    by = {p.name: p for p in pods}
    assert len(pods) == 6
    assert by["pod-1"] == PodRequest("pod-1", cpu_milli=4000, memory_mib=8192, gpus=1, gpu_milli=500)
    assert by["pod-2"].gpus == 2 and by["pod-2"].exclusive
    assert by["pod-2"].gpu_models == ("V100M16", "V100M32")  # split, sorted
    assert by["pod-3"].gpus == 0 and by["pod-3"].gpu_milli == 1000 and by["pod-3"].gpu_models == ()
    assert by["pod-4"].gpu_models == ("T4",)  # deduplicated
    assert by["pod-5"].gpu_models == () and by["pod-5"].exclusive
    assert (by["pod-6"].cpu_milli, by["pod-6"].memory_mib) == (0, 0)  # empty and "nan" read as 0


def test_load_pods_from_a_5_column_list(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "multigpu.csv", PODS_5_CSV))
    assert [(p.name, p.gpus, p.gpu_milli, p.gpu_models) for p in pods] == [
        ("mg-1", 4, 1000, ()),
        ("mg-2", 2, 1000, ()),
        ("mg-3", 1, 500, ()),
    ]


def test_a_bad_number_names_the_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.csv", PODS_5_CSV.replace("mg-2,8000", "mg-2,8k"))
    with pytest.raises(TraceError) as err:
        load_pods(path)
    msg = str(err.value)
    assert str(path) in msg and "'cpu_milli'" in msg and "'8k'" in msg and ":3:" in msg
    nodes = write(
        tmp_path, "badnodes.csv", NODES_CSV.replace("node-b,64000,262144,4", "node-b,64000,262144,four")
    )
    with pytest.raises(TraceError, match=r"badnodes\.csv:3: column 'gpu'"):
        load_nodes(nodes)
    assert issubclass(TraceError, ValueError)


def test_a_missing_column_raises(tmp_path: Path) -> None:
    path = write(tmp_path, "nocol.csv", "name,cpu_milli,memory_mib,num_gpu\np,1,1,1\n")
    with pytest.raises(TraceError, match=r"missing column.*gpu_milli"):
        load_pods(path)
    with pytest.raises(TraceError, match=r"missing column.*model"):
        load_nodes(write(tmp_path, "n.csv", "sn,cpu_milli,memory_mib,gpu\nn,1,1,1\n"))
    with pytest.raises(TraceError, match="missing column"):
        load_pods(write(tmp_path, "empty.csv", ""))


def test_gpu_milli_out_of_range_raises(tmp_path: Path) -> None:
    for milli in ("0", "1001", ""):
        path = write(tmp_path, "range.csv", f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,{milli}\n")
        with pytest.raises(TraceError, match="out of range"):
            load_pods(path)


# ---- workload ------------------------------------------------------------------------------------------
BASE = [
    PodRequest(f"p{k:02d}", cpu_milli=1000, gpus=g, gpu_milli=m)
    for k, (g, m) in enumerate([(1, 500), (1, 1000), (2, 1000), (0, 1000), (1, 250), (4, 1000)])
]


def test_build_workload_is_deterministic_per_seed_and_differs_across_seeds() -> None:
    a = build_workload(BASE, 40_000, seed=42, tune=1.3)
    assert build_workload(list(reversed(BASE)), 40_000, seed=42, tune=1.3) == a  # input order is irrelevant
    b = build_workload(BASE, 40_000, seed=43, tune=1.3)
    assert [p.name for p in a] != [p.name for p in b]


@pytest.mark.parametrize("tune", [0.5, 1.0, 1.3, 2.0])
def test_tuned_demand_reaches_the_target_and_keeps_every_base_pod(tune: float) -> None:
    capacity = 40_000
    work = build_workload(BASE, capacity, seed=7, tune=tune)
    demand = sum(p.gpu_milli_total for p in work)
    assert demand >= tune * capacity
    names = [p.name for p in work]
    assert len(set(names)) == len(names)
    for pod in BASE:
        assert pod in work  # unchanged
    extra = [p for p in work if p not in BASE]
    assert all("-tune-" in p.name for p in extra)
    # Tuning stops as soon as the target is reached: without the last sample it was short.
    if extra:
        last = max(extra, key=lambda p: int(p.name.rsplit("-", 1)[1]))
        assert demand - last.gpu_milli_total < tune * capacity
        assert all(p.shape() in {b.shape() for b in BASE} for p in extra)


def test_build_workload_without_tuning_is_a_shuffle() -> None:
    work = build_workload(BASE, 10**9, seed=1, tune=0)
    assert sorted(work, key=lambda p: p.name) == BASE
    assert build_workload([], 1000, seed=1, tune=1.3) == []


def test_parse_seeds() -> None:
    assert parse_seeds("42-44,50") == [42, 43, 44, 50]
    assert parse_seeds("42") == [42]
    assert parse_seeds(" 1 , 3-3 ,") == [1, 3]
    assert parse_seeds("-5") == [-5]
    assert parse_seeds("-5--3") == [-5, -4, -3]
    for bad in ("", ",", "a", "5-3", "1-x", "1.5"):
        with pytest.raises(ValueError):
            parse_seeds(bad)
    with pytest.raises(
        ValueError, match=r"^seed 'abc' is not a whole number or a range of them; write e\.g\. 42-51"
    ):
        parse_seeds("abc")
    with pytest.raises(ValueError, match="seed '1-x' is not"):
        parse_seeds("1-x")


# ---- simulate and summarise --------------------------------------------------------------------------
def tiny_cluster(tmp_path: Path) -> tuple[list[NodeSpec], list[PodRequest]]:
    nodes = load_nodes(write(tmp_path, "n.csv", NODES_CSV))
    pods = load_pods(write(tmp_path, "p.csv", PODS_11_CSV)) + load_pods(write(tmp_path, "m.csv", PODS_5_CSV))
    return nodes, pods


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_simulate_allocation_never_decreases_and_stays_within_capacity(tmp_path: Path, policy: str) -> None:
    nodes, pods = tiny_cluster(tmp_path)
    run = simulate(nodes, pods, policy, seed=42, time_decisions=True)
    assert len(run.allocated_pct) == MAX_POINT + 1
    assert run.allocated_pct[0] == 0.0  # the empty cluster, before any arrival
    assert all(b >= a for a, b in zip(run.allocated_pct, run.allocated_pct[1:], strict=False))
    assert all(0.0 <= x <= 100.0 for x in run.allocated_pct)
    workload = build_workload(pods, 7000, 42, 1.3)
    assert run.placed + run.failed == len(workload)
    assert len(run.decision_seconds) == len(workload)
    assert run.placed > 0 and run.allocated_pct[MAX_POINT] > 0
    assert run.unallocated(100) == pytest.approx(100.0 - run.allocated_pct[100])
    # Deterministic for a seed.
    assert simulate(nodes, pods, policy, seed=42).allocated_pct == run.allocated_pct


def test_simulate_needs_gpus(tmp_path: Path) -> None:
    nodes, pods = tiny_cluster(tmp_path)
    with pytest.raises(ValueError, match="no GPUs"):
        simulate([n for n in nodes if not n.gpus], pods, "fgd", seed=1)


def test_summarise_matches_the_documented_json() -> None:
    runs = [
        RunResult(42, 1.23456, [float(min(x, 90)) for x in range(MAX_POINT + 1)]),
        RunResult(43, 2.0, [float(min(x, 80)) for x in range(MAX_POINT + 1)]),
        RunResult(44, 3.0, [float(min(x, 85)) for x in range(MAX_POINT + 1)]),
    ]
    out = summarise("openb_pod_list_default", "fgd", runs)
    assert set(out) == {"trace", "policy", "runs", "median_unallocated_gpu_pct"}
    assert out["trace"] == "openb_pod_list_default" and out["policy"] == "fgd"
    summaries, medians = out["runs"], out["median_unallocated_gpu_pct"]
    assert isinstance(summaries, list) and isinstance(medians, dict)
    assert [set(r) for r in summaries] == [{"seed", "seconds", "unallocated_gpu_pct"}] * 3
    first = summaries[0]
    assert first["seed"] == 42 and first["seconds"] == 1.235
    assert first["unallocated_gpu_pct"] == {"95": 10.0, "100": 10.0, "130": 10.0}
    assert set(medians) == {str(p) for p in REPORT_POINTS} == {"95", "100", "130"}
    assert out["median_unallocated_gpu_pct"] == {"95": 15.0, "100": 15.0, "130": 15.0}
    json.dumps(out)  # serialisable as is


# ---- CLI ----------------------------------------------------------------------------------------------
@pytest.fixture
def trace_files(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path, "nodes.csv", NODES_CSV), write(
        tmp_path, "tiny_pods.csv", PODS_11_CSV + PODS_5_CSV.split("\n", 1)[1]
    )


def test_cli_simulate_writes_json_and_prints_a_table(
    tmp_path: Path, trace_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace_files
    out = tmp_path / "out" / "result.json"
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--seeds", "1-2"]
    rc = main([*args, "--json", str(out), "--workers", "1"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "trace: tiny_pods" in printed and "unalloc@100%" in printed
    assert any(line.startswith("fgd ") for line in printed.splitlines())
    data = json.loads(out.read_text())
    assert data["trace"] == "tiny_pods" and data["policy"] == "fgd"
    assert [r["seed"] for r in data["runs"]] == [1, 2]
    assert set(data["median_unallocated_gpu_pct"]) == {"95", "100", "130"}


def test_cli_several_policies_write_a_list_and_a_plot(
    tmp_path: Path, trace_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace_files
    out, png = tmp_path / "r.json", tmp_path / "plots" / "alloc.png"
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit, default"]
    rc = main([*args, "--seeds", "3", "--json", str(out), "--plot", str(png), "--workers", "1", "-v"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [d["policy"] for d in data] == ["bestfit", "default"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    captured = capsys.readouterr()
    assert "seed 3" in captured.err  # -v reports each run


def test_cli_parallel_workers_give_the_same_figures(tmp_path: Path, trace_files: tuple[Path, Path]) -> None:
    nodes, pods = trace_files
    results = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}.json"
        args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--seeds", "1,2"]
        assert main([*args, "--json", str(out), "--workers", workers]) == 0
        data = json.loads(out.read_text())
        results.append([r["unallocated_gpu_pct"] for r in data["runs"]])
    assert results[0] == results[1]


def test_cli_compare_adds_the_paper_columns(
    tmp_path: Path, trace_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace_files
    header = "workload,sc_policy," + ",".join(str(p) for p in range(131))
    rows = [
        "tiny_pods,06-FGD," + ",".join(str(min(p, 90)) for p in range(131)),
        "other,06-FGD," + ",".join("0" for _ in range(131)),
    ]
    (tmp_path / "paper").mkdir()
    write(tmp_path / "paper", "analysis_allo_discrete.csv", "\n".join([header, *rows]) + "\n")
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd,default", "--seeds", "1"]
    assert main([*args, "--compare", str(tmp_path / "paper"), "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert "paper@100%" in printed and "delta" in printed
    cols = {
        line.split()[0]: line.split()
        for line in printed.splitlines()
        if line.startswith(("fgd ", "default "))
    }
    ours = float(cols["fgd"][2])
    assert cols["fgd"][4] == "10.00"  # the paper's 100 − 90 for this workload only
    assert float(cols["fgd"][5]) == pytest.approx(ours - 10.0, abs=0.011)
    assert cols["default"][4] == "-"  # not a paper policy: its delta is against the paper's FGD
    assert float(cols["default"][5]) == pytest.approx(float(cols["default"][2]) - 10.0, abs=0.011)


def test_cli_errors_return_2(
    tmp_path: Path, trace_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace_files
    base = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--workers", "1"]
    assert main([*base, "--policy", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    assert main([*base, "--policy", "fgd,nope"]) == 2
    assert main([*base, "--seeds", "9-1"]) == 2
    assert main(["simulate", "--nodes", str(tmp_path / "missing.csv"), "--pods", str(pods)]) == 2
    bad = write(tmp_path, "bad.csv", PODS_5_CSV.replace("16000", "lots"))
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(bad)]) == 2
    assert "not a number" in capsys.readouterr().err
    assert main([]) == 2  # a command is required


def test_report_table_without_expected_lists_policies() -> None:
    runs = {"fgd": [RunResult(1, 0.1, [50.0] * (MAX_POINT + 1))]}
    text = report.table("t", runs, None)
    lines = text.splitlines()
    assert lines[0] == "trace: t" and "paper" not in text
    assert lines[3].split() == ["fgd", "50.00", "50.00", "50.00"]


def test_cli_output_json_prints_the_document_the_json_file_holds(
    tmp_path: Path, trace_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = trace_files
    out = tmp_path / "r.json"
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--seeds", "1"]
    assert main([*args, "--workers", "1", "-o", "json", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)  # the document alone: no table, no timing lines
    assert printed == json.loads(out.read_text())
    assert captured.err == ""  # not a terminal: no progress bar
    assert main([*args, "--workers", "1", "-o", "yaml"]) == 0
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    for doc in (as_yaml, printed):  # the same document but for each run's time
        assert all(run.pop("seconds") >= 0 for run in doc["runs"])
    assert as_yaml == printed
    assert printed["policy"] == "fgd" and set(printed["runs"][0]["unallocated_gpu_pct"]) == {
        "95",
        "100",
        "130",
    }


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--compare", "{tmp}/no-such-dir"], "--compare"),
        (["--json", "{pods}/under-a-file.json"], "--json"),
        (["--plot", "{tmp}"], "--plot"),
        (["--seeds", "abc"], "seed 'abc'"),
    ],
)
def test_cli_paths_and_seeds_are_checked_before_any_replay(
    tmp_path: Path,
    trace_files: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    says: str,
) -> None:
    from neuronetes.cli import simulate as simulate_cli

    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("the replay ran before the command line was checked")

    monkeypatch.setattr(simulate_cli, "replay", no_replay)
    nodes, pods = trace_files
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"]
    assert main([*args, *(a.format(tmp=tmp_path, pods=pods) for a in extra)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err


def test_the_readme_names_every_policy_the_cli_takes() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.startswith("| `--policy NAME` |")]
    named = row.split("|")[2].split(":", 1)[1].replace(", or", ",").split(",")
    assert [n.split("`")[1] for n in named] == list(POLICIES)
