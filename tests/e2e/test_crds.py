"""The CRDs against a real kube-apiserver: seed examples apply, invalid objects are refused, kubectl
shows them.

The `cluster` fixture (tests/e2e/conftest.py) has already applied crds/ and waited for Established,
so a CRD the API server refuses (non-structural schema, a CEL rule that does not compile or is too
costly) fails the session before these tests run.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from apitools import Example, invalid_examples, seed_examples
from e2e_cluster import E2ECluster, wait_until_policies_enforced

from neuronetes.api import models
from neuronetes.api.models import DEFAULT_MAX_REPLICAS, MAX_REPLICAS
from neuronetes.contracts import GROUP, VERSION
from neuronetes.devcluster.policyprobe import probes_for

pytestmark = pytest.mark.e2e

# Every kind of models.RESOURCES: each has a spec.
SPEC_KINDS = (models.AgentPool, models.GPUSlice, models.GPUNode, models.ToolBinding, models.GangReservation)

SEED = seed_examples()
INVALID = invalid_examples()


@pytest.fixture(scope="module")
def ns(cluster: E2ECluster) -> Iterator[str]:
    name = f"crds-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _plural(kind: str) -> str:
    return f"{models.RESOURCES[kind].plural}.{GROUP}"


def _apply(cluster: E2ECluster, ns: str, text: str) -> Any:
    """Server-side apply ``text`` in ``ns``; the object the server stored."""
    return json.loads(
        cluster.kubectl("apply", "--server-side", "-n", ns, "-o", "json", "-f", "-", input=text).stdout
    )


def _try_apply(cluster: E2ECluster, ns: str, text: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "--server-side", "-n", ns, "-f", "-", input=text, check=False)


def _get(cluster: E2ECluster, ns: str, kind: str, name: str) -> Any:
    return json.loads(cluster.kubectl("get", _plural(kind), name, "-n", ns, "-o", "json").stdout)


def test_crds_are_established_and_structural(cluster: E2ECluster) -> None:
    for res in models.RESOURCES.values():
        crd = json.loads(cluster.kubectl("get", "crd", res.crd_name, "-o", "json").stdout)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", (res.kind, conditions)
        assert conditions.get("NamesAccepted") == "True", (res.kind, conditions)
        assert conditions.get("NonStructuralSchema", "False") == "False", (res.kind, conditions)
        assert crd["status"]["acceptedNames"]["kind"] == res.kind


@pytest.mark.parametrize("example", SEED, ids=[e.name for e in SEED])
def test_seed_example_applies_server_side(cluster: E2ECluster, ns: str, example: Example) -> None:
    local = example.obj
    kind, name = local["kind"], local["metadata"]["name"]
    applied = _apply(cluster, ns, example.text)
    assert (applied["kind"], applied["metadata"]["name"]) == (kind, name)
    stored = _get(cluster, ns, kind, name)
    model = models.RESOURCES[kind].model
    # The server's defaults are the model's defaults: decoding the stored object and the local
    # (undefaulted) example gives the same spec.
    stored_obj, local_obj = models.decode(stored, model), models.decode(local, model)
    assert isinstance(stored_obj, SPEC_KINDS) and isinstance(local_obj, SPEC_KINDS)
    assert stored_obj.spec == local_obj.spec


@pytest.mark.parametrize("example", INVALID, ids=[e.name for e in INVALID])
def test_invalid_object_is_refused_naming_the_field(cluster: E2ECluster, ns: str, example: Example) -> None:
    result = _try_apply(cluster, ns, example.text)
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"accepted: {output}"
    assert example.expect in output
    obj = example.obj
    gone = cluster.kubectl("get", _plural(obj["kind"]), obj["metadata"]["name"], "-n", ns, check=False)
    assert gone.returncode != 0


POOL = """\
apiVersion: neuronetes.io/v1alpha1
kind: AgentPool
metadata:
  name: {name}
spec:
  minReplicas: 1
  maxReplicas: 5
  gpuRequirements:
    count: 2
    type: A100
    memory: 80Gi
"""


def _patch_status(
    cluster: E2ECluster, kind: str, name: str, status: dict[str, Any], ns: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Merge-patch the status subresource (unchecked: the caller looks at the result)."""
    where = ["-n", ns] if ns else []
    patch = json.dumps({"status": status})
    args = ["patch", _plural(kind), name, *where, "--subresource=status", "--type=merge", "-p", patch]
    return cluster.kubectl(*args, check=False)


