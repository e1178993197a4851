"""GPU health: the XID catalog, thermal and ECC rules, and the GPU state machine of one GPU.

States (`neuronetes.model.GpuHealth`): AVAILABLE, ALLOCATED (a pod holds an assignment, not running
yet), IN_USE (an assigned pod runs) come from usage; DEGRADED, RESETTING and OFFLINE come from
faults and administrators and take the GPU out of placement. docs/gpu-health.md has the tables.

`GpuHealthState.state(usage)` derives the state from what is known now; the caller records each
change as a transition (Kubernetes Event + GPUNode status). Faults that need a reset go OFFLINE
while the GPU's users are evicted, RESETTING during the reset, then AVAILABLE.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from neuronetes.model import GpuHealth

__all__ = [
    "THERMAL_PAUSE_C",
    "THERMAL_RESUME_C",
    "XID_CATALOG",
    "Fault",
    "GpuHealthState",
    "Phase",
    "Recovery",
    "Usage",
    "classify_xid",
]

THERMAL_PAUSE_C: Final = 85.0  # above: no new work on the GPU
THERMAL_RESUME_C: Final = 80.0  # at or below: back in service (hysteresis)


class Recovery(enum.Enum):
    """What an XID (or another fault) asks for, after NVIDIA's XID catalog."""

    IGNORE = "ignore"  # an application fault: the application is told, the GPU is fine
    WARN = "warn"  # counted and reported; the GPU stays in service
    DRAIN = "drain"  # no new work; running work finishes; reset once the GPU is empty
    RESET = "reset"  # users evicted at once, then a GPU reset
    REBOOT = "reboot"  # users evicted; the GPU stays OFFLINE until the node is rebooted

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY: Final = {
    Recovery.IGNORE: 0,
    Recovery.WARN: 1,
    Recovery.DRAIN: 2,
    Recovery.RESET: 3,
    Recovery.REBOOT: 4,
}

XID_CATALOG: Final[dict[int, tuple[Recovery, str]]] = {
    13: (Recovery.IGNORE, "graphics engine exception (application fault)"),
    31: (Recovery.IGNORE, "GPU memory page fault (application fault)"),
    43: (Recovery.IGNORE, "GPU stopped processing (application fault)"),
    45: (Recovery.IGNORE, "preemptive cleanup after previous errors (application fault)"),
    68: (Recovery.IGNORE, "video processor exception (application fault)"),
    48: (Recovery.RESET, "double-bit ECC error"),
    61: (Recovery.RESET, "internal micro-controller breakpoint"),
    62: (Recovery.RESET, "internal micro-controller halt"),
    63: (Recovery.DRAIN, "row remapping / page retirement recorded (applied at the next reset)"),
    64: (Recovery.RESET, "row remapping / page retirement recording failure"),
    74: (Recovery.RESET, "NVLink error"),
    79: (Recovery.REBOOT, "GPU has fallen off the bus"),
    92: (Recovery.WARN, "high single-bit ECC error rate"),
    94: (Recovery.DRAIN, "contained ECC error (the affected application was stopped)"),
    95: (Recovery.RESET, "uncontained ECC error"),
    119: (Recovery.RESET, "GSP RPC timeout"),
    120: (Recovery.RESET, "GSP error"),
    140: (Recovery.RESET, "unrecovered ECC error"),
}
"""XID → recovery, after NVIDIA's XID catalog (docs/gpu-health.md)."""

_UNKNOWN_XID: Final = (Recovery.DRAIN, "XID not in the agent's catalog")


def classify_xid(xid: int) -> tuple[Recovery, str]:
    """The recovery an XID asks for and its meaning; unknown XIDs drain the GPU (keep running work,
    place nothing new) rather than be ignored."""
    return XID_CATALOG.get(xid, _UNKNOWN_XID)


class Phase(enum.Enum):
    """Where a fault needing a reset stands."""

    EVICTING = "evicting"  # RESET/REBOOT: users being evicted (OFFLINE)
    DRAINING = "draining"  # DRAIN: waiting for users to finish (DEGRADED)
    RESETTING = "resetting"  # the backend is resetting the GPU (RESETTING)
    FAILED = "failed"  # the reset failed or is not possible: OFFLINE until `online`


@dataclass(slots=True)
class Fault:
    recovery: Recovery
    reason: str
    phase: Phase
    xid: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """Pods of the node holding this GPU: assigned (bound) and running."""

    assigned: int = 0
    running: int = 0


