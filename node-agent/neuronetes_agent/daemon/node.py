"""One node served by the agent: health bookkeeping, reactions to faults, publication.

`NodeAgent.tick` is the whole loop body: read XIDs and samples from the backend (outside the lock,
so a hung NVML only blocks this node's reads and the watchdog can still report it), then under the
lock apply them, derive every GPU's state, record each transition (Event on the Node, GPUNode
status), publish what changed, evict the pods of GPUs whose fault needs it, start resets, apply
MIG layouts and keep the containers' shim regions; then hand off to the NRI plugin (the node
inventory and ledger files), tend the regions from the plugin's container records (host PIDs,
dead slots) and reconcile shared GPUs' memory with NVML (`backstop`, `reconcile`).

Longer than most modules because `NodeAgent` is one lock-protected unit of state and every step of
the round reads and writes it; the decisions themselves live in pure modules (`health`,
`publish`, `miglayout`, `pods`, `regions`, `ledger`, `containers`, `reconcile`) and only their
sequencing is here.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from neuronetes import contracts as c
from neuronetes.contracts import ANNOTATION_OFFLINE_GPUS  # re-exported: importable from here too
from neuronetes.model import GpuHealth

from .backstop import Backstop
from .containers import ContainerTender
from .devices import Discovery, DiscoveryError, GpuLost, GpuSample, Inventory, XidEvent
from .health import GpuHealthState, Recovery, Usage
from .inventory import InventoryWriter
from .kube import KubeError, NodeWrites
from .ledger import LedgerWriter
from .miglayout import MIG_MANAGER_LABEL, MigTarget, changes, targets_from_spec
from .pods import PodUse
from .publish import Allocation, gpu_capacity, gpu_labels, gpunode_status
from .reconcile import PodRef
from .regions import RegionKeeper

__all__ = [
    "ANNOTATION_OFFLINE_GPUS",
    "REQUEST_PREFIX",
    "NodeAgent",
    "Transition",
]

log = logging.getLogger("neuronetes_agent")

REQUEST_PREFIX: Final = f"request.{c.GROUP}/"
"""GPUNode annotations ``request.neuronetes.io/<id>``: one-shot orders the agent executes and removes
(``online``, ``evict``, and on simulated nodes ``inject``); docs/gpu-health.md."""
XID_WAIT_FAILURES_LIMIT: Final = 3  # consecutive event-wait failures that mark the GPUs unhealthy
EVICTION_RETRY_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class Transition:
    gpu: str
    index: int
    before: GpuHealth
    after: GpuHealth
    reason: str


@dataclass(slots=True)
class _Published:
    labels: dict[str, str | None] | None = None  # what the Node has (None: unknown)
    capacity: dict[str, str] | None = None
    status_key: str = ""
    heartbeat: float = 0.0
    gpunode_missing: bool = False


@dataclass(slots=True)
class NodeCounters:
    xids: Counter[tuple[str, int]] = field(default_factory=Counter)
    transitions: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    evictions: Counter[str] = field(default_factory=Counter)
    slots_reclaimed: int = 0  # dead processes' slots ordered freed after NVML showed the memory released
    # NVML reconciliation: (namespace, pod, reason) -> episodes acted on (neuronetes_slice_evictions_total)
    slice_evictions: Counter[tuple[str, str, str]] = field(default_factory=Counter)


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
        regions: RegionKeeper | None = None,
        inventory_file: InventoryWriter | None = None,
        ledger: LedgerWriter | None = None,
        containers: ContainerTender | None = None,
        backstop: Backstop | None = None,
    ) -> None:
        self.node = node
        self.node_uid = node_uid
        self.backend = backend
        self.kube = kube
        self.resets = resets
        self.agent_version = agent_version
        self.heartbeat_s = heartbeat_s
        self.regions = regions
        self.inventory_file = inventory_file  # --node only: the NRI plugin's device map
        self.ledger = ledger  # --node only: the pods bound here, for the plugin's cross-check
        self.containers = containers  # --node only: host PIDs and dead slots from the plugin's records
        self.backstop = backstop  # --node only (with `containers`): NVML reconciliation of shared GPUs
        self._live: frozenset[str] = frozenset()  # pods with a running container (their regions stay)
        self._handoff_warnings: set[str] = set()
        self._pods_changed = regions is not None
        self.lock = threading.Lock()
        self.inventory: Inventory | None = None
        self.discovery_seconds = 0.0
        self.health: dict[str, GpuHealthState] = {}
        self.samples: dict[str, GpuSample] = {}
        self.states: dict[str, tuple[GpuHealth, str]] = {}
        self.pods: dict[str, PodUse] = {}
        self.cordoned: frozenset[str] = frozenset()
        self.mig_targets: dict[int, MigTarget] = {}
        self.mig_external = False  # NVIDIA's mig-manager owns the node's MIG configuration
        self.mig_state = "None"
        self._mig_pending: dict[str, MigTarget] = {}
        self._mig_failed_generation = -1
        self.generation = 0
        self.nvml_ok = True
        self.poll_started = 0.0  # monotonic start of the backend reads in progress (0: none)
        self.counters = NodeCounters()
        self._requests: dict[str, dict[str, Any]] = {}
        self._done_requests: set[str] = set()
        self._resetting: dict[str, Future[bool]] = {}
        self._evicted: dict[str, float] = {}
        self._xid_failures = 0
        self._published = _Published()
        self._ecc_seen: dict[str, int] = {}
        self._conditions_since: dict[tuple[str, str], str] = {}
        # Labels depend on the inventory only, capacity on the usable GPUs: computed on change.
        self._labels: dict[str, str | None] = {}
        self._capacity_of: tuple[frozenset[str] | None, dict[str, str]] = (None, {})

    # ---- setup ---------------------------------------------------------------------------------

    def start(self, node: Mapping[str, Any] | None = None) -> None:
        """Discover the GPUs and publish the node's labels, capacity and GPUNode. With the Node
        object (as a watch delivered it), labels and capacity it already has are not rewritten."""
        if node is not None:
            self._published.labels = dict((node.get("metadata") or {}).get("labels") or {})
            self.mig_external = MIG_MANAGER_LABEL in self._published.labels
            self._published.capacity = dict((node.get("status") or {}).get("capacity") or {})
        started = time.perf_counter()
        inventory = self.backend.scan()
        self.discovery_seconds = time.perf_counter() - started
        with self.lock:
            self.inventory = inventory
            self._labels = gpu_labels(self.node, inventory)
            self.health = {g.uuid: GpuHealthState() for g in inventory.gpus}
            gpunode = self.kube.ensure_gpunode(self.node, self.node_uid)
            self._apply_spec(gpunode)
            self._derive_states(record=False)
            self._publish(force=True)
            # Nodes started together would heartbeat together: spread them over one period.
            self._published.heartbeat -= random.uniform(0, self.heartbeat_s)
        self._write_inventory()

    # ---- inputs from watches (any thread) --------------------------------------------------------

    def set_pod(self, uid: str, use: PodUse | None) -> None:
        with self.lock:
            if use is None:
                self.pods.pop(uid, None)
            else:
                self.pods[uid] = use
            self._pods_changed = self.regions is not None

    def gpunode_deleted(self) -> None:
        """Someone deleted the node's GPUNode: the next round creates and publishes it again."""
        with self.lock:
            self._published.gpunode_missing = True
            self._published.status_key = ""

    def set_gpunode(self, gpunode: Mapping[str, Any]) -> None:
        with self.lock:
            self._apply_spec(gpunode)

    def _apply_spec(self, gpunode: Mapping[str, Any]) -> None:
        meta = gpunode.get("metadata") or {}
        spec = gpunode.get("spec") or {}
        self.generation = int(meta.get("generation") or 0)
        self.cordoned = frozenset(spec.get("cordonedGPUs") or ())
        self.mig_targets = targets_from_spec(spec)
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        offline = {u.strip() for u in annotations.get(ANNOTATION_OFFLINE_GPUS, "").split(",") if u.strip()}
        for uuid, h in self.health.items():
            h.admin_offline = uuid in offline
        self._done_requests &= set(annotations)  # handled and removed: forget them
        for key, value in annotations.items():
            if key.startswith(REQUEST_PREFIX) and key not in self._done_requests:
                try:
                    order = json.loads(value)
                except ValueError:
                    order = {}
                self._requests[key] = order if isinstance(order, dict) else {}

    # ---- the loop ------------------------------------------------------------------------------

    def tick(self) -> None:
        """One round: read the backend, react, publish. Never raises for API or GPU errors."""
        inventory = self.inventory
        if inventory is None:
            return
        with self.lock:
            self._handle_requests()  # before the reads, so they see what an order changed
        self.poll_started = time.monotonic()
        xids, samples, lost, nvml_ok = self._read(inventory)
        self.poll_started = 0.0
        with self.lock:
            self.nvml_ok = nvml_ok
            for h in self.health.values():
                h.unresponsive = None if nvml_ok else "NVML does not answer"
            for event in xids:
                self._on_xid(event)
            for uuid in lost:
                self.health[uuid].on_lost()
            for uuid, sample in samples.items():
                self._on_sample(uuid, sample)
            self._finish_resets()
            self._plan_mig()
            transitions = self._derive_states(record=True)
            self._publish(force=bool(transitions))
            self._evict_and_reset()
            self._apply_mig()
            self._sync_regions()
        self._write_inventory()
        self._hand_off()

    def _write_inventory(self) -> None:
        """Rewrite the node inventory file when due or changed (a MIG change rescans first)."""
        if self.inventory_file is not None and self.inventory is not None:
            self.inventory_file.refresh(self.inventory)

    def _sync_regions(self) -> None:
        inventory = self.inventory
        if self.regions is None or not self._pods_changed or inventory is None:
            return
        self._pods_changed = False
        wanted = {p.uid: (p.namespace, p.name, p.assignment) for p in self.pods.values()}
        for error in self.regions.sync(wanted, inventory, keep=self._live):
            self._event("Warning", "GPURegionFailed", error)

    def _hand_off(self) -> None:
        """Write the node ledger and tend the regions from the plugin's container records; a
        warning becomes an Event once, and again only after it cleared."""
        inventory = self.inventory
        if inventory is None or (self.ledger is None and self.containers is None):
            return
        with self.lock:
            pods = dict(self.pods)
            processes = [p for sample in self.samples.values() for p in sample.processes]
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
                log.info("node %s: ordered %d region slots of dead processes freed", self.node, report.freed)
            with self.lock:
                self.counters.slots_reclaimed += report.freed
                if report.live != self._live:  # a gone pod's last container stopped: drop its region
                    self._live = report.live
                    self._pods_changed = self.regions is not None
            if self.backstop is not None:
                self._reconcile(self.backstop, inventory, report.cgroups)
        for warning in warnings:
            if warning not in self._handoff_warnings:
                self._event("Warning", "GPUContainerHandoff", warning)
        self._handoff_warnings = set(warnings)

    def _reconcile(
        self, backstop: Backstop, inventory: Inventory, cgroups: Mapping[tuple[str, str], Path]
    ) -> None:
        """Carry out NVML reconciliation's plan (`backstop`): a Warning Event on the pod and on the
        Node per finding past its grace, the counter, and in enforce mode the pod's eviction."""
        with self.lock:
            if not self.nvml_ok:
                return  # NVML hangs or fails: nothing to judge by
            pods, samples = dict(self.pods), dict(self.samples)
        result = backstop.round(pods, inventory, samples, cgroups)
        with self.lock:
            for ref, reason, message in backstop.events(result):
                self._event("Warning", reason, message, pod=ref)
            for ref, why in result.count:
                self.counters.slice_evictions[(ref.namespace, ref.name, why.value)] += 1
            for ref, found in result.evict:
                if (pod := self.pods.get(ref.uid)) is not None:
                    self._evict_once(pod, backstop.eviction_reason(found), time.monotonic())

    def watchdog(self, limit_s: float) -> bool:
        """Called from another thread: when the backend reads of this node have hung for more than
        `limit_s`, mark every GPU DEGRADED and publish. True when it fired."""
        started = self.poll_started
        if not started or time.monotonic() - started <= limit_s:
            return False
        with self.lock:
            if not self.nvml_ok:
                return True
            self.nvml_ok = False
            for h in self.health.values():
                h.unresponsive = f"NVML has not answered for {time.monotonic() - started:.0f} s"
            self._derive_states(record=True)
            self._publish(force=True)
        return True

    def _read(self, inventory: Inventory) -> tuple[list[XidEvent], dict[str, GpuSample], list[str], bool]:
        xids: list[XidEvent] = []
        nvml_ok = True
        try:
            xids = self.backend.wait_xids(0)
            self._xid_failures = 0
        except DiscoveryError as exc:
            self._xid_failures += 1
            nvml_ok = self._xid_failures < XID_WAIT_FAILURES_LIMIT
            log.warning("node %s: XID wait failed (%d in a row): %s", self.node, self._xid_failures, exc)
        samples: dict[str, GpuSample] = {}
        lost: list[str] = []
        for g in inventory.gpus:
            try:
                samples[g.uuid] = self.backend.sample(g.uuid)
            except GpuLost:
                lost.append(g.uuid)
            except DiscoveryError as exc:
                log.warning("node %s: GPU %s: %s", self.node, g.uuid, exc)
        return xids, samples, lost, nvml_ok

    def _on_xid(self, event: XidEvent) -> None:
        h = self.health.get(event.uuid)
        if h is None:
            return
        recovery = h.on_xid(event.xid)
        self.counters.xids[(event.uuid, event.xid)] += 1
        kind = "Normal" if recovery in (Recovery.IGNORE,) else "Warning"
        self._event(kind, "GPUXid", f"GPU {event.uuid}: XID {event.xid} ({recovery.value})")

    def _on_sample(self, uuid: str, sample: GpuSample) -> None:
        h = self.health[uuid]
        self.samples[uuid] = sample
        h.on_temperature(sample.temperature_celsius)
        seen = self._ecc_seen.get(uuid)
        now = sample.ecc_uncorrected_total
        if now is not None:
            if seen is not None and now > seen and (h.fault is None or h.fault.xid != 48):
                h.on_uncorrected_ecc(now - seen)
            self._ecc_seen[uuid] = now

    def _usage(self) -> dict[str, Usage]:
        assigned: Counter[str] = Counter()
        running: Counter[str] = Counter()
        for pod in self.pods.values():
            for uuid in pod.allocations:
                assigned[uuid] += 1
                running[uuid] += pod.running
        return {u: Usage(assigned[u], running[u]) for u in self.health}

    def _derive_states(self, *, record: bool) -> list[Transition]:
        assert self.inventory is not None
        usage = self._usage()
        out: list[Transition] = []
        for g in self.inventory.gpus:
            h = self.health[g.uuid]
            state, reason = h.state(usage[g.uuid])
            if state.schedulable and g.uuid in self._mig_pending:
                state, reason = GpuHealth.DEGRADED, "MIG layout being applied (spec.migLayout)"
            before = self.states.get(g.uuid, (h.state_now, ""))[0]
            self.states[g.uuid] = (state, reason)
            h.state_now = state
            if record and state is not before:
                out.append(Transition(g.uuid, g.index, before, state, reason))
        for t in out:
            self.counters.transitions[(t.gpu, t.before.value, t.after.value)] += 1
            unhealthy = not t.after.schedulable
            self._event(
                "Warning" if unhealthy else "Normal",
                f"GPU{t.after.value}",
                f"GPU {t.index} ({t.gpu}): {t.before.value} -> {t.after.value}"
                + (f": {t.reason}" if t.reason else ""),
            )
        return out

    def _finish_resets(self) -> None:
        for uuid, future in list(self._resetting.items()):
            if not future.done():
                continue
            del self._resetting[uuid]
            try:
                ok = future.result()
            except Exception as exc:  # a backend error is a failed reset
                log.warning("node %s: reset of %s failed: %s", self.node, uuid, exc)
                ok = False
            self.health[uuid].reset_finished(ok)

    def _evict_and_reset(self) -> None:
        usage = self._usage()
        now = time.monotonic()
        for uuid, h in self.health.items():
            if h.needs_eviction(usage[uuid]):
                self._evict_users(uuid, f"GPU {uuid}: {h.fault.reason if h.fault else ''}", now)
            elif h.ready_to_reset(usage[uuid]) and uuid not in self._resetting:
                h.reset_started()
                self._resetting[uuid] = self.resets.submit(self.backend.reset, uuid)
        self._evicted = {uid: t for uid, t in self._evicted.items() if uid in self.pods}

    def _evict_users(self, uuid: str, why: str, now: float) -> None:
        """Evict the pods holding GPU `uuid` (each at most once per retry interval)."""
        for pod in list(self.pods.values()):
            if uuid in pod.allocations:
                self._evict_once(pod, why, now)

    def _evict_once(self, pod: PodUse, why: str, now: float) -> None:
        """Evict `pod` unless it was asked less than a retry interval ago."""
        if now - self._evicted.get(pod.uid, -1e9) > EVICTION_RETRY_S:
            self._evict(pod, why)
            self._evicted[pod.uid] = now

    # ---- MIG layouts ---------------------------------------------------------------------------

    def _plan_mig(self) -> None:
        """Compare the GPUs with ``spec.migLayout``: the GPUs to reconfigure (kept off new work,
        DEGRADED) and the layout state."""
        inventory = self.inventory
        assert inventory is not None
        self._mig_pending = {}
        if not self.mig_targets or self.mig_external:
            self.mig_state = "None"  # nothing asked, or NVIDIA's mig-manager owns the node: report only
            return
        missing = set(self.mig_targets) - {g.index for g in inventory.gpus}
        if missing:
            self._mig_fail(f"spec.migLayout names GPU index {sorted(missing)} the node does not have")
            return
        pending = changes(inventory, self.mig_targets)
        if not pending:
            if self.mig_state != "Applied":
                self._event("Normal", "MIGApplied", "MIG layout applied")
            self.mig_state = "Applied"
        elif self.mig_state != "Failed" or self._mig_failed_generation != self.generation:
            self._mig_pending = pending  # a failed layout is retried when the spec changes
            self.mig_state = "Pending"

    def _apply_mig(self) -> None:
        """Evict the users of each GPU to reconfigure; reconfigure the GPUs without users."""
        usage = self._usage()
        applied = False
        for uuid, target in self._mig_pending.items():
            if usage[uuid].assigned:
                self._evict_users(uuid, f"GPU {uuid}: MIG layout change", time.monotonic())
                continue
            self.mig_state = "Applying"
            error = self.backend.apply_mig(uuid, target.enabled, target.counts)
            if error is not None:
                self._mig_fail(f"GPU {target.index}: {error}")
                break
            applied = True
        if applied:
            self._rescan()

    def _mig_fail(self, message: str) -> None:
        if self.mig_state != "Failed" or self._mig_failed_generation != self.generation:
            self._event("Warning", "MIGFailed", message)
        self.mig_state = "Failed"
        self._mig_failed_generation = self.generation

    def _rescan(self) -> None:
        """Read the inventory again after a reconfiguration (labels and capacity follow)."""
        try:
            inventory = self.backend.scan()
        except DiscoveryError as exc:
            log.warning("node %s: rescan failed: %s", self.node, exc)
            return
        self.inventory = inventory
        self._labels = gpu_labels(self.node, inventory)
        self._capacity_of = (None, {})

    def _evict(self, pod: PodUse, why: str) -> None:
        status = self.kube.evict(pod.namespace, pod.name)
        self.counters.evictions[str(status)] += 1
        self._event("Warning", "GPUPodEvicted", f"evicting {pod.namespace}/{pod.name} (HTTP {status}): {why}")

    # ---- requests ------------------------------------------------------------------------------

    def _handle_requests(self) -> None:
        if not self._requests:
            return
        requests, self._requests = self._requests, {}
        for key, order in requests.items():
            message = self._execute(order)
            self._done_requests.add(key)
            self._event("Normal", "GPURequest", f"{key}: {message}")
            try:
                self.kube.patch_gpunode(self.node, {"metadata": {"annotations": {key: None}}})
            except KubeError as exc:
                log.warning("node %s: cannot remove %s: %s", self.node, key, exc)

    def _execute(self, order: Mapping[str, Any]) -> str:
        verb, uuid = order.get("verb"), order.get("gpu")
        h = self.health.get(str(uuid))
        if h is None:
            return f"refused: no GPU {uuid!r} on this node"
        if verb == "online":
            repair = getattr(self.backend, "repair", None)
            if repair is not None:
                repair(str(uuid))
            h.on_online()
            return f"GPU {uuid} online"
        if verb == "evict":
            pods = [p for p in self.pods.values() if uuid in p.allocations]
            for pod in pods:
                self._evict(pod, f"GPU {uuid} taken offline by an administrator (--force)")
            return f"evicted {len(pods)} pods from GPU {uuid}"
        if verb == "inject":
            inject = getattr(self.backend, "inject", None)
            if inject is None:
                return "refused: fault injection exists only on simulated nodes"
            try:
                return str(inject(str(uuid), order.get("fault") or {}))
            except (KeyError, TypeError, ValueError) as exc:
                return f"refused: {exc}"
        return f"refused: unknown verb {verb!r}"

    # ---- publication ---------------------------------------------------------------------------

    def usable_gpus(self) -> set[str]:
        return {u for u, (s, _) in self.states.items() if s.schedulable and u not in self.cordoned}

    def allocations(self) -> dict[str, list[Allocation]]:
        assert self.inventory is not None
        out: dict[str, list[Allocation]] = {}
        for pod in self.pods.values():
            for uuid, entries in pod.allocations.items():
                gpu = self.inventory.by_uuid(uuid)
                for entry in entries:
                    entry = dict(entry)
                    profile, start = entry.pop("migProfile", None), entry.pop("migStart", None)
                    if gpu is not None and profile is not None:
                        inst = next((d for d in gpu.mig_devices if d.start == start), None)
                        if inst is not None:
                            entry["migInstance"] = inst.uuid
                    out.setdefault(uuid, []).append(entry)
        return out

    def _publish(self, *, force: bool) -> None:
        """Write labels, capacity and the GPUNode status where they changed (status also on the
        heartbeat). API errors are logged; the next tick tries again."""
        inventory = self.inventory
        assert inventory is not None
        pub = self._published
        now = time.monotonic()
        try:
            if pub.gpunode_missing:  # deleted by someone: the agent owns it, so it comes back
                self._apply_spec(self.kube.ensure_gpunode(self.node, self.node_uid))
                pub.gpunode_missing = False
            labels = self._labels
            if pub.labels is None or any(pub.labels.get(k) != v for k, v in labels.items()):
                self.kube.patch_node_labels(self.node, labels)
                pub.labels = labels
            usable = frozenset(self.usable_gpus())
            if usable != self._capacity_of[0]:
                self._capacity_of = (usable, gpu_capacity(self.node, inventory, set(usable)))
            capacity = self._capacity_of[1]
            if pub.capacity is None or any(pub.capacity.get(k) != v for k, v in capacity.items()):
                self.kube.patch_node_capacity(self.node, capacity)
                pub.capacity = capacity
            allocations = self.allocations()
            key = json.dumps(
                [sorted(self.states.items()), allocations, self.generation, self.nvml_ok, self.mig_state],
                default=str,
            )
            if not force and key == pub.status_key and now - pub.heartbeat >= self.heartbeat_s:
                # Nothing changed: the heartbeat alone (a small patch; a fleet sends many).
                stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                self.kube.patch_gpunode_status(self.node, {"lastHeartbeatTime": stamp})
                pub.heartbeat = now
            elif force or key != pub.status_key:
                status = gpunode_status(
                    inventory,
                    self.states,
                    allocations,
                    agent_version=self.agent_version,
                    generation=self.generation,
                    heartbeat=datetime.now(UTC),
                    nvml_ok=self.nvml_ok,
                    mig_state=self.mig_state,
                )
                self._stamp_conditions(status)
                self.kube.patch_gpunode_status(self.node, status)
                pub.status_key, pub.heartbeat = key, now
        except KubeError as exc:
            log.warning("node %s: publication failed: %s", self.node, exc)
            if exc.status == 404:
                pub.gpunode_missing = True
                pub.status_key = ""

    def _stamp_conditions(self, status: dict[str, Any]) -> None:
        """Keep each condition's lastTransitionTime until its status changes."""
        stamp = status["lastHeartbeatTime"]
        for cond in status["conditions"]:
            key = (cond["type"], cond["status"])
            since = self._conditions_since.setdefault(key, stamp)
            other = (cond["type"], "False" if cond["status"] == "True" else "True")
            self._conditions_since.pop(other, None)
            cond["lastTransitionTime"] = since

    def _event(self, kind: str, reason: str, message: str, *, pod: PodRef | None = None) -> None:
        """An Event on the Node, and with `pod` on that pod too."""
        log.info("node %s: %s %s", self.node, reason, message)
        try:
            self.kube.node_event(self.node, self.node_uid, kind, reason, message)
        except KubeError as exc:
            log.warning("node %s: cannot record event %s: %s", self.node, reason, exc)
        if pod is None:
            return
        try:
            self.kube.pod_event(pod.namespace, pod.name, pod.uid, self.node, kind, reason, message)
        except KubeError as exc:
            log.warning("node %s: cannot record event %s on pod %s: %s", self.node, reason, pod.name, exc)
