"""The hot paths: a pod's record reused across status-only versions, the hold book's expiry order,
the verbs' direct ASGI path."""

from __future__ import annotations

import copy
import json
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from extender_support import FakeApi, cpu_pod, node_objects, synced_cache
from pod_builder import manifest, served

from neuronetes import contracts as c
from neuronetes.model import PodRequest
from neuronetes_extender.app import create_app
from neuronetes_extender.holds import HoldBook
from neuronetes_extender.pods import PodInfo
from neuronetes_extender.results import Hold
from neuronetes_extender.service import ExtenderService
from neuronetes_extender.store import ClusterStore
from neuronetes_extender.wire import Pod

pytestmark = pytest.mark.unit

JSON_HEADERS = {"content-type": "application/json"}


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


# ---- the hold book's expiry order ----------------------------------------------------------------


def _hold(alloc_id: str, expires_at: float) -> Hold:
    return Hold(alloc_id, f"pod-{alloc_id}", "n1", PodRequest(name=alloc_id), None, (), expires_at)


def test_due_holds_come_soonest_first_and_follow_renewals_and_releases() -> None:
    book = HoldBook()
    for alloc_id, at in (("a", 30.0), ("b", 10.0), ("c", 20.0), ("d", 99.0)):
        book.put(_hold(alloc_id, at))
    book.renew("b", 50.0)  # renewed past now: not due
    book.forget("c")  # released: not due
    book.put(_hold("a", 25.0))  # re-put with another expiry: due once, at the new one
    assert [h.alloc_id for h in book.due(40.0)] == ["a"]
    assert [h.alloc_id for h in book.due(40.0)] == ["a"]  # still held: due again
    book.forget("a")
    assert [(h.alloc_id, h.expires_at) for h in book.due(60.0)] == [("b", 50.0)]
    for k in range(500):  # many renewals: the expiry heap stays bounded
        book.renew("d", 100.0 + k)
    assert len(book._expiries) <= 2 * len(book) + 64
    assert [h.alloc_id for h in book.due(1000.0)] == ["b", "d"]


def test_the_watch_report_of_our_binding_reuses_the_bound_record() -> None:
    first = served(manifest("p", {c.RESOURCE_GPU: 2}), resource_version="10")
    pending = PodInfo.from_pod(_pod(first))
    bound = pending.bound_to("n7", None, {"example.com/written-at-bind": "1"})
    reported = copy.deepcopy(first)  # what the API server makes of the Binding
    reported["metadata"]["resourceVersion"] = "12"
    reported["metadata"].setdefault("annotations", {})["example.com/written-at-bind"] = "1"
    reported["spec"]["nodeName"] = "n7"
    reported["metadata"]["labels"]["topology.kubernetes.io/zone"] = "z1"  # copied from the node
    again = PodInfo.from_pod(_pod(reported), bound)
    assert again.gpu is pending.gpu  # nothing read again
    assert (again.node, again.resource_version) == ("n7", "12")
    assert again == PodInfo.from_pod(_pod(reported))
    reported["spec"]["nodeName"] = "elsewhere"  # not what we bound: read again
    assert PodInfo.from_pod(_pod(reported), bound).node == "elsewhere"


def test_a_bind_in_flight_is_expected_until_it_settles_or_the_pod_is_reported_bound() -> None:
    store = ClusterStore(lambda: 0.0)
    pending = PodInfo.from_pod(_pod(served(manifest("p", {c.RESOURCE_GPU: 1}))))
    store.put_pod(pending)
    expected = pending.bound_to("n1", None, {"example.com/a": "1"})
    store.expect_bound(expected)
    assert store.previous(pending.id) is expected
    store.put_pod(expected)  # the watch reported it bound
    assert store.previous(pending.id) is store.pods[pending.id]
    store.expect_bound(expected)
    store.bind_settled(pending.id)  # the Binding's answer read (or it failed)
    assert store.previous(pending.id) is store.pods[pending.id]
    store.expect_bound(expected)
    store.pop_pod(pending.id)  # deleted meanwhile
    assert store.previous(pending.id) is None


# ---- the verbs' direct ASGI path ---------------------------------------------------------------


def _call(app: Any, method: str, path: str, body: bytes, headers: dict[str, str], root: str = "") -> Any:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, root_path=root)
        async with httpx.AsyncClient(transport=transport, base_url="http://extender") as client:
            return await client.request(method, root + path, content=body, headers=headers)

    return anyio.run(go)


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (json.dumps({"Pod": cpu_pod("c"), "NodeNames": ["n-0", "n-1"]}).encode(), JSON_HEADERS),
        (b"{", JSON_HEADERS),
        (b"{}", {"content-type": "text/plain"}),
    ],
    ids=["answer", "malformed", "not json"],
)
def test_the_direct_path_and_the_fastapi_route_answer_alike(body: bytes, headers: dict[str, str]) -> None:
    cache = synced_cache(node_objects({"dgx-a100-80gb": 2}))
    app = create_app(ExtenderService(cache, FakeApi(cache=cache)))
    direct = _call(app, "POST", "/filter", body, headers)
    # Mounted under a prefix, the path is not the verbs' table's: FastAPI routes it.
    routed = _call(app, "POST", "/filter", body, headers, root="/under")
    assert (direct.status_code, direct.json()) == (routed.status_code, routed.json())
    assert direct.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert _call(app, "GET", "/filter", b"", {}).status_code == 405  # other methods: FastAPI's
