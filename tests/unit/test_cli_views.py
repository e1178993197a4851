"""What the cluster commands compute from API objects: GPU use and fragmentation (`top`, `status`),
the trace of `simulate --from-cluster`, and `explain`'s reading of the extender's Event notes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from extender_support import node_objects
from pod_builder import container, manifest

from neuronetes import contracts as c
from neuronetes.cli import explain as explain_cli
from neuronetes.cli.explain import ASSIGNED, parse_placement, parse_rejections
from neuronetes.cli.views import cluster_views
from neuronetes.sim.cluster_trace import node_rows, pod_rows, write_trace
from neuronetes.sim.trace import load_nodes, load_pods
from neuronetes_extender.events import rejections_note
from neuronetes_extender.results import Explanation

pytestmark = pytest.mark.unit


def gpunode(
    name: str, count: int, *, cordoned: tuple[int, ...] = (), offline: tuple[int, ...] = ()
) -> dict[str, Any]:
    uuids = [c.simulated_gpu_uuid(name, k) for k in range(count)]
    return {
        "metadata": {
            "name": name,
            "annotations": {f"{c.GROUP}/offline-gpus": ",".join(uuids[k] for k in offline)},
        },
        "spec": {"cordonedGPUs": [uuids[k] for k in cordoned]},
        "status": {
            "model": "A100-SXM4-40GB",
            "gpuCount": count,
            "conditions": [{"type": "Ready", "status": "True"}],
            "gpus": [
                {"index": k, "uuid": u, "model": "A100-SXM4-40GB", "memoryMiB": 40960, "health": "Available"}
                for k, u in enumerate(uuids)
            ],
        },
    }


def placed(
    pod: dict[str, Any], node: str, gpus: list[dict[str, Any]], phase: str = "Running"
) -> dict[str, Any]:
    assignment = {
        "version": 1,
        "node": node,
        "containers": {"main": {"gpus": gpus, "priority": 0, "qos": "Guaranteed"}},
    }
    pod["metadata"]["annotations"] = {c.ANNOTATION_ASSIGNED_GPUS: json.dumps(assignment)}
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": phase}
    return pod


def gpu(node: str, k: int, memory: int, compute: int, **mig: Any) -> dict[str, Any]:
    return {
        "uuid": c.simulated_gpu_uuid(node, k),
        "index": k,
        "memoryMiB": memory,
        "computePercent": compute,
        **mig,
    }


@pytest.fixture
def world() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = node_objects({"a100-40gb-mig": 1})
    name = nodes[0]["metadata"]["name"]
    gpunodes = [gpunode(name, 8, cordoned=(5,), offline=(6,))]
    pods = [
        placed(
            manifest("whole", {c.RESOURCE_GPU: 2}), name, [gpu(name, 0, 40960, 100), gpu(name, 1, 40960, 100)]
        ),
        placed(
            manifest("slice", {c.RESOURCE_GPU_MEMORY: 8192, c.RESOURCE_GPU_COMPUTE: 25}),
            name,
            [gpu(name, 2, 8192, 25)],
        ),
        placed(
            manifest("mig", {c.mig_resource_name("3g.20gb"): 1}),
            name,
            [gpu(name, 3, 20096, 100, migProfile="3g.20gb", migStart=4)],
        ),
        placed(manifest("done", {c.RESOURCE_GPU: 1}), name, [gpu(name, 4, 40960, 100)], phase="Succeeded"),
        manifest("pending", {c.RESOURCE_GPU: 1}, node_selector={c.LABEL_GPU_TYPE: "A100"}),
        manifest("cpu-only"),
        manifest("invalid", {c.RESOURCE_GPU: 1, c.RESOURCE_GPU_COMPUTE: 10}),
    ]
    return nodes, gpunodes, pods


def test_gpu_use_counts_whole_slice_and_mig_and_skips_finished_pods(world: Any) -> None:
    nodes, gpunodes, pods = world
    [view] = cluster_views(gpunodes, nodes, pods)
    by_index = {g.index: g for g in view.gpus}
    assert [by_index[k].milli for k in range(5)] == [1000, 1000, 250, 428, 0]  # `done` has finished
    assert by_index[0].users == ["default/whole"] and by_index[2].memory_used_mib == 8192
    assert by_index[5].cordoned and by_index[5].free_milli == 0  # drained: nothing new goes there
    assert by_index[6].offline and by_index[6].free_milli == 0
    assert view.allocated_milli == 2678 and view.free_milli == 750 + 572 + 1000 + 1000
    assert 0 <= view.fragmentation_milli <= view.free_milli
    assert view.document()["gpuList"][3]["allocatedMilli"] == 428


def test_an_unhealthy_gpu_has_nothing_free_and_no_gpu_pod_means_no_fragmentation() -> None:
    nodes = node_objects({"t4x4-pcie": 1})
    name = nodes[0]["metadata"]["name"]
    node = gpunode(name, 4)
    node["status"]["gpus"][1]["health"] = "Unhealthy"
    [view] = cluster_views([node], nodes, [manifest("cpu-only")])
    assert [g.free_milli for g in view.gpus] == [1000, 0, 1000, 1000]
    assert view.free_milli == 3000 and view.fragmentation_milli == 0  # docs/cli.md, "top"


def test_the_trace_takes_a_nodes_gpus_and_model_from_the_gpunode_else_its_labels_else_capacity() -> None:
    labelled, by_capacity, cpu_only = node_objects({"t4x4-pcie": 2, "cpu-only": 1})
    del labelled["metadata"]["labels"][c.LABEL_GPU_TYPE]  # no gpu-type label: the GPUNode's model
    del by_capacity["metadata"]["labels"][c.LABEL_GPU_COUNT]  # no count label: the capacity's count
    published = gpunode(labelled["metadata"]["name"], 3)  # the agent's count wins over the label's 4
    rows = {r["sn"]: r for r in node_rows([labelled, by_capacity, cpu_only], [published])}
    assert set(rows) == {labelled["metadata"]["name"], by_capacity["metadata"]["name"]}
    assert (rows[labelled["metadata"]["name"]]["gpu"], rows[labelled["metadata"]["name"]]["model"]) == (
        "3",
        "A100-SXM4-40GB",
    )
    assert (rows[by_capacity["metadata"]["name"]]["gpu"], rows[by_capacity["metadata"]["name"]]["model"]) == (
        "4",
        "T4",
    )


def test_the_cluster_trace_round_trips_through_the_simulators_reader(world: Any, tmp_path: Path) -> None:
    nodes, gpunodes, pods = world
    node_csv, pod_csv = write_trace(tmp_path, node_rows(nodes, gpunodes), pod_rows(pods))
    [node] = load_nodes(node_csv)
    assert len(node.gpus) == 8 and node.gpu_model == "A100" and node.cpu_milli > 0
    loaded = {p.name: p for p in load_pods(pod_csv)}
    assert set(loaded) == {"default/whole", "default/slice", "default/mig", "default/pending"}
    assert (loaded["default/whole"].gpus, loaded["default/whole"].gpu_milli) == (2, 1000)
    assert (loaded["default/slice"].gpus, loaded["default/slice"].gpu_milli) == (1, 250)
    assert (loaded["default/mig"].gpus, loaded["default/mig"].gpu_milli) == (1, 428)
    assert loaded["default/pending"].gpu_models == ("A100",)


def test_a_pods_trace_row_is_its_effective_request_and_pods_being_deleted_are_left_out() -> None:
    setup = container("setup")
    setup["resources"]["requests"] = {"cpu": "4", "memory": "8Gi"}  # the init step asks for more
    # a sidecar started first runs beside the init step and beside main: its ask adds to both
    sidecar = container("proxy", restartPolicy="Always")
    staged = manifest("staged", {c.RESOURCE_GPU: 1}, init=[sidecar, setup])
    staged["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    going = manifest("going", {c.RESOURCE_GPU: 1})
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    [row] = pod_rows([staged, going])
    assert (row["name"], row["cpu_milli"], row["memory_mib"]) == ("default/staged", "4100", "8320")
    assert (row["pod_phase"], row["creation_time"]) == ("Pending", "1767225600")


def test_nodes_without_gpus_are_left_out_of_the_trace() -> None:
    assert node_rows(node_objects({"cpu-only": 2}), []) == []


def test_explain_reads_the_extenders_notes_back() -> None:
    note = Explanation(
        "n1", (0, 1), ("GPU-a", "GPU-b"), "one nvlink group", (("topology", 0.25), ("frag", -1.5))
    ).text()
    assert parse_placement(note) == {
        "node": "n1",
        "gpus": "0,1",
        "why": "one nvlink group",
        "scoreTerms": {"topology": "+0.25", "frag": "-1.5"},
    }
    assert parse_placement("something else") == {"note": "something else"}
    reasons = {f"n{k}": "insufficient gpus" for k in range(7)} | {"m": "gpu unhealthy"}
    assert parse_rejections(rejections_note(reasons)) == [
        {"reason": "insufficient gpus", "nodes": ["n0", "n1", "n2", "n3", "n4"], "more": 2},
        {"reason": "gpu unhealthy", "nodes": ["m"], "more": 0},
    ]


def test_the_placement_note_docs_cli_shows_is_what_the_extender_writes() -> None:
    note = Explanation(
        "dgx-1",
        (0, 1),
        ("GPU-a", "GPU-b"),
        "one nvlink group (nvlink group 0)",
        (("topology", 0.0765),),
        "dgx-2",
        0.0765,
    ).text()
    assert note == (
        "node dgx-1, gpus 0,1 (one nvlink group (nvlink group 0)); vs runner-up dgx-2 (margin +0.0765): "
        "topology +0.0765"
    )


def test_explain_reads_the_runner_up_the_margin_and_the_terms_that_differ() -> None:
    base = Explanation("n1", (0, 1), ("GPU-a", "GPU-b"), "one nvlink group (nvlink group 0)")
    scored = replace(
        base, terms=(("topology", 0.36), ("cost", -0.01)), runner_up="n2", margin=0.35, more_terms=1
    )
    assert parse_placement(scored.text()) == {
        "node": "n1",
        "gpus": "0,1",
        "why": "one nvlink group (nvlink group 0)",
        "runnerUp": "n2",
        "margin": "+0.35",
        "scoreTerms": {"topology": "+0.36", "cost": "-0.01"},
        "moreTerms": 1,
    }
    tie = parse_placement(replace(base, runner_up="n2", margin=0.0).text())
    assert (tie["runnerUp"], tie["margin"], tie["scoreTerms"]) == ("n2", "+0", {})
    unscored = parse_placement(replace(base, runner_up="n2").text())
    assert (unscored["runnerUp"], unscored["margin"]) == ("n2", None)
    alone = parse_placement(replace(base, alone="no other candidate node fits").text())
    assert (alone["runnerUp"], alone["noRunnerUp"]) == (None, "no other candidate node fits")


def _table_rows(out: str) -> dict[str, str]:
    """`explain`'s two-column table: first cell -> second cell."""
    cells = (line.split("  ", 1) for line in out.splitlines())
    return {row[0].strip(): row[1].strip() for row in cells if len(row) == 2}


