"""The operator's policy e2e modules' common setup: an extender of their own, a namespace, their
nodes, and the operator and webhook as processes (`LocalStack`) — and all of it undone.

The cluster is shared by every e2e module: nodes a module adds are deleted when it ends (later
modules place GPU pods on their own nodes, and a budget prices a pod by every node it may land on),
and the cluster's extender is set back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from e2e_cluster import E2ECluster
from extender_harness import ExtenderProcess

from neuronetes.devcluster import ExtenderConfig
from neuronetes.devcluster.localstack import LocalStack

__all__ = ["OperatorStack", "operator_stack"]


class OperatorStack:
    """What `operator_stack` set up: the operator and webhook (`local`), the extender, the nodes."""

    def __init__(self, cluster: E2ECluster, local: LocalStack, extender: ExtenderProcess) -> None:
        self.cluster, self.local, self.extender = cluster, local, extender
        self.nodes: list[str] = []

    def add_nodes(self, profile: str, count: int, prefix: str, **kwargs: Any) -> list[str]:
        """`E2ECluster.add_nodes`, deleted when the stack ends."""
        added = self.cluster.add_nodes(profile, count, prefix, **kwargs)
        self.nodes += added
        return added


@contextmanager
def operator_stack(
    cluster: E2ECluster,
    work: Path,
    namespace: str,
    *,
    settings: dict[str, Any],
    extender_args: Sequence[str] = (),
    prepare: Callable[[], object] | None = None,
    log_lines: int = 30,
    **local: Any,
) -> Iterator[OperatorStack]:
    """`namespace`, then `prepare` (what the extender reads at start, e.g. its ConfigMap), an
    extender (`extender_args`) set as the cluster's, and `LocalStack` with the operator `settings`
    (`local`: its other keywords), not started: the caller adds its nodes and objects, then starts
    it (`OperatorStack.local.start`). On the way out: the namespace and the stack's nodes are
    deleted, the processes stopped, their logs' tails printed."""
    cluster.kubectl("create", "namespace", namespace)
    if prepare is not None:
        prepare()
    ext = ExtenderProcess(cluster.extender_kubeconfig, work, extra_args=list(extender_args))
    ext.start()
    cluster.set_extender(ExtenderConfig(url=ext.url, weight=20))
    local_stack = LocalStack(cluster.kubeconfig, work / "stack", cluster.kubectl, settings=settings, **local)
    stack = OperatorStack(cluster, local_stack, ext)
    try:
        yield stack
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        if stack.nodes:
            cluster.kubectl("delete", "node", *stack.nodes, "--wait=false", check=False)
            cluster.kubectl("delete", "gpunode", *stack.nodes, "--wait=false", check=False)
        stack.local.stop()
        cluster.set_extender(ExtenderConfig.from_env())
        ext.stop()
        for proc in (stack.local.operator, *stack.local.webhooks):
            print(f"--- {proc.name} log ---\n{proc.tail(log_lines)}")
