"""Model preloading (``cacheAware.preloadStrategy``): which nodes get a preload Job, what the Job
runs, and what the pool's ``status.cache`` says. Pure; the controller makes the API calls
(`neuronetes_operator.controller`). docs/model-cache.md describes the flow.

One Job per chosen node, pinned to it (``spec.nodeName``: it asks for no GPU, so there is nothing
to schedule), running the pool's image with `FETCH_SCRIPT`, which downloads the model into the
pool's namespace's folder of the node's cache directory (the only host folder it mounts:
`neuronetes.modelcache.namespace_folder`) and writes the completion marker last. The node's agent
then reports ``<namespace>:<model>`` in its GPUNode, and the finished Job is deleted. A failed Job
(or one whose pod was never created: an admission policy refused it) stays `FAILED_BACKOFF_S` (its
node is not tried again meanwhile), then is deleted and its node becomes a candidate again.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import msgspec

from neuronetes import contracts as c
from neuronetes.api.models import CacheAware, ModelCacheStatus, PodTemplate
from neuronetes.modelcache import (
    MARKER,
    choose_preload_nodes,
    directory_name,
    hit_entries,
    namespace_folder,
    selector_matches,
)

from .pods import DEFAULT_CONTAINER

__all__ = [
    "FAILED_BACKOFF_S",
    "FETCH_SCRIPT",
    "MAX_STARTS",
    "NO_POD_S",
    "UNREPORTED_S",
    "PreloadJob",
    "PreloadPlan",
    "plan_preload",
    "preload_job",
    "read_gpunode_page",
    "read_job",
]

MAX_STARTS: Final = 8
"""Preload Jobs one reconcile creates at most (bounded work; the next reconcile goes on)."""
FAILED_BACKOFF_S: Final = 300.0
"""How long a failed preload keeps its node from being tried again."""
UNREPORTED_S: Final = 120.0
"""A Job that succeeded but whose node still does not report the model after this long failed
(the image wrote elsewhere, or no agent reads the directory)."""
NO_POD_S: Final = 30.0
"""A Job still without any pod this long after its creation failed: its pod was refused (Pod
Security ``baseline`` or ``restricted`` refuses the hostPath volume, another admission policy, a
quota). The Job controller says why only in the Job's ``FailedCreate`` Events."""
CACHE_MOUNT: Final = "/neuronetes-model-cache"
"""Where the preload container sees its namespace's folder of the node's cache directory."""
ENV_PRELOAD_MODEL: Final = "NEURONETES_PRELOAD_MODEL"
ENV_PRELOAD_DIR: Final = "NEURONETES_PRELOAD_DIR"
ENV_PRELOAD_MARKER: Final = "NEURONETES_PRELOAD_MARKER"
FETCH_SCRIPT: Final = r"""set -eu
mkdir -p "$NEURONETES_PRELOAD_DIR"
if command -v hf >/dev/null 2>&1; then
  hf download "$NEURONETES_PRELOAD_MODEL" --local-dir "$NEURONETES_PRELOAD_DIR"
elif command -v huggingface-cli >/dev/null 2>&1; then
  huggingface-cli download "$NEURONETES_PRELOAD_MODEL" --local-dir "$NEURONETES_PRELOAD_DIR"
else
  echo "the image has neither hf nor huggingface-cli (huggingface_hub) to fetch the model" >&2
  exit 1
fi
marker="$NEURONETES_PRELOAD_DIR/$NEURONETES_PRELOAD_MARKER"
printf '%s' "$NEURONETES_PRELOAD_MODEL" > "$marker.tmp"
mv "$marker.tmp" "$marker"
"""
"""The preload container's command (``sh -c``): the Hugging Face Hub download of the model id into
its folder, then the marker, written last and atomically (rename), so the agent never reports a
half-downloaded model. The template container's env (e.g. ``HF_TOKEN``, ``HF_ENDPOINT``) is kept."""


@dataclass(frozen=True, slots=True)
class PreloadJob:
    """One of the pool's preload Jobs, as read from the API."""

    name: str
    node: str
    model: str
    state: str
    """``running``, ``succeeded`` or ``failed``."""
    finished_at: datetime | None = None
    created_at: datetime | None = None
    has_pods: bool = True
    """Whether the Job controller has created a pod of it (one active, succeeded or failed)."""


def _time(stamp: Any) -> datetime | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if isinstance(stamp, str) else None


