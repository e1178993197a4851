"""Which models are cached on a node: the agent's source for ``GPUNode.status.gpus[].cachedModels``.

Two sources (docs/model-cache.md):

* `HostModelCache` (``--node``): the host cache directory (``--model-cache-dir``), read by
  `scan_model_cache` under the contract of `neuronetes.modelcache`: ``<dir>/<name>/`` with the
  marker file holding the model's name. The agent runs privileged, so the scan never follows a
  symlink (every open is relative to the directory already opened, with ``O_NOFOLLOW``), never
  blocks on a FIFO, reads at most `MAX_MARKER_BYTES` of a marker and looks at no more than
  `MAX_SCANNED` entries.
* `SimulatedModelCache` (fleet mode): a simulated node has no host directory. Its cache holds the
  models its Node's annotation `contracts.ANNOTATION_SIMULATED_CACHED_MODELS` names, plus every model
  a preload pod (`contracts.ANNOTATION_PRELOAD_MODEL`) completed on the node: where a real preload
  pod writes the directory and its marker, the simulated node takes the pod's success as that
  write.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, Protocol

from neuronetes.modelcache import MARKER, MAX_REPORTED, directory_name

__all__ = [
    "MAX_MARKER_BYTES",
    "MAX_SCANNED",
    "HostModelCache",
    "ModelCache",
    "SimulatedModelCache",
    "parse_model_list",
    "scan_model_cache",
]

log = logging.getLogger("neuronetes_agent")

MAX_SCANNED: Final = 4096
"""Directory entries one scan looks at, at most (a huge or hostile directory costs no more)."""
MAX_MARKER_BYTES: Final = 1024
"""A marker longer than this is not one (a model name is at most 253 characters)."""
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MARKER_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ModelCache(Protocol):
    """What the agent's loop asks of a node's cache each round."""

    def models(self) -> tuple[str, ...]:
        """The models cached now, sorted (at most `MAX_REPORTED`)."""
        ...


def _complete_model(root_fd: int, name: str) -> str | None:
    """The model directory `name` holds, when it is a real directory with a complete marker."""
    try:
        folder = os.open(name, _DIR_FLAGS, dir_fd=root_fd)  # ELOOP/ENOTDIR: a symlink or a file
    except OSError:
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


def scan_model_cache(root: Path, *, limit: int = MAX_SCANNED) -> tuple[str, ...]:
    """The complete models in the cache directory `root` (sorted, at most `MAX_REPORTED`); () when
    `root` does not exist or cannot be read. `root` itself is the administrator's path (it may be a
    symlink); nothing inside it is followed."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("model cache %s: cannot open: %s", root, exc)
        return ()
    found: list[str] = []
    try:
        with os.scandir(root_fd) as entries:
            for seen, entry in enumerate(entries):
                if seen >= limit or len(found) >= MAX_REPORTED:
                    break
                if entry.name.startswith("."):
                    continue
                model = _complete_model(root_fd, entry.name)
                if model is not None:
                    found.append(model)
    except OSError as exc:
        log.warning("model cache %s: scan failed: %s", root, exc)
    finally:
        os.close(root_fd)
    return tuple(sorted(found))


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

    def models(self) -> tuple[str, ...]:
        now = self._clock()
        if now - self._at >= self.every_s:
            self._models = scan_model_cache(self.root)
            self._at = now
        return self._models


def parse_model_list(raw: str | None) -> set[str]:
    """The models of a comma-separated list (the simulated nodes' annotation); bad names dropped."""
    names = (part.strip() for part in (raw or "").split(","))
    return {n for n in names if directory_name(n) is not None}


class SimulatedModelCache:
    """A simulated node's cache: the Node's annotation, plus the models preloaded on it."""

    def __init__(self, initial: Iterable[str] = ()) -> None:
        self._declared: set[str] = set(initial)
        self._preloaded: set[str] = set()

    def declare(self, models: Iterable[str]) -> None:
        """The Node's annotation now names `models` (a model removed from it is uncached)."""
        self._declared = set(models)

    def preloaded(self, model: str) -> None:
        """A preload pod of `model` succeeded on the node: the simulated fetch wrote the model."""
        if directory_name(model) is not None:
            self._preloaded.add(model)

    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self._declared | self._preloaded))[:MAX_REPORTED]
