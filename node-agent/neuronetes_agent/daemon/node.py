"""One node served by the agent: the loop that sequences the parts, each of which has one job.

`NodeAgent.tick` is the whole loop body: execute administrators' requests (`orders`), read XIDs
and samples from the backend (`monitor`, outside the lock, so a hung NVML only blocks this node's
reads and the watchdog can still report it), then under the lock apply them, finish resets, plan
the MIG layout (`miglayout`), derive every GPU's state and record each transition, publish what
changed (`publication`), evict the pods of GPUs whose fault needs it and start resets
(`eviction`), apply MIG layouts and keep the containers' shim regions; then hand off to the NRI
plugin (`handoff`: the node inventory and ledger files, the regions tended from the plugin's
container records, NVML reconciliation of shared GPUs). The parts share one `NodeState` and its
lock; the module map is in docs/gpu-health.md "The agent's modules".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any, Unpack

from neuronetes.model import GpuHealth

from .devices import Discovery, DiscoveryError, Inventory
from .events import NodeEvents
from .eviction import Evictor
from .handoff import HandOff, HandOffParts
from .kube import NodeWrites
from .miglayout import MIG_MANAGER_LABEL, MigLayouts, MigTarget, targets_from_spec
from .modelcache import ModelCache
from .monitor import HealthMonitor, Transition
from .nodestate import NodeCounters, NodeState
from .orders import ANNOTATION_OFFLINE_GPUS, REQUEST_PREFIX, Orders
from .pods import PodUse
from .publication import Publisher

__all__ = [
    "ANNOTATION_OFFLINE_GPUS",
    "REQUEST_PREFIX",
    "NodeAgent",
    "Transition",
]

log = logging.getLogger("neuronetes_agent")


class NodeAgent:
    """The agent's work for one node (one per process on a GPU node, thousands in fleet mode)."""

    def __init__(
        self,
        node: str,
        node_uid: str,
        backend: Discovery,
        kube: NodeWrites,
        resets: Executor,
        *,
        agent_version: str,
        heartbeat_s: float = 60.0,
        model_cache: ModelCache | None = None,
        **handoff: Unpack[HandOffParts],
    ) -> None:
        """`model_cache`: where the node's cached models are read (`modelcache`; None: none are
        reported). `handoff`: with ``--node``, the regions, files, container records and
        reconciliation the round hands off to (`handoff.HandOffParts`)."""
        self.node = node
        self.node_uid = node_uid
        self.backend = backend
        self.kube = kube
        self.state = NodeState(node, node_uid)
        self.model_cache = model_cache
        # The state's lock, states and counters are made once and never replaced: aliases.
        self.lock = self.state.lock
        self.states: dict[str, tuple[GpuHealth, str]] = self.state.states
        self.counters: NodeCounters = self.state.counters
        self.discovery_seconds = 0.0
        self.poll_started = 0.0  # monotonic start of the backend reads in progress (0: none)
        events = NodeEvents(node, node_uid, kube)
        self.evictor = Evictor(self.state, kube, events, backend, resets)
        self.monitor = HealthMonitor(self.state, backend, events)
        self.orders = Orders(self.state, backend, kube, events, self.evictor)
        self.mig = MigLayouts(self.state, backend, events, self.evictor)
        self.publisher = Publisher(self.state, kube, self._apply_spec, agent_version, heartbeat_s)
        self.handoff = HandOff(self.state, events, self.evictor, handoff)
        self.regions = self.handoff.regions
        self.inventory_file = self.handoff.inventory_file
        self.ledger = self.handoff.ledger
        self.containers = self.handoff.containers

    # ---- the state the exporter and tests read -------------------------------------------------

    @property
    def inventory(self) -> Inventory | None:
        """The GPUs as last discovered (None before `start`)."""
        return self.state.inventory

    @inventory.setter
    def inventory(self, inventory: Inventory | None) -> None:
        self.state.inventory = inventory

    @property
    def mig_state(self) -> str:
        """The GPUNode's ``status.migConfigState``."""
        return self.mig.state

    @property
    def mig_targets(self) -> dict[int, MigTarget]:
        """``spec.migLayout`` by GPU index."""
        return self.mig.targets

    @mig_targets.setter
    def mig_targets(self, targets: dict[int, MigTarget]) -> None:
        self.mig.targets = targets

    # ---- setup ---------------------------------------------------------------------------------

    def start(self, node: Mapping[str, Any] | None = None) -> None:
        """Discover the GPUs and publish the node's labels, capacity and GPUNode. With the Node
        object (as a watch delivered it), labels and capacity it already has are not rewritten."""
        if node is not None:
            self.mig.external = MIG_MANAGER_LABEL in self.publisher.seen(node)
        started = time.perf_counter()
        inventory = self.backend.scan()
        self.discovery_seconds = time.perf_counter() - started
        with self.lock:
            self.state.inventory = inventory
            self.publisher.inventory_changed(inventory)
            self.monitor.start(inventory)
            self._apply_spec(self.kube.ensure_gpunode(self.node, self.node_uid))
            self._read_model_cache()
            self.monitor.derive_states(record=False, reconfiguring=self.mig.pending)
            self.publisher.publish(force=True, mig_state=self.mig.state)
            self.publisher.spread_heartbeat()
        self.handoff.write_inventory()

    # ---- inputs from watches (any thread) --------------------------------------------------------

    def set_pod(self, uid: str, use: PodUse | None) -> None:
        with self.lock:
            if use is None:
                self.state.pods.pop(uid, None)
            else:
                self.state.pods[uid] = use
            self.handoff.pods_changed()

    def gpunode_deleted(self) -> None:
        """Someone deleted the node's GPUNode: the next round creates and publishes it again."""
        with self.lock:
            self.publisher.gpunode_deleted()

    def set_gpunode(self, gpunode: Mapping[str, Any]) -> None:
        with self.lock:
            self._apply_spec(gpunode)

    def _apply_spec(self, gpunode: Mapping[str, Any]) -> None:
        meta = gpunode.get("metadata") or {}
        spec = gpunode.get("spec") or {}
        self.state.generation = int(meta.get("generation") or 0)
        self.state.cordoned = frozenset(spec.get("cordonedGPUs") or ())
        self.mig.targets = targets_from_spec(spec)
        self.orders.take(meta.get("annotations") or {})

    # ---- the loop ------------------------------------------------------------------------------

    def tick(self) -> None:
        """One round: read the backend, react, publish. Never raises for API or GPU errors."""
        inventory = self.state.inventory
        if inventory is None:
            return
        with self.lock:
            self.orders.handle()  # before the reads, so they see what an order changed
        self.poll_started = time.monotonic()
        readings = self.monitor.read(inventory)
        self.poll_started = 0.0
        with self.lock:
            self._read_model_cache()
            self.monitor.apply(readings)
            self.evictor.finish_resets()
            self.mig.plan()
            transitions = self.monitor.derive_states(record=True, reconfiguring=self.mig.pending)
            self.publisher.publish(force=bool(transitions), mig_state=self.mig.state)
            self.evictor.react()
            if self.mig.apply():
                self._rescan()
            self.handoff.sync_regions()
        self.handoff.write_inventory()
        self.handoff.run()

    def _read_model_cache(self) -> None:
        """The cached models into the state (published with the GPUNode status when they change)."""
        if self.model_cache is not None:
            self.state.cached_models = self.model_cache.models()

    def watchdog(self, limit_s: float) -> bool:
        """Called from another thread: when the backend reads of this node have hung for more than
        `limit_s`, mark every GPU DEGRADED and publish. True when it fired."""
        started = self.poll_started
        if not started or time.monotonic() - started <= limit_s:
            return False
        with self.lock:
            if not self.state.nvml_ok:
                return True
            self.monitor.hung(started)
            self.monitor.derive_states(record=True, reconfiguring=self.mig.pending)
            self.publisher.publish(force=True, mig_state=self.mig.state)
        return True

    def _rescan(self) -> None:
        """Read the inventory again after a reconfiguration (labels and capacity follow)."""
        try:
            inventory = self.backend.scan()
        except DiscoveryError as exc:
            log.warning("node %s: rescan failed: %s", self.node, exc)
            return
        self.state.inventory = inventory
        self.publisher.inventory_changed(inventory)
