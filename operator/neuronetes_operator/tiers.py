"""Priority tiers: the PriorityClasses a cluster admin defines, and which namespaces may use each.

A tenant's AgentPool never mints a PriorityClass. The admin declares named tiers (the chart's
``priorityTiers``; `load_tiers` reads the same list from a file): each has a PriorityClass value, a
preemption policy and the namespaces that may use it (a list of names and/or a label selector).
The chart creates their PriorityClasses (`priority_classes`): ``neuronetes-<tier>`` and, for a tier
that may preempt, ``neuronetes-<tier>-nopreempt`` too (same value, never preempts: a pool of that
tier with preemption off). `pool_priority` is how an AgentPool picks one (docs/agentpool.md
"Priority tiers"):

- ``spec.scheduling.priorityTier: <name>`` names the tier;
- else a numeric ``spec.scheduling.priority`` above 0 (or ``preemption.enabled``) maps to the
  **highest tier whose value is at or below it**, whatever the namespace may use — so a spec means
  the same in every namespace and never gets more than it asks for — and is refused at admission
  when its namespace may not use that tier (`tier_admission`);
- else (priority 0, no tier, no preemption) the pods get no PriorityClass, as before tiers.

Pure, but for `load_tiers` (a file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
import msgspec.yaml

from neuronetes.api.models import PolicyState, Scheduling

from .policy import ResolvedPool

__all__ = [
    "CLASS_PREFIX",
    "DEFAULT_TIERS",
    "NOPREEMPT_SUFFIX",
    "NamespaceSelector",
    "PoolPriority",
    "PriorityTier",
    "TierError",
    "class_name",
    "load_tiers",
    "may_use",
    "pool_priority",
    "priority_classes",
    "selector_matches",
    "tier_listing",
    "tier_of_class",
    "validate_tiers",
    "with_tier",
]

CLASS_PREFIX: Final = "neuronetes-"
"""Every tier's PriorityClass is ``neuronetes-<tier>``; pods naming another ``neuronetes-*`` class
(e.g. one an operator before tiers created) are refused by the webhook."""
NOPREEMPT_SUFFIX: Final = "-nopreempt"
MAX_VALUE: Final = 1_000_000_000
"""The highest value the API server allows a PriorityClass that is not a system one."""


class TierError(ValueError):
    """An AgentPool's priority that no tier satisfies; the message starts with the field."""


class LabelRequirement(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True):
    key: Annotated[str, msgspec.Meta(min_length=1, max_length=317)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()


class NamespaceSelector(
    msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True
):
    """A Kubernetes label selector over namespaces' labels; an empty one matches every namespace."""

    match_labels: dict[str, str] = msgspec.field(default_factory=dict)
    match_expressions: tuple[LabelRequirement, ...] = ()


class PriorityTier(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True, frozen=True):
    """One tier: its PriorityClass value, preemption policy, and who may use it.

    Attributes:
        name: the tier (``spec.scheduling.priorityTier``); its PriorityClass is ``neuronetes-<name>``.
        value: the PriorityClass value (pods' ``spec.priority``), at most 1000000000.
        preemption_policy: ``PreemptLowerPriority`` lets the tier's pods preempt lower ones (pools
            with ``preemption.enabled``); ``Never`` does not.
        namespaces: namespaces that may use the tier, by name.
        namespace_selector: namespaces that may use it, by label (``{}``: every namespace; unset:
            none besides `namespaces`). Only as strong as who may label namespaces.
        description: shown in the PriorityClass.
    """

    name: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")]
    value: Annotated[int, msgspec.Meta(ge=-(2**31), le=MAX_VALUE)]
    preemption_policy: Literal["Never", "PreemptLowerPriority"] = "Never"
    namespaces: tuple[str, ...] = ()
    namespace_selector: NamespaceSelector | None = None
    description: str = ""


DEFAULT_TIERS: Final = (
    PriorityTier(
        name="default",
        value=0,
        namespace_selector=NamespaceSelector(),
        description="NeuroNetes priority tier default: every namespace; never preempts.",
    ),
    PriorityTier(
        name="high",
        value=1000,
        preemption_policy="PreemptLowerPriority",
        description="NeuroNetes priority tier high: namespaces the cluster admin grants it.",
    ),
    PriorityTier(
        name="critical",
        value=1_000_000,
        preemption_policy="PreemptLowerPriority",
        description="NeuroNetes priority tier critical: namespaces the cluster admin grants it.",
    ),
)
"""The chart's default ``priorityTiers`` (tests/unit check they are the same)."""


def validate_tiers(tiers: Sequence[PriorityTier]) -> tuple[PriorityTier, ...]:
    """`tiers`, checked: names and values unique (a numeric priority must map to one tier).

    Raises:
        ValueError: two tiers share a name or a value.
    """
    for what in ("name", "value"):
        seen = [getattr(t, what) for t in tiers]
        dupes = sorted({str(v) for v in seen if seen.count(v) > 1})
        if dupes:
            raise ValueError(f"priority tiers: the {what} {', '.join(dupes)} is used by more than one tier")
    return tuple(tiers)


def load_tiers(path: str | Path | None) -> tuple[PriorityTier, ...]:
    """The tiers of a YAML or JSON list in `path` (None: `DEFAULT_TIERS`).

    Raises:
        OSError: unreadable. msgspec.ValidationError / msgspec.DecodeError / ValueError: bad content.
    """
    if path is None:
        return DEFAULT_TIERS
    return validate_tiers(msgspec.yaml.decode(Path(path).read_bytes(), type=list[PriorityTier]))


def class_name(tier: PriorityTier, preempts: bool) -> str:
    """The PriorityClass of `tier` for pods that preempt (or, when the tier may, do not)."""
    base = f"{CLASS_PREFIX}{tier.name}"
    if tier.preemption_policy == "PreemptLowerPriority" and not preempts:
        return base + NOPREEMPT_SUFFIX
    return base


def priority_classes(tiers: Sequence[PriorityTier]) -> list[dict[str, Any]]:
    """The PriorityClass objects of `tiers`, as the chart renders them."""
    out = []
    for tier in tiers:
        variants = [(True, tier.preemption_policy)]
        if tier.preemption_policy == "PreemptLowerPriority":
            variants.append((False, "Never"))
        for preempts, policy in variants:
            out.append(
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {
                        "name": class_name(tier, preempts),
                        "labels": {"neuronetes.io/priority-tier": tier.name},
                    },
                    "value": tier.value,
                    "preemptionPolicy": policy,
                    "globalDefault": False,
                    "description": tier.description or f"NeuroNetes priority tier {tier.name}.",
                }
            )
    return out


