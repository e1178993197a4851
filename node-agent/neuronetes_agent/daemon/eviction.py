"""Taking work off faulted GPUs: the Eviction API for their pods, then the GPU reset.

A GPU whose fault needs it (`GpuHealthState.needs_eviction`) has the pods holding it evicted,
each at most once per retry interval (a refused eviction, e.g. by a PodDisruptionBudget, is asked
again); once it is empty and its fault asks for one, the reset runs on the `resets` executor and
its outcome is read the next round. MIG layouts and NVML reconciliation evict through here too.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Final

from .devices import Discovery
from .events import NodeEvents
from .kube import NodeWrites
from .nodestate import NodeState
from .pods import PodUse

__all__ = ["EVICTION_RETRY_S", "Evictor"]

EVICTION_RETRY_S: Final = 5.0  # a refused eviction (e.g. by a PodDisruptionBudget) is asked again after

log = logging.getLogger("neuronetes_agent")


@dataclass(eq=False, slots=True)
class Evictor:
    """Evictions and resets of one node (called with the node's lock held)."""

    state: NodeState
    kube: NodeWrites
    events: NodeEvents
    backend: Discovery
    resets: Executor
    # pod UID -> monotonic time its eviction was last asked
    _evicted: dict[str, float] = field(default_factory=dict, init=False)
    _resetting: dict[str, Future[bool]] = field(default_factory=dict, init=False)

    def evict(self, pod: PodUse, why: str) -> None:
        """Ask the Eviction API for `pod` now (counted by HTTP status, an Event says why)."""
        status = self.kube.evict(pod.namespace, pod.name)
        self.state.counters.evictions[str(status)] += 1
        self.events.record(
            "Warning", "GPUPodEvicted", f"evicting {pod.namespace}/{pod.name} (HTTP {status}): {why}"
        )

    def evict_once(self, pod: PodUse, why: str, now: float) -> None:
        """Evict `pod` unless it was asked less than a retry interval ago."""
        if now - self._evicted.get(pod.uid, -1e9) > EVICTION_RETRY_S:
            self.evict(pod, why)
            self._evicted[pod.uid] = now

    def evict_users(self, uuid: str, why: str, now: float) -> None:
        """Evict the pods holding GPU `uuid` (each at most once per retry interval)."""
        for pod in list(self.state.pods.values()):
            if uuid in pod.allocations:
                self.evict_once(pod, why, now)

    def react(self) -> None:
        """Evict the users of the GPUs whose fault needs it; reset the emptied GPUs that need it."""
        state = self.state
        usage = state.usage()
        now = time.monotonic()
        for uuid, h in state.health.items():
            if h.needs_eviction(usage[uuid]):
                self.evict_users(uuid, f"GPU {uuid}: {h.fault.reason if h.fault else ''}", now)
            elif h.ready_to_reset(usage[uuid]) and uuid not in self._resetting:
                h.reset_started()
                self._resetting[uuid] = self.resets.submit(self.backend.reset, uuid)
        self._evicted = {uid: t for uid, t in self._evicted.items() if uid in state.pods}

    def finish_resets(self) -> None:
        """Hand each finished reset's outcome to its GPU's health machine."""
        for uuid, future in list(self._resetting.items()):
            if not future.done():
                continue
            del self._resetting[uuid]
            try:
                ok = future.result()
            except Exception as exc:  # a backend error is a failed reset
                log.warning("node %s: reset of %s failed: %s", self.state.node, uuid, exc)
                ok = False
            self.state.health[uuid].reset_finished(ok)
