"""Node prices (`neuronetes.pricing`): the label, the price table and its capacity types, unknown
prices; the table's ConfigMap as `neuronetes.kube.pricetable` applies it."""

from __future__ import annotations

from typing import Any

import pytest

from neuronetes import contracts as c
from neuronetes.kube.pricetable import PriceTableWatch, parse_price_table_ref
from neuronetes.nodes import NodeSpecError, node_spec_from_fields
from neuronetes.pricing import (
    CAPACITY_LABELS,
    PRICE_TABLE_KEY,
    PriceError,
    capacity_type,
    node_price,
    parse_price_table,
    price_of,
)

pytestmark = pytest.mark.unit

TABLE = parse_price_table(
    """
p4d.24xlarge:
  on-demand: 32.77
  spot: 13.11
a2-ultragpu-8g:
  on-demand: 40.22
  spot: 12.06
Standard_ND96asr_v4:
  on-demand: 27.2
"""
)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({c.LABEL_SPOT: "true"}, "spot"),
        ({c.LABEL_SPOT: "false"}, "on-demand"),
        ({"karpenter.sh/capacity-type": "spot"}, "spot"),
        ({"karpenter.sh/capacity-type": "on-demand"}, "on-demand"),
        ({"karpenter.sh/capacity-type": "reserved"}, "reserved"),
        ({"eks.amazonaws.com/capacityType": "SPOT"}, "spot"),
        ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, "on-demand"),
        ({"eks.amazonaws.com/capacityType": "CAPACITY_BLOCK"}, "reserved"),
        ({"cloud.google.com/gke-spot": "true"}, "spot"),
        ({"cloud.google.com/gke-preemptible": "true"}, "spot"),
        ({"cloud.google.com/gke-nodepool": "gpu"}, "on-demand"),
        ({"kubernetes.azure.com/scalesetpriority": "spot"}, "spot"),
        ({"kubernetes.azure.com/agentpool": "gpu"}, "on-demand"),
        ({"kubernetes.azure.com/agentpool": "gpu", "kubernetes.azure.com/scalesetpriority": "spot"}, "spot"),
        ({"karpenter.sh/capacity-type": "weird"}, None),
        ({}, None),
    ],
)
def test_capacity_type_from_each_providers_label(labels: dict[str, str], expected: str | None) -> None:
    assert capacity_type(labels) == expected


def test_our_spot_label_comes_first_and_every_capacity_label_is_listed() -> None:
    labels = {c.LABEL_SPOT: "false", "karpenter.sh/capacity-type": "spot"}
    assert capacity_type(labels) == "on-demand"
    assert [label for label, _ in CAPACITY_LABELS][:2] == [c.LABEL_SPOT, "karpenter.sh/capacity-type"]


def test_the_label_wins_then_the_table_by_instance_and_capacity_type_else_unknown() -> None:
    it = "node.kubernetes.io/instance-type"
    labelled = node_price({c.LABEL_PRICE_PER_HOUR: "3.5", it: "p4d.24xlarge"}, TABLE)
    assert (labelled.per_hour, labelled.source) == (3.5, "label")
    spot = node_price({it: "p4d.24xlarge", "karpenter.sh/capacity-type": "spot"}, TABLE)
    assert (spot.per_hour, spot.source, spot.capacity) == (13.11, "table", "spot")
    gke = node_price({it: "a2-ultragpu-8g", "cloud.google.com/gke-spot": "true"}, TABLE)
    assert gke.per_hour == 12.06
    beta = node_price({"beta.kubernetes.io/instance-type": "Standard_ND96asr_v4"}, TABLE)
    assert beta.per_hour == 27.2
    # No capacity label: the highest price the table gives the instance type (never below the cost).
    assert price_of({it: "p4d.24xlarge"}, TABLE) == 32.77
    # A capacity type the table has no price for, an instance type it does not list, no instance
    # type: unknown, never 0.
    assert (
        price_of({it: "Standard_ND96asr_v4", "kubernetes.azure.com/scalesetpriority": "spot"}, TABLE) is None
    )
    assert node_price({it: "g5.xlarge"}, TABLE).source == "unknown"
    assert price_of({}, TABLE) is None