def read_job(job: Mapping[str, Any]) -> PreloadJob:
    """A preload Job's node, model and state (from its conditions: Complete or Failed), when it was
    created and whether any pod of it was."""
    meta = job.get("metadata") or {}
    spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    status = job.get("status") or {}
    state, finished = "running", None
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True" or cond.get("type") not in ("Complete", "Failed"):
            continue
        state = "succeeded" if cond["type"] == "Complete" else "failed"
        finished = _time(cond.get("lastTransitionTime"))
    return PreloadJob(
        name=str(meta.get("name", "")),
        node=str(spec.get("nodeName", "")),
        model=str((meta.get("annotations") or {}).get(c.ANNOTATION_PRELOAD_MODEL, "")),
        state=state,
        finished_at=finished,
        created_at=_time(meta.get("creationTimestamp")),
        has_pods=state != "running" or any(status.get(k) for k in ("active", "succeeded", "failed")),
    )


class _Name(msgspec.Struct):
    name: str = ""


class _Gpu(msgspec.Struct, rename="camel"):
    cached_models: list[str] | None = None


class _Status(msgspec.Struct):
    gpus: list[_Gpu] | None = None


class _GpuNode(msgspec.Struct):
    metadata: _Name = msgspec.field(default_factory=_Name)
    status: _Status | None = None


class _ListMeta(msgspec.Struct):
    continue_: str | None = msgspec.field(default=None, name="continue")


class _GpuNodePage(msgspec.Struct):
    items: list[_GpuNode] | None = None
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


_PAGE = msgspec.json.Decoder(_GpuNodePage)


def read_gpunode_page(data: bytes, out: dict[str, frozenset[str]]) -> str | None:
    """One page of a GPUNode list (raw JSON) into `out`: per node whose agent has reported its GPUs,
    the models it reports cached (any GPU's list; everything else in the objects is skipped, not
    built). Returns the list's continue token (None: the last page)."""
    page = _PAGE.decode(data)
    for gn in page.items or []:
        gpus = gn.status.gpus if gn.status is not None else None
        if gpus:
            out[gn.metadata.name] = frozenset(m for g in gpus for m in g.cached_models or [])
    return page.metadata.continue_ or None


