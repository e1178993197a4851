"""What the cluster commands compute from API objects: GPU use and fragmentation (`top`, `status`),
the trace of `simulate --from-cluster`, and `explain`'s reading of the extender's Event notes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from extender_support import node_objects
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes.cli.explain import parse_placement, parse_rejections
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