def test_a_malformed_price_label_is_an_error_for_the_node_and_unknown_for_a_cost() -> None:
    bad = {c.LABEL_PRICE_PER_HOUR: "cheap"}
    with pytest.raises(PriceError, match="price-per-hour"):
        node_price(bad)
    assert price_of(bad) is None
    with pytest.raises(NodeSpecError, match="'cheap' is not a price"):
        node_spec_from_fields("n", bad, {}, unschedulable=False)
    assert (
        node_spec_from_fields(
            "n", {"node.kubernetes.io/instance-type": "p4d.24xlarge"}, {}, unschedulable=False, prices=TABLE
        ).price_per_hour
        == 32.77
    )
    assert node_spec_from_fields("n", {}, {}, unschedulable=False).price_per_hour is None


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("p4d.24xlarge: {on-demand: -1}", "entry p4d.24xlarge/on-demand: -1 is not a price"),
        ("p4d.24xlarge: {on-demand: abc}", "entry p4d.24xlarge/on-demand: 'abc' is not a price"),
        ("p4d.24xlarge: {on-demand: .inf}", "entry p4d.24xlarge/on-demand: inf is not a price"),
        ("p4d.24xlarge: {on-demand: true}", "entry p4d.24xlarge/on-demand: True is not a price"),
        ("p4d.24xlarge: {preemptible: 1}", "entry p4d.24xlarge/preemptible: unknown capacity type"),
        ("p4d.24xlarge: 3.2", "entry p4d.24xlarge: expected capacity types"),
        ("- p4d.24xlarge", "expected a mapping of instance type to prices, got list"),
        ("p4d: [", "not YAML"),
    ],
)
def test_a_bad_table_is_one_error_naming_the_entry(text: str, names: str) -> None:
    with pytest.raises(PriceError) as err:
        parse_price_table(text, source="ConfigMap x/y")
    assert str(err.value).startswith("ConfigMap x/y: ") and names in str(err.value)
    assert "\n" not in str(err.value)


def test_empty_tables_and_their_highest_price() -> None:
    assert len(parse_price_table("")) == 0 and parse_price_table("").highest is None
    assert len(TABLE) == 5 and TABLE.highest == 40.22


def configmap(text: str | None) -> dict[str, Any]:
    return {
        "metadata": {"name": "neuronetes-price-table", "namespace": "ops", "uid": "u1"},
        "data": {} if text is None else {PRICE_TABLE_KEY: text},
    }


class _NoApi:
    """The watch's informer is never started here: `apply` is what its hooks call."""

    def get(self, *_: Any, **__: Any) -> bytes:
        raise AssertionError("not listed in this test")

    def watch(self, *_: Any, **__: Any) -> Any:
        raise AssertionError("not watched in this test")


def test_the_watch_applies_changes_keeps_the_last_good_table_and_says_what_is_wrong_once() -> None:
    tables: list[Any] = []
    errors: list[tuple[str, str]] = []
    watch = PriceTableWatch(
        _NoApi(),
        "ops",
        on_change=tables.append,
        on_invalid=lambda cm, message: errors.append((cm["metadata"]["name"], message)),
    )
    watch.apply(configmap("g5.xlarge: {on-demand: 1.0}"))
    assert watch.table.lookup("g5.xlarge", "on-demand") == 1.0 and watch.version == 1
    for _ in range(2):  # the same bad content, seen twice (a relist), is said once
        watch.apply(configmap("g5.xlarge: {on-demand: lots}"))
    assert watch.table.lookup("g5.xlarge", "on-demand") == 1.0 and watch.version == 1
    assert errors == [
        (
            "neuronetes-price-table",
            "ConfigMap ops/neuronetes-price-table key prices.yaml: entry g5.xlarge/on-demand: "
            "'lots' is not a price (a number >= 0, per hour)",
        )
    ]
    invalid_table_error = watch.error
    assert invalid_table_error is not None
    watch.apply(configmap("g5.xlarge: {on-demand: 1.2}"))
    assert watch.table.lookup("g5.xlarge", "on-demand") == 1.2 and watch.error is None
    watch.apply(None)  # deleted: no table
    assert len(watch.table) == 0 and len(tables) == 3


def test_price_table_reference() -> None:
    assert parse_price_table_ref("neuronetes-system/neuronetes-price-table") == (
        "neuronetes-system",
        "neuronetes-price-table",
    )
    for bad in ("neuronetes-price-table", "a/b/c", "A/b", "/b"):
        with pytest.raises(ValueError, match="expected NAMESPACE/NAME"):
            parse_price_table_ref(bad)
