"""The model cache on a node: the directory contract and the choice of nodes to preload. Pure.

Contract (docs/model-cache.md): the host directory (`contracts.NODE_MODEL_CACHE_DIR` by default)
holds one directory per model, named `directory_name(model)`; the model is *cached* once that
directory holds the regular file `MARKER` whose content is the model's name. The fetcher writes the
marker last, so a half-downloaded model is never reported. The node agent scans the directory
(`neuronetes_agent.daemon.modelcache`) and the operator's preload Jobs fill it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from neuronetes.nodeselect import requirement_holds

__all__ = [
    "MARKER",
    "MAX_MODEL_NAME",
    "MAX_REPORTED",
    "PreloadChoice",
    "choose_preload_nodes",
    "directory_name",
    "selector_matches",
]

MARKER: Final = ".neuronetes-complete"
"""The file a fetcher writes last, holding the model's name: the model is complete."""
MAX_MODEL_NAME: Final = 253
"""An AgentPool's ``spec.model`` is at most this long (the CRD)."""
MAX_REPORTED: Final = 256
"""Models one node reports at most (the GPUNode CRD's ``cachedModels`` maxItems)."""


def directory_name(model: str) -> str | None:
    """The directory of `model` in the cache: its name with each ``/`` spelled ``--`` (as in
    ``org/name`` model ids); None when the name cannot be one path component (empty, too long, a
    control character, a leading ``.``, which also keeps ``.`` and ``..`` out).

    Two names may share a directory (``a/b`` and ``a--b``); the marker's content says which one it
    holds, so the cache never reports a model it does not have."""
    if not model or len(model) > MAX_MODEL_NAME or model.startswith("."):
        return None
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in model):
        return None
    name = model.replace("/", "--")
    return name if len(name.encode()) <= 255 else None


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether `labels` satisfy a Kubernetes label selector (``matchLabels`` and ``matchExpressions``,
    ANDed; None or empty: everything)."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        if not requirement_holds(
            str(expr.get("operator")), list(expr.get("values") or []), labels.get(expr["key"])
        ):
            return False
    return True


@dataclass(frozen=True, slots=True)
class PreloadChoice:
    """What a pool's preloading should do now (`choose_preload_nodes`)."""

    cached: tuple[str, ...]
    """Selected nodes that report the model cached."""
    start: tuple[str, ...]
    """Nodes to start a preload on now."""
    missing: int
    """Cached nodes still lacking once every preload under way and started succeeds (0: enough;
    above 0: too few selected nodes are left to try)."""


def choose_preload_nodes(
    candidates: Iterable[str],
    cached: Collection[str],
    preloading: Collection[str],
    failed: Collection[str],
    want: int,
    *,
    max_start: int,
) -> PreloadChoice:
    """The nodes to preload on so that `want` of the `candidates` (selected, schedulable nodes) have
    the model cached.

    Guarantees: never more preloads than needed (cached + under way + started <= `want`, unless
    more are already cached or under way: nothing is cancelled); no node is started twice (one
    cached, under way or whose preload recently `failed` is skipped: the caller forgets a failure
    after its back-off); at most `max_start` starts per call (bounded work per reconcile);
    deterministic (candidates in name order)."""
    names = sorted(set(candidates))
    have = [n for n in names if n in cached]
    under_way = [n for n in names if n in preloading and n not in cached]
    need = max(0, want - len(have) - len(under_way))
    free = [n for n in names if n not in cached and n not in preloading and n not in failed]
    start = free[: min(need, max(0, max_start))]
    return PreloadChoice(tuple(have), tuple(start), max(0, need - len(free)))
