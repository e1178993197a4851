"""The extender's GPU cache: inventory from Node objects, pods and their assignments, holds, node
changes, hot-reloaded settings, group reservations, and the list+watch reflector feeding it."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from extender_support import (
    FakeApi,
    FakeClock,
    bind_now,
    bound_with,
    gpu_pod,
    mig_pod,
    names_request,
    node_objects,
    shared_pod,
    synced_cache,
)

from neuronetes import contracts as c
from neuronetes.engine import PlacementEngine
from neuronetes.inventory import ClusterState
from neuronetes.model import GpuGrant, Locality, PodRequest
from neuronetes.nodes import NodeSpecError
from neuronetes.pricing import parse_price_table
from neuronetes.profiles import PROFILES, node_manifest
from neuronetes_extender.cache import GpuCache
from neuronetes_extender.config import ConfigError, ExtenderSettings, SettingsSource, load_settings
from neuronetes_extender.kube import KubeError
from neuronetes_extender.nodes import node_spec_from_node
from neuronetes_extender.pods import PodInfo
from neuronetes_extender.service import ExtenderService
from neuronetes_extender.watch import Reflector
from neuronetes_extender.wire import ExtenderBindingArgs, Node, NodeList, Pod

pytestmark = pytest.mark.unit


def as_node(obj: dict[str, Any]) -> Node:
    return msgspec.convert(obj, Node)


def as_pod(obj: dict[str, Any]) -> Pod:
    return msgspec.convert(obj, Pod)


def info(obj: dict[str, Any]) -> PodInfo:
    return PodInfo.from_pod(as_pod(obj))


def bound(
    pod: dict[str, Any], node: str, gpus: list[int] | None = None, *, model_uuid: bool = True
) -> dict[str, Any]:
    """`pod` bound to `node`, with an assignment of whole GPUs `gpus` to its container ``main``."""
    if gpus is None:
        out = copy.deepcopy(pod)
        out["spec"]["nodeName"] = node
        out["status"]["phase"] = "Running"
        return out
    return bound_with(
        pod, node, dict.fromkeys(gpus, (15360, 100)), uuid_node=None if model_uuid else "elsewhere"
    )


def free_gpus(cache: GpuCache, node: str) -> list[int]:
    usage = cache.gpu_usage(node)
    assert usage is not None
    return [j for j, (milli, _) in enumerate(usage) if milli == 1000]


# ---- nodes → NodeSpec ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_node_objects_of_every_profile_give_back_its_inventory(name: str) -> None:
    spec = PROFILES[name].node_spec(f"{name}-0", zone="local-1b", spot=name == "t4x4-pcie")
    derived = node_spec_from_node(node_manifest(spec))
    assert (derived.name, derived.cpu_milli, derived.memory_mib) == (
        spec.name,
        spec.cpu_milli,
        spec.memory_mib,
    )
    assert (derived.spot, derived.zone, derived.region, derived.schedulable) == (
        spec.spot,
        spec.zone,
        spec.region,
        spec.schedulable,
    )
    assert derived.price_per_hour == pytest.approx(spec.price_per_hour, abs=0.005)
    assert len(derived.gpus) == len(spec.gpus)
    for got, want in zip(derived.gpus, spec.gpus, strict=True):
        assert got.uuid == want.uuid == c.simulated_gpu_uuid(spec.name, want.index)
        assert (got.index, got.memory_mib, got.numa_node, got.socket) == (
            want.index,
            want.memory_mib,
            want.numa_node,
            want.socket,
        )
        assert (got.mig_enabled, got.nvlink_group, got.pcie_gen) == (
            want.mig_enabled,
            want.nvlink_group,
            want.pcie_gen,
        )
        assert got.nvlink_bandwidth_gbps == want.nvlink_bandwidth_gbps
        assert got.model.split("-")[0] == want.model.split("-")[0]


def test_gpu_feature_discovery_product_label_names_the_model() -> None:
    manifest = node_manifest(PROFILES["dgx-h100"].node_spec("h"))
    manifest["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    spec = node_spec_from_node(manifest)
    assert spec.gpus[0].model == "H100-80GB-HBM3" and spec.gpus[0].nvlink_bandwidth_gbps == 900.0


@pytest.mark.parametrize(
    ("prof", "where", "key", "value"),
    [
        ("t4x4-pcie", "labels", c.LABEL_GPU_COUNT, "eight"),
        ("t4x4-pcie", "labels", c.LABEL_PRICE_PER_HOUR, "-1"),
        ("a100-40gb-mig", "labels", c.LABEL_GPU_MEMORY, "lots"),  # MIG-only: per-GPU memory from it
        ("t4x4-pcie", "capacity", "cpu", "many"),
        ("t4x4-pcie", "capacity", c.RESOURCE_GPU, "1.5"),
        ("t4x4-pcie", "capacity", "memory", "1e30"),
    ],
)
def test_unreadable_nodes_are_refused_and_the_cache_places_nothing_there(
    prof: str, where: str, key: str, value: str
) -> None:
    (manifest,) = node_objects({prof: 1})
    if where == "labels":
        manifest["metadata"]["labels"][key] = value
    else:
        manifest["status"]["capacity"][key] = value
        manifest["status"]["allocatable"][key] = value
    with pytest.raises(NodeSpecError):
        node_spec_from_node(manifest)
    cache = synced_cache([manifest])
    spec = cache.node_spec(manifest["metadata"]["name"])
    assert spec is not None and not spec.schedulable and spec.gpus == ()
    decision = cache.filter(info(gpu_pod("p")), [manifest["metadata"]["name"]])
    assert decision.feasible == () and decision.unresolvable == {
        manifest["metadata"]["name"]: "node unschedulable"
    }


def test_cordoned_node_and_mig_gpus_of_an_unmodelled_model() -> None:
    t4, dgx = node_objects({"t4x4-pcie": 1, "dgx-a100-80gb": 1})
    dgx["spec"]["unschedulable"] = True
    t4["metadata"]["labels"][c.LABEL_GPU_COUNT] = "6"  # 2 GPUs in MIG mode a T4 cannot have
    spec = node_spec_from_node(t4)
    assert len(spec.gpus) == 4 and not any(g.mig_enabled for g in spec.gpus)
    cache = synced_cache([t4, dgx])
    decision = cache.filter(info(gpu_pod("p", 2)), ["nt4x4-pcie-0", "ndgx-a100-80gb-0"])
    assert decision.feasible == ("nt4x4-pcie-0",)
    assert decision.unresolvable == {"ndgx-a100-80gb-0": "node unschedulable"}


def test_a_drained_gpu_is_not_in_mig_mode_and_no_round_warns(caplog: pytest.LogCaptureFixture) -> None:
    """The agent offers only usable GPUs (``neuronetes.io/gpu`` drops by one for a drained GPU) and
    keeps the count label: the GPU held back is not in MIG mode. A T4 cannot be; an A100 that offers
    no MIG instance is not. A node that offers MIG instances keeps its MIG GPUs."""
    t4, a100, mig_node = node_objects({"t4x4-pcie": 1, "dgx-a100-80gb": 1, "a100-40gb-mig": 1})
    for node, whole in ((t4, "3"), (a100, "7")):
        node["status"]["capacity"][c.RESOURCE_GPU] = whole
        node["status"]["allocatable"][c.RESOURCE_GPU] = whole
    with caplog.at_level("DEBUG", logger="neuronetes.nodes"):
        for _ in range(3):  # every round reads the node again
            t4_spec, a100_spec = node_spec_from_node(t4), node_spec_from_node(a100)
    assert len(t4_spec.gpus) == 3 and not any(g.mig_enabled for g in t4_spec.gpus)
    assert len(a100_spec.gpus) == 7 and not any(g.mig_enabled for g in a100_spec.gpus)
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    assert all(g.mig_enabled for g in node_spec_from_node(mig_node).gpus)


# ---- settings -----------------------------------------------------------------------------------


def test_settings_files(tmp_path: Path) -> None:
    yaml_file = tmp_path / "s.yaml"
    yaml_file.write_text("policy: default\nweights:\n  cost: 0.5\nassumeTTLSeconds: 12\nfilterTopK: 2\n")
    s = load_settings(yaml_file)
    assert (s.weights, s.assume_ttl_seconds, s.filter_top_k) == ({"cost": 0.5}, 12.0, 2)
    (tmp_path / "empty.yml").write_text("")
    assert load_settings(tmp_path / "empty.yml") == ExtenderSettings()
    json_file = tmp_path / "s.json"
    for bad in (
        {"polcy": "default"},
        {"policy": "nope"},
        {"weights": {"nope": 1.0}},
        {"weights": {"cost": -1}},
        {"assumeTTLSeconds": 0},
        {"filterTopK": 0},
        {"maxBodyBytes": 10},
    ):
        json_file.write_text(json.dumps(bad))
        with pytest.raises(ConfigError):
            load_settings(json_file)
    json_file.write_text("{")
    with pytest.raises(ConfigError):
        load_settings(json_file)
    with pytest.raises(ConfigError):
        load_settings(tmp_path / "missing.json")


def test_settings_are_hot_reloaded_and_bad_files_ignored(tmp_path: Path) -> None:
    path = tmp_path / "extender.json"
    path.write_text(json.dumps({"weights": {"cost": 0.15}, "assumeTTLSeconds": 30}))
    clock = FakeClock()
    source = SettingsSource(path, clock=clock)
    cache = synced_cache(node_objects({"t4x4-pcie": 2}), clock=clock)
    cache.settings = source
    assert cache.policy.weights["cost"] == 0.15
    path.write_text(json.dumps({"weights": {"cost": 3.0, "fgd": 0}, "assumeTTLSeconds": 5}))
    assert cache.policy.weights["cost"] == 0.15  # checked at most once a second
    clock.now += 1.5
    policy = cache.policy
    assert policy.weights["cost"] == 3.0 and "fgd" not in policy.weights
    decision = cache.filter(info(gpu_pod("p")), ["nt4x4-pcie-0", "nt4x4-pcie-1"])
    assert decision.hold is not None and decision.hold.expires_at == clock.now + 5
    path.write_text("{not json")
    clock.now += 1.5
    assert cache.policy.weights["cost"] == 3.0 and source.errors == 1


# ---- pods, assignments, holds -------------------------------------------------------------------------


def test_bound_pods_hold_their_assigned_gpus_until_they_finish_or_go() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    node = "nt4x4-pcie-0"
    a = bound(gpu_pod("a", 2), node, [1, 3])
    cache.upsert_pod(as_pod(a))
    assert free_gpus(cache, node) == [0, 2]
    stale = copy.deepcopy(a)
    stale["spec"].pop("nodeName")  # an older event: nodeName is write-once
    cache.upsert_pod(as_pod(stale))
    assert free_gpus(cache, node) == [0, 2]
    done = copy.deepcopy(a)
    done["status"]["phase"] = "Succeeded"
    cache.upsert_pod(as_pod(done))
    assert free_gpus(cache, node) == [0, 1, 2, 3]
    b = bound(gpu_pod("b", 1), node, [2])
    cache.upsert_pod(as_pod(b))
    assert free_gpus(cache, node) == [0, 1, 3]
    cache.delete_pod(as_pod(b))
    assert free_gpus(cache, node) == [0, 1, 2, 3]
    cache.check_invariants()


def test_gpu_pods_bound_without_a_usable_assignment_still_hold_gpus() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    node = "nt4x4-pcie-0"
    foreign = bound(gpu_pod("foreign", 2), node)  # no annotation at all
    cache.upsert_pod(as_pod(foreign))
    cache.upsert_pod(as_pod(bound(gpu_pod("odd", 1), node, [0], model_uuid=False)))  # unknown UUID
    free = free_gpus(cache, node)
    assert len(free) == 1
    foreign["status"]["conditions"] = [{"type": "Ready", "status": "True"}]  # a status-only update
    cache.upsert_pod(as_pod(foreign))
    assert free_gpus(cache, node) == free
    stats = cache.stats()
    assert stats.unaccounted_pods == 0 and stats.conflicts == 0
    cache.check_invariants()


def test_double_booked_gpus_are_reported_not_oversubscribed() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    node = "nt4x4-pcie-0"
    cache.upsert_pod(as_pod(bound(gpu_pod("first", 1), node, [0])))
    second = bound(gpu_pod("second", 1), node, [0])
    cache.upsert_pod(as_pod(second))
    cache.upsert_pod(as_pod(second))  # the same pod again: still one conflict
    stats = cache.stats()
    assert stats.conflicts == 1 and stats.unaccounted_pods == 1
    cache.check_invariants()


def test_a_bound_pod_takes_precedence_over_a_hold_on_its_gpus() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    node = "nt4x4-pcie-0"
    waiting = info(gpu_pod("waiting", 4))
    assert cache.filter(waiting, [node]).feasible == (node,)
    cache.upsert_pod(as_pod(bound(gpu_pod("elsewhere-bound", 1), node, [2])))
    assert cache.hold_of(waiting.id) is None  # the API server is the truth
    assert cache.stats().conflicts == 0
    cache.check_invariants()


def test_holds_expire_after_their_ttl() -> None:
    clock = FakeClock()
    cache = synced_cache(node_objects({"t4x4-pcie": 1}), ExtenderSettings(assume_ttl_seconds=10), clock=clock)
    node = "nt4x4-pcie-0"
    pod = info(shared_pod("s", 4096, 50))
    hold = cache.filter(pod, [node]).hold
    assert hold is not None and hold.expires_at == clock.now + 10
    clock.now += 9.9
    cache.check_invariants()
    assert cache.hold_of(pod.id) is not None
    clock.now += 0.2
    cache.check_invariants()
    assert cache.hold_of(pod.id) is None and cache.gpu_usage(node) == [(1000, 15360)] * 4


def test_a_retried_filter_replaces_the_pods_hold() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    pod = info(gpu_pod("again", 3))
    for _ in range(3):
        assert cache.filter(pod, ["nt4x4-pcie-0"]).feasible == ("nt4x4-pcie-0",)
    assert len(cache.holds()) == 1
    cache.check_invariants()


def test_node_changes_rebuild_and_replay_holds_and_pods() -> None:
    objs = node_objects({"t4x4-pcie": 2})
    cache = synced_cache(objs)
    n0, n1 = (o["metadata"]["name"] for o in objs)
    cache.upsert_pod(as_pod(bound(gpu_pod("pinned", 1), n1, [3])))
    pod = info(gpu_pod("held", 2))
    hold = cache.filter(pod, [n1]).hold
    assert hold is not None
    cache.delete_node(n1)  # gone: the hold waits, dormant; the pod is counted when the node is back
    cache.check_invariants()
    assert cache.hold_of(pod.id) is not None and cache.gpu_usage(n1) is None
    cache.upsert_node(as_node(objs[1]))
    cache.check_invariants()
    assert free_gpus(cache, n1) == [j for j in range(4) if j not in {3, *(g.gpu_index for g in hold.grants)}]
    # Relabelling a node (a price change) rebuilds too; unchanged heartbeats do not.
    rebuilds = cache.stats().rebuilds
    beat = copy.deepcopy(objs[0])
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:01:00Z"
    cache.upsert_node(as_node(beat))
    cache.check_invariants()
    assert cache.stats().rebuilds == rebuilds
    beat["metadata"]["labels"][c.LABEL_PRICE_PER_HOUR] = "9.99"
    cache.upsert_node(as_node(beat))
    cache.check_invariants()
    assert cache.stats().rebuilds == rebuilds + 1
    assert n0 in {h.node for h in cache.holds()} or cache.hold_of(pod.id) is not None


def test_a_price_table_change_prices_every_node_again_and_the_label_still_wins() -> None:
    objs = node_objects({"t4x4-pcie": 3})
    for obj in objs:
        labels = obj["metadata"]["labels"]
        labels["node.kubernetes.io/instance-type"] = "g4dn.12xlarge"
        labels["karpenter.sh/capacity-type"] = "on-demand"
    del objs[0]["metadata"]["labels"][c.LABEL_PRICE_PER_HOUR]
    del objs[1]["metadata"]["labels"][c.LABEL_PRICE_PER_HOUR]
    objs[1]["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "g4dn.metal"  # not in the table
    cache = synced_cache(objs)
    table, unknown, labelled = (o["metadata"]["name"] for o in objs)

    def price(name: str) -> float | None:
        spec = cache.node_spec(name)
        assert spec is not None
        return spec.price_per_hour

    assert price(table) is None and price(unknown) is None
    label = price(labelled)
    assert label is not None
    # Unknown prices rank with the dearest known node: never as free.
    pod = info(gpu_pod("p", 1))
    assert cache.explain(pod, table)["cost"] == cache.explain(pod, unknown)["cost"] == 0.0
    rebuilds = cache.stats().rebuilds
    cache.set_price_table(parse_price_table("g4dn.12xlarge: {on-demand: 3.91, spot: 1.56}"))
    cache.check_invariants()
    assert price(table) == 3.91 and price(unknown) is None and price(labelled) == label
    assert cache.stats().rebuilds == rebuilds + 1
    cost = {name: cache.explain(pod, name)["cost"] for name in (table, unknown, labelled)}
    assert cost[unknown] == 0.0 and cost[table] == pytest.approx(1 - 3.91 / max(3.91, label))
    # A node that joins later is priced by the table in force.
    late = node_objects({"t4x4-pcie": 1}, prefix="late-")[0]
    late["metadata"]["labels"].pop(c.LABEL_PRICE_PER_HOUR)
    late["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "g4dn.12xlarge"
    late["metadata"]["labels"][c.LABEL_SPOT] = "true"
    cache.upsert_node(as_node(late))
    assert price(late["metadata"]["name"]) == 1.56


def test_a_bind_to_a_node_that_left_is_refused() -> None:
    objs = node_objects({"t4x4-pcie": 1})
    cache = synced_cache(objs)
    api = FakeApi(cache=cache)
    service = ExtenderService(cache, api)
    pod = gpu_pod("p", 1)
    api.add(pod)
    result, _ = service.filter(names_request(pod, ["nt4x4-pcie-0"]))
    assert result.node_names == ["nt4x4-pcie-0"]
    cache.replace_nodes([])
    out, _ = bind_now(
        service,
        ExtenderBindingArgs(
            pod_name="p", pod_namespace="default", pod_uid=pod["metadata"]["uid"], node="nt4x4-pcie-0"
        ),
    )
    assert "not in the gpu inventory" in out.error and api.bindings == []
    cache.check_invariants()


def test_relist_forgets_pods_that_are_gone() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    node = "nt4x4-pcie-0"
    keep = bound(gpu_pod("keep", 1), node, [0])
    gone = bound(gpu_pod("gone", 1), node, [1])
    cache.replace_pods([as_pod(keep), as_pod(gone)])
    assert free_gpus(cache, node) == [2, 3]
    cache.replace_pods([as_pod(keep), as_pod(mig_pod("pending", "1g.5gb"))])
    assert free_gpus(cache, node) == [1, 2, 3]
    assert cache.stats().pending_gpu_pods == 1
    cache.check_invariants()


def test_group_reservations_are_all_or_nothing_and_expire() -> None:
    clock = FakeClock()
    cache = synced_cache(node_objects({"dgx-a100-80gb": 2, "t4x4-pcie": 2}), clock=clock)
    members = [PodRequest(name=f"m{k}", gpus=2) for k in range(4)]
    holds = cache.reserve_group("g1", members, Locality.SAME_NODE, ttl=30)
    assert holds is not None and len(holds) == 4 and len({h.node for h in holds}) == 1
    assert {h.node for h in holds} <= {"ndgx-a100-80gb-0", "ndgx-a100-80gb-1"}
    cache.check_invariants()
    too_big = [PodRequest(name=f"x{k}", gpus=4) for k in range(3)]
    assert cache.reserve_group("g2", too_big, Locality.SAME_NODE) is None
    assert {h.group for h in cache.holds()} == {"g1"}
    assert cache.release_gang("g1") == 4 and cache.holds() == []
    assert cache.reserve_group("g3", members, Locality.SAME_NODE, ttl=30) is not None
    clock.now += 31
    cache.check_invariants()
    assert cache.holds() == []


def test_prioritize_gives_the_engines_scores() -> None:
    objs = node_objects({"dgx-a100-80gb": 2, "t4x4-pcie": 3, "cpu-only": 1})
    cache = synced_cache(objs)
    node = "nt4x4-pcie-1"
    cache.upsert_pod(as_pod(bound(gpu_pod("busy", 2), node, [0, 1])))
    names = [o["metadata"]["name"] for o in objs]
    pod = info(shared_pod("s", 4096, 30))
    # The same engine over the same inventory and allocation, built independently.
    specs = sorted((node_spec_from_node(o) for o in objs), key=lambda s: s.name)
    engine = PlacementEngine(ClusterState(specs))
    i = engine.state.index[node]
    engine.state.allocate("busy", i, 100, 128, [GpuGrant(0, 1000, 15360), GpuGrant(1, 1000, 15360)])
    want = engine.prioritize(
        pod.request, [engine.state.index[n] for n in [*names, "ghost"] if n in engine.state.index]
    )
    got = cache.prioritize(pod, [*names, "ghost"])
    assert got[:-1] == want and got[-1] == 0
    assert max(got) == 10 and got[names.index("ncpu-only-0")] == 0


def test_readiness_needs_both_first_lists() -> None:
    cache = GpuCache()
    readiness = [cache.synced]
    cache.mark_synced("nodes")
    readiness.append(cache.synced)
    cache.mark_synced("pods")
    readiness.append(cache.synced)
    assert readiness == [False, False, True] and cache.sync_age("pods") < 1


# ---- the reflector ---------------------------------------------------------------------------------


class FakeStream:
    def __init__(self, lines: list[bytes], done: threading.Event | None = None) -> None:
        self.lines = lines
        self.done = done

    def __enter__(self) -> FakeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.done is not None:
            self.done.set()

    def __iter__(self) -> Iterator[bytes]:
        yield from self.lines
        if self.done is not None:
            self.done.wait(10)


class FakeKube:
    """Serves list pages and watch streams from scripts, recording every request."""

    def __init__(self, pages: list[list[bytes]], streams: list[list[bytes]]) -> None:
        self.pages = pages
        self.streams = streams
        self.gets: list[list[tuple[str, str]]] = []
        self.watches: list[list[tuple[str, str]]] = []
        self.idle = threading.Event()

    def get(self, path: str, query: list[tuple[str, str]], *, timeout: float | None = None) -> bytes:
        self.gets.append(list(query))
        token = dict(query).get("continue", "")
        listing = self.pages[0]
        page = int(token or 0)
        if page == len(listing) - 1:
            self.pages.pop(0)
        return listing[page]

    def watch(self, path: str, query: list[tuple[str, str]], *, read_timeout: float) -> FakeStream:
        self.watches.append(list(query))
        if self.streams:
            return FakeStream(self.streams.pop(0))
        return FakeStream([], self.idle)


def node_list(items: list[dict[str, Any]], rv: str, cont: str = "") -> bytes:
    return json.dumps({"metadata": {"resourceVersion": rv, "continue": cont}, "items": items}).encode()


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


def test_reflector_lists_pages_watches_and_relists_on_410() -> None:
    a, b, extra = node_objects({"t4x4-pcie": 3})
    changed = copy.deepcopy(b)
    changed["spec"]["unschedulable"] = True
    fake = FakeKube(
        pages=[
            [node_list([a], "10", cont="1"), node_list([b], "11")],
            [node_list([a, extra], "50")],
            [node_list([extra, changed], "60")],
        ],
        streams=[
            [
                event("ADDED", extra),
                event("MODIFIED", changed),
                event("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "20"}}),
            ],
            [b"not json at all"],
            [event("DELETED", a), event("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})],
        ],
    )
    cache = GpuCache()
    seen: list[tuple[str, str]] = []
    synced = threading.Event()

    def upsert(node: Node) -> None:
        seen.append(("upsert", node.metadata.name))
        cache.upsert_node(node)

    def delete(node: Node) -> None:
        seen.append(("delete", node.metadata.name))
        cache.delete_node(node.metadata.name)

    reflector: Reflector[Node] = Reflector(
        fake,  # type: ignore[arg-type]
        "nodes",
        "/api/v1/nodes",
        Node,
        NodeList,
        on_replace=cache.replace_nodes,
        on_upsert=upsert,
        on_delete=delete,
        on_synced=synced.set,
        on_heard=lambda: cache.touch("nodes"),
        max_backoff=0.01,
    )
    reflector.start()
    try:
        deadline = time.monotonic() + 10
        while len(fake.watches) < 4:
            assert time.monotonic() < deadline, (reflector.relists, fake.watches)
            time.sleep(0.01)
    finally:
        reflector.stop()
    assert synced.is_set() and reflector.relists == 3
    # The first list in two pages; each watch from the latest resourceVersion: the list's, then the
    # bookmark's (the stream ended); an undecodable line and 410 Gone each lead to a relist.
    assert fake.gets[0] == [("limit", "500")] and fake.gets[1] == [("limit", "500"), ("continue", "1")]
    assert [dict(q)["resourceVersion"] for q in fake.watches] == ["11", "20", "50", "60"]
    assert all(dict(q)["allowWatchBookmarks"] == "true" for q in fake.watches)
    assert seen == [("upsert", "nt4x4-pcie-2"), ("upsert", "nt4x4-pcie-1"), ("delete", "nt4x4-pcie-0")]
    spec = cache.node_spec("nt4x4-pcie-1")
    assert cache.node_spec("nt4x4-pcie-0") is None and spec is not None and not spec.schedulable


def test_kube_errors_say_whether_the_request_may_have_taken_effect() -> None:
    assert KubeError(0, "reset").ambiguous and KubeError(503, "x").ambiguous and KubeError(429, "x").ambiguous
    assert not KubeError(409, "conflict").ambiguous and not KubeError(403, "forbidden").ambiguous
