"""ToolBinding status (pure): the pool resolved, the lag rule shown as the policy controller's."""

from __future__ import annotations

import pytest

from neuronetes.api.models import PoolReference, QueueConfig, ToolBindingSpec
from neuronetes_operator.toolbindings import binding_status

pytestmark = pytest.mark.unit


def conditions(status: dict[str, object]) -> dict[str, tuple[str, str]]:
    return {cd["type"]: (cd["status"], cd["reason"]) for cd in status["conditions"]}  # type: ignore[attr-defined]


def test_binding_without_pool_ref_is_pending() -> None:
    spec = ToolBindingSpec(queue_config=QueueConfig(autoscale_on_lag=True, max_lag_threshold=100))
    st = binding_status(spec, False, 1)
    assert st["phase"] == "Pending"
    assert conditions(st) == {"Bound": ("False", "NoPoolRef"), "LagScaling": ("True", "PolicyController")}


def test_binding_to_an_existing_pool_is_active() -> None:
    st = binding_status(ToolBindingSpec(pool_ref=PoolReference(name="rag-pool")), True, 2)
    assert st["phase"] == "Active" and conditions(st)["Bound"] == ("True", "PoolFound")
    assert conditions(st)["LagScaling"] == ("False", "Disabled")


def test_binding_to_a_missing_pool_says_so() -> None:
    st = binding_status(ToolBindingSpec(pool_ref=PoolReference(name="nope")), False, 1)
    assert st["phase"] == "Pending" and conditions(st)["Bound"] == ("False", "PoolNotFound")
