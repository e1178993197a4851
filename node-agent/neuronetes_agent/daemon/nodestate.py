"""What the agent knows about one node, shared by the parts of its loop under one lock.

`NodeState` is the one unit of state every part reads and writes: the inventory, the pods holding
GPUs, each GPU's health machine, samples and derived state, the GPUNode spec's cordons and
generation, NVML's responsiveness and the counters the exporter reads. The parts (`monitor`,
`eviction`, `orders`, `miglayout`, `publication`, `handoff`) each take it and hold the node's
`lock` only as `NodeAgent` sequences them (`handoff` takes it itself around its reads of the state).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from neuronetes.model import GpuHealth

from .devices import GpuSample, Inventory
from .health import GpuHealthState, Usage
from .pods import PodUse
from .publish import Allocation

__all__ = ["NodeCounters", "NodeState"]


@dataclass(slots=True)
class NodeCounters:
    xids: Counter[tuple[str, int]] = field(default_factory=Counter)
    transitions: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    evictions: Counter[str] = field(default_factory=Counter)
    slots_reclaimed: int = 0  # dead processes' slots ordered freed after NVML showed the memory released
    # NVML reconciliation: (namespace, pod, reason) -> episodes acted on (neuronetes_slice_evictions_total)
    slice_evictions: Counter[tuple[str, str, str]] = field(default_factory=Counter)


@dataclass(slots=True, eq=False)
class NodeState:
    """One node's state; read and written with `lock` held."""

    node: str
    node_uid: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    inventory: Inventory | None = None
    health: dict[str, GpuHealthState] = field(default_factory=dict)
    samples: dict[str, GpuSample] = field(default_factory=dict)
    states: dict[str, tuple[GpuHealth, str]] = field(default_factory=dict)
    pods: dict[str, PodUse] = field(default_factory=dict)
    cordoned: frozenset[str] = frozenset()
    generation: int = 0
    nvml_ok: bool = True
    cached_models: tuple[str, ...] = ()  # the node's model cache (`modelcache`), as last read
    counters: NodeCounters = field(default_factory=NodeCounters)

    def usage(self) -> dict[str, Usage]:
        """Per GPU, the pods assigned to it and those of them running."""
        assigned: Counter[str] = Counter()
        running: Counter[str] = Counter()
        for pod in self.pods.values():
            for uuid in pod.allocations:
                assigned[uuid] += 1
                running[uuid] += pod.running
        return {u: Usage(assigned[u], running[u]) for u in self.health}

    def usable_gpus(self) -> set[str]:
        """The GPUs that can take new work: schedulable state, not cordoned."""
        return {u for u, (s, _) in self.states.items() if s.schedulable and u not in self.cordoned}

    def allocations(self) -> dict[str, list[Allocation]]:
        """Per GPU, the allocations of the pods holding it (a MIG placement named by its instance)."""
        assert self.inventory is not None
        out: dict[str, list[Allocation]] = {}
        for pod in self.pods.values():
            for uuid, entries in pod.allocations.items():
                gpu = self.inventory.by_uuid(uuid)
                for entry in entries:
                    entry = dict(entry)
                    profile, start = entry.pop("migProfile", None), entry.pop("migStart", None)
                    if gpu is not None and profile is not None:
                        # The instance at the grant's start of the grant's profile: an instance of
                        # another profile there is not the one granted (a layout changed under it).
                        inst = next(
                            (d for d in gpu.mig_devices if d.start == start and d.profile == profile), None
                        )
                        if inst is not None:
                            entry["migInstance"] = inst.uuid
                    out.setdefault(uuid, []).append(entry)
        return out
