"""Health bookkeeping of one node's GPUs: the backend's XIDs and samples into each GPU's health
machine (`health.GpuHealthState`), then every GPU's state, each change recorded as a transition.

`read` talks to the backend and runs without the node's lock (a hung NVML blocks only this node's
reads, and the watchdog can still report it); `apply` and `derive_states` run with it held.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Final

from neuronetes.model import GpuHealth

from .devices import Discovery, DiscoveryError, GpuLost, GpuSample, Inventory, XidEvent
from .events import NodeEvents
from .health import GpuHealthState, Recovery
from .nodestate import NodeState

__all__ = ["XID_WAIT_FAILURES_LIMIT", "HealthMonitor", "Readings", "Transition"]

log = logging.getLogger("neuronetes_agent")

XID_WAIT_FAILURES_LIMIT: Final = 3  # consecutive event-wait failures that mark the GPUs unhealthy


@dataclass(frozen=True, slots=True)
class Transition:
    """A GPU's state changed (an Event and a counter)."""

    gpu: str
    index: int
    before: GpuHealth
    after: GpuHealth
    reason: str


@dataclass(frozen=True, slots=True)
class Readings:
    """One round's reads of the backend."""

    xids: list[XidEvent] = field(default_factory=list)
    samples: dict[str, GpuSample] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)  # GPUs fallen off the bus
    nvml_ok: bool = True


class HealthMonitor:
    """XIDs, samples and the derived GPU states of one node."""

    def __init__(self, state: NodeState, backend: Discovery, events: NodeEvents) -> None:
        self.state = state
        self.backend = backend
        self.events = events
        self._xid_failures = 0
        self._ecc_seen: dict[str, int] = {}

    def start(self, inventory: Inventory) -> None:
        """A fresh health machine per discovered GPU."""
        self.state.health = {g.uuid: GpuHealthState() for g in inventory.gpus}

    def read(self, inventory: Inventory) -> Readings:
        """The backend's pending XIDs and a sample of every GPU (without the node's lock)."""
        node = self.state.node
        xids: list[XidEvent] = []
        nvml_ok = True
        try:
            xids = self.backend.wait_xids(0)
            self._xid_failures = 0
        except DiscoveryError as exc:
            self._xid_failures += 1
            nvml_ok = self._xid_failures < XID_WAIT_FAILURES_LIMIT
            log.warning("node %s: XID wait failed (%d in a row): %s", node, self._xid_failures, exc)
        samples: dict[str, GpuSample] = {}
        lost: list[str] = []
        for g in inventory.gpus:
            try:
                samples[g.uuid] = self.backend.sample(g.uuid)
            except GpuLost:
                lost.append(g.uuid)
            except DiscoveryError as exc:
                log.warning("node %s: GPU %s: %s", node, g.uuid, exc)
        return Readings(xids, samples, lost, nvml_ok)

    def apply(self, readings: Readings) -> None:
        """Feed a round's reads to the GPUs' health machines."""
        state = self.state
        state.nvml_ok = readings.nvml_ok
        for h in state.health.values():
            h.unresponsive = None if readings.nvml_ok else "NVML does not answer"
        for event in readings.xids:
            self._on_xid(event)
        for uuid in readings.lost:
            state.health[uuid].on_lost()
        for uuid, sample in readings.samples.items():
            self._on_sample(uuid, sample)

    def hung(self, started: float) -> None:
        """The backend reads begun at monotonic `started` hang: NVML counts as not answering."""
        self.state.nvml_ok = False
        for h in self.state.health.values():
            h.unresponsive = f"NVML has not answered for {time.monotonic() - started:.0f} s"

    def _on_xid(self, event: XidEvent) -> None:
        h = self.state.health.get(event.uuid)
        if h is None:
            return
        recovery = h.on_xid(event.xid)
        self.state.counters.xids[(event.uuid, event.xid)] += 1
        kind = "Normal" if recovery in (Recovery.IGNORE,) else "Warning"
        self.events.record(kind, "GPUXid", f"GPU {event.uuid}: XID {event.xid} ({recovery.value})")

    def _on_sample(self, uuid: str, sample: GpuSample) -> None:
        h = self.state.health[uuid]
        self.state.samples[uuid] = sample
        h.on_temperature(sample.temperature_celsius)
        seen = self._ecc_seen.get(uuid)
        now = sample.ecc_uncorrected_total
        if now is not None:
            if seen is not None and now > seen and (h.fault is None or h.fault.xid != 48):
                h.on_uncorrected_ecc(now - seen)
            self._ecc_seen[uuid] = now

    def derive_states(self, *, record: bool, reconfiguring: Container[str]) -> list[Transition]:
        """Every GPU's state now (a GPU in `reconfiguring`, its MIG layout being applied, takes no
        new work); with `record`, each change is counted and an Event."""
        state = self.state
        assert state.inventory is not None
        usage = state.usage()
        out: list[Transition] = []
        for g in state.inventory.gpus:
            h = state.health[g.uuid]
            now, reason = h.state(usage[g.uuid])
            if now.schedulable and g.uuid in reconfiguring:
                now, reason = GpuHealth.DEGRADED, "MIG layout being applied (spec.migLayout)"
            before = state.states.get(g.uuid, (h.state_now, ""))[0]
            state.states[g.uuid] = (now, reason)
            h.state_now = now
            if record and now is not before:
                out.append(Transition(g.uuid, g.index, before, now, reason))
        for t in out:
            state.counters.transitions[(t.gpu, t.before.value, t.after.value)] += 1
            unhealthy = not t.after.schedulable
            self.events.record(
                "Warning" if unhealthy else "Normal",
                f"GPU{t.after.value}",
                f"GPU {t.index} ({t.gpu}): {t.before.value} -> {t.after.value}"
                + (f": {t.reason}" if t.reason else ""),
            )
        return out
