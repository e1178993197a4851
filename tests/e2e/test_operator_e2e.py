"""The operator and the admission webhook as real processes against the local control plane.

The extender runs as a process too (kube-scheduler's ``neuronetes-scheduler`` profile calls it),
the operator with ``neuronetes operator run`` and two webhook replicas sharing one port with
``neuronetes webhook serve`` (`neuronetes.devcluster.localstack.LocalStack`). Nodes are kwok nodes
of the simulated GPU profiles; the operator's dev settings make pool pods tolerate their taint.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from apitools import seed_examples
from e2e_cluster import E2ECluster, wait_until
from operator_stack import operator_stack

from neuronetes import contracts as c
from neuronetes.api.models import AgentPool, decode
from neuronetes.devcluster.localstack import LocalStack
from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.pods import LABEL_POOL, LABEL_TEMPLATE_HASH
from neuronetes_operator.slices import FINALIZER
from neuronetes_operator.tiers import DEFAULT_TIERS, pool_priority

pytestmark = pytest.mark.e2e

NS = "operator-e2e"
NODES = {"dgx-a100-80gb": 10, "a100-40gb-mig": 4, "t4x4-pcie": 6}  # 20 nodes
BATCH = 8
SEED_POOLS = [e for e in seed_examples() if e.obj["kind"] == "AgentPool"]
# The seed's high-priority-pool asks for priority 1000: tier high, which this namespace is granted.
TIERS = tuple(msgspec.structs.replace(t, namespaces=(NS,)) if t.name == "high" else t for t in DEFAULT_TIERS)


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


def pool_pods(cluster: E2ECluster, pool: str) -> list[dict[str, Any]]:
    return list(get_json(cluster, "pods", "-n", NS, "-l", f"{LABEL_POOL}={pool}")["items"])


def apply(cluster: E2ECluster, text: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-n", NS, "-f", "-", *extra, input=text, check=False)


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    work = Path(tmp_path_factory.mktemp("operator"))
    # Batches of 8 pod changes a reconcile: the larger pools here converge over several.
    settings = {**dev_operator_settings(), "batchSize": BATCH}
    with operator_stack(cluster, work, NS, settings=settings, tiers=TIERS, log_lines=15) as up:
        up.local.start()
        for profile, count in NODES.items():
            up.add_nodes(profile, count, f"op-{profile}")
        yield up.local


def wait_ready(cluster: E2ECluster, pool: str, timeout: float = 90) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def ready() -> dict[str, Any] | None:
        obj = get_json(cluster, "agentpool", pool, "-n", NS)
        st = seen["status"] = obj.get("status") or {}
        current = st.get("observedGeneration") == obj["metadata"].get("generation")  # not the old spec's
        return (
            obj
            if current and st.get("phase") == "Ready" and st.get("readyReplicas") == st.get("desired")
            else None
        )

    try:
        return wait_until(ready, timeout=timeout, what=f"pool {pool} Ready")
    except pytest.fail.Exception:
        status = {k: v for k, v in seen.get("status", {}).items() if k != "placements"}
        pytest.fail(f"pool {pool} not Ready in {timeout:.0f}s; status: {json.dumps(status)}")


# ---- acceptance 1: every seed AgentPool reconciles ----------------------------------------------


def test_every_seed_pool_reconciles(cluster: E2ECluster, stack: LocalStack) -> None:
    for example in SEED_POOLS:
        result = apply(cluster, example.text)
        assert result.returncode == 0, (example.name, result.stderr)
    for example in SEED_POOLS:
        obj = example.obj
        name = obj["metadata"]["name"]
        pool = wait_ready(cluster, name, timeout=120)
        st = pool["status"]
        pods = [p for p in pool_pods(cluster, name) if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) == st["desired"] == st["replicas"]
        spec = obj["spec"]
        req = spec.get("gpuRequirements") or {}
        tier = pool_priority(decode(obj, AgentPool).spec.scheduling, TIERS)  # 1000: high; 100: default
        for pod in pods:
            assert pod["spec"]["schedulerName"] == c.SCHEDULER_NAME
            assert pod["spec"]["nodeName"], pod["metadata"]["name"]
            assert pod["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            if "migProfile" in spec:
                assert limits == {c.mig_resource_name(spec["migProfile"]): "1"}
            else:
                assert limits == {c.RESOURCE_GPU: str(req.get("count", 1))}
            locality = (req.get("topology") or {}).get("locality", "any")
            assert pod["metadata"]["annotations"][c.ANNOTATION_LOCALITY] == locality
            assert pod["spec"].get("priority", 0) == (tier.tier.value if tier else 0)
            assert pod["spec"].get("priorityClassName") == (tier.class_name if tier else None)
            node = get_json(cluster, "node", pod["spec"]["nodeName"])
            if "type" in req:
                assert node["metadata"]["labels"][c.LABEL_GPU_TYPE] == req["type"]
            assert c.ANNOTATION_ASSIGNED_GPUS in pod["metadata"]["annotations"]
        placed = {p["pod"]: p for p in st["placements"]}
        assert set(placed) == {p["metadata"]["name"] for p in pods}
        assert all(p["node"] and p["gpus"] for p in placed.values())
        assert st["costPerHour"] > 0 and st["gpus"] == sum(
            int(next(iter(p["spec"]["containers"][0]["resources"]["limits"].values()))) for p in pods
        )
        conditions = {cd["type"]: cd["status"] for cd in st["conditions"]}
        assert conditions["Ready"] == "True" and conditions["Degraded"] == "False"
    tp = get_json(cluster, "pods", "-n", NS, "-l", f"{LABEL_POOL}=tensor-parallel-pool")["items"][0]
    assert tp["metadata"]["annotations"][c.ANNOTATION_MIN_BANDWIDTH] == "600"
    spot = get_json(cluster, "agentpool", "spot-pool", "-n", NS)["status"]["policies"]
    assert {"name": "costOptimization", "enabled": True}.items() <= spot[0].items()
    lines = cluster.kubectl("get", "agentpools", "-n", NS, "tensor-parallel-pool").stdout.splitlines()
    assert lines[1].split()[:6] == ["tensor-parallel-pool", "1", "1", "8", lines[1].split()[4], "Ready"]
    events = get_json(cluster, "events", "-n", NS, "--field-selector", "involvedObject.name=rag-pool")
    assert any(e["reason"] == "Created" and "rag-pool-0" in e["message"] for e in events["items"])


# ---- acceptance 2: gangs ------------------------------------------------------------------------

GANG = """\
apiVersion: neuronetes.io/v1alpha1
kind: AgentPool
metadata:
  name: gang
