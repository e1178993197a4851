"""Gangs through the extender: one reservation for the whole group, a bind barrier, expiry, restart."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import msgspec
import pytest
from extender_support import FakeApi, FakeClock, bind_now, gpu_pod, names_request, node_objects, synced_cache

from neuronetes import contracts as c
from neuronetes_extender.cache import GpuCache
from neuronetes_extender.config import ExtenderSettings
from neuronetes_extender.gangs import GangSpec, decode_reservation, encode_reservation, reservation_name
from neuronetes_extender.kube import KubeError
from neuronetes_extender.pods import PodInfo
from neuronetes_extender.reservations import GroupDirectory, ReservationStore
from neuronetes_extender.service import ExtenderService
from neuronetes_extender.watch import CustomObject
from neuronetes_extender.wire import ExtenderBindingArgs, ObjectMeta, Pod

pytestmark = pytest.mark.unit

NODES = {"dgx-a100-80gb": 2, "t4x4-pcie": 2}
DGX = {"ndgx-a100-80gb-0", "ndgx-a100-80gb-1"}


def gang_pod(
    name: str, gpus: int, group: str, size: int | None, locality: str = "same-node", **kw: Any
) -> dict[str, Any]:
    pod = gpu_pod(name, gpus, **kw)
    meta = pod["metadata"]
    if size is None:
        meta["labels"][c.LABEL_POD_GROUP_X_K8S] = group
    else:
        meta["labels"][c.LABEL_GANG] = group
        meta["labels"][c.LABEL_GANG_SIZE] = str(size)
    meta["annotations"] = {c.ANNOTATION_LOCALITY: locality}
    return pod


def as_pod(obj: Mapping[str, Any]) -> Pod:
    return msgspec.convert(obj, Pod)


class Setup:
    def __init__(self, ttl: float = 60.0, nodes: Mapping[str, int] = NODES) -> None:
        self.clock = FakeClock()
        settings = ExtenderSettings(gang_ttl_seconds=ttl, bind_wait_seconds=30)
        self.cache = synced_cache(node_objects(nodes), settings, clock=self.clock)
        self.api = FakeApi(cache=self.cache)
        self.service = ExtenderService(self.cache, self.api)
        self.names = [n["metadata"]["name"] for n in node_objects(nodes)]

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.api.add(pod)
        self.cache.upsert_pod(as_pod(pod))
        return pod

    def filter(self, pod: Mapping[str, Any]) -> Any:
        result, _ = self.service.filter(names_request(pod, self.names))
        return result

    def bind(self, pod: Mapping[str, Any], node: str) -> str:
        meta = pod["metadata"]
        out, _ = bind_now(
            self.service,
            ExtenderBindingArgs(
                pod_name=meta["name"], pod_namespace=meta["namespace"], pod_uid=meta["uid"], node=node
            ),
        )
        return out.error


def free_gpus(cache: GpuCache, node: str) -> int:
    usage = cache.gpu_usage(node)
    assert usage is not None
    return sum(1 for milli, _ in usage if milli == 1000)


def bind_all_async(
    s: Setup, pods: list[dict[str, Any]], node: str
) -> tuple[list[threading.Thread], dict[str, str]]:
    errors: dict[str, str] = {}

    def run(p: dict[str, Any]) -> None:
        errors[p["metadata"]["name"]] = s.bind(p, node)

    threads = [threading.Thread(target=run, args=(p,)) for p in pods]
    for t in threads:
        t.start()
    return threads, errors


def wait_for(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_first_member_reserves_the_whole_same_node_gang_and_the_barrier_binds_all() -> None:
    s = Setup()
    pods = [s.add(gang_pod(f"w{k}", 2, "train", 4)) for k in range(4)]
    first = s.filter(pods[0])
    (node,) = first.node_names
    assert node in DGX
    assert all("gang train" in r for r in first.failed_nodes.values())
    (group,) = s.cache.gangs()
    assert group.size == 4 and len(group.slots) == 4 and {sl.node for sl in group.slots} == {node}
    assert free_gpus(s.cache, node) == 0  # all 8 GPUs held for the gang
    # A lone pod cannot take the gang's GPUs meanwhile.
    lone = s.add(gpu_pod("lone", 8))
    (other,) = s.filter(lone).node_names
    assert other != node
    for p in pods[1:]:
        assert s.filter(p).node_names == [node]
    # Three binds wait at the barrier: nothing is bound before the fourth member arrives.
    threads, errors = bind_all_async(s, pods[:3], node)
    wait_for(lambda: len(s.cache.gangs()[0].arrived) == 3)
    time.sleep(0.1)
    assert [b for b in s.api.bindings if b[0].startswith("default/w")] == []
    assert s.bind(pods[3], node) == ""
    for t in threads:
        t.join(10)
    assert errors == {"w0": "", "w1": "", "w2": ""}
    gang_binds = [b for b in s.api.bindings if b[0].startswith("default/w")]
    assert len(gang_binds) == 4 and {b[1] for b in gang_binds} == {node}
    for _, _, written in gang_binds:
        doc = c.decode_assignment(written[c.ANNOTATION_ASSIGNED_GPUS])
        assert doc.gang is not None and (doc.gang.name, doc.gang.size) == ("train", 4)
    gpus = [
        g.uuid
        for _, _, a in gang_binds
        for ctr in c.decode_assignment(a[c.ANNOTATION_ASSIGNED_GPUS]).containers.values()
        for g in ctr.gpus
    ]
    assert len(gpus) == len(set(gpus)) == 8
    assert s.cache.gangs() == [] and s.cache.holds() == [h for h in s.cache.holds() if not h.group]
    s.cache.check_invariants()


def test_a_gang_that_fits_nowhere_holds_nothing_and_says_why() -> None:
    s = Setup()
    pods = [s.add(gang_pod(f"big{k}", 8, "huge", 3)) for k in range(3)]
    out = s.filter(pods[0])
    assert out.node_names == []
    assert set(out.failed_nodes) == set(s.names)
    assert all(r == "gang huge: no room for all 3 members same-node" for r in out.failed_nodes.values())
    assert s.cache.gangs() == [] and s.cache.holds() == []
    # Spread over nodes (locality any) the same gang fits: 2 DGX × 8 GPUs… but needs 24 GPUs: no.
    spread = [s.add(gang_pod(f"s{k}", 8, "spread", 2, locality="any")) for k in range(2)]
    assert len(s.filter(spread[0]).node_names) == 1
    (group,) = s.cache.gangs()
    assert {sl.node for sl in group.slots} == DGX
    s.cache.check_invariants()


def test_expiry_fails_the_waiting_binds_and_frees_the_gpus() -> None:
    s = Setup(ttl=20)
    pods = [s.add(gang_pod(f"e{k}", 2, "slow", 4)) for k in range(4)]
    (node,) = s.filter(pods[0]).node_names
    s.filter(pods[1])
    threads, errors = bind_all_async(s, pods[:2], node)
    wait_for(lambda: len(s.cache.gangs()[0].arrived) == 2)
    s.clock.now += 21
    for t in threads:
        t.join(10)
    assert all("expired or released" in e for e in errors.values()), errors
    assert s.api.bindings == []
    assert s.cache.gangs() == [] and s.cache.holds() == []
    assert free_gpus(s.cache, node) == 8
    # The members retry: a new reservation is made for the whole group again.
    assert s.filter(pods[2]).node_names != []
    assert len(s.cache.gangs()[0].slots) == 4
    s.cache.check_invariants()


def test_a_deleted_member_hands_its_slot_back_and_a_replacement_takes_it() -> None:
    s = Setup()
    pods = [s.add(gang_pod(f"d{k}", 2, "elastic", 4)) for k in range(4)]
    (node,) = s.filter(pods[0]).node_names
    s.filter(pods[1])
    s.api.delete("default", "d1")
    group = s.cache.gangs()[0]
    assert sum(1 for sl in group.slots if sl.pod) == 1
    new = s.add(gang_pod("d1b", 2, "elastic", 4))
    assert s.filter(new).node_names == [node]
    assert sum(1 for sl in s.cache.gangs()[0].slots if sl.pod) == 2
    s.cache.check_invariants()


def test_a_member_of_another_shape_gets_no_slot() -> None:
    s = Setup()
    a = s.add(gang_pod("a", 2, "mixed", 2))
    b = s.add(gang_pod("b", 1, "mixed", 2))
    s.filter(a)
    group = s.cache.gangs()[0]
    # Both pods were pending when the group was planned: each has a slot of its own shape.
    assert sorted(sl.request.gpus for sl in group.slots) == [1, 2]
    assert s.filter(b).node_names == [group.slots[0].node]
    late = s.add(gang_pod("c", 4, "mixed", 2))
    out = s.filter(late)
    assert out.node_names == [] and all("slots are taken" in r for r in out.failed_nodes.values())


def test_members_bound_before_the_reservation_count_toward_the_gang() -> None:
    s = Setup()
    pods = [gang_pod(f"p{k}", 1, "half", 3, locality="any") for k in range(3)]
    pods[0]["spec"]["nodeName"] = "nt4x4-pcie-0"
    pods[0]["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS] = ""
    del pods[0]["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS]
    for p in pods:
        s.add(p)
    s.filter(pods[1])
    (group,) = s.cache.gangs()
    assert len(group.slots) == 2 and group.prebound == 1
    s.filter(pods[2])
    threads, errors = bind_all_async(s, [pods[1]], group.slots[0].node)
    assert s.bind(pods[2], group.slots[1].node) == ""
    for t in threads:
        t.join(10)
    assert errors == {"p1": ""}
    assert s.cache.gangs() == []


def test_group_size_from_the_podgroup_watch() -> None:
    """Group objects come from the PodGroup watch (the directory has no API client to GET with)."""
    groups = GroupDirectory()
    key = c.LABEL_POD_GROUP_X_K8S
    known = PodInfo.from_pod(as_pod(gang_pod("k", 1, "known", None)))
    assert groups.spec_for(known, 120) == (
        "gang known: size unknown (PodGroup default/known not found (PodGroups not listed yet))"
    )
    podgroup = CustomObject(
        metadata=ObjectMeta(name="known", namespace="default"),
        spec={"minMember": 3, "scheduleTimeoutSeconds": 45},
    )
    groups.replace(key, [podgroup])
    assert groups.spec_for(known, 120) == GangSpec(size=3, ttl_seconds=45)
    missing = PodInfo.from_pod(as_pod(gang_pod("m", 1, "nope", None)))
    assert groups.spec_for(missing, 120) == "gang nope: size unknown (PodGroup default/nope not found)"
    labelled = PodInfo.from_pod(as_pod(gang_pod("l", 1, "lab", 5)))
    assert groups.spec_for(labelled, 120) == GangSpec(size=5, ttl_seconds=120)
    groups.upsert(key, msgspec.structs.replace(podgroup, spec={"minMember": 0}))
    assert groups.spec_for(known, 120) == (
        "gang known: size unknown (PodGroup default/known has no positive spec.minMember)"
    )
    groups.delete(key, podgroup)
    assert "not found" in str(groups.spec_for(known, 120))


def test_malformed_gang_labels_are_a_clear_filter_error() -> None:
    s = Setup()
    pod = gang_pod("bad", 1, "g", 2)
    pod["metadata"]["labels"][c.LABEL_GANG_SIZE] = "two"
    out = s.filter(s.add(pod))
    assert out.node_names == [] and all("gang-size" in r for r in out.failed_and_unresolvable_nodes.values())
    pod2 = gang_pod("bad2", 1, "g2", 2, locality="sideways")
    out = s.filter(s.add(pod2))
    assert all("locality" in r for r in out.failed_and_unresolvable_nodes.values())


class StoreApi:
    """The API calls `ReservationStore` makes, over a dict of objects."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, timeout: float | None = None
    ) -> bytes:
        with self.lock:
            if path.endswith("/status"):
                self.objects[path[: -len("/status")]]["status"] = body["status"]
            else:
                old = self.objects.get(path, {})
                self.objects[path] = dict(body) | ({"status": old["status"]} if "status" in old else {})
        return b"{}"

    def delete(self, path: str, *, timeout: float | None = None) -> bytes:
        with self.lock:
            if self.objects.pop(path, None) is None:
                raise KubeError(404, "not found")
        return b"{}"


