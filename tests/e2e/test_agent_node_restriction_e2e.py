"""One agent, one node: the chart's node restriction of the agent against the real API server.

A cluster of its own in chart mode (``helm install`` of the chart, its pods run by the chart
runner, as in test_helm_e2e.py) with two simulated GPU nodes, A and B, and an agent pod on each.
The agent of node A acts with exactly the credentials its pod has: the token the chart runner
requested for it, bound to the pod (and so to node A) as the kubelet's projected token is. With
them it may write node A's labels and capacity, its GPUNode, Events about it and about a pod bound to
it, and evict such a pod; the same writes for node B are refused by the policy
``neuronetes.io-agent-writes-only-its-node`` (or, for a pod's eviction and Events, the webhooks
``evictions.neuronetes.io`` and ``events.neuronetes.io``) with a message naming both nodes.
The agent fleet that serves both nodes runs as a ServiceAccount of its own and is not restricted.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import own_cluster, run_documented_policy_wait, wait_until, wait_until_policies_enforced
from pod_builder import manifest

from neuronetes import contracts as c
from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.api import Api, ApiError
from neuronetes.devcluster.chartmode import ChartOps, ChartRelease

pytestmark = pytest.mark.e2e

NS = "neuronetes-system"
AGENT = f"system:serviceaccount:{NS}:neuronetes-agent"
VICTIMS = "victims"
GPUNODES = f"/apis/{c.GROUP}/{c.VERSION}/gpunodes"
MERGE = "application/merge-patch+json"
POLICY = "neuronetes.io-agent-writes-only-its-node"


@pytest.fixture(scope="module")
def dev(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    with own_cluster(request, f"agent-node-e2e-{os.getpid()}", chart=ChartRelease()) as cluster:
        # The install waited for the chart's policies; the tests rely on them, so say so here too.
        wait_until_policies_enforced(cluster, ChartOps(cluster).policy_probes())
        yield cluster


@pytest.fixture(scope="module")
def ops(dev: DevCluster) -> ChartOps:
    return ChartOps(dev)


@pytest.fixture(scope="module")
def nodes(dev: DevCluster, ops: ChartOps) -> tuple[str, str]:
    """Nodes A and B, each with its agent pod; the fleet serves both; a pod bound to each."""
    a, b = dev.add_nodes("dgx-a100-80gb", 2, "gpu")
    wait_until(
        lambda: (f := ops.runner_state()["fleet"]) and f["nodes"] == [a, b] and f["pid"],
        timeout=60,
        what="the agent fleet over both nodes",
    )
    for node in (a, b):
        wait_until(
            functools.partial(_gpus, dev, node), timeout=60, what=f"the fleet's GPUNode status of {node}"
        )
    dev.kubectl("create", "namespace", VICTIMS)
    for name, node in (("on-a", a), ("on-b", b)):
        dev.kubectl("create", "-f", "-", input=json.dumps(manifest(name, namespace=VICTIMS, node=node)))
        # Pods in `default`, the one namespace the agent's Role lets it record Events in.
        dev.kubectl("create", "-f", "-", input=json.dumps(manifest(name, node=node)))
    return a, b


def _gpus(dev: DevCluster, node: str) -> list[Any]:
    try:
        return list(get(dev, f"{GPUNODES}/{node}").get("status", {}).get("gpus") or [])
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise


def agent_token(ops: ChartOps, node: str) -> str:
    """The token the chart runner gave the agent pod on `node` (its projected token)."""
    (run,) = [r for r in ops.runner_state()["pods"].values() if r["agentOf"] == [node]]
    return (Path(run["root"]) / "serviceaccount" / "token").read_text()


def api_as(dev: DevCluster, token: str) -> Api:
    return Api(dev.api().server, token, dev.ca_file)


@pytest.fixture
def agent(dev: DevCluster, ops: ChartOps, nodes: tuple[str, str]) -> Api:
    """A client with exactly the credentials of the agent pod on node A."""
    return api_as(dev, agent_token(ops, nodes[0]))


def get(dev: DevCluster, path: str) -> Any:
    return dev.api().request("GET", path)


def refused(write: Callable[[], object]) -> str:
    with pytest.raises(ApiError) as err:
        write()
    assert err.value.status == 403, err.value
    return str(err.value)


def node_event(node: str) -> dict[str, Any]:
    """An Event about `node`, as the agent records it (`Kube.node_event`)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
        "reason": "GPUHealthy",
        "message": "e2e",
        "type": "Normal",
        "source": {"component": "neuronetes-agent", "host": node},
    }


