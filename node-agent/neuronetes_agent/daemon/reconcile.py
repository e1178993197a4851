"""NVML reconciliation: the decisions of the backstop that holds shared GPUs' memory limits against
processes the CUDA shim does not bind (docs/threat-model.md "Reconciliation", docs/gpu-health.md
"Reconciliation").

Pure: plain data in, findings and a plan out; no I/O, no clock. `daemon.backstop` gathers the data
each round and `handoff.HandOff` carries the plan out.

**Scope.** Only the GPUs on which a container holds a *slice* (`grant_kind`): never a whole GPU,
never a MIG instance (nobody shares those). A container's processes are the host PIDs of its cgroup;
a process of another container or pod is never charged to this one.

**Rules**, per container and per GPU it holds a slice of, with NVML's per-process memory of the GPU:

- ``unshimmed``: a process of the container that NVML lists on the GPU while no ACTIVE slot of the
  container's region carries its host PID: a static binary, a loader that ignores
  ``/etc/ld.so.preload``, a private copy of the driver. NVML listing a compute process means it has a
  context, which holds memory; the finding names the bytes NVML gives it.
- ``over_limit``: the memory NVML attributes to the container's processes on the GPU, summed, is more
  than ``limit + n × context_allowance + margin`` (`Policy.allowed`), ``n`` being how many of them
  NVML lists. The shim does not charge a process's CUDA context (612 MiB for PyTorch with cuBLAS on
  an H100), hence the allowance per process (default 1 GiB); the margin (default 64 MiB) covers
  NVML's 2 MiB grain and kernels loaded after the context. The limit is the assignment's
  ``memoryMiB`` (the extender's decision), never the region's figure, which the tenant can write.

**Grace.** A finding is acted on once it has been seen in every round for ``grace_s`` (default
30 s: a process may be starting, and the agent registers a shim process's host PID one round after
it claims its slot). A round without it forgets it; when it comes back its time starts again.

**Actions** (`plan`): each finding that outlives its grace is reported once (a Warning Event), each
(pod, reason) is counted once per episode (``neuronetes_slice_evictions_total``; an episode ends in
the first round without a finding of that reason for the pod), and in ``enforce`` mode the pod is
evicted every round while a finding of it is due (the caller spaces the retries). ``report`` does
everything but evict; ``off`` finds nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "DEFAULT_CONTEXT_ALLOWANCE_BYTES",
    "DEFAULT_GRACE_S",
    "DEFAULT_MARGIN_BYTES",
    "EVENT_REASONS",
    "ContainerView",
    "Finding",
    "Grant",
    "GrantKind",
    "Memory",
    "Mode",
    "Plan",
    "PodRef",
    "Policy",
    "Reason",
    "find",
    "grant_kind",
    "plan",
]

MIB: Final = 1 << 20
DEFAULT_GRACE_S: Final = 30.0
DEFAULT_CONTEXT_ALLOWANCE_BYTES: Final = 1024 * MIB
DEFAULT_MARGIN_BYTES: Final = 64 * MIB


class Mode(enum.StrEnum):
    ENFORCE = "enforce"  # evict, record Events, count
    REPORT = "report"  # record Events and count, never evict
    OFF = "off"  # nothing


class Reason(enum.StrEnum):
    UNSHIMMED = "unshimmed"
    OVER_LIMIT = "over_limit"


EVENT_REASONS: Final = {Reason.UNSHIMMED: "GPUUnshimmedProcess", Reason.OVER_LIMIT: "GPUMemoryOverLimit"}
"""The reason of the Warning Event each finding becomes."""


class GrantKind(enum.StrEnum):
    SLICE = "slice"
    WHOLE = "whole"
    MIG = "mig"


def grant_kind(memory_mib: int, *, mig: bool, gpu_memory_mib: int, gpu_mig_enabled: bool) -> GrantKind:
    """What a container holds on one GPU: a MIG instance (the grant names one, or the GPU is in MIG
    mode), the whole GPU (its limit is all of the GPU's memory: nobody else fits beside it, the node
    ledger's rule too), else a slice."""
    if mig or gpu_mig_enabled:
        return GrantKind.MIG
    return GrantKind.WHOLE if memory_mib >= gpu_memory_mib else GrantKind.SLICE


@dataclass(frozen=True, slots=True)
class Grant:
    kind: GrantKind
    limit_bytes: int  # the assignment's memoryMiB, in bytes


@dataclass(frozen=True, slots=True)
class ContainerView:
    """One container as reconciliation sees it."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    grants: Mapping[str, Grant]  # GPU UUID -> what the container holds there
    registered: frozenset[int]  # host PIDs of the ACTIVE slots of its region (its shim processes)
    host_pids: frozenset[int]  # its processes: the host PIDs of its cgroup


@dataclass(frozen=True, slots=True)
class Policy:
    """``--reconcile``, ``--reconcile-grace``, ``--reconcile-context-allowance``, ``--reconcile-margin``."""

    mode: Mode = Mode.ENFORCE
    grace_s: float = DEFAULT_GRACE_S
    context_allowance_bytes: int = DEFAULT_CONTEXT_ALLOWANCE_BYTES
    margin_bytes: int = DEFAULT_MARGIN_BYTES

    def __post_init__(self) -> None:
        if self.grace_s < 0 or self.context_allowance_bytes < 0 or self.margin_bytes < 0:
            raise ValueError("reconciliation grace, context allowance and margin must not be negative")

    def allowed(self, limit_bytes: int, processes: int) -> int:
        """What NVML may attribute to a container's `processes` on a GPU before it is over its limit."""
        return limit_bytes + processes * self.context_allowance_bytes + self.margin_bytes


@dataclass(frozen=True, slots=True)
class PodRef:
    uid: str
    namespace: str
    name: str


def _size(n: int) -> str:
    return f"{n / MIB:.0f} MiB ({n} bytes)"


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule broken by one container on one GPU."""

    reason: Reason
    pod: PodRef
    container: str
    gpu: str
    pid: int  # unshimmed: the process; over_limit: 0
    used_bytes: int  # unshimmed: the process's memory; over_limit: the container's total
    limit_bytes: int
    allowed_bytes: int  # over_limit: limit + tolerance; unshimmed: the same figure, for the message
    pids: tuple[int, ...]  # the container's processes NVML lists on the GPU

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.pod.uid, self.container, self.gpu, self.reason.value, self.pid)

    def describe(self) -> str:
        """One line naming the process or processes, the memory, the limit and the tolerance."""
        if self.reason is Reason.UNSHIMMED:
            return (
                f"container {self.container}: process {self.pid} holds {_size(self.used_bytes)} on GPU "
                f"{self.gpu} without the CUDA shim (no active slot of the container's region has its "
                f"host PID); the container's limit there is {_size(self.limit_bytes)}"
            )
        n = len(self.pids)
        return (
            f"container {self.container}: its processes {list(self.pids)} hold {_size(self.used_bytes)} "
            f"on GPU {self.gpu}, more than its limit {_size(self.limit_bytes)} + {n} process(es) x "
            f"context allowance + margin = {_size(self.allowed_bytes)}"
        )


def find(
    containers: Iterable[ContainerView],
    nvml: Mapping[str, Mapping[int, int]],
    policy: Policy,
) -> list[Finding]:
    """Every finding of this round. `nvml`: GPU UUID -> host PID -> bytes (NVML's running compute
    processes of the GPU; a GPU missing from it was not read and is not judged)."""
    if policy.mode is Mode.OFF:
        return []
    out: list[Finding] = []
    for view in containers:
        ref = PodRef(view.pod_uid, view.namespace, view.pod)
        for gpu, grant in sorted(view.grants.items()):
            procs = nvml.get(gpu)
            if grant.kind is not GrantKind.SLICE or procs is None:
                continue
            mine = sorted((pid, used) for pid, used in procs.items() if pid in view.host_pids)
            if not mine:
                continue
            pids = tuple(pid for pid, _ in mine)
            total = sum(used for _, used in mine)
            allowed = policy.allowed(grant.limit_bytes, len(mine))
            for pid, used in mine:
                if pid not in view.registered:
                    out.append(
                        Finding(
                            Reason.UNSHIMMED,
                            ref,
                            view.container,
                            gpu,
                            pid,
                            used,
                            grant.limit_bytes,
                            allowed,
                            pids,
                        )
                    )
            if total > allowed:
                out.append(
                    Finding(
                        Reason.OVER_LIMIT,
                        ref,
                        view.container,
                        gpu,
                        0,
                        total,
                        grant.limit_bytes,
                        allowed,
                        pids,
                    )
                )
    return out


@dataclass(frozen=True, slots=True)
class Memory:
    """What reconciliation keeps between rounds."""

    first_seen: Mapping[tuple[str, str, str, str, int], float] = field(default_factory=dict)
    reported: frozenset[tuple[str, str, str, str, int]] = frozenset()  # findings whose Event is out
    counted: frozenset[tuple[str, Reason]] = frozenset()  # (pod UID, reason) episodes counted


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do this round."""

    memory: Memory  # to pass to the next round
    pending: tuple[Finding, ...]  # seen, still within their grace
    report: tuple[Finding, ...]  # past their grace for the first time: one Warning Event each
    count: tuple[tuple[PodRef, Reason], ...]  # +1 on neuronetes_slice_evictions_total each
    evict: tuple[tuple[PodRef, tuple[Finding, ...]], ...]  # enforce: the pods to evict, and why


def plan(findings: Iterable[Finding], memory: Memory, now: float, policy: Policy) -> Plan:
    """Apply the grace to this round's `findings` (seen at `now`, seconds of a monotonic clock)."""
    first_seen: dict[tuple[str, str, str, str, int], float] = {}
    pending: list[Finding] = []
    due: list[Finding] = []
    for f in findings:
        if f.key in first_seen:
            continue
        first_seen[f.key] = since = memory.first_seen.get(f.key, now)
        (due if now - since >= policy.grace_s else pending).append(f)
    report = tuple(f for f in due if f.key not in memory.reported)
    episodes = {(f.pod.uid, f.reason): f.pod for f in due}
    count = tuple(
        (pod, reason) for (uid, reason), pod in episodes.items() if (uid, reason) not in memory.counted
    )
    # An episode lasts while its pod has a finding of that reason, due or not.
    alive = {(f.pod.uid, f.reason) for f in [*due, *pending]}
    evict: dict[str, tuple[PodRef, list[Finding]]] = {}
    if policy.mode is Mode.ENFORCE:
        for f in due:
            evict.setdefault(f.pod.uid, (f.pod, []))[1].append(f)
    return Plan(
        memory=Memory(
            first_seen=first_seen,
            reported=frozenset(f.key for f in due),
            counted=frozenset((memory.counted & alive) | set(episodes)),
        ),
        pending=tuple(pending),
        report=report,
        count=count,
        evict=tuple((pod, tuple(fs)) for pod, fs in evict.values()),
    )
