"""What the cluster commands read from the API server: GPUNodes, Nodes, pods and their Events.

One client per command; every failure becomes a `CliError` with one line (unreachable server,
refused credentials, object not found), never a client traceback.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import quote

from neuronetes import contracts as c
from neuronetes.contracts import ANNOTATION_OFFLINE_GPUS

from .output import CliError

__all__ = ["GPUNODES_PATH", "Cluster", "offline_gpus"]

GPUNODES_PATH: Final = f"/apis/{c.GROUP}/{c.VERSION}/gpunodes"
TIMEOUT_S: Final = 15.0


def offline_gpus(gpunode: dict[str, Any]) -> set[str]:
    """The UUIDs `neuronetes offline` holds out of service on this GPUNode (the agent's annotation)."""
    raw = ((gpunode.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_OFFLINE_GPUS, "")
    return {u.strip() for u in str(raw).split(",") if u.strip()}


class Cluster:
    """A read-only view of the cluster through `kubeconfig` (default: in-cluster, else ~/.kube/config)."""

    def __init__(self, kubeconfig: str | None, fallback: str = "") -> None:
        """`fallback`: what else was tried before the cluster (the workstation's line, from the
        target rule), said after a kubeconfig error when no --kubeconfig was given."""
        from neuronetes.kube.client import KubeClient, KubeError, load_api_client

        try:
            api = load_api_client(kubeconfig or None)
        except KubeError as exc:
            tried = f"; {fallback}" if fallback and not kubeconfig else ""
            raise CliError(
                f"kubeconfig {kubeconfig or 'the default kubeconfig'}: {exc.reason}{tried}"
            ) from None
        api.configuration.retries = 1  # an unreachable server answers in seconds, not minutes
        self.client = KubeClient(api, timeout=TIMEOUT_S)
        self.server = self.client.server

    def get(self, path: str, query: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        from neuronetes.kube.client import KubeError

        try:
            data = self.client.get(path, query)
        except KubeError as exc:
            if exc.status == 404:
                raise CliError(f"not found: {path}") from None
            if exc.status:
                raise CliError(f"GET {path}: the API server answered {exc.status} {exc.reason}") from None
            raise CliError(f"cannot reach the API server at {self.server}: {exc.reason}") from None
        return dict(json.loads(data))

    def items(self, path: str, query: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
        return list(self.get(path, query).get("items") or [])

    def gpunodes(self) -> list[dict[str, Any]]:
        return sorted(self.items(GPUNODES_PATH), key=lambda g: str(g["metadata"]["name"]))

    def nodes(self) -> list[dict[str, Any]]:
        return self.items("/api/v1/nodes")

    def pods(self) -> list[dict[str, Any]]:
        return self.items("/api/v1/pods")

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
        try:
            return self.get(path)
        except CliError as exc:
            if str(exc.message).startswith("not found"):
                raise CliError(f"pod {namespace}/{name} not found") from None
            raise

    def events_about(self, kind: str, namespace: str, name: str) -> list[dict[str, Any]]:
        """The core/v1 view of every Event about the object, oldest first (events.k8s.io Events
        appear there too, with their note as the message)."""
        where = f"/api/v1/namespaces/{quote(namespace, safe='')}/events" if namespace else "/api/v1/events"
        selector = f"involvedObject.kind={kind},involvedObject.name={name}"
        events = self.items(where, [("fieldSelector", selector)])
        return sorted(events, key=event_time)

    def gpu(self, ref: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(GPUNode, its status entry) of the GPU `ref` names: its UUID or a unique UUID prefix
        (`match_gpu`, as the workstation takes it less the index); CliError when no GPUNode lists
        it or the prefix is ambiguous."""
        from neuronetes_agent.daemon.devices import GpuRefError, match_gpu

        found = {
            str(gpu.get("uuid")): (node, dict(gpu))
            for node in self.gpunodes()
            for gpu in (node.get("status") or {}).get("gpus") or ()
        }
        try:
            return found[match_gpu(ref, ((None, uuid) for uuid in found), "")]
        except GpuRefError as exc:
            raise CliError(exc.message if exc.ambiguous else f"no GPUNode lists GPU {ref}") from None


def event_time(event: dict[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
