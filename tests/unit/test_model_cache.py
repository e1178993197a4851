"""The model cache's pure parts: the directory contract and the agent's scan of it (partial
downloads, symlinks, FIFOs, bad markers, the bound), the choice of nodes to preload, the operator's
preload plan and Job, and how a pod's annotations become the request's model-cache term."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from neuronetes import contracts as c
from neuronetes.api.models import CacheAware, LabelSelector, PodTemplate, PreloadNodes, PreloadStrategy
from neuronetes.assignment import ResourceRequestError, pod_gpu_request
from neuronetes.modelcache import MARKER, choose_preload_nodes, directory_name, selector_matches
from neuronetes_agent.daemon.modelcache import (
    MAX_MARKER_BYTES,
    SimulatedModelCache,
    parse_model_list,
    scan_model_cache,
)
from neuronetes_operator.preload import (
    FAILED_BACKOFF_S,
    UNREPORTED_S,
    PreloadJob,
    plan_preload,
    preload_job,
    read_gpunode_page,
    read_job,
)

pytestmark = pytest.mark.unit


# ---- names ---------------------------------------------------------------------------------------


def test_directory_names() -> None:
    assert directory_name("llama-8b") == "llama-8b"
    assert directory_name("meta-llama/Llama-3.1-8B") == "meta-llama--Llama-3.1-8B"
    for bad in ("", ".", "..", ".hidden", "a\nb", "a\x00b", "x" * 254):
        assert directory_name(bad) is None, bad


def test_label_selector() -> None:
    labels = {"pool": "a", "zone": "z1"}
    assert selector_matches(None, labels) and selector_matches({}, labels)
    assert selector_matches({"matchLabels": {"pool": "a"}}, labels)
    assert not selector_matches({"matchLabels": {"pool": "b"}}, labels)
    expr = {"key": "zone", "operator": "In", "values": ["z1", "z2"]}
    assert selector_matches({"matchLabels": {"pool": "a"}, "matchExpressions": [expr]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, labels)
    assert selector_matches({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, labels)


# ---- choosing nodes ------------------------------------------------------------------------------


def test_choice_tops_up_to_the_wanted_count_and_never_beyond() -> None:
    nodes = [f"n{i}" for i in range(6)]
    choice = choose_preload_nodes(nodes, {"n3"}, {"n1"}, set(), 3, max_start=8)
    assert choice.cached == ("n3",) and choice.start == ("n0",) and choice.missing == 0
    # Enough cached or under way: nothing started, nothing cancelled.
    assert choose_preload_nodes(nodes, {"n0", "n1"}, {"n2", "n3"}, set(), 2, max_start=8).start == ()
    # A recently failed node is not tried again; too few left shows as missing.
    choice = choose_preload_nodes(["a", "b"], set(), set(), {"a"}, 2, max_start=8)
    assert choice.start == ("b",) and choice.missing == 1
    # Bounded work per call; the rest comes at the next call.
    choice = choose_preload_nodes(nodes, set(), set(), set(), 5, max_start=2)
    assert choice.start == ("n0", "n1") and choice.missing == 0
    # Nodes outside the candidates never count, cached or not.
    assert choose_preload_nodes(["a"], {"zz"}, {"yy"}, set(), 1, max_start=8).start == ("a",)


# ---- the agent's scan ----------------------------------------------------------------------------


def complete(root: Path, model: str, marker: str | None = None) -> Path:
    folder = root / (directory_name(model) or "")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / MARKER).write_text(model if marker is None else marker)
    return folder


def test_scan_reports_complete_models_only(tmp_path: Path) -> None:
    root = tmp_path / "models"
    complete(root, "org/llama-8b")
    complete(root, "bert")
    (root / "partial").mkdir()  # still downloading: no marker
    (root / "partial" / "weights.bin").write_bytes(b"x")
    complete(root, "claims-other", marker="bert")  # its marker names another model
    big = complete(root, "huge")
    (big / MARKER).write_text("huge" + " " * MAX_MARKER_BYTES)
    (root / "a-file").write_text("not a folder")
    complete(root, ".hidden")  # not a model folder name
    assert scan_model_cache(root) == ("bert", "org/llama-8b")


def test_scan_follows_no_symlink(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    elsewhere = complete(tmp_path / "outside", "stolen")
    (root / "stolen").symlink_to(elsewhere)  # a folder symlinked out of the cache
    folder = root / "linked-marker"
    folder.mkdir()
    (tmp_path / "secret").write_text("linked-marker")
    (folder / MARKER).symlink_to(tmp_path / "secret")  # the marker itself a symlink
    fifo = root / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / MARKER)  # opening it must not block the agent's loop
    assert scan_model_cache(root) == ()


def test_scan_is_bounded_and_tolerates_a_missing_root(tmp_path: Path) -> None:
    assert scan_model_cache(tmp_path / "absent") == ()
    root = tmp_path / "models"
    for i in range(30):
        complete(root, f"m{i:02d}")
    assert len(scan_model_cache(root)) == 30
    assert len(scan_model_cache(root, limit=10)) == 10


def test_simulated_cache_declared_plus_preloaded() -> None:
    assert parse_model_list(" a, org/b ,, .bad") == {"a", "org/b"}
    cache = SimulatedModelCache({"a"})
    cache.preloaded("org/b")
    cache.preloaded("..")
    assert cache.models() == ("a", "org/b")
    cache.declare(set())
    assert cache.models() == ("org/b",)


# ---- the operator's preload plan -----------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def cache_aware(want: int, labels: dict[str, str] | None = None) -> CacheAware:
    selector = LabelSelector(match_labels=labels) if labels is not None else None
    strategy = PreloadStrategy(nodes=PreloadNodes(label_selector=selector), min_cached_replicas=want)
    return CacheAware(enabled=True, preload_strategy=strategy)


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


NODES = {n: node(n, warm="yes") for n in ("a", "b", "c", "d")} | {"x": node("x")}


def job(name: str, node_name: str, state: str, ago_s: float = 0.0, model: str = "m") -> PreloadJob:
    return PreloadJob(
        name, node_name, model, state, NOW - timedelta(seconds=ago_s) if state != "running" else None
    )


def test_plan_starts_only_what_is_missing_on_selected_reporting_nodes() -> None:
    cached = {"a": frozenset({"m"}), "b": frozenset(), "c": frozenset(), "x": frozenset()}  # d: no agent
    plan = plan_preload(cache_aware(3, {"warm": "yes"}), "m", NODES, cached, [], NOW)
    assert plan.create == ["b", "c"] and plan.delete == []
    assert (
        plan.status is not None and plan.status.cached_nodes == ["a"] and plan.status.preloading == ["b", "c"]
    )
    assert plan.status.message is None
    plan = plan_preload(cache_aware(4, {"warm": "yes"}), "m", NODES, cached, [], NOW)
    assert (
        plan.status is not None
        and plan.status.message is not None
        and "1 more selected" in plan.status.message
    )


def test_plan_follows_jobs_to_their_outcome() -> None:
    cached = {n: frozenset() for n in ("a", "b", "c", "d")} | {"a": frozenset({"m"})}
    jobs = [
        job("ja", "a", "succeeded", 1),  # reported: deleted, said once
        job("jb", "b", "running"),
        job("jc", "c", "failed", 10),  # in its back-off
        job("jd", "d", "succeeded", UNREPORTED_S + 1),  # succeeded, never reported
        job("old", "b", "running", model="previous"),  # another model
    ]
    plan = plan_preload(cache_aware(4), "m", NODES, cached, jobs, NOW)
    assert sorted(plan.delete) == ["ja", "old"] and plan.create == []
    assert plan.status is not None
    assert (plan.status.cached_nodes, plan.status.preloading, plan.status.failed) == (
        ["a"],
        ["b"],
        ["c", "d"],
    )
    reasons = [(r, m.split(":")[0]) for _, r, m in plan.events]
    assert reasons == [
        ("ModelPreloaded", "node a caches m"),
        ("PreloadFailed", "preloading m on node c"),
        ("PreloadFailed", "preloading m on node d"),
    ]
    # The next reconcile does not say the failures again; past the back-off they are tried again.
    again = plan_preload(cache_aware(4), "m", NODES, cached, jobs[1:4], NOW, previously_failed=["c", "d"])
    assert [r for _, r, _ in again.events] == []
    later = [job("jc", "c", "failed", FAILED_BACKOFF_S + 1)]
    plan = plan_preload(cache_aware(2), "m", NODES, cached, later, NOW, previously_failed=["c"])
    assert plan.delete == ["jc"] and plan.create == ["b"]


def test_plan_with_preloading_off_deletes_the_jobs() -> None:
    jobs = [job("j", "a", "running")]
    assert plan_preload(CacheAware(enabled=False), "m", NODES, {}, jobs, NOW).delete == ["j"]
    plan = plan_preload(cache_aware(1), None, NODES, {}, jobs, NOW)
    assert plan.delete == ["j"] and plan.status is None


def test_preload_job_manifest_and_reading_it_back() -> None:
    pool = {"metadata": {"name": "chat", "namespace": "ns", "uid": "u1"}}
    template = PodTemplate(
        spec={
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11",
                    "env": [{"name": "HF_TOKEN", "value": "t"}],
                }
            ],
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
        }
    )
    body = preload_job(pool, "node-1", "org/m", template, [{"key": "kwok", "operator": "Exists"}], "/cache")
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert body["metadata"]["labels"] == {c.LABEL_PRELOAD_POOL: "chat"}
    spec = body["spec"]["template"]["spec"]
    (ctr,) = spec["containers"]
    assert spec["nodeName"] == "node-1" and spec["restartPolicy"] == "Never"
    assert ctr["image"] == "vllm/vllm-openai:v0.11" and ctr["command"][:2] == ["sh", "-c"]
    env = {e["name"]: e["value"] for e in ctr["env"]}
    assert env["HF_TOKEN"] == "t" and env["NEURONETES_PRELOAD_MODEL"] == "org/m"
    assert env["NEURONETES_PRELOAD_DIR"].endswith("/org--m") and env["NEURONETES_PRELOAD_MARKER"] == MARKER
    assert spec["volumes"][0]["hostPath"]["path"] == "/cache"
    assert [t["key"] for t in spec["tolerations"]] == ["gpu", "kwok"]
    assert "resources" not in ctr  # no GPU: nothing for the GPU scheduler or the webhook
    body["status"] = {
        "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }
    assert read_job(body) == PreloadJob(body["metadata"]["name"], "node-1", "org/m", "succeeded", NOW)
    gpus = [{"uuid": "GPU-1", "cachedModels": ["x"], "allocations": []}, {"cachedModels": []}]
    page = {
        "items": [{"metadata": {"name": "n"}, "status": {"gpus": gpus}}, {"metadata": {"name": "new"}}],
        "metadata": {"continue": "next"},
    }
    cached: dict[str, frozenset[str]] = {}
    assert read_gpunode_page(json.dumps(page).encode(), cached) == "next"
    assert cached == {"n": frozenset({"x"})}  # "new": no agent has reported it, no candidate
    assert read_gpunode_page(b'{"items": [], "metadata": {}}', cached) is None


# ---- a pod's annotations -------------------------------------------------------------------------


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    ctr = {"name": "m", "resources": {"limits": {c.RESOURCE_GPU: "1"}, "requests": {c.RESOURCE_GPU: "1"}}}
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
        "spec": {"containers": [ctr]},
    }


def test_pod_annotations_give_the_request_its_model_cache_term() -> None:
    asked = pod_gpu_request(pod({c.ANNOTATION_MODEL: "org/m", c.ANNOTATION_CACHE_HIT_WEIGHT: "0.35"}))
    assert asked is not None
    assert (asked.request.model_name, asked.request.model_cache_weight) == ("org/m", 0.35)
    # The model alone (a fallback pool's pods) asks for no cache scoring.
    plain = pod_gpu_request(pod({c.ANNOTATION_MODEL: "org/m"}))
    assert plain is not None and (plain.request.model_name, plain.request.model_cache_weight) == (None, None)
    for bad, said in (
        ({c.ANNOTATION_MODEL: "m", c.ANNOTATION_CACHE_HIT_WEIGHT: "2"}, "is not a number from 0 to 1"),
        ({c.ANNOTATION_MODEL: "m", c.ANNOTATION_CACHE_HIT_WEIGHT: "nan"}, "is not a number from 0 to 1"),
        ({c.ANNOTATION_CACHE_HIT_WEIGHT: "0.2"}, f"needs the model in annotation {c.ANNOTATION_MODEL}"),
    ):
        with pytest.raises(ResourceRequestError, match=said):
            pod_gpu_request(pod(bad))
