"""The model cache's pure parts: the directory contract (shared and per-namespace folders, the
reported ``<namespace>:<model>`` entries) and the agent's scan of it (partial downloads, symlinks,
FIFOs, bad markers, the bounds, the flat layout of earlier versions), the choice of nodes to
preload, the operator's preload plan and Job (its one mount: its namespace's folder), how a pod's
annotations become the request's model-cache term, and that a namespace's cache counts for its own
pods only."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from node_factory import NodeFactory

from neuronetes import contracts as c
from neuronetes.api.models import CacheAware, LabelSelector, PodTemplate, PreloadNodes, PreloadStrategy
from neuronetes.assignment import ResourceRequestError, pod_gpu_request
from neuronetes.engine import PlacementEngine
from neuronetes.inventory import ClusterState
from neuronetes.modelcache import (
    MARKER,
    MAX_REPORTED,
    cache_entry,
    choose_preload_nodes,
    directory_name,
    hit_entries,
    namespace_folder,
    parse_cache_entry,
    selector_matches,
)
from neuronetes_agent.daemon.modelcache import (
    MAX_MARKER_BYTES,
    MAX_SCANNED_PER_NAMESPACE,
    HostModelCache,
    SimulatedModelCache,
    parse_model_list,
    scan_model_cache,
)
from neuronetes_operator.preload import (
    FAILED_BACKOFF_S,
    NO_POD_S,
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
    for bad in ("", ".", "..", ".hidden", "a\nb", "a\x00b", "x" * 254, "llama3:8b"):
        assert directory_name(bad) is None, bad


def test_reported_entries_name_the_namespace_and_nothing_else_parses() -> None:
    assert cache_entry("org/m") == "org/m" and cache_entry("org/m", "team-a") == "team-a:org/m"
    assert parse_cache_entry("org/m") == (None, "org/m")
    assert parse_cache_entry("team-a:org/m") == ("team-a", "org/m")
    # A second ':', a namespace that is none (upper case, a dot, empty, too long), a model
    # without a folder: no entry.
    for bad in ("a:b:c", "Team:m", "a.b:m", ":m", f"{'n' * 64}:m", "team-a:", "team-a:.m", ""):
        assert parse_cache_entry(bad) is None, bad
    assert hit_entries("org/m", "team-a") == ("org/m", "team-a:org/m")
    assert hit_entries("org/m", None) == ("org/m",) and hit_entries("org/m", "Not_A_NS") == ("org/m",)
    # "y:m" as a model would otherwise read as namespace y's entry of m.
    assert hit_entries("y:m", "x") == ()
    assert namespace_folder("/var/cache/neuronetes/models/", "team-a") == (
        "/var/cache/neuronetes/models/namespaces/team-a"
    )
    for bad_namespace in ("..", "a/b", "", "A"):
        with pytest.raises(ValueError, match="is not a namespace name"):
            namespace_folder("/cache", bad_namespace)


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


def complete(folder: Path, model: str, marker: str | None = None) -> Path:
    """`model` fetched into the cache folder `folder` (``<dir>/shared`` or a namespace's)."""
    name = directory_name(model)
    assert name is not None, model
    model_folder = folder / name
    model_folder.mkdir(parents=True, exist_ok=True)
    (model_folder / "config.json").write_text("{}")
    (model_folder / MARKER).write_text(model if marker is None else marker)
    return model_folder


def test_scan_reports_complete_models_only(tmp_path: Path) -> None:
    root = tmp_path / "models"
    shared = root / "shared"
    complete(shared, "org/llama-8b")
    complete(shared, "bert")
    (shared / "partial").mkdir()  # still downloading: no marker
    (shared / "partial" / "weights.bin").write_bytes(b"x")
    complete(shared, "claims-other", marker="bert")  # its marker names another model
    big = complete(shared, "huge")
    (big / MARKER).write_text("huge" + " " * MAX_MARKER_BYTES)
    (shared / "a-file").write_text("not a folder")
    (shared / ".hidden").mkdir()
    (shared / ".hidden" / MARKER).write_text(".hidden")  # not a model folder name
    assert scan_model_cache(root).models == ("bert", "org/llama-8b")


def test_scan_reports_each_namespace_under_its_name(tmp_path: Path) -> None:
    root = tmp_path / "models"
    complete(root / "shared", "org/m")
    complete(root / "namespaces" / "team-a", "org/m")
    complete(root / "namespaces" / "team-b", "org/m")
    complete(root / "namespaces" / "team-b", "org/n")
    # A namespace's marker names a model only: the namespace is the folder's, never the marker's.
    complete(root / "namespaces" / "team-a", "claims", marker="team-b:claims")
    for not_a_namespace in ("Team-C", "a.b", "x" * 64):
        complete(root / "namespaces" / not_a_namespace, "org/m")
    (root / "namespaces" / "stray-file").write_text("x")
    complete(tmp_path / "elsewhere", "org/stolen")
    (root / "namespaces" / "linked").symlink_to(tmp_path / "elsewhere")  # a namespace symlinked away
    os.mkfifo(root / "namespaces" / "fifo")  # opening it as a folder must not block
    # Today's flat layout: written by any namespace's preload Job, so it counts for nobody.
    complete(root, "org/old")
    scan = scan_model_cache(root)
    assert scan.models == ("org/m", "team-a:org/m", "team-b:org/m", "team-b:org/n")
    assert scan.misplaced == ("org--old",)


def test_scan_follows_no_symlink(tmp_path: Path) -> None:
    root = tmp_path / "models"
    shared = root / "shared"
    shared.mkdir(parents=True)
    elsewhere = complete(tmp_path / "outside", "stolen")
    (shared / "stolen").symlink_to(elsewhere)  # a folder symlinked out of the cache
    folder = shared / "linked-marker"
    folder.mkdir()
    (tmp_path / "secret").write_text("linked-marker")
    (folder / MARKER).symlink_to(tmp_path / "secret")  # the marker itself a symlink
    fifo = shared / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / MARKER)  # opening it must not block the agent's loop
    # A namespace folder whose model folder is a symlink to the shared one's.
    (root / "namespaces" / "team-a").mkdir(parents=True)
    (root / "namespaces" / "team-a" / "stolen").symlink_to(elsewhere)
    assert scan_model_cache(root).models == ()
    # shared/ or namespaces/ themselves symlinked: not followed either.
    other = tmp_path / "other"
    other.mkdir()
    complete(tmp_path / "real-shared", "org/m")
    (other / "shared").symlink_to(tmp_path / "real-shared")
    complete(tmp_path / "real-ns" / "team-a", "org/m")
    (other / "namespaces").symlink_to(tmp_path / "real-ns")
    assert scan_model_cache(other).models == ()


