"""The data-locality hints and candidate limit of a pool's new pods: the API reads around the pure
`neuronetes.locality` (docs/locality.md).

Read when a reconcile creates pods, never otherwise: the named Services / StatefulSets of
``dataLocality.vectorStoreAffinity`` (get), the pods their selectors match and the pods of each
``antiAffinity`` label set (list, in the pool's namespace), and the nodes' zones from the
operator's node cache. A store that does not exist (yet) or cannot be read adds nothing: the
pods are then scored as without it, and the next pods created see it once it is there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec
from kubernetes import client
from kubernetes.client.rest import ApiException

from neuronetes import contracts as c
from neuronetes.api.models import AgentPoolSpec
from neuronetes.locality import (
    LocalityError,
    LocalityHints,
    anti_affinity_selectors,
    locality_annotations,
    locality_hints,
    parse_store_ref,
    selector_of,
)

from .policy import scheduling_request
from .reconcile import LIST_PAGE

__all__ = ["scheduling_annotations"]

log = logging.getLogger("neuronetes_operator")


def _pods(core: client.CoreV1Api, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods of `namespace` that `selector` matches, each as far as `locality_hints` reads it."""
    out: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        found = core.list_namespaced_pod(
            namespace, label_selector=selector, limit=LIST_PAGE, _continue=token, _preload_content=False
        )
        page = msgspec.json.decode(found.data)
        for item in page.get("items") or []:
            out.append(
                {
                    "metadata": {"deletionTimestamp": (item.get("metadata") or {}).get("deletionTimestamp")},
                    "spec": {"nodeName": (item.get("spec") or {}).get("nodeName")},
                    "status": {"phase": (item.get("status") or {}).get("phase")},
                }
            )
        token = (page.get("metadata") or {}).get("continue") or None
        if token is None:
            return out


def _store(core: client.CoreV1Api, apps: client.AppsV1Api, namespace: str, entry: str) -> str | None:
    """The pod selector of one ``vectorStoreAffinity`` entry (None: no such store, no selector)."""
    try:
        ref = parse_store_ref(entry)
    except LocalityError as exc:  # the CRD's pattern refuses these: an object from before it
        log.warning("dataLocality.vectorStoreAffinity in %s: %s", namespace, exc)
        return None
    try:
        if ref.kind == "service":
            found = core.read_namespaced_service(ref.name, namespace, _preload_content=False)
        else:
            found = apps.read_namespaced_stateful_set(ref.name, namespace, _preload_content=False)
    except ApiException as exc:
        if exc.status not in (403, 404):
            raise
        log.info("dataLocality: %s/%s in %s not read (%s)", ref.kind, ref.name, namespace, exc.status)
        return None
    return selector_of(ref, msgspec.json.decode(found.data))


def scheduling_annotations(
    core: client.CoreV1Api,
    apps: client.AppsV1Api,
    namespace: str,
    spec: AgentPoolSpec,
    nodes: Mapping[str, Mapping[str, Any]],
) -> dict[str, str]:
    """The annotations (`neuronetes.locality.locality_annotations`) the pods a pool creates now
    carry: its stores' nodes and zones, the nodes it avoids, its weight level and candidate limit.

    `nodes`: the operator's node cache (name → node view with labels), for the zones."""
    weight, limit = scheduling_request(spec)
    block = spec.scheduling.data_locality if spec.scheduling else None
    if block is None:
        return locality_annotations(None, None, limit)
    store_pods: list[dict[str, Any]] = []
    for entry in block.vector_store_affinity or []:
        selector = _store(core, apps, namespace, entry)
        if selector is not None:
            store_pods.extend(_pods(core, namespace, selector))
    avoided: list[dict[str, Any]] = []
    for entry in block.anti_affinity or []:
        try:
            selectors = anti_affinity_selectors(entry)
        except LocalityError as exc:  # the CRD's pattern refuses these: an object from before it
            log.warning("dataLocality.antiAffinity in %s: %s", namespace, exc)
            continue
        for selector in selectors:
            avoided.extend(_pods(core, namespace, selector))
    zones = {
        name: str((node.get("metadata") or {}).get("labels", {}).get(c.LABEL_ZONE) or "")
        for name, node in nodes.items()
    }
    hints: LocalityHints = locality_hints(store_pods, avoided, zones)
    return locality_annotations(hints, weight, limit)
