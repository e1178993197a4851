"""The extender's verbs: decoded requests in, the cache's decisions, wire structs out.

No HTTP here (`neuronetes_extender.app` does that), no body decoding (`neuronetes_extender.bodies`)
and no placement logic (the cache and the engine do that): each verb asks the `GpuCache` and
translates the answer back. Filter refuses to decide (an Error, which kube-scheduler retries)
while the cache is not synced or a watch has been broken longer than ``maxWatchStalenessSeconds``.
Bind is async: it obtains the pod (the cache's record, else the API server's) and then makes
one attempt, posts the Binding through the async API client, and a gang member's bind waits at
the barrier without holding a thread. Every verb returns ``(result, outcome)``; the outcome
labels the latency metric.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from .barrier import GangBarrier
from .bodies import BadInputError, NodeSet, PreemptRequest, meta_victims
from .cache import BindPlan, BindRefused, GpuCache
from .events import EventRecorder, PodRef, rejections_note
from .gangs import GangSpec
from .kube import Binder, KubeError
from .metrics import ExtenderMetrics
from .pods import PodInfo, pod_identity
from .reservations import GroupDirectory
from .watch import WatchHealth
from .wire import (
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionResult,
    HostPriority,
    Pod,
)

__all__ = ["BadInputError", "ExtenderService", "placement_note"]

log = logging.getLogger(__name__)

NOT_SYNCED: Final = "neuronetes extender: gpu cache not synced with the API server yet"
CONFLICT: Final = 409
REASON_ASSIGNED: Final = "GpusAssigned"
# A GPU pod no node passed: each rejected node's reason, for `neuronetes explain` and `kubectl
# describe` (kube-scheduler's FailedScheduling only counts reasons). Throttled per pod: every
# retry of a Pending pod asks again.
REASON_REJECTED: Final = "GpuFilterRejected"
REJECTED_EVERY_S: Final = 30.0


def placement_note(plan: BindPlan) -> str:
    """The placement Event's message: node, GPUs, why, and the score terms that decided it."""
    if plan.explanation is not None:
        return plan.explanation.text()
    gpus = sorted(
        {g.index for x in plan.assignment.containers.values() for g in x.gpus} if plan.assignment else ()
    )
    return f"node {plan.node}, gpus {','.join(map(str, gpus)) or 'none'}"


