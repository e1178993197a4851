"""A pod's cache record is reused across versions that change only its status (the watch's hot path)."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from pod_builder import manifest, served

from neuronetes import contracts as c
from neuronetes.extender.pods import PodInfo
from neuronetes.extender.wire import Pod

pytestmark = pytest.mark.unit


def _pod(obj: dict[str, Any]) -> Pod:
    return msgspec.convert(obj, Pod)


def _versions() -> tuple[dict[str, Any], dict[str, Any]]:
    first = served(manifest("p", {c.RESOURCE_GPU: 2}, node="n1"), resource_version="10")
    later = copy.deepcopy(first)
    later["metadata"]["resourceVersion"] = "11"
    later["status"] = {"phase": "Running"}
    return first, later


def test_a_status_update_reuses_the_record_and_takes_the_new_status() -> None:
    first, later = _versions()
    old = PodInfo.from_pod(_pod(first))
    new = PodInfo.from_pod(_pod(later), old)
    assert new.gpu is old.gpu and new.gang is old.gang  # nothing read again
    assert (new.phase, new.resource_version) == ("Running", "11")
    assert new == PodInfo.from_pod(_pod(later))  # the same record a full read gives


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["metadata"].setdefault("annotations", {}).update({c.ANNOTATION_ASSIGNED_GPUS: "x"}),
        lambda p: p["metadata"]["labels"].update({"extra": "1"}),
        lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({c.RESOURCE_GPU: 4}),
        lambda p: p["metadata"].update({"uid": "0f0e0d0c-0000-4000-8000-000000000000"}),
    ],
    ids=["annotation", "label", "request", "replaced pod"],
)
def test_a_changed_spec_label_annotation_or_uid_is_read_again(change: Any) -> None:
    first, later = _versions()
    change(later)
    old = PodInfo.from_pod(_pod(first))
    assert PodInfo.from_pod(_pod(later), old) == PodInfo.from_pod(_pod(later))
