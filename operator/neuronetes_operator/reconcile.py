"""What to create and delete so a pool's pods match what it wants. Pure: pods in, actions out.

Rules (docs/agentpool.md "How pods are managed"):

* A pod the pool no longer wants (scaled down, gang size changed) is deleted.
* A failed or finished pod is deleted, and recreated under the same name once it is gone.
* Gangs are whole or absent: when a member of a gang that had begun binding is missing or failed,
  every other member is deleted too, and the gang is recreated, all members together, once none
  of its old members is left (a terminating pod's name cannot be reused before it is gone).
* A replica has two names (``<pod>`` and ``<pod>-r``): a pod under notice, or one moved off spot,
  is replaced under the other name while it still runs (`neuronetes_operator.spot_plan`).
* A pod (or gang) whose template hash is outdated is replaced one unit at a time, and only while
  every other unit is ready, so a rollout never takes more than one replica (one gang) away.

`batch` cuts a plan to what one reconcile does (docs/agentpool.md, "Batches"): at most the
operator's ``batchSize`` creations and deletions, whole units (a gang's members go together), in
the plan's order; the rest waits for the next reconcile, which plans again from the pods it finds.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from neuronetes import contracts as c

from .pods import LABEL_TEMPLATE_HASH, DesiredPod

__all__ = ["LIST_PAGE", "Action", "batch", "is_ready", "is_terminating", "plan", "read_pod_page"]

LIST_PAGE: Final = 500
"""Pods per page when the operator lists a pool's pods: what it holds decoded in full at once."""


@dataclass(frozen=True, slots=True)
class Action:
    """Create or delete one pod, and why (the reason becomes an Event).

    `unit`: what the pod belongs to and goes with — its gang (``gang:<label>``) or itself — so a
    batch never splits a gang. `pod`: for a creation, the desired pod (its manifest is built when
    asked for, `manifest`)."""

    verb: str  # "create" | "delete"
    name: str
    reason: str
    pod: DesiredPod | None = field(default=None, compare=False, repr=False)
    unit: str = ""

    @property
    def manifest(self) -> dict[str, Any] | None:
        return self.pod.manifest if self.pod is not None else None


def _observed(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What a reconcile reads of a listed pod (the plan, the status, the gang retries); the rest —
    managed fields, volumes, most of the spec and status — is dropped as each page is read."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    kept = ("name", "namespace", "uid", "labels", "annotations", "ownerReferences", "deletionTimestamp")
    return {
        "metadata": {k: meta[k] for k in kept if k in meta},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [
                {"name": ctr.get("name"), "resources": ctr.get("resources") or {}}
                for ctr in spec.get("containers") or []
            ],
        },
        "status": {"phase": status.get("phase"), "conditions": status.get("conditions") or []},
    }


def read_pod_page(data: bytes, owner_uid: str, into: list[dict[str, Any]]) -> str | None:
    """Add the pods of one page of a pod list (the API server's JSON) that the pool `owner_uid`
    controls to `into`, each as `_observed` keeps it; the page's continue token (None: last page).

    Controlled by this very pool (its uid), so pods of an earlier pool of the same name (being
    garbage-collected) are not taken over."""
    page = json.loads(data)
    for item in page.get("items") or []:
        owners = item["metadata"].get("ownerReferences") or []
        if any(o.get("controller") and o.get("uid") == owner_uid for o in owners):
            into.append(_observed(item))
    return (page.get("metadata") or {}).get("continue") or None


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
    return bool(labels.get(LABEL_TEMPLATE_HASH) != want.template.digest)


def _unit_of(pod: Mapping[str, Any]) -> str:
    gang = (pod.get("metadata", {}).get("labels") or {}).get(c.LABEL_GANG)
    return f"gang:{gang}" if gang else f"pod:{pod['metadata']['name']}"


def plan(
    desired: Sequence[DesiredPod],
    observed: Sequence[Mapping[str, Any]],
    deleting: Collection[str] = (),
) -> list[Action]:
    """The actions that move `observed` (the pool's pods) toward `desired`.

    A replica is one pod under either of its names (`DesiredPod.alternate`); both exist only while
    one replaces the other (`neuronetes_operator.spot_plan`), and a gang's two generations are
    two gangs. `deleting`: pods the caller deletes in this reconcile (counted as gone)."""
    have = {p["metadata"]["name"]: p for p in observed}
    want = {d.name: d for d in desired}
    names = set(want) | {d.alternate for d in desired if d.alternate}
    actions: list[Action] = []
    gone: set[str] = set(deleting)  # pods deleted by this plan (or the caller) or already terminating

    def delete(name: str, reason: str) -> None:
        if name in gone:
            return
        gone.add(name)
        if not is_terminating(have[name]):
            actions.append(Action("delete", name, reason, unit=_unit_of(have[name])))

    def live(name: str) -> bool:
        return bool(name) and name in have and name not in gone

    for name, pod in have.items():
        if is_terminating(pod):
            gone.add(name)
        elif name in gone:
            continue
        elif name not in names:
            delete(name, "ScaledDown")
        elif _finished(pod):
            delete(name, "PodFinished")

    units: dict[tuple[str, object], list[DesiredPod]] = {}
    for d in desired:
        units.setdefault(("gang", d.gang) if d.gang is not None else ("pod", d.name), []).append(d)

    for key, members in units.items():
        if key[0] != "gang":
            continue
        for generation in ([m.name for m in members], [m.alternate for m in members if m.alternate]):
            present = [n for n in generation if live(n)]
            started = any(_bound(have[n]) for n in present)
            if present and len(present) < len(members) and started:
                for n in present:
                    delete(n, "GangBroken")

    def occupant(m: DesiredPod) -> str | None:
        """The replica's one live pod; None when it has none, or two (a replacement under way)."""
        found = [n for n in (m.name, m.alternate) if live(n)]
        return found[0] if len(found) == 1 else None

    # Rollout: replace one outdated unit, only while every other unit is whole and ready.
    outdated = [
        key
        for key, members in units.items()
        if any((o := occupant(m)) is not None and _outdated(have[o], m) for m in members)
    ]
    if outdated:
        settled = all(
            (o := occupant(m)) is not None and is_ready(have[o])
            for key, members in units.items()
            if key != outdated[0]
            for m in members
        )
        if settled:
            for m in units[outdated[0]]:
                for n in (m.name, m.alternate):
                    if n in have:
                        delete(n, "Outdated")

    for key, members in units.items():
        if any(live(m.alternate) for m in members):
            continue  # the replica (gang) lives under its other name
        if any(m.name in gone for m in members) and key[0] == "gang":
            continue  # the gang is recreated whole once its old members are gone
        for m in members:
            if m.name not in have:
                actions.append(Action("create", m.name, "Created", m, m.unit))
    return actions


def batch(actions: Sequence[Action], size: int) -> tuple[list[Action], list[Action]]:
    """(now, later): the first whole units of `actions` holding at most `size` actions, and the rest.

    A unit (a gang) is never split: one larger than `size` goes alone, so a reconcile does at most
    ``max(size, gang size)`` pod changes. Order is kept (the plan's deletions come first)."""
    units: dict[str, list[Action]] = {}
    for a in actions:
        units.setdefault(a.unit or f"pod:{a.name}", []).append(a)
    now: list[Action] = []
    later: list[Action] = []
    for members in units.values():
        if later or (now and len(now) + len(members) > size):
            later.extend(members)
        else:
            now.extend(members)
    return now, later
