"""The extender's wire protocol: kube-scheduler-shaped JSON in both nodeCacheCapable modes, the
verbs' answers, 4xx for bad input, and schemathesis over the app's OpenAPI with zero 5xx."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import pytest
import schemathesis
from extender_support import (
    AsgiClient,
    FakeApi,
    cpu_pod,
    gpu_pod,
    metric_value,
    node_objects,
    pod_object,
    shared_pod,
    synced_cache,
)
from hypothesis import HealthCheck, settings
from pod_builder import container

from neuronetes import contracts as c
from neuronetes_extender.app import create_app
from neuronetes_extender.budgets import budget_of
from neuronetes_extender.cache import GpuCache
from neuronetes_extender.config import ExtenderSettings
from neuronetes_extender.service import ExtenderService
from neuronetes_extender.watch import CustomObject
from neuronetes_extender.wire import Pod

pytestmark = pytest.mark.unit

NODES = node_objects({"dgx-a100-80gb": 3, "t4x4-pcie": 2, "a100-40gb-mig": 1, "cpu-only": 1})
NAMES = [n["metadata"]["name"] for n in NODES]
JSON = {"content-type": "application/json"}
FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


@dataclass
class Env:
    cache: GpuCache
    api: FakeApi
    service: ExtenderService
    client: AsgiClient

    def post(self, verb: str, doc: Any) -> Any:
        response = self.client.post(f"/{verb}", content=json.dumps(doc), headers=JSON)
        assert response.status_code == 200, response.text
        return response.json()

    def filter(self, pod: dict[str, Any], *, mode: str = "names", names: list[str] | None = None) -> Any:
        self.api.add(pod)
        return self.post("filter", args(pod, mode=mode, names=names))

    def bind(self, pod: dict[str, Any], node: str) -> Any:
        meta = pod["metadata"]
        return self.post(
            "bind",
            {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node},
        )


def args(pod: dict[str, Any], *, mode: str = "names", names: list[str] | None = None) -> dict[str, Any]:
    """ExtenderArgs exactly as kube-scheduler sends them (the unused field is null)."""
    chosen = names if names is not None else NAMES
    if mode == "names":
        return {"Pod": pod, "Nodes": None, "NodeNames": chosen}
    items = [n for n in NODES if n["metadata"]["name"] in chosen]
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}


def make_env(settings: ExtenderSettings | None = None) -> Env:
    cache = synced_cache(NODES, settings)
    api = FakeApi(cache=cache)
    service = ExtenderService(cache, api)
    return Env(cache, api, service, AsgiClient(create_app(service)))


@pytest.fixture
def env() -> Env:
    return make_env()


def training_pod(name: str = "trainer") -> dict[str, Any]:
    """Init container, sidecar and two app containers, all with GPUs: the pod needs 3 GPUs."""
    return pod_object(
        name,
        [container("main", {c.RESOURCE_GPU: 2, "cpu": "4", "memory": "16Gi"}), container("helper", {})],
        init=[
            container("warmup", {c.RESOURCE_GPU: 3}),
            container("logger", {c.RESOURCE_GPU: 1}, restartPolicy="Always"),
        ],
    )


# ---- filter -------------------------------------------------------------------------------------


def test_filter_names_only_mode(env: Env) -> None:
    pod = training_pod()
    out = env.filter(pod)
    assert set(out) == FILTER_KEYS
    assert out["Nodes"] is None and out["Error"] == ""
    assert len(out["NodeNames"]) == 1
    chosen = out["NodeNames"][0]
    rejected = {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}
    assert not set(out["FailedNodes"]) & set(out["FailedAndUnresolvableNodes"])
    assert chosen not in rejected
    assert out["FailedAndUnresolvableNodes"]["ncpu-only-0"] == "node has fewer gpus than requested"
    assert out["FailedNodes"]["na100-40gb-mig-0"] == "insufficient free gpus"  # MIG GPUs are never whole
    # The decision is held at once: 3 GPUs (sidecar 1 + the larger of init 3 - and app 2 + sidecar 1).
    hold = env.cache.hold_of(pod["metadata"]["uid"])
    assert hold is not None and hold.node == chosen and len(hold.grants) == 3
    env.cache.check_invariants()


def test_filter_full_node_list_mode_returns_the_objects_it_was_sent(env: Env) -> None:
    out = env.filter(training_pod())
    env.cache.holds()  # a second pod: the first one's hold is in place
    pod = gpu_pod("second", 1)
    out = env.filter(pod, mode="full")
    assert set(out) == FILTER_KEYS
    assert out["NodeNames"] is None
    (node,) = out["Nodes"]["items"]
    assert node == next(n for n in NODES if n["metadata"]["name"] == node["metadata"]["name"])
    assert "ncpu-only-0" in out["FailedAndUnresolvableNodes"]


def test_filter_answers_both_fields_when_both_are_sent(env: Env) -> None:
    pod = gpu_pod("both", 1)
    doc = {"Pod": pod, "Nodes": {"items": NODES}, "NodeNames": NAMES}
    out = env.post("filter", doc)
    assert out["NodeNames"] == [n["metadata"]["name"] for n in out["Nodes"]["items"]]


def test_filter_top_k_lists_feasible_nodes_in_fit_order() -> None:
    env = make_env(ExtenderSettings(filter_top_k=3))
    out = env.filter(gpu_pod("k", 1))
    assert len(out["NodeNames"]) == 3
    hold = env.cache.hold_of(env.api.pods[("default", "k")]["metadata"]["uid"])
    assert hold is not None and hold.node == out["NodeNames"][0]


def test_bind_to_another_offered_node_than_the_held_one_is_refused() -> None:
    # Issue 9: a GPU pod binds only where this extender's filter holds its GPUs.
    env = make_env(ExtenderSettings(filter_top_k=3))
    pod = gpu_pod("moved", 2)
    env.api.add(pod)
    first, second, _ = env.filter(pod)["NodeNames"]
    out = env.bind(pod, second)
    assert f"its gpus are held on {first}, not on {second}" in out["Error"]
    assert env.api.bindings == []
    assert env.bind(pod, first) == {"Error": ""}
    ((_, node, annotations),) = env.api.bindings
    assert node == first == c.decode_assignment(annotations[c.ANNOTATION_ASSIGNED_GPUS]).node
    assert env.cache.holds() == []
    env.cache.check_invariants()


def test_filter_rejects_unknown_nodes_and_deduplicates(env: Env) -> None:
    out = env.filter(gpu_pod("u", 1), names=["ghost", "nt4x4-pcie-0", "nt4x4-pcie-0"])
    assert out["NodeNames"] == ["nt4x4-pcie-0"]
    assert out["FailedNodes"] == {"ghost": "node not in the gpu inventory yet"}


def test_later_filters_cannot_take_held_gpus(env: Env) -> None:
    t4 = ["nt4x4-pcie-0"]
    for k in range(4):
        assert env.filter(gpu_pod(f"h{k}", 1), names=t4)["NodeNames"] == t4
    out = env.filter(gpu_pod("h4", 1), names=t4)
    assert out["NodeNames"] == []
    assert out["FailedNodes"] == {"nt4x4-pcie-0": "insufficient free gpus"}
    env.cache.check_invariants()


def test_shared_and_mig_pods(env: Env) -> None:
    out = env.filter(shared_pod("s", memory_mib=8192, compute=25))
    assert len(out["NodeNames"]) == 1
    mig = pod_object("m", [container("main", {c.mig_resource_name("2g.10gb"): 1})])
    out = env.filter(mig)
    assert out["NodeNames"] == ["na100-40gb-mig-0"]
    assert out["FailedAndUnresolvableNodes"]["ncpu-only-0"] == "node has fewer gpus than requested"


def test_invalid_gpu_request_is_unschedulable_everywhere_not_an_error(env: Env) -> None:
    pod = pod_object("bad", [container("main", {c.RESOURCE_GPU: 1})])
    pod["spec"]["containers"][0]["resources"]["requests"][c.RESOURCE_GPU] = "2"  # requests != limits
    out = env.filter(pod)
    assert out["NodeNames"] == [] and out["Error"] == ""
    reasons = set(out["FailedAndUnresolvableNodes"].values())
    assert len(reasons) == 1 and reasons.pop().startswith("invalid gpu request: container 'main'")


def test_pod_without_gpus_passes_through_untouched(env: Env) -> None:
    pod = cpu_pod("web")
    out = env.filter(pod)
    assert out["NodeNames"] == NAMES and out["FailedNodes"] == {}
    out = env.post("filter", args(pod, mode="full"))
    assert out["Nodes"]["items"] == NODES
    assert env.cache.holds() == []
    scores = env.post("prioritize", args(pod))
    assert scores == [{"Host": n, "Score": 0} for n in NAMES]


def test_unsynced_cache_fails_the_attempt_and_is_not_ready() -> None:
    cache = GpuCache()
    client = AsgiClient(create_app(ExtenderService(cache)))
    response = client.post("/filter", content=json.dumps(args(gpu_pod("p"))), headers=JSON)
    assert response.status_code == 200 and "not synced" in response.json()["Error"]
    assert client.get("/readyz").status_code == 503
    assert client.get("/healthz").status_code == 200


# ---- prioritize ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["names", "full"])
def test_prioritize_scores_every_node_0_to_10(env: Env, mode: str) -> None:
    pod = gpu_pod("p", 1)
    env.api.add(pod)
    scores = env.post("prioritize", args(pod, mode=mode))
    assert [s["Host"] for s in scores] == NAMES
    assert all(set(s) == {"Host", "Score"} and 0 <= s["Score"] <= 10 for s in scores)
    assert {s["Host"]: s["Score"] for s in scores}["ncpu-only-0"] == 0
    assert max(s["Score"] for s in scores) == 10
    chosen = env.filter(pod)["NodeNames"][0]
    scores = env.post("prioritize", args(pod, mode=mode))
    assert {s["Host"]: s["Score"] for s in scores}[chosen] == 10


# ---- bind ---------------------------------------------------------------------------------------


def test_bind_carries_the_assignment_of_every_container(env: Env) -> None:
    pod = training_pod()
    node = env.filter(pod)["NodeNames"][0]
    assert env.bind(pod, node) == {"Error": ""}
    ((key, bound_node, annotations),) = env.api.bindings
    assert key == "default/trainer" and bound_node == node
    assignment = c.decode_assignment(annotations[c.ANNOTATION_ASSIGNED_GPUS])
    assert assignment.node == node and assignment.pod_uid == pod["metadata"]["uid"]
    assert set(assignment.containers) == {"warmup", "logger", "main"}
    uuids = {g.uuid for ctr in assignment.containers.values() for g in ctr.gpus}
    assert len(uuids) == 3
    assert uuids <= {c.simulated_gpu_uuid(node, j) for j in range(8)}
    assert len(assignment.containers["main"].gpus) == 2
    assert not {g.uuid for g in assignment.containers["logger"].gpus} & {
        g.uuid for g in assignment.containers["main"].gpus
    }
    # The hold became the pod's committed allocation.
    assert env.cache.holds() == []
    info = env.cache.pod(pod["metadata"]["uid"])
    assert info is not None and info.node == node
    env.cache.check_invariants()


def test_bind_is_idempotent(env: Env) -> None:
    pod = gpu_pod("idem", 2)
    node = env.filter(pod)["NodeNames"][0]
    assert env.bind(pod, node) == {"Error": ""}
    assert env.bind(pod, node) == {"Error": ""}
    assert len(env.api.bindings) == 1
    # A restarted extender (empty cache) retrying the same bind: the API says it is done.
    fresh = ExtenderService(synced_cache(NODES), env.api)
    client = AsgiClient(create_app(fresh))
    meta = pod["metadata"]
    doc = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": node}
    assert client.post("/bind", content=json.dumps(doc), headers=JSON).json() == {"Error": ""}
    other = next(n for n in NAMES if n != node)
    doc["Node"] = other
    assert "already bound" in client.post("/bind", content=json.dumps(doc), headers=JSON).json()["Error"]
    assert len(env.api.bindings) == 1


def test_bind_conflict_from_the_api_is_success_when_bound_there(env: Env) -> None:
    pod = gpu_pod("race", 1)
    node = env.filter(pod)["NodeNames"][0]
    env.api.pods[("default", "race")]["spec"]["nodeName"] = node  # bound behind our back
    assert env.bind(pod, node) == {"Error": ""}
    env.cache.check_invariants()


def test_bind_without_a_prior_filter_is_refused(env: Env) -> None:
    # Issue 9: no more "place again at bind": an unfiltered GPU pod is refused with a reason.
    pod = shared_pod("late", memory_mib=4096, compute=10)
    env.api.add(pod)
    out = env.bind(pod, "nt4x4-pcie-1")
    assert "no gpus held for it on nt4x4-pcie-1" in out["Error"]
    assert env.api.bindings == [] and env.cache.holds() == []


def test_bind_refuses_a_node_without_room(env: Env) -> None:
    pod = gpu_pod("huge", 8)
    env.api.add(pod)
    assert env.filter(pod, names=["nt4x4-pcie-0"])["NodeNames"] == []
    out = env.bind(pod, "nt4x4-pcie-0")
    assert "no gpus held for it" in out["Error"]
    assert env.api.bindings == []
    env.cache.check_invariants()


def test_bind_failure_releases_the_hold(env: Env) -> None:
    pod = gpu_pod("fails", 1)
    node = env.filter(pod)["NodeNames"][0]
    env.api.fail_next(403, "forbidden")
    assert "forbidden" in env.bind(pod, node)["Error"]
    assert env.cache.holds() == []
    env.cache.check_invariants()


def test_bind_of_a_pod_without_gpus_has_no_assignment(env: Env) -> None:
    pod = cpu_pod("plain")
    env.api.add(pod)
    assert env.bind(pod, "ncpu-only-0") == {"Error": ""}
    assert env.api.bindings == [("default/plain", "ncpu-only-0", {})]


# ---- preempt ------------------------------------------------------------------------------------


def _fill_t4(env: Env) -> list[dict[str, Any]]:
    """Four one-GPU pods of priorities 40, 10, 30, 20 bound to nt4x4-pcie-0."""
    pods = []
    for k, priority in enumerate([40, 10, 30, 20]):
        pod = gpu_pod(f"v{k}", 1, priority=priority)
        assert env.filter(pod, names=["nt4x4-pcie-0"])["NodeNames"] == ["nt4x4-pcie-0"]
        assert env.bind(pod, "nt4x4-pcie-0") == {"Error": ""}
        pods.append(env.api.pods[("default", f"v{k}")])
    return pods


@pytest.mark.parametrize("mode", ["meta", "full"])
def test_preempt_refines_victims_per_gpu_lowest_priority_first(env: Env, mode: str) -> None:
    victims = _fill_t4(env)
    usage = env.cache.gpu_usage("nt4x4-pcie-0")
    stats = replace(env.cache.stats(), sync_age_seconds={})
    preemptor = gpu_pod("vip", 2, priority=100)
    node2 = "nt4x4-pcie-1"
    if mode == "meta":
        table = {
            "nt4x4-pcie-0": {"Pods": [{"UID": p["metadata"]["uid"]} for p in victims], "NumPDBViolations": 1},
            node2: {"Pods": [], "NumPDBViolations": 0},
        }
        doc = {"Pod": preemptor, "NodeNameToMetaVictims": table, "NodeNameToVictims": None}
    else:
        table = {
            "nt4x4-pcie-0": {"Pods": victims, "NumPDBViolations": 1},
            node2: {"Pods": [], "NumPDBViolations": 0},
        }
        doc = {"Pod": preemptor, "NodeNameToVictims": table, "NodeNameToMetaVictims": None}
    out = env.post("preempt", doc)
    assert set(out) == {"NodeNameToMetaVictims"}
    refined = out["NodeNameToMetaVictims"]
    by_priority = {p["metadata"]["uid"]: p["spec"]["priority"] for p in victims}
    chosen = [v["UID"] for v in refined["nt4x4-pcie-0"]["Pods"]]
    assert [by_priority[u] for u in chosen] == [10, 20]  # the two lowest, lowest first
    assert refined["nt4x4-pcie-0"]["NumPDBViolations"] <= 1
    assert refined[node2] == {"Pods": [], "NumPDBViolations": 0}  # fits there without victims
    # A dry run: nothing changed.
    assert env.cache.gpu_usage("nt4x4-pcie-0") == usage
    assert replace(env.cache.stats(), sync_age_seconds={}) == stats


def test_preempt_answers_the_victims_on_one_gpu_not_the_lowest_on_the_node(env: Env) -> None:
    """Eight half-GPU pods fill the four T4s two by two; a whole-GPU pod needs both pods of one
    GPU gone. kube-scheduler's node totals see any two lowest-priority pods as room (here on two
    GPUs: nothing freed); the answer is the pair sharing the GPU of least highest priority,
    whichever pods kube-scheduler proposed."""
    gpu_of: dict[str, int] = {}
    priorities = [10, 80, 20, 70, 30, 60, 40, 50]
    uids: dict[str, int] = {}
    for k, priority in enumerate(priorities):
        pod = shared_pod(f"h{k}", 7000, 50, priority=priority)
        assert env.filter(pod, names=["nt4x4-pcie-0"])["NodeNames"] == ["nt4x4-pcie-0"]
        hold = env.cache.hold_of(pod["metadata"]["uid"])
        assert hold is not None
        gpu_of[pod["metadata"]["uid"]] = hold.grants[0].gpu_index
        uids[pod["metadata"]["uid"]] = priority
        assert env.bind(pod, "nt4x4-pcie-0") == {"Error": ""}
    by_gpu: dict[int, list[str]] = {}
    for uid, gpu in gpu_of.items():
        by_gpu.setdefault(gpu, []).append(uid)
    assert sorted(len(v) for v in by_gpu.values()) == [2, 2, 2, 2]
    best = min(by_gpu.values(), key=lambda pair: (max(uids[u] for u in pair), sum(uids[u] for u in pair)))
    lowest_two = sorted(uids, key=uids.__getitem__)[:2]
    assert gpu_of[lowest_two[0]] != gpu_of[lowest_two[1]]  # what node totals would evict
    table = {"nt4x4-pcie-0": {"Pods": [{"UID": u} for u in lowest_two], "NumPDBViolations": 0}}
    out = env.post("preempt", {"Pod": gpu_pod("vip", 1, priority=100), "NodeNameToMetaVictims": table})
    chosen = [v["UID"] for v in out["NodeNameToMetaVictims"]["nt4x4-pcie-0"]["Pods"]]
    assert sorted(chosen) == sorted(best)
    assert [uids[u] for u in chosen] == sorted(uids[u] for u in best)  # lowest priority first


def test_preempt_counts_the_violations_of_the_pdbs_the_cache_watches(env: Env) -> None:
    """A PDB over every pod of the namespace (empty selector) allows one disruption: two victims
    violate it once, whatever kube-scheduler counted for its own set."""
    victims = _fill_t4(env)  # priorities 40, 10, 30, 20
    pdb = {"metadata": {"name": "all", "namespace": "default"}, "spec": {"selector": {}}}
    budget = budget_of(msgspec.convert({**pdb, "status": {"disruptionsAllowed": 1}}, CustomObject))
    assert budget is not None
    env.cache.replace_budgets([budget])
    uids = [{"UID": p["metadata"]["uid"]} for p in victims]
    table = {"nt4x4-pcie-0": {"Pods": uids, "NumPDBViolations": 3}}
    out = env.post("preempt", {"Pod": gpu_pod("vip", 2, priority=100), "NodeNameToMetaVictims": table})
    refined = out["NodeNameToMetaVictims"]["nt4x4-pcie-0"]
    by_uid = {p["metadata"]["uid"]: p["spec"]["priority"] for p in victims}
    assert [by_uid[v["UID"]] for v in refined["Pods"]] == [10, 20]
    assert refined["NumPDBViolations"] == 1


def test_preempt_never_names_a_pod_at_or_above_the_preemptors_priority(env: Env) -> None:
    victims = _fill_t4(env)  # priorities 40, 10, 30, 20
    table = {
        "nt4x4-pcie-0": {"Pods": [{"UID": p["metadata"]["uid"]} for p in victims], "NumPDBViolations": 0}
    }
    out = env.post("preempt", {"Pod": gpu_pod("mid", 3, priority=25), "NodeNameToMetaVictims": table})
    # Only the pods of priority 10 and 20 are candidates: two GPUs freed, not three.
    assert out == {"NodeNameToMetaVictims": {}}
    out = env.post("preempt", {"Pod": gpu_pod("mid", 2, priority=25), "NodeNameToMetaVictims": table})
    by_uid = {p["metadata"]["uid"]: p["spec"]["priority"] for p in victims}
    assert [by_uid[v["UID"]] for v in out["NodeNameToMetaVictims"]["nt4x4-pcie-0"]["Pods"]] == [10, 20]


def test_preempt_drops_nodes_where_victims_cannot_make_room(env: Env) -> None:
    victims = _fill_t4(env)
    preemptor = gpu_pod("giant", 8, priority=100)
    table = {
        "nt4x4-pcie-0": {"Pods": [{"UID": p["metadata"]["uid"]} for p in victims], "NumPDBViolations": 0}
    }
    out = env.post("preempt", {"Pod": preemptor, "NodeNameToMetaVictims": table})
    assert out == {"NodeNameToMetaVictims": {}}


def test_preempt_of_a_pod_without_gpus_echoes_the_victims(env: Env) -> None:
    table = {"n": {"Pods": [{"UID": "a"}], "NumPDBViolations": 2}}
    out = env.post("preempt", {"Pod": cpu_pod("c"), "NodeNameToMetaVictims": table})
    assert out == {"NodeNameToMetaVictims": table}


# ---- bad input: 4xx with a reason, never 5xx ------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "body", "headers", "status"),
    [
        ("filter", b'{"Pod": {}}', {"content-type": "text/plain"}, 415),
        ("filter", b'{"Pod": {}}', {}, 415),
        ("bind", b"{}", {"content-type": "application/x-www-form-urlencoded"}, 415),
        ("filter", b"{", JSON, 400),
        ("filter", b"\xff\xfe", JSON, 400),
        ("filter", b"[]", JSON, 400),
        ("filter", b'{"Pod": null, "NodeNames": []}', JSON, 400),
        ("filter", b'{"NodeNames": ["a"]}', JSON, 400),
        ("filter", b'{"Pod": {}, "NodeNames": "n1"}', JSON, 400),
        ("filter", b'{"Pod": {}, "NodeNames": [1]}', JSON, 400),
        ("filter", b'{"Pod": {"spec": {"priority": "high"}}}', JSON, 400),
        ("filter", b'{"Pod": {"spec": {"priority": 99999999999}}}', JSON, 400),
        ("filter", b'{"Pod": {"spec": {"containers": {}}}}', JSON, 400),
        ("filter", b'{"Pod": {}, "Nodes": {"items": [{"metadata": 5}]}}', JSON, 400),
        ("filter", b'{"Pod": {}, "Nodes": {"items": [{}]}}', JSON, 400),
        ("prioritize", b'{"Pod": {}, "Nodes": {"items": [[]]}}', JSON, 400),
        ("bind", b"{}", JSON, 400),
        ("bind", b'{"PodName": "", "PodNamespace": "d", "PodUID": "", "Node": "n"}', JSON, 400),
        ("bind", b'{"PodName": 5, "PodNamespace": "d", "Node": "n"}', JSON, 400),
        ("preempt", b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{}]}}}', JSON, 400),
        ("preempt", b'{"Pod": {}, "NodeNameToVictims": {"n": {"NumPDBViolations": "x"}}}', JSON, 400),
    ],
)
def test_bad_input_gets_a_4xx_with_a_reason(
    env: Env, verb: str, body: bytes, headers: dict[str, str], status: int
) -> None:
    response = env.client.post(f"/{verb}", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["Error"]


def test_oversized_bodies_get_413() -> None:
    env = make_env(ExtenderSettings(max_body_bytes=4096))
    big = json.dumps(args(gpu_pod("big"), mode="full")).encode()
    assert len(big) > 4096
    response = env.client.post("/filter", content=big, headers=JSON)
    assert response.status_code == 413 and "limit" in response.json()["Error"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit applies while reading
        for k in range(0, len(big), 1000):
            yield big[k : k + 1000]

    response = env.client.post("/filter", content=chunks(), headers=JSON)
    assert response.status_code == 413
    response = env.client.post("/filter", content=b"{}", headers={**JSON, "content-length": "x"})
    assert response.status_code == 400


def test_metrics_count_verbs_attempts_and_binds(env: Env) -> None:
    pod = gpu_pod("m", 1)
    node = env.filter(pod)["NodeNames"][0]
    env.bind(pod, node)
    env.client.post("/filter", content=b"{", headers=JSON)
    text = env.client.get("/metrics").text
    assert metric_value(text, "neuronetes_scheduler_attempts_total") == 1
    assert metric_value(text, "neuronetes_scheduler_success_total") == 1
    assert (
        metric_value(text, "neuronetes_scheduler_latency_seconds_count", verb="filter", result="scheduled")
        == 1
    )
    assert metric_value(text, "neuronetes_scheduler_latency_seconds_count", verb="bind", result="ok") == 1
    assert metric_value(text, "neuronetes_scheduler_requests_total", verb="filter", code="400") == 1
    assert metric_value(text, "neuronetes_scheduler_cache_nodes") == len(NODES)
    assert metric_value(text, "neuronetes_scheduler_cache_pods") == 1
    assert metric_value(text, "neuronetes_scheduler_cache_holds") == 0
    assert 0 <= metric_value(text, "neuronetes_scheduler_cache_sync_age_seconds", resource="pods") < 60
    # Sub-millisecond buckets exist.
    assert 'le="0.0001"' in text and 'le="0.00025"' in text


def test_wire_decodes_only_what_it_needs() -> None:
    pod = training_pod()
    decoded = msgspec.json.decode(json.dumps(pod), type=Pod)
    assert decoded.metadata.uid == pod["metadata"]["uid"]
    assert [x.name for x in decoded.spec.init_containers or ()] == ["warmup", "logger"]
    assert decoded.spec.init_containers[1].restart_policy == "Always"  # type: ignore[index]
    assert decoded.spec.scheduler_name == c.SCHEDULER_NAME


# ---- schemathesis over the OpenAPI document: zero 5xx ------------------------------------------------

_FUZZ = make_env()
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", _FUZZ.client.app)
SCHEMA.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE], max_examples=60
)


def test_openapi_documents_every_verb() -> None:
    doc = _FUZZ.client.get("/openapi.json").json()
    for verb in ("filter", "prioritize", "bind", "preempt"):
        operation = doc["paths"][f"/{verb}"]["post"]
        assert operation["requestBody"]["required"] is True
        assert {"200", "400", "413", "415"} <= set(operation["responses"])
    assert {"ExtenderArgsSchema", "ExtenderFilterResult", "HostPriority", "Pod"} <= set(
        doc["components"]["schemas"]
    )


@SCHEMA.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_openapi_fuzz_never_5xx(case: schemathesis.Case[Any]) -> None:
    response = case.call()
    assert response.status_code < 500, (response.status_code, response.text[:500])
    case.validate_response(response)
    _FUZZ.cache.check_invariants()
