"""The kopf operator: watches turned into pool keys, a work queue, `PoolController.reconcile` per key.

The handlers only enqueue: an AgentPool event enqueues that pool, a pod event enqueues the pool
named by the pod's ``neuronetes.io/pool`` label, a GangReservation event the pool whose gang it
reserves, a node event refreshes the node cache (`nodecache`), which the operator also lists in
full before its first pool reconcile and every ``nodeResyncSeconds``. Workers
take keys from the queue, never two for the same pool at once, and a pool that changes while it
is being reconciled is reconciled again afterwards, as is one whose reconcile left pod changes
for the next (its batch was full). No handler adds a finalizer, so pools delete
normally even while the operator is down.

One replica: kopf's peering only pauses an operator while a higher-priority peer runs; it is not
leader election. The operator runs without kopf peering, and a second copy would only duplicate API calls
(pods have deterministic names, so it could not duplicate pods). docs/agentpool.md says so.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, start_http_server

from neuronetes import contracts as c
from neuronetes.kube.client import KubeClient
from neuronetes.kube.pricetable import PriceTableWatch, parse_price_table_ref
from neuronetes.pricing import PriceTable

from .admission import ANNOTATION_SLICE
from .autoscaler import AutoscalerController, AutoscalerMetrics
from .binding_controller import BindingController
from .carbon_gate import CarbonGateController
from .controller import PLURAL, PoolController
from .gang_retry import pool_of_gang
from .mig_layouts import MigLayoutController
from .mig_slices import mig_instances_seen, waits_for_mig_instance
from .objects import post_event
from .pods import LABEL_POOL
from .settings import OperatorSettings
from .slice_controller import SliceController
from .tiers import DEFAULT_TIERS, PriorityTier

__all__ = ["WorkQueue", "build_registry", "run"]

log = logging.getLogger("neuronetes_operator")
Key = tuple[str, str]


class WorkQueue:
    """Keys waiting for a reconcile; a key is queued once however often it is added."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()

    def add(self, key: Key) -> None:
        if key in self._running:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    async def get(self) -> Key:
        key = await self._queue.get()
        self._queued.discard(key)
        self._running.add(key)
        return key

    def done(self, key: Key) -> None:
        self._running.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)


