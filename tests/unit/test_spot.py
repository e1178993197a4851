"""Spot capacity's pure rules (`neuronetes.spot`): notices and their deadlines, spot nodes, the
spot share, instance-type preferences and the interruption threshold's state machine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from neuronetes import contracts as c
from neuronetes.spot import (
    NOTICE_KEY,
    ThresholdState,
    duration_seconds,
    instance_type_preferences,
    is_spot_node,
    notice_of,
    on_demand_requirements,
    spot_allowance,
    step_threshold,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def node(
    taints: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"taints": taints or []},
    }


@pytest.mark.parametrize(
    ("taint", "source", "seconds"),
    [
        ({"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}, "aws-nth-spot-itn", 120),
        ({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}, "karpenter-disrupted", 120),
        (
            {"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"},
            "karpenter-disruption",
            120,
        ),
        (
            {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"},
            "gke-impending-termination",
            30,
        ),
        ({"key": NOTICE_KEY, "value": "45", "effect": "NoSchedule"}, "neuronetes", 45),
    ],
)
def test_each_notice_taint_is_recognised_with_its_deadline_from_first_seen(
    taint: dict[str, Any], source: str, seconds: int
) -> None:
    seen = NOW - timedelta(seconds=10)
    notice = notice_of(node([taint]), now=NOW, first_seen=seen)
    assert notice is not None
    assert (notice.node, notice.source, notice.noticed) == ("n1", source, seen)
    assert notice.deadline == seen + timedelta(seconds=seconds)
    assert notice.problem is None


def test_a_taints_time_added_wins_over_first_seen() -> None:
    added = "2026-05-01T11:59:00Z"
    taint = {"key": "aws-node-termination-handler/spot-itn", "effect": "NoExecute", "timeAdded": added}
    notice = notice_of(node([taint]), now=NOW, first_seen=NOW)
    assert notice is not None and notice.deadline == datetime(2026, 5, 1, 12, 1, tzinfo=UTC)


def test_the_rebalance_recommendation_is_opt_in() -> None:
    taint = {"key": "aws-node-termination-handler/rebalance-recommendation", "effect": "PreferNoSchedule"}
    assert notice_of(node([taint]), now=NOW) is None
    notice = notice_of(node([taint]), now=NOW, rebalance=True)
    assert notice is not None and notice.source == "aws-nth-rebalance"


def test_karpenter_disruption_taint_needs_its_value_and_other_taints_are_no_notice() -> None:
    other = {"key": "karpenter.sh/disruption", "value": "something-else", "effect": "NoSchedule"}
    unrelated = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    assert notice_of(node([other, unrelated]), now=NOW) is None
    assert notice_of(node(), now=NOW) is None


def test_our_notice_as_label_or_annotation_with_seconds_a_time_or_nothing() -> None:
    label = notice_of(node(labels={NOTICE_KEY: "true"}), now=NOW)
    assert label is not None and label.deadline == NOW + timedelta(seconds=120)
    secs = notice_of(node(labels={NOTICE_KEY: "20"}), now=NOW)
    assert secs is not None and secs.deadline == NOW + timedelta(seconds=20)
    at = notice_of(node(annotations={NOTICE_KEY: "2026-05-01T12:05:00Z"}), now=NOW)
    assert at is not None and at.deadline == datetime(2026, 5, 1, 12, 5, tzinfo=UTC)


def test_a_garbage_deadline_is_one_clear_problem_and_the_default_deadline() -> None:
    notice = notice_of(node(annotations={NOTICE_KEY: "soon-ish"}), now=NOW)
    assert notice is not None and notice.deadline == NOW + timedelta(seconds=120)
    assert notice.problem is not None and "neither seconds nor an RFC 3339 time" in notice.problem
    bad_taints = node([{"no-key": 1}, "junk", {"key": None}])  # type: ignore[list-item]
    assert notice_of(bad_taints, now=NOW) is None


@pytest.mark.parametrize(
    ("labels", "spot"),
    [
        ({c.LABEL_SPOT: "true"}, True),
        ({"karpenter.sh/capacity-type": "spot"}, True),
        ({"karpenter.sh/capacity-type": "on-demand"}, False),
        ({"eks.amazonaws.com/capacityType": "SPOT"}, True),
        ({"cloud.google.com/gke-spot": "true"}, True),
        ({"kubernetes.azure.com/scalesetpriority": "spot"}, True),
        ({c.LABEL_SPOT: "false"}, False),
        ({}, False),
    ],
)
def test_spot_nodes_by_any_clouds_label(labels: dict[str, str], spot: bool) -> None:
    assert is_spot_node(labels) is spot


def test_on_demand_requirements_exclude_each_spot_label() -> None:
    reqs = {r["key"]: r for r in on_demand_requirements()}
    assert reqs["karpenter.sh/capacity-type"] == {
        "key": "karpenter.sh/capacity-type",
        "operator": "NotIn",
        "values": ["spot"],
    }
    assert all(r["operator"] == "NotIn" for r in reqs.values())


@pytest.mark.parametrize(
    ("units", "percent", "allowed"),
    [(4, 50, 2), (5, 50, 2), (3, 34, 1), (3, 33, 0), (10, 100, 10), (10, 0, 0), (0, 50, 0), (7, 99, 6)],
)
def test_spot_allowance_never_exceeds_the_percentage(units: int, percent: int, allowed: int) -> None:
    assert spot_allowance(units, percent) == allowed
    assert units == 0 or allowed / units <= percent / 100


def test_instance_types_are_a_preference_order() -> None:
    terms = instance_type_preferences(["p4d.24xlarge", "p5.48xlarge", "p4d.24xlarge", "g5.48xlarge"])
    assert [t["weight"] for t in terms] == [100, 67, 33]
    assert [t["preference"]["matchExpressions"][0]["values"] for t in terms] == [
        ["p4d.24xlarge"],
        ["p5.48xlarge"],
        ["g5.48xlarge"],
    ]
    assert terms[0]["preference"]["matchExpressions"][0]["key"] == "node.kubernetes.io/instance-type"
    assert min(t["weight"] for t in instance_type_preferences([f"t{i}" for i in range(64)])) == 2
    assert instance_type_preferences([]) == []


def test_durations() -> None:
    assert duration_seconds("10m") == 600
    assert duration_seconds("1h30m") == 5400
    assert duration_seconds("1.5s") == 1.5
    with pytest.raises(ValueError, match="not a duration"):
        duration_seconds("10 minutes")


def test_threshold_trips_after_count_within_window_and_clears_after_a_quiet_window() -> None:
    window = 600.0
    state = ThresholdState()
    state = step_threshold(state, [NOW], count=2, window_s=window, now=NOW)
    assert state.tripped_at is None and state.noticed == (NOW,)
    later = NOW + timedelta(minutes=11)  # the first notice left the window: still one in it
    state = step_threshold(state, [later], count=2, window_s=window, now=later)
    assert state.tripped_at is None and state.noticed == (later,)
    third = later + timedelta(minutes=3)
    state = step_threshold(state, [third], count=2, window_s=window, now=third)
    assert state.tripped_at == third
    # Quiet period: one window from the last notice. Just before it, still tripped.
    before = third + timedelta(seconds=window - 1)
    assert step_threshold(state, [], count=2, window_s=window, now=before).tripped_at == third
    after = third + timedelta(seconds=window)
    cleared = step_threshold(state, [], count=2, window_s=window, now=after)
    assert cleared.tripped_at is None and cleared.noticed == (third,)  # the newest is kept


def test_a_notice_during_the_quiet_period_restarts_it() -> None:
    window = 60.0
    state = ThresholdState(noticed=(NOW,), tripped_at=NOW)
    again = NOW + timedelta(seconds=50)
    state = step_threshold(state, [again], count=3, window_s=window, now=again)
    assert state.tripped_at == NOW
    assert (
        step_threshold(state, [], count=3, window_s=window, now=NOW + timedelta(seconds=70)).tripped_at == NOW
    )
    assert (
        step_threshold(state, [], count=3, window_s=window, now=again + timedelta(seconds=60)).tripped_at
        is None
    )