spec:
  minReplicas: 4
  gpuRequirements:
    count: 2
    topology:
      locality: same-node
  scheduling:
    gangScheduling:
      enabled: true
      minMembers: 4
"""


def test_gang_lands_whole_and_is_recreated_whole(cluster: E2ECluster, stack: LocalStack) -> None:
    assert apply(cluster, GANG).returncode == 0
    pool = wait_ready(cluster, "gang")
    pods = pool_pods(cluster, "gang")
    assert len(pods) == 4 and len({p["spec"]["nodeName"] for p in pods}) == 1
    assert {p["metadata"]["labels"][c.LABEL_GANG] for p in pods} == {"gang-0"}
    assert {p["metadata"]["labels"][c.LABEL_GANG_SIZE] for p in pods} == {"4"}
    conditions = {cd["type"]: cd["status"] for cd in pool["status"]["conditions"]}
    assert conditions["GangScheduled"] == "True"
    budget = get_json(cluster, "poddisruptionbudget", "gang", "-n", NS)
    assert budget["spec"]["minAvailable"] == 4
    assert budget["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
    before = {p["metadata"]["uid"] for p in pods}
    cluster.kubectl("delete", "pod", "-n", NS, "gang-0-2", "--wait=false")

    def recreated() -> list[dict[str, Any]] | None:
        now = [p for p in pool_pods(cluster, "gang") if not p["metadata"].get("deletionTimestamp")]
        fresh = [p for p in now if p["metadata"]["uid"] not in before and p["spec"].get("nodeName")]
        return now if len(fresh) == 4 and len(now) == 4 else None

    pods = wait_until(recreated, timeout=90, what="the whole gang recreated and bound")
    assert len({p["spec"]["nodeName"] for p in pods}) == 1
    events = get_json(cluster, "events", "-n", NS, "--field-selector", "involvedObject.name=gang")
    assert any(e["reason"] == "GangBroken" for e in events["items"])


STUCK = """\
apiVersion: neuronetes.io/v1alpha1
kind: AgentPool
metadata:
  name: stuck
