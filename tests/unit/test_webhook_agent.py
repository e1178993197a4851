"""The webhook's routes for the node agent: it evicts, and records Events about, only pods bound to
the node its credentials name, and an allowed Eviction is pinned to the pod's UID
(operator/neuronetes_operator/agent_admission.py, docs/rbac.md)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest

from neuronetes_operator.agent_admission import (
    NODE_NAME_EXTRA,
    PodReadError,
    review_eviction,
    review_pod_event,
)
from neuronetes_operator.launch import AGENT_USERNAME
from neuronetes_operator.webhook import admission_response

pytestmark = pytest.mark.unit

PODS: dict[tuple[str, str], dict[str, Any]] = {
    ("team", "on-a"): {"metadata": {"name": "on-a", "uid": "uid-a"}, "spec": {"nodeName": "node-a"}},
    ("team", "on-b"): {"metadata": {"name": "on-b", "uid": "uid-b"}, "spec": {"nodeName": "node-b"}},
    ("team", "pending"): {"metadata": {"name": "pending", "uid": "uid-p"}, "spec": {}},
}


def read(namespace: str, name: str) -> Mapping[str, Any] | None:
    return PODS.get((namespace, name))


def request(name: str, node: str | None = "node-a", **eviction: Any) -> dict[str, Any]:
    user: dict[str, Any] = {"username": AGENT_USERNAME}
    if node is not None:
        user["extra"] = {NODE_NAME_EXTRA: [node], "authentication.kubernetes.io/pod-name": ["agent-x"]}
    return {
        "uid": "u",
        "operation": "CREATE",
        "namespace": "team",
        "name": name,
        "subResource": "eviction",
        "userInfo": user,
        "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}, **eviction},
    }


def test_the_agent_evicts_a_pod_of_its_node_pinned_to_the_pods_uid() -> None:
    refusals, patch = review_eviction(request("on-a"), read)
    assert refusals == []
    assert patch == [{"op": "add", "path": "/deleteOptions", "value": {"preconditions": {"uid": "uid-a"}}}]


@pytest.mark.parametrize(
    ("eviction", "patch"),
    [
        ({"deleteOptions": {"gracePeriodSeconds": 5}},
         [{"op": "add", "path": "/deleteOptions/preconditions", "value": {"uid": "uid-a"}}]),
        ({"deleteOptions": {"preconditions": {"resourceVersion": "7"}}},
         [{"op": "add", "path": "/deleteOptions/preconditions/uid", "value": "uid-a"}]),
        ({"deleteOptions": {"preconditions": {"uid": "uid-a"}}}, []),
    ],
)  # fmt: skip
def test_the_uid_is_added_to_the_delete_options_the_agent_sent(
    eviction: dict[str, Any], patch: list[dict[str, Any]]
) -> None:
    assert review_eviction(request("on-a", **eviction), read) == ([], patch)


@pytest.mark.parametrize(
    ("name", "node", "eviction", "message"),
    [
        ("on-b", "node-a", {}, f"the NeuroNetes agent of node node-a ({AGENT_USERNAME}) may evict "
         "only pods bound to node node-a; pod team/on-b is bound to node node-b"),
        ("pending", "node-a", {}, "may evict only pods bound to node node-a; "
         "pod team/pending is not bound to a node"),
        ("gone", "node-a", {}, "pod team/gone does not exist"),
        ("on-a", None, {}, f"{AGENT_USERNAME} may evict only pods bound to the node its credentials "
         "name, and these name none"),
        ("on-a", "node-a", {"deleteOptions": {"preconditions": {"uid": "other"}}},
         "the Eviction's precondition names UID other, not the pod's (uid-a)"),
    ],
)  # fmt: skip
def test_every_other_eviction_is_refused_naming_the_node(
    name: str, node: str | None, eviction: dict[str, Any], message: str
) -> None:
    refusals, patch = review_eviction(request(name, node, **eviction), read)
    assert patch == [] and len(refusals) == 1 and message in refusals[0]


def test_an_unreadable_pod_or_no_reader_is_a_refusal() -> None:
    def broken(namespace: str, name: str) -> Mapping[str, Any] | None:
        raise PodReadError("connection refused")

    (refusal,), _ = review_eviction(request("on-a"), broken)
    assert "pod team/on-a could not be read (connection refused)" in refusal and "node-a" in refusal
    (refusal,), _ = review_eviction(request("on-a"), None)
    assert "cannot read pods" in refusal and "may not evict it" in refusal


def test_a_node_extra_of_several_values_names_no_node() -> None:
    req = request("on-a")
    req["userInfo"]["extra"][NODE_NAME_EXTRA] = ["node-a", "node-b"]
    (refusal,), _ = review_eviction(req, read)
    assert "these name none" in refusal


def test_the_evictions_route_answers_with_the_verdict_and_the_patch() -> None:
    allowed = admission_response("/evictions", {"request": request("on-a")}, pods=read)["response"]
    assert allowed["allowed"] and allowed["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(allowed["patch"]))[0]["value"] == {"preconditions": {"uid": "uid-a"}}
    refused = admission_response("/evictions", {"request": request("on-b")}, pods=read)["response"]
    assert not refused["allowed"] and refused["status"]["code"] == 403
    assert "bound to node node-b" in refused["status"]["message"]
    # Without a pod reader (no credentials) nothing is evicted.
    assert not admission_response("/evictions", {"request": request("on-a")})["response"]["allowed"]


def event_request(about: dict[str, Any], node: str | None = "node-a") -> dict[str, Any]:
    req = request("x", node)
    req["subResource"], req["name"] = "", ""
    req["object"] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": "team"},
        "involvedObject": about,
    }
    return req


def test_the_agent_records_events_only_about_pods_of_its_node() -> None:
    on_a = {"kind": "Pod", "namespace": "team", "name": "on-a", "uid": "uid-a"}
    assert review_pod_event(event_request(on_a), read) == []
    assert review_pod_event(event_request({**on_a, "uid": ""}), read) == []
    (refusal,) = review_pod_event(event_request({"kind": "Pod", "namespace": "team", "name": "on-b"}), read)
    assert (
        f"the NeuroNetes agent of node node-a ({AGENT_USERNAME}) may record Events about only pods" in refusal
    )
    assert "pod team/on-b is bound to node node-b" in refusal
    (refusal,) = review_pod_event(event_request({**on_a, "uid": "uid-b"}), read)
    assert "names UID uid-b, not pod team/on-a's (uid-a)" in refusal
    (refusal,) = review_pod_event(event_request(on_a, node=None), read)
    assert "these name none" in refusal
    # Events about anything else are the admission policy's.
    assert review_pod_event(event_request({"kind": "Node", "name": "node-b"}), read) == []
    response = admission_response("/events", {"request": event_request(on_a)}, pods=read)["response"]
    assert response["allowed"] and "patch" not in response
