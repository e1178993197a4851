"""The pod webhook and GPUSlices: a pod naming a slice gets exactly the slice's share, or a refusal
naming the annotation or the resources (operator/neuronetes_operator/slice_admission.py, docs/gpuslice.md)."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest
from webhook_cases import gpu_pod

from neuronetes import contracts as c
from neuronetes_operator.slice_admission import SliceReadError, review_slice_pod, slice_share
from neuronetes_operator.webhook import admission_response

pytestmark = pytest.mark.unit

SLICE: dict[str, Any] = {
    "apiVersion": c.API_VERSION,
    "kind": "GPUSlice",
    "metadata": {"name": "chat", "namespace": "default"},
    "spec": {"memory": "6Gi", "computePercent": 60, "qosClass": "Guaranteed"},
}


MIG_SLICE: dict[str, Any] = {
    **SLICE,
    "spec": {**SLICE["spec"], "computePercent": 100, "migProfile": "1g.5gb"},
}


def reader(obj: Mapping[str, Any] | None = SLICE, fail: bool = False) -> Any:
    def read(namespace: str, name: str) -> Mapping[str, Any] | None:
        if fail:
            raise SliceReadError("connection refused")
        assert namespace == "default"
        return obj if obj is not None and name == obj["metadata"]["name"] else None

    return read


def named(pod: dict[str, Any], name: str = "chat") -> dict[str, Any]:
    pod["metadata"]["annotations"] = {c.ANNOTATION_SLICE: name}
    return pod


def bare_pod() -> dict[str, Any]:
    pod = gpu_pod()
    del pod["spec"]["containers"][0]["resources"]
    return named(pod)


def review(pod: dict[str, Any], read: Any = None) -> dict[str, Any]:
    body = {"request": {"uid": "u", "operation": "CREATE", "namespace": "default", "object": pod}}
    response: dict[str, Any] = admission_response("/pods", body, slices=read or reader())["response"]
    return response


def apply_patch(pod: dict[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON patch applied as the API server would (add ops only)."""
    out = copy.deepcopy(pod)
    for op in json.loads(base64.b64decode(response["patch"])):
        assert op["op"] == "add"
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = op["value"]
    return out


@pytest.mark.parametrize(
    "resources",
    [None, {}, {"requests": {"cpu": "1"}}, {"limits": {"cpu": "1"}}],
    ids=["no-resources", "empty", "requests-only", "cpu-limit"],
)
def test_a_pod_asking_for_nothing_gets_the_slice_share(resources: dict[str, Any] | None) -> None:
    pod = bare_pod()
    if resources is not None:
        pod["spec"]["containers"][0]["resources"] = copy.deepcopy(resources)
    response = review(pod)
    assert response["allowed"], response
    patched = apply_patch(pod, response)
    limits = patched["spec"]["containers"][0]["resources"]["limits"]
    assert limits[c.RESOURCE_GPU_MEMORY] == "6144" and limits[c.RESOURCE_GPU_COMPUTE] == "60"
    assert patched["spec"]["schedulerName"] == c.SCHEDULER_NAME
    if resources and "limits" in resources:
        assert limits["cpu"] == "1"


def test_the_recorded_status_share_wins_over_the_spec() -> None:
    bound = copy.deepcopy(SLICE)
    bound["status"] = {"phase": "Bound", "memoryMiB": 5000, "computePercent": 25}
    assert slice_share(bound) == (5000, 25)
    assert slice_share(SLICE) == (6144, 60)


def test_a_pod_asking_for_exactly_the_share_is_left_as_it_is() -> None:
    pod = named(gpu_pod({c.RESOURCE_GPU_MEMORY: "6144", c.RESOURCE_GPU_COMPUTE: "60"}))
    response = review(pod)
    assert response["allowed"]
    ops = json.loads(base64.b64decode(response["patch"]))
    assert ops == [{"op": "add", "path": "/spec/schedulerName", "value": c.SCHEDULER_NAME}]


def test_a_pod_naming_a_mig_slice_gets_one_instance_of_its_profile_or_keeps_asking_for_it() -> None:
    pod = bare_pod()
    response = review(pod, reader(MIG_SLICE))
    assert response["allowed"], response
    limits = apply_patch(pod, response)["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {c.mig_resource_name("1g.5gb"): "1"}
    asking = named(gpu_pod({c.mig_resource_name("1g.5gb"): "1"}))
    assert review(asking, reader(MIG_SLICE))["allowed"]


@pytest.mark.parametrize(
    ("pod", "read", "expect"),
    [
        (
            named(gpu_pod({c.RESOURCE_GPU_MEMORY: "8192", c.RESOURCE_GPU_COMPUTE: "60"})),
            None,
            "holds 6144 MiB",
        ),
        (named(gpu_pod({c.RESOURCE_GPU: "1"})), None, "also asks for whole GPUs"),
        (named(gpu_pod({c.mig_resource_name("1g.5gb"): "1"})), None, "also asks for a MIG instance"),
        (named(gpu_pod(), "Bad Name!"), None, "is not a GPUSlice name"),
        (bare_pod(), reader(None), "does not exist in namespace default"),
        (bare_pod(), reader(fail=True), "could not be read (connection refused)"),
        (
            bare_pod(),
            reader({**SLICE, "metadata": {**SLICE["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            "is being deleted",
        ),
        (
            named(gpu_pod({c.mig_resource_name("2g.10gb"): "1"})),
            reader(MIG_SLICE),
            "a MIG 1g.5gb instance, and asks for a MIG instance of another kind or profile",
        ),
        (
            named(gpu_pod({c.RESOURCE_GPU_MEMORY: "6144", c.RESOURCE_GPU_COMPUTE: "60"})),
            reader(MIG_SLICE),
            "asks for a shared slice of another kind or profile",
        ),
    ],
    ids=[
        "other-share",
        "whole-gpus",
        "mig",
        "bad-name",
        "missing",
        "unreadable",
        "deleting",
        "mig-slice-other-profile",
        "mig-slice-shared",
    ],
)
def test_a_pod_is_refused_naming_the_annotation(pod: dict[str, Any], read: Any, expect: str) -> None:
    response = review(pod, read)
    assert not response["allowed"]
    message = response["status"]["message"]
    assert message.startswith(f"metadata.annotations[{c.ANNOTATION_SLICE}]") and expect in message


def test_without_api_credentials_slice_pods_are_refused_and_others_untouched() -> None:
    verdict = review_slice_pod(bare_pod(), "default", None)
    assert "cannot read GPUSlices" in verdict.refusals[0]
    body = {"request": {"uid": "u", "operation": "CREATE", "namespace": "default", "object": gpu_pod()}}
    assert admission_response("/pods", body)["response"]["allowed"]