def test_scan_is_bounded_and_tolerates_a_missing_root(tmp_path: Path) -> None:
    assert scan_model_cache(tmp_path / "absent").models == ()
    root = tmp_path / "models"
    for i in range(30):
        complete(root / "shared", f"m{i:02d}")
    assert len(scan_model_cache(root).models) == 30
    assert len(scan_model_cache(root, limit=10).models) == 10
    for i in range(20):
        complete(root / "namespaces" / "team-a", f"a{i:02d}")
    found = scan_model_cache(root, namespace_limit=5).models
    assert sum(m.startswith("team-a:") for m in found) == 5


def test_scan_shares_the_report_fairly_between_namespaces(tmp_path: Path) -> None:
    """One namespace filling its folder costs the agent at most its per-namespace bound and cannot
    push another namespace's (or the platform's) models out of the node's report."""
    root = tmp_path / "models"
    complete(root / "shared", "org/base")
    for i in range(MAX_SCANNED_PER_NAMESPACE + 40):
        complete(root / "namespaces" / "flood", f"f{i:03d}")
    complete(root / "namespaces" / "quiet", "org/m")
    found = scan_model_cache(root).models
    assert len(found) == MAX_REPORTED
    assert "org/base" in found and "quiet:org/m" in found


def test_host_cache_rescans_at_its_interval(tmp_path: Path) -> None:
    now = [0.0]
    cache = HostModelCache(tmp_path, every_s=10.0, clock=lambda: now[0])
    assert cache.models() == ()
    complete(tmp_path / "namespaces" / "team-a", "org/m")
    now[0] = 5.0
    assert cache.models() == ()  # within the interval: the last scan's
    now[0] = 10.0
    assert cache.models() == ("team-a:org/m",)