def test_reservations_are_persisted_and_restored_after_a_restart() -> None:
    """Kill the extender mid-gang: the new one restores the slots; the gang completes; nothing is
    oversubscribed."""
    s = Setup()
    store_api = StoreApi()
    store = ReservationStore(s.cache, store_api)  # type: ignore[arg-type]
    assert not s.cache.synced  # until the reservations are listed (restored)
    s.cache.mark_synced("gangreservations")
    pods = [s.add(gang_pod(f"r{k}", 2, "resume", 4)) for k in range(4)]
    (node,) = s.filter(pods[0]).node_names
    s.filter(pods[1])
    store.flush()
    ((path, obj),) = store_api.objects.items()
    assert path.endswith("/gangreservations/" + reservation_name("resume"))
    assert obj["spec"]["size"] == 4 and len(obj["spec"]["members"]) == 4
    assert obj["status"] == {"phase": "Reserved", "boundMembers": 0}
    assert {m["name"] for m in obj["spec"]["members"]} >= {"r0", "r1"}
    assert all(len(m["gpuUUIDs"]) == 2 and m["node"] == node for m in obj["spec"]["members"])

    # The extender dies. A new one lists nodes and pods, then restores the reservation.
    s2 = Setup()
    s2.api = s.api
    for p in pods:
        s2.cache.upsert_pod(as_pod(p))
    s2.service = ExtenderService(s2.cache, s2.api)
    s2.api.cache = s2.cache
    listed = msgspec.json.decode(msgspec.json.encode(obj), type=CustomObject)  # as a list returns it
    restored = decode_reservation(listed.as_object("GangReservation"))
    assert s2.cache.restore_gangs([restored]) == 1
    (group,) = s2.cache.gangs()
    assert {sl.node for sl in group.slots} == {node} and free_gpus(s2.cache, node) == 0
    assert sorted(sl.pod_name for sl in group.slots if sl.pod) == ["r0", "r1"]
    # A lone pod cannot take the restored slots; the members complete the gang.
    assert s2.filter(s2.add(gpu_pod("lone", 8))).node_names != [node]
    for p in pods[2:]:
        assert s2.filter(p).node_names == [node]
    threads, errors = bind_all_async(s2, pods[:3], node)
    assert s2.bind(pods[3], node) == ""
    for t in threads:
        t.join(10)
    assert set(errors.values()) == {""}
    s2.cache.check_invariants()
    assert s2.cache.gangs() == []


