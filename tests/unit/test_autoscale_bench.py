"""bench/autoscale.py: the simulated vLLM pool keeps its invariants and the HPA baseline behaves as
the Kubernetes docs say. No figure of any policy is asserted (bench/README.md has them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import autoscale  # noqa: E402
from autoscale_sim.policies import Hpa, PoolState  # noqa: E402
from autoscale_sim.run import Run, reversals, simulate  # noqa: E402
from autoscale_sim.server import ServerModel  # noqa: E402
from autoscale_sim.workloads import ramp, step_load  # noqa: E402

MODEL = ServerModel()


@pytest.fixture(scope="module")
def ramp_run() -> Run:
    workload = ramp(7, low_rps=1.0, high_rps=20.0, phases_s=(30.0, 90.0, 60.0, 90.0, 30.0))
    return simulate(workload, Hpa("hpa", 1, 16), MODEL, initial_replicas=1, min_replicas=1, max_replicas=16)


def test_every_request_is_served_once_and_finishes_after_its_first_token(ramp_run: Run) -> None:
    assert ramp_run.requests
    assert all(r.served == 1 for r in ramp_run.requests)
    assert all(r.arrival <= r.first_token <= r.finished for r in ramp_run.requests)


def test_ttft_is_never_below_the_prompts_prefill_time(ramp_run: Run) -> None:
    shortest = min(r.ttft - r.prompt / MODEL.prefill_tokens_per_s for r in ramp_run.requests)
    assert shortest >= -1e-9


def test_replica_seconds_is_the_integral_of_the_replicas_holding_a_gpu(ramp_run: Run) -> None:
    assert ramp_run.events, "the ramp makes the pool scale"
    assert ramp_run.replica_seconds == pytest.approx(ramp_run.replica_integral, rel=1e-9)
    assert ramp_run.replica_seconds >= ramp_run.end  # never fewer than min_replicas (1)


def test_a_cold_replica_serves_nothing_before_its_cold_start() -> None:
    workload = step_load(2.0, 40.0, 30.0, 240.0, 1000, 100)
    run = simulate(workload, Hpa("hpa", 1, 8), MODEL, initial_replicas=1, min_replicas=1, max_replicas=8)
    first_scale_up = next(at for at, before, after in run.events if after > before)
    late_replicas = {r.replica for r in run.requests if r.replica != 0}
    assert late_replicas, "the step brought new replicas"
    earliest = min(r.first_token for r in run.requests if r.replica in late_replicas)
    assert earliest >= first_scale_up + MODEL.cold_start_s


def _hpa_step_run() -> tuple[Run, float]:
    """1 req/s, then 40 req/s from 60 s, nothing from 300 s: up, hold, then down."""
    workload = step_load(1.0, 40.0, 60.0, 1200.0, 1000, 100, stop_s=300.0)
    run = simulate(workload, Hpa("hpa", 1, 30), MODEL, initial_replicas=1, min_replicas=1, max_replicas=30)
    return run, 300.0


def test_hpa_acts_only_at_its_15s_syncs_and_scales_up_by_at_most_double_or_four_pods() -> None:
    run, _ = _hpa_step_run()
    ups = [(at, before, after) for at, before, after in run.events if after > before]
    assert len(ups) >= 2, "the step needs more than one scale-up"
    assert all(abs(at / 15.0 - round(at / 15.0)) < 1e-6 for at, _, _ in run.events)
    for _, before, after in ups:
        assert after <= max(2 * before, before + 4)
    assert max(after for _, _, after in ups) > 4, "the percent policy (x2) took over from +4 pods"


def test_hpa_scales_down_only_after_the_300s_window_and_reaches_min_when_it_has_passed() -> None:
    run, load_stops = _hpa_step_run()
    last_up = max(at for at, before, after in run.events if after > before)
    downs = [(at, before, after) for at, before, after in run.events if after < before]
    assert downs, "the load stopped: the pool shrinks"
    assert downs[0][0] >= last_up + 300.0  # the scale-down window keeps the highest recommendation
    last_at, _, last_to = run.events[-1]
    assert last_to == 1
    # Once nothing waits (at the latest when the last request finishes) every recommendation is
    # minReplicas; the window forgets the last higher one 300 s later (plus a scrape and a sync), and
    # 100 % per 15 s lets the pool drop there in one sync.
    queue_empty_by = max(r.finished for r in run.requests)
    assert queue_empty_by >= load_stops
    assert last_at <= queue_empty_by + 300.0 + 5.0 + 15.0
    assert reversals(run.events) == 0


def test_hpa_holds_inside_its_10_percent_tolerance() -> None:
    hpa = Hpa("hpa", 1, 30)
    hpa.prime(0.0, 10)
    snapshot_waiting = [5.4] * 10  # 8 % over the target of 5 per pod
    assert hpa._pods_proposal(snapshot_waiting, 0, 10) == 10
    assert hpa._pods_proposal([6.0] * 10, 0, 10) == 12  # 20 % over: ceil(1.2 x 10)
    assert hpa.decide(0.0, None, PoolState(10, 10, 0)) == 10  # no metric: no change


def test_quick_run_reports_every_policy_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "autoscale.json"
    assert autoscale.main(["--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report: dict[str, Any] = json.loads(out.read_text())
    # The quick run has the trace's first 600 s and the short ramp.
    assert [w["name"] for w in report["workloads"]] == ["azure-conv", "ramp"]
    ramp_report = report["workloads"][-1]
    names = [row["policy"] for row in ramp_report["results"]]
    assert names[:3] == ["hpa", "keda", "aibrix-apa"]
    for row in ramp_report["results"]:
        assert row["served"] == row["requests"] > 0
        assert 0.0 <= row["slo_attainment"] <= 1.0
        assert row["ttft_p50_s"] <= row["ttft_p95_s"] <= row["ttft_p99_s"]
        assert f"{row['policy']:<11}" in printed
    if "ours" in names:
        assert any(line.startswith("verdict ramp:") for line in printed.splitlines())
    else:
        assert "ours: skipped" in printed


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(SystemExit) as exit_info:
        autoscale.main(["--rate-scale", "0"])
    assert exit_info.value.code == 2