def test_kubectl_get_agentpools_shows_the_printer_columns(cluster: E2ECluster, ns: str) -> None:
    _apply(cluster, ns, POOL.format(name="columns"))
    status = {
        "phase": "Ready",
        "replicas": 2,
        "readyReplicas": 2,
        "desired": 2,
        "gpus": 4,
        "costPerHour": 12.5,
    }
    assert _patch_status(cluster, "AgentPool", "columns", status, ns).returncode == 0
    lines = cluster.kubectl("get", "agentpools", "columns", "-n", ns).stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "DESIRED", "GPUS", "COST/H", "PHASE", "AGE"]
    assert lines[1].split()[:6] == ["columns", "2", "2", "4", "12.5", "Ready"]
    # The status written through the subresource decodes into the model.
    pool = models.decode(_get(cluster, ns, "AgentPool", "columns"), models.AgentPool)
    assert pool.status is not None and pool.status.cost_per_hour == 12.5


def test_scale_subresource(cluster: E2ECluster, ns: str) -> None:
    _apply(cluster, ns, POOL.format(name="scaled"))
    selector = "neuronetes.io/pool=scaled"
    assert (
        _patch_status(cluster, "AgentPool", "scaled", {"replicas": 1, "selector": selector}, ns).returncode
        == 0
    )
    cluster.kubectl("scale", "agentpool", "scaled", "-n", ns, "--replicas=3")
    assert _get(cluster, ns, "AgentPool", "scaled")["spec"]["replicas"] == 3
    raw = cluster.kubectl("get", "--raw", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/agentpools/scaled/scale")
    scale = json.loads(raw.stdout)
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 3
    assert scale["status"] == {"replicas": 1, "selector": selector}
    # The CEL bounds hold through the scale subresource too.
    refused = cluster.kubectl("scale", "agentpool", "scaled", "-n", ns, "--replicas=9", check=False)
    assert refused.returncode != 0
    assert "spec.replicas must be <= spec.maxReplicas" in refused.stderr
    assert _get(cluster, ns, "AgentPool", "scaled")["spec"]["replicas"] == 3


def test_status_schemas_are_enforced(cluster: E2ECluster, ns: str) -> None:
    _apply(cluster, ns, POOL.format(name="status"))
    bad = _patch_status(cluster, "AgentPool", "status", {"phase": "Exploded"}, ns)
    assert bad.returncode != 0 and "status.phase: Unsupported value" in bad.stderr
    name = f"gpunode-{ns}"  # cluster-scoped
    cluster.kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        input=json.dumps(models.encode(models.GPUNode(metadata={"name": name}))),
    )
    try:
        gpu = {
            "uuid": "GPU-1",
            "index": 0,
            "memoryMiB": 81920,
            "nvlinkBandwidthGBps": 600,
            "health": "Available",
        }
        ok = _patch_status(cluster, "GPUNode", name, {"gpuCount": 1, "healthyGPUs": 1, "gpus": [gpu]})
        assert ok.returncode == 0, ok.stderr
        stored = json.loads(cluster.kubectl("get", _plural("GPUNode"), name, "-o", "json").stdout)
        node = models.decode(stored, models.GPUNode)
        assert node.status is not None and node.status.gpus is not None
        assert (node.status.gpus[0].memory_mib, node.status.gpus[0].nvlink_bandwidth_gbps) == (81920, 600.0)
        broken = _patch_status(cluster, "GPUNode", name, {"gpus": [{**gpu, "health": "Broken"}]})
        assert broken.returncode != 0 and "status.gpus[0].health: Unsupported value" in broken.stderr
    finally:
        cluster.kubectl("delete", _plural("GPUNode"), name, check=False)


def test_transition_rules(cluster: E2ECluster, ns: str) -> None:
    slice_yaml = """\
apiVersion: neuronetes.io/v1alpha1
kind: GPUSlice
metadata:
  name: pinned
spec:
  memory: 10Gi
  computePercent: 30
  nodeName: {node}
"""
    _apply(cluster, ns, slice_yaml.format(node="gpu-node-1"))
    moved = _try_apply(cluster, ns, slice_yaml.format(node="gpu-node-2"))
    assert moved.returncode != 0 and "spec.nodeName is immutable once set" in moved.stderr
    gang_yaml = """\
apiVersion: neuronetes.io/v1alpha1
kind: GangReservation
metadata:
  name: gang
spec:
  groupName: {group}
  size: 2
  expiresAt: "2030-01-01T00:00:00Z"
  members:
    - name: member-0
      node: gpu-node-1
      gpuIndices: [0, 1]
      gpuUUIDs: [GPU-a, GPU-b]
"""
    _apply(cluster, ns, gang_yaml.format(group="g1"))
    renamed = _try_apply(cluster, ns, gang_yaml.format(group="g2"))
    assert renamed.returncode != 0 and "spec.groupName is immutable" in renamed.stderr
    gang = models.decode(_get(cluster, ns, "GangReservation", "gang"), models.GangReservation)
    assert gang.spec.members is not None and gang.spec.members[0].compute_percent == 100


def test_kubectl_explain_documents_units(cluster: E2ECluster) -> None:
    out = cluster.kubectl("explain", "agentpools.spec.gpuRequirements.topology.minBandwidth").stdout
    assert "600Gi = 600 GB/s" in " ".join(out.split())


