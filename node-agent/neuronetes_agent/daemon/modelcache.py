"""Which models are cached on a node: the agent's source for ``GPUNode.status.gpus[].cachedModels``.

Two sources (docs/model-cache.md):

* `HostModelCache` (``--node``): the host cache directory (``--model-cache-dir``), read by
  `scan_model_cache` under the contract of `neuronetes.modelcache`: ``<dir>/shared/<name>/`` (the
  platform's, reported as ``<model>``) and ``<dir>/namespaces/<namespace>/<name>/`` (one
  namespace's, reported as ``<namespace>:<model>``), each with the marker file holding the model's
  name. The agent runs privileged and tenants write the namespace folders, so the scan never
  follows a symlink (every open is relative to the directory already opened, with ``O_NOFOLLOW``),
  never blocks on a FIFO, reads at most `MAX_MARKER_BYTES` of a marker and looks at a bounded
  number of entries per folder (`MAX_SCANNED`, `MAX_NAMESPACES`, `MAX_SCANNED_PER_NAMESPACE`).
* `SimulatedModelCache` (fleet mode): a simulated node has no host directory. Its cache holds the
  entries its Node's annotation `contracts.ANNOTATION_SIMULATED_CACHED_MODELS` names (the same
  ``<model>`` / ``<namespace>:<model>`` format), plus ``<namespace>:<model>`` for every preload pod
  (`contracts.ANNOTATION_PRELOAD_MODEL`) of that namespace completed on the node: where a real
  preload pod writes its namespace's folder and the marker, the simulated node takes the pod's
  success as that write.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from neuronetes.modelcache import (
    MARKER,
    MAX_REPORTED,
    NAMESPACES_DIR,
    SHARED_DIR,
    cache_entry,
    directory_name,
    parse_cache_entry,
    valid_namespace,
)

__all__ = [
    "MAX_MARKER_BYTES",
    "MAX_NAMESPACES",
    "MAX_SCANNED",
    "MAX_SCANNED_PER_NAMESPACE",
    "CacheScan",
    "HostModelCache",
    "ModelCache",
    "SimulatedModelCache",
    "parse_model_list",
    "scan_model_cache",
]

log = logging.getLogger("neuronetes_agent")

MAX_SCANNED: Final = 4096
"""Entries of ``shared/`` one scan looks at, at most (a huge directory costs no more)."""
MAX_NAMESPACES: Final = 1024
"""Namespace folders one scan looks into, at most."""
MAX_SCANNED_PER_NAMESPACE: Final = 256
"""Entries of one namespace's folder one scan looks at, at most: what a tenant's folder costs the
agent, however many entries its preload Jobs planted."""
MAX_MARKER_BYTES: Final = 1024
"""A marker longer than this is not one (a model name is at most 253 characters)."""
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MARKER_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MISPLACED_SHOWN: Final = 8


class ModelCache(Protocol):
    """What the agent's loop asks of a node's cache each round."""

    def models(self) -> tuple[str, ...]:
        """The entries cached now (``<model>``, ``<namespace>:<model>``), sorted (at most
        `MAX_REPORTED`)."""
        ...


@dataclass(frozen=True, slots=True)
class CacheScan:
    """One scan of the host cache directory."""

    models: tuple[str, ...]
    """The entries reported: ``<model>`` from ``shared/``, ``<namespace>:<model>`` from a namespace's
    folder; sorted, at most `MAX_REPORTED`."""
    misplaced: tuple[str, ...] = ()
    """Top-level entries other than ``shared`` and ``namespaces`` (first few by name): model folders
    of the flat layout of earlier versions, which preload Jobs of any namespace wrote, so they count
    for nobody until an administrator moves them (docs/model-cache.md, "Migration")."""


def _open_folder(parent_fd: int, name: str) -> int | None:
    """`name` in the open folder `parent_fd`, opened as a folder; None when it is none (a symlink,
    a file, a FIFO: ``O_DIRECTORY`` refuses it before any open could block) or cannot be read."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)  # ELOOP/ENOTDIR: a symlink or no folder
    except OSError:
        return None


def _complete_model(parent_fd: int, name: str) -> str | None:
    """The model the folder `name` holds, when it is a real folder with a complete marker."""
    folder = _open_folder(parent_fd, name)
    if folder is None:
        return None
    try:
        marker = os.open(MARKER, _MARKER_FLAGS, dir_fd=folder)
    except OSError:
        return None  # still downloading (no marker), or the marker is a symlink
    finally:
        os.close(folder)
    try:
        info = os.fstat(marker)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MARKER_BYTES:
            return None
        data = os.read(marker, MAX_MARKER_BYTES + 1)
    finally:
        os.close(marker)
    try:
        model = data.decode().strip()
    except UnicodeDecodeError:
        return None
    return model if directory_name(model) == name else None


