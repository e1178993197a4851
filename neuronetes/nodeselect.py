"""Whether a pod's node selection admits a node by its labels: ``spec.nodeSelector`` and the
required node affinity, as kube-scheduler's NodeAffinity plugin reads them. Pure.

The extender's bind-time filter (`neuronetes_extender.nodefit`, on its decoded objects) and the
operator's cost projection (`neuronetes_operator.budget`, on pod specs as JSON) share the rule of
one requirement, `requirement_holds`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["pod_admits_node", "requirement_holds"]


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def requirement_holds(operator: str, values: Sequence[str], value: str | None) -> bool:
    """Whether a node whose label (or field) is `value` (None: absent) meets one requirement of a
    node selector term (operators In, NotIn, Exists, DoesNotExist, Gt, Lt)."""
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, bound = _integer(value), _integer(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an unknown operator or a malformed Gt/Lt matches nothing (as Kubernetes)


def _term_admits(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    for req in expressions:
        if not requirement_holds(
            str(req.get("operator")), req.get("values") or [], labels.get(req.get("key", ""))
        ):
            return False
    return all(
        requirement_holds(
            str(req.get("operator")),
            req.get("values") or [],
            name if req.get("key") == "metadata.name" else None,
        )
        for req in fields
    )


def pod_admits_node(pod_spec: Mapping[str, Any], labels: Mapping[str, str], name: str = "") -> bool:
    """Whether the pod spec (JSON) may run on the node `name` with `labels`, by its nodeSelector and
    required node affinity (one of the terms must hold); taints and resources are not looked at."""
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    return any(_term_admits(term, labels, name) for term in terms)
