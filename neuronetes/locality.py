"""Data locality and the candidate limit: an AgentPool's ``dataLocality`` and ``fastScheduling``
turned into the pod annotations the extender scores by. Pure (no API access).

Formats (docs/locality.md):

* A ``vectorStoreAffinity`` entry names a workload in the pool's namespace: ``service/<name>``,
  ``statefulset/<name>``, or a bare ``<name>`` (a Service). Its pods are those its selector
  matches (a Service's ``spec.selector``, a StatefulSet's ``spec.selector``).
* An ``antiAffinity`` entry is a label set, ``key=value[,key=value…]`` (every pair must match;
  keys as Kubernetes label keys, values as label values), or a bare ``<name>``: the pods
  labelled ``app.kubernetes.io/name`` or ``app.kubernetes.io/instance`` ``=<name>``. Read in the
  pool's namespace.

The operator lists those pods and writes, on each pod it creates (`locality_annotations`): the
nodes the stores' pods run on (`ANNOTATION_DATA_NODES`), those nodes' zones
(`ANNOTATION_DATA_ZONES`), the nodes running pods of an anti-affinity set
(`ANNOTATION_AVOID_NODES`), the weight level (`ANNOTATION_DATA_LOCALITY_WEIGHT`) and the candidate
limit (`ANNOTATION_MAX_NODES_TO_SCORE`). The extender reads them back (`request_fields`) into the
`PodRequest` its ``data_locality`` term (`neuronetes.engine.scorers.score_data_locality`) and the
engine's candidate limit use. Scores only: no hard affinity is written.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from neuronetes.contracts import GROUP

__all__ = [
    "ANNOTATION_AVOID_NODES",
    "ANNOTATION_DATA_LOCALITY_WEIGHT",
    "ANNOTATION_DATA_NODES",
    "ANNOTATION_DATA_ZONES",
    "ANNOTATION_MAX_NODES_TO_SCORE",
    "LABEL_SET_PATTERN",
    "LOCALITY_ANNOTATIONS",
    "LOCALITY_WEIGHT_MULTIPLIERS",
    "MAX_NAMED_NODES",
    "NAME_LABELS",
    "STORE_REF_PATTERN",
    "LocalityError",
    "LocalityHints",
    "StoreRef",
    "anti_affinity_selectors",
    "locality_annotations",
    "locality_hints",
    "parse_label_set",
    "parse_store_ref",
    "request_fields",
    "selector_of",
]

ANNOTATION_DATA_NODES: Final = f"{GROUP}/data-nodes"
"""Comma-separated nodes the pod's data (its pool's vector stores) runs on."""
ANNOTATION_DATA_ZONES: Final = f"{GROUP}/data-zones"
"""Comma-separated zones (``topology.kubernetes.io/zone``) of those nodes."""
ANNOTATION_AVOID_NODES: Final = f"{GROUP}/avoid-nodes"
"""Comma-separated nodes running pods of the pool's ``antiAffinity`` label sets."""
ANNOTATION_DATA_LOCALITY_WEIGHT: Final = f"{GROUP}/data-locality-weight"
"""``low`` | ``medium`` | ``high``: the multiplier of the data-locality term's weight."""
ANNOTATION_MAX_NODES_TO_SCORE: Final = f"{GROUP}/max-nodes-to-score"
"""A positive integer: the most feasible nodes the extender scores for the pod."""
LOCALITY_ANNOTATIONS: Final = (
    ANNOTATION_DATA_NODES,
    ANNOTATION_DATA_ZONES,
    ANNOTATION_AVOID_NODES,
    ANNOTATION_DATA_LOCALITY_WEIGHT,
    ANNOTATION_MAX_NODES_TO_SCORE,
)
"""The annotations of this module: requests a pod may carry (the webhook lets tenants set them)."""

