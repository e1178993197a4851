"""A churn soak of the extender's preemption controller on a simulated cluster and clock.

Shared by the short seeded unit test (tests/unit/test_preemption_soak.py) and the 30-minute
soak (bench/preemption_soak.py). What runs is the extender's own code: the `GpuCache` (its
filter, holds and `PreemptionBook`) and the `PreemptionController` (its decisions, evictions,
node holds and Events). What is simulated is around it:

- the clock (the cache's, moved one second per step) and time itself (a pod's run time);
- kube-scheduler: every `retry_s` seconds each pending pod, highest priority first, is offered
  every node through the extender's filter and bound where the filter holds its GPUs;
- the API server: an Eviction marks the victim terminating (it keeps its GPUs for
  `grace_s` seconds, as a pod in its termination grace period does), then deletes it;
- the workloads: arrivals (Poisson, mixed priorities and sizes, three in ten asking for the
  fewest-victims order, one in ten a gang of two), departures (a pod's run ends;
  a pod pending for `abandon_s` is withdrawn by its owner), and evicted pods re-queued (their
  controller creates them again, pending, with the run time they had left).

A **preemption loop** is a cycle in the graph "workload A's pod evicted workload B's pod": B
re-placed and evicting A back (or through others). It is counted when an eviction closes a
cycle. Also counted: victims re-placed onto the node held for their preemptor while it is held
(the freed GPUs taken back), holds that ran out before their preemptor bound, and how often
one workload was evicted.
"""

from __future__ import annotations

import copy
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import msgspec
from extender_support import (
    FakeApi,
    FakeClock,
    bound_with,
    node_objects,
    pod_object,
    shared_pod,
    synced_cache,
)
from pod_builder import container

from neuronetes import contracts as c
from neuronetes_extender.cache import GpuCache
from neuronetes_extender.config import ExtenderSettings, PreemptionSettings
from neuronetes_extender.events import EventRecorder, PodRef
from neuronetes_extender.gangs import GangSpec
from neuronetes_extender.pods import PodInfo
from neuronetes_extender.preemption import PreemptionController
from neuronetes_extender.wire import Pod

EPOCH = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
# (priority, share of arrivals): batch that never preempts, then three tiers that may.
PRIORITY_MIX = ((0, 0.35), (100, 0.30), (500, 0.20), (1000, 0.15))
_EVICTED_FOR = re.compile(r"^evicted for (\S+) \(priority")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    priority: int
    memory_mib: int  # per GPU (0: whole GPUs)
    compute: int  # percent per GPU (100 with whole GPUs)
    gpus: int  # whole GPUs (0: one share)
    fewest_victims: bool = False  # its pool's preemption.policy is fewest-victims
    members: int = 1  # above 1: a gang of that many pods (evicted together, preempting together)


@dataclass
class SoakFigures:
    seconds: int
    arrivals: int = 0
    binds: int = 0
    completed: int = 0
    abandoned: int = 0
    preemptions: int = 0
    gang_preemptions: int = 0
    evictions: int = 0
    requeued: int = 0
    loops: int = 0
    victims_retook_held_gpus: int = 0
    holds_expired_unbound: int = 0
    preemptors_bound: int = 0
    preemptors_bound_on_held_node: int = 0
    max_evictions_of_one_workload: int = 0
    time_to_bind_s: list[float] = field(default_factory=list)
    tick_ms: list[float] = field(default_factory=list)
    pending_at_end: int = 0

    def percentile(self, values: list[float], q: float) -> float:
        if not values:
            return 0.0
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Api:
    """The API server's Eviction (the victim terminates for `grace_s`) and the nudge patch."""

    def __init__(self, sim: ChurnSoak) -> None:
        self.sim = sim

    def post(self, path: str, body: Any, *, timeout: float | None = None) -> bytes:
        assert path.endswith("/eviction") and body["kind"] == "Eviction"
        self.sim.evict(body["metadata"]["namespace"], body["metadata"]["name"])
        return b"{}"

    def merge_patch(self, path: str, body: Any, *, timeout: float | None = None) -> bytes:
        return b"{}"


class _Events(EventRecorder):
    """Events as a user reads them: each ``Preempted`` names its preemptor."""

    def __init__(self, sim: ChurnSoak) -> None:
        super().__init__(None)
        self.sim = sim

    def record(self, pod: PodRef, reason: str, note: str, **_: Any) -> None:
        if reason == "Preempted":
            found = _EVICTED_FOR.match(note)
            assert found is not None, note
            self.sim.preempted(pod.name, found.group(1).split("/", 1)[1])
        elif reason == "Preempting":
            self.sim.preempting(pod.name)


