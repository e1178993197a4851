"""The extender's preemption controller (`neuronetes_extender.preemption`) over a real cache: who
preempts (rejected long enough, priority, ``preemptionPolicy``), whom (per GPU), the Eviction API
with a PodDisruptionBudget's refusal, the node held against lower priorities, the nudge.

The API server is an in-memory double at the HTTP-path level (evictions delete the pod and
deliver the deletion to the cache, as the watch would; a refusal answers 429); the end-to-end
path with the real kube-scheduler and API server is `tests/e2e/test_preemption_e2e.py`.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec
import pytest
from extender_support import FakeApi, FakeClock, bound_with, node_objects, shared_pod, synced_cache

from neuronetes import contracts as c
from neuronetes.kube.client import KubeError
from neuronetes_extender.budgets import budget_of
from neuronetes_extender.cache import GpuCache
from neuronetes_extender.config import ExtenderSettings, PreemptionSettings
from neuronetes_extender.events import EventRecorder, PodRef
from neuronetes_extender.gangs import GangSpec
from neuronetes_extender.pods import PodInfo
from neuronetes_extender.preemption import PreemptionController
from neuronetes_extender.watch import CustomObject
from neuronetes_extender.wire import Pod

pytestmark = pytest.mark.unit

NODE = "nt4x4-pcie-0"
NODES = node_objects({"t4x4-pcie": 2})  # the second stays empty: kube-scheduler never offers it


class Api:
    """Evictions and nudges by HTTP path, against `FakeApi`'s pods (which tell the cache)."""

    def __init__(self, fake: FakeApi, refuse: set[str] | None = None) -> None:
        self.fake, self.refuse = fake, refuse or set()
        self.evicted: list[str] = []
        self.nudged: list[str] = []

    def post(self, path: str, body: Any, *, timeout: float | None = None) -> bytes:
        assert path.endswith("/eviction") and body["kind"] == "Eviction"
        name = body["metadata"]["name"]
        if name in self.refuse:
            raise KubeError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
        self.evicted.append(name)
        self.fake.delete(body["metadata"]["namespace"], name)
        return b"{}"

    def merge_patch(self, path: str, body: Any, *, timeout: float | None = None) -> bytes:
        self.nudged.append(path.rsplit("/", 1)[1])
        return b"{}"


class Recorder(EventRecorder):
    def __init__(self) -> None:
        super().__init__(None)
        self.said: list[tuple[str, str, str]] = []

    def record(self, pod: PodRef, reason: str, note: str, **_: Any) -> None:
        self.said.append((reason, pod.name, note))


class World:
    def __init__(self, *, refuse: set[str] | None = None, min_pending: float = 10.0) -> None:
        self.clock = FakeClock()
        settings = ExtenderSettings(preemption=PreemptionSettings(min_pending_seconds=min_pending))
        self.cache: GpuCache = synced_cache(NODES, settings, clock=self.clock)
        self.fake = FakeApi(cache=self.cache)
        self.api = Api(self.fake, refuse)
        self.events = Recorder()
        self.ctl = PreemptionController(
            self.cache, cast(Any, self.api), self.events, lambda: self.cache.settings.get().preemption
        )

    def run(self, pod: dict[str, Any]) -> None:
        self.fake.add(pod)
        self.cache.upsert_pod(msgspec.convert(pod, Pod))

    def info(self, pod: dict[str, Any]) -> PodInfo:
        return PodInfo.from_pod(msgspec.convert(pod, Pod))

    def fill(self) -> dict[str, int]:
        """Four pods of 8,000 MiB and 40 % compute, one per GPU, priorities 10..40: name -> GPU."""
        out = {}
        for j, priority in enumerate((30, 10, 40, 20)):
            pod = shared_pod(f"low-{j}", 8000, 40, priority=priority)
            self.run(bound_with(pod, NODE, {j: (8000, 40)}))
            out[f"low-{j}"] = j
        return out