LOCALITY_WEIGHT_MULTIPLIERS: Final[Mapping[str, float]] = {"low": 0.5, "medium": 1.0, "high": 2.0}
"""``localityWeight`` → multiplier of the ``data_locality`` term's weight (the extender's
``weights.data_locality``, 0.10 in the default split: low 0.05, medium 0.10, high 0.20)."""
MAX_NAMED_NODES: Final = 100
"""Most nodes one annotation names (the nodes holding most of the workload's pods first)."""
MAX_NODES_TO_SCORE: Final = 100_000

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = rf"({_DNS_LABEL}(\.{_DNS_LABEL})*/)?{_NAME}"
_PAIR = rf"{_KEY}=({_NAME})?"
STORE_REF_PATTERN: Final = r"^((service|statefulset)/)?[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
"""A ``vectorStoreAffinity`` entry (the CRD's pattern)."""
LABEL_SET_PATTERN: Final = rf"^({_PAIR}(,{_PAIR})*|{_NAME})$"
"""An ``antiAffinity`` entry (the CRD's pattern): a label set or a bare workload name."""
NAME_LABELS: Final = ("app.kubernetes.io/name", "app.kubernetes.io/instance")
"""A bare ``antiAffinity`` name means the pods with either of these labels set to it."""
_STORE_REF = re.compile(STORE_REF_PATTERN)
_PAIR_RE = re.compile(rf"^{_PAIR}$")
_BARE_NAME = re.compile(rf"^{_NAME}$")
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ZONE = re.compile(rf"^({_NAME})$")


class LocalityError(ValueError):
    """An entry or annotation that cannot be read; the message names it and says what is expected."""


@dataclass(frozen=True, slots=True)
class StoreRef:
    """A workload a pool runs near: ``kind`` ``service`` or ``statefulset``, and its name."""

    kind: str
    name: str


def parse_store_ref(text: str) -> StoreRef:
    """A ``vectorStoreAffinity`` entry: ``service/<name>``, ``statefulset/<name>`` or ``<name>``
    (a Service)."""
    if not _STORE_REF.fullmatch(text):
        raise LocalityError(
            f"{text!r} is not service/<name>, statefulset/<name> or <name> (a Service) with a "
            "lower-case DNS name"
        )
    kind, _, name = text.rpartition("/")
    return StoreRef(kind or "service", name)


def anti_affinity_selectors(text: str) -> list[str]:
    """The label selectors (API list syntax) of an ``antiAffinity`` entry: the label set itself,
    or for a bare ``<name>`` one selector per `NAME_LABELS` key (a pod matching either counts)."""
    if _BARE_NAME.fullmatch(text):
        return [f"{key}={text}" for key in NAME_LABELS]
    parse_label_set(text)
    return [text]


def parse_label_set(text: str) -> dict[str, str]:
    """A label set ``key=value[,key=value…]`` as a label map (every pair must match). Keys are
    label keys (an optional DNS prefix of at most 253 characters and a name of at most 63),
    values label values (at most 63, may be empty); a key appears once."""
    out: dict[str, str] = {}
    for pair in text.split(","):
        if not _PAIR_RE.fullmatch(pair):
            raise LocalityError(
                f"{text!r}: {pair!r} is not key=value with a label key and a label value "
                "(e.g. app=redis,tier=cache)"
            )
        key, _, value = pair.partition("=")
        prefix, _, _ = key.rpartition("/")
        if len(prefix) > 253:
            raise LocalityError(f"{text!r}: the prefix of {key!r} is longer than 253 characters")
        if key in out:
            raise LocalityError(f"{text!r}: key {key!r} appears twice")
        out[key] = value
    return out


def _requirement(expr: Mapping[str, Any]) -> str | None:
    key, op = str(expr.get("key", "")), expr.get("operator")
    values = ",".join(str(v) for v in expr.get("values") or [])
    if op == "In":
        return f"{key} in ({values})"
    if op == "NotIn":
        return f"{key} notin ({values})"
    if op == "Exists":
        return key
    if op == "DoesNotExist":
        return f"!{key}"
    return None


def selector_of(ref: StoreRef, obj: Mapping[str, Any]) -> str | None:
    """The label selector (API list syntax) of the pods of `obj`, the Service or StatefulSet
    `ref` names; None when it selects no pods (a Service without a selector, an unknown operator)."""
    spec = obj.get("spec") or {}
    if ref.kind == "service":
        selector = spec.get("selector") or {}
        if not selector:
            return None
        return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    selector = spec.get("selector") or {}
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        part = _requirement(expr)
        if part is None:
            return None
        parts.append(part)
    return ",".join(parts) or None  # an empty selector would select every pod: none is meant


@dataclass(frozen=True, slots=True)
class LocalityHints:
    """Where a pool's data is and what it avoids: nodes and zones, as the annotations carry them."""

    data_nodes: tuple[str, ...] = ()
    data_zones: tuple[str, ...] = ()
    avoid_nodes: tuple[str, ...] = ()