class ChurnSoak:
    """The simulated cluster around the extender's cache and preemption controller."""

    def __init__(
        self,
        seed: int,
        *,
        nodes: Mapping[str, int] | None = None,
        arrivals_per_s: float = 0.25,
        mean_run_s: float = 240.0,
        retry_s: int = 5,
        grace_s: int = 5,
        abandon_s: int = 600,
        settings: PreemptionSettings | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.clock = FakeClock(0.0)
        self.settings = settings or PreemptionSettings()
        self.nodes = node_objects(dict(nodes or {"t4x4-pcie": 4, "dgx-a100-80gb": 1}))
        self.node_names = [n["metadata"]["name"] for n in self.nodes]
        self.cache: GpuCache = synced_cache(
            self.nodes, ExtenderSettings(preemption=self.settings), clock=self.clock
        )
        self.fake = FakeApi(cache=self.cache)
        self.ctl = PreemptionController(
            self.cache, cast(Any, _Api(self)), _Events(self), lambda: self.settings
        )
        self.arrivals_per_s, self.mean_run_s = arrivals_per_s, mean_run_s
        self.retry_s, self.grace_s, self.abandon_s = retry_s, grace_s, abandon_s
        self.now = 0
        self.serial = 0
        self.pending: dict[str, tuple[Workload, float, int]] = {}  # pod -> (workload, left s, since)
        self.running: dict[str, tuple[Workload, float, int, str]] = {}  # pod -> (.., ends at, node)
        self.terminating: dict[str, int] = {}  # pod -> deleted at
        self.workload_of: dict[str, Workload] = {}
        self.evicted_by: dict[str, set[str]] = {}  # workload -> workloads whose pods it evicted
        self.evictions_of: dict[str, int] = {}
        self.preempting_since: dict[str, int] = {}  # preemptor pod -> when it started evicting
        self.victims_for: dict[str, set[str]] = {}  # preemptor pod -> its victims' workloads
        self.figures = SoakFigures(0)

    # ---- workloads ------------------------------------------------------------------------------
    def _new_workload(self) -> Workload:
        self.serial += 1
        r, acc = self.rng.random(), 0.0
        priority = PRIORITY_MIX[-1][0]
        for p, share in PRIORITY_MIX:
            acc += share
            if r < acc:
                priority = p
                break
        fewest = self.rng.random() < 0.3
        members = 2 if self.rng.random() < 0.1 else 1
        if self.rng.random() < 0.2:
            gpus = self.rng.choice([1, 1, 1, 2])
            return Workload(f"w{self.serial}", priority, 0, 100, gpus, fewest, members)
        memory = self.rng.choice([3000, 5000, 7000, 12000])
        return Workload(
            f"w{self.serial}", priority, memory, self.rng.choice([20, 30, 50]), 0, fewest, members
        )

    def _pod(self, w: Workload, name: str) -> dict[str, Any]:
        if w.gpus:
            pod = pod_object(name, [container("main", {c.RESOURCE_GPU: w.gpus})], priority=w.priority)
        else:
            pod = shared_pod(name, w.memory_mib, w.compute, priority=w.priority)
        if w.fewest_victims:
            pod["metadata"].setdefault("annotations", {})[c.ANNOTATION_PREEMPTION_POLICY] = "fewest-victims"
        if w.members > 1:
            pod["metadata"].setdefault("labels", {}).update(
                {c.LABEL_GANG: w.name, c.LABEL_GANG_SIZE: str(w.members)}
            )
        return pod

    def _create(self, w: Workload, left_s: float) -> None:
        name = f"{w.name}-{self.rng.randrange(16**6):06x}"
        self.workload_of[name] = w
        pod = self._pod(w, name)
        self.fake.add(pod)
        self.cache.upsert_pod(msgspec.convert(pod, Pod))
        self.pending[name] = (w, left_s, self.now)

    def _info(self, name: str) -> PodInfo | None:
        pod = self.fake.pods.get(("default", name))
        return None if pod is None else PodInfo.from_pod(msgspec.convert(pod, Pod))

    # ---- what the controller tells us (through the API and Events) ------------------------------
    def evict(self, namespace: str, name: str) -> None:
        pod = self.fake.pods[(namespace, name)]
        pod["metadata"]["deletionTimestamp"] = _stamp(self.now)
        self.cache.upsert_pod(msgspec.convert(copy.deepcopy(pod), Pod))
        self.terminating[name] = self.now + self.grace_s
        self.figures.evictions += 1

    def preempted(self, victim: str, preemptor: str) -> None:
        a, b = self.workload_of[preemptor].name, self.workload_of[victim].name
        self.evictions_of[b] = self.evictions_of.get(b, 0) + 1
        if a != b and self._reaches(b, a):
            self.figures.loops += 1  # b (or one it evicted, and so on) evicted a before
        self.evicted_by.setdefault(a, set()).add(b)
        self.victims_for.setdefault(preemptor, set()).add(b)

    def preempting(self, preemptor: str) -> None:
        self.figures.preemptions += 1
        self.figures.gang_preemptions += self.workload_of[preemptor].members > 1
        self.preempting_since.setdefault(preemptor, self.now)

    def _reaches(self, start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in self.evicted_by.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    # ---- one simulated second -------------------------------------------------------------------
    def step(self) -> None:
        self.now += 1
        self.clock.now = float(self.now)
        for _ in range(_poisson(self.rng, self.arrivals_per_s)):
            self.figures.arrivals += 1
            w = self._new_workload()
            run_s = min(1200.0, max(30.0, self.rng.expovariate(1 / self.mean_run_s)))
            for _ in range(w.members):
                self._create(w, run_s)
        self._departures()
        if self.now % self.retry_s == 0:
            self._schedule()
        started = time.perf_counter()
        self.ctl.tick()
        self.figures.tick_ms.append((time.perf_counter() - started) * 1000)
        self._holds_expired()

    def _departures(self) -> None:
        for name, (_, ends, _, _) in list(self.running.items()):
            if ends <= self.now and name not in self.terminating:
                del self.running[name]
                self.fake.delete("default", name)
                self.figures.completed += 1
        for name, at in list(self.terminating.items()):
            if at <= self.now:
                del self.terminating[name]
                w, ends, _, _ = self.running.pop(name)
                self.fake.delete("default", name)
                self.figures.requeued += 1
                self._create(w, max(1.0, ends - self.now))  # its controller makes it again
        for name, (_, _, since) in list(self.pending.items()):
            if self.now - since >= self.abandon_s:
                del self.pending[name]
                self.fake.delete("default", name)
                self.figures.abandoned += 1

    def _schedule(self) -> None:
        order = sorted(self.pending.items(), key=lambda kv: (-kv[1][0].priority, kv[1][2], kv[0]))
        for name, (w, left, _) in order:
            info = self._info(name)
            assert info is not None
            gang = GangSpec(size=w.members, ttl_seconds=60) if w.members > 1 else None
            decision = self.cache.filter(info, self.node_names, gang)
            if decision.hold is None:
                continue
            node = decision.hold.node
            held = [r for r in self.cache.reservations() if r.node == node]
            if any(w.name in self.victims_for.get(r.key.split("/", 1)[1], ()) for r in held):
                self.figures.victims_retook_held_gpus += 1  # its preemptor's freed GPUs taken back
            gpus = {g.gpu_index: (g.memory_mib, max(1, g.milli // 10)) for g in decision.hold.grants}
            pod = bound_with(self.fake.pods[("default", name)], node, gpus)
            pod["status"]["startTime"] = _stamp(self.now)
            self.fake.add(pod)
            self.cache.upsert_pod(msgspec.convert(pod, Pod))
            del self.pending[name]
            self.running[name] = (w, self.now + left, self.now, node)
            self.figures.binds += 1
            if name in self.preempting_since:
                self.figures.preemptors_bound += 1
                self.figures.time_to_bind_s.append(self.now - self.preempting_since.pop(name))
                if any(r.key.split("/", 1)[1] == name for r in held):
                    self.figures.preemptors_bound_on_held_node += 1

    def _holds_expired(self) -> None:
        held = {r.key.split("/", 1)[1] for r in self.cache.reservations()}
        for name, since in list(self.preempting_since.items()):
            if name not in held and name in self.pending and self.now - since > 1:
                self.figures.holds_expired_unbound += 1
                del self.preempting_since[name]
            elif name not in self.pending and name not in self.running:
                del self.preempting_since[name]  # withdrawn

    def run(self, seconds: int) -> SoakFigures:
        for _ in range(seconds):
            self.step()
        self.figures.seconds = self.now
        self.figures.pending_at_end = len(self.pending)
        self.figures.max_evictions_of_one_workload = max(self.evictions_of.values(), default=0)
        return self.figures


def _stamp(seconds: int) -> str:
    return datetime.fromtimestamp(EPOCH + seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method (small means)."""
    limit, k, p = pow(2.718281828459045, -mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k
