"""The GPU cache's feeds: the node, pod, GPUNode, GPUSlice and PodDisruptionBudget reflectors
of one cache, started together.

Nodes and pods are required (the cache is ready once both are listed); GPUNode and GPUSlice
objects once listed too, but optional (without the GPUNode CRD, node labels and capacity are the
inventory; without the GPUSlice CRD, nothing is reserved by slices). Each of those is added to
the `WatchHealth` that readiness reads. PodDisruptionBudgets only order preemption's victims
(`budgets`): the cache does not wait for them nor is it unready without them (the Eviction API
enforces them regardless).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from neuronetes import contracts as c
from neuronetes.api import models as m
from neuronetes.api.models import GPUNode

from .budgets import budget_of
from .cache import GPUNODES, GPUSLICES, GpuCache
from .kube import KubeApi
from .slices import slice_of
from .watch import CustomObject, CustomObjectList, Reflector, WatchHealth
from .wire import Node, NodeList, Pod, PodList

__all__ = ["Reflectors", "gpunode_reflector", "gpuslice_reflector", "pdb_reflector", "start_reflectors"]

PDBS = "poddisruptionbudgets"

log = logging.getLogger(__name__)


def _gpunode(obj: CustomObject) -> GPUNode | None:
    try:
        return m.decode(obj.as_object("GPUNode"), GPUNode)
    except msgspec.ValidationError as exc:
        log.warning("GPUNode %s ignored (not valid): %s", obj.metadata.name, exc)
        return None


def gpunode_reflector(
    cache: GpuCache, api: KubeApi, *, resync_period: float = 600.0
) -> Reflector[CustomObject]:
    """Feeds `cache` the agents' GPUNode objects (the GPUs as NVML discovered them)."""

    def replace(items: Iterable[CustomObject]) -> None:
        cache.replace_gpunodes(g for g in map(_gpunode, items) if g is not None)

    def upsert(obj: CustomObject) -> None:
        g = _gpunode(obj)
        if g is not None:
            cache.upsert_gpunode(g)

    return Reflector(
        api,
        GPUNODES,
        f"/apis/{c.API_VERSION}/gpunodes",
        CustomObject,
        CustomObjectList,
        on_replace=replace,
        on_upsert=upsert,
        on_delete=lambda obj: cache.delete_gpunode(obj.metadata.name),
        on_synced=lambda: cache.mark_synced(GPUNODES),
        on_heard=lambda: cache.touch(GPUNODES),
        resync_period=resync_period,
        # Without the GPUNode CRD (no agents yet) node labels and capacity are the inventory.
        on_missing=lambda: log.info("no GPUNode CRD: the GPU inventory comes from node labels and capacity"),
    )


def _keyed_reflector(
    api: KubeApi,
    resource: str,
    path: str,
    *,
    replace: Callable[[Iterable[CustomObject]], None],
    put: Callable[[str, CustomObject | None], None],
    on_synced: Callable[[], None] = lambda: None,
    on_heard: Callable[[], None] = lambda: None,
    **hooks: Any,
) -> Reflector[CustomObject]:
    """A reflector of namespaced objects told to the cache as ``put(namespace/name, object or
    None when gone)`` (`hooks`: the other `Reflector` arguments)."""

    def key(obj: CustomObject) -> str:
        return f"{obj.metadata.namespace}/{obj.metadata.name}"

    return Reflector(
        api,
        resource,
        path,
        CustomObject,
        CustomObjectList,
        on_replace=replace,
        on_upsert=lambda obj: put(key(obj), obj),
        on_delete=lambda obj: put(key(obj), None),
        on_synced=on_synced,
        on_heard=on_heard,
        **hooks,
    )