def preemptor(name: str = "high", priority: int = 1000, **spec: Any) -> dict[str, Any]:
    pod = shared_pod(name, 12000, 50, priority=priority)
    pod["spec"].update(spec)
    return pod


def test_a_rejected_pod_preempts_after_the_minimum_pending_time_one_victim_on_one_gpu() -> None:
    w = World()
    gpus = w.fill()
    high = preemptor()
    w.run(high)
    decision = w.cache.filter(w.info(high), [NODE])
    assert not decision.feasible  # 29,440 MiB free on the node, no GPU with 12,000
    assert w.ctl.tick() == 0 and w.api.evicted == []  # rejected just now: transient Pending
    w.clock.now += 10
    assert w.ctl.tick() == 1
    assert w.api.evicted == ["low-1"]  # the lowest priority, alone on its GPU: not two on two GPUs
    reasons = [(r, n) for r, n, _ in w.events.said]
    assert ("Preempted", "low-1") in reasons and ("Preempting", "high") in reasons
    # The victim is gone: the preemptor is nudged and now fits on the victim's GPU.
    w.ctl.tick()
    assert w.api.nudged == ["high"]
    again = w.cache.filter(w.info(high), [NODE])
    assert again.feasible and again.hold is not None
    assert [g.gpu_index for g in again.hold.grants] == [gpus["low-1"]]


def test_only_the_nodes_kube_scheduler_offered_are_freed() -> None:
    """The pod's node selector, affinity and taints are kube-scheduler's filters: an empty node it
    was never offered is no place for it, so the controller preempts on the offered one instead
    of deciding that no victim is needed."""
    w = World(min_pending=0)
    w.fill()
    high = preemptor()
    w.run(high)
    assert w.cache.filter(w.info(high), ["nt4x4-pcie-1"]).feasible  # room there, had it been offered
    w.cache.filter(w.info(high), [NODE])
    assert w.ctl.tick() == 1 and w.api.evicted == ["low-1"]


def test_the_held_node_is_refused_to_lower_priorities_until_the_preemptor_binds() -> None:
    w = World(min_pending=0)
    w.fill()
    high = preemptor()
    w.run(high)
    w.cache.filter(w.info(high), [NODE])
    assert w.ctl.tick() == 1
    assert [(r.key, r.node) for r in w.cache.reservations()] == [("default/high", NODE)]
    small = shared_pod("small", 1000, 10, priority=500)
    refused = w.cache.filter(w.info(small), [NODE])
    assert not refused.feasible
    assert refused.failed[NODE] == "gpus held for preemptor default/high (priority 1000)"
    # A pod of higher priority than the preemptor is not held off.
    vip = shared_pod("vip", 1000, 10, priority=2000)
    assert w.cache.filter(w.info(vip), [NODE]).feasible
    # The preemptor bound (or gone): the node is no longer held.
    w.fake.delete("default", "high")
    assert w.cache.preemption_due(0) == [] and w.cache.reservations() == []


def test_pods_that_may_not_preempt_do_not() -> None:
    for high in (preemptor(preemptionPolicy="Never"), preemptor(priority=0)):
        w = World(min_pending=0)
        w.fill()
        w.run(high)
        w.cache.filter(w.info(high), [NODE])
        assert w.ctl.tick() == 0 and w.api.evicted == []
    # Nothing of lower priority to evict: no decision, nothing evicted.
    w = World(min_pending=0)
    w.fill()
    low = preemptor(priority=5)
    w.run(low)
    w.cache.filter(w.info(low), [NODE])
    assert w.ctl.tick() == 0 and w.api.evicted == []


def test_a_refused_eviction_says_so_and_the_next_decision_tries_another_victim() -> None:
    w = World(min_pending=0, refuse={"low-1"})
    w.fill()
    high = preemptor()
    w.run(high)
    w.cache.filter(w.info(high), [NODE])
    assert w.ctl.tick() == 0
    blocked = [(n, note) for r, n, note in w.events.said if r == "PreemptionBlocked"]
    assert blocked and blocked[0][0] == "high" and "PodDisruptionBudget" in blocked[0][1]
    assert w.cache.reservations() == []  # the attempt ended: the node is not held
    w.cache.filter(w.info(high), [NODE])  # kube-scheduler tries again: still rejected
    assert w.ctl.tick() == 1
    assert w.api.evicted == ["low-3"]  # the next lowest on a GPU of its own (priority 20)