def _names(folder_fd: int, limit: int) -> list[str]:
    """The first `limit` entry names of the open folder (none starting with ``.``)."""
    out: list[str] = []
    with os.scandir(folder_fd) as entries:
        for seen, entry in enumerate(entries):
            if seen >= limit:
                break
            if not entry.name.startswith("."):
                out.append(entry.name)
    return out


def _models_in(parent_fd: int, name: str, limit: int) -> list[str]:
    """The complete models of the folder `name` of `parent_fd`, looking at `limit` entries at most."""
    folder = _open_folder(parent_fd, name)
    if folder is None:
        return []
    try:
        return [m for n in _names(folder, limit) if (m := _complete_model(folder, n)) is not None]
    finally:
        os.close(folder)


def _fair_share(shared: list[str], per_namespace: dict[str, list[str]], cap: int) -> tuple[str, ...]:
    """At most `cap` entries: the shared models first (the platform's), then the namespaces' in
    turns (one model of each namespace per round, by name), so no namespace's many models push out
    another's."""
    out = [cache_entry(m) for m in sorted(shared)[:cap]]
    queues = [[cache_entry(m, ns) for m in sorted(models)] for ns, models in sorted(per_namespace.items())]
    depth = 0
    while len(out) < cap and any(depth < len(q) for q in queues):
        out.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return tuple(sorted(out[:cap]))


def scan_model_cache(
    root: Path,
    *,
    limit: int = MAX_SCANNED,
    namespace_limit: int = MAX_SCANNED_PER_NAMESPACE,
) -> CacheScan:
    """The complete models in the cache directory `root`; empty when `root` does not exist or cannot
    be read. `root` itself is the administrator's path (it may be a symlink); nothing inside it is
    followed. Looks at `limit` entries of ``shared/`` and of the top level, `MAX_NAMESPACES`
    namespace folders (names that are no namespace skipped) and `namespace_limit` entries of each."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("model cache %s: cannot open: %s", root, exc)
        return CacheScan(())
    shared: list[str] = []
    per_namespace: dict[str, list[str]] = {}
    misplaced: list[str] = []
    try:
        misplaced = sorted(n for n in _names(root_fd, limit) if n not in (SHARED_DIR, NAMESPACES_DIR))
        shared = _models_in(root_fd, SHARED_DIR, limit)
        namespaces = _open_folder(root_fd, NAMESPACES_DIR)
        if namespaces is not None:
            try:
                for ns in _names(namespaces, MAX_NAMESPACES):
                    if valid_namespace(ns):
                        found = _models_in(namespaces, ns, namespace_limit)
                        if found:
                            per_namespace[ns] = found
            finally:
                os.close(namespaces)
    except OSError as exc:
        log.warning("model cache %s: scan failed: %s", root, exc)
    finally:
        os.close(root_fd)
    return CacheScan(_fair_share(shared, per_namespace, MAX_REPORTED), tuple(misplaced[:_MISPLACED_SHOWN]))


class HostModelCache:
    """The host directory, scanned at most once per `every_s` (the loop asks every round)."""

    def __init__(
        self, root: Path, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.root = root
        self.every_s = every_s
        self._clock = clock
        self._at = -float("inf")
        self._models: tuple[str, ...] = ()
        self._misplaced: tuple[str, ...] = ()

    def models(self) -> tuple[str, ...]:
        now = self._clock()
        if now - self._at >= self.every_s:
            scan = scan_model_cache(self.root)
            if scan.misplaced and scan.misplaced != self._misplaced:
                log.warning(
                    "model cache %s: %s are neither %s/ nor %s/ and count for no pod: move a model "
                    "folder you trust into %s/ (docs/model-cache.md, Migration)",
                    self.root,
                    ", ".join(scan.misplaced),
                    SHARED_DIR,
                    NAMESPACES_DIR,
                    SHARED_DIR,
                )
            self._misplaced = scan.misplaced
            self._models = scan.models
            self._at = now
        return self._models


def parse_model_list(raw: str | None) -> set[str]:
    """The entries of a comma-separated list (the simulated nodes' annotation: ``<model>`` shared,
    ``<namespace>:<model>`` a namespace's); an entry that is none (`parse_cache_entry`) dropped."""
    names = (part.strip() for part in (raw or "").split(","))
    return {n for n in names if parse_cache_entry(n) is not None}


class SimulatedModelCache:
    """A simulated node's cache: the Node's annotation, plus the namespaces' models preloaded on it."""

    def __init__(self, initial: Iterable[str] = ()) -> None:
        self._declared: set[str] = set(initial)
        self._preloaded: set[str] = set()

    def declare(self, models: Iterable[str]) -> None:
        """The Node's annotation now names `models` (a model removed from it is uncached)."""
        self._declared = set(models)

    def preloaded(self, namespace: str, model: str) -> None:
        """A preload pod of `namespace` fetching `model` succeeded on the node: the simulated fetch
        wrote the model into that namespace's folder, as a real one would."""
        if valid_namespace(namespace) and directory_name(model) is not None:
            self._preloaded.add(cache_entry(model, namespace))

    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self._declared | self._preloaded))[:MAX_REPORTED]
