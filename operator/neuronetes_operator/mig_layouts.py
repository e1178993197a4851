"""The MIG layout controller: re-lays out MIG GPUs for pending MIG demand no current layout serves.

Every tick (``migLayouts.intervalSeconds``) it first follows the relayouts it wrote (the GPUNode's
``status.migPlan``): the agent's ``status.migConfigState`` for the current generation, or
mig-manager's ``nvidia.com/mig.config.state`` label; ``Applied`` or ``Failed``, or ``Failed`` once
``applyTimeoutSeconds`` pass; a node it cordoned is uncordoned when the relayout ends either way.
Then it reads the pending pods asking for ``neuronetes.io/mig-*`` and the Pending MIG GPUSlices
(`neuronetes.migdemand`; at most ``maxDemandPerTick`` instances, oldest first; each pod's restricted
to the nodes with GPUs it may run on by its node selection and tolerations, a pinned slice's to its
node or GPU; instances Bound MIG slices hold are in use) and the GPUNodes (at most
``maxGpusPerTick`` MIG GPUs), asks `neuronetes.migplan.plan_mig_layouts` per group of nodes
(`neuronetes.migdemand.plan_mig_demand`; through `neuronetes.migrollout`, which keeps the GPUs of a
node still being re-laid out, of a mig-manager GPU in use, of an unhealthy GPU as they stand) and
writes at most ``maxNodesPerTick`` relayouts: ``spec.migLayout`` with exact placements for the
agent, or a mig-parted config entry and ``nvidia.com/mig.config`` for mig-manager. The time of each
GPU's relayout is kept in ``status.migPlan.gpus`` (the hysteresis' clock, ``minRelayoutIntervalSeconds``).
Events ``MIGRelayoutPlanned`` (GPUNode, each pod and slice served),
``MIGRelayoutApplied``/``MIGRelayoutFailed``, and ``MIGDemandUnserved`` (Warning, on a pending pod or
slice the planner could not serve, with its reasons; at most once per claim every
`UNSERVED_EVENT_INTERVAL_S` while its reasons stay the same).
docs/mig.md, "Applying a plan".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from neuronetes import contracts as c
from neuronetes.mig import MigLayout
from neuronetes.migdemand import (
    pending_mig_demand,
    pinned_slice_demand,
    plan_mig_demand,
    slice_held_instances,
    unserved_by_claim,
)
from neuronetes.migplan import GpuMigState
from neuronetes.migrollout import (
    MIG_MANAGER_CONFIG_LABEL,
    MIG_MANAGER_STATE_LABEL,
    ApplyPath,
    NodeRelayout,
    agent_layout_entries,
    apply_path,
    current_layout,
    gpu_key,
    gpu_states,
    merge_mig_parted_configs,
    mig_parted_config_name,
    mig_parted_entry,
    node_relayouts,
)

from .mig_layout_io import GPUNODES, MigLayoutIO
from .objects import api_message
from .settings import MigLayoutSettings

__all__ = ["ANNOTATION_CORDONED", "UNSERVED_EVENT_INTERVAL_S", "MigLayoutController", "relayout_times"]

log = logging.getLogger("neuronetes_operator.mig_layouts")

ANNOTATION_CORDONED: Final = f"{c.GROUP}/mig-cordoned"
"""On a node the controller cordoned for a MIG mode change: the mig-parted config it waits for."""
CONFIG_KEY: Final = "config.yaml"
UNSERVED_EVENT_INTERVAL_S: Final = 300.0
"""A pod's ``MIGDemandUnserved`` Event is posted again after this long at the earliest (sooner when
the reasons change): a pod waiting for capacity is told why without an Event every tick."""


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def relayout_times(gpunode: Mapping[str, Any]) -> dict[int, float]:
    """When the controller last re-laid out each GPU of the node (``status.migPlan.gpus``)."""
    out: dict[int, float] = {}
    for entry in ((gpunode.get("status") or {}).get("migPlan") or {}).get("gpus") or ():
        t = _seconds(entry.get("lastRelayoutTime"))
        if t is not None:
            out[int(entry["index"])] = t
    return out


class MigLayoutController(MigLayoutIO):
    """Plans and writes MIG relayouts, one `tick` at a time (from a thread)."""

    def __init__(self, api: Any, settings: MigLayoutSettings, namespaces: list[str] | None = None) -> None:
        super().__init__(api, namespaces)
        self.settings = settings
        # claim (a pod's namespace/name, a slice's GPUSlice:namespace/name) -> (when its
        # MIGDemandUnserved Event was posted, the message)
        self._unserved_told: dict[str, tuple[float, str]] = {}
        # claim -> the node whose relayout, written for it, is being applied
        self._awaiting: dict[str, str] = {}

    # ---- the tick --------------------------------------------------------------------------------

    def tick(self, now_s: float | None = None) -> None:
        """Follow the relayouts under way, then plan and write new ones."""
        now = time.time() if now_s is None else now_s
        gpunodes = self.custom.list_cluster_custom_object(c.GROUP, c.VERSION, GPUNODES).get("items") or []
        nodes = self._nodes()
        busy: set[str] = set()
        for g in gpunodes:
            name = g["metadata"]["name"]
            if ((g.get("status") or {}).get("migPlan") or {}).get("state") == "Applying":
                try:
                    if self._follow(g, nodes.get(name), now):
                        busy.add(name)
                except ApiException as exc:
                    busy.add(name)
                    log.warning("following the MIG relayout of %s: %s", name, api_message(exc))
        slices = self._slices()
        # The nodes a pending pod may run on (its node selection, its tolerations of their taints)
        # among the nodes with GPUs: its demand is served and planned on those only.
        gpu_nodes = [
            node
            for name in sorted({g["metadata"]["name"] for g in gpunodes})
            if (node := nodes.get(name)) is not None and not node["metadata"].get("deletionTimestamp")
        ]
        pending, left_out = pending_mig_demand(
            self._pending_pods(), self.settings.max_demand_per_tick, slices, gpu_nodes
        )
        demand = [*pinned_slice_demand(slices), *pending]
        if not demand:
            self._unserved_told.clear()
            return
        if left_out:
            log.info("MIG layouts: %d pending instances wait for a later tick", left_out)
        held = slice_held_instances(slices)  # Bound MIG slices' instances: in use, never re-laid out
        states: list[GpuMigState] = []
        paths: dict[str, ApplyPath] = {}
        mig_off: set[str] = set()
        gpu_uuids: dict[str, str] = {}
        by_name: dict[str, dict[str, Any]] = {}
        for g in sorted(gpunodes, key=lambda g: g["metadata"]["name"]):
            name = g["metadata"]["name"]
            node = nodes.get(name)
            if node is None or node.get("metadata", {}).get("deletionTimestamp"):
                continue
            path = apply_path(node["metadata"].get("labels") or {})
            found, skipped = gpu_states(
                g,
                path,
                relayout_times(g),
                now,
                frozen=name in busy,
                mode_change=self.settings.allow_mode_change,
                held=held,
            )
            for line in skipped:
                log.info("MIG layouts: %s left out: %s", name, line)
            room = self.settings.max_gpus_per_tick - len(states)
            if room <= 0:
                break
            found = found[:room]
            states.extend(found)
            reported = (g.get("status") or {}).get("gpus") or ()
            mig_off |= {gpu_key(name, int(x["index"])) for x in reported if x.get("migMode") == "Disabled"}
            gpu_uuids.update({gpu_key(name, int(x["index"])): str(x.get("uuid")) for x in reported})
            paths[name], by_name[name] = path, g
        plan = plan_mig_demand(
            demand,
            states,
            gpu_uuids,
            now_s=now,
            min_relayout_interval_s=self.settings.min_relayout_interval_seconds,
        )
        # A pod a relayout under way was written for is not unserved: its node is frozen meanwhile.
        self._awaiting = {k: n for k, n in self._awaiting.items() if n in busy}
        unserved = {k: v for k, v in unserved_by_claim(plan).items() if k not in self._awaiting}
        self._tell_unserved(unserved, now)
        for relayout in node_relayouts(plan, paths, mig_off)[: self.settings.max_nodes_per_tick]:
            try:
                self._write(by_name[relayout.node], nodes[relayout.node], relayout, now)
            except (ApiException, ValueError) as exc:
                message = api_message(exc) if isinstance(exc, ApiException) else str(exc)
                log.warning("writing the MIG relayout of %s: %s", relayout.node, message)
                self._event(by_name[relayout.node], "Warning", "MIGRelayoutFailed", message)

    def _tell_unserved(self, unserved: Mapping[str, list[str]], now: float) -> None:
        """A Warning Event on each claim (pod, MIG slice) with demand the plan leaves unserved,
        rate-limited per claim; claims served or gone are forgotten."""
        self._unserved_told = {k: v for k, v in self._unserved_told.items() if k in unserved}
        for key, reasons in unserved.items():
            message = "no MIG layout can serve this pod: " + "; ".join(reasons)
            told = self._unserved_told.get(key)
            if told is not None and told[1] == message and now - told[0] < UNSERVED_EVENT_INTERVAL_S:
                continue
            self._unserved_told[key] = (now, message)
            log.info("MIG layouts: %s: %s", key, message)
            self._claim_event(key, message, "Warning", "MIGDemandUnserved")

    # ---- following a relayout -----------------------------------------------------------------------

    def _follow(self, gpunode: dict[str, Any], node: Mapping[str, Any] | None, now: float) -> bool:
        """Move ``status.migPlan`` on; True while the relayout is still under way."""
        plan = (gpunode.get("status") or {}).get("migPlan") or {}
        started = _seconds(plan.get("plannedTime")) or now
        outcome: tuple[str, str] | None = None
        if plan.get("path") == "mig-manager":
            labels = (node or {}).get("metadata", {}).get("labels") or {}
            if labels.get(MIG_MANAGER_CONFIG_LABEL) != plan.get("migConfig"):
                outcome = ("Failed", "nvidia.com/mig.config was changed by someone else")
            elif labels.get(MIG_MANAGER_STATE_LABEL) == "success":
                outcome = ("Applied", f"mig-manager applied {plan.get('migConfig')}")
            elif labels.get(MIG_MANAGER_STATE_LABEL) == "failed":
                outcome = ("Failed", f"mig-manager failed to apply {plan.get('migConfig')}")
        else:
            status = gpunode.get("status") or {}
            current = int(status.get("observedGeneration") or 0) >= int(
                gpunode["metadata"].get("generation") or 0
            )
            if current and status.get("migConfigState") == "Applied":
                outcome = ("Applied", "the node agent applied the layout")
            elif current and status.get("migConfigState") == "Failed":
                outcome = (
                    "Failed",
                    "the node agent failed to apply the layout (its MIGFailed Event says why)",
                )
        if outcome is None and now - started > self.settings.apply_timeout_seconds:
            outcome = ("Failed", f"not applied within {self.settings.apply_timeout_seconds:.0f} s")
        if outcome is None:
            return True
        state, message = outcome
        if plan.get("cordoned") and node is not None:
            self._uncordon(node)
        self._status(
            gpunode,
            {"state": state, "message": f"{plan.get('message', '')}; {message}"[:4096], "cordoned": False},
        )
        self._event(gpunode, "Normal" if state == "Applied" else "Warning", f"MIGRelayout{state}", message)
        return False

    # ---- writing a relayout ---------------------------------------------------------------------------

    def _write(
        self, gpunode: dict[str, Any], node: Mapping[str, Any], relayout: NodeRelayout, now: float
    ) -> None:
        name = relayout.node
        summary = relayout.summary()
        served = f"{len(relayout.serves)} pending MIG instance(s): {', '.join(relayout.serves[:8])}"
        message = f"{summary} (for {served})"
        status: dict[str, Any] = {
            "state": "Applying",
            "path": relayout.path,
            "message": message[:4096],
            "plannedTime": _stamp(now),
            "cordoned": False,
        }
        if relayout.path == "mig-manager":
            status.update(self._write_mig_manager(gpunode, node, relayout))
        else:
            entries = agent_layout_entries((gpunode.get("spec") or {}).get("migLayout") or [], relayout)
            self.custom.patch_cluster_custom_object(
                c.GROUP, c.VERSION, GPUNODES, name, {"spec": {"migLayout": entries}}
            )
        times = relayout_times(gpunode)
        times.update({index: now for index in relayout.gpus})
        status["gpus"] = [{"index": i, "lastRelayoutTime": _stamp(t)} for i, t in sorted(times.items())]
        self._status(gpunode, status)
        self._event(gpunode, "Normal", "MIGRelayoutPlanned", message)
        for key in relayout.serves:
            self._awaiting[key.partition("#")[0]] = name
            self._claim_event(
                key,
                f"MIG relayout of node {name} planned for this claim: {summary}",
                "Normal",
                "MIGRelayoutPlanned",
            )
        log.info("MIG relayout of %s (%s): %s", name, relayout.path, message)

    def _write_mig_manager(
        self, gpunode: Mapping[str, Any], node: Mapping[str, Any], relayout: NodeRelayout
    ) -> dict[str, Any]:
        """The node's whole layout as a mig-parted entry in mig-manager's ConfigMap, then the node's
        ``nvidia.com/mig.config`` label (cordoned first when a GPU switches its MIG mode)."""
        layouts: dict[int, MigLayout] = {}
        for gpu in (gpunode.get("status") or {}).get("gpus") or ():
            index = int(gpu["index"])
            if index in relayout.gpus:
                layouts[index] = relayout.gpus[index].target
            elif gpu.get("migMode") == "Enabled" and (layout := current_layout(gpu)) is not None:
                layouts[index] = layout
        entry = mig_parted_entry(layouts)
        config = mig_parted_config_name(entry)
        namespace, _, cm_name = self.settings.mig_manager_config_map.partition("/")
        keep = {
            str(n["metadata"].get("labels", {}).get(MIG_MANAGER_CONFIG_LABEL)) for n in self._nodes().values()
        }
        try:
            cm = self.core.read_namespaced_config_map(cm_name, namespace)
            data = dict(cm.data or {})
            data[CONFIG_KEY] = merge_mig_parted_configs(data.get(CONFIG_KEY), config, entry, keep)
            self.core.patch_namespaced_config_map(
                cm_name, namespace, {"data": {CONFIG_KEY: data[CONFIG_KEY]}}
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            text = merge_mig_parted_configs(None, config, entry, keep)
            self.core.create_namespaced_config_map(
                namespace, {"metadata": {"name": cm_name}, "data": {CONFIG_KEY: text}}
            )
        cordoned = False
        meta = node["metadata"]
        if relayout.mode_change and not (node.get("spec") or {}).get("unschedulable"):
            # A GPU switching its MIG mode must stay idle until mig-manager is done: nothing new may
            # land on the node. Never a node someone else cordoned (it is left as it is).
            self.core.patch_node(
                meta["name"],
                {"spec": {"unschedulable": True}, "metadata": {"annotations": {ANNOTATION_CORDONED: config}}},
            )
            cordoned = True
        self.core.patch_node(
            meta["name"],
            {"metadata": {"labels": {MIG_MANAGER_CONFIG_LABEL: config, MIG_MANAGER_STATE_LABEL: "pending"}}},
        )
        return {"migConfig": config, "cordoned": cordoned}

    def _uncordon(self, node: Mapping[str, Any]) -> None:
        """Uncordon a node this controller cordoned (its annotation says so), and only such a node."""
        meta = node["metadata"]
        if ANNOTATION_CORDONED not in (meta.get("annotations") or {}):
            return
        self.core.patch_node(
            meta["name"],
            {"spec": {"unschedulable": False}, "metadata": {"annotations": {ANNOTATION_CORDONED: None}}},
        )