def eviction(name: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": VICTIMS}}


def test_the_agents_credentials_carry_its_node(
    dev: DevCluster, ops: ChartOps, nodes: tuple[str, str]
) -> None:
    a, _ = nodes
    review = json.loads(dev.kubectl(f"--token={agent_token(ops, a)}", "auth", "whoami", "-o", "json").stdout)
    user = review["status"]["userInfo"]
    assert user["username"] == AGENT
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [a]
    pods = get(dev, f"/api/v1/namespaces/{NS}/pods?labelSelector=app.kubernetes.io/component%3Dagent")[
        "items"
    ]
    (pod,) = [p for p in pods if p["spec"]["nodeName"] == a]
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == [pod["metadata"]["name"]]


WRITES: dict[str, Callable[[Api, str], object]] = {
    "node labels": lambda api, node: api.request(
        "PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {c.LABEL_GPU_TYPE: "e2e"}}},
        content_type=MERGE,
    ),
    "node capacity": lambda api, node: api.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": {"capacity": {c.RESOURCE_GPU: "7"}, "allocatable": {c.RESOURCE_GPU: "7"}}},
        content_type=MERGE,
    ),
    "GPUNode annotations": lambda api, node: api.request(
        "PATCH",
        f"{GPUNODES}/{node}",
        {"metadata": {"annotations": {f"{c.GROUP}/request-e2e": None}}},
        content_type=MERGE,
    ),
    "GPUNode status": lambda api, node: api.request(
        "PATCH", f"{GPUNODES}/{node}/status", {"status": {"lastHeartbeatTime": "2026-01-01T00:00:00Z"}},
        content_type=MERGE,
    ),
    "Event": lambda api, node: api.request("POST", "/api/v1/namespaces/default/events", node_event(node)),
}  # fmt: skip


@pytest.mark.parametrize("what", list(WRITES))
def test_the_agent_of_node_a_writes_node_a_but_not_node_b(
    agent: Api, nodes: tuple[str, str], what: str
) -> None:
    a, b = nodes
    message = refused(lambda: WRITES[what](agent, b))
    assert POLICY in message, message
    assert f"the NeuroNetes agent of node {a} ({AGENT}) may write only its own node's objects" in message
    assert f"(node {b})" in message
    WRITES[what](agent, a)  # its own node: allowed


def test_the_agent_of_node_a_evicts_pods_of_node_a_only(
    dev: DevCluster, agent: Api, nodes: tuple[str, str]
) -> None:
    a, b = nodes
    path = f"/api/v1/namespaces/{VICTIMS}/pods/{{}}/eviction"
    message = refused(lambda: agent.request("POST", path.format("on-b"), eviction("on-b")))
    assert 'admission webhook "evictions.neuronetes.io" denied the request' in message
    assert f"agent of node {a} ({AGENT}) may evict only pods bound to node {a}" in message
    assert f"pod {VICTIMS}/on-b is bound to node {b}" in message
    assert get(dev, f"/api/v1/namespaces/{VICTIMS}/pods/on-b")["spec"]["nodeName"] == b
    agent.request("POST", path.format("on-a"), eviction("on-a"))  # a pod of its own node: evicted

    def deleted() -> bool:
        try:
            return bool(
                get(dev, f"/api/v1/namespaces/{VICTIMS}/pods/on-a")["metadata"].get("deletionTimestamp")
            )
        except ApiError as exc:
            return exc.status == 404

    wait_until(deleted, timeout=10, what="the evicted pod to be deleted")


