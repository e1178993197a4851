"""Admission of priorities: an AgentPool, or a pod, uses only the tiers its namespace may use.

- An AgentPool (``objects.neuronetes.io``, CREATE and UPDATE) whose ``spec.scheduling`` picks a
  tier (`tiers.pool_priority`) its namespace may not use is refused, the message naming the field
  that picked it (``spec.scheduling.priorityTier`` or ``spec.scheduling.priority``); so is an unknown
  tier, a priority below every tier, and ``preemption.enabled`` on a tier that never preempts.
- A pod (``pods.neuronetes.io``, CREATE) naming a ``neuronetes-*`` PriorityClass is refused unless
  the class is a tier's its namespace may use: a tenant cannot take a tier directly, and a class
  an operator created before tiers (``neuronetes-p<N>``) serves nobody. The operator's own pool
  pods pass the same check, so a grant the admin withdraws stops new pods of that tier.

Whether a namespace may use a tier can depend on its labels (a tier's ``namespaceSelector``): the
webhook then reads the Namespace (``get`` on namespaces); when it cannot, it refuses (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from neuronetes.api.models import AgentPool, decode

from . import CONVERT_LOCK
from .apiread import api_reader, namespace_path
from .tiers import CLASS_PREFIX, PriorityTier, TierError, may_use, pool_priority, tier_listing, tier_of_class

__all__ = [
    "NamespaceReadError",
    "NamespaceReader",
    "api_namespace_reader",
    "review_pod_priority",
    "review_pool_priority",
]


class NamespaceReadError(Exception):
    """The Namespace could not be read (the API server is unreachable, or access is denied)."""


NamespaceReader = Callable[[str, str], Mapping[str, Any] | None]
"""("", name) → the Namespace object, None when there is none; raises `NamespaceReadError`."""


def _allowed(tier: PriorityTier, namespace: str, read: NamespaceReader | None) -> tuple[bool, str]:
    """(may `namespace` use `tier`, why not when the Namespace could not be read)."""
    verdict = may_use(tier, namespace, None)
    if verdict is not None:
        return verdict, ""
    if read is None:
        return False, "this webhook cannot read Namespaces (no API credentials)"
    try:
        obj = read("", namespace)
    except NamespaceReadError as exc:
        return False, f"namespace {namespace} could not be read ({exc}); retry"
    labels = dict(((obj or {}).get("metadata") or {}).get("labels") or {})
    return bool(may_use(tier, namespace, labels)), ""


def _usable(tiers: Sequence[PriorityTier], namespace: str, read: NamespaceReader | None) -> str:
    return tier_listing([t for t in tiers if _allowed(t, namespace, read)[0]])


def _refusal(
    where: str, lead: str, tier: PriorityTier, namespace: str, tiers: Sequence[PriorityTier],
    read: NamespaceReader | None, why: str,
) -> str:  # fmt: skip
    if why:
        return (
            f"{where}: {lead} priority tier {tier.name}, and whether namespace {namespace} may use it "
            f"cannot be checked: {why}"
        )
    return (
        f"{where}: {lead} priority tier {tier.name} (value {tier.value}), which namespace {namespace} "
        f"may not use; it may use {_usable(tiers, namespace, read)}. Choose one of those, or ask the "
        "cluster admin to grant the tier (chart value priorityTiers)"
    )


def review_pool_priority(
    pool: Mapping[str, Any], namespace: str, tiers: Sequence[PriorityTier], read: NamespaceReader | None
) -> list[str]:
    """Refusals of an AgentPool's priority (empty: allowed). A pool that does not decode is left to
    `validation.review_object`, which says why."""
    try:
        with CONVERT_LOCK:
            scheduling = decode(pool, AgentPool).spec.scheduling
    except msgspec.ValidationError:
        return []
    try:
        chosen = pool_priority(scheduling, tiers)
    except TierError as exc:
        return [str(exc)]
    if chosen is None:
        return []
    out = []
    if chosen.preemption_denied:
        out.append(
            f"spec.scheduling.preemption.enabled: priority tier {chosen.tier.name} never preempts "
            f"(preemptionPolicy Never); turn preemption off or use a tier that may preempt"
        )
    ok, why = _allowed(chosen.tier, namespace, read)
    if not ok:
        if chosen.field == "spec.scheduling.priority":
            lead = f"{chosen.requested} maps to"  # the highest tier at or below it
        else:
            lead = "the pool asks for"
        out.append(_refusal(chosen.field, lead, chosen.tier, namespace, tiers, read, why))
    return out


def review_pod_priority(
    pod: Mapping[str, Any], namespace: str, tiers: Sequence[PriorityTier], read: NamespaceReader | None
) -> list[str]:
    """Refusals of a pod's ``neuronetes-*`` PriorityClass (empty: allowed, or another class)."""
    name = (pod.get("spec") or {}).get("priorityClassName")
    if not isinstance(name, str) or not name.startswith(CLASS_PREFIX):
        return []
    tier = tier_of_class(name, tiers)
    if tier is None:
        classes = ", ".join(f"{CLASS_PREFIX}{t.name}" for t in tiers)
        return [
            f"spec.priorityClassName: {name} is no priority tier's PriorityClass (NeuroNetes tiers: "
            f"{classes or 'none'}); name a tier's class or another PriorityClass"
        ]
    ok, why = _allowed(tier, namespace, read)
    if ok:
        return []
    lead = f"{name} is the PriorityClass of"
    return [_refusal("spec.priorityClassName", lead, tier, namespace, tiers, read, why)]


def api_namespace_reader(timeout_s: float = 2.0) -> NamespaceReader | None:
    """A `NamespaceReader` over the API server (None: no credentials; a tier granted by label is
    then refused)."""
    return api_reader(namespace_path, NamespaceReadError, timeout_s)