def _fake_cluster(pod: dict[str, Any], note: str) -> type:
    class FakeCluster:
        def __init__(self, kubeconfig: str | None, fallback: str = "") -> None:
            pass

        def pod(self, namespace: str, name: str) -> dict[str, Any]:
            return pod

        def events_about(self, kind: str, namespace: str, name: str) -> list[dict[str, Any]]:
            return [{"reason": ASSIGNED, "message": note, "involvedObject": {"uid": "u-1"}}]

    return FakeCluster


def test_explain_prints_the_runner_up_the_margin_and_the_terms_that_differ(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    note = Explanation(
        "n1", (0,), ("GPU-a",), "tightest fit", (("topology", 0.36), ("cost", -0.01)), "n2", 0.35, 2
    ).text()
    pod = placed(manifest("p", {c.RESOURCE_GPU: 1}, namespace="team"), "n1", [])
    pod["metadata"]["uid"] = "u-1"
    monkeypatch.setattr(explain_cli, "Cluster", _fake_cluster(pod, note))
    explain_cli.explain.main(["team/p"], standalone_mode=False)
    rows = _table_rows(capsys.readouterr().out)
    assert rows["runner-up"] == "n2"
    assert rows["margin"].startswith("+0.35")
    assert rows["score term topology"] == "+0.36 vs n2" and rows["score term cost"] == "-0.01 vs n2"
    assert rows["score terms not listed"] == "2 smaller differences"
    explain_cli.explain.main(["team/p", "-o", "json"], standalone_mode=False)
    doc = json.loads(capsys.readouterr().out)
    assert doc["placement"]["runnerUp"] == "n2" and doc["placement"]["scoreTerms"] == {
        "topology": "+0.36",
        "cost": "-0.01",
    }
    alone = Explanation("n1", (0,), ("GPU-a",), "tightest fit", alone="no other candidate node fits")
    monkeypatch.setattr(explain_cli, "Cluster", _fake_cluster(pod, alone.text()))
    explain_cli.explain.main(["team/p"], standalone_mode=False)
    rows = _table_rows(capsys.readouterr().out)
    assert rows["runner-up"] == "none: no other candidate node fits" and "margin" not in rows