def test_the_agent_of_node_a_records_events_about_pods_of_node_a_only(
    dev: DevCluster, agent: Api, nodes: tuple[str, str]
) -> None:
    a, b = nodes

    def pod_event(name: str) -> dict[str, Any]:
        uid = get(dev, f"/api/v1/namespaces/default/pods/{name}")["metadata"]["uid"]
        about = {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": name, "uid": uid}
        return {**node_event(a), "metadata": {"generateName": f"{name}.", "namespace": "default"},
                "involvedObject": about}  # fmt: skip

    events = "/api/v1/namespaces/default/events"
    message = refused(lambda: agent.request("POST", events, pod_event("on-b")))
    assert 'admission webhook "events.neuronetes.io" denied the request' in message
    assert f"agent of node {a} ({AGENT}) may record Events about only pods bound to node {a}" in message
    assert f"pod default/on-b is bound to node {b}" in message
    agent.request("POST", events, pod_event("on-a"))  # a pod of its own node


def test_on_its_own_node_the_agent_changes_only_what_it_owns(
    dev: DevCluster, agent: Api, nodes: tuple[str, str]
) -> None:
    a, _ = nodes
    node = f"/api/v1/nodes/{a}"
    label = refused(
        lambda: agent.request("PATCH", node, {"metadata": {"labels": {"team": "x"}}}, content_type=MERGE)
    )
    assert (
        f"may change only its GPU labels ({c.LABEL_GPU_TYPE}" in label and f"of Node {a}, not team" in label
    )
    taint = {"spec": {"taints": [{"key": "e2e", "value": "x", "effect": "NoSchedule"}]}}
    assert "the spec (taints, unschedulable)" in refused(
        lambda: agent.request("PATCH", node, taint, content_type=MERGE)
    )
    cpu = {"status": {"capacity": {"cpu": "1"}}}
    assert f"allocatable of Node {a}, not cpu" in refused(
        lambda: agent.request("PATCH", f"{node}/status", cpu, content_type=MERGE)
    )
    cordon = {"spec": {"cordonedGPUs": ["GPU-e2e"]}}
    assert f"GPUNode {a} (an administrator's)" in refused(
        lambda: agent.request("PATCH", f"{GPUNODES}/{a}", cordon, content_type=MERGE)
    )
    assert not get(dev, f"{GPUNODES}/{a}").get("spec", {}).get("cordonedGPUs")


def test_a_token_of_the_agent_that_names_no_node_writes_nothing(
    dev: DevCluster, nodes: tuple[str, str]
) -> None:
    a, _ = nodes
    unbound = api_as(dev, dev.kubectl("create", "token", "neuronetes-agent", "-n", NS).stdout.strip())
    message = refused(lambda: WRITES["node labels"](unbound, a))
    assert (
        f"{AGENT} may write Node {a} only with credentials that name its node, and these name none" in message
    )
    pod = f"/api/v1/namespaces/{VICTIMS}/pods/on-b/eviction"
    assert "these name none" in refused(lambda: unbound.request("POST", pod, eviction("on-b")))


def test_the_fleet_serves_both_nodes_as_an_identity_of_its_own(
    dev: DevCluster, ops: ChartOps, nodes: tuple[str, str]
) -> None:
    fleet = ops.runner_state()["fleet"]
    assert fleet["serviceAccount"] == f"{NS}/neuronetes-agent-fleet"
    kubeconfig = ops.runner_root / "fleet" / "kubeconfig"
    review = json.loads(dev.kubectl(f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json").stdout)
    assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{NS}:neuronetes-agent-fleet"
    # It published both nodes (its writes passed: the fixture waited for each GPUNode's status).
    assert [len(_gpus(dev, node)) for node in nodes] == [8, 8]
    log = Path(fleet["log"]).read_text()
    assert "403" not in log, log[-2000:]
    # Its bindings are the agent's, copied (and owned by what they copy).
    crb = get(dev, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/neuronetes:agent:fleet")
    assert crb["roleRef"]["name"] == "neuronetes:agent"
    assert crb["metadata"]["ownerReferences"][0]["name"] == "neuronetes:agent"


def test_the_documented_kubectl_probe_finds_the_charts_policies_enforced(dev: DevCluster) -> None:
    """docs/webhook.md's block for platform teams, as written, after ``helm install``: the chart's
    webhook answers the preset-nodeName probe first, and its refusal counts."""
    done = run_documented_policy_wait(dev)
    assert done.returncode == 0, done.stderr
