"""The model cache on a node: the directory contract, the names the cache's models are reported
under, and the choice of nodes to preload. Pure.

Contract (docs/model-cache.md): the host directory (`contracts.NODE_MODEL_CACHE_DIR` by default)
holds the platform's models in ``shared/`` and each namespace's in ``namespaces/<namespace>/``, one
folder per model named `directory_name(model)`; the model is *cached* once that folder holds the
regular file `MARKER` whose content is the model's name. The fetcher writes the marker last, so a
half-downloaded model is never reported. The node agent scans the directory
(`neuronetes_agent.daemon.modelcache`) and reports a shared model as ``<model>`` and a namespace's
as ``<namespace>:<model>`` (`cache_entry`); a pod of namespace X hits on either ``M`` or ``X:M``
(`hit_entries`), never on another namespace's. The operator's preload Jobs write a namespace's
folder only (`namespace_folder`): a tenant can plant or spoil models for itself alone.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from neuronetes.contracts import DNS_LABEL_PATTERN
from neuronetes.nodeselect import requirement_holds

__all__ = [
    "MARKER",
    "MAX_MODEL_NAME",
    "MAX_REPORTED",
    "NAMESPACES_DIR",
    "SHARED_DIR",
    "PreloadChoice",
    "cache_entry",
    "choose_preload_nodes",
    "directory_name",
    "hit_entries",
    "namespace_folder",
    "parse_cache_entry",
    "selector_matches",
    "valid_namespace",
]

MARKER: Final = ".neuronetes-complete"
"""The file a fetcher writes last, holding the model's name: the model is complete."""
MAX_MODEL_NAME: Final = 253
"""An AgentPool's ``spec.model`` is at most this long (the CRD)."""
MAX_REPORTED: Final = 256
"""Models one node reports at most (the GPUNode CRD's ``cachedModels`` maxItems)."""
SHARED_DIR: Final = "shared"
"""The platform's models: ``<dir>/shared/<model folder>/``, written by a host provisioner or an
administrator, never mounted writable into a tenant's pod by NeuroNetes. Reported as ``<model>``."""
NAMESPACES_DIR: Final = "namespaces"
"""One namespace's models: ``<dir>/namespaces/<namespace>/<model folder>/``, written by that
namespace's preload Jobs. Reported as ``<namespace>:<model>``."""
_SEPARATOR: Final = ":"
_NAMESPACE = re.compile(DNS_LABEL_PATTERN)


def valid_namespace(name: str) -> bool:
    """Whether `name` can be a Kubernetes namespace (an RFC 1123 label: at most 63 of ``a-z0-9-``,
    alphanumeric at both ends), so never ``:``, ``/``, ``.`` or ``..``."""
    return len(name) <= 63 and _NAMESPACE.match(name) is not None


def directory_name(model: str) -> str | None:
    """The directory of `model` in the cache: its name with each ``/`` spelled ``--`` (as in
    ``org/name`` model ids); None when the name cannot be one path component (empty, too long, a
    control character, a leading ``.``, which also keeps ``.`` and ``..`` out) or holds ``:``, which
    separates a namespace from the model in the reported names (no Hugging Face model id has one:
    they are ``[A-Za-z0-9._-]`` with at most one ``/``), so such a model is never cached.

    Two names may share a directory (``a/b`` and ``a--b``); the marker's content says which one it
    holds, so the cache never reports a model it does not have."""
    if not model or len(model) > MAX_MODEL_NAME or model.startswith(".") or _SEPARATOR in model:
        return None
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in model):
        return None
    name = model.replace("/", "--")
    return name if len(name.encode()) <= 255 else None


def cache_entry(model: str, namespace: str | None = None) -> str:
    """How a node reports `model` cached: ``<model>`` from the shared folder, ``<namespace>:<model>``
    from a namespace's."""
    return model if namespace is None else f"{namespace}{_SEPARATOR}{model}"


def parse_cache_entry(entry: str) -> tuple[str | None, str] | None:
    """The namespace (None: shared) and model of a reported entry; None when it is not one: more
    than one ``:``, a namespace that is no namespace name, or a model without a folder."""
    namespace, sep, model = entry.rpartition(_SEPARATOR)
    if sep and not valid_namespace(namespace):
        return None  # also "a:b:c", whose namespace part "a:b" is no label
    if directory_name(model) is None:
        return None
    return (namespace if sep else None), model


def hit_entries(model: str, namespace: str | None) -> tuple[str, ...]:
    """The reported entries that hold `model` for a pod (or pool) of `namespace`: the shared one
    and its own namespace's, never another namespace's; none for a model without a folder (a name
    with ``:`` could otherwise read as another namespace's entry)."""
    if directory_name(model) is None:
        return ()
    if namespace is not None and valid_namespace(namespace):
        return model, cache_entry(model, namespace)
    return (model,)


def namespace_folder(cache_dir: str, namespace: str) -> str:
    """The host folder of `namespace`'s models under the cache directory `cache_dir`: all that one
    of its preload Jobs mounts (writable)."""
    if not valid_namespace(namespace):
        raise ValueError(f"{namespace!r} is not a namespace name")
    return f"{cache_dir.rstrip('/')}/{NAMESPACES_DIR}/{namespace}"


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
