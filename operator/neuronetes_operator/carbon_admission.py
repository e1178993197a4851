"""Admission of a pool's pod under carbon-aware time shifting: the ``neuronetes.io/carbon`` gate.

A pod labelled ``neuronetes.io/pool=<pool>`` (the operator's pods, and pods a user creates with the
label) whose pool has ``carbonAware.enabled`` and ``timeShifting.enabled`` gets the scheduling gate
``neuronetes.io/carbon`` at creation — the only time a gate may be added — unless it is one of the
pool's first ``minReplicas`` pods by name (``<pool>-<i>``, ``<pool>-<g>-<m>``): the pool's floor
serves now, the pods above it wait for clean energy. The operator's gate-release controller
(`carbon_gate`) removes the gate. The webhook reads the pool with its own credentials; when it
cannot, the pod is admitted without the gate (fail open: time shifting defers work, it never
blocks it), and the reason is logged. docs/carbon.md, "The gate".
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from neuronetes.carbon.release import GATE

from .apiread import agentpool_path, api_reader
from .pods import LABEL_POOL

__all__ = ["PoolReadError", "PoolReader", "api_pool_reader", "carbon_gate_patch", "in_floor", "time_shifting"]

log = logging.getLogger("neuronetes.webhook")


class PoolReadError(Exception):
    """The AgentPool could not be read (the API server is unreachable, or access is denied)."""


PoolReader = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) → the AgentPool object, None when there is none; raises `PoolReadError`."""


def api_pool_reader(timeout_s: float = 2.0) -> PoolReader | None:
    """A `PoolReader` over the API server (None: no credentials; then no pod is gated)."""
    return api_reader(agentpool_path, PoolReadError, timeout_s)


def time_shifting(pool: Mapping[str, Any]) -> bool:
    """Whether the pool's pods are time-shifted: ``carbonAware.enabled`` and ``timeShifting.enabled``."""
    carbon = ((pool.get("spec") or {}).get("scheduling") or {}).get("carbonAware") or {}
    shifting = carbon.get("timeShifting") or {}
    return bool(carbon.get("enabled")) and bool(shifting.get("enabled"))


def in_floor(pod_name: str, pool: Mapping[str, Any]) -> bool:
    """Whether `pod_name` is one of the pool's first ``minReplicas`` pods by the operator's names."""
    spec = pool.get("spec") or {}
    name = str((pool.get("metadata") or {}).get("name") or "")
    floor = int(spec.get("minReplicas", 1) or 0)
    gang = (spec.get("scheduling") or {}).get("gangScheduling") or {}
    match = re.fullmatch(re.escape(name) + r"-([0-9]+)(?:-([0-9]+))?", pod_name)
    if match is None:
        return False
    if match.group(2) is None:  # <pool>-<i>
        return not gang.get("enabled") and int(match.group(1)) < floor
    size = int(gang.get("minMembers") or floor or 1)
    return bool(gang.get("enabled")) and int(match.group(1)) * size < floor


def carbon_gate_patch(
    pod: Mapping[str, Any], namespace: str, read: PoolReader | None
) -> list[dict[str, Any]]:
    """The JSON patch adding the gate to a pod being created (empty: no gate for this pod)."""
    meta = pod.get("metadata") or {}
    pool_name = (meta.get("labels") or {}).get(LABEL_POOL)
    if not pool_name or read is None:
        return []
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    if any(isinstance(g, Mapping) and g.get("name") == GATE for g in gates):
        return []  # reinvoked: already there
    try:
        pool = read(namespace, str(pool_name))
    except PoolReadError as exc:
        log.warning(
            "pool %s/%s not read, pod admitted without the carbon gate: %s", namespace, pool_name, exc
        )
        return []
    if pool is None or not time_shifting(pool) or in_floor(str(meta.get("name") or ""), pool):
        return []
    if gates:
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
