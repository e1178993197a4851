"""The GPUs as the workstation daemon sees them: readings, health and administrator holds.

The readings come from the node agent's discovery backends (`daemon.nvml` on a machine with
NVIDIA GPUs, `daemon.simulated` otherwise or with ``--simulate-gpus N``) and the health from the
agent's GPU state machine (`daemon.health.GpuHealthState`: XIDs, thermal pause above 85 °C,
administrator offline), so a GPU means the same in a cluster and on a workstation. Each refresh
records state changes in the store.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from neuronetes.model import GpuHealth
from neuronetes.profiles import TopologyProfile
from neuronetes_agent.daemon.devices import DiscoveryError, GpuLost, GpuProcess, match_gpu
from neuronetes_agent.daemon.health import GpuHealthState, Usage

from .jobs import ACTIVE, Job, JobState
from .store import Store

__all__ = ["SCHEDULABLE", "GpuView", "Gpus", "open_backend", "usage"]

log = logging.getLogger(__name__)

SCHEDULABLE: Final = frozenset({GpuHealth.AVAILABLE, GpuHealth.ALLOCATED, GpuHealth.IN_USE})
_SIMULATED_NODE: Final = "workstation"


def _workstation_profile(count: int) -> TopologyProfile:
    return TopologyProfile(
        name="workstation",
        description=f"simulated workstation: {count}× A100-PCIE-80GB",
        gpu_model="A100-PCIE-80GB",
        gpu_count=count,
        gpu_memory_mib=81920,
        cpu_milli=32_000,
        memory_mib=256 * 1024,
        price_per_hour=0.0,
        spot_price_per_hour=0.0,
        sockets=1,
        numa_nodes=1,
    )


def open_backend(simulate_gpus: int | None) -> tuple[Any, str]:
    """The discovery backend and a one-line description: simulated when asked (or when NVML is
    not available, or loads but cannot list the GPUs), else NVML."""
    from neuronetes_agent.daemon.simulated import SimulatedGpus

    if simulate_gpus is None:
        from neuronetes_agent.daemon.nvml import NvmlGpus, load_nvml

        try:
            nvml = NvmlGpus(load_nvml())
        except DiscoveryError as exc:
            return _simulated_instead(exc)
        try:
            nvml.scan()  # an NVML that cannot list the GPUs is no better than none
        except DiscoveryError as exc:
            nvml.close()
            return _simulated_instead(exc)
        return nvml, "nvml"
    if not 1 <= simulate_gpus <= 8:
        raise ValueError(f"--simulate-gpus {simulate_gpus}: use 1-8")
    profile = _workstation_profile(simulate_gpus)
    return SimulatedGpus(profile, _SIMULATED_NODE, reset_seconds=0.5), f"simulated: {simulate_gpus} GPU(s)"


def _simulated_instead(exc: DiscoveryError) -> tuple[Any, str]:
    """One simulated GPU where NVML is unusable, and why (said in the log and in `status`)."""
    from neuronetes_agent.daemon.simulated import SimulatedGpus

    log.warning("%s; running on the simulated backend (1 GPU)", exc)
    return SimulatedGpus(_workstation_profile(1), _SIMULATED_NODE, reset_seconds=0.5), f"simulated: {exc}"


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU at one refresh."""

    uuid: str
    index: int
    model: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_percent: float
    temperature_celsius: float | None
    processes: tuple[GpuProcess, ...]
    state: GpuHealth
    reason: str
    drained: bool

    @property
    def schedulable(self) -> bool:
        return self.state in SCHEDULABLE and not self.drained


class Gpus:
    """The backend's GPUs with one health state machine each."""

    def __init__(self, backend: Any, store: Store) -> None:
        self.backend = backend
        self.store = store
        self.devices = list(backend.scan().gpus)
        self._health = {g.uuid: GpuHealthState() for g in self.devices}
        holds = store.gpu_holds()
        for uuid, h in self._health.items():
            h.admin_offline = uuid in holds and holds[uuid].offline
        self.views: dict[str, GpuView] = {}
        self._recorded: dict[str, tuple[str, str]] = {}  # last state stored per GPU

    @property
    def simulated(self) -> Any:
        """The simulated backend (its fault API), or None on real GPUs."""
        from neuronetes_agent.daemon.simulated import SimulatedGpus

        return self.backend if isinstance(self.backend, SimulatedGpus) else None

    def refresh(self, usage: Mapping[str, Usage], now: float) -> dict[str, GpuView]:
        """Read every GPU, feed the state machines, record changes; returns the views by UUID."""
        try:
            xids = self.backend.wait_xids(0.0)
        except DiscoveryError as exc:
            log.warning("XID events: %s", exc)
            xids = []
        for event in xids:
            if event.uuid in self._health:
                self._health[event.uuid].on_xid(event.xid)
        holds = self.store.gpu_holds()
        views: dict[str, GpuView] = {}
        for dev in self.devices:
            health = self._health[dev.uuid]
            try:
                sample = self.backend.sample(dev.uuid)
            except GpuLost:
                health.on_lost()
                sample = None
            except DiscoveryError as exc:
                health.unresponsive = f"NVML: {exc}"
                sample = None
            else:
                health.unresponsive = None
                health.on_temperature(sample.temperature_celsius)
            state, reason = health.state(usage.get(dev.uuid, Usage()))
            hold = holds.get(dev.uuid)
            views[dev.uuid] = GpuView(
                uuid=dev.uuid,
                index=dev.index,
                model=dev.model,
                memory_total_bytes=dev.memory_mib << 20,
                memory_used_bytes=sample.memory_used_bytes if sample else 0,
                utilization_percent=(sample.utilization_percent or 0.0) if sample else 0.0,
                temperature_celsius=sample.temperature_celsius if sample else None,
                processes=sample.processes if sample else (),
                state=state,
                reason=reason,
                drained=bool(hold and hold.drained),
            )
            if self._recorded.get(dev.uuid) != (state.value, reason):
                self.store.record_gpu_state(dev.uuid, state.value, reason, now)
                self._recorded[dev.uuid] = (state.value, reason)
        self.views = views
        return views

    def set_offline(self, uuid: str, offline: bool) -> None:
        health = self._health[uuid]
        if offline:
            health.admin_offline = True
        else:
            health.on_online()

    def resolve(self, ref: str) -> str:
        """The UUID of the GPU `ref` names: its index, UUID or unique UUID prefix (`match_gpu`).
        Raises GpuRefError."""
        return match_gpu(ref, ((d.index, d.uuid) for d in self.devices), "on this machine")


def usage(jobs: list[Job], ending: list[Job]) -> dict[str, Usage]:
    """What each GPU's health state machine needs from the daemon's jobs: how many hold it (active,
    or an attempt whose processes are still exiting) and how many run on it."""
    assigned: dict[str, int] = {}
    running: dict[str, int] = {}
    for job in jobs + [replace(j, state=JobState.RUNNING) for j in ending]:
        if job.state in ACTIVE:
            for uuid in job.gpus:
                assigned[uuid] = assigned.get(uuid, 0) + 1
                if job.state is JobState.RUNNING:
                    running[uuid] = running.get(uuid, 0) + 1
    return {u: Usage(assigned=assigned[u], running=running.get(u, 0)) for u in assigned}