def test_simulated_cache_declared_plus_preloaded() -> None:
    assert parse_model_list(" a, org/b ,, .bad, team-a:org/c, a:b:c, Bad:x") == {"a", "org/b", "team-a:org/c"}
    cache = SimulatedModelCache({"a"})
    cache.preloaded("team-a", "org/b")  # a preload pod of team-a wrote team-a's folder
    cache.preloaded("team-a", "..")
    cache.preloaded("Not_A_NS", "org/b")
    assert cache.models() == ("a", "team-a:org/b")
    cache.declare(set())
    assert cache.models() == ("team-a:org/b",)


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
    plan = plan_preload(cache_aware(3, {"warm": "yes"}), "m", "ns", NODES, cached, [], NOW)
    assert plan.create == ["b", "c"] and plan.delete == []
    assert (
        plan.status is not None and plan.status.cached_nodes == ["a"] and plan.status.preloading == ["b", "c"]
    )
    assert plan.status.message is None
    plan = plan_preload(cache_aware(4, {"warm": "yes"}), "m", "ns", NODES, cached, [], NOW)
    assert (
        plan.status is not None
        and plan.status.message is not None
        and "1 more selected" in plan.status.message
    )


def test_plan_counts_shared_and_own_namespace_entries_only() -> None:
    """A node counts as caching the pool's model when it holds it shared or in the pool's own
    namespace; another namespace's copy is no cache for this pool, so the node gets a preload."""
    cached = {
        "a": frozenset({"m"}),
        "b": frozenset({"ns:m"}),
        "c": frozenset({"other:m", "ns:m2"}),
        "d": frozenset(),
    }
    plan = plan_preload(cache_aware(4), "m", "ns", NODES, cached, [], NOW)
    assert plan.status is not None and plan.status.cached_nodes == ["a", "b"]
    assert plan.create == ["c", "d"]
    # The other namespace's pool sees its own copy on c, and none on b.
    plan = plan_preload(cache_aware(4), "m", "other", NODES, cached, [], NOW)
    assert plan.status is not None and plan.status.cached_nodes == ["a", "c"]


def test_plan_says_when_a_jobs_pod_was_never_created() -> None:
    """A Job the admission of its pod refused (Pod Security baseline and the hostPath volume) has
    no pod: after NO_POD_S it counts as failed, with an Event and a status message saying why."""
    cached: dict[str, frozenset[str]] = {n: frozenset() for n in ("a", "b")}
    created = NOW - timedelta(seconds=NO_POD_S + 1)
    refused = PreloadJob("ja", "a", "m", "running", created_at=created, has_pods=False)
    young = PreloadJob("jb", "b", "m", "running", created_at=NOW - timedelta(seconds=1), has_pods=False)
    plan = plan_preload(cache_aware(2), "m", "ns", NODES, cached, [refused, young], NOW)
    assert plan.status is not None and plan.status.failed == ["a"] and plan.status.preloading == ["b"]
    ((etype, reason, message),) = plan.events
    assert (etype, reason) == ("Warning", "PreloadFailed")
    assert "no pod of its Job ja was created" in message and "hostPath" in message
    assert plan.status.message is not None and "refused in namespace ns" in plan.status.message
    # Past the back-off (counted from when it was found refused) it is deleted and tried again.
    stale = PreloadJob(
        "ja",
        "a",
        "m",
        "running",
        created_at=NOW - timedelta(seconds=NO_POD_S + FAILED_BACKOFF_S),
        has_pods=False,
    )
    assert plan_preload(cache_aware(1), "m", "ns", NODES, cached, [stale], NOW).delete == ["ja"]
    # A Job with a pod (pending on its image, say) is under way however old.
    pulling = PreloadJob("ja", "a", "m", "running", created_at=created - timedelta(hours=1), has_pods=True)
    plan = plan_preload(cache_aware(1), "m", "ns", NODES, cached, [pulling], NOW)
    assert plan.status is not None and plan.status.preloading == ["a"] and plan.events == []