spec:
  minReplicas: 2
  gpuRequirements:
    count: 1
    topology:
      locality: same-node
  scheduling:
    gangScheduling:
      enabled: true
      minMembers: 2
      scheduleTimeoutSeconds: 3
  template:
    spec:
      containers:
        - name: agent
          image: registry.k8s.io/pause:3.10
          ports:
            - containerPort: 8080
              hostPort: 8080
"""


def test_a_gang_whose_reservation_expires_is_reported_and_retried_with_backoff(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    # The extender reserves both members on one node, but kube-scheduler never lets the second
    # member onto it (both want host port 8080): the reservation expires, every time.
    assert apply(cluster, STUCK).returncode == 0
    first = wait_until(
        lambda: {p["metadata"]["uid"] for p in pool_pods(cluster, "stuck")} or None, timeout=30
    )

    def retry_events() -> list[dict[str, Any]]:
        found = get_json(cluster, "events", "-n", NS, "--field-selector", "involvedObject.name=stuck")[
            "items"
        ]
        return sorted((e for e in found if e["reason"] == "GangRetry"), key=lambda e: e["firstTimestamp"])

    def condition() -> dict[str, Any] | None:
        st = get_json(cluster, "agentpool", "stuck", "-n", NS).get("status") or {}
        cds = {cd["type"]: cd for cd in st.get("conditions") or []}
        gang = cds.get("GangScheduled", {})
        return gang if gang.get("reason") == "GangReservationFailed" else None

    gang = wait_until(condition, timeout=90, what="GangScheduled=False, GangReservationFailed")
    assert (
        gang["status"] == "False" and "gang stuck-0: the scheduler's reservation Expired" in gang["message"]
    )
    events = wait_until(lambda: retry_events() or None, timeout=30, what="a GangRetry event")
    assert "recreated (retry 1, the next waits at least 10s)" in events[0]["message"]
    wait_until(
        lambda: not first & {p["metadata"]["uid"] for p in pool_pods(cluster, "stuck")},
        timeout=60,
        what="the gang's pods recreated",
    )
    events = wait_until(
        lambda: (lambda e: e if len(e) >= 2 else None)(retry_events()), timeout=120, what="retry 2"
    )
    assert "retry 2, the next waits at least 20s" in events[1]["message"]
    gap = datetime.fromisoformat(events[1]["firstTimestamp"]) - datetime.fromisoformat(
        events[0]["firstTimestamp"]
    )
    assert gap.total_seconds() >= 9  # the backoff (event times are whole seconds)
    cluster.kubectl("delete", "agentpool", "stuck", "-n", NS, "--wait=false")


# ---- acceptance 3: scale and restart ----------------------------------------------------------

SCALED = """\
apiVersion: neuronetes.io/v1alpha1
kind: AgentPool
metadata:
  name: scaled
spec:
  minReplicas: 1
  maxReplicas: 5
"""


def test_kubectl_scale_within_bounds_and_refused_outside(cluster: E2ECluster, stack: LocalStack) -> None:
    assert apply(cluster, SCALED).returncode == 0
    wait_ready(cluster, "scaled")
    out = cluster.kubectl("scale", "agentpool", "scaled", "-n", NS, "--replicas=3")
    assert "scaled" in out.stdout
    wait_until(lambda: len(pool_pods(cluster, "scaled")) == 3, timeout=60, what="3 pods")
    assert wait_ready(cluster, "scaled")["status"]["replicas"] == 3
    refused = cluster.kubectl("scale", "agentpool", "scaled", "-n", NS, "--replicas=6", check=False)
    assert refused.returncode != 0 and "spec.replicas must be <= spec.maxReplicas" in refused.stderr
    cluster.kubectl("scale", "agentpool", "scaled", "-n", NS, "--replicas=1")
    wait_until(
        lambda: (
            len([p for p in pool_pods(cluster, "scaled") if not p["metadata"].get("deletionTimestamp")]) == 1
        ),
        timeout=60,
        what="scaled down to 1",
    )


RESTART = """\
apiVersion: neuronetes.io/v1alpha1
kind: AgentPool
metadata:
  name: restart
