"""The Helm chart on the local control plane: install, run, schedule, upgrade, uninstall.

A cluster of its own in chart mode (`neuronetes.devcluster.chartmode`): ``helm install`` of
``helm/neuronetes`` with ``hack/local-values.yaml``, the chart's pods scheduled onto kwok nodes,
their containers run by the chart runner as host processes with the configuration the chart
rendered. The tests run in order on one release.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from apitools import seed_examples
from e2e_cluster import own_cluster, wait_until

from neuronetes import contracts as c
from neuronetes.devcluster import DevCluster
from neuronetes.devcluster.chartmode import SYSTEM_NODE, ChartOps, ChartRelease
from neuronetes.devcluster.podplan import Credentials, Entrypoints, automounts_token, plan_pod
from neuronetes.profiles import KWOK_ANNOTATION

pytestmark = pytest.mark.e2e

NS = "neuronetes-system"
POOLS = ("tensor-parallel-pool", "small-model-pool")
COMPONENTS = {"gpu-scheduler": 2, "neuronetes-webhook": 2, "neuronetes-operator": 1}


@pytest.fixture(scope="module")
def dev(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    with own_cluster(request, f"helm-e2e-{os.getpid()}", chart=ChartRelease()) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def ops(dev: DevCluster) -> ChartOps:
    return ChartOps(dev)


def get(dev: DevCluster, *args: str) -> Any:
    return json.loads(dev.kubectl("get", "-o", "json", *args).stdout)


def release_pods(dev: DevCluster) -> list[dict[str, Any]]:
    items = get(dev, "pods", "-n", NS, "-l", "app.kubernetes.io/instance=neuronetes")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def cmdline(pid: int) -> tuple[str, ...]:
    return tuple(Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0"))


def test_install_is_accepted_and_its_workloads_land_on_kwok_nodes(dev: DevCluster, ops: ChartOps) -> None:
    status = json.loads(ops.helm("status", "neuronetes", "-n", NS, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    for name, replicas in COMPONENTS.items():
        deploy = get(dev, "deployment", name, "-n", NS)
        assert deploy["status"].get("readyReplicas") == replicas, name
    pods = release_pods(dev)
    assert len(pods) == sum(COMPONENTS.values())
    system = get(dev, "node", SYSTEM_NODE)
    assert system["metadata"]["annotations"][KWOK_ANNOTATION[0]] == KWOK_ANNOTATION[1]
    assert not system["spec"].get("taints")
    for pod in pods:
        assert pod["spec"]["nodeName"] == SYSTEM_NODE and pod["status"]["phase"] == "Running"
    # The CRDs and the admission policies came with the chart.
    assert get(dev, "crd", "agentpools.neuronetes.io")["status"]["acceptedNames"]["kind"] == "AgentPool"
    policies = get(dev, "validatingadmissionpolicies")["items"]
    assert {p["metadata"]["name"] for p in policies} >= {"neuronetes.io-gpu-pods-are-scheduled"}


def test_components_run_as_host_processes_with_the_rendered_configuration(
    dev: DevCluster, ops: ChartOps
) -> None:
    state = ops.runner_state()
    entry = Entrypoints.for_host(dev.tools.kube_scheduler)
    net = int(dev.store.running().chart["net"])  # type: ignore[index]
    ca = dev.ca_file.read_bytes()
    for pod in release_pods(dev):
        meta = pod["metadata"]
        run = state["pods"][meta["uid"]]
        sa = get(dev, "serviceaccount", pod["spec"]["serviceAccountName"], "-n", NS)
        token_file = Path(run["root"]) / "serviceaccount" / "token"
        creds = (
            Credentials(dev.api().server, ca, token_file.read_text()) if automounts_token(pod, sa) else None
        )
        plan = plan_pod(
            pod,
            config_maps={o["metadata"]["name"]: o for o in get(dev, "configmaps", "-n", NS)["items"]},
            secrets={o["metadata"]["name"]: o for o in get(dev, "secrets", "-n", NS)["items"]},
            credentials=creds,
            entrypoints=entry,
            root=Path(run["root"]),
            node_root=Path(run["root"]).parents[1] / "nodes" / pod["spec"]["nodeName"],
            base_env={},
            net=net,
        )
        # Every container runs, with exactly the planned command line (the rendered one, mapped).
        assert set(run["containers"]) == {ctr.name for ctr in plan.containers}, meta["name"]
        for ctr in plan.containers:
            assert cmdline(run["containers"][ctr.name]["pid"]) == ctr.argv
        # The volumes hold the rendered ConfigMaps and Secrets.
        for f in plan.files:
            assert f.path.read_bytes() == f.content, f.path
        # The process's identity is the pod's ServiceAccount (webhook pods get no token at all).
        if creds is None:
            assert not token_file.exists()
            continue
        review = json.loads(dev.kubectl(f"--token={creds.token}", "auth", "whoami", "-o", "json").stdout)
        user = review["status"]["userInfo"]
        assert user["username"] == f"system:serviceaccount:{NS}:{pod['spec']['serviceAccountName']}"
        assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [meta["uid"]]
    # The guide's `kubectl logs` works: the API server asks the node's "kubelet", the runner answers.
    logs = dev.kubectl("logs", "-n", NS, "deployment/gpu-scheduler", "-c", "extender").stdout
    assert "neuronetes_extender" in logs and "=== " not in logs
    # The settings the extenders read are the chart's values.
    settings = get(dev, "configmap", "neuronetes-extender-settings", "-n", NS)["data"]["settings.yaml"]
    assert msgspec.yaml.decode(settings)["filterTopK"] == 3


def test_an_agentpool_from_the_guide_is_scheduled_through_the_chart(dev: DevCluster, ops: ChartOps) -> None:
    dev.add_nodes("dgx-a100-80gb", 2, "dgx")
    dev.add_nodes("a100-40gb-mig", 1, "mig")
    wait_until(lambda: len(get(dev, "gpunodes")["items"]) == 3, timeout=60, what="the agent's GPUNodes")
    # One agent process in fleet mode serves exactly the nodes that have an agent pod.
    fleet = wait_until(
        lambda: (
            (f := ops.runner_state()["fleet"])
            and f["nodes"] == ["dgx-0", "dgx-1", "mig-0"]
            and f["pid"]
            and f
        ),
        timeout=30,
        what="the agent fleet over the three GPU nodes",
    )
    assert "--simulate-nodes" in fleet["argv"] and "--node" not in " ".join(fleet["argv"]).split("=")[0]
    dev.kubectl("create", "namespace", "pools")
    for example in seed_examples():
        if example.obj["kind"] == "AgentPool" and example.obj["metadata"]["name"] in POOLS:
            dev.kubectl("apply", "-n", "pools", "-f", "-", input=example.text)

    def bound() -> list[dict[str, Any]] | None:
        pods = get(dev, "pods", "-n", "pools")["items"]
        ok = [p for p in pods if p["spec"].get("nodeName") and p["status"].get("phase") == "Running"]
        # Every pool has its pods (the operator creates one pool's after another's), all Running.
        pools = {(p["metadata"].get("labels") or {}).get("neuronetes.io/pool") for p in pods}
        return pods if pools >= set(POOLS) and len(ok) == len(pods) else None

    pods = wait_until(bound, timeout=120, what="the pools' pods Bound and Running")
    for pod in pods:
        assert c.ANNOTATION_ASSIGNED_GPUS in pod["metadata"]["annotations"], pod["metadata"]["name"]
    tp = [p for p in pods if p["metadata"]["name"].startswith("tensor-parallel-pool")]
    assert tp and all(p["spec"]["nodeName"].startswith("dgx-") for p in tp)
    # The pods went through the chart's webhook (the API server called it through the egress proxy).
    metrics = dev.kubectl("get", "--raw", "/metrics").stdout
    calls = [
        line for line in metrics.splitlines()
        if line.startswith("apiserver_admission_webhook_admission_duration_seconds_count")
        and 'name="pods.neuronetes.io"' in line and 'rejected="false"' in line
    ]  # fmt: skip
    assert calls and sum(float(line.split()[-1]) for line in calls) >= len(pods)
    dev.kubectl("delete", "namespace", "pools", "--wait=true", "--timeout=60s")


def test_the_charts_priority_tiers_and_gpu_quota_hold_under_its_own_rbac(
    dev: DevCluster, ops: ChartOps
) -> None:
    """The chart creates the tiers' PriorityClasses (the operator may create none) and its webhook
    refuses a pool above its namespace's tiers; it lists a namespace's ResourceQuotas, GPUSlices and
    pods with its own ServiceAccount to hold slices to the quota (docs/rbac.md)."""
    classes = {
        o["metadata"]["name"]: (o["value"], o["preemptionPolicy"])
        for o in get(dev, "priorityclasses")["items"]
        if o["metadata"]["name"].startswith("neuronetes-")
    }
    assert classes == {
        "neuronetes-default": (0, "Never"),
        "neuronetes-high": (1000, "PreemptLowerPriority"),
        "neuronetes-high-nopreempt": (1000, "Never"),
        "neuronetes-critical": (1000000, "PreemptLowerPriority"),
        "neuronetes-critical-nopreempt": (1000000, "Never"),
    }
    operator = f"--as=system:serviceaccount:{NS}:neuronetes-operator"
    assert (
        dev.kubectl("auth", "can-i", "create", "priorityclasses", operator, check=False).stdout.strip()
        == "no"
    )
    dev.kubectl("create", "namespace", "tenants")
    pool = {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": "greedy", "namespace": "tenants"},
        "spec": {"scheduling": {"priority": 1000}},
    }
    refused = dev.kubectl("create", "-f", "-", input=json.dumps(pool), check=False)
    assert "spec.scheduling.priority: 1000 maps to priority tier high" in refused.stderr, refused.stderr
    hard = {f"requests.{c.RESOURCE_GPU_MEMORY}": "1024"}
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": "tenants"}}
    dev.kubectl("create", "-f", "-", input=json.dumps({**quota, "spec": {"hard": hard}}))

    def gpu_slice(memory: str) -> str:
        body = {"apiVersion": "neuronetes.io/v1alpha1", "kind": "GPUSlice", "metadata": {"name": "s"}}
        return json.dumps({**body, "spec": {"memory": memory, "computePercent": 10}})

    create = ("create", "--dry-run=server", "-n", "tenants", "-f", "-")
    refused = dev.kubectl(*create, input=gpu_slice("2Gi"), check=False)
    assert "would exceed ResourceQuota gpu" in refused.stderr and "used 0, hard 1024" in refused.stderr, (
        refused.stderr
    )
    assert dev.kubectl(*create, input=gpu_slice("512Mi"), check=False).returncode == 0
    dev.kubectl("delete", "namespace", "tenants", "--wait=false")


BIG_POOL = """\
apiVersion: neuronetes.io/v1alpha1
kind: AgentPool
metadata:
  name: big
  namespace: default