def test_a_restored_reservation_past_its_deadline_frees_everything() -> None:
    s = Setup(ttl=30)
    store_api = StoreApi()
    store = ReservationStore(s.cache, store_api)  # type: ignore[arg-type]
    assert not s.cache.synced  # until the reservations are listed (restored)
    s.cache.mark_synced("gangreservations")
    pods = [s.add(gang_pod(f"x{k}", 2, "late", 4)) for k in range(4)]
    (node,) = s.filter(pods[0]).node_names
    store.flush()
    (obj,) = store_api.objects.values()
    restored = decode_reservation(obj)
    s2 = Setup()
    assert s2.cache.restore_gangs([restored]) == 1
    assert free_gpus(s2.cache, node) == 0
    s2.clock.now += 31
    assert s2.cache.gangs() == [] and free_gpus(s2.cache, node) == 8
    s2.cache.check_invariants()
    # An object whose deadline already passed is not restored at all.
    obj["spec"]["expiresAt"] = "2001-01-01T00:00:00Z"
    s3 = Setup()
    assert s3.cache.restore_gangs([decode_reservation(obj)]) == 0
    assert free_gpus(s3.cache, node) == 8


def test_ended_reservations_are_deleted_or_marked() -> None:
    s = Setup(ttl=10)
    store_api = StoreApi()
    store = ReservationStore(s.cache, store_api)  # type: ignore[arg-type]
    assert not s.cache.synced  # until the reservations are listed (restored)
    s.cache.mark_synced("gangreservations")
    pods = [s.add(gang_pod(f"z{k}", 1, "short", 2, locality="any")) for k in range(2)]
    s.filter(pods[0])
    store.flush()
    s.clock.now += 11
    s.cache.stats()
    store.flush()
    (obj,) = store_api.objects.values()
    assert obj["status"]["phase"] == "Expired"
    # A new reservation of the same group reuses the object; completing it deletes it.
    (node,) = s.filter(pods[0]).node_names
    node2 = s.filter(pods[1]).node_names[0]
    threads, errors = bind_all_async(s, [pods[0]], node)
    assert s.bind(pods[1], node2) == ""
    for t in threads:
        t.join(10)
    assert errors == {"z0": ""}
    store.flush()
    assert store_api.objects == {}


