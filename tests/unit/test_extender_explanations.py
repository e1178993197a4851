"""The placement Event says why the pod's node beat the runner-up (the candidate the filter
scored best after it): the runner-up's name, the margin and the terms the two differ on — never
those equal on every candidate — or plainly that there was no runner-up; through the extender's
filter, its cache and its bind, read back as `kubectl neuronetes explain` reads it."""

from __future__ import annotations

import copy
from typing import Any

import anyio
import msgspec
import pytest
from extender_support import FakeApi, bind_now, gpu_pod, names_request, node_objects, planned, synced_cache

from neuronetes import contracts as c
from neuronetes.cli.explain import parse_placement
from neuronetes_extender.events import EventRecorder
from neuronetes_extender.pods import PodInfo
from neuronetes_extender.service import REASON_ASSIGNED, ExtenderService
from neuronetes_extender.wire import ExtenderBindingArgs, Pod

pytestmark = pytest.mark.unit


def pcie_only(node: dict[str, Any]) -> dict[str, Any]:
    """`node` as its labels would say it without NVLink (nothing else differs)."""
    node = copy.deepcopy(node)
    node["metadata"]["labels"][c.LABEL_GPU_TOPOLOGY] = "pcie"
    return node


TWINS = node_objects({"dgx-a100-80gb": 2})
NODES = [pcie_only(TWINS[0]), TWINS[1]]  # the PCIe one first: a tie would go to it
PCIE, NVLINK = (n["metadata"]["name"] for n in NODES)


class Extender:
    """The extender's service over a synced cache of `nodes`, posting its Events to a fake API."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.cache = synced_cache(nodes)
        self.api = FakeApi(cache=self.cache)
        self.service = ExtenderService(self.cache, self.api, events=EventRecorder(self.api))

    def filter(self, pod: dict[str, Any], names: list[str]) -> str:
        """`pod` filtered among `names`: the node the extender chose (and holds the GPUs on)."""
        self.api.add(pod)
        result, _ = self.service.filter(names_request(pod, names))
        assert result.node_names is not None
        return str(result.node_names[0])

    def bind(self, pod: dict[str, Any], node: str) -> str:
        """`pod` bound to `node`: the note of its placement Event."""
        meta = pod["metadata"]
        args = ExtenderBindingArgs(
            pod_name=meta["name"], pod_namespace=meta["namespace"], pod_uid=meta["uid"], node=node
        )
        out, _ = bind_now(self.service, args)
        assert out.error == ""
        anyio.run(self.service.events.drain, 5.0)
        [note] = [
            e["note"]
            for e in self.api.events
            if e["reason"] == REASON_ASSIGNED and e["regarding"]["name"] == meta["name"]
        ]
        return str(note)


def test_nodes_that_differ_only_in_nvlink_are_told_apart_by_topology_alone() -> None:
    ext = Extender(NODES)
    pod = gpu_pod("pair", 2)
    assert ext.filter(pod, [PCIE, NVLINK]) == NVLINK
    note = ext.bind(pod, NVLINK)
    doc = parse_placement(note)
    assert doc["node"] == NVLINK and doc["runnerUp"] == PCIE, note
    # Every other term of the policy is equal on the two nodes: only topology is listed, and the
    # margin is all its own.
    assert len(ext.cache.policy.weights) > 1
    assert list(doc["scoreTerms"]) == ["topology"] and doc["moreTerms"] == 0, note
    margin = float(doc["margin"])
    assert margin > 0 and float(doc["scoreTerms"]["topology"]) == pytest.approx(margin, rel=1e-2), note
    assert f"; vs runner-up {PCIE} (margin +" in note


def test_without_another_candidate_there_is_no_runner_up_and_the_note_says_so() -> None:
    ext = Extender(NODES)
    pod = gpu_pod("alone", 2)
    # The runner-up comes from the filter's candidates: the PCIe node is known but not one of them.
    assert ext.filter(pod, [NVLINK]) == NVLINK
    note = ext.bind(pod, NVLINK)
    assert note.endswith("; no runner-up: no other candidate node fits"), note
    doc = parse_placement(note)
    assert (doc["runnerUp"], doc["scoreTerms"]) == (None, {})
    assert doc["noRunnerUp"] == "no other candidate node fits"


def test_equal_nodes_tie_on_every_term_and_none_is_listed() -> None:
    ext = Extender(TWINS)
    names = [n["metadata"]["name"] for n in TWINS]
    pod = gpu_pod("twin", 2)
    node = ext.filter(pod, names)
    note = ext.bind(pod, node)
    (other,) = set(names) - {node}
    assert note.endswith(f"; vs runner-up {other} (margin +0): no term differs (a tie the policy broke)")
    assert parse_placement(note)["scoreTerms"] == {}


def test_a_runner_up_filled_before_the_bind_is_said_to_no_longer_fit() -> None:
    ext = Extender(NODES)
    pod = gpu_pod("early", 2)
    assert ext.filter(pod, [PCIE, NVLINK]) == NVLINK
    assert ext.filter(gpu_pod("filler", 8), [PCIE]) == PCIE  # holds every GPU of the runner-up
    note = ext.bind(pod, NVLINK)
    assert note.endswith(f"; no runner-up: {PCIE}, the runner-up, no longer fits"), note


def test_a_gang_member_has_no_runner_up_of_its_own() -> None:
    ext = Extender(NODES)
    members = [gpu_pod(f"m{k}", 1) for k in range(2)]
    for pod in members:
        pod["metadata"]["labels"].update({c.LABEL_GANG: "job", c.LABEL_GANG_SIZE: "2"})
        ext.cache.upsert_pod(msgspec.convert(pod, Pod))
    node = ext.filter(members[0], [PCIE, NVLINK])
    plan = planned(ext.cache.prepare_bind(PodInfo.from_pod(msgspec.convert(members[0], Pod)).id, node))
    assert plan.explanation is not None
    assert plan.explanation.text().endswith("; no runner-up: placed with its gang as a whole")