def test_between_equal_priorities_the_pod_started_last_goes() -> None:
    """kube-scheduler's key after priorities and count: the latest start (it has lost the least
    work), from the pods' ``status.startTime``."""
    w = World(min_pending=0)
    for j, started in enumerate(("2026-11-27T09:00:00Z", "2026-11-27T08:00:00Z", "2026-11-27T11:00:00Z")):
        pod = bound_with(shared_pod(f"same-{j}", 8000, 40, priority=10), NODE, {j: (8000, 40)})
        pod["status"]["startTime"] = started
        w.run(pod)
    w.run(bound_with(shared_pod("other", 8000, 40, priority=50), NODE, {3: (8000, 40)}))
    high = preemptor()
    w.run(high)
    w.cache.filter(w.info(high), [NODE])
    assert w.ctl.tick() == 1
    assert w.api.evicted == ["same-2"]


def pdb(name: str, allowed: int, **match_labels: str) -> CustomObject:
    """A policy/v1 PodDisruptionBudget as the API server serves it."""
    obj = {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "7"},
        "spec": {"selector": {"matchLabels": match_labels}, "minAvailable": 1},
        "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1},
    }
    return msgspec.convert(obj, CustomObject)


def labelled(pod: dict[str, Any], **labels: str) -> dict[str, Any]:
    pod["metadata"].setdefault("labels", {}).update(labels)
    return pod


def test_a_victim_its_pdb_does_not_let_go_is_passed_over_for_one_it_does() -> None:
    """The lowest-priority pod (low-1) runs under a PDB allowing no disruption now: the decision
    takes the next lowest on a GPU of its own (low-3, priority 20) instead of being refused by
    the Eviction API first. Once the PDB allows one disruption, low-1 is the victim again."""
    for allowed, victim in ((0, "low-3"), (1, "low-1")):
        w = World(min_pending=0)
        for j, priority in enumerate((30, 10, 40, 20)):
            pod = labelled(shared_pod(f"low-{j}", 8000, 40, priority=priority), app=f"web-{j}")
            w.run(bound_with(pod, NODE, {j: (8000, 40)}))
        w.cache.replace_budgets([b for b in [budget_of(pdb("web-1", allowed, app="web-1"))] if b is not None])
        high = preemptor()
        w.run(high)
        w.cache.filter(w.info(high), [NODE])
        assert w.ctl.tick() == 1
        assert w.api.evicted == [victim]


def test_a_pdb_watched_away_no_longer_counts() -> None:
    w = World(min_pending=0)
    for j, priority in enumerate((30, 10, 40, 20)):
        pod = labelled(shared_pod(f"low-{j}", 8000, 40, priority=priority), app="web")
        w.run(bound_with(pod, NODE, {j: (8000, 40)}))
    w.cache.put_budget("default/web", budget_of(pdb("web", 0, app="web")))
    w.cache.put_budget("default/web", None)  # deleted
    high = preemptor()
    w.run(high)
    w.cache.filter(w.info(high), [NODE])
    assert w.ctl.tick() == 1 and w.api.evicted == ["low-1"]


def test_a_null_selector_pdb_covers_nothing() -> None:
    obj = msgspec.convert({"metadata": {"name": "x", "namespace": "default"}, "spec": {}}, CustomObject)
    assert budget_of(obj) is None


