"""Data locality and the candidate limit, pure parts: the formats of an AgentPool's dataLocality
entries, the hints read from the stores' pods, and the annotations the extender reads back."""

from __future__ import annotations

import pytest

from neuronetes.assignment import ResourceRequestError, pod_gpu_request
from neuronetes.locality import (
    ANNOTATION_AVOID_NODES,
    ANNOTATION_DATA_LOCALITY_WEIGHT,
    ANNOTATION_DATA_NODES,
    ANNOTATION_DATA_ZONES,
    ANNOTATION_MAX_NODES_TO_SCORE,
    LocalityError,
    LocalityHints,
    StoreRef,
    anti_affinity_selectors,
    locality_annotations,
    locality_hints,
    parse_label_set,
    parse_store_ref,
    selector_of,
)

pytestmark = pytest.mark.unit


def test_store_names_are_kind_slash_name_or_a_bare_service() -> None:
    assert parse_store_ref("weaviate") == StoreRef("service", "weaviate")
    assert parse_store_ref("service/qdrant") == StoreRef("service", "qdrant")
    assert parse_store_ref("statefulset/milvus-0.a") == StoreRef("statefulset", "milvus-0.a")
    for bad in ("deployment/x", "Service/x", "UPPER", "x/", "", "service/-x"):
        with pytest.raises(LocalityError, match="service/<name>"):
            parse_store_ref(bad)


def test_anti_affinity_is_a_label_set_or_a_bare_workload_name() -> None:
    assert parse_label_set("app=redis,tier=cache") == {"app": "redis", "tier": "cache"}
    assert parse_label_set("example.com/role=") == {"example.com/role": ""}
    assert anti_affinity_selectors("app=redis,tier=cache") == ["app=redis,tier=cache"]
    assert anti_affinity_selectors("training-jobs") == [
        "app.kubernetes.io/name=training-jobs",
        "app.kubernetes.io/instance=training-jobs",
    ]
    for bad, why in (
        ("app=redis,", "is not key=value"),
        ("app==x", "is not key=value"),
        ("a=1,a=2", "appears twice"),
        ("app=" + "x" * 64, "is not key=value"),
        ("app in (a,b)", "is not key=value"),
    ):
        with pytest.raises(LocalityError, match=why):
            anti_affinity_selectors(bad)


def test_a_store_s_selector_in_list_syntax() -> None:
    service = {"spec": {"selector": {"app": "qdrant", "tier": "db"}}}
    assert selector_of(StoreRef("service", "q"), service) == "app=qdrant,tier=db"
    assert selector_of(StoreRef("service", "q"), {"spec": {}}) is None  # no selector: no pods
    sts = {
        "spec": {
            "selector": {
                "matchLabels": {"app": "milvus"},
                "matchExpressions": [
                    {"key": "shard", "operator": "In", "values": ["0", "1"]},
                    {"key": "canary", "operator": "DoesNotExist"},
                ],
            }
        }
    }
    assert selector_of(StoreRef("statefulset", "m"), sts) == "app=milvus,shard in (0,1),!canary"
    assert selector_of(StoreRef("statefulset", "m"), {"spec": {"selector": {}}}) is None


def _pod(node: str | None, phase: str = "Running", deleting: bool = False) -> dict[str, object]:
    return {
        "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z" if deleting else None},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_hints_name_the_nodes_most_store_pods_run_on_first_and_their_zones() -> None:
    store = [
        _pod("b"),
        _pod("a"),
        _pod("b"),
        _pod(None, "Pending"),
        _pod("c", "Failed"),
        _pod("d", deleting=True),
    ]
    avoided = [_pod("z"), _pod("y"), _pod("z", "Succeeded")]
    hints = locality_hints(store, avoided, {"a": "zone-1", "b": "zone-2", "c": "zone-3", "z": "zone-1"})
    assert hints == LocalityHints(("b", "a"), ("zone-1", "zone-2"), ("y", "z"))
    assert locality_hints([_pod("n")], [], {}) == LocalityHints(("n",), (), ())


def test_annotations_round_trip_into_the_request_the_extender_places() -> None:
    hints = LocalityHints(("n1", "n2"), ("zone-a",), ("n9",))
    annotations = locality_annotations(hints, "high", 50)
    assert annotations == {
        ANNOTATION_DATA_NODES: "n1,n2",
        ANNOTATION_DATA_ZONES: "zone-a",
        ANNOTATION_AVOID_NODES: "n9",
        ANNOTATION_DATA_LOCALITY_WEIGHT: "high",
        ANNOTATION_MAX_NODES_TO_SCORE: "50",
    }
    pod = {
        "metadata": {"name": "p", "namespace": "d", "annotations": annotations},
        "spec": {"containers": [{"name": "a", "resources": {"limits": {"neuronetes.io/gpu": "1"}}}]},
    }
    gpu = pod_gpu_request(pod)
    assert gpu is not None
    req = gpu.request
    assert (req.preferred_nodes, req.preferred_zones, req.avoid_nodes) == (("n1", "n2"), ("zone-a",), ("n9",))
    assert req.weight_multiplier("data_locality") == 2.0 and req.weight_multiplier("cost") == 1.0
    assert req.max_nodes_to_score == 50
    assert req.shape().max_nodes_to_score == 0  # the limit does not split the score cache
    # Nothing to say: no annotation at all; medium is the policy's own weight.
    assert locality_annotations(LocalityHints(), "medium", None) == {}
    medium = locality_annotations(LocalityHints(("n1",)), "medium", None)
    pod["metadata"]["annotations"] = medium  # type: ignore[index]
    gpu = pod_gpu_request(pod)
    assert gpu is not None and gpu.request.weight_scale == ()


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        (ANNOTATION_DATA_LOCALITY_WEIGHT, "extreme", "is not one of low, medium, high"),
        (ANNOTATION_MAX_NODES_TO_SCORE, "0", "is not an integer in 1..100000"),
        (ANNOTATION_MAX_NODES_TO_SCORE, "ten", "is not an integer in 1..100000"),
        (ANNOTATION_DATA_NODES, "n1,Bad Node", "is not a node or zone name"),
        (ANNOTATION_AVOID_NODES, ",".join(f"n{k}" for k in range(101)), "101 names, at most 100"),
    ],
)
def test_a_malformed_annotation_is_a_request_error_naming_it(key: str, value: str, why: str) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "d", "annotations": {key: value}},
        "spec": {"containers": [{"name": "a", "resources": {"limits": {"neuronetes.io/gpu": "1"}}}]},
    }
    with pytest.raises(ResourceRequestError, match=f"annotation {key}: .*{why}"):
        pod_gpu_request(pod)
