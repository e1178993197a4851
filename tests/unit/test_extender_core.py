"""The extender's decision core (issue 9): a ledger tenants cannot write, bind only what was
decided, nudges on hold expiry, bounded tenant gang hints, one GPU model per gang, the
non-blocking barrier API, explanations, named invariant errors, idempotent restore."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import msgspec
import pytest
from extender_support import (
    FakeApi,
    FakeClock,
    bind_now,
    bound_with,
    cpu_pod,
    gpu_pod,
    names_request,
    node_objects,
    planned,
    shared_pod,
    synced_cache,
)

from neuronetes import contracts as c
from neuronetes.assignment import ResourceRequestError, pod_gpu_request
from neuronetes_extender.cache import BindPlan, BindRefused, CacheInvariantError, GpuCache
from neuronetes_extender.config import ExtenderSettings
from neuronetes_extender.gangs import GangSpec, decode_reservation, encode_reservation
from neuronetes_extender.pods import PodInfo
from neuronetes_extender.service import ExtenderService
from neuronetes_extender.wire import ExtenderBindingArgs, Node, Pod

pytestmark = pytest.mark.unit

T4 = "nt4x4-pcie-0"


def as_pod(obj: dict[str, Any]) -> Pod:
    return msgspec.convert(obj, Pod)


def info(obj: dict[str, Any]) -> PodInfo:
    return PodInfo.from_pod(as_pod(obj))


def whole_free(cache: GpuCache, node: str) -> list[int]:
    usage = cache.gpu_usage(node)
    assert usage is not None
    return [j for j, (milli, _) in enumerate(usage) if milli == 1000]


def annotate(pod: dict[str, Any], node: str, gpus: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """`pod` bound to `node` with an assignment naming GPU j -> (memoryMiB, computePercent)."""
    return bound_with(pod, node, gpus)


class Env:
    def __init__(self, nodes: dict[str, int] | None = None, **settings: Any) -> None:
        self.clock = FakeClock()
        objs = node_objects(nodes or {"t4x4-pcie": 1})
        self.names = [o["metadata"]["name"] for o in objs]
        self.cache = synced_cache(objs, ExtenderSettings(**settings), clock=self.clock)
        self.api = FakeApi(cache=self.cache)
        self.service = ExtenderService(self.cache, self.api)

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.api.add(pod)
        self.cache.upsert_pod(as_pod(pod))
        return pod

    def filter(self, pod: dict[str, Any], names: list[str] | None = None) -> Any:
        out, _ = self.service.filter(names_request(pod, names or self.names))
        return out

    def bind(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        out, _ = bind_now(
            self.service,
            ExtenderBindingArgs(
                pod_name=meta["name"], pod_namespace=meta["namespace"], pod_uid=meta["uid"], node=node
            ),
        )
        return str(out.error)


# ---- a ledger tenants cannot write ---------------------------------------------------------------
def test_an_assignment_changed_after_bind_frees_nothing() -> None:
    env = Env()
    pod = env.add(gpu_pod("tenant", 1))
    (node,) = env.filter(pod).node_names
    assert env.bind(pod, node) == ""
    held = set(range(4)) - set(whole_free(env.cache, node))
    (gpu,) = held
    # The tenant patches its annotation to name another GPU (and then removes it): ignored.
    other = (gpu + 1) % 4
    patched = annotate(env.api.pods[("default", "tenant")], node, {other: (15360, 100)})
    env.cache.upsert_pod(as_pod(patched))
    assert set(range(4)) - set(whole_free(env.cache, node)) == {gpu}
    gone = copy.deepcopy(patched)
    gone["metadata"]["annotations"] = {}
    env.cache.upsert_pod(as_pod(gone))
    assert set(range(4)) - set(whole_free(env.cache, node)) == {gpu}
    assert env.cache.stats().ignored_assignment_changes == 2
    # The next pods never get that GPU.
    for k in range(3):
        nxt = env.add(gpu_pod(f"next{k}", 1))
        assert env.filter(nxt).node_names == [node]
        hold = env.cache.hold_of(info(nxt).id)
        assert hold is not None and hold.grants[0].gpu_index != gpu
    assert env.filter(env.add(gpu_pod("one-too-many", 1))).node_names == []
    env.cache.check_invariants()


def test_a_restarted_cache_trusts_the_first_assignment_it_sees_and_not_later_changes() -> None:
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    first = annotate(gpu_pod("p", 1), T4, {2: (15360, 100)})
    cache.upsert_pod(as_pod(first))
    assert whole_free(cache, T4) == [0, 1, 3]
    cache.upsert_pod(as_pod(annotate(first, T4, {0: (15360, 100)})))
    assert whole_free(cache, T4) == [0, 1, 3] and cache.stats().ignored_assignment_changes == 1


def test_a_forged_annotation_is_counted_at_what_it_claims() -> None:
    # A pod created with spec.nodeName preset: it asks for 1 MiB / 1 % and claims a whole GPU.
    cache = synced_cache(node_objects({"t4x4-pcie": 1}))
    forged = annotate(shared_pod("forged", 1, 1), T4, {1: (15360, 100)})
    cache.upsert_pod(as_pod(forged))
    assert cache.gpu_usage(T4)[1] == (0, 0)  # type: ignore[index]
    # Claiming less than the request needs counts the request.
    small = annotate(shared_pod("small", 8192, 50), T4, {2: (10, 1)})
    cache.upsert_pod(as_pod(small))
    assert cache.gpu_usage(T4)[2] == (500, 15360 - 8192)  # type: ignore[index]
    # A preset nodeName without any annotation: the GPUs its request needs are counted.
    preset = copy.deepcopy(gpu_pod("preset", 2))
    preset["spec"]["nodeName"] = T4
    cache.upsert_pod(as_pod(preset))
    assert whole_free(cache, T4) == []
    assert cache.stats().unaccounted_pods == 0
    cache.check_invariants()


# ---- bind only what was decided ------------------------------------------------------------------
def test_bind_of_an_unfiltered_gpu_pod_or_another_schedulers_pod_is_refused() -> None:
    env = Env()
    pod = env.add(gpu_pod("curl", 4))
    assert "no gpus held for it on " + T4 in env.bind(pod, T4)
    foreign = gpu_pod("other", 1)
    foreign["spec"]["schedulerName"] = "default-scheduler"
    env.add(foreign)
    assert env.filter(foreign).node_names == [T4]
    assert "schedulerName 'default-scheduler' is not neuronetes-scheduler" in env.bind(foreign, T4)
    assert env.api.bindings == []


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    """``spec.affinity`` with required node affinity `terms`."""
    selector = {"nodeSelectorTerms": list(terms)}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


@pytest.mark.parametrize(
    ("patch", "refused"),
    [
        ({"nodeSelector": {"gpu": "none"}}, "nodeSelector (gpu=none)"),
        ({"tolerations": []}, "taint kwok.x-k8s.io/node=fake:NoSchedule"),
        ({"tolerations": [{"operator": "Exists"}]}, None),
        (required({"matchExpressions": [expr("zone", "In", "x")]}), "required node affinity"),
        (
            required(
                {"matchExpressions": [expr("zone", "Exists")]},
                {
                    "matchFields": [expr("metadata.name", "NotIn", "x")],
                    "matchExpressions": [expr("zone", "DoesNotExist")],
                },
            ),
            None,
        ),
        (required({"matchExpressions": [expr("cores", "Gt", "8")]}), None),
        (required({"matchExpressions": [expr("cores", "Lt", "8")]}), "required node affinity"),
        (required({"matchFields": [expr("metadata.name", "In", "elsewhere")]}), "required node affinity"),
    ],
)
def test_a_pod_without_gpus_binds_only_where_its_rules_allow(
    patch: dict[str, Any], refused: str | None
) -> None:
    objs = node_objects({"cpu-only": 1})
    objs[0]["metadata"]["labels"]["cores"] = "16"
    env = Env()
    env.cache.replace_nodes([msgspec.convert(o, Node) for o in objs])
    node = objs[0]["metadata"]["name"]
    pod = cpu_pod("web")
    pod["spec"].update(patch)
    env.api.add(pod)
    error = env.bind(pod, node)
    if refused is None:
        assert error == "" and env.api.bindings == [("default/web", node, {})]
    else:
        assert refused in error and env.api.bindings == []


def test_a_gpu_pod_held_by_a_filter_still_needs_the_nodes_rules_at_bind() -> None:
    # The attack of issue 9: a made-up /filter holds a DGX for an 8-GPU pod whose nodeSelector
    # matches no node (kube-scheduler never offered it that node); its /bind is refused.
    env = Env({"dgx-a100-80gb": 1})
    pod = gpu_pod("sneaky", 8)
    pod["spec"]["nodeSelector"] = {"pool": "nowhere"}
    env.add(pod)
    (node,) = env.filter(pod).node_names
    assert "does not match the pod's nodeSelector (pool=nowhere)" in env.bind(pod, node)
    assert env.api.bindings == []


# ---- nudges when holds end ------------------------------------------------------------------------
def test_an_expired_hold_nudges_the_pods_it_blocked() -> None:
    env = Env(assume_ttl_seconds=10)
    hog = env.add(gpu_pod("hog", 4))
    assert env.filter(hog).node_names == [T4]  # then never binds (a made-up filter)
    waiting = env.add(gpu_pod("waiting", 1))
    assert env.filter(waiting).node_names == []
    assert env.cache.take_nudges() == []
    env.filter(hog)  # filtered again: its GPUs are re-held, nothing was freed
    assert env.cache.take_nudges() == []
    env.clock.now += 11
    assert env.cache.take_nudges() == [("default", "waiting")]
    assert env.cache.take_nudges() == []
    assert env.filter(waiting).node_names == [T4]


def test_a_released_hold_nudges_too() -> None:
    env = Env()
    hog = env.add(gpu_pod("hog", 4))
    (node,) = env.filter(hog).node_names
    env.api.fail_next(403, "forbidden")
    waiting = env.add(gpu_pod("waiting", 1))
    assert env.filter(waiting).node_names == []
    assert "forbidden" in env.bind(hog, node)  # a definite failure releases the hold
    assert env.cache.take_nudges() == [("default", "waiting")]


# ---- tenant gang hints are bounded ----------------------------------------------------------------
def gang(name: str, gpus: int, group: str, size: int, **annotations: str) -> dict[str, Any]:
    pod = gpu_pod(name, gpus)
    pod["metadata"]["labels"].update({c.LABEL_GANG: group, c.LABEL_GANG_SIZE: str(size)})
    pod["metadata"]["annotations"] = dict(annotations)
    return pod


def test_gang_size_and_timeout_above_the_limits_are_refused_before_planning() -> None:
    env = Env(max_gang_size=16, max_gang_timeout_seconds=600)
    huge = env.add(gang("huge", 1, "huge", 10_000_000))
    out = env.filter(huge)
    assert out.node_names == [] and env.cache.gangs() == [] and env.cache.holds() == []
    (reason,) = set(out.failed_and_unresolvable_nodes.values())
    assert c.LABEL_GANG_SIZE in reason and "10000000" in reason and "maxGangSize=16" in reason
    pinned = env.add(gang("pinned", 1, "pin", 2, **{c.ANNOTATION_GANG_TIMEOUT: "86400"}))
    (reason,) = set(env.filter(pinned).failed_and_unresolvable_nodes.values())
    assert c.ANNOTATION_GANG_TIMEOUT in reason and "maxGangTimeoutSeconds=600" in reason
    assert env.cache.holds() == []
    ok = env.add(gang("ok", 1, "ok", 2, **{c.ANNOTATION_GANG_TIMEOUT: "600"}))
    assert env.filter(ok).node_names == [T4]
    assert ExtenderSettings().max_gang_size == 1024 and ExtenderSettings().max_gang_timeout_seconds == 3600


# ---- duplicate container names -----------------------------------------------------------------
def test_two_containers_of_one_name_are_refused() -> None:
    pod = gpu_pod("twins", 1)
    pod["spec"]["initContainers"] = [copy.deepcopy(pod["spec"]["containers"][0])]
    with pytest.raises(ResourceRequestError, match="container name 'main' is used twice"):
        pod_gpu_request(pod)
    env = Env()
    env.add(pod)
    out = env.filter(pod)
    assert out.node_names == []
    assert "'main' is used twice" in out.failed_and_unresolvable_nodes[T4]


# ---- a gang shares one GPU model ----------------------------------------------------------------
def test_a_gang_without_locality_stays_on_one_gpu_model() -> None:
    env = Env({"t4x4-pcie": 1, "dgx-a100-80gb": 1})
    pods = [env.add(gang(f"w{k}", 2, "mixed", 4, **{c.ANNOTATION_LOCALITY: "any"})) for k in range(4)]
    assert env.filter(pods[0]).node_names
    (group,) = env.cache.gangs()
    models = {env.cache.node_spec(s.node).gpu_model for s in group.slots}  # type: ignore[union-attr]
    assert len(models) == 1
    # 8 x 2 GPUs fit only across both models: refused rather than split.
    env.cache.release_gang(group.id)
    big = [env.add(gang(f"b{k}", 2, "big", 6, **{c.ANNOTATION_LOCALITY: "any"})) for k in range(6)]
    out = env.filter(big[0])
    assert out.node_names == [] and "no room for all 6 members" in next(iter(out.failed_nodes.values()))


# ---- the non-blocking barrier ----------------------------------------------------------------------
def test_gang_arrive_waits_then_opens_and_tells_the_listener() -> None:
    env = Env({"dgx-a100-80gb": 1}, gang_ttl_seconds=60)
    told: list[str] = []
    env.cache.set_barrier_listener(told.append)
    pods = [env.add(gang(f"m{k}", 2, "job", 3)) for k in range(3)]
    node = env.filter(pods[0]).node_names[0]
    plans = []
    for p in pods:
        assert env.filter(p).node_names == [node]
        plans.append(planned(env.cache.prepare_bind(info(p).id, node)))
    told.clear()
    first = env.cache.gang_arrive(plans[0])
    assert (first.status, first.arrived, first.size) == ("wait", 1, 3) and "1 of 3" in first.reason
    assert first.deadline == env.clock.now + 60
    assert told == ["default/job"]
    assert env.cache.gang_arrive(plans[0]).arrived == 1  # idempotent
    assert env.cache.gang_arrive(plans[1]).status == "wait"
    last = env.cache.gang_arrive(plans[2])
    assert last.status == "open" and last.arrived == 3
    assert env.cache.gang_arrive(plans[0]).status == "open"
    assert plans[0].explanation is not None and plans[0].explanation.node == node


def test_fail_waiting_binds_fails_every_waiting_member() -> None:
    env = Env({"dgx-a100-80gb": 1})
    told: list[str] = []
    pods = [env.add(gang(f"m{k}", 2, "job", 2)) for k in range(2)]
    node = env.filter(pods[0]).node_names[0]
    env.filter(pods[1])
    plan = planned(env.cache.prepare_bind(info(pods[0]).id, node))
    assert env.cache.gang_arrive(plan).status == "wait"
    env.cache.set_barrier_listener(told.append)
    env.cache.fail_waiting_binds("extender shutting down")
    assert told == ["default/job"]
    state = env.cache.gang_arrive(plan)
    assert (state.status, state.reason) == ("failed", "extender shutting down")
    other = planned(env.cache.prepare_bind(info(pods[1]).id, node))
    assert env.cache.gang_arrive(other).status == "failed"


def test_an_expired_reservation_fails_the_barrier_and_tells_the_listener() -> None:
    env = Env({"dgx-a100-80gb": 1}, gang_ttl_seconds=30)
    told: list[str] = []
    env.cache.set_barrier_listener(told.append)
    pods = [env.add(gang(f"m{k}", 2, "job", 2)) for k in range(2)]
    node = env.filter(pods[0]).node_names[0]
    plan = planned(env.cache.prepare_bind(info(pods[0]).id, node))
    assert env.cache.gang_arrive(plan).status == "wait"
    told.clear()
    env.clock.now += 31
    env.cache.tick()
    assert told == ["default/job"]
    assert env.cache.gang_arrive(plan).status == "failed" and env.cache.holds() == []


# ---- explanations ---------------------------------------------------------------------------------
def test_filter_and_bind_carry_an_explanation_with_the_deciding_terms() -> None:
    # Two models: the terms are those that set the node apart from the runner-up (a lone node has
    # none, nor have two equal ones: tests/unit/test_extender_explanations.py).
    env = Env({"dgx-a100-80gb": 1, "dgx-h100": 1})
    pod = env.add(gpu_pod("explained", 2))
    decision = env.cache.filter(info(pod), env.names)
    e = decision.explanation
    assert e is not None and e.node == env.names[0] and len(e.gpu_indices) == 2 == len(e.gpu_uuids)
    assert e.reason and e.terms == ()  # the terms are worked out at bind, off the filter's path
    plan = planned(env.cache.prepare_bind(info(pod).id, e.node))
    b = plan.explanation
    assert b is not None and (b.node, b.gpu_indices, b.reason) == (e.node, e.gpu_indices, e.reason)
    assert 1 <= len(b.terms) <= 3
    magnitudes = [abs(v) for _, v in b.terms]
    assert magnitudes == sorted(magnitudes, reverse=True)
    assert b.node in b.text() and b.terms[0][0] in b.text()
    env.cache.check_invariants()
    terms = env.cache.explain(info(gpu_pod("other", 2)), e.node)
    assert set(terms) == set(env.cache.policy.weights)


def test_the_bind_explains_on_a_scratch_copy_and_leaves_the_live_state_alone() -> None:
    # Two models, so the explanation has a runner-up and terms to list.
    env = Env({"dgx-a100-80gb": 1, "dgx-h100": 1})
    pod = env.add(gpu_pod("scratch", 2))
    node = env.cache.filter(info(pod), env.names).feasible[0]
    state = env.cache._books.snap.state
    gen, free = state.gen.copy(), state.gpu_milli_free.copy()
    plan = env.cache.prepare_bind(info(pod).id, node)
    assert isinstance(plan, BindPlan) and plan.explanation is not None and plan.explanation.terms
    assert (state.gen == gen).all() and (state.gpu_milli_free == free).all()
    env.cache.check_invariants()


# ---- invariants and restore ----------------------------------------------------------------------
def test_a_broken_invariant_raises_the_named_error() -> None:
    env = Env()
    env.filter(env.add(gpu_pod("p", 1)))
    env.cache._books.snap.state.allocate("leak", 0, 0, 0, [])  # a bug elsewhere: an allocation nobody owns
    with pytest.raises(CacheInvariantError, match="leaked allocation leak"):
        env.cache.check_invariants()


def test_restore_is_idempotent_and_incremental() -> None:
    env = Env({"dgx-a100-80gb": 2})
    pods = [env.add(gang(f"r{k}", 2, "resume", 2)) for k in range(2)]
    env.filter(pods[0])
    (group,) = env.cache.gangs()
    obj = encode_reservation(group, {n: s for n in env.names if (s := env.cache.node_spec(n)) is not None})
    restored = decode_reservation(obj)
    standby = Env({"dgx-a100-80gb": 2})
    for p in pods:
        standby.cache.upsert_pod(as_pod(p))
    assert standby.cache.restore_gangs([restored]) == 1
    held = standby.cache.holds()
    assert standby.cache.restore_gangs([restored]) == 0  # the same set again: nothing changes
    assert standby.cache.holds() == held and len(standby.cache.gangs()) == 1
    # The other extender planned the group again (a new reservation id): the standby follows it.
    again = dataclasses.replace(restored, reservation_id="f" * 32)
    assert standby.cache.restore_gangs([again]) == 1
    (now,) = standby.cache.gangs()
    assert now.reservation_id == "f" * 32
    standby.cache.check_invariants()
    # Its object went away: the caller releases it.
    assert standby.cache.release_gang(now.id, now.reservation_id) == 2
    assert standby.cache.holds() == []


def test_a_gang_spec_is_what_the_filter_gets() -> None:
    # (the service passes the group's size and TTL: the bounds apply to both)
    env = Env(max_gang_size=4)
    pod = env.add(gang("x", 1, "g", 2))
    decision = env.cache.filter(info(pod), env.names, GangSpec(size=8, ttl_seconds=60))
    assert decision.feasible == () and "maxGangSize=4" in next(iter(decision.unresolvable.values()))
    assert isinstance(env.cache.prepare_bind(info(pod).id, T4), BindRefused)


def test_a_pod_bound_before_the_watch_showed_it_keeps_its_gpus_past_the_hold_ttl() -> None:
    env = Env(assume_ttl_seconds=10)
    pod = info(gpu_pod("unseen", 2))  # filtered and bound; the watch has not reported it yet
    (node,) = env.cache.filter(pod, env.names).feasible
    plan = planned(env.cache.prepare_bind(pod.id, node, pod))
    env.cache.bind_done(plan, ok=True)
    env.clock.now += 60
    assert len(whole_free(env.cache, node)) == 2 and env.cache.holds() == []
    env.cache.check_invariants()


# ---- data locality and the candidate limit (docs/locality.md) ---------------------------------------
def _with_annotations(pod: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **annotations}
    return pod


def test_the_locality_annotations_move_the_extender_s_choice_and_scores() -> None:
    env = Env({"t4x4-pcie": 4})
    first, second, third, _ = env.names  # four equal, empty nodes
    store_side = _with_annotations(gpu_pod("near"), {"neuronetes.io/data-nodes": third})
    plain, _ = env.service.prioritize(names_request(gpu_pod("plain"), env.names))
    assert {p.score for p in plain} == {10}
    ranked, _ = env.service.prioritize(names_request(store_side, env.names))
    assert [p.score for p in ranked] == [0, 0, 10, 0]
    assert env.filter(gpu_pod("plain")).node_names == [first]  # no annotation: the first wins
    assert env.filter(store_side).node_names == [third]
    avoiding = _with_annotations(gpu_pod("away"), {"neuronetes.io/avoid-nodes": f"{first},{second}"})
    assert env.filter(avoiding).node_names == [third]


def test_the_candidate_limit_annotation_bounds_the_nodes_scored() -> None:
    env = Env({"t4x4-pcie": 4})
    # The data's node is outside the first window of 2: the limit wins over the preference.
    pod = _with_annotations(
        gpu_pod("fast"), {"neuronetes.io/data-nodes": env.names[3], "neuronetes.io/max-nodes-to-score": "2"}
    )
    assert env.filter(pod).node_names == [env.names[0]]
    nxt = _with_annotations(
        gpu_pod("fast2"), {"neuronetes.io/data-nodes": env.names[3], "neuronetes.io/max-nodes-to-score": "2"}
    )
    assert env.filter(nxt).node_names == [env.names[3]]  # the next window: nodes 2 and 3


def test_prioritize_scores_the_filter_s_answer_without_moving_the_candidate_window() -> None:
    env = Env({"t4x4-pcie": 6}, filter_top_k=2)
    first, second, third, fourth, _, _ = env.names

    def limited(name: str) -> dict[str, Any]:
        return _with_annotations(
            gpu_pod(name), {"neuronetes.io/data-nodes": second, "neuronetes.io/max-nodes-to-score": "2"}
        )

    pod = limited("fast")
    answer = env.filter(pod).node_names
    assert answer == [second, first]  # the first window, the data's node first
    # kube-scheduler asks about the nodes that passed the filter: they are scored (the held one
    # 10), and the next pod's filter still takes the next window.
    ranked, _ = env.service.prioritize(names_request(pod, answer))
    assert [p.score for p in ranked] == [10, 0]
    assert env.filter(limited("next")).node_names == [third, fourth]
    # Asked about every node, a pod with a limit scores one window of them: the rest get 0.
    spread, _ = env.service.prioritize(names_request(limited("wide"), env.names))
    assert sorted(p.score for p in spread) == [0, 0, 0, 0, 10, 10]