def test_encode_decode_round_trip_keeps_every_slot() -> None:
    s = Setup()
    pods = [s.add(gang_pod(f"q{k}", 2, "rt", 3)) for k in range(3)]
    s.filter(pods[0])
    (group,) = s.cache.gangs()
    specs = {n: spec for n in s.names if (spec := s.cache.node_spec(n)) is not None}
    back = decode_reservation(encode_reservation(group, specs))
    assert back.size == 3 and back.locality == group.locality and back.reservation_id == group.reservation_id
    assert [(sl.node, [g.gpu_index for g in sl.grants], sl.request.gpus) for sl in back.slots] == [
        (sl.node, [g.gpu_index for g in sl.grants], sl.request.gpus) for sl in group.slots
    ]
    assert abs(back.expires_wall - group.expires_wall) < 1.5


@pytest.mark.parametrize("n", [4])
def test_concurrent_gangs_never_oversubscribe(n: int) -> None:
    s = Setup(nodes={"dgx-a100-80gb": 3})
    gangs = [[s.add(gang_pod(f"g{i}-{k}", 2, f"g{i}", 4)) for k in range(4)] for i in range(n)]
    placed: dict[int, str] = {}
    for i, members in enumerate(gangs):
        out = s.filter(members[0])
        if out.node_names:
            placed[i] = out.node_names[0]
    assert len(placed) == 3  # three DGX nodes, one 4 × 2 same-node gang each
    threads = []
    results: list[dict[str, str]] = []
    for i, node in placed.items():
        for p in gangs[i][1:]:
            assert s.filter(p).node_names == [node]
        ts, e = bind_all_async(s, gangs[i], node)
        threads += ts
        results.append(e)
    for t in threads:
        t.join(10)
    errs = {k: v for e in results for k, v in e.items()}
    assert set(errs.values()) == {""} and len(errs) == 12
    s.cache.check_invariants()
    assert all(free_gpus(s.cache, node) == 0 for node in placed.values())