async def _worker(
    queue: WorkQueue,
    reconcile: Callable[[str, str], object],
    wake: dict[Key, float] | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Reconcile keys from `queue`, once `ready` is set (the node cache whole: `_list_nodes`); a
    reconcile that returns true (its batch was full: more to do) is queued again at once, behind
    the keys already waiting; one that put its key in `wake` (a spot replacement under way: its
    deadline) is queued again after that many seconds."""
    if ready is not None:
        await ready.wait()
    while True:
        key = await queue.get()
        more = False
        try:
            more = bool(await asyncio.to_thread(reconcile, *key))
        except Exception as exc:  # a failed reconcile is retried; the loop must not die
            log.warning("reconcile of %s/%s failed: %s; retrying", key[0], key[1], exc)
            asyncio.get_running_loop().call_later(2.0, queue.add, key)
        finally:
            queue.done(key)
        if more:
            queue.add(key)
        elif wake is not None and (after := wake.pop(key, None)) is not None:
            asyncio.get_running_loop().call_later(after, queue.add, key)


async def _ticks(what: str, tick: Callable[[], object], every: float) -> None:
    """A timer-driven controller's ticks, one at a time, every `every` seconds: the autoscaling
    controller (docs/autoscaling.md, "The controller"; a tick's work is bounded by its settings,
    poolsPerTick and bindingsPerTick), the carbon gate-release controller (docs/carbon.md) and the
    MIG layout controller (docs/mig.md; maxDemandPerTick, maxGpusPerTick, maxNodesPerTick)."""
    while True:
        started = asyncio.get_running_loop().time()
        try:
            await asyncio.to_thread(tick)
        except Exception as exc:  # the next tick retries; the loop must not die
            log.warning("%s tick failed: %s", what, exc)
        await asyncio.sleep(max(0.0, every - (asyncio.get_running_loop().time() - started)))


async def _queue_all(queues: Mapping[str, WorkQueue], controller: PoolController) -> None:
    """Queue every object of each plural in `queues`."""
    for plural, queue in queues.items():
        try:
            found = await asyncio.to_thread(
                controller.custom.list_cluster_custom_object, c.GROUP, c.VERSION, plural
            )
        except Exception as exc:  # the next round retries; the loop must not die
            log.warning("resync of %s failed: %s", plural, exc)
            continue
        for item in found.get("items", []):
            queue.add((item["metadata"]["namespace"], item["metadata"]["name"]))


NODE_LIST_RETRY_S = (1.0, 30.0)
"""A failed node list is retried after 1 s, doubling to at most 30 s."""


async def _list_nodes(
    controller: PoolController, queue: WorkQueue, every: float, listed: asyncio.Event
) -> None:
    """The node cache's full lists (`nodecache`): the first as soon as the API answers (`listed`
    is set then: the pool workers wait for it), then one every `every` seconds; a list that shows
    a new interruption notice queues every pool, as the watch's event would have."""
    delay = NODE_LIST_RETRY_S[0]
    while True:
        try:
            appeared = await asyncio.to_thread(controller.list_nodes)
        except Exception as exc:  # retried; the loop must not die
            log.warning("listing the nodes failed: %s; retrying in %.0f s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, NODE_LIST_RETRY_S[1])
            continue
        delay = NODE_LIST_RETRY_S[0]
        listed.set()
        if appeared:
            await _queue_all({PLURAL: queue}, controller)
        await asyncio.sleep(every)


async def _resync(queues: Mapping[str, WorkQueue], controller: PoolController, every: float) -> None:
    """Every `every` seconds, every pool and every slice (a Pending one may fit now) is queued."""
    while True:
        await asyncio.sleep(every)
        await _queue_all(queues, controller)


PRICE_TABLE_WAIT_S = 10.0
"""How long the operator waits at start for the price table's first list before reconciling (a
pool with a budget reconciled without its prices would hold back pods it can afford)."""


async def _watch_prices(ref: str, api: Any, controller: PoolController, queue: WorkQueue) -> PriceTableWatch:
    """Keep `controller`'s price table current from the ConfigMap `ref` (``NAMESPACE/NAME``): each
    change queues every pool (their budgets and costs are priced again); an invalid table is a
    Warning Event on the ConfigMap."""
    loop = asyncio.get_running_loop()

    def changed(table: PriceTable) -> None:
        controller.set_price_table(table)
        asyncio.run_coroutine_threadsafe(_queue_all({PLURAL: queue}, controller), loop)

    def invalid(configmap: Mapping[str, Any], message: str) -> None:
        post_event(
            controller.core,
            {**configmap, "apiVersion": "v1", "kind": "ConfigMap"},
            "Warning",
            "InvalidPriceTable",
            message,
        )

    namespace, name = parse_price_table_ref(ref)
    watch = PriceTableWatch(KubeClient(api), namespace, name, on_change=changed, on_invalid=invalid).start()
    if not await asyncio.to_thread(watch.wait_synced, PRICE_TABLE_WAIT_S):
        log.warning(
            "price table %s not listed yet; reconciling without it (pools are queued again once it is)", ref
        )
    return watch


def connection_info(cfg: Any) -> kopf.ConnectionInfo:
    """kopf's credentials from a `kubernetes.client.Configuration` (kubeconfig or in-cluster)."""
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


def build_registry(settings: OperatorSettings, api: Any, controller_factory: Any) -> kopf.OperatorRegistry:
    """The kopf handlers, registered in their own registry (nothing global)."""
    registry = kopf.OperatorRegistry()
    metrics_registry = CollectorRegistry()
    # The handlers are coroutines: they run on the loop that owns the queue (sync handlers would run
    # in kopf's thread pool, and asyncio queues are not thread-safe).
    state: dict[str, Any] = {"api": api, "bindings": {}, "metrics": AutoscalerMetrics(metrics_registry)}
    state.update(mig_waiting=set(), mig_seen={})  # Pending MIG slices; per GPUNode, its MIG instances
    cfg = settings

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # our Events say what was done and why; kopf's would be noise
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix="operator.neuronetes.io"
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="operator.neuronetes.io"
        )
        settings.watching.server_timeout = 300
        settings.watching.inactivity_timeout = 600
        queue, slice_queue, binding_queue = WorkQueue(), WorkQueue(), WorkQueue()
        controller = controller_factory()
        if cfg.price_table:
            state["prices"] = await _watch_prices(cfg.price_table, api, controller, queue)
        slices = SliceController(api, lambda *a: post_event(controller.core, *a))
        state.update(queue=queue, controller=controller, slice_queue=slice_queue, binding_queue=binding_queue)
        # No pool is reconciled on a partial view of the nodes (`nodecache`): the workers wait for
        # the first full list.
        listed = asyncio.Event()
        state["tasks"] = [
            asyncio.create_task(_list_nodes(controller, queue, cfg.node_resync_seconds, listed)),
            *(
                asyncio.create_task(_worker(queue, controller.reconcile, controller.wake, listed))
                for _ in range(cfg.workers)
            ),
        ]
        # One slice worker: slices are bound one at a time (see slice_controller).
        state["tasks"].append(asyncio.create_task(_worker(slice_queue, slices.reconcile)))
        bindings = BindingController(api)
        state["tasks"].append(asyncio.create_task(_worker(binding_queue, bindings.reconcile)))
        if cfg.metrics_port:
            state["metrics_server"] = start_http_server(cfg.metrics_port, registry=metrics_registry)[0]
        if cfg.autoscaler.enabled:
            autoscaler = AutoscalerController(api, cfg.autoscaler, state["metrics"], cfg.namespaces)
            state["autoscaler"] = autoscaler
            state["tasks"].append(
                asyncio.create_task(_ticks("autoscaling", autoscaler.tick, cfg.autoscaler.interval_seconds))
            )
        if cfg.carbon.enabled:
            gates = CarbonGateController(api, cfg.carbon, cfg.namespaces)
            state["tasks"].append(
                asyncio.create_task(_ticks("carbon gate", gates.tick, cfg.carbon.interval_seconds))
            )
        if cfg.mig_layouts.enabled:
            relayouts = MigLayoutController(api, cfg.mig_layouts, cfg.namespaces)
            state["tasks"].append(
                asyncio.create_task(_ticks("MIG layout", relayouts.tick, cfg.mig_layouts.interval_seconds))
            )
        state["tasks"].append(
            asyncio.create_task(
                _resync(
                    {PLURAL: queue, "gpuslices": slice_queue, "toolbindings": binding_queue},
                    controller,
                    cfg.resync_seconds,
                )
            )
        )

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # An own registry has no default login handler; kopf's reads only the default kubeconfig.
        return connection_info(state["api"].configuration)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in state.get("tasks", []):
            task.cancel()
        if "autoscaler" in state:
            state["autoscaler"].close()
        if "prices" in state:
            await asyncio.to_thread(state["prices"].stop, 2.0)
        if "metrics_server" in state:
            state["metrics_server"].shutdown()

    @kopf.on.event(c.GROUP, c.VERSION, PLURAL, registry=registry)
    async def pool_event(namespace: str | None, name: str, **_: Any) -> None:
        if namespace:
            state["queue"].add((namespace, name))
            for binding in state["bindings"].get(namespace, ()):  # a pool appeared or went
                state["binding_queue"].add((namespace, binding))

    @kopf.on.event("", "v1", "pods", labels={LABEL_POOL: kopf.PRESENT}, registry=registry)
    async def pod_event(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        if namespace:
            state["queue"].add((namespace, labels[LABEL_POOL]))

    @kopf.on.event(c.GROUP, c.VERSION, "toolbindings", registry=registry)
    async def binding_event(namespace: str | None, name: str, **_: Any) -> None:
        if namespace:
            state["bindings"].setdefault(namespace, set()).add(name)
            state["binding_queue"].add((namespace, name))

    @kopf.on.event(c.GROUP, c.VERSION, "gpuslices", registry=registry)
    async def slice_event(
        namespace: str | None, name: str, body: Mapping[str, Any], type: str | None, **_: Any
    ) -> None:
        if namespace:
            state["slice_queue"].add((namespace, name))
            waiting = type != "DELETED" and waits_for_mig_instance(body)
            (state["mig_waiting"].add if waiting else state["mig_waiting"].discard)((namespace, name))
            if type == "DELETED" and (body.get("spec") or {}).get("migProfile"):
                for key in sorted(state["mig_waiting"]):  # its instance is free for them now
                    state["slice_queue"].add(key)

    @kopf.on.event(c.GROUP, c.VERSION, "gpunodes", registry=registry)
    async def gpunode_event(name: str, body: Mapping[str, Any], **_: Any) -> None:
        # A node's MIG instances or their holders changed (a relayout landed, an instance was
        # freed): the Pending MIG slices are bound now, not at the next resync.
        seen = mig_instances_seen(body)
        if state["mig_seen"].get(name) != seen:
            state["mig_seen"][name] = seen
            for key in sorted(state["mig_waiting"]):
                state["slice_queue"].add(key)

    @kopf.on.event("", "v1", "pods", annotations={ANNOTATION_SLICE: kopf.PRESENT}, registry=registry)
    async def slice_pod_event(namespace: str | None, annotations: Mapping[str, str], **_: Any) -> None:
        if namespace:
            state["slice_queue"].add((namespace, annotations[ANNOTATION_SLICE]))

    @kopf.on.event(c.GROUP, c.VERSION, "gangreservations", registry=registry)
    async def reservation_event(namespace: str | None, spec: Mapping[str, Any], **_: Any) -> None:
        pool = pool_of_gang(str(spec.get("groupName") or ""))
        if namespace and pool:  # a pool's gang reservation changed (it may have failed)
            state["queue"].add((namespace, pool))

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(name: str, body: Mapping[str, Any], type: str | None, **_: Any) -> None:
        if state["controller"].node_seen(name, None if type == "DELETED" else body):
            # An interruption notice: every pool is reconciled (those with pods there replace them).
            await _queue_all({PLURAL: state["queue"]}, state["controller"])

    return registry


def run(
    settings: OperatorSettings,
    *,
    kubeconfig: str | None,
    stop: threading.Event | None = None,
    tiers: tuple[PriorityTier, ...] = DEFAULT_TIERS,
) -> None:
    """Run the operator until `stop` is set or the process is signalled (SIGTERM/SIGINT); pools'
    priorities map onto `tiers` (`tiers.pool_priority`)."""
    from kubernetes import client, config

    if kubeconfig:
        api = config.new_client_from_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
            api = client.ApiClient()
        except config.ConfigException:  # not in a pod: $KUBECONFIG, else ~/.kube/config (as the others)
            api = config.new_client_from_config()
    registry = build_registry(settings, api, lambda: PoolController(api, settings, tiers))
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one INFO line per watch event
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        stop_flag=stop,
    )