BOUNDED = """\
apiVersion: neuronetes.io/v1alpha1
kind: AgentPool
metadata:
  name: {name}
spec:
  {spec}
"""
POLICIES = ("neuronetes.io-agentpool-replicas", "neuronetes.io-agentpool-scale")

# (pool spec, what the refusal says): the admission policy's maximum (1024, the chart's default)
# and the CRD's (4096, which nothing raises), each naming the field.
LIMIT, CRD_MAX = DEFAULT_MAX_REPLICAS, f"in body should be less than or equal to {MAX_REPLICAS}"
PAST_THE_MAXIMUM = [
    ("replicas: 1025", f"spec.replicas: 1025 is more than {LIMIT}"),
    ("minReplicas: 1025", f"spec.minReplicas: 1025 is more than {LIMIT}"),
    ("{replicas: 2, maxReplicas: 1025}", f"spec.maxReplicas: 1025 is more than {LIMIT}"),
    ("replicas: 4097", f"spec.replicas: Invalid value: 4097: spec.replicas {CRD_MAX}"),
    ("minReplicas: 200000", f"spec.minReplicas: Invalid value: 200000: spec.minReplicas {CRD_MAX}"),
    (
        "{replicas: 2, maxReplicas: 4097}",
        f"spec.maxReplicas: Invalid value: 4097: spec.maxReplicas {CRD_MAX}",
    ),
]


def _set_policy_maximum(cluster: E2ECluster, value: int, ns: str) -> None:
    """Set both policies' maximum to `value` and wait until the API server enforces it — in both:
    the replicas policy refusing a pool past `value` says nothing of the scale policy, which the
    API server may load a refresh later."""
    op = [{"op": "replace", "path": "/spec/variables/0/expression", "value": str(value)}]
    for name in POLICIES:
        cluster.kubectl("patch", "validatingadmissionpolicy", name, "--type=json", "-p", json.dumps(op))
    wait_until_policies_enforced(cluster, probes_for(POLICIES, max_replicas=value))


def test_replicas_past_the_maximum_are_refused_naming_the_field(cluster: E2ECluster, ns: str) -> None:
    wait_until_policies_enforced(cluster, probes_for(POLICIES))  # what this test relies on
    names = {p["metadata"]["name"] for p in json.loads(
        cluster.kubectl("get", "validatingadmissionpolicies", "-o", "json").stdout)["items"]}  # fmt: skip
    assert set(POLICIES) <= names  # manifests/policies/, as the chart installs them
    for i, (spec, expect) in enumerate(PAST_THE_MAXIMUM):
        refused = _try_apply(cluster, ns, BOUNDED.format(name=f"past-{i}", spec=spec))
        assert refused.returncode != 0, f"{spec}: accepted"
        assert expect in " ".join(refused.stderr.split()), (spec, refused.stderr)
    # At the maximum: accepted. kubectl scale past it: refused, naming the field, by either bound.
    _apply(cluster, ns, BOUNDED.format(name="most", spec=f"replicas: {DEFAULT_MAX_REPLICAS}"))
    for replicas, expect in [
        (LIMIT + 1, f"spec.replicas: {LIMIT + 1} is more than {LIMIT}"),
        (MAX_REPLICAS + 1, f"spec.replicas {CRD_MAX}"),
    ]:
        scaled = cluster.kubectl(
            "scale", "agentpool", "most", "-n", ns, f"--replicas={replicas}", check=False
        )
        assert scaled.returncode != 0 and expect in " ".join(scaled.stderr.split()), scaled.stderr
    assert _get(cluster, ns, "AgentPool", "most")["spec"]["replicas"] == DEFAULT_MAX_REPLICAS
    # A maximum lowered below a stored pool: the pool may still be labelled and scaled down, not up.
    try:
        _set_policy_maximum(cluster, 100, ns)
        labelled = cluster.kubectl("label", "agentpool", "most", "-n", ns, "team=a", check=False)
        assert labelled.returncode == 0, labelled.stderr
        down = cluster.kubectl("scale", "agentpool", "most", "-n", ns, "--replicas=1000", check=False)
        assert down.returncode == 0, down.stderr
        up = cluster.kubectl("scale", "agentpool", "most", "-n", ns, "--replicas=1001", check=False)
        assert up.returncode != 0 and "spec.replicas: 1001 is more than 100," in up.stderr, up.stderr
        up_patch = ("--type=merge", "-p", '{"spec":{"replicas":1002}}')
        patched = cluster.kubectl("patch", "agentpool", "most", "-n", ns, *up_patch, check=False)
        assert patched.returncode != 0 and "spec.replicas: 1002 is more than 100," in patched.stderr
    finally:
        _set_policy_maximum(cluster, DEFAULT_MAX_REPLICAS, ns)