def test_native_kubernetes_gangs_get_no_barrier_of_ours() -> None:
    pod = gang_pod("native", 2, "wl", 4)
    pod["spec"]["workloadRef"] = {"name": "training", "podGroup": "workers"}
    info = PodInfo.from_pod(as_pod(pod))
    assert info.gang is None and info.gpu is not None
    s = Setup()
    s.add(pod)
    assert len(s.filter(pod).node_names) == 1 and s.cache.gangs() == []


def test_pods_rejected_while_a_reservation_held_the_gpus_are_nudged_when_it_ends() -> None:
    s = Setup(ttl=15, nodes={"dgx-a100-80gb": 1})
    patched: list[tuple[str, Any]] = []

    class PatchingStoreApi(StoreApi):
        def merge_patch(self, path: str, body: Any, timeout: float | None = None) -> bytes:
            patched.append((path, body))
            return b"{}"

    store_api = PatchingStoreApi()
    store = ReservationStore(s.cache, store_api)  # type: ignore[arg-type]
    s.cache.mark_synced("gangreservations")
    members = [s.add(gang_pod(f"n{k}", 4, "hog", 2)) for k in range(2)]
    assert s.filter(members[0]).node_names
    lone = s.add(gpu_pod("lone", 8))
    assert s.filter(lone).node_names == []
    assert s.cache.take_nudges() == []  # nothing was released yet
    s.clock.now += 16
    s.cache.tick()
    assert store.nudge() == 1
    ((path, body),) = patched
    assert (
        path == "/api/v1/namespaces/default/pods/lone"
        and "neuronetes.io/nudged-at" in body["metadata"]["annotations"]
    )
    assert s.cache.take_nudges() == []
    assert s.filter(lone).node_names == ["ndgx-a100-80gb-0"]


def test_a_standby_follows_the_active_extenders_reservations() -> None:
    """The standby's reservation watch hands every GangReservation to the cache's idempotent
    restore: it holds the active extender's slots (no GPU for anyone else there), and lets
    them go when the active one ends the group or deletes the object."""
    active, standby = Setup(), Setup()
    active_api = StoreApi()
    writer = ReservationStore(active.cache, active_api)  # type: ignore[arg-type]
    store = ReservationStore(standby.cache, StoreApi())  # type: ignore[arg-type]
    active.cache.mark_synced("gangreservations")
    standby.cache.mark_synced("gangreservations")
    pods = [active.add(gang_pod(f"h{k}", 2, "ha", 4)) for k in range(4)]
    for p in pods:
        standby.cache.upsert_pod(as_pod(p))
    (node,) = active.filter(pods[0]).node_names
    writer.flush()
    ((_, obj),) = active_api.objects.items()
    item = msgspec.json.decode(msgspec.json.encode(obj), type=CustomObject)
    before = free_gpus(standby.cache, node)
    store.upserted(item)
    store.upserted(item)  # the same object again (a resync): nothing changes
    store.listed([item])
    assert free_gpus(standby.cache, node) == before - 8
    assert len(standby.cache.gangs()) == 1
    assert standby.filter(standby.add(gpu_pod("lone", 8))).node_names != [node]
    ended = msgspec.structs.replace(item, status={"phase": "Expired", "boundMembers": 0})
    store.upserted(ended)
    assert standby.cache.gangs() == [] and free_gpus(standby.cache, node) == before
    store.upserted(item)  # reserved again (a new plan): held again; then its object is deleted
    assert len(standby.cache.gangs()) == 1
    store.deleted(item)
    assert standby.cache.gangs() == []
    standby.cache.check_invariants()
