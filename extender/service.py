"""The extender's verbs: wire structs in, the cache's decisions, wire structs out.

No HTTP here (`neuronetes.extender.app` does that) and no placement logic (the cache and the
engine do that): each verb translates kube-scheduler's request, asks the `GpuCache`, and
translates the answer back. Every verb returns ``(result, outcome)``; the outcome labels the
latency metric.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from .cache import BindRefusedError, GpuCache, PodUnknownError
from .gangs import GangSpec
from .kube import Binder, KubeError
from .metrics import ExtenderMetrics
from .pods import PodInfo, pod_identity
from .reservations import GroupDirectory
from .wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    MetaPod,
    MetaVictims,
    RawNodeList,
    decode_node,
)

__all__ = ["BadInputError", "ExtenderService", "NodeSet"]

log = logging.getLogger(__name__)

NOT_SYNCED: Final = "neuronetes extender: gpu cache not synced with the API server yet"
CONFLICT: Final = 409


class BadInputError(ValueError):
    """A request that decoded but cannot be acted on (the HTTP layer answers 400)."""


@dataclass(frozen=True, slots=True)
class NodeSet:
    """The nodes of a filter/prioritize request, in either ``nodeCacheCapable`` mode."""

    names: list[str]
    raw: dict[str, msgspec.Raw] | None  # name -> the node object as sent (full-object mode)
    by_name: bool  # the request listed NodeNames (answer in NodeNames)

    @classmethod
    def of(cls, args: ExtenderArgs) -> NodeSet:
        raw: dict[str, msgspec.Raw] | None = None
        names: list[str] = []
        if args.nodes is not None:
            raw = {}
            for k, item in enumerate(args.nodes.items or ()):
                try:
                    name = decode_node(item).metadata.name
                except msgspec.DecodeError as exc:
                    raise BadInputError(f"Nodes.items[{k}]: {exc}") from None
                if not name:
                    raise BadInputError(f"Nodes.items[{k}]: node without metadata.name")
                if name not in raw:
                    raw[name] = item
                    names.append(name)
        if args.node_names is not None:
            names = args.node_names  # duplicates are harmless: the cache considers each node once
        return cls(names, raw, args.node_names is not None)

    def answer(self, chosen: Sequence[str]) -> tuple[list[str] | None, RawNodeList | None]:
        """(NodeNames, Nodes) carrying `chosen` in the mode(s) the request used."""
        node_names = list(chosen) if self.by_name or self.raw is None else None
        nodes = None
        if self.raw is not None:
            nodes = RawNodeList(items=[self.raw[n] for n in chosen if n in self.raw])
        return node_names, nodes


class ExtenderService:
    def __init__(
        self,
        cache: GpuCache,
        binder: Binder | None = None,
        metrics: ExtenderMetrics | None = None,
        groups: GroupDirectory | None = None,
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.metrics = metrics
        self.groups = groups or GroupDirectory(None)

    # ---- filter ------------------------------------------------------------------------------------
    def filter(self, args: ExtenderArgs) -> tuple[ExtenderFilterResult, str]:
        nodes = NodeSet.of(args)
        pod = PodInfo.from_pod(args.pod)
        if not pod.wants_gpu:  # not ours: every node passes, untouched
            names, raw = nodes.answer(nodes.names)
            return ExtenderFilterResult(node_names=names, nodes=raw), "passthrough"
        if not self.cache.synced:
            return ExtenderFilterResult(error=NOT_SYNCED), "error"
        if self.metrics is not None:
            self.metrics.attempts.inc()
        gang: GangSpec | None = None
        if pod.gang is not None and not pod.gpu_error:
            found = self.groups.spec_for(pod, self.cache.settings.get().gang_ttl_seconds)
            if isinstance(found, str):
                failed = dict.fromkeys(nodes.names, found)
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
        if decision.hold is not None:
            log.debug(
                "filter %s -> %s gpus %s (%s)",
                pod.key,
                decision.hold.node,
                [g.gpu_index for g in decision.hold.grants],
                decision.hold.reason,
            )
        return result, "scheduled" if decision.feasible else "unschedulable"

    # ---- prioritize --------------------------------------------------------------------------------
    def prioritize(self, args: ExtenderArgs) -> tuple[list[HostPriority], str]:
        nodes = NodeSet.of(args)
        pod = PodInfo.from_pod(args.pod)
        if not pod.wants_gpu or not self.cache.synced:
            return [HostPriority(host=n, score=0) for n in nodes.names], "passthrough"
        scores = self.cache.prioritize(pod, nodes.names)
        return [HostPriority(host=n, score=s) for n, s in zip(nodes.names, scores, strict=True)], "ok"

    # ---- bind --------------------------------------------------------------------------------------
    def bind(self, args: ExtenderBindingArgs) -> tuple[ExtenderBindingResult, str]:
        ns, name, uid, node = args.pod_namespace, args.pod_name, args.pod_uid, args.node
        if not name or not node:
            raise BadInputError("PodName and Node are required")
        binder = self.binder
        if binder is None:
            return ExtenderBindingResult(error="neuronetes extender: binding is not configured"), "error"
        pod_id = pod_identity(uid, ns, name)
        try:
            try:
                plan = self.cache.prepare_bind(pod_id, node)
            except PodUnknownError:
                pod = binder.get_pod(ns, name)
                if pod is None or (uid and pod.metadata.uid != uid):
                    return ExtenderBindingResult(error=f"pod {ns}/{name} ({uid}) does not exist"), "error"
                if pod.spec.node_name:
                    self.cache.upsert_pod(pod)
                    if pod.spec.node_name == node:
                        return ExtenderBindingResult(), "ok"
                    return ExtenderBindingResult(
                        error=f"pod {ns}/{name} is already bound to {pod.spec.node_name}"
                    ), "error"
                plan = self.cache.prepare_bind(pod_id, node, PodInfo.from_pod(pod))
        except BindRefusedError as exc:
            return ExtenderBindingResult(error=f"neuronetes extender: {exc}"), "refused"
        except KubeError as exc:
            return ExtenderBindingResult(
                error=f"neuronetes extender: reading pod {ns}/{name}: {exc}"
            ), "error"
        if plan.already_bound:
            return ExtenderBindingResult(), "ok"
        if plan.group:
            # The barrier: no member is bound before every member has reached bind. On a refusal
            # kube-scheduler forgets what it assumed for the pod and retries it later.
            why = self.cache.await_gang(plan, timeout=self.cache.settings.get().bind_wait_seconds)
            if why is not None:
                return ExtenderBindingResult(error=f"neuronetes extender: {why}"), "refused"
        try:
            binder.bind(ns, name, uid, node, plan.annotations)
        except KubeError as exc:
            if exc.status == CONFLICT:
                # Already bound (a retried bind) or the pod was replaced: read what is true now.
                try:
                    current = binder.get_pod(ns, name)
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
        self.cache.bind_done(plan, ok=True)
        if self.metrics is not None:
            self.metrics.success.inc()
        return ExtenderBindingResult(), "ok"

    # ---- preempt -----------------------------------------------------------------------------------
    def preempt(self, args: ExtenderPreemptionArgs) -> tuple[ExtenderPreemptionResult, str]:
        """Refine kube-scheduler's victims per GPU (a dry run: nothing in the cache changes)."""
        proposed: dict[str, tuple[list[tuple[str, str, int]], int]] = {}  # node -> ([(uid, id, prio)], pdb)
        if args.node_name_to_meta_victims is not None:
            for node, meta in args.node_name_to_meta_victims.items():
                if meta is None:
                    continue
                victims = []
                for p in meta.pods or ():
                    known = self.cache.pod(p.uid)
                    victims.append((p.uid, p.uid, known.priority if known is not None else 0))
                proposed[node] = (victims, meta.num_pdb_violations)
        elif args.node_name_to_victims is not None:
            for node, full in args.node_name_to_victims.items():
                if full is None:
                    continue
                victims = [
                    (
                        p.metadata.uid,
                        pod_identity(p.metadata.uid, p.metadata.namespace, p.metadata.name),
                        p.spec.priority or 0,
                    )
                    for p in full.pods or ()
                ]
                proposed[node] = (victims, full.num_pdb_violations)

        def as_meta(victims: Sequence[tuple[str, str, int]], pdb: int) -> MetaVictims:
            return MetaVictims(pods=[MetaPod(uid=v[0]) for v in victims], num_pdb_violations=pdb)

        pod = PodInfo.from_pod(args.pod)
        if not pod.wants_gpu or not self.cache.synced:
            out = {node: as_meta(v, pdb) for node, (v, pdb) in proposed.items()}
            return ExtenderPreemptionResult(node_name_to_meta_victims=out), "passthrough"
        out = {}
        for node, (victims, pdb) in proposed.items():
            if self.cache.node_spec(node) is None:
                out[node] = as_meta(victims, pdb)  # not ours to judge
                continue
            refined = self.cache.refine_victims(pod, node, [(v[1], v[2]) for v in victims])
            if refined is None:
                continue  # even all these victims would not make room for the pod's GPUs
            by_id = {v[1]: v for v in victims}
            chosen = [by_id[i] for i in refined]
            out[node] = as_meta(chosen, pdb if len(chosen) == len(victims) else min(pdb, len(chosen)))
        return ExtenderPreemptionResult(node_name_to_meta_victims=out), "ok"