def tier_of_class(name: str, tiers: Sequence[PriorityTier]) -> PriorityTier | None:
    """The tier whose PriorityClass (either variant) is `name`."""
    for tier in tiers:
        if name in (class_name(tier, True), class_name(tier, False)):
            return tier
    return None


def tier_listing(tiers: Sequence[PriorityTier]) -> str:
    """``default (0), high (1000)``: tiers by value, for messages."""
    return ", ".join(f"{t.name} ({t.value})" for t in sorted(tiers, key=lambda t: t.value)) or "none"


def _requirement_matches(req: LabelRequirement, labels: Mapping[str, str]) -> bool:
    if req.operator == "Exists":
        return req.key in labels
    if req.operator == "DoesNotExist":
        return req.key not in labels
    if req.operator == "In":
        return req.key in labels and labels[req.key] in req.values
    return req.key not in labels or labels[req.key] not in req.values  # NotIn


def selector_matches(selector: NamespaceSelector, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics: every label and every expression must hold."""
    return all(labels.get(k) == v for k, v in selector.match_labels.items()) and all(
        _requirement_matches(r, labels) for r in selector.match_expressions
    )


def may_use(tier: PriorityTier, namespace: str, labels: Mapping[str, str] | None) -> bool | None:
    """Whether `namespace` (with `labels`) may use `tier`; None when that depends on the labels
    and they are not known (the caller reads the Namespace and asks again)."""
    if namespace in tier.namespaces:
        return True
    selector = tier.namespace_selector
    if selector is None:
        return False
    if not selector.match_labels and not selector.match_expressions:
        return True
    if labels is None:
        return None
    return selector_matches(selector, labels)


@dataclass(frozen=True, slots=True)
class PoolPriority:
    """The tier an AgentPool's ``spec.scheduling`` picks, and its pods' PriorityClass.

    `preemption_denied`: the pool asks for preemption on a tier that never preempts (the webhook
    refuses it; a pool stored before tiers gets the tier's class and the status says so).
    """

    tier: PriorityTier
    field: str
    requested: str
    """The field's value as written (``5000``, ``high``)."""
    class_name: str
    preempts: bool
    preemption_denied: bool

    def describe(self) -> str:
        """What the pool gets, for its status."""
        how = "may preempt lower priorities" if self.preempts else "never preempts"
        text = (
            f"{self.field.removeprefix('spec.')} {self.requested}: tier {self.tier.name}, PriorityClass "
            f"{self.class_name} (value {self.tier.value}; {how})"
        )
        if self.preemption_denied:
            text += f"; preemption.enabled is not honoured: tier {self.tier.name} never preempts"
        return text


def pool_priority(scheduling: Scheduling | None, tiers: Sequence[PriorityTier]) -> PoolPriority | None:
    """The tier `scheduling` picks among `tiers` (None: no PriorityClass; module docstring).

    Raises:
        TierError: an unknown tier, or a priority below every tier; the message names the field.
    """
    if scheduling is None:
        return None
    preempt = bool(scheduling.preemption and scheduling.preemption.enabled)
    if scheduling.priority_tier is not None:
        field, requested = "spec.scheduling.priorityTier", scheduling.priority_tier
        tier = next((t for t in tiers if t.name == scheduling.priority_tier), None)
        if tier is None:
            raise TierError(
                f"{field}: {scheduling.priority_tier!r} is not a priority tier of this cluster; its tiers "
                f"are {tier_listing(tiers)}"
            )
    elif scheduling.priority > 0 or preempt:
        field, requested = "spec.scheduling.priority", str(scheduling.priority)
        below = [t for t in tiers if t.value <= scheduling.priority]
        if not below:
            raise TierError(
                f"{field}: {scheduling.priority} is below every priority tier of this cluster "
                f"({tier_listing(tiers)}); set spec.scheduling.priorityTier instead"
            )
        tier = max(below, key=lambda t: t.value)
    else:
        return None
    may_preempt = tier.preemption_policy == "PreemptLowerPriority"
    return PoolPriority(
        tier=tier,
        field=field,
        requested=requested,
        class_name=class_name(tier, preempt and may_preempt),
        preempts=preempt and may_preempt,
        preemption_denied=preempt and not may_preempt,
    )


def with_tier(
    resolved: ResolvedPool, scheduling: Scheduling | None, tiers: Sequence[PriorityTier]
) -> ResolvedPool:
    """`resolved` with the pods' PriorityClass of the tier `scheduling` picks, and a ``priority``
    entry in its policies saying which (none: unchanged).

    Raises:
        TierError: as `pool_priority`.
    """
    chosen = pool_priority(scheduling, tiers)
    if chosen is None:
        return resolved
    state = PolicyState(name="priority", enabled=True, effect=chosen.describe())
    return replace(resolved, priority_class=chosen.class_name, policies=(*resolved.policies, state))
