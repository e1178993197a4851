"""What to create and delete so a pool's pods match what it wants. Pure: pods in, actions out.

Rules (docs/agentpool.md "How pods are managed"):

* A pod the pool no longer wants (scaled down, gang size changed) is deleted.
* A failed or finished pod is deleted, and recreated under the same name once it is gone.
* Gangs are whole or absent: when a member of a gang that had begun binding is missing or failed,
  every other member is deleted too, and the gang is recreated, all members together, once none
  of its old members is left (a terminating pod's name cannot be reused before it is gone).
* A pod (or gang) whose template hash is outdated is replaced one unit at a time, and only while
  every other unit is ready, so a rollout never takes more than one replica (one gang) away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .pods import LABEL_TEMPLATE_HASH, DesiredPod

__all__ = ["Action", "is_ready", "is_terminating", "plan"]


@dataclass(frozen=True, slots=True)
class Action:
    """Create or delete one pod, and why (the reason becomes an Event)."""

    verb: str  # "create" | "delete"
    name: str
    reason: str
    manifest: dict[str, Any] | None = None


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def _finished(pod: Mapping[str, Any]) -> bool:
    return bool(pod.get("status", {}).get("phase") in ("Failed", "Succeeded"))


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(cd.get("type") == "Ready" and cd.get("status") == "True" for cd in conditions)


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool(pod.get("spec", {}).get("nodeName"))


def _outdated(pod: Mapping[str, Any], want: DesiredPod) -> bool:
    labels = pod.get("metadata", {}).get("labels") or {}
    return bool(labels.get(LABEL_TEMPLATE_HASH) != want.manifest["metadata"]["labels"][LABEL_TEMPLATE_HASH])


def plan(desired: Sequence[DesiredPod], observed: Sequence[Mapping[str, Any]]) -> list[Action]:
    """The actions that move `observed` (the pool's pods) toward `desired`."""
    have = {p["metadata"]["name"]: p for p in observed}
    want = {d.name: d for d in desired}
    actions: list[Action] = []
    gone: set[str] = set()  # pods deleted by this plan or already terminating

    def delete(name: str, reason: str) -> None:
        if name in gone:
            return
        gone.add(name)
        if not is_terminating(have[name]):
            actions.append(Action("delete", name, reason))

    for name, pod in have.items():
        if is_terminating(pod):
            gone.add(name)
        elif name not in want:
            delete(name, "ScaledDown")
        elif _finished(pod):
            delete(name, "PodFinished")

    units: dict[tuple[str, object], list[DesiredPod]] = {}
    for d in desired:
        units.setdefault(("gang", d.gang) if d.gang is not None else ("pod", d.name), []).append(d)

    for key, members in units.items():
        if key[0] != "gang":
            continue
        present = [m.name for m in members if m.name in have and m.name not in gone]
        started = any(_bound(have[n]) for n in present)
        if present and len(present) < len(members) and started:
            for n in present:
                delete(n, "GangBroken")

    # Rollout: replace one outdated unit, only while every other unit is whole and ready.
    outdated = [
        key
        for key, members in units.items()
        if any(m.name in have and m.name not in gone and _outdated(have[m.name], m) for m in members)
    ]
    if outdated:
        settled = all(
            m.name in have and m.name not in gone and is_ready(have[m.name])
            for key, members in units.items()
            if key != outdated[0]
            for m in members
        )
        if settled:
            for m in units[outdated[0]]:
                if m.name in have:
                    delete(m.name, "Outdated")

    for key, members in units.items():
        if any(m.name in gone for m in members) and key[0] == "gang":
            continue  # the gang is recreated whole once its old members are gone
        for m in members:
            if m.name not in have:
                actions.append(Action("create", m.name, "Created", m.manifest))
    return actions