spec:
  minReplicas: 24
"""


def test_sigkill_mid_reconcile_converges_without_duplicates(cluster: E2ECluster, stack: LocalStack) -> None:
    assert apply(cluster, RESTART).returncode == 0
    wait_until(lambda: len(pool_pods(cluster, "restart")) >= 3, timeout=60, what="the first pods")
    stack.operator.kill()
    partial = len(pool_pods(cluster, "restart"))
    stack.operator.start()
    wait_ready(cluster, "restart", timeout=120)
    pods = pool_pods(cluster, "restart")
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == sorted(f"restart-{i}" for i in range(24)), (partial, names)
    every = get_json(cluster, "pods", "-n", NS)["items"]
    orphans = [
        p["metadata"]["name"]
        for p in every
        if LABEL_POOL in (p["metadata"].get("labels") or {}) and not p["metadata"].get("ownerReferences")
    ]
    assert orphans == []
    # The 24 pods came in batches: no reconcile created more than BATCH (each says which it made).
    events = get_json(cluster, "events", "-n", NS, "--field-selector", "involvedObject.name=restart")
    made = [created_count(e["message"]) for e in events["items"] if e["reason"] == "Created"]
    assert made and max(made) <= BATCH and sum(made) <= 24, made


def created_count(message: str) -> int:
    """Pods a ``Created`` event names: ``created pods a-0, a-1 and 5 more`` is 7."""
    names, _, more = message.removeprefix("created pods ").partition(" and ")
    return len(names.split(", ")) + (int(more.split()[0]) if more else 0)


# ---- acceptance 4: GPUSlice (operator side) ----------------------------------------------------

SLICE = """\
apiVersion: neuronetes.io/v1alpha1
kind: GPUSlice
metadata:
  name: {name}
  namespace: {ns}
spec:
  memory: 6Gi
  computePercent: 60
  qosClass: Guaranteed
  nodeName: {node}
