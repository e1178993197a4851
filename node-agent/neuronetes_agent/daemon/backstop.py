"""The agent's side of NVML reconciliation (`daemon.reconcile` decides): each round, the data the
decisions take, from what the agent already holds, and the first-seen times between rounds.

- the containers and their limits: the pods' assignments (API server), classified per GPU against
  the inventory (`reconcile.grant_kind`: only slices are judged);
- a container's processes: the host PIDs of its cgroup and of every cgroup below it
  (`cgroup_members`), the cgroup resolved by `ContainerTender` from the NRI plugin's record
  (`TendReport.cgroups`). A container without a record, or whose cgroup does not resolve, is not
  judged: the agent never guesses whose a process is;
- its shim processes: `RegionKeeper.registered_host_pids` (the host PIDs the agent itself wrote into
  the region's active slots after finding them in that cgroup). A region that cannot be read
  registers nobody: the container's processes on the GPU are then unshimmed, which they are in
  effect (the shim fails closed without a valid region);
- NVML's running compute processes of each GPU (`GpuSample.processes`).

`handoff.HandOff` carries out the returned plan (Events — `events` words them —, the counter, evictions).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final

from neuronetes_agent import region as shim

from .devices import GpuProcess, GpuSample, Inventory
from .pods import PodUse
from .reconcile import (
    EVENT_REASONS,
    ContainerView,
    Finding,
    Grant,
    GrantKind,
    Memory,
    Mode,
    Plan,
    PodRef,
    Policy,
    find,
    grant_kind,
    plan,
)
from .regions import RegionKeeper

__all__ = ["MAX_CGROUPS", "Backstop", "cgroup_members"]

log = logging.getLogger("neuronetes_agent")

MAX_CGROUPS: Final = 1024
"""Cgroups read per container and round (its own and those below it)."""


def cgroup_members(where: Path, limit: int = MAX_CGROUPS) -> frozenset[int]:
    """The host PIDs in the cgroup `where` and in every cgroup below it: a container allowed to
    write its cgroup tree cannot hide a process from reconciliation in a child cgroup."""
    pids: set[int] = set()
    todo = [where]
    read = 0
    while todo and read < limit:
        d = todo.pop()
        read += 1
        with contextlib.suppress(OSError):  # gone meanwhile
            pids.update(int(v) for v in (d / "cgroup.procs").read_text().split() if v.isdigit())
        try:
            with os.scandir(d) as entries:
                todo.extend(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
        except OSError:
            continue
    if todo:
        log.warning("cgroup %s: more than %d cgroups below it; the rest are not read", where, limit)
    return frozenset(pids)


def _by_pid(processes: Iterable[GpuProcess]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p in processes:
        out[p.pid] = out.get(p.pid, 0) + max(0, p.used_memory_bytes)
    return out


class Backstop:
    """Reconciliation for one node: `round` once per agent round, after the host PIDs are registered."""

    def __init__(
        self,
        policy: Policy,
        regions: RegionKeeper,
        *,
        clock: Callable[[], float] = time.monotonic,
        members: Callable[[Path], frozenset[int]] = cgroup_members,
    ) -> None:
        self.policy = policy
        self.regions = regions
        self.clock = clock
        self.members = members
        self.memory = Memory()

    def views(
        self,
        pods: Mapping[str, PodUse],
        inventory: Inventory,
        cgroups: Mapping[tuple[str, str], Path],
        busy: Callable[[str], bool] = lambda uuid: True,
    ) -> list[ContainerView]:
        """The containers holding a slice of some `busy` GPU (one NVML lists processes on) whose
        cgroup is known."""
        out: list[ContainerView] = []
        for uid, pod in sorted(pods.items()):
            for name, grant in sorted(pod.assignment.containers.items()):
                grants: dict[str, Grant] = {}
                for g in grant.gpus:
                    gpu = inventory.by_uuid(g.uuid)
                    if gpu is None:
                        continue
                    kind = grant_kind(
                        g.memory_mib,
                        mig=g.mig_profile is not None,
                        gpu_memory_mib=gpu.memory_mib,
                        gpu_mig_enabled=gpu.mig_enabled,
                    )
                    grants[g.uuid] = Grant(kind, g.memory_mib << 20)
                where = cgroups.get((uid, name))
                if where is None or not any(g.kind is GrantKind.SLICE and busy(u) for u, g in grants.items()):
                    continue
                try:
                    registered = frozenset(self.regions.registered_host_pids(uid, name))
                except (OSError, shim.RegionError) as exc:
                    log.warning(
                        "%s/%s container %s: region unreadable (%s): no shim process",
                        pod.namespace,
                        pod.name,
                        name,
                        exc,
                    )
                    registered = frozenset()
                out.append(
                    ContainerView(uid, pod.namespace, pod.name, name, grants, registered, self.members(where))
                )
        return out

    def round(
        self,
        pods: Mapping[str, PodUse],
        inventory: Inventory,
        samples: Mapping[str, GpuSample],
        cgroups: Mapping[tuple[str, str], Path],
    ) -> Plan:
        """This round's plan; the first-seen times are kept for the next."""
        if self.policy.mode is Mode.OFF:
            return plan((), self.memory, self.clock(), self.policy)
        nvml = {uuid: _by_pid(s.processes) for uuid, s in samples.items()}
        views = self.views(pods, inventory, cgroups, busy=lambda uuid: bool(nvml.get(uuid)))
        findings = find(views, nvml, self.policy)
        result = plan(findings, self.memory, self.clock(), self.policy)
        self.memory = result.memory
        return result

    def events(self, result: Plan) -> list[tuple[PodRef, str, str]]:
        """(pod, Event reason, message) of each finding the plan reports: one Warning Event each."""
        action = (
            "evicting the pod" if self.policy.mode is Mode.ENFORCE else "not evicted (--reconcile=report)"
        )
        return [
            (f.pod, EVENT_REASONS[f.reason], f"pod {f.pod.namespace}/{f.pod.name}: {f.describe()}; {action}")
            for f in result.report
        ]

    @staticmethod
    def eviction_reason(found: Iterable[Finding]) -> str:
        """The eviction's reason in the agent's GPUPodEvicted Event."""
        return "NVML reconciliation: " + "; ".join(f.describe() for f in found)
