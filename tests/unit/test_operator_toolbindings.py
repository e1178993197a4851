"""ToolBinding status (pure): the pool resolved, and whether the autoscaling controller can act on
the lag (it reads depth from Prometheus only)."""

from __future__ import annotations

import pytest

from neuronetes.api.models import PoolReference, QueueConfig, QueueSource, ToolBindingSpec
from neuronetes_operator.toolbindings import binding_status

pytestmark = pytest.mark.unit


def conditions(status: dict[str, object]) -> dict[str, tuple[str, str]]:
    return {cd["type"]: (cd["status"], cd["reason"]) for cd in status["conditions"]}  # type: ignore[attr-defined]


def test_binding_without_pool_ref_is_pending() -> None:
    spec = ToolBindingSpec(queue_config=QueueConfig(autoscale_on_lag=True, max_lag_threshold=100))
    st = binding_status(spec, False, 1)
    assert st["phase"] == "Pending"
    assert conditions(st) == {"Bound": ("False", "NoPoolRef"), "LagScaling": ("False", "QueueNotReadable")}


def test_lag_from_prometheus_is_the_autoscaling_controllers() -> None:
    spec = ToolBindingSpec(
        pool_ref=PoolReference(name="rag-pool"),
        queue=QueueSource(type="prometheus", name="sum(kafka_consumergroup_lag)"),
        queue_config=QueueConfig(autoscale_on_lag=True, max_lag_threshold=100),
    )
    assert conditions(binding_status(spec, True, 1))["LagScaling"] == ("True", "AutoscalingController")


def test_binding_to_an_existing_pool_is_active() -> None:
    st = binding_status(ToolBindingSpec(pool_ref=PoolReference(name="rag-pool")), True, 2)
    assert st["phase"] == "Active" and conditions(st)["Bound"] == ("True", "PoolFound")
    assert conditions(st)["LagScaling"] == ("False", "Disabled")


def test_binding_to_a_missing_pool_says_so() -> None:
    st = binding_status(ToolBindingSpec(pool_ref=PoolReference(name="nope")), False, 1)
    assert st["phase"] == "Pending" and conditions(st)["Bound"] == ("False", "PoolNotFound")
