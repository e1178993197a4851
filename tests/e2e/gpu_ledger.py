"""The ledger check of the cluster-level e2e tests, on what the API says was bound.

`no_gpu_given_twice` reads bound pods the way a user would (``spec.nodeName`` and the
``neuronetes.io/assigned-gpus`` annotation, decoded with `neuronetes.contracts.decode_assignment`)
and reports every GPU given twice: an exclusive GPU shared with another pod, shares of one GPU
over its memory or 100 % compute, a MIG slice given twice or a MIG GPU also given whole.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from neuronetes import contracts as c
from neuronetes.profiles import LABEL_PROFILE, profile


def gpu_memory_of(nodes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """MiB per GPU of each simulated node (from its profile label)."""
    out = {}
    for node in nodes:
        name = (node["metadata"].get("labels") or {}).get(LABEL_PROFILE)
        if name:
            out[node["metadata"]["name"]] = profile(name).gpu_memory_mib
    return out


def no_gpu_given_twice(pods: Iterable[Mapping[str, Any]], gpu_memory: Mapping[str, int]) -> list[str]:
    """Every way the bound `pods` over-commit a GPU (empty: none)."""
    # (node, GPU uuid) -> pod -> (exclusive, memory MiB, compute %, MIG slices)
    grants: dict[tuple[str, str], dict[str, tuple[bool, int, int, set[int]]]] = defaultdict(dict)
    problems: list[str] = []
    for pod in pods:
        node = pod["spec"].get("nodeName")
        raw = (pod["metadata"].get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        if not node or raw is None:
            continue
        name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        doc = c.decode_assignment(raw)
        if doc.node != node:
            problems.append(f"{name}: bound to {node}, assignment names {doc.node}")
        for ctr in doc.containers.values():  # containers of one pod may reuse a GPU (init, then main)
            for g in ctr.gpus:
                excl, mem, cpu, mig = grants[(node, g.uuid)].get(name, (False, 0, 0, set()))
                if g.mig_start is not None:
                    mig = mig | {g.mig_start}
                elif g.compute_percent >= 100:
                    excl = True
                else:
                    mem, cpu = max(mem, g.memory_mib or 0), max(cpu, g.compute_percent)
                grants[(node, g.uuid)][name] = (excl, mem, cpu, mig)
    for (node, uuid), by_pod in grants.items():
        where = f"{node} GPU {uuid}"
        if any(g[0] for g in by_pod.values()) and len(by_pod) > 1:
            problems.append(f"{where}: exclusive, yet given to {sorted(by_pod)}")
        slices = [s for g in by_pod.values() for s in g[3]]
        if len(slices) != len(set(slices)):
            problems.append(f"{where}: a MIG slice given twice among {sorted(by_pod)}")
        if slices and any(not g[3] for g in by_pod.values()):
            problems.append(f"{where}: MIG slices and whole/shared grants at once: {sorted(by_pod)}")
        compute = sum(g[2] for g in by_pod.values())
        memory = sum(g[1] for g in by_pod.values())
        if compute > 100 or memory > gpu_memory.get(node, memory):
            problems.append(f"{where}: shares over the GPU ({compute} %, {memory} MiB): {sorted(by_pod)}")
    return problems