@dataclass(slots=True)
class PreloadPlan:
    """What one reconcile does about preloading."""

    create: list[str] = field(default_factory=list)
    """Nodes to start a preload Job on."""
    delete: list[str] = field(default_factory=list)
    """Jobs to delete (done and reported, failed past the back-off, or for another model)."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    status: ModelCacheStatus | None = None


def _outcome(job: PreloadJob, now: datetime) -> tuple[str, float]:
    """The Job's state for the plan (``running``, ``succeeded``, ``failed`` or ``no-pod``: its pod
    was never created within `NO_POD_S`) and the seconds since it reached it."""
    if job.state != "running":
        return job.state, (now - job.finished_at).total_seconds() if job.finished_at is not None else 0.0
    if job.has_pods or job.created_at is None:
        return "running", 0.0
    waited = (now - job.created_at).total_seconds()
    return ("no-pod", waited - NO_POD_S) if waited >= NO_POD_S else ("running", 0.0)


def _failure(job: PreloadJob, state: str) -> str:
    if state == "succeeded":
        return f"its Job {job.name} succeeded but the node's agent does not report the model"
    if state == "no-pod":
        return (
            f"no pod of its Job {job.name} was created in {NO_POD_S:.0f} s: an admission policy refused it "
            "(Pod Security baseline and restricted refuse its hostPath volume; the Job's FailedCreate "
            "events say which, docs/model-cache.md)"
        )
    return f"its Job {job.name} failed"


def plan_preload(
    cache: CacheAware,
    model: str | None,
    namespace: str,
    nodes: Mapping[str, Mapping[str, Any]],
    cached: Mapping[str, frozenset[str]],
    jobs: Iterable[PreloadJob],
    now: datetime,
    previously_failed: Collection[str] = (),
) -> PreloadPlan:
    """The preload step of one reconcile of a pool of `namespace` (`neuronetes.modelcache.
    choose_preload_nodes` picks the nodes): candidates are the nodes matching ``nodes.labelSelector``
    that have a GPUNode (an agent that can report the model); a node caches the model for the pool
    when it reports it shared or in `namespace` (`neuronetes.modelcache.hit_entries`), never in
    another namespace. Events are said once per outcome: a node cached when its Job is deleted, a
    failure when its node first appears among the failed (`previously_failed`: the last status's)."""
    strategy = cache.preload_strategy
    out = PreloadPlan()
    jobs = list(jobs)
    if not cache.enabled or strategy is None or model is None or directory_name(model) is None:
        out.delete = [j.name for j in jobs]  # preloading off, or nothing to preload
        return out
    want = strategy.min_cached_replicas or 0
    selector = strategy.nodes.label_selector if strategy.nodes is not None else None
    chosen = msgspec_selector(selector)
    candidates = [
        name
        for name, node in nodes.items()
        if name in cached and selector_matches(chosen, (node.get("metadata") or {}).get("labels") or {})
    ]
    hits = hit_entries(model, namespace)
    have = {n for n in candidates if not cached[n].isdisjoint(hits)}
    preloading: set[str] = set()
    failed: set[str] = set()
    refused = False
    for job in jobs:
        state, age = _outcome(job, now)
        if job.model != model or job.node not in nodes:
            out.delete.append(job.name)  # the served model changed, or the node went away
        elif job.node in have:
            out.delete.append(job.name)
            out.events.append(("Normal", "ModelPreloaded", f"node {job.node} caches {model}"))
        elif state == "running" or (state == "succeeded" and age < UNREPORTED_S):
            preloading.add(job.node)
        elif age >= FAILED_BACKOFF_S:
            out.delete.append(job.name)  # its node may be tried again
        else:
            failed.add(job.node)
            refused = refused or state == "no-pod"
            if job.node in previously_failed:
                continue
            why = _failure(job, state)
            out.events.append(("Warning", "PreloadFailed", f"preloading {model} on node {job.node}: {why}"))
    choice = choose_preload_nodes(candidates, have, preloading, failed, want, max_start=MAX_STARTS)
    out.create = list(choice.start)
    said = []
    if choice.missing:
        said.append(
            f"{len(choice.cached)} of {want} nodes cache {model}: {choice.missing} more selected node(s) "
            "with a node agent are needed (nodes whose preload failed are tried again after "
            f"{FAILED_BACKOFF_S:.0f} s)"
        )
    if refused:
        said.append(
            f"preload pods were refused in namespace {namespace}: its Pod Security level (baseline or "
            "restricted) or another admission policy refuses their hostPath volume (docs/model-cache.md)"
        )
    message = "; ".join(said) or None
    out.status = ModelCacheStatus(
        model=model,
        wanted=want,
        cached_nodes=sorted(choice.cached)[:256],
        preloading=sorted(preloading | set(choice.start))[:256],
        failed=sorted(failed)[:256],
        message=message,
    )
    return out


def msgspec_selector(selector: Any) -> dict[str, Any] | None:
    """A decoded ``LabelSelector`` as the Kubernetes JSON `selector_matches` reads."""
    if selector is None:
        return None
    return {
        "matchLabels": dict(selector.match_labels or {}),
        "matchExpressions": [
            {"key": e.key, "operator": e.operator, "values": list(e.values or [])}
            for e in selector.match_expressions or []
        ],
    }


def job_name(pool: str, node: str) -> str:
    """The Job of `pool` on `node`: stable, at most 63 characters (a Job's pods' label limit)."""
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{pool[:40].rstrip('-.')}-preload-{digest}"


def preload_job(
    pool: Mapping[str, Any],
    node: str,
    model: str,
    template: PodTemplate | None,
    tolerations: list[dict[str, Any]],
    cache_dir: str,
) -> dict[str, Any]:
    """The preload Job of `model` on `node` for `pool` (owned by the pool, so it goes with it). Its
    one host volume is the pool's namespace's folder of the cache directory `cache_dir`
    (`neuronetes.modelcache.namespace_folder`): neither the shared models nor another namespace's
    are reachable from the pool's image."""
    meta = pool["metadata"]
    folder = directory_name(model)
    assert folder is not None, "plan_preload plans no preload of a model without a folder"
    tpl = dict(template.spec or {}) if template is not None else {}
    first = dict((tpl.get("containers") or [DEFAULT_CONTAINER])[0])
    env = [e for e in first.get("env") or [] if not str(e.get("name", "")).startswith("NEURONETES_")]
    env += [
        {"name": ENV_PRELOAD_MODEL, "value": model},
        {"name": ENV_PRELOAD_DIR, "value": f"{CACHE_MOUNT}/{folder}"},
        {"name": ENV_PRELOAD_MARKER, "value": MARKER},
    ]
    container: dict[str, Any] = {
        "name": "preload",
        "image": first.get("image", DEFAULT_CONTAINER["image"]),
        "command": ["sh", "-c", FETCH_SCRIPT],
        "env": env,
        "volumeMounts": [{"name": "model-cache", "mountPath": CACHE_MOUNT}],
    }
    for key in ("envFrom", "imagePullPolicy"):
        if key in first:
            container[key] = copy.deepcopy(first[key])
    labels = {c.LABEL_PRELOAD_POOL: meta["name"]}
    annotations = {c.ANNOTATION_PRELOAD_MODEL: model}
    pod_spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [
            {
                "name": "model-cache",
                "hostPath": {
                    "path": namespace_folder(cache_dir, meta["namespace"]),
                    "type": "DirectoryOrCreate",
                },
            }
        ],
        "tolerations": [*copy.deepcopy(tpl.get("tolerations") or []), *copy.deepcopy(tolerations)],
    }
    for key in ("serviceAccountName", "imagePullSecrets"):
        if key in tpl:
            pod_spec[key] = copy.deepcopy(tpl[key])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(meta["name"], node),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": pool.get("apiVersion", c.API_VERSION),
                    "kind": "AgentPool",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": 3600,
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec},
        },
    }