def test_a_pool_asking_for_fewest_victims_evicts_one_pod_not_two_of_lower_priority() -> None:
    """GPU 0 holds two pods of priority 10 (7,000 MiB each), GPUs 1-3 one pod each (14,000 MiB,
    priorities 30, 40, 50). A 12,000 MiB preemptor evicts the two priority-10 pods under
    kube-scheduler's order, and only the priority-30 pod under ``fewest-victims`` (the pool's
    ``spec.scheduling.preemption.policy``, carried by the annotation the operator writes)."""
    for policy, evicted in ((None, ["pair-a", "pair-b"]), ("fewest-victims", ["one-1"])):
        w = World(min_pending=0)
        w.run(bound_with(shared_pod("pair-a", 7000, 20, priority=10), NODE, {0: (7000, 20)}))
        w.run(bound_with(shared_pod("pair-b", 7000, 20, priority=10), NODE, {0: (7000, 20)}))
        for j, priority in ((1, 30), (2, 40), (3, 50)):
            w.run(bound_with(shared_pod(f"one-{j}", 14000, 40, priority=priority), NODE, {j: (14000, 40)}))
        high = preemptor()
        if policy is not None:
            high["metadata"].setdefault("annotations", {})[c.ANNOTATION_PREEMPTION_POLICY] = policy
        w.run(high)
        w.cache.filter(w.info(high), [NODE])
        assert w.ctl.tick() == 1
        assert sorted(w.api.evicted) == evicted


def gang_member(name: str, size: int, priority: int = 1000) -> dict[str, Any]:
    pod = shared_pod(name, 12000, 50, priority=priority)
    pod["metadata"].setdefault("labels", {}).update({c.LABEL_GANG: "train", c.LABEL_GANG_SIZE: str(size)})
    return pod


def fill_both(w: World, priorities: tuple[int, ...]) -> None:
    """One 8,000 MiB pod per GPU on both nodes (GPU j of node k gets priorities[4k + j])."""
    for k, node in enumerate(("nt4x4-pcie-0", "nt4x4-pcie-1")):
        for j in range(4):
            pod = shared_pod(f"low-{k}{j}", 8000, 40, priority=priorities[4 * k + j])
            w.run(bound_with(pod, node, {j: (8000, 40)}))


def test_a_pending_gang_preempts_for_all_its_members_at_once() -> None:
    """Two members of 12,000 MiB: one victim per member, the two lowest-priority pods (one on
    each node here), both evicted in one decision, every node freed held for the gang (its own
    members pass, a lower-priority pod does not), and the gang's reservation made once they are
    gone; every member is nudged."""
    w = World(min_pending=0)
    fill_both(w, (30, 10, 40, 50, 60, 70, 5, 80))
    both = ["nt4x4-pcie-0", "nt4x4-pcie-1"]
    spec = GangSpec(size=2, ttl_seconds=60)
    members = [gang_member(f"train-{m}", 2) for m in range(2)]
    for pod in members:
        w.run(pod)
        assert not w.cache.filter(w.info(pod), both, spec).feasible
    assert w.ctl.tick() == 1
    assert sorted(w.api.evicted) == ["low-01", "low-12"]  # priorities 10 and 5
    assert sorted(r.node for r in w.cache.reservations()) == both
    small = shared_pod("small", 1000, 10, priority=500)
    assert not w.cache.filter(w.info(small), both).feasible
    w.ctl.tick()
    assert sorted(w.api.nudged) == ["train-0", "train-1"]
    placed = [w.cache.filter(w.info(pod), both, spec) for pod in members]
    assert all(d.feasible for d in placed)
    assert w.cache.preemption_due(0) == [] and w.cache.reservations() == []  # the gang holds its own


def test_a_gang_evicts_nobody_unless_every_member_gets_room() -> None:
    """Three members, but only two GPUs hold pods below the gang's priority: no victim at all."""
    w = World(min_pending=0)
    fill_both(w, (30, 2000, 2000, 2000, 2000, 2000, 5, 2000))
    spec = GangSpec(size=3, ttl_seconds=60)
    for m in range(3):
        pod = gang_member(f"train-{m}", 3)
        w.run(pod)
        w.cache.filter(w.info(pod), ["nt4x4-pcie-0", "nt4x4-pcie-1"], spec)
    assert w.ctl.tick() == 0 and w.api.evicted == []
    assert w.cache.reservations() == []
