"""Whether a pod may run on a node by the node's labels and taints, as kube-scheduler's
NodeAffinity and TaintToleration plugins read them: ``spec.nodeSelector`` and the required node
affinity (`pod_admits_node`), the node's NoSchedule / NoExecute taints against the pod's tolerations
(`tolerates`), both (`pod_fits_node`, on a Node object as JSON). Pure.

The extender's bind-time filter (`neuronetes_extender.nodefit`, on its decoded objects) shares the
rule of one requirement, `requirement_holds`, and of tolerations, `tolerates`; the operator's cost
projection (`neuronetes_operator.budget`) and the MIG demand (`neuronetes.migdemand`) read pod specs
as JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

__all__ = ["BLOCKING_TAINT_EFFECTS", "pod_admits_node", "pod_fits_node", "requirement_holds", "tolerates"]

BLOCKING_TAINT_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects that keep a pod without a matching toleration off a node (PreferNoSchedule only
lowers the node's score)."""


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


def tolerates(tolerations: Iterable[Mapping[str, Any]], key: str, value: str, effect: str) -> bool:
    """Whether one of the tolerations (``key``, ``operator`` Exists or Equal — the default —,
    ``value``, ``effect``; empty key or effect: any) tolerates the taint ``key=value:effect``."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != effect:
            continue
        if t.get("key") and t.get("key") != key:
            continue
        operator = t.get("operator") or "Equal"
        if operator == "Exists" or (operator == "Equal" and (t.get("value") or "") == value):
            return True
    return False


def pod_fits_node(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the pod spec (JSON) may run on the Node object (JSON): its nodeSelector and required
    node affinity admit the node's labels and name, and it tolerates every NoSchedule / NoExecute
    taint of the node. Resources and cordoning are not looked at."""
    meta = node.get("metadata") or {}
    if not pod_admits_node(pod_spec, meta.get("labels") or {}, str(meta.get("name") or "")):
        return False
    tolerations = pod_spec.get("tolerations") or []
    return all(
        tolerates(tolerations, str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in BLOCKING_TAINT_EFFECTS
    )