class ExtenderService:
    def __init__(
        self,
        cache: GpuCache,
        binder: Binder | None = None,
        metrics: ExtenderMetrics | None = None,
        groups: GroupDirectory | None = None,
        *,
        health: WatchHealth | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.metrics = metrics
        self.groups = groups or GroupDirectory()
        self.health = health or WatchHealth()
        self.events = events or EventRecorder(None)
        self.barrier = GangBarrier(cache, self.events)

    def unready(self) -> str | None:
        """Why decisions must wait (not synced yet, or a watch broken too long), or None."""
        if not self.cache.synced:
            return NOT_SYNCED
        stale = self.health.stale(self.cache.settings.get().max_watch_staleness_seconds)
        return None if stale is None else f"neuronetes extender: {stale}"

    # ---- filter ------------------------------------------------------------------------------------
    def _pod_info(self, pod: Pod) -> PodInfo:
        """The request's pod as the cache knows it when the watch delivered this very version
        (reading a pod's GPU request is the costliest part of a small request), else parsed."""
        meta = pod.metadata
        if meta.resource_version:
            known = self.cache.pod(pod_identity(meta.uid, meta.namespace, meta.name))
            if known is not None and known.resource_version == meta.resource_version:
                return known
        return PodInfo.from_pod(pod)

    def filter(self, nodes: NodeSet) -> tuple[ExtenderFilterResult, str]:
        pod = self._pod_info(nodes.pod)
        if not pod.wants_gpu:  # not ours: every node passes, untouched
            names, raw = nodes.answer(nodes.names)
            return ExtenderFilterResult(node_names=names, nodes=raw), "passthrough"
        unready = self.unready()
        if unready is not None:
            return ExtenderFilterResult(error=unready), "error"
        if self.metrics is not None:
            self.metrics.attempts.inc()
        gang: GangSpec | None = None
        if pod.gang is not None and not pod.gpu_error:
            found = self.groups.spec_for(pod, self.cache.settings.get().gang_ttl_seconds)
            if isinstance(found, str):
                failed = dict.fromkeys(nodes.names, found)
                self._record_rejections(pod, failed)
                names, raw = nodes.answer(())
                return ExtenderFilterResult(node_names=names, nodes=raw, failed_nodes=failed), "unschedulable"
            gang = found
        decision = self.cache.filter(pod, nodes.names, gang)
        if decision.topology_violation is not None and self.metrics is not None:
            self.metrics.topology_violations.labels(decision.topology_violation).inc()
        names, raw = nodes.answer(decision.feasible)
        result = ExtenderFilterResult(
            node_names=names,
            nodes=raw,
            failed_nodes=decision.failed,
            failed_and_unresolvable_nodes=decision.unresolvable,
        )
        if not decision.feasible:
            self._record_rejections(pod, {**decision.failed, **decision.unresolvable})
        if decision.hold is not None:
            log.debug(
                "filter %s -> %s gpus %s (%s)",
                pod.key,
                decision.hold.node,
                [g.gpu_index for g in decision.hold.grants],
                decision.hold.reason,
            )
        return result, "scheduled" if decision.feasible else "unschedulable"

    def _record_rejections(self, pod: PodInfo, reasons: dict[str, str]) -> None:
        if reasons:
            self.events.record(
                PodRef(pod.namespace, pod.name, pod.uid),
                REASON_REJECTED,
                rejections_note(reasons),
                action="Filter",
                type="Warning",
                every_s=REJECTED_EVERY_S,
            )

    # ---- prioritize --------------------------------------------------------------------------------
    def prioritize(self, nodes: NodeSet) -> tuple[list[HostPriority], str]:
        pod = self._pod_info(nodes.pod)
        if not pod.wants_gpu or not self.cache.synced:
            return [HostPriority(host=n, score=0) for n in nodes.names], "passthrough"
        scores = self.cache.prioritize(pod, nodes.names)
        return [HostPriority(host=n, score=s) for n, s in zip(nodes.names, scores, strict=True)], "ok"

    # ---- bind --------------------------------------------------------------------------------------
    async def bind(self, args: ExtenderBindingArgs) -> tuple[ExtenderBindingResult, str]:
        ns, name, uid, node = args.pod_namespace, args.pod_name, args.pod_uid, args.node
        if not name or not node:
            raise BadInputError("PodName and Node are required")
        binder = self.binder
        if binder is None:
            return ExtenderBindingResult(error="neuronetes extender: binding is not configured"), "error"
        pod_id = pod_identity(uid, ns, name)
        info = self.cache.pod(pod_id)
        if info is None:  # not seen by the watch yet: read it, then decide once
            found = await self._fetch_pod(binder, ns, name, uid, node)
            if isinstance(found, tuple):
                return found
            info = found
        plan = self.cache.prepare_bind(pod_id, node, info)
        if isinstance(plan, BindRefused):
            return ExtenderBindingResult(error=f"neuronetes extender: {plan.reason}"), "refused"
        if plan.already_bound:
            return ExtenderBindingResult(), "ok"
        ref = PodRef(ns, name, uid)
        if plan.group:
            # The barrier: no member is bound before every member has reached bind. On a refusal
            # kube-scheduler forgets what it assumed for the pod and retries it later.
            why = await self.barrier.wait(plan, ref, self.cache.settings.get().bind_wait_seconds)
            if why is not None:
                return ExtenderBindingResult(error=f"neuronetes extender: {why}"), "refused"
        started = time.perf_counter()
        try:
            await binder.bind(ns, name, uid, node, plan.annotations)
        except KubeError as exc:
            self._api_took("binding", started)
            if exc.status == CONFLICT:
                # Already bound (a retried bind) or the pod was replaced: read what is true now.
                try:
                    current = await binder.get_pod(ns, name)
                except KubeError:
                    current = None
                if (
                    current is not None
                    and current.spec.node_name == node
                    and (not uid or current.metadata.uid == uid)
                ):
                    self.cache.bind_done(plan, ok=True, pod=current)
                    return ExtenderBindingResult(), "ok"
            self.cache.bind_done(plan, ok=False, ambiguous=exc.ambiguous)
            return ExtenderBindingResult(
                error=f"neuronetes extender: binding {ns}/{name} to {node}: {exc}"
            ), "error"
        self._api_took("binding", started)
        self.cache.bind_done(plan, ok=True)
        if plan.assignment is not None:
            self.events.record(ref, REASON_ASSIGNED, placement_note(plan), action="Bind")
        if self.metrics is not None:
            self.metrics.success.inc()
        return ExtenderBindingResult(), "ok"

    async def _fetch_pod(
        self, binder: Binder, ns: str, name: str, uid: str, node: str
    ) -> PodInfo | tuple[ExtenderBindingResult, str]:
        """The pod to bind as the API server has it, or the bind's answer when there is nothing
        to decide (gone, replaced, or already bound: then the cache learns it)."""
        started = time.perf_counter()
        try:
            pod = await binder.get_pod(ns, name)
        except KubeError as exc:
            return ExtenderBindingResult(
                error=f"neuronetes extender: reading pod {ns}/{name}: {exc}"
            ), "error"
        finally:
            self._api_took("get_pod", started)
        if pod is None or (uid and pod.metadata.uid != uid):
            return ExtenderBindingResult(error=f"pod {ns}/{name} ({uid}) does not exist"), "error"
        if pod.spec.node_name:
            self.cache.upsert_pod(pod)
            if pod.spec.node_name == node:
                return ExtenderBindingResult(), "ok"
            return ExtenderBindingResult(
                error=f"pod {ns}/{name} is already bound to {pod.spec.node_name}"
            ), "error"
        return PodInfo.from_pod(pod)

    def _api_took(self, call: str, started: float) -> None:
        """Export how long an API server call of the bind verb took (its share of bind latency)."""
        if self.metrics is not None:
            self.metrics.api_latency.labels(call).observe(time.perf_counter() - started)

    # ---- preempt -----------------------------------------------------------------------------------
    def preempt(self, request: PreemptRequest) -> tuple[ExtenderPreemptionResult, str]:
        """Per node kube-scheduler proposes, the victims per GPU (`GpuCache.refine_victims`: the
        lower-priority pods on the node whose eviction lets the pod's GPUs fit, chosen by
        kube-scheduler's own order, a victim given back only on the GPU it holds); a node where
        no eviction makes room is dropped. A dry run: nothing in the cache changes."""
        proposed: dict[str, tuple[list[tuple[str, str, int]], int]] = {}
        for node, (asked, pdb) in request.proposed.items():
            known = [
                (uid, pod_id, prio if prio is not None else self._priority(pod_id))
                for uid, pod_id, prio in asked
            ]
            proposed[node] = (known, pdb)
        pod = PodInfo.from_pod(request.pod)
        if not pod.wants_gpu or not self.cache.synced:
            out = {node: meta_victims(v, pdb) for node, (v, pdb) in proposed.items()}
            return ExtenderPreemptionResult(node_name_to_meta_victims=out), "passthrough"
        out = {}
        for node, (victims, pdb) in proposed.items():
            if self.cache.node_spec(node) is None:
                out[node] = meta_victims(victims, pdb)  # not ours to judge
                continue
            refined = self.cache.refine_victims(pod, node)
            if refined is None:
                continue  # even every lower-priority pod there would not make room for the GPUs
            evicted, violations = refined
            chosen = [(v.uid or v.id, v.id, v.priority) for v in evicted]
            out[node] = meta_victims(chosen, violations)  # by the PDBs the cache watches
        return ExtenderPreemptionResult(node_name_to_meta_victims=out), "ok"

    def _priority(self, pod_id: str) -> int:
        known = self.cache.pod(pod_id)
        return known.priority if known is not None else 0