"""


def test_gpu_slices_reserve_a_gpu_never_oversubscribe_and_defer_deletion(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    (node,) = cluster.add_nodes("t4x4-pcie", 1, "op-slices", labels={"neuronetes.io/e2e-suite": "slices"})
    names = [f"slice-{i}" for i in range(6)]
    text = "---\n".join(SLICE.format(name=n, ns=NS, node=node) for n in names)
    cluster.kubectl("apply", "-f", "-", input=text)  # six at once, four GPUs: 60 % + 60 % never fit one

    def settled() -> list[dict[str, Any]] | None:
        items = [get_json(cluster, "gpuslice", n, "-n", NS) for n in names]
        phases = [(s.get("status") or {}).get("phase") for s in items]
        return (
            items if all(p in ("Bound", "Pending") for p in phases) and phases.count("Bound") == 4 else None
        )

    items = wait_until(settled, timeout=60, what="four of six slices Bound")
    bound = [s for s in items if s["status"]["phase"] == "Bound"]
    uuids = [s["status"]["gpuUUIDs"][0] for s in bound]
    assert len(set(uuids)) == 4 and {s["status"]["node"] for s in bound} == {node}
    pending = [s for s in items if s["status"]["phase"] == "Pending"]
    assert all(cd["reason"] == "NoCapacity" for s in pending for cd in s["status"]["conditions"])
    assert all(FINALIZER in s["metadata"]["finalizers"] for s in items)

    user = bound[0]["metadata"]["name"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "slice-user", "namespace": NS, "annotations": {"neuronetes.io/slice": user}},
        "spec": {"containers": [{"name": "m", "image": "registry.example/w:1"}]},
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    cluster.kubectl("delete", "gpuslice", user, "-n", NS, "--wait=false")

    def deferred() -> dict[str, Any] | None:
        s = get_json(cluster, "gpuslice", user, "-n", NS)
        conds = {cd["type"]: cd for cd in (s.get("status") or {}).get("conditions") or []}
        return s if conds.get("InUse", {}).get("status") == "True" else None

    held = wait_until(deferred, timeout=30, what="deletion deferred while a pod uses the slice")
    assert held["metadata"]["deletionTimestamp"] and held["status"]["phase"] == "Bound"
    cluster.kubectl("delete", "pod", "slice-user", "-n", NS, "--grace-period=0", "--force")
    wait_until(
        lambda: cluster.kubectl("get", "gpuslice", user, "-n", NS, check=False).returncode != 0,
        timeout=60,
        what="the slice released once its pod is gone",
    )
    for n in names:
        cluster.kubectl("delete", "gpuslice", n, "-n", NS, "--ignore-not-found", "--wait=false")


def shared_pod(
    name: str, node: str, memory: int = 0, compute: int = 0, slice_name: str = ""
) -> dict[str, Any]:
    """A pod pinned to `node` asking for a shared slice (or, naming `slice_name`, for nothing)."""
    limits = {c.RESOURCE_GPU_MEMORY: str(memory), c.RESOURCE_GPU_COMPUTE: str(compute)} if memory else {}
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if slice_name:
        meta["annotations"] = {c.ANNOTATION_SLICE: slice_name}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": dev_operator_settings()["podTolerations"],
            "containers": [
                {
                    "name": "m",
                    "image": "registry.example/w:1",
                    **({"resources": {"limits": limits}} if limits else {}),
                }
            ],
        },
    }


def gpu_books(cluster: E2ECluster, node: str) -> dict[str, tuple[int, int]]:
    """Per GPU of `node`, from the API: (MiB, %) held by Bound slices (their status) plus bound pods
    (their assignments), a pod inside a Bound slice counted within it. Asserts every such pod's
    assignment lies inside its slice."""
    slices = {
        s["metadata"]["name"]: s["status"]
        for s in get_json(cluster, "gpuslices", "-n", NS)["items"]
        if (s.get("status") or {}).get("phase") == "Bound" and s["status"]["node"] == node
    }
    books: dict[str, tuple[int, int]] = {}

    def charge(uuid: str, memory: int, percent: int) -> None:
        m, p = books.get(uuid, (0, 0))
        books[uuid] = (m + memory, p + percent)

    for st in slices.values():
        charge(st["gpuUUIDs"][0], st["memoryMiB"], st["computePercent"])
    pods = get_json(cluster, "pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]
    for pod in pods:
        raw = (pod["metadata"].get("annotations") or {}).get(c.ANNOTATION_ASSIGNED_GPUS)
        if raw is None or pod["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        doc = c.decode_assignment(raw)
        (gpu,) = {g.uuid: g for ctr in doc.containers.values() for g in ctr.gpus}.values()
        inside = slices.get((pod["metadata"].get("annotations") or {}).get(c.ANNOTATION_SLICE, ""))
        if inside is not None:
            assert gpu.uuid == inside["gpuUUIDs"][0] and gpu.memory_mib <= inside["memoryMiB"]
            continue
        charge(gpu.uuid, gpu.memory_mib, gpu.compute_percent)
    return books


def test_a_slice_holds_its_share_for_the_pods_that_name_it_and_only_for_them(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    (node,) = cluster.add_nodes("t4x4-pcie", 1, "op-slice-pods")
    text = SLICE.format(name="resv", ns=NS, node=node)
    cluster.kubectl("apply", "-f", "-", input=text)

    def bound() -> dict[str, Any] | None:
        s = get_json(cluster, "gpuslice", "resv", "-n", NS)
        return s if (s.get("status") or {}).get("phase") == "Bound" else None

    st = wait_until(bound, timeout=60, what="slice resv Bound")["status"]
    uuid = st["gpuUUIDs"][0]
    assert (st["memoryMiB"], st["computePercent"], st["qosClass"]) == (6144, 60, "Guaranteed")
    changed = cluster.kubectl(
        "patch", "gpuslice", "resv", "-n", NS, "--type=merge", "-p", '{"spec":{"memory":"1Gi"}}', check=False
    )
    assert changed.returncode != 0 and "immutable" in changed.stderr
    # Before any pod names it, the share is taken: seven pods of 50 % on four GPUs, one of them 60 %
    # reserved: six bind (two per free GPU), none on the slice's GPU, one waits.
    fillers = [f"fill-{i}" for i in range(7)]
    for name in fillers:
        cluster.kubectl("create", "-f", "-", input=json.dumps(shared_pod(name, node, 1024, 50)))

    def placed() -> dict[str, str] | None:
        out = {}
        for name in fillers:
            pod = get_json(cluster, "pod", name, "-n", NS)
            raw = pod["metadata"].get("annotations", {}).get(c.ANNOTATION_ASSIGNED_GPUS)
            if raw:
                ((g,),) = {tuple(x.gpus) for x in c.decode_assignment(raw).containers.values()}
                out[name] = g.uuid
        return out if len(out) == 6 else None

    on = wait_until(placed, timeout=90, what="six of seven 50 % pods bound")
    assert uuid not in on.values()
    (waiting,) = set(fillers) - set(on)
    # A pod naming the slice asks for nothing: the webhook gives it the slice's share, the extender
    # the slice's GPU, and it is not charged again.
    cluster.kubectl("create", "-f", "-", input=json.dumps(shared_pod("inside", node, slice_name="resv")))

    def inside_bound() -> dict[str, Any] | None:
        pod = get_json(cluster, "pod", "inside", "-n", NS)
        return pod if c.ANNOTATION_ASSIGNED_GPUS in pod["metadata"].get("annotations", {}) else None

    pod = wait_until(inside_bound, timeout=60, what="the slice's pod bound")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert (limits[c.RESOURCE_GPU_MEMORY], limits[c.RESOURCE_GPU_COMPUTE]) == ("6144", "60")
    doc = c.decode_assignment(pod["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS])
    (ctr,) = doc.containers.values()
    (g,) = ctr.gpus
    assert (doc.node, g.uuid, g.memory_mib, g.compute_percent, ctr.qos) == (
        node,
        uuid,
        6144,
        60,
        c.QoS.GUARANTEED,
    )
    books = gpu_books(cluster, node)
    assert all(m <= 15360 and p <= 100 for m, p in books.values()), books
    assert books[uuid] == (6144, 60)
    # Deleting the pod keeps the reservation: a new 50 % pod still finds no room.
    cluster.kubectl("delete", "pod", "inside", "-n", NS, "--grace-period=0", "--force")
    cluster.kubectl("create", "-f", "-", input=json.dumps(shared_pod("probe", node, 1024, 50)))
    time.sleep(5)
    for name in (waiting, "probe"):
        assert not get_json(cluster, "pod", name, "-n", NS)["spec"].get("nodeName"), name
    # Deleting the slice releases it: both waiting 50 % pods now fit on its GPU.
    cluster.kubectl("delete", "gpuslice", "resv", "-n", NS)

    def released() -> bool:
        nodes = [get_json(cluster, "pod", n, "-n", NS)["spec"].get("nodeName") for n in (waiting, "probe")]
        return nodes == [node, node]

    wait_until(released, timeout=120, what="the released share taken by the waiting pods")
    books = gpu_books(cluster, node)
    assert books[uuid] == (2048, 100) and all(m <= 15360 and p <= 100 for m, p in books.values()), books
    for name in (*fillers, "probe"):
        cluster.kubectl("delete", "pod", name, "-n", NS, "--grace-period=0", "--force", "--wait=false")


# ---- ToolBinding ---------------------------------------------------------------------------------


def test_toolbindings_resolve_their_pool(cluster: E2ECluster, stack: LocalStack) -> None:
    seed = next(e for e in seed_examples() if e.obj["kind"] == "ToolBinding")
    assert apply(cluster, seed.text).returncode == 0
    bound = seed.text.replace("name: queue-binding", "name: rag-binding").replace(
        "spec:\n", "spec:\n  poolRef:\n    name: rag-pool\n", 1
    )
    assert apply(cluster, bound).returncode == 0

    def phase(name: str) -> str | None:
        return (get_json(cluster, "toolbinding", name, "-n", NS).get("status") or {}).get("phase")

    wait_until(lambda: phase("queue-binding") == "Pending", timeout=30, what="queue-binding Pending")
    wait_until(lambda: phase("rag-binding") == "Active", timeout=30, what="rag-binding Active")
    st = get_json(cluster, "toolbinding", "queue-binding", "-n", NS)["status"]
    reasons = {cd["type"]: cd["reason"] for cd in st["conditions"]}
    assert reasons == {"Bound": "NoPoolRef", "LagScaling": "QueueNotReadable"}


def test_a_pool_of_a_gpu_type_no_node_has_is_not_a_silent_pending(
    cluster: E2ECluster, stack: LocalStack
) -> None:
    """L4 is a GPU family NeuroNetes knows (the webhook admits it) that no node of this cluster has:
    the condition NoMatchingNodes says so (the operator asked the API server by label), and an Event."""
    pool = f"apiVersion: {c.API_VERSION}\nkind: AgentPool\nmetadata:\n  name: l4-pool\nspec:\n"
    pool += "  minReplicas: 1\n  gpuRequirements:\n    type: L4\n"
    assert apply(cluster, pool).returncode == 0

    def condition() -> dict[str, Any] | None:
        st = get_json(cluster, "agentpool", "l4-pool", "-n", NS).get("status") or {}
        return next((cd for cd in st.get("conditions") or [] if cd["type"] == "NoMatchingNodes"), None)

    wait_until(lambda: (condition() or {}).get("status") == "True", timeout=60, what="NoMatchingNodes")
    assert "no node has GPUs of type L4" in (condition() or {})["message"]
    events = get_json(cluster, "events", "-n", NS, "--field-selector", "involvedObject.name=l4-pool")
    assert any(e["reason"] == "NoMatchingNodes" and e["type"] == "Warning" for e in events["items"])
    cluster.kubectl("delete", "agentpool", "-n", NS, "l4-pool", "--wait=false")


def test_template_change_rolls_the_pods_one_at_a_time(cluster: E2ECluster, stack: LocalStack) -> None:
    text = SCALED.replace("name: scaled", "name: rolled").replace("minReplicas: 1", "minReplicas: 3")
    assert apply(cluster, text).returncode == 0
    wait_ready(cluster, "rolled")
    old = {p["metadata"]["labels"][LABEL_TEMPLATE_HASH] for p in pool_pods(cluster, "rolled")}
    patch = {"spec": {"template": {"metadata": {"labels": {"release": "two"}}}}}
    cluster.kubectl("patch", "agentpool", "rolled", "-n", NS, "--type=merge", "-p", json.dumps(patch))
    lowest = 3

    def rolled() -> bool:
        nonlocal lowest
        live = [p for p in pool_pods(cluster, "rolled") if not p["metadata"].get("deletionTimestamp")]
        ready = [
            p
            for p in live
            if any(
                cd["type"] == "Ready" and cd["status"] == "True" for cd in p["status"].get("conditions", [])
            )
        ]
        lowest = min(lowest, len(ready))
        hashes = {p["metadata"]["labels"][LABEL_TEMPLATE_HASH] for p in live}
        return (
            len(live) == 3
            and not hashes & old
            and all(p["metadata"]["labels"].get("release") == "two" for p in live)
        )

    wait_until(rolled, timeout=120, interval=0.1, what="every pod replaced by one of the new template")
    assert lowest >= 2  # one replica at a time
    events = get_json(cluster, "events", "-n", NS, "--field-selector", "involvedObject.name=rolled")
    assert any(e["reason"] == "Outdated" for e in events["items"])