def test_plan_follows_jobs_to_their_outcome() -> None:
    cached: dict[str, frozenset[str]] = {n: frozenset() for n in ("a", "b", "c", "d")} | {
        "a": frozenset({"m"})
    }
    jobs = [
        job("ja", "a", "succeeded", 1),  # reported: deleted, said once
        job("jb", "b", "running"),
        job("jc", "c", "failed", 10),  # in its back-off
        job("jd", "d", "succeeded", UNREPORTED_S + 1),  # succeeded, never reported
        job("old", "b", "running", model="previous"),  # another model
    ]
    plan = plan_preload(cache_aware(4), "m", "ns", NODES, cached, jobs, NOW)
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
    again = plan_preload(
        cache_aware(4), "m", "ns", NODES, cached, jobs[1:4], NOW, previously_failed=["c", "d"]
    )
    assert [r for _, r, _ in again.events] == []
    later = [job("jc", "c", "failed", FAILED_BACKOFF_S + 1)]
    plan = plan_preload(cache_aware(2), "m", "ns", NODES, cached, later, NOW, previously_failed=["c"])
    assert plan.delete == ["jc"] and plan.create == ["b"]


def test_plan_with_preloading_off_deletes_the_jobs() -> None:
    jobs = [job("j", "a", "running")]
    assert plan_preload(CacheAware(enabled=False), "m", "ns", NODES, {}, jobs, NOW).delete == ["j"]
    plan = plan_preload(cache_aware(1), None, "ns", NODES, {}, jobs, NOW)
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
    # Its one volume is its namespace's folder: neither shared/ nor another namespace's is reachable.
    assert spec["volumes"] == [
        {"name": "model-cache", "hostPath": {"path": "/cache/namespaces/ns", "type": "DirectoryOrCreate"}}
    ]
    assert ctr["volumeMounts"] == [{"name": "model-cache", "mountPath": "/neuronetes-model-cache"}]
    assert env["NEURONETES_PRELOAD_DIR"] == "/neuronetes-model-cache/org--m"
    assert [t["key"] for t in spec["tolerations"]] == ["gpu", "kwok"]
    assert "resources" not in ctr  # no GPU: nothing for the GPU scheduler or the webhook
    body["status"] = {
        "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }
    assert read_job(body) == PreloadJob(body["metadata"]["name"], "node-1", "org/m", "succeeded", NOW)
    # Created, its pod refused: no active, succeeded or failed pod.
    body["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    body["status"] = {"startTime": "2026-01-01T00:00:00Z"}
    refused = read_job(body)
    assert (refused.state, refused.created_at, refused.has_pods) == ("running", NOW, False)
    body["status"] = {"active": 1}
    assert read_job(body).has_pods
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


def test_a_namespaces_cache_counts_for_its_own_pods_only(nodes: NodeFactory) -> None:
    """Pods of namespaces x and y asking for one model: x's pod scores the shared copy and x's own
    as hits, never y's; the request carries the entries that count (shared and own namespace)."""
    specs = [
        nodes.t4("y-own", cached_models=frozenset({"y:org/m"})),
        nodes.t4("cold"),
        nodes.t4("x-own", cached_models=frozenset({"x:org/m"})),
        nodes.t4("shared", cached_models=frozenset({"org/m"})),
    ]
    engine = PlacementEngine(ClusterState(specs), "default")

    def hits(namespace: str) -> dict[str, float]:
        body = pod({c.ANNOTATION_MODEL: "org/m", c.ANNOTATION_CACHE_HIT_WEIGHT: "1"})
        body["metadata"]["namespace"] = namespace
        asked = pod_gpu_request(body)
        assert asked is not None
        assert asked.request.model_cache_names == ("org/m", f"{namespace}:org/m")
        return {s.name: engine.explain(asked.request, i)["model_cache"] for i, s in enumerate(specs)}

    assert hits("x") == {"y-own": 0.0, "cold": 0.0, "x-own": 1.0, "shared": 1.0}
    assert hits("y") == {"y-own": 1.0, "cold": 0.0, "x-own": 0.0, "shared": 1.0}
    # A namespace no pool lives in sees the shared copy alone.
    assert hits("z") == {"y-own": 0.0, "cold": 0.0, "x-own": 0.0, "shared": 1.0}
    # A model named like another namespace's entry ("y:org/m") has no folder and hits nowhere.
    body = pod({c.ANNOTATION_MODEL: "y:org/m", c.ANNOTATION_CACHE_HIT_WEIGHT: "1"})
    asked = pod_gpu_request(body)
    assert asked is not None and asked.request.model_cache_names == ()
    assert {engine.explain(asked.request, i)["model_cache"] for i in range(len(specs))} == {0.0}
