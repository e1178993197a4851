"""GPUSlice reconcile: finalizer, bind a Pending slice to a GPU, release a deleted one when unused.

A MIG slice (``spec.migProfile``) is bound to an idle reported MIG instance of its profile
(`mig_slices.choose_mig_instance`), else stays Pending with reason ``NoMigInstance`` until the MIG
layout controller's relayout lands (a GPUNode change queues it again).

Slices are reconciled one at a time (one lock), reading every Bound slice and bound pod before
choosing, so concurrent slices never oversubscribe a GPU. Before binding, the slice's namespace
quota is checked again (`quota`, counting Bound slices and pods outside a slice; a MIG slice as one
instance of its profile): two slices the webhook admitted at the same instant cannot both bind past
a ResourceQuota; the one that does not fit stays Pending with condition ``Bound=False``, reason
``QuotaExceeded``. The choice is `slices.choose_gpu`; the node inventory is the core's reading of
Node objects (`neuronetes.nodes`, which the extender reads them with too), refined by the agents'
GPUNode objects, so both see the same GPUs and UUIDs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
from kubernetes import client
from kubernetes.client.rest import ApiException

from neuronetes import contracts as c
from neuronetes.api.models import GPUNode, GPUSlice, decode
from neuronetes.model import NodeSpec
from neuronetes.nodes import apply_gpunode, node_spec_from_object

from . import CONVERT_LOCK
from .mig_slices import choose_mig_instance, idle_instances_note, mig_held, mig_reserved, reported_instances
from .objects import patch_status
from .quota import excesses, quota_relevant, slice_demand, usage
from .slices import FINALIZER, choose_gpu, gpu_use, pods_using, reserved

__all__ = ["SliceController"]

PLURAL = "gpuslices"


class SliceController:
    """Reconciles GPUSlices (serially)."""

    def __init__(
        self, api: client.ApiClient, event: Callable[[Mapping[str, Any], str, str, str], None]
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.event = event
        self._lock = threading.Lock()

    def reconcile(self, namespace: str, name: str) -> None:
        with self._lock:
            self._reconcile(namespace, name)

    def _get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                c.GROUP, c.VERSION, namespace, PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def _reconcile(self, namespace: str, name: str) -> None:
        obj = self._get(namespace, name)
        if obj is None:
            return
        meta = obj["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        status = obj.get("status") or {}
        if meta.get("deletionTimestamp"):
            self._release(obj, finalizers)
            return
        if FINALIZER not in finalizers:
            patch = {
                "metadata": {
                    "finalizers": [*finalizers, FINALIZER],
                    "resourceVersion": meta["resourceVersion"],
                }
            }
            self.custom.patch_namespaced_custom_object(c.GROUP, c.VERSION, namespace, PLURAL, name, patch)
        bound = status.get("phase") in ("Bound", "Active")
        if bound and ("memoryMiB" in status or "migStart" in status):
            return
        try:
            with CONVERT_LOCK:
                sl = decode(obj, GPUSlice)
        except msgspec.ValidationError as exc:
            if not bound:
                self._status(obj, {"phase": "Failed"}, "Bound", False, "InvalidSpec", str(exc))
            return
        if bound:  # bound by an operator that did not record the reservation: record it now
            patch_status(self.custom, PLURAL, meta, {"status": reserved(sl.spec)})
            return
        over = self._over_quota(obj)  # a MIG slice's instance counts too (docs/gpuslice.md "Quota")
        if over:
            previous = {cd.get("type"): cd for cd in status.get("conditions") or []}.get("Bound") or {}
            self._status(obj, {"phase": "Pending"}, "Bound", False, "QuotaExceeded", over)
            if previous.get("reason") != "QuotaExceeded":
                self.event(obj, "Warning", "QuotaExceeded", over)
            return
        if sl.spec.mig_profile is not None:
            self._bind_mig(obj, sl)
            return
        slices, pods, nodes, _ = self._inventory()
        choice = choose_gpu(sl.spec, nodes, gpu_use(slices, pods))
        if choice is None:
            self._status(
                obj,
                {"phase": "Pending"},
                "Bound",
                False,
                "NoCapacity",
                "no GPU has the slice's memory and share free",
            )
            return
        self._status(
            obj,
            {"phase": "Bound", "node": choice.node, "gpuUUIDs": [choice.uuid], **reserved(sl.spec)},
            "Bound",
            True,
            "Reserved",
            f"reserved on {choice.node} GPU {choice.index} ({choice.uuid})",
        )
        self.event(obj, "Normal", "Bound", f"reserved on node {choice.node}, GPU {choice.index}")

    def _bind_mig(self, obj: Mapping[str, Any], sl: GPUSlice) -> None:
        """Bind a MIG slice to an idle reported instance of its profile, or say why it waits."""
        slices, pods, nodes, gpunodes = self._inventory()
        others = [s for s in slices if s.metadata.get("uid") != sl.metadata.get("uid")]
        held = mig_held(others, pods, gpunodes.values())
        inst = choose_mig_instance(sl.spec, reported_instances(nodes, gpunodes), held)
        if inst is None:
            self._status(
                obj, {"phase": "Pending"}, "Bound", False, "NoMigInstance", idle_instances_note(sl.spec)
            )
            return
        model = next(
            (g.model for n in nodes if n.name == inst.node for g in n.gpus if g.uuid == inst.gpu_uuid), ""
        )
        where = f"MIG instance {inst.profile} at slot {inst.start} of {inst.node} GPU {inst.gpu_index}"
        self._status(
            obj,
            {"phase": "Bound", **mig_reserved(sl.spec, inst, model)},
            "Bound",
            True,
            "Reserved",
            f"{where} ({inst.uuid or inst.gpu_uuid})",
        )
        self.event(obj, "Normal", "Bound", f"bound to {where}")

    def _over_quota(self, obj: Mapping[str, Any]) -> str:
        """Why binding `obj` would exceed a ResourceQuota of its namespace (empty: it would not)."""
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        listed = self.core.list_namespaced_resource_quota(namespace).items
        quotas = quota_relevant(self.api.sanitize_for_serialization(listed))
        if not quotas:
            return ""
        slices = self.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, namespace, PLURAL)["items"]
        pods = self.api.sanitize_for_serialization(self.core.list_namespaced_pod(namespace).items)
        others = [s for s in slices if s["metadata"]["name"] != name]
        used = usage([*others, obj], pods, bound_only=True)
        found = excesses(quotas, used, slice_demand(obj))
        if not found:
            return ""
        why = "; ".join(e.describe() for e in found)
        return f"binding the slice: {why}; it stays Pending until the namespace has room"

    def _inventory(
        self,
    ) -> tuple[list[GPUSlice], list[dict[str, Any]], list[NodeSpec], dict[str, GPUNode]]:
        raw_slices = self.custom.list_cluster_custom_object(c.GROUP, c.VERSION, PLURAL)["items"]
        pods = self.api.sanitize_for_serialization(
            self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items
        )
        nodes_raw = self.api.sanitize_for_serialization(self.core.list_node().items)
        try:
            gpunodes_raw = self.custom.list_cluster_custom_object(c.GROUP, c.VERSION, "gpunodes")["items"]
        except ApiException:
            gpunodes_raw = []
        with CONVERT_LOCK:
            slices = []
            for item in raw_slices:
                try:
                    slices.append(decode(item, GPUSlice))
                except msgspec.ValidationError:
                    continue
            gpunodes: dict[str, GPUNode] = {}
            for item in gpunodes_raw:
                try:
                    gn = decode(item, GPUNode)
                except msgspec.ValidationError:
                    continue
                gpunodes[str(gn.metadata.get("name"))] = gn
            nodes = []
            for item in nodes_raw:
                try:
                    spec = node_spec_from_object(item)
                except ValueError:
                    continue
                nodes.append(apply_gpunode(spec, gpunodes[spec.name]) if spec.name in gpunodes else spec)
        return slices, pods, nodes, gpunodes

    def _release(self, obj: Mapping[str, Any], finalizers: list[str]) -> None:
        meta = obj["metadata"]
        if FINALIZER not in finalizers:
            return
        found = self.core.list_namespaced_pod(meta["namespace"])
        users = pods_using(meta["name"], self.api.sanitize_for_serialization(found.items))
        if users:
            message = (
                f"deletion deferred: pods {', '.join(users[:5])} use the slice; it is released when they end"
            )
            self._status(obj, {}, "InUse", True, "PodsUseSlice", message)
            self.event(obj, "Warning", "DeletionDeferred", message)
            return
        self._status(obj, {"phase": "Released"}, "InUse", False, "Released", "no pod uses the slice")
        remaining = [f for f in finalizers if f != FINALIZER]
        patch = {"metadata": {"finalizers": remaining, "resourceVersion": meta["resourceVersion"]}}
        try:
            self.custom.patch_namespaced_custom_object(
                c.GROUP, c.VERSION, meta["namespace"], PLURAL, meta["name"], patch
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _status(
        self, obj: Mapping[str, Any], fields: dict[str, Any], kind: str, ok: bool, reason: str, message: str
    ) -> None:
        meta = obj["metadata"]
        state = "True" if ok else "False"
        previous = {cd.get("type"): cd for cd in (obj.get("status") or {}).get("conditions") or []}
        since = (
            previous.get(kind, {}).get("lastTransitionTime")
            if previous.get(kind, {}).get("status") == state
            else None
        )
        condition = {
            "type": kind,
            "status": state,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since or datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        }
        conditions = [cd for t, cd in previous.items() if t != kind] + [condition]
        body = {"status": {**fields, "observedGeneration": meta.get("generation"), "conditions": conditions}}
        patch_status(self.custom, PLURAL, meta, body)