def _placed_nodes(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The nodes of the bound, running-or-starting, not terminating `pods`, most pods first."""
    count: Counter[str] = Counter()
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        if node and not meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
            count[str(node)] += 1
    return [n for n, _ in sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))][:MAX_NAMED_NODES]


def locality_hints(
    store_pods: Iterable[Mapping[str, Any]],
    avoided_pods: Iterable[Mapping[str, Any]],
    node_zones: Mapping[str, str],
) -> LocalityHints:
    """The hints for a pool from the pods of its stores and of its anti-affinity sets (Pod
    objects as JSON; pods not bound, finished or terminating do not count) and the zone of each
    node (``topology.kubernetes.io/zone``; a node without one adds no zone)."""
    data = _placed_nodes(store_pods)
    zones = sorted({node_zones[n] for n in data if node_zones.get(n)})
    return LocalityHints(tuple(data), tuple(zones), tuple(sorted(_placed_nodes(avoided_pods))))


def locality_annotations(
    hints: LocalityHints | None, weight: str | None, max_nodes_to_score: int | None
) -> dict[str, str]:
    """The pod annotations for `hints` (None: no dataLocality), the ``localityWeight`` level and
    the candidate limit (None: fastScheduling off); empty lists are left out."""
    out: dict[str, str] = {}
    if hints is not None:
        for key, names in (
            (ANNOTATION_DATA_NODES, hints.data_nodes),
            (ANNOTATION_DATA_ZONES, hints.data_zones),
            (ANNOTATION_AVOID_NODES, hints.avoid_nodes),
        ):
            if names:
                out[key] = ",".join(names)
        if weight is not None and (hints.data_nodes or hints.data_zones or hints.avoid_nodes):
            out[ANNOTATION_DATA_LOCALITY_WEIGHT] = weight
    if max_nodes_to_score is not None:
        out[ANNOTATION_MAX_NODES_TO_SCORE] = str(max_nodes_to_score)
    return out


def _names(annotations: Mapping[str, Any], key: str, pattern: re.Pattern[str]) -> tuple[str, ...]:
    raw = annotations.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, str):
        raise LocalityError(f"annotation {key}: {raw!r} is not a string")
    names = tuple(n for n in raw.split(",") if n)
    if len(names) > MAX_NAMED_NODES:
        raise LocalityError(f"annotation {key}: {len(names)} names, at most {MAX_NAMED_NODES}")
    for name in names:
        if not pattern.fullmatch(name):
            raise LocalityError(f"annotation {key}: {name!r} is not a node or zone name")
    return names


def request_fields(annotations: Mapping[str, Any]) -> dict[str, Any]:
    """The `neuronetes.model.PodRequest` fields a pod's locality annotations ask for (only those
    it carries): ``preferred_nodes``, ``preferred_zones``, ``avoid_nodes``, ``weight_scale`` and
    ``max_nodes_to_score``.

    Raises:
        LocalityError: a malformed list, an unknown weight level, a limit that is not an integer
            in 1..100000.
    """
    out: dict[str, Any] = {}
    for key, field_name, pattern in (
        (ANNOTATION_DATA_NODES, "preferred_nodes", _NODE_NAME),
        (ANNOTATION_DATA_ZONES, "preferred_zones", _ZONE),
        (ANNOTATION_AVOID_NODES, "avoid_nodes", _NODE_NAME),
    ):
        names = _names(annotations, key, pattern)
        if names:
            out[field_name] = names
    weight = annotations.get(ANNOTATION_DATA_LOCALITY_WEIGHT)
    if weight is not None:
        if weight not in LOCALITY_WEIGHT_MULTIPLIERS:
            raise LocalityError(
                f"annotation {ANNOTATION_DATA_LOCALITY_WEIGHT}: {weight!r} is not one of "
                f"{', '.join(LOCALITY_WEIGHT_MULTIPLIERS)}"
            )
        scale = LOCALITY_WEIGHT_MULTIPLIERS[weight]
        if scale != 1.0:
            out["weight_scale"] = (("data_locality", scale),)
    raw = annotations.get(ANNOTATION_MAX_NODES_TO_SCORE)
    if raw is not None:
        if not (
            isinstance(raw, str) and raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_NODES_TO_SCORE
        ):
            key = ANNOTATION_MAX_NODES_TO_SCORE
            raise LocalityError(f"annotation {key}: {raw!r} is not an integer in 1..{MAX_NODES_TO_SCORE}")
        out["max_nodes_to_score"] = int(raw)
    return out
