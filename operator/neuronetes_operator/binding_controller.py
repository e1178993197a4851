"""One ToolBinding reconcile: its pool looked up, its status and an Event when its phase changes.

The status itself is `toolbindings.binding_status`'s (pure); the lag rule is the autoscaling
controller's. This module only does the API calls around it, with the synchronous Kubernetes
client (the kopf handlers run it in a worker thread).
"""

from __future__ import annotations

import msgspec
from kubernetes import client
from kubernetes.client.rest import ApiException

from neuronetes import contracts as c
from neuronetes.api.models import ToolBinding, decode

from . import CONVERT_LOCK
from .controller import PLURAL
from .objects import patch_status, post_event
from .toolbindings import binding_status

__all__ = ["BindingController"]

_CONVERT = CONVERT_LOCK


class BindingController:
    """Reconciles ToolBindings (one at a time per binding is the caller's job)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def reconcile(self, namespace: str, name: str) -> None:
        """A ToolBinding's status: its pool resolved (`toolbindings.binding_status`)."""
        try:
            obj = self.custom.get_namespaced_custom_object(
                c.GROUP, c.VERSION, namespace, "toolbindings", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        try:
            with _CONVERT:
                spec = decode(obj, ToolBinding).spec
        except msgspec.ValidationError as exc:
            patch_status(self.custom, "toolbindings", obj["metadata"], {"status": {"phase": "Error"}})
            post_event(self.core, obj, "Warning", "InvalidSpec", f"the binding's spec cannot be used: {exc}")
            return
        exists = False
        if spec.pool_ref is not None:
            try:
                self.custom.get_namespaced_custom_object(
                    c.GROUP, c.VERSION, namespace, PLURAL, spec.pool_ref.name
                )
                exists = True
            except ApiException as exc:
                if exc.status != 404:
                    raise
        status = binding_status(spec, exists, int(obj["metadata"].get("generation") or 0))
        if (obj.get("status") or {}).get("phase") != status["phase"]:
            post_event(
                self.core,
                obj,
                "Normal",
                status["conditions"][0]["reason"],
                status["conditions"][0]["message"],
            )
        patch_status(self.custom, "toolbindings", obj["metadata"], {"status": status})
