"""``neuronetes explain POD``: why a pod runs on its node and GPUs, or why it is Pending, from what
the extender recorded: the pod's `neuronetes.io/assigned-gpus` annotation, its ``GpusAssigned``
Event (the reason, the runner-up node and the score terms that set the node apart from it), its
``GpuFilterRejected`` Event (each rejected node's reason) and kube-scheduler's
``FailedScheduling``."""

from __future__ import annotations

import re
from typing import Any, Final

import click
import msgspec

from neuronetes import contracts as c

from .kube import Cluster
from .options import KUBECONFIG
from .output import emit, output_option

__all__ = ["explain", "parse_placement", "parse_rejections"]

# The extender's Event reasons (extender/neuronetes_extender/service.py): one name, read here.
ASSIGNED: Final = "GpusAssigned"
REJECTED: Final = "GpuFilterRejected"
FAILED_SCHEDULING: Final = "FailedScheduling"

_PLACEMENT = re.compile(r"^node (?P<node>\S+), gpus (?P<gpus>\S+)(?: \((?P<why>.*?)\))?(?:; (?P<terms>.*))?$")
_VERSUS = re.compile(r"^vs runner-up (?P<node>\S+) \((?:margin (?P<margin>\S+)|[^)]*)\)(?:: (?P<terms>.*))?$")
_ALONE: Final = "no runner-up: "
_MORE = re.compile(r"^\+(?P<count>\d+) more$")
_TERM = re.compile(r"^(?P<name>\S+) (?P<value>[+-]\S+)$")
_GROUP = re.compile(r"(?P<reason>.+?) \[(?P<nodes>[^\]]*)\](?:; |$)")


def parse_placement(note: str) -> dict[str, Any]:
    """The extender's placement note → its parts (the whole note when it differs):
    ``node n1, gpus 0,1 (why); vs runner-up n2 (margin +0.5): topology +0.4, cost +0.1, +1 more``
    gives the runner-up, the margin and the terms that set the node apart from it (its weighted
    value minus the runner-up's), ``…; no runner-up: why`` says why there is none, and
    ``…; term +1, term -2`` (terms without a runner-up) gives the terms alone."""
    m = _PLACEMENT.match(note.strip())
    if m is None:
        return {"note": note}
    doc: dict[str, Any] = {"node": m["node"], "gpus": m["gpus"], "why": m["why"] or ""}
    tail = m["terms"] or ""
    versus = _VERSUS.match(tail)
    if versus is not None:
        terms, more = _terms(versus["terms"] or "")
        return doc | {
            "runnerUp": versus["node"],
            "margin": versus["margin"],
            "scoreTerms": terms,
            "moreTerms": more,
        }
    if tail.startswith(_ALONE):
        return doc | {"runnerUp": None, "noRunnerUp": tail.removeprefix(_ALONE), "scoreTerms": {}}
    terms = {}
    for part in tail.split(", "):
        name, _, value = part.rpartition(" ")
        if name:
            terms[name] = value
    return doc | {"scoreTerms": terms}


def _terms(listed: str) -> tuple[dict[str, str], int]:
    """``topology +0.4, cost -0.1, +2 more`` → ({"topology": "+0.4", "cost": "-0.1"}, 2); what is
    neither a term nor a count (the words of a tie) is left out."""
    terms: dict[str, str] = {}
    more = 0
    for part in listed.split(", "):
        if (count := _MORE.match(part)) is not None:
            more = int(count["count"])
        elif (term := _TERM.match(part)) is not None:
            terms[term["name"]] = term["value"]
    return terms, more


def parse_rejections(note: str) -> list[dict[str, Any]]:
    """``3 node(s) rejected: reason [n1, n2]; other [n3 +2 more]`` →
    ``[{"reason": "reason", "nodes": ["n1", "n2"], "more": 0}, ...]``."""
    _, _, body = note.partition(" rejected: ")
    groups = []
    for m in _GROUP.finditer(body):
        listed, _, more = m["nodes"].partition(" +")
        groups.append(
            {
                "reason": m["reason"],
                "nodes": [n for n in listed.split(", ") if n],
                "more": int(more.split()[0]) if more else 0,
            }
        )
    return groups


def _pod_ref(pod: str, namespace: str) -> tuple[str, str]:
    if "/" in pod:
        ns, _, name = pod.partition("/")
        if not ns or not name or "/" in name:
            raise click.BadParameter(f"{pod!r}: use NAME or NAMESPACE/NAME", param_hint="POD")
        return ns, name
    return namespace, pod


def _latest(events: list[dict[str, Any]], reason: str) -> str | None:
    notes = [str(e.get("message") or "") for e in events if e.get("reason") == reason]
    return notes[-1] if notes else None


def _assignment(pod: dict[str, Any]) -> dict[str, Any] | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
    if raw is None:
        return None
    try:
        return dict(msgspec.to_builtins(c.decode_assignment(raw)))
    except c.AssignmentError as exc:
        return {"error": str(exc)}