class GpuHealthState:
    """Health of one GPU: the worst open fault, temperature, administrator holds."""

    __slots__ = ("admin_offline", "fault", "hot", "last_xid", "lost", "state_now", "unresponsive")

    def __init__(self) -> None:
        self.fault: Fault | None = None
        self.hot: float | None = None  # temperature while above the pause threshold
        self.lost = False
        self.admin_offline = False
        self.unresponsive: str | None = None  # NVML watchdog reason
        self.last_xid = 0
        self.state_now = GpuHealth.AVAILABLE

    # ---- inputs --------------------------------------------------------------------------------

    def on_xid(self, xid: int) -> Recovery:
        """Record an XID; returns its recovery. A worse fault replaces a milder one."""
        self.last_xid = xid
        recovery, meaning = classify_xid(xid)
        if recovery.severity >= Recovery.DRAIN.severity:
            self._raise(Fault(recovery, f"XID {xid}: {meaning}", _first_phase(recovery), xid))
        if xid == 79:
            self.lost = True
        return recovery

    def on_uncorrected_ecc(self, count: int) -> None:
        """New double-bit ECC errors seen by polling (the XID 48 path, should the event be missed)."""
        self._raise(Fault(Recovery.RESET, f"{count} new uncorrectable ECC errors", Phase.EVICTING, 48))

    def on_temperature(self, celsius: float | None) -> None:
        if celsius is None:
            return
        if celsius > THERMAL_PAUSE_C:
            self.hot = celsius
        elif celsius <= THERMAL_RESUME_C:
            self.hot = None
        elif self.hot is not None:
            self.hot = celsius

    def on_lost(self) -> None:
        self.lost = True
        self._raise(Fault(Recovery.REBOOT, "GPU does not answer (fallen off the bus)", Phase.EVICTING, 79))

    def on_online(self) -> None:
        """An administrator put the GPU back (`neuronetes online`): every fault is cleared."""
        self.fault = None
        self.lost = False
        self.admin_offline = False
        self.hot = None

    def on_reboot(self) -> None:
        self.on_online()

    # ---- the reset workflow ----------------------------------------------------------------------

    def needs_eviction(self, usage: Usage) -> bool:
        f = self.fault
        return f is not None and f.phase is Phase.EVICTING and usage.assigned > 0

    def ready_to_reset(self, usage: Usage) -> bool:
        f = self.fault
        return (
            f is not None
            and f.recovery in (Recovery.RESET, Recovery.DRAIN)
            and f.phase in (Phase.EVICTING, Phase.DRAINING)
            and usage.assigned == 0
            and not self.lost
        )

    def reset_started(self) -> None:
        if self.fault is not None:
            self.fault.phase = Phase.RESETTING

    def reset_finished(self, ok: bool) -> None:
        if self.fault is None:
            return
        if ok:
            self.fault = None
        else:
            self.fault.phase = Phase.FAILED
            self.fault.reason += "; the reset failed: reset the GPU and run `neuronetes online`"

    # ---- the state ---------------------------------------------------------------------------

    def state(self, usage: Usage) -> tuple[GpuHealth, str]:
        """The GPU's state and why (empty reason for the schedulable states)."""
        f = self.fault
        if self.admin_offline:
            return GpuHealth.OFFLINE, "taken offline by an administrator"
        if f is not None:
            if f.phase is Phase.RESETTING:
                return GpuHealth.RESETTING, f.reason
            if f.phase is Phase.DRAINING:
                return GpuHealth.DEGRADED, f.reason
            return GpuHealth.OFFLINE, f.reason
        if self.unresponsive is not None:
            return GpuHealth.DEGRADED, self.unresponsive
        if self.hot is not None:
            return GpuHealth.DEGRADED, f"temperature {self.hot:.0f} °C above {THERMAL_PAUSE_C:.0f} °C"
        if usage.running:
            return GpuHealth.IN_USE, ""
        if usage.assigned:
            return GpuHealth.ALLOCATED, ""
        return GpuHealth.AVAILABLE, ""

    def _raise(self, fault: Fault) -> None:
        current = self.fault
        if current is None or fault.recovery.severity > current.recovery.severity:
            self.fault = fault


def _first_phase(recovery: Recovery) -> Phase:
    return Phase.DRAINING if recovery is Recovery.DRAIN else Phase.EVICTING
