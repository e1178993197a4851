"""The Grafana dashboard and the alert rules: every expression parses, and every metric it uses is
exported by a component (the registries built in-process, as the extender and the agent build them).
`promtool check rules` checks the rule file as Prometheus loads it, and `promtool test rules` runs
the alert cases of tests/fixtures/neuronetes-rules-test.yaml."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from observability import (
    DASHBOARD,
    REPO_ROOT,
    RULES,
    all_queries,
    exported_metric_names,
    metric_names,
    rule_queries,
)

from neuronetes import contracts as c

pytestmark = pytest.mark.unit

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian's prometheus) missing"
)


def test_every_query_uses_only_exported_metrics() -> None:
    exported = exported_metric_names()
    everything = set().union(*exported.values())
    queries = all_queries()
    assert len(queries) >= 40
    missing = {q.where: sorted(metric_names(q.expr) - everything) for q in queries}
    assert {w: m for w, m in missing.items() if m} == {}
    for q in queries:
        assert metric_names(q.expr), f"{q.where} selects no metric"


def test_the_dashboard_covers_every_area() -> None:
    used = set().union(*(metric_names(q.expr) for q in all_queries()))
    for name in (
        c.METRIC_GPUS_ALLOCATED,
        c.METRIC_GPUS_FRAGMENTED,
        c.METRIC_GPU_UTILIZATION,
        c.METRIC_GPU_MEMORY_USED,
        c.METRIC_GPU_TEMPERATURE,
        c.METRIC_SLICE_MEMORY_USED,
        c.METRIC_SLICE_THROTTLED_TIME,
        c.METRIC_SCHEDULER_ATTEMPTS,
        c.METRIC_SCHEDULER_SUCCESS,
        c.METRIC_SCHEDULER_PENDING,
        c.METRIC_GANGS_PENDING,
    ):
        assert name in used, name
    assert c.METRIC_SCHEDULER_LATENCY + "_bucket" in used
    assert {c.METRIC_AUTOSCALER_DECISIONS, c.METRIC_AUTOSCALER_DESIRED} <= used
    assert c.METRIC_SCALEUP_TO_READY + "_bucket" in used
    assert c.METRIC_GPU_XID_ERRORS in used


def test_every_alert_named_by_the_issue_exists() -> None:
    alerts = {q.where: metric_names(q.expr) for q in rule_queries()}
    assert alerts["alert NeuroNetesGPUXidError"] == {c.METRIC_GPU_XID_ERRORS}
    assert alerts["alert NeuroNetesGPUOffline"] == {c.METRIC_GPU_HEALTH}
    assert alerts["alert NeuroNetesSchedulingLatencyHigh"] == {c.METRIC_SCHEDULER_LATENCY + "_bucket"}
    assert alerts["alert NeuroNetesGangPendingPastTimeout"] == {c.METRIC_GANGS_PAST_TIMEOUT}
    assert alerts["alert NeuroNetesExtenderCacheStale"] == {c.METRIC_WATCH_BROKEN}


def test_dashboard_panels_are_unique_and_placed() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        assert p["type"] == "row" or p["description"], p["title"]
        assert p["gridPos"]["x"] >= 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]


def test_unparsable_promql_is_refused() -> None:
    with pytest.raises(ValueError):
        metric_names("sum(rate(neuronetes_gpu_power_watts[5m])")


@needs_promtool
def test_promtool_check_rules_is_clean() -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_every_alert_fires_on_its_series_and_not_on_others() -> None:
    """`promtool test rules`: synthetic series in, the alerts (labels and rendered text) out."""
    cases = REPO_ROOT / "tests" / "fixtures" / "neuronetes-rules-test.yaml"
    done = subprocess.run(
        ["promtool", "test", "rules", str(cases)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