def explanation(pod: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    doc: dict[str, Any] = {
        "pod": f"{meta.get('namespace')}/{meta.get('name')}",
        "phase": status.get("phase"),
        "node": spec.get("nodeName") or None,
        "schedulerName": spec.get("schedulerName"),
    }
    assignment = _assignment(pod)
    if assignment is not None:
        doc["assignment"] = assignment
    placed = _latest(events, ASSIGNED)
    if placed is not None:
        doc["placement"] = parse_placement(placed)
    if not spec.get("nodeName"):
        rejected = _latest(events, REJECTED)
        doc["rejectedNodes"] = parse_rejections(rejected) if rejected else []
        doc["scheduler"] = _latest(events, FAILED_SCHEDULING)
    return doc


def _print_table(doc: dict[str, Any]) -> None:
    rows: list[list[Any]] = [
        ["pod", doc["pod"]],
        ["phase", doc["phase"]],
        ["scheduler", doc["schedulerName"]],
        ["node", doc["node"] or "-"],
    ]
    placement = doc.get("placement") or {}
    assignment = doc.get("assignment") or {}
    for name, ctr in (assignment.get("containers") or {}).items():
        gpus = ", ".join(
            f"{g['index']} ({g['uuid']}, {g['memoryMiB']} MiB, {g['computePercent']}%"
            + (f", MIG {g['migProfile']}" if g.get("migProfile") else "")
            + ")"
            for g in ctr["gpus"]
        )
        rows.append([f"container {name}", gpus])
    if "error" in assignment:
        rows.append(["assignment", f"unreadable: {assignment['error']}"])
    if placement:
        rows.append(["why this node", placement.get("why") or placement.get("note") or "-"])
        rows.extend(_versus_rows(placement))
    elif doc["node"] and not assignment:
        rows.append(
            ["why", "no GPU placement recorded (not a NeuroNetes GPU pod, or placed by another scheduler)"]
        )
    if not doc["node"]:
        rows.append(["kube-scheduler", doc.get("scheduler") or "no FailedScheduling event yet"])
        if not doc.get("rejectedNodes"):
            rows.append(["extender", "no node rejected by the extender (yet)"])
    emit("table", doc, columns=["", ""], rows=rows)
    if doc.get("rejectedNodes"):
        emit(
            "table",
            doc,
            columns=["REJECTED BECAUSE", "NODES"],
            rows=[
                [g["reason"], ", ".join(g["nodes"]) + (f" and {g['more']} more" if g["more"] else "")]
                for g in doc["rejectedNodes"]
            ],
        )


def _versus_rows(placement: dict[str, Any]) -> list[list[Any]]:
    """The table's rows for what set the node apart: the runner-up and the margin, then each term
    the two differ on (the node's weighted value minus the runner-up's)."""
    runner_up = placement.get("runnerUp")
    terms = placement.get("scoreTerms") or {}
    if "noRunnerUp" in placement:
        return [["runner-up", f"none: {placement['noRunnerUp']}"]]
    if not runner_up:
        return [[f"score term {term}", value] for term, value in terms.items()]
    rows: list[list[Any]] = [["runner-up", runner_up]]
    if placement.get("margin") is None:
        return rows
    rows.append(["margin", f"{placement['margin']} (this node's score minus {runner_up}'s)"])
    rows.extend([f"score term {term}", f"{value} vs {runner_up}"] for term, value in terms.items())
    if placement.get("moreTerms"):
        rows.append(["score terms not listed", f"{placement['moreTerms']} smaller differences"])
    if not terms:
        rows.append(["score terms", "none differs: a tie the scheduling policy broke"])
    return rows


# A cluster-only view: its kubeconfig error points a workstation user to the jobs' own view.
_WORKSTATION_HINT: Final = (
    "explain reads the cluster (on a workstation: neuronetes jobs describe JOB, once its daemon runs: "
    "neuronetes agent run --workstation)"
)


@click.command(
    "explain",
    short_help="Why a pod runs on its node and GPUs, or why it is Pending.",
    help="Why POD (NAME or NAMESPACE/NAME) runs on its node and GPUs (the extender's reason, the "
    "runner-up node and the score terms that set the node apart from it), or why it is Pending "
    "(each rejected node's reason and kube-scheduler's summary).",
)
@click.argument("pod")
@click.option("-n", "--namespace", default="default", show_default=True)
@KUBECONFIG
@output_option
def explain(pod: str, namespace: str, kubeconfig: str | None, output: str) -> int:
    ns, name = _pod_ref(pod, namespace)
    cluster = Cluster(kubeconfig, fallback=_WORKSTATION_HINT)
    obj = cluster.pod(ns, name)
    uid = (obj.get("metadata") or {}).get("uid")
    events = [
        e
        for e in cluster.events_about("Pod", ns, name)
        if not uid or (e.get("involvedObject") or {}).get("uid") in (None, "", uid)
    ]
    doc = explanation(obj, events)
    if output == "table":
        _print_table(doc)
    else:
        emit(output, doc)
    return 0
