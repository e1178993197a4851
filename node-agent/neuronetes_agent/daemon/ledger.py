"""The node ledger file: the pods bound to this node and what they were assigned, for the NRI
plugin's cross-check (docs/contracts.md "The node ledger file", docs/node-injection.md "The
node ledger cross-check").

The plugin reads the assignment from the pod sandbox's annotation; the ledger is what the agent
learnt from the API server. A pod enters the ledger, after every pod already in it, when the agent
first sees it bound to this node with an assignment the node accepts (`pods.pod_use`), and its
annotation is pinned then: a later change of ``neuronetes.io/assigned-gpus`` is ignored (counted
in `ignored_changes`, logged once), as the extender's ledger does, so the plugin refuses a pod
whose sandbox carries anything else. A pod leaves when it finishes or is deleted. The order is
what decides a collision (the pod recorded first keeps its GPU), so it survives a restart: the
writer starts from the file already there.

Nothing is written before the pod watch has listed the node's pods once (`ready`): a ledger
written from an empty view would drop every pod and refuse their containers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec

from .devices import Inventory
from .inventory import REWRITE_S, atomic_write
from .pods import PodUse

__all__ = ["LEDGER_FILE", "LedgerWriter"]

log = logging.getLogger("neuronetes_agent")

LEDGER_FILE: Final = "ledger.json"
_VERSION: Final = 1
_MAX_BYTES: Final = 8 << 20  # the plugin's bound (node-agent/nri/ledger)


@dataclass(frozen=True, slots=True)
class _Entry:
    namespace: str
    name: str
    annotation: str


class _PodDoc(msgspec.Struct, forbid_unknown_fields=True):
    uid: str
    namespace: str
    name: str
    assignment: str


class _LedgerDoc(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    version: int
    node: str
    generation: int
    updated_at: str
    gpus: list[dict[str, Any]]
    pods: list[_PodDoc]


class LedgerWriter:
    """Keeps ``<state>/ledger.json`` equal to the pods bound here (rewritten on change and every
    `REWRITE_S` seconds, so the plugin's freshness bound holds)."""

    def __init__(
        self,
        node: str,
        state_dir: Path,
        *,
        ready: Callable[[], bool],
        clock: Callable[[], float],
    ) -> None:
        self.node = node
        self.path = state_dir / LEDGER_FILE
        self.ready = ready
        self.clock = clock
        self.ignored_changes = 0
        self._entries: dict[str, _Entry] = {}  # pod UID -> entry, in recording order
        self._generation = 0
        self._written_key = ""
        self._written_at = float("-inf")
        self._reported: set[str] = set()
        self._resume()

    def _resume(self) -> None:
        """Continue the order, the pinned annotations and the generation of the file there."""
        try:
            raw = self.path.read_bytes()
            if len(raw) > _MAX_BYTES:
                raise ValueError(f"{len(raw)} bytes")
            doc = msgspec.json.decode(raw, type=_LedgerDoc)
        except FileNotFoundError:
            return
        except (OSError, ValueError, msgspec.ValidationError) as exc:
            log.warning("node ledger %s not resumed (%s): starting a new one", self.path, exc)
            return
        if doc.node != self.node or doc.version != _VERSION:
            log.warning("node ledger %s is not this node's: starting a new one", self.path)
            return
        self._generation = doc.generation
        self._entries = {p.uid: _Entry(p.namespace, p.name, p.assignment) for p in doc.pods}

    def refresh(self, pods: Mapping[str, PodUse], inventory: Inventory) -> bool:
        """Record `pods` (pod UID -> use) and write the file when it changed or is due; True when
        written. Raises OSError when the file cannot be written (the plugin then refuses GPU
        containers once the old file goes stale: fail closed)."""
        if not self.ready():
            return False
        self._observe(pods)
        gpus = [{"uuid": g.uuid, "memoryMiB": g.memory_mib} for g in inventory.gpus]
        key = json.dumps([gpus, [(u, e.annotation) for u, e in self._entries.items()]])
        now = self.clock()
        if key == self._written_key and now - self._written_at < REWRITE_S:
            return False
        self._generation += 1
        doc = {
            "version": _VERSION,
            "node": self.node,
            "generation": self._generation,
            "updatedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "gpus": gpus,
            "pods": [
                {"uid": uid, "namespace": e.namespace, "name": e.name, "assignment": e.annotation}
                for uid, e in self._entries.items()
            ],
        }
        atomic_write(self.path, json.dumps(doc, separators=(",", ":")).encode())
        self._written_key, self._written_at = key, now
        return True

    def _observe(self, pods: Mapping[str, PodUse]) -> None:
        for uid in [u for u in self._entries if u not in pods]:
            del self._entries[uid]
            self._reported.discard(uid)
        for uid, use in pods.items():
            entry = self._entries.get(uid)
            if entry is None:
                self._entries[uid] = _Entry(use.namespace, use.name, use.annotation)
            elif entry.annotation != use.annotation and uid not in self._reported:
                self._reported.add(uid)
                self.ignored_changes += 1
                log.warning(
                    "pod %s/%s: neuronetes.io/assigned-gpus changed after it was bound; the node "
                    "ledger keeps the first one (the NRI plugin refuses the new one)",
                    use.namespace,
                    use.name,
                )