def gpuslice_reflector(
    cache: GpuCache, api: KubeApi, *, resync_period: float = 600.0
) -> Reflector[CustomObject]:
    """Feeds `cache` the GPUSlices' reservations (`slices.slice_of`: their status only)."""
    return _keyed_reflector(
        api,
        GPUSLICES,
        f"/apis/{c.API_VERSION}/{GPUSLICES}",
        replace=lambda items: cache.replace_slices(s for s in map(slice_of, items) if s is not None),
        put=lambda key, obj: cache.put_slice(key, None if obj is None else slice_of(obj)),
        on_synced=lambda: cache.mark_synced(GPUSLICES),
        on_heard=lambda: cache.touch(GPUSLICES),
        resync_period=resync_period,
        on_missing=lambda: log.info("no GPUSlice CRD: no GPU share is reserved by slices"),
    )


def pdb_reflector(cache: GpuCache, api: KubeApi, *, resync_period: float = 600.0) -> Reflector[CustomObject]:
    """Feeds `cache` the PodDisruptionBudgets (`budgets.budget_of`: selector and allowed
    disruptions), which order preemption's victims."""
    return _keyed_reflector(
        api,
        PDBS,
        f"/apis/policy/v1/{PDBS}",
        replace=lambda items: cache.replace_budgets(b for b in map(budget_of, items) if b is not None),
        put=lambda key, obj: cache.put_budget(key, None if obj is None else budget_of(obj)),
        resync_period=resync_period,  # neither synced nor heard: the cache does not wait for it
    )


class Reflectors:
    """The node, pod, GPUNode, GPUSlice and PodDisruptionBudget reflectors of one cache."""

    def __init__(
        self,
        nodes: Reflector[Node],
        pods: Reflector[Pod],
        gpunodes: Reflector[CustomObject],
        gpuslices: Reflector[CustomObject],
        pdbs: Reflector[CustomObject],
    ) -> None:
        self.nodes, self.pods, self.gpunodes, self.gpuslices = nodes, pods, gpunodes, gpuslices
        self.pdbs = pdbs

    @property
    def all(self) -> tuple[Reflector[Any], ...]:
        return (self.nodes, self.pods, self.gpunodes, self.gpuslices, self.pdbs)

    def start(self) -> None:
        for reflector in self.all:
            reflector.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every reflector within `timeout` seconds in all (their threads are daemons)."""
        deadline = time.monotonic() + timeout
        for reflector in self.all:
            reflector.signal_stop()
        for reflector in self.all:
            reflector.join(deadline - time.monotonic())


def start_reflectors(
    cache: GpuCache,
    api: KubeApi,
    *,
    resync_period: float = 600.0,
    watch_timeout: float = 300.0,
    health: WatchHealth | None = None,
) -> Reflectors:
    """Feed `cache` from the API server in background threads (returned, started; each one
    added to `health`)."""
    nodes: Reflector[Node] = Reflector(
        api,
        "nodes",
        "/api/v1/nodes",
        Node,
        NodeList,
        on_replace=cache.replace_nodes,
        on_upsert=cache.upsert_node,
        on_delete=lambda n: cache.delete_node(n.metadata.name),
        on_synced=lambda: cache.mark_synced("nodes"),
        on_heard=lambda: cache.touch("nodes"),
        resync_period=resync_period,
        watch_timeout=watch_timeout,
    )
    pods: Reflector[Pod] = Reflector(
        api,
        "pods",
        "/api/v1/pods",
        Pod,
        PodList,
        on_replace=cache.replace_pods,
        on_upsert=cache.upsert_pod,
        on_delete=cache.delete_pod,
        on_synced=lambda: cache.mark_synced("pods"),
        on_heard=lambda: cache.touch("pods"),
        resync_period=resync_period,
        watch_timeout=watch_timeout,
    )
    cache.require_sync(GPUNODES)
    cache.require_sync(GPUSLICES)
    reflectors = Reflectors(
        nodes,
        pods,
        gpunode_reflector(cache, api, resync_period=resync_period),
        gpuslice_reflector(cache, api, resync_period=resync_period),
        pdb_reflector(cache, api, resync_period=resync_period),
    )
    if health is not None:
        for reflector in reflectors.all:
            if reflector is not reflectors.pdbs:  # optional: see the module's docstring
                health.add(reflector)
    reflectors.start()
    return reflectors