spec:
  replicas: 2000
"""


def test_the_chart_value_agentpools_maxreplicas_sets_the_replica_maximum(
    dev: DevCluster, ops: ChartOps
) -> None:
    def create() -> Any:
        return dev.kubectl("create", "--dry-run=server", "-f", "-", input=BIG_POOL, check=False)

    refused = create()
    assert refused.returncode != 0 and "spec.replicas: 2000 is more than 1024," in refused.stderr
    ops.upgrade("--set", "agentPools.maxReplicas=2048")
    wait_until(lambda: create().returncode == 0, timeout=30, what="a pool of 2000 replicas admitted")
    refused = dev.kubectl(
        "create", "--dry-run=server", "-f", "-", input=BIG_POOL.replace("2000", "4097"), check=False
    )
    assert refused.returncode != 0 and "less than or equal to 4096" in refused.stderr  # the CRD's bound


def _extender_logs(ops: ChartOps) -> dict[str, str]:
    state = ops.runner_state()
    return {
        run["name"]: Path(run["containers"]["extender"]["log"]).read_text()
        for run in state["pods"].values()
        if "extender" in run["containers"]
    }


def test_helm_upgrade_with_new_weights_takes_effect(dev: DevCluster, ops: ChartOps) -> None:
    before = {run["name"]: run for run in ops.runner_state()["pods"].values()}
    # The extender's settings are hot-reloaded: the same processes load the new weights.
    weights = ("--set-json", 'scheduler.extender.settings.weights={"availability": 0.9}')
    ops.upgrade(*weights)
    wait_until(
        lambda: all("reloaded" in t and "'availability': 0.9" in t for t in _extender_logs(ops).values()),
        timeout=30,
        what="every extender reloading the new weights",
    )  # fmt: skip
    after = {run["name"]: run for run in ops.runner_state()["pods"].values()}
    assert set(after) == set(before)
    # kube-scheduler reads its configuration once: a new extender weight rolls the gpu-scheduler pods.
    ops.upgrade(*weights, "--set", "scheduler.kubeScheduler.extenderWeight=7")
    rolled = {run["name"]: run for run in ops.runner_state()["pods"].values()}
    old = {n for n in before if n.startswith("gpu-scheduler-")}
    new = {n for n in rolled if n.startswith("gpu-scheduler-")}
    assert len(new) == 2 and not old & new
    for name in new:
        run = rolled[name]
        config = Path(run["root"]) / "volumes" / "scheduler-config" / "config.yaml"
        doc = msgspec.yaml.decode(config.read_bytes())
        assert doc["extenders"][0]["weight"] == 7
        assert doc["extenders"][0]["urlPrefix"] == f"http://{run['address']}:8888"
    for name in old:
        for ctr in before[name]["containers"].values():
            assert not Path(f"/proc/{ctr['pid']}").exists() or cmdline(ctr["pid"]) != tuple(ctr["argv"])


def test_helm_uninstall_leaves_nothing_but_the_crds(dev: DevCluster, ops: ChartOps) -> None:
    pids = [
        ctr["pid"] for run in ops.runner_state()["pods"].values() for ctr in run["containers"].values()
    ] + [ops.runner_state()["fleet"]["pid"]]
    ops.uninstall()
    assert ops.leftovers() == []
    wait_until(lambda: not ops.runner_state()["pods"] and ops.runner_state()["fleet"] is None, timeout=30,
               what="the runner to stop every pod's processes")  # fmt: skip
    time.sleep(0.5)
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == []
    crds = {o["metadata"]["name"] for o in get(dev, "crds")["items"]}
    assert {"agentpools.neuronetes.io", "gpunodes.neuronetes.io"} <= crds
