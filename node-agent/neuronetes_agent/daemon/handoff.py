"""One node's hand-off to the NRI plugin and the containers (``--node`` only): the shim regions
of the pods bound here (`regions`), the node inventory and ledger files the plugin reads
(`inventory`, `ledger`), the regions tended from the plugin's container records (`containers`:
host PIDs, dead processes' slots) and NVML reconciliation of shared GPUs carried out (`backstop`
plans it). In fleet mode every part is None and nothing here runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from .backstop import Backstop
from .containers import ContainerTender
from .devices import Inventory
from .events import NodeEvents
from .eviction import Evictor
from .inventory import InventoryWriter
from .ledger import LedgerWriter
from .nodestate import NodeState
from .regions import RegionKeeper

__all__ = ["HandOff", "HandOffParts"]

log = logging.getLogger("neuronetes_agent")


class HandOffParts(TypedDict, total=False):
    """The ``--node`` parts of the hand-off (fleet mode has none)."""

    regions: RegionKeeper | None
    inventory_file: InventoryWriter | None  # the NRI plugin's device map
    ledger: LedgerWriter | None  # the pods bound here, for the plugin's cross-check
    containers: ContainerTender | None  # host PIDs and dead slots from the plugin's records
    backstop: Backstop | None  # (with `containers`) NVML reconciliation of shared GPUs


class HandOff:
    """The files, regions and reconciliation of one node; `sync_regions` runs with the node's lock
    held, `write_inventory` and `run` without it (`run` takes it to read and write the state)."""

    def __init__(self, state: NodeState, events: NodeEvents, evictor: Evictor, parts: HandOffParts) -> None:
        self.state = state
        self.events = events
        self.evictor = evictor
        self.regions = parts.get("regions")
        self.inventory_file = parts.get("inventory_file")
        self.ledger = parts.get("ledger")
        self.containers = parts.get("containers")
        self.backstop = parts.get("backstop")
        self._live: frozenset[str] = frozenset()  # pods with a running container (their regions stay)
        self._warnings: set[str] = set()
        self._pods_changed = self.regions is not None

    def pods_changed(self) -> None:
        """The node's pods changed: the regions follow next round."""
        self._pods_changed = self.regions is not None

    def write_inventory(self) -> None:
        """Rewrite the node inventory file when due or changed (a MIG change rescans first)."""
        if self.inventory_file is not None and self.state.inventory is not None:
            self.inventory_file.refresh(self.state.inventory)

    def sync_regions(self) -> None:
        """Write the regions of the pods bound here, drop those of pods gone (and stopped)."""
        inventory = self.state.inventory
        if self.regions is None or not self._pods_changed or inventory is None:
            return
        self._pods_changed = False
        wanted = {p.uid: (p.namespace, p.name, p.assignment) for p in self.state.pods.values()}
        for error in self.regions.sync(wanted, inventory, keep=self._live):
            self.events.record("Warning", "GPURegionFailed", error)

    def run(self) -> None:
        """Write the node ledger and tend the regions from the plugin's container records; a
        warning becomes an Event once, and again only after it cleared."""
        state = self.state
        inventory = state.inventory
        if inventory is None or (self.ledger is None and self.containers is None):
            return
        with state.lock:
            pods = dict(state.pods)
            processes = [p for sample in state.samples.values() for p in sample.processes]
        warnings: list[str] = []
        if self.ledger is not None:
            try:
                self.ledger.refresh(pods, inventory)
            except OSError as exc:
                warnings.append(f"node ledger not written: {exc}")
        if self.containers is not None:
            report = self.containers.tend(pods, processes)
            warnings += report.warnings
            if report.freed:
                log.info("node %s: ordered %d region slots of dead processes freed", state.node, report.freed)
            with state.lock:
                state.counters.slots_reclaimed += report.freed
                if report.live != self._live:  # a gone pod's last container stopped: drop its region
                    self._live = report.live
                    self._pods_changed = self.regions is not None
            if self.backstop is not None:
                self._reconcile(self.backstop, inventory, report.cgroups)
        for warning in warnings:
            if warning not in self._warnings:
                self.events.record("Warning", "GPUContainerHandoff", warning)
        self._warnings = set(warnings)

    def _reconcile(
        self, backstop: Backstop, inventory: Inventory, cgroups: Mapping[tuple[str, str], Path]
    ) -> None:
        """Carry out NVML reconciliation's plan (`backstop`): a Warning Event on the pod and on the
        Node per finding past its grace, the counter, and in enforce mode the pod's eviction."""
        state = self.state
        with state.lock:
            if not state.nvml_ok:
                return  # NVML hangs or fails: nothing to judge by
            pods, samples = dict(state.pods), dict(state.samples)
        result = backstop.round(pods, inventory, samples, cgroups)
        with state.lock:
            for ref, reason, message in backstop.events(result):
                self.events.record("Warning", reason, message, pod=ref)
            for ref, why in result.count:
                state.counters.slice_evictions[(ref.namespace, ref.name, why.value)] += 1
            for ref, found in result.evict:
                if (pod := state.pods.get(ref.uid)) is not None:
                    self.evictor.evict_once(pod, backstop.eviction_reason(found), time.monotonic())
