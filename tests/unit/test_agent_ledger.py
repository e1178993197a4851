"""The node ledger the agent writes for the NRI plugin's cross-check (docs/contracts.md "The node
ledger file", docs/node-injection.md "The node ledger cross-check"): pinned first-seen
assignments in order across restarts, the plugin's own reader and cross-check
(`node-agent/nri/cmd/ledger-check`) on what the agent wrote, the agent process's wiring, and the
watch's relist reporting pods deleted meanwhile."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from handoff_support import NODE, UID_A, UID_B, Clock, QuietKube, gpus_of, ledger_doc, pod, use
from nri_tools import build_nri_tool

from neuronetes.profiles import LABEL_PROFILE, PROFILES
from neuronetes_agent.daemon.ledger import LEDGER_FILE, LedgerWriter
from neuronetes_agent.daemon.simulated import SimulatedGpus

pytestmark = pytest.mark.unit


def test_the_ledger_pins_the_first_assignment_and_keeps_order_across_restarts(tmp_path: Path) -> None:
    gpus = gpus_of()
    inventory = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE).scan()
    clock = Clock()
    ready = False
    writer = LedgerWriter(NODE, tmp_path, ready=lambda: ready, clock=clock)
    a = use(pod(UID_A, "a", [(gpus[0].uuid, 0, 81920, 100)]))
    b = use(pod(UID_B, "b", [(gpus[1].uuid, 1, 20480, 25)]))
    assert not writer.refresh({UID_A: a}, inventory)  # the pod watch has not listed yet
    assert not (tmp_path / LEDGER_FILE).exists()

    ready = True
    assert writer.refresh({UID_A: a, UID_B: b}, inventory)
    doc = ledger_doc(tmp_path)
    assert (doc["version"], doc["node"], doc["generation"]) == (1, NODE, 1)
    assert [p["uid"] for p in doc["pods"]] == [UID_A, UID_B]
    assert doc["pods"][0] == {"uid": UID_A, "namespace": "ml", "name": "a", "assignment": a.annotation}
    assert doc["gpus"][0] == {"uuid": gpus[0].uuid, "memoryMiB": gpus[0].memory_mib}
    assert (tmp_path / LEDGER_FILE).stat().st_mode & 0o777 == 0o644

    # unchanged: not rewritten until due; then rewritten with the next generation
    assert not writer.refresh({UID_A: a, UID_B: b}, inventory)
    clock.now += 11
    assert writer.refresh({UID_A: a, UID_B: b}, inventory)
    assert ledger_doc(tmp_path)["generation"] == 2

    # the annotation patched after bind: ignored, counted once
    patched = use(pod(UID_A, "a", [(gpus[2].uuid, 2, 81920, 100)]))
    writer.refresh({UID_A: patched, UID_B: b}, inventory)
    writer.refresh({UID_A: patched, UID_B: b}, inventory)
    assert writer.ignored_changes == 1
    assert ledger_doc(tmp_path)["pods"][0]["assignment"] == a.annotation

    # a restarted agent continues the order, the pinned annotation and the generation
    again = LedgerWriter(NODE, tmp_path, ready=lambda: True, clock=clock)
    assert again.refresh({UID_B: b, UID_A: patched}, inventory)
    doc = ledger_doc(tmp_path)
    assert [p["uid"] for p in doc["pods"]] == [UID_A, UID_B] and doc["generation"] == 3
    assert doc["pods"][0]["assignment"] == a.annotation

    # a pod that finished or was deleted leaves
    again.refresh({UID_B: b}, inventory)
    assert [p["uid"] for p in ledger_doc(tmp_path)["pods"]] == [UID_B]


def test_a_foreign_or_broken_ledger_file_is_not_resumed(tmp_path: Path) -> None:
    inventory = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE).scan()
    (tmp_path / LEDGER_FILE).write_text('{"version": 1, "node": "other"')
    writer = LedgerWriter(NODE, tmp_path, ready=lambda: True, clock=Clock())
    assert writer.refresh({}, inventory)
    assert ledger_doc(tmp_path)["generation"] == 1


@pytest.fixture(scope="session")
def ledger_check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nri_tool("ledger-check", tmp_path_factory.mktemp("go"))


def test_the_plugin_admits_from_the_agents_ledger_and_refuses_a_double_booking(
    tmp_path: Path, ledger_check: Path
) -> None:
    gpus = gpus_of()
    inventory = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE).scan()
    uid_c = "3c9d1e2f-1111-4222-8333-444455556666"
    pods = {
        UID_A: use(pod(UID_A, "a", [(gpus[0].uuid, 0, gpus[0].memory_mib, 100)])),
        UID_B: use(pod(UID_B, "b", [(gpus[1].uuid, 1, 40960, 50)])),
        # a later pod given GPU 0 again (a double booking) and a slice that no longer fits on GPU 1
        uid_c: use(pod(uid_c, "c", [(gpus[0].uuid, 0, 1024, 10), (gpus[1].uuid, 1, 50000, 50)])),
    }
    LedgerWriter(NODE, tmp_path, ready=lambda: True, clock=Clock()).refresh(pods, inventory)
    out = subprocess.run(
        [str(ledger_check), str(tmp_path / LEDGER_FILE), NODE, UID_A, UID_B, uid_c],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr  # the plugin's strict reader accepts what the agent wrote
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"OK node={NODE} generation=1 gpus=8 pods=3"), lines
    assert lines[1:3] == [f"admit {UID_A}", f"admit {UID_B}"]
    assert lines[3].startswith(f"refuse {uid_c}: GPU {gpus[0].uuid} is held whole by pod ml/a"), lines


def test_an_agent_for_a_real_node_hands_off_and_a_fleet_does_not(tmp_path: Path) -> None:
    from neuronetes_agent.daemon.fleet import AgentProcess, AgentSettings

    sim = SimulatedGpus(PROFILES["dgx-a100-80gb"], NODE)
    state = tmp_path / "state"
    settings = AgentSettings(
        node=NODE, state_dir=state, region_dir=state / "containers", cgroup_root=tmp_path
    )
    process = AgentProcess(None, settings)
    process.kube, process._local = QuietKube(), sim  # type: ignore[assignment]
    process._start_node(NODE, {"metadata": {"name": NODE, "uid": "node-uid"}})
    agent = process.agents[NODE]
    assert agent.ledger is not None and agent.containers is not None
    assert agent.containers.cgroup_root == tmp_path and agent.containers.regions is agent.regions
    agent.tick()
    assert not (state / LEDGER_FILE).exists()  # the pod watch has not listed the node's pods yet
    process._pods_listed.set()
    agent.tick()
    assert ledger_doc(state)["node"] == NODE
    process.stop()

    fleet = AgentProcess(None, AgentSettings(simulate_nodes="x=y"))
    fleet.kube = QuietKube()  # type: ignore[assignment]
    fleet._start_node(
        "sim-1",
        {"metadata": {"name": "sim-1", "labels": {LABEL_PROFILE: "dgx-a100-80gb"}}},
    )
    assert fleet.agents["sim-1"].ledger is None and fleet.agents["sim-1"].containers is None
    fleet.stop()


def test_a_pod_deleted_while_the_watch_was_down_is_reported_deleted_at_the_relist() -> None:
    from neuronetes_agent.daemon.kube import Informer

    lists = [
        [pod(UID_A, "a", []), pod(UID_B, "b", [])],
        [pod(UID_B, "b", [])],  # a was deleted while the watch was broken
    ]

    class ListingApi:
        def get(self, path: str, query: Any = (), *, timeout: float | None = None) -> bytes:
            return json.dumps({"metadata": {"resourceVersion": "7"}, "items": lists.pop(0)}).encode()

    class ListingKube:
        client = ListingApi()

    events: list[tuple[str, Any]] = []
    informer = Informer(ListingKube(), "/api/v1/pods", lambda k, o: events.append((k, o)))  # type: ignore[arg-type]
    informer.relist()
    informer.relist()
    assert [(k, o["metadata"]["uid"]) for k, o in events] == [
        ("SYNC", UID_A),
        ("SYNC", UID_B),
        ("SYNC", UID_B),
        ("DELETED", UID_A),
    ]
    assert events[-1][1] == {
        "metadata": {"name": "a", "namespace": "ml", "uid": UID_A},
        "spec": {"nodeName": NODE},
    }
