"""GPU-aware preemption acted on: victims evicted through the Eviction API, the GPUs held for the
preemptor, Events on both sides (docs/preemption.md, "The preemption controller").

kube-scheduler's own preemption cannot do this for GPU pods: it checks victims against node
totals, so a pod that needs one GPU emptied on a node with enough GPU memory in total finds "no
victim needed" and nobody is evicted, while the extender's filter keeps rejecting it
(`tests/e2e/test_preemption_e2e.py` shows both). The controller here runs beside the filter:

1. **Who preempts.** A pod the filter rejected (no node has room for its GPUs), still pending,
   with a priority above 0 and ``preemptionPolicy`` not ``Never``, rejected for at least
   ``preemption.minPendingSeconds`` (default 10 s: transient Pending evicts nobody). Only the
   extender whose kube-scheduler leads sees filter calls, so with two pairs (HA) only the active
   one preempts.
2. **Whom.** `neuronetes.engine.preempt.choose_victims` over the nodes kube-scheduler last offered
   the pod (those its own filters pass: node selector, affinity, taints), on a copy of the cache's
   state outside its lock (a decision at 5,000 nodes must not stall the filter), among bound pods
   of lower priority: per GPU, kube-scheduler's order plus GPU-seconds lost; a gang whole. Pods
   inside a GPUSlice are not candidates (their slice's reservation outlives them; deleting a
   tenant's GPUSlice is not the scheduler's to do).
3. **How.** Each victim pod gets an Eviction (``pods/eviction``: PodDisruptionBudgets honoured),
   those a PDB covers first. The decision already prefers victims whose PDBs allow their
   disruption (`budgets`); a refusal all the same (429: a PDB changed since; anything else)
   ends the attempt with a Warning Event on the preemptor; the refused pod is left out of the
   next decisions for ``preemption.refusedBackoffSeconds``, so the next decision (the next
   tick) tries other victims.
4. **The hold.** The chosen node is reserved for the preemptor for
   ``preemption.reservationSeconds`` (default 60) or until it binds or goes: the filter refuses
   that node to pods of lower priority meanwhile (kube-scheduler's nominated-node rule, per
   node), so the freed GPUs are not taken by the victims' peers. The preemptor is then nudged to
   be scheduled again.
5. **Events.** ``Preempting`` on the preemptor (the node and the victims), ``Preempted`` on each
   victim (the preemptor and its priority), ``PreemptionBlocked`` when an eviction is refused.

No loops: a victim has a lower priority than its preemptor, so it can never preempt it back,
and the reservation keeps its peers off the freed node until the preemptor binds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote

from neuronetes.engine.preempt import PreemptionDecision, Unit, group_units
from neuronetes.inventory import ClusterState

from .budgets import BudgetBook, victim_of
from .config import PreemptionSettings
from .events import EventRecorder, PodRef
from .gangs import GangSpec
from .kube import KubeApi, KubeError, nudge_pod
from .pods import PodInfo
from .store import ClusterStore

__all__ = ["PreemptionBook", "PreemptionController", "Reservation", "candidates"]

log = logging.getLogger(__name__)
TOO_MANY_REQUESTS = 429
NOT_FOUND = 404


@dataclass(frozen=True, slots=True)
class Reservation:
    """A node held for a preemptor until `until` (monotonic seconds)."""

    pod: str
    key: str  # namespace/name
    priority: int
    node: str
    until: float
    group: str = ""  # a gang preemptor's group (namespace/name): its members are not held off


class PreemptionBook:
    """Pods the filter rejected (since when), the nodes held for preemptors, and evictions refused
    lately (not thread-safe on its own: the cache's lock guards it)."""

    def __init__(self) -> None:
        self.rejected_since: dict[str, float] = {}
        # Per rejected pod, the nodes kube-scheduler last offered it (its own filters passed there:
        # node selector, affinity, taints): the only nodes a preemption may free for it.
        self.offered: dict[str, Sequence[str]] = {}
        self.reservations: dict[str, Reservation] = {}  # preemptor pod id -> its reservation
        self.refused_until: dict[str, float] = {}  # victim pod id -> left out until
        self.budgets = BudgetBook()  # the PodDisruptionBudgets (`feeds.pdb_reflector`)
        self.gang_specs: dict[str, GangSpec] = {}  # rejected gang member -> its group's size, TTL

    def rejected(self, pod_id: str, now: float, offered: Sequence[str], gang: GangSpec | None = None) -> None:
        self.rejected_since.setdefault(pod_id, now)
        self.offered[pod_id] = offered
        if gang is not None:
            self.gang_specs[pod_id] = gang

    def placed(self, pod_id: str) -> None:
        self.rejected_since.pop(pod_id, None)
        self.offered.pop(pod_id, None)
        self.gang_specs.pop(pod_id, None)

    def expire(self, pods: Mapping[str, PodInfo], now: float, planned: Collection[str] = ()) -> None:
        """Drop what no longer applies: pods gone or no longer pending, reservations whose
        preemptor bound, went, or ran out of time (a gang's: no member waits any more, or the
        group's own reservation is `planned`: its GPUs are held by it now), refusals past their
        backoff."""
        for pod_id in [p for p in self.rejected_since if not _pending(pods.get(p))]:
            self.placed(pod_id)
        waiting = {g for g in (self.reservations[k].group for k in self.reservations) if g}
        if waiting:  # gangs whose preemption holds are live: do they still have a member waiting?
            waiting = {p.gang_id for p in pods.values() if p.gang_id in waiting and _pending(p)}
        for key, held in list(self.reservations.items()):
            gone = held.group not in waiting if held.group else not _pending(pods.get(held.pod))
            if held.until <= now or gone or held.group in planned:
                del self.reservations[key]
        for pod_id in [p for p, until in self.refused_until.items() if until <= now]:
            del self.refused_until[pod_id]

    def blocked(self, pod: PodInfo) -> dict[str, str]:
        """Nodes held for another preemptor of `pod`'s priority or higher: node -> why
        (kube-scheduler's rule for nominated pods: equal priorities do not take their room)."""
        out: dict[str, str] = {}
        for held in self.reservations.values():
            if held.group and held.group == pod.gang_id:
                continue  # the gang's own room
            if held.pod != pod.id and held.priority >= pod.priority:
                out.setdefault(held.node, f"gpus held for preemptor {held.key} (priority {held.priority})")
        return out

    def due(self, pods: Mapping[str, PodInfo], now: float, min_pending_s: float) -> list[PodInfo]:
        """Pending pods rejected for at least `min_pending_s` that may preempt and hold nothing
        yet, highest priority first (then the longest waiting). A gang is one of them: its
        first member by name that is due stands for it (`gang_preemption`), and only while
        the gang holds nothing."""
        held_gangs = {h.group for h in self.reservations.values() if h.group}
        out = []
        for pod_id, since in self.rejected_since.items():
            info = pods.get(pod_id)
            if (
                info is not None
                and _pending(info)
                and now - since >= min_pending_s
                and info.priority > 0
                and info.preemption_policy != "Never"
                and not info.slice
                and pod_id not in self.reservations
                and info.gang_id not in held_gangs
            ):
                out.append((-info.priority, since, pod_id, info))
        out.sort(key=lambda t: t[:3])
        first: dict[str, str] = {}  # gang -> the name of its member that stands for it
        for *_, info in out:
            if info.gang_id is not None and info.name < first.get(info.gang_id, "\U0010ffff"):
                first[info.gang_id] = info.name
        return [info for *_, info in out if info.gang_id is None or first[info.gang_id] == info.name]


def _pending(info: PodInfo | None) -> bool:
    return info is not None and info.pending_gpu


def candidates(
    state: ClusterState,
    store: ClusterStore,
    pod: PodInfo,
    left_out: Iterable[str],
    budgets: BudgetBook | None = None,
) -> list[Unit]:
    """The units `pod` may evict: bound pods of lower priority in `state`, not in a GPUSlice and
    not `left_out`, a gang's members together, with their start times, GPU-seconds lost and
    the PodDisruptionBudget covering each (from `budgets`) with the disruptions it allows."""
    skip = set(left_out)
    now = time.time()
    victims = []
    for info in store.pods.values():
        alloc = "pod/" + info.id
        if (
            not info.node
            or info.priority >= pod.priority
            or info.slice
            or info.deleting
            or info.terminal
            or alloc not in state.allocations
        ):
            continue
        # GPU-seconds lost: the GPU share it holds (whole GPUs 1 each) times the seconds it ran.
        share = sum(g.milli for g in state.allocations[alloc].grants) / 1000
        ran = max(0.0, now - info.started) if info.started else 0.0
        victims.append(victim_of(info, budgets, allocation=alloc, gpu_seconds_lost=share * ran))
    return [u for u in group_units(victims) if not skip.intersection(u.pods)]


class PreemptionCache(Protocol):
    """What the controller asks of `GpuCache` (under its lock there)."""

    def preemption_due(self, min_pending_s: float) -> list[PodInfo]: ...

    def decide_preemption(self, pod: PodInfo) -> PreemptionDecision: ...

    def pod(self, pod_id: str) -> PodInfo | None: ...

    def hold_nodes_for(self, pod: PodInfo, nodes: Collection[str], seconds: float) -> None: ...

    def refuse_victim(self, pod_id: str, seconds: float) -> None: ...

    def drop_holds_for(self, pod: PodInfo) -> None: ...

    def pending_members(self, pod: PodInfo) -> list[PodInfo]: ...


class PreemptionController:
    """Every `interval_s`: decide for the pods due (`PreemptionBook.due`), evict, hold, say so."""

    def __init__(
        self,
        cache: PreemptionCache,
        api: KubeApi,
        events: EventRecorder,
        settings: Callable[[], PreemptionSettings],
        *,
        interval_s: float = 1.0,
    ) -> None:
        self.cache, self.api, self.events, self.settings = cache, api, events, settings
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.evicted = 0
        # Preemptor pod id -> (the pods to nudge: the preemptor, or a gang's pending members; its
        # victims' pod ids; give up at): they are nudged once every victim is gone
        # (kube-scheduler may not retry a pod an extender rejected on its own).
        self._awaiting: dict[str, tuple[list[PodInfo], tuple[str, ...], float]] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="preemption", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # the next tick retries; the thread must not die
                log.exception("preemption tick failed")

    def tick(self) -> int:
        """One round; returns the pods that preempted."""
        settings = self.settings()
        if not settings.enabled:
            return 0
        self._nudge_when_room()
        done = 0
        for pod in self.cache.preemption_due(settings.min_pending_seconds)[: settings.max_per_tick]:
            decision = self.cache.decide_preemption(pod)
            if not decision.needed or not decision.victims or decision.node is None:
                continue
            if self._act(pod, decision, settings):
                done += 1
        return done

    def _act(self, pod: PodInfo, decision: PreemptionDecision, settings: PreemptionSettings) -> bool:
        node = ", ".join(sorted(set(decision.nodes)))
        # Victims a PodDisruptionBudget covers are evicted first: were one refused, no other
        # victim would have been evicted in vain.
        guarded = {p for u in decision.victims if u.pdbs for p in u.pods}
        pods = sorted(decision.pods, key=lambda p: p not in guarded)
        victims = [v for v in (self.cache.pod(p) for p in pods) if v is not None]
        names = ", ".join(sorted(v.key for v in victims))
        # The nodes are held before the first eviction: the GPUs they free are the preemptor's
        # (a gang's: every node its members' victims are on).
        self.cache.hold_nodes_for(pod, set(decision.nodes), settings.reservation_seconds)
        for victim in victims:
            refused = self._evict(victim)
            if refused is not None:
                self.cache.refuse_victim(victim.id, settings.refused_backoff_seconds)
                self.cache.drop_holds_for(pod)
                self.events.record(
                    PodRef(pod.namespace, pod.name, pod.uid),
                    "PreemptionBlocked",
                    f"evicting {victim.key} on {node} was refused ({refused}); other victims are tried next",
                    action="Preempting",
                    type="Warning",
                    every_s=30.0,
                )
                return False
            self.evicted += 1
            self.events.record(
                PodRef(victim.namespace, victim.name, victim.uid),
                "Preempted",
                f"evicted for {pod.key} (priority {pod.priority}) on {node}: {decision.reason}",
                action="Preempting",
            )
        self.events.record(
            PodRef(pod.namespace, pod.name, pod.uid),
            "Preempting",
            f"evicting {names} on {node}; the node is held for this pod "
            f"for {settings.reservation_seconds:g}s",
            action="Preempting",
        )
        nudge = self.cache.pending_members(pod)
        self._awaiting[pod.id] = (nudge, decision.pods, time.monotonic() + settings.reservation_seconds)
        log.info("preemption: %s evicts %s on %s", pod.key, names, node)
        return True

    def _nudge_when_room(self) -> None:
        """Nudge each preemptor whose victims are all gone (their GPUs released)."""
        now = time.monotonic()
        for pod_id, (pods, victims, give_up) in list(self._awaiting.items()):
            if now >= give_up:
                del self._awaiting[pod_id]
            elif all(self.cache.pod(v) is None for v in victims):
                del self._awaiting[pod_id]
                for pod in pods:
                    nudge_pod(self.api, pod.namespace, pod.name)

    def _evict(self, victim: PodInfo) -> str | None:
        """Evict `victim`; None when done (or already gone), else why not."""
        namespace, name = quote(victim.namespace, safe=""), quote(victim.name, safe="")
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": victim.name, "namespace": victim.namespace},
        }
        try:
            self.api.post(path, body)
        except KubeError as exc:
            if exc.status == NOT_FOUND:
                return None
            if exc.status == TOO_MANY_REQUESTS:
                return "a PodDisruptionBudget allows no disruption now"
            return f"HTTP {exc.status}: {str(exc)[:200]}"
        return None
