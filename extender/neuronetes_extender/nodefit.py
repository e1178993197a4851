"""Whether a pod may run on a node by the node's labels and taints (the bind-time filter).

kube-scheduler sends every pod it schedules to the extender's bind, those without NeuroNetes
resources too; the extender never filtered those, so before binding one it checks what
kube-scheduler's NodeAffinity and TaintToleration plugins check: ``spec.nodeSelector``, the
required node affinity (``matchExpressions`` on labels, ``matchFields`` on ``metadata.name``,
operators In, NotIn, Exists, DoesNotExist, Gt, Lt) and the node's NoSchedule / NoExecute taints
against the pod's tolerations. A bind request naming a node the pod may not use is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from neuronetes.nodeselect import BLOCKING_TAINT_EFFECTS, requirement_holds, tolerates

from .wire import Affinity, Node, NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration

__all__ = ["NodeFacts", "node_fit_reason"]


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the bind-time filter reads of a Node object."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]

    @classmethod
    def of(cls, node: Node) -> NodeFacts:
        return cls(node.metadata.name, dict(node.metadata.labels or {}), tuple(node.spec.taints or ()))


def _requirement_holds(req: NodeSelectorRequirement, value: str | None) -> bool:
    return requirement_holds(req.operator, req.values or [], value)


def _term_matches(term: NodeSelectorTerm, facts: NodeFacts) -> bool:
    expressions = term.match_expressions or []
    fields = term.match_fields or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    if not all(_requirement_holds(r, facts.labels.get(r.key)) for r in expressions):
        return False
    return all(_requirement_holds(r, facts.name if r.key == "metadata.name" else None) for r in fields)


def node_fit_reason(
    facts: NodeFacts,
    node_selector: Mapping[str, str] | None,
    affinity: Affinity | None,
    tolerations: Sequence[Toleration],
) -> str | None:
    """Why the pod may not run on the node (None: it may)."""
    for key, value in (node_selector or {}).items():
        if facts.labels.get(key) != value:
            return f"node {facts.name} does not match the pod's nodeSelector ({key}={value})"
    required = None
    if affinity is not None and affinity.node_affinity is not None:
        required = affinity.node_affinity.required_during_scheduling_ignored_during_execution
    if required is not None:
        terms = required.node_selector_terms or []
        if not any(_term_matches(t, facts) for t in terms):
            return f"node {facts.name} does not match the pod's required node affinity"
    tolerating = [msgspec.structs.asdict(t) for t in tolerations]
    for taint in facts.taints:
        if taint.effect in BLOCKING_TAINT_EFFECTS and not tolerates(
            tolerating, taint.key, taint.value, taint.effect
        ):
            taint_text = f"{taint.key}={taint.value}:{taint.effect}"
            return f"node {facts.name} has the taint {taint_text} the pod does not tolerate"
    return None
