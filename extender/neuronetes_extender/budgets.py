"""PodDisruptionBudgets as the preemption decision reads them: which PDB covers a pod, and how many
disruptions it allows now (docs/preemption.md, "The order").

The decision's first key is kube-scheduler's: the fewest victims their PDBs do not allow to go
(per PDB, the victims it covers beyond ``status.disruptionsAllowed``). The Eviction API enforces
the PDBs whatever the decision says; reading them here lets the decision prefer victims it may
evict, rather than learn it from a refusal. The feed is a list + watch of
``policy/v1 poddisruptionbudgets`` (`feeds.pdb_reflector`); it is optional: until it is listed,
or where the extender may not read PDBs, every victim counts as covered by none, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from neuronetes.engine.preempt import Victim
from neuronetes.nodeselect import requirement_holds

from .pods import PodInfo
from .watch import CustomObject

__all__ = ["Budget", "BudgetBook", "budget_of", "victim_of"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Budget:
    """One PodDisruptionBudget: its selector (in its namespace) and its allowed disruptions."""

    key: str  # namespace/name
    namespace: str
    match_labels: tuple[tuple[str, str], ...]
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...]  # key, operator, values
    allowed: int

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Kubernetes label-selector semantics: every label and every expression holds."""
        return (
            namespace == self.namespace
            and all(labels.get(k) == v for k, v in self.match_labels)
            and all(requirement_holds(op, values, labels.get(k)) for k, op, values in self.match_expressions)
        )


def budget_of(obj: CustomObject) -> Budget | None:
    """The `Budget` of a listed/watched PDB; None when it selects no pod (policy/v1: a null
    selector selects nothing) or its selector is malformed."""
    meta = obj.metadata
    selector: Any = obj.spec.get("selector")
    if not isinstance(selector, dict):
        return None
    try:
        labels = tuple(sorted((str(k), str(v)) for k, v in (selector.get("matchLabels") or {}).items()))
        expressions = tuple(
            (str(e["key"]), str(e["operator"]), tuple(str(v) for v in e.get("values") or ()))
            for e in selector.get("matchExpressions") or ()
        )
    except (AttributeError, KeyError, TypeError):
        log.warning("PodDisruptionBudget %s/%s ignored: its selector is malformed", meta.namespace, meta.name)
        return None
    allowed = (obj.status or {}).get("disruptionsAllowed", 0)
    return Budget(
        f"{meta.namespace}/{meta.name}",
        meta.namespace,
        labels,
        expressions,
        allowed if isinstance(allowed, int) else 0,
    )


class BudgetBook:
    """The PDBs known, by namespace (not thread-safe on its own: the cache's lock guards it)."""

    def __init__(self) -> None:
        self._by_key: dict[str, Budget] = {}
        self._by_namespace: dict[str, list[Budget]] = {}

    def replace(self, budgets: Iterable[Budget]) -> None:
        self._by_key = {b.key: b for b in budgets}
        self._index()

    def put(self, key: str, budget: Budget | None) -> None:
        if budget is None:
            self._by_key.pop(key, None)
        else:
            self._by_key[key] = budget
        self._index()

    def _index(self) -> None:
        self._by_namespace = {}
        for b in sorted(self._by_key.values(), key=lambda b: b.key):
            self._by_namespace.setdefault(b.namespace, []).append(b)

    def covering(self, namespace: str, labels: Mapping[str, str] | None) -> Budget | None:
        """The PDB covering a pod (the first by key where several do: the Eviction API refuses
        such a pod anyway, so which one counts matters little)."""
        for b in self._by_namespace.get(namespace, ()):
            if b.covers(namespace, labels or {}):
                return b
        return None


def victim_of(
    info: PodInfo, budgets: BudgetBook | None, *, allocation: str, gpu_seconds_lost: float = 0.0
) -> Victim:
    """`info` as a candidate victim: its priority, start, gang and the PDB covering it (none when
    the PDBs are not read)."""
    budget = budgets.covering(info.namespace, info.labels) if budgets is not None else None
    return Victim(
        info.id,
        info.priority,
        start_time=info.started,
        allocation=allocation,
        group=f"gang/{info.gang_id}" if info.gang_id else "",
        gpu_seconds_lost=gpu_seconds_lost,
        pdb=budget.key if budget is not None else "",
        pdb_allowed=budget.allowed if budget is not None else 0,
    )
