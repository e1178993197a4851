"""A GPU pod no node passes gets one `GpuFilterRejected` Event with each rejected node's reason,
at most once per 30 s per pod (kube-scheduler asks again on every retry)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from extender_support import gpu_pod, names_request, node_objects, synced_cache

from neuronetes_extender.events import EventRecorder, PodRef, rejections_note
from neuronetes_extender.service import REASON_REJECTED, REJECTED_EVERY_S, ExtenderService

pytestmark = pytest.mark.unit

NODES = node_objects({"dgx-a100-80gb": 2, "t4x4-pcie": 1})
NAMES = [n["metadata"]["name"] for n in NODES]


class _Poster:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    async def post(self, path: str, body: dict[str, Any]) -> bytes:
        self.posted.append(body)
        return b"{}"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_note_groups_nodes_by_reason_most_first_and_counts_the_rest() -> None:
    reasons = {f"n{k}": "insufficient gpus" for k in range(7)} | {"m1": "gpu unhealthy"}
    note = rejections_note(reasons)
    assert note == ("8 node(s) rejected: insufficient gpus [n0, n1, n2, n3, n4 +2 more]; gpu unhealthy [m1]")


def test_an_unschedulable_gpu_pod_records_each_nodes_reason_once_per_interval() -> None:
    poster, clock = _Poster(), _Clock()
    service = ExtenderService(synced_cache(NODES), events=EventRecorder(poster, clock=clock))
    pod = gpu_pod("too-big", 9)  # more GPUs than any node has
    for _ in range(3):  # kube-scheduler's retries
        result, outcome = service.filter(names_request(pod, NAMES))
        assert outcome == "unschedulable" and not result.node_names
        anyio.run(service.events.drain, 5.0)
    assert len(poster.posted) == 1
    clock.now += REJECTED_EVERY_S + 1
    service.filter(names_request(pod, NAMES))
    anyio.run(service.events.drain, 5.0)
    assert len(poster.posted) == 2  # the first, then one more after the interval
    event = poster.posted[0]
    assert event["reason"] == REASON_REJECTED and event["type"] == "Warning"
    assert event["regarding"]["name"] == "too-big" and event["action"] == "Filter"
    note = event["note"]
    assert note.startswith(f"{len(NAMES)} node(s) rejected: ")
    assert all(name in note for name in NAMES)


def test_a_placed_pod_records_no_rejection() -> None:
    poster = _Poster()
    service = ExtenderService(synced_cache(NODES), events=EventRecorder(poster))
    result, _ = service.filter(names_request(gpu_pod("fits", 1), NAMES))
    assert result.node_names
    anyio.run(service.events.drain, 5.0)
    assert [e for e in poster.posted if e["reason"] == REASON_REJECTED] == []


def test_the_throttle_book_is_bounded() -> None:
    clock = _Clock()
    events = EventRecorder(_Poster(), max_pending=10, clock=clock)

    for k in range(10):
        events.record(PodRef("ns", f"p{k}"), REASON_REJECTED, "x", action="Filter", every_s=30)
    anyio.run(events.drain, 5.0)
    events.record(PodRef("ns", "late"), REASON_REJECTED, "x", action="Filter", every_s=30)
    assert events.pending() == 0 and events.dropped == 1  # book full of fresh entries
    clock.now += 31
    events.record(PodRef("ns", "later"), REASON_REJECTED, "x", action="Filter", every_s=30)
    assert events.pending() == 1  # old entries forgotten, room again
