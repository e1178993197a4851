"""One AgentPool reconcile: read the pool and its pods, apply the plan, write status and events.

The decisions are made by pure functions (`policy.resolve`, `pods.desired_pods`,
`reconcile.plan`, `status.pool_status`); this module only does the API calls around them, with
the synchronous Kubernetes client (the kopf handlers run it in worker threads).

Why one module past 400 lines: it is where the steps of a pool reconcile meet, in their order
(the node view and clock, the fallback step, the spot split, the budget, gang retries, the
batch, the status): each step's logic is a pure module of its own (`fallback`, `spot_plan`,
`budget`, `gang_retry`, `reconcile`, `status`), and splitting the order itself would hide it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import msgspec
from kubernetes import client
from kubernetes.client.rest import ApiException

from neuronetes import contracts as c
from neuronetes.api.models import (
    AgentPool,
    AgentPoolSpec,
    AgentPoolStatus,
    CacheAware,
    ModelCacheStatus,
    decode,
)
from neuronetes.pricing import PriceTable
from neuronetes.spot import Notice

from . import CONVERT_LOCK
from .budget import BudgetPlan, PoolPrices, PrimaryCost, cost_status, plan_budget, primary_cost
from .fallback import choose_model, policy_inputs
from .gang_retry import GangRetries, plan_gang_retries
from .locality import scheduling_annotations
from .nodecache import NodeCache, node_view
from .objects import api_message, patch_status, post_event
from .pods import LABEL_POOL, DesiredPod, alternate_name, desired_pods, served_template
from .policy import ResolvedPool, cost_optimization_enabled, resolve
from .preload import plan_preload, preload_job, read_gpunode_page, read_job
from .reconcile import LIST_PAGE, Action, batch, plan, read_pod_page
from .settings import OperatorSettings
from .spot_plan import SpotPlan, SpotState, plan_spot, spot_state, with_capacity
from .status import COST_BUDGET_EXCEEDED, NO_MATCHING_NODES, pool_status
from .tiers import DEFAULT_TIERS, PriorityTier, TierError, with_tier

__all__ = ["PoolController"]

log = logging.getLogger("neuronetes_operator")
_CONVERT = CONVERT_LOCK
PLURAL = "agentpools"
_REASON_TEXT = {
    "Created": "created pods {names}",
    "ScaledDown": "deleted pods {names}: the pool wants fewer replicas",
    "PodFinished": "deleted pods {names}: they failed or exited; they are recreated",
    "GangBroken": "deleted pods {names}: their gang lost a member after binding; the gang is recreated whole",
    "Outdated": "deleted pods {names}: the pool's spec changed (rolling replacement)",
    "SpotReplacement": "created pods {names}: they replace pods on nodes under an interruption notice",
    "SpotReplaced": "deleted pods {names}: their replacements are Ready, or the notice's deadline came",
    "SpotInterrupted": "deleted pods {names}: their node is under an interruption notice (scale-down)",
    "SpotRebalanced": "moved pods {names} off spot: over the pool's spot share (maxSpotPercent, or spot off)",
    "OverBudget": "deleted pods {names}: their cost no longer fits the pool's maxCostPerHour",
}
_NORMAL = ("Created", "ScaledDown", "SpotReplacement", "SpotReplaced", "SpotRebalanced")
REPLACEMENT_POLL_S = 2.0
"""While a replacement is under way its pool is reconciled at least this often (the deadline)."""
PRELOAD_POLL_S = 2.0
"""While a preload is under way its pool is reconciled at least this often (the Job's outcome)."""


def _budget(spec: AgentPoolSpec) -> float | None:
    """The pool's ``maxCostPerHour`` while its cost optimization is on (None: no budget)."""
    cost = spec.scheduling.cost_optimization if spec.scheduling else None
    if cost is None or not cost_optimization_enabled(cost):
        return None
    return cost.max_cost_per_hour


def _over_budget(actions: list[Action], budget: BudgetPlan) -> list[Action]:
    """The plan's deletions of pods the budget left out say so (their Event's reason), under either
    of a replica's names (`pods.alternate_name`)."""
    dropped = budget.dropped | {alternate_name(n) for n in budget.dropped}
    return [
        replace(a, reason="OverBudget") if a.verb == "delete" and a.name in dropped else a for a in actions
    ]


def _names(names: list[str], shown: int = 10) -> str:
    head = ", ".join(names[:shown])
    return head if len(names) <= shown else f"{head} and {len(names) - shown} more"


def _recorded_notices(spot: Mapping[str, Any], now: datetime) -> dict[str, datetime]:
    """When the notices in a pool's ``status.spot`` began, for those whose deadline is still ahead:
    a restarted operator keeps their deadlines (a notice on a node whose last one is over is new)."""
    out = {}
    for item in spot.get("interruptions") or []:
        try:
            noticed = datetime.fromisoformat(str(item["noticed"]))
            deadline = datetime.fromisoformat(str(item["deadline"]))
        except (KeyError, ValueError):
            continue
        if deadline > now:
            out[str(item.get("node"))] = noticed
    return out


class PoolController:
    """Reconciles AgentPools; thread-safe (one reconcile per pool at a time is the caller's job)."""

    def __init__(
        self,
        api: client.ApiClient,
        settings: OperatorSettings,
        tiers: tuple[PriorityTier, ...] = DEFAULT_TIERS,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.batch = client.BatchV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.api = api
        self.settings = settings
        self.tiers = tiers
        self.node_cache = NodeCache(rebalance_notices=settings.spot_rebalance_notices)
        self.wake: dict[tuple[str, str], float] = {}  # pool → reconcile again after this many seconds
        self.retries = GangRetries(settings.gang_retry_seconds, settings.gang_retry_max_seconds)
        self._calls = ThreadPoolExecutor(max_workers=16, thread_name_prefix="pod-calls")

    # ---- node cache (`nodecache`: fed by the kopf node watch and full lists) ---------------------

    def node_seen(self, name: str, body: Mapping[str, Any] | None) -> bool:
        """A node watch event (None: deleted); whether an interruption notice appeared on it (the
        caller reconciles every pool then)."""
        return self.node_cache.seen(name, body)

    def list_nodes(self) -> bool:
        """List every node into the cache (`nodecache.NodeCache.replace`), in pages of `LIST_PAGE`
        as raw JSON, keeping of each only what a reconcile reads; whether an interruption notice
        appeared. Raises the API's errors."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            found = self.core.list_node(limit=LIST_PAGE, _continue=token, _preload_content=False)
            page = msgspec.json.decode(found.data)
            items.extend(node_view(str(i["metadata"]["name"]), i) for i in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return self.node_cache.replace(items)

    def set_price_table(self, table: PriceTable) -> None:
        """The price table changed (the caller then reconciles every pool)."""
        self.node_cache.set_prices(table)

    def _spot_pass(
        self,
        pool: Mapping[str, Any],
        resolved: ResolvedPool,
        want: list[DesiredPod],
        pods: list[dict[str, Any]],
        nodes: Mapping[str, Mapping[str, Any]],
        notices: Mapping[str, Notice],
        spot_off: bool,
        at: datetime,
    ) -> tuple[SpotPlan, SpotState, list[Action]]:
        """The spot split of `want` (`spot_plan`): the replacements and moves, the spot state, and
        the ordinary plan's actions with their creations made spot-capable while the share allows."""
        moves = plan_spot(want, pods, nodes, notices, resolved, spot_off=spot_off, now=at)
        spot = spot_state(pool, resolved, moves, notices, now=at)
        if spot.disables_spot != spot_off:
            # The threshold tripped (or cleared) now: plan again, so this very reconcile acts on it.
            moves = plan_spot(want, pods, nodes, notices, resolved, spot_off=spot.disables_spot, now=at)
        return moves, spot, with_capacity(plan(want, pods, moves.deleting), moves)

    # ---- the reconcile -------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> bool:
        """Reconcile one pool: at most one batch of pod changes (`reconcile.batch`, the settings'
        ``batchSize``). Whether changes are left for another reconcile (the caller requeues it)."""
        try:
            pool = self.custom.get_namespaced_custom_object(c.GROUP, c.VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                self.retries.forget_pool(namespace, name)
                return False  # deleted: its pods and budget go with it (ownerReferences)
            raise
        try:
            with _CONVERT:
                spec = decode(pool, AgentPool).spec
        except msgspec.ValidationError as exc:
            self._event(pool, "Warning", "InvalidSpec", f"the pool's spec cannot be used: {exc}")
            self._write_status(pool, AgentPoolStatus(phase="Failed"))
            return False
        # No msgspec conversion below until the status is written: no lock is held over the pods.
        resolved = resolve(spec)
        try:
            resolved = with_tier(resolved, spec.scheduling, self.tiers)
        except TierError as exc:  # e.g. a tier the admin removed since the pool was admitted
            self._event(pool, "Warning", "InvalidSpec", f"the pool's priority cannot be used: {exc}")
            self._write_status(pool, AgentPoolStatus(phase="Failed"))
            return False
        self._ensure_budget(pool, resolved.desired, resolved.gang_size, spec.min_replicas)
        # One view of the nodes and one clock for every step of this reconcile.
        nodes, table = self.node_cache.snapshot()
        at = datetime.now(UTC)
        # The fallback step (`fallback`): the model served decides the pods' template, so a switch
        # is the rolling replacement of outdated pods below.
        primary = self._primary_cost(pool, spec, resolved, nodes, table)
        inputs = policy_inputs(
            pool,
            spec,
            resolved,
            nodes,
            now=at.timestamp(),
            autoscaler_on=self.settings.autoscaler.enabled,
            primary=primary,
        )
        model = choose_model(pool, spec, inputs, now=at.timestamp(), primary=primary)
        want = desired_pods(
            pool,
            spec,
            resolved,
            tolerations=self.settings.pod_tolerations,
            model=None if model is None else model.model,
        )
        pods = self._pods(namespace, name, pool["metadata"]["uid"])
        old_spot = (pool.get("status") or {}).get("spot") or {}
        notices = self.node_cache.notices(nodes, _recorded_notices(old_spot, at), at)
        spot_off = (
            bool(old_spot.get("thresholdTrippedAt")) and resolved.spot.threshold_action == "disable-spot"
        )
        # The spot split first: it decides which pods to create are spot-capable, and a spot-capable
        # pod is projected at the dearest node it may land on, an on-demand one at the dearest
        # on-demand node (`budget.PoolPrices`). Then the budget keeps what fits; if it left replicas
        # out, the split is planned again on what it kept (the share is of the pool's replicas), no
        # creation becoming spot-capable that was not (it could cost more than the budget counted).
        # Replacements (`spot_plan`) are never held back: a replica being replaced counts once.
        moves, spot, planned = self._spot_pass(pool, resolved, want, pods, nodes, notices, spot_off, at)
        capable = {a.name: a.pod.spot for a in planned if a.verb == "create" and a.pod is not None}
        prices = PoolPrices.of(nodes, table, want)
        budget = plan_budget(
            [replace(d, spot=capable.get(d.name, False)) for d in want], pods, prices, _budget(spec)
        )
        if budget.dropped:
            want = budget.kept
            moves, spot, planned = self._spot_pass(pool, resolved, want, pods, nodes, notices, spot_off, at)
            planned = [
                replace(a, pod=replace(a.pod, spot=False))
                if a.pod is not None and a.pod.spot and not capable.get(a.name, False)
                else a
                for a in planned
            ]
        for etype, reason, message in spot.events:
            self._event(pool, etype, reason, message)
        actions, later = batch(moves.actions + _over_budget(planned, budget), self.settings.batch_size)
        if moves.in_flight:  # old and new pods both exist: the deadline must not wait for an event
            self.wake[(namespace, name)] = REPLACEMENT_POLL_S
        gang_notes = self._retry_failed_gangs(pool, resolved.gang_size, want, pods, actions)
        self._scheduling_annotations(namespace, spec, nodes, actions)
        # Concurrently: a gang's members are created together, and a batch is not created one
        # round trip (through the webhook) at a time. One event per reason, naming the pods.
        applied = list(self._calls.map(lambda a: self._apply(pool, a), actions))
        by_reason: dict[str, list[str]] = {}
        for action, ok in zip(actions, applied, strict=True):
            if ok:
                by_reason.setdefault(action.reason, []).append(action.name)
        for reason, names in by_reason.items():
            if reason == "GangRetry":
                continue  # said by `_retry_failed_gangs`, with the reservation's outcome
            etype = "Normal" if reason in _NORMAL else "Warning"
            self._event(pool, etype, reason, _REASON_TEXT[reason].format(names=_names(names)))
        if actions:
            pods = self._pods(namespace, name, pool["metadata"]["uid"])
        if model is not None and model.event is not None:
            self._event(pool, *model.event)
        cost = cost_status(budget, pods, prices)
        gpu_type = spec.gpu_requirements.type
        status = pool_status(
            pool,
            resolved,
            pods,
            nodes,
            gang_notes=gang_notes,
            backlog=len(later),
            nodes_of_type=None if gpu_type is None else self._nodes_of_type(gpu_type, nodes),
            spot=spot.status if spot.shown else None,
            extra_conditions=spot.conditions,
            model=model,
            cost=cost,
            budget=budget,
        )
        served = spec.model if model is None else model.model
        status = msgspec.structs.replace(status, cache=self._preload(pool, spec, served, nodes, at))
        self._event_on_transition(pool, status)
        self._write_status(pool, status)
        return bool(later)

    def _preload(
        self,
        pool: Mapping[str, Any],
        spec: AgentPoolSpec,
        model: str | None,
        nodes: Mapping[str, Mapping[str, Any]],
        at: datetime,
    ) -> ModelCacheStatus | None:
        """The preload step (`preload.plan_preload`): delete the Jobs that are done, start those
        still needed (at most `preload.MAX_STARTS`); ``status.cache``. Nothing is read for a pool
        that neither preloads nor did."""
        cache = spec.scheduling.cache_aware if spec.scheduling else None
        old = (pool.get("status") or {}).get("cache")
        if (cache is None or cache.preload_strategy is None) and not old:
            return None
        meta = pool["metadata"]
        ns, name = meta["namespace"], meta["name"]
        found = self.batch.list_namespaced_job(
            ns, label_selector=f"{c.LABEL_PRELOAD_POOL}={name}", _preload_content=False
        )
        items = msgspec.json.decode(found.data).get("items") or []
        jobs = [
            read_job(j)
            for j in items
            if any(o.get("uid") == meta["uid"] for o in j["metadata"].get("ownerReferences") or [])
        ]
        if cache is None or cache.preload_strategy is None:
            plan = plan_preload(CacheAware(), None, ns, nodes, {}, jobs, at)
        else:
            plan = plan_preload(
                cache,
                model,
                ns,
                nodes,
                self._cached_models(),
                jobs,
                at,
                previously_failed=(old or {}).get("failed") or (),
            )
        for job in plan.delete:
            try:
                self.batch.delete_namespaced_job(job, ns, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        template = served_template(spec, resolve(spec), model)
        started = []
        for node in plan.create:
            assert model is not None
            body = preload_job(
                pool, node, model, template, self.settings.pod_tolerations, self.settings.model_cache_dir
            )
            try:
                self.batch.create_namespaced_job(ns, body)
                started.append(node)
            except ApiException as exc:
                if exc.status == 409:
                    continue  # a racing reconcile created it
                self._event(
                    pool, "Warning", "PreloadRefused", f"preload Job on {node} refused: {api_message(exc)}"
                )
        if started:
            self._event(pool, "Normal", "PreloadStarted", f"preloading {model} on nodes {_names(started)}")
        for etype, reason, message in plan.events:
            self._event(pool, etype, reason, message)
        if plan.status is not None and (plan.create or plan.status.preloading):
            self.wake[(ns, name)] = PRELOAD_POLL_S  # Jobs finish without an event the pool sees
        return plan.status

    def _scheduling_annotations(
        self,
        namespace: str,
        spec: AgentPoolSpec,
        nodes: Mapping[str, Mapping[str, Any]],
        actions: list[Action],
    ) -> None:
        """Give the pods this batch creates the pool's current data-locality hints and candidate
        limit (`locality.scheduling_annotations`), read only when there is a pod to create."""
        scheduling = spec.scheduling
        if scheduling is None or (scheduling.data_locality is None and scheduling.fast_scheduling is None):
            return
        templates = {id(a.pod.template): a.pod.template for a in actions if a.verb == "create" and a.pod}
        if not templates:
            return
        found = scheduling_annotations(self.core, self.apps, namespace, spec, nodes)
        for template in templates.values():
            template.scheduling_annotations = found

    def _primary_cost(
        self,
        pool: Mapping[str, Any],
        spec: AgentPoolSpec,
        resolved: ResolvedPool,
        nodes: Mapping[str, Mapping[str, Any]],
        table: PriceTable,
    ) -> PrimaryCost | None:
        """While the fallback model serves a pool with a budget: what ``spec.model``'s pods would
        cost (`budget.PrimaryCost`); else None."""
        budget = _budget(spec)
        active = (pool.get("status") or {}).get("activeModel")
        if budget is None or resolved.fallback_model is None or active != resolved.fallback_model:
            return None
        want = desired_pods(pool, spec, resolved, tolerations=self.settings.pod_tolerations, model=spec.model)
        return primary_cost(want, PoolPrices.of(nodes, table, want), budget)

    def _cached_models(self) -> dict[str, frozenset[str]]:
        """Per node with a GPUNode, the models its agent reports cached: the GPUNodes read in pages
        of `LIST_PAGE` as raw JSON, decoded into names and model lists only
        (`preload.read_gpunode_page`)."""
        out: dict[str, frozenset[str]] = {}
        token: str | None = None
        while True:
            found = self.custom.list_cluster_custom_object(
                c.GROUP, c.VERSION, "gpunodes", limit=LIST_PAGE, _continue=token, _preload_content=False
            )
            token = read_gpunode_page(found.data, out)
            if token is None:
                return out

    def _retry_failed_gangs(
        self,
        pool: Mapping[str, Any],
        gang_size: int,
        want: list[DesiredPod],
        pods: list[dict[str, Any]],
        actions: list[Action],
    ) -> dict[str, str]:
        """Recreate the gangs whose reservation the extender reported Failed or Expired
        (`gang_retry.plan_gang_retries`): `actions` gains their deletions and loses their
        creations. Per such gang: what the ``GangScheduled`` condition says about it."""
        if not gang_size:
            return {}
        meta = pool["metadata"]
        try:
            found = self.custom.list_namespaced_custom_object(
                c.GROUP, c.VERSION, meta["namespace"], "gangreservations"
            )
        except ApiException as exc:
            if exc.status in (403, 404):  # no GangReservation CRD (or no access): nothing reported
                return {}
            raise
        retry = plan_gang_retries(
            self.retries,
            meta["namespace"],
            gang_size,
            want,
            pods,
            actions,
            found.get("items") or [],
            time.monotonic(),
        )
        actions[:] = retry.actions
        for gang, doomed in retry.retried.items():
            self._event(pool, "Warning", "GangRetry", f"{retry.notes[gang]}; deleted pods {_names(doomed)}")
        return retry.notes

    def _nodes_of_type(self, gpu_type: str, nodes: Mapping[str, Mapping[str, Any]]) -> int | None:
        """Nodes labelled with the pool's GPU type (the pods' affinity: as written or upper-cased).
        None cached is asked of the API server (the node watch may not have listed the nodes yet:
        no pool is told "no such nodes" at start-up); None when it cannot say."""
        values = sorted({gpu_type, gpu_type.upper()})
        cached = sum(
            1
            for node in nodes.values()
            if (node["metadata"].get("labels") or {}).get(c.LABEL_GPU_TYPE) in values
        )
        if cached:
            return cached
        try:
            found = self.core.list_node(
                label_selector=f"{c.LABEL_GPU_TYPE} in ({','.join(values)})", limit=1, _preload_content=False
            )
        except ApiException as exc:
            log.warning("nodes of GPU type %s not listed: %s", gpu_type, exc.status)
            return None
        listed: dict[str, Any] = msgspec.json.decode(found.data)
        return len(listed.get("items") or [])

    def _pods(self, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        """The pool's pods (labelled with its name, controlled by its uid: `reconcile.read_pod_page`),
        read in pages of `LIST_PAGE` as raw JSON, keeping of each only what a reconcile reads: a
        pool's pods never sit in memory in full, nor as the client's objects (bench/README.md,
        "Admission and reconcile cost")."""
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            found = self.core.list_namespaced_pod(
                namespace,
                label_selector=f"{LABEL_POOL}={name}",
                limit=LIST_PAGE,
                _continue=token,
                _preload_content=False,
            )
            token = read_pod_page(found.data, uid, out)
            if token is None:
                return out

    def _apply(self, pool: Mapping[str, Any], action: Action) -> bool:
        """Create or delete one pod; whether it was done by this call."""
        ns = pool["metadata"]["namespace"]
        try:
            if action.verb == "create":
                manifest = action.manifest  # built here, once: only the batch's pods are built
                assert manifest is not None
                self.core.create_namespaced_pod(ns, manifest)
            else:
                self.core.delete_namespaced_pod(action.name, ns)
        except ApiException as exc:
            if exc.status in (404, 409):  # already gone / already there (a racing or earlier reconcile)
                return False
            if exc.status in (400, 403, 422):
                self._event(pool, "Warning", "PodRefused", f"pod {action.name} refused: {api_message(exc)}")
                return False
            raise
        return True

    def _ensure_budget(
        self, pool: Mapping[str, Any], desired: int, gang_size: int, min_replicas: int
    ) -> None:
        meta = pool["metadata"]
        # A gang loses its meaning with any member gone: keep them all; else keep minReplicas.
        min_available = desired if gang_size else min(min_replicas, desired)
        body = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": {LABEL_POOL: meta["name"]},
                "ownerReferences": [
                    {
                        "apiVersion": c.API_VERSION,
                        "kind": "AgentPool",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {LABEL_POOL: meta["name"]}}},
        }
        try:
            self.policy.create_namespaced_pod_disruption_budget(meta["namespace"], body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            patch = {"spec": {"minAvailable": min_available}}
            self.policy.patch_namespaced_pod_disruption_budget(meta["name"], meta["namespace"], patch)

    def _write_status(self, pool: Mapping[str, Any], status: AgentPoolStatus) -> None:
        meta = pool["metadata"]
        with _CONVERT:
            body = {"status": msgspec.to_builtins(status)}
        old = pool.get("status") or {}
        for key in ("placements", "conditions", "policies", "spot", "fallback", "cache"):
            if key in old and key not in body["status"]:
                body["status"][key] = None
        if isinstance(old.get("fallback"), dict) and body["status"].get("fallback"):
            # A merge patch keeps the fields it does not name: clear the triggers and the restore
            # time that no longer hold.
            body["status"]["fallback"] = {**dict.fromkeys(old["fallback"]), **body["status"]["fallback"]}
        # A merge patch keeps what it does not name: a figure that went away is removed by name.
        cost = body["status"].get("cost")
        if cost is not None:
            for key in ("budgetPerHour", "unknownPriceReplicas"):
                if key in (old.get("cost") or {}) and key not in cost:
                    cost[key] = None
        patch_status(self.custom, PLURAL, meta, body)

    def _event_on_transition(self, pool: Mapping[str, Any], status: AgentPoolStatus) -> None:
        """A Warning event when a condition turns bad for a new reason (GangUnplaceable, Unschedulable,
        NoMatchingNodes, CostBudgetExceeded's); a Normal one when the budget holds everything again."""
        old = {cd.get("type"): cd.get("reason") for cd in (pool.get("status") or {}).get("conditions") or []}
        for cd in status.conditions or []:
            if cd.type == COST_BUDGET_EXCEEDED:
                if old.get(cd.type) != cd.reason and (cd.status == "True" or cd.type in old):
                    self._event(
                        pool,
                        "Warning" if cd.status == "True" else "Normal",
                        cd.reason or cd.type,
                        cd.message or "",
                    )
                continue
            if (
                cd.reason
                in (
                    "GangUnplaceable",
                    "GangReservationFailed",
                    "Unschedulable",
                    "PodsFailed",
                    NO_MATCHING_NODES,
                )
                and old.get(cd.type) != cd.reason
            ):
                self._event(pool, "Warning", cd.reason, cd.message or cd.reason)

    def _event(self, pool: Mapping[str, Any], etype: str, reason: str, message: str) -> None:
        post_event(self.core, pool, etype, reason, message)
