"""The admission policies of manifests/policies against the real API server (ValidatingAdmissionPolicy, CEL).

The session cluster applies them, and waits until the API server enforces them; this module
waits too (`wait_until_policies_enforced`: each policy refuses its probe), since a policy is enforced
only a while after it is created. A tenant is a ServiceAccount with the stock ``edit`` role (and,
to reach the Binding path too, ``pods/binding``); the extender is the ServiceAccount the policies
trust. Refused: a GPU pod created with ``spec.nodeName`` preset (main or init container), and
anyone but the extender setting, changing or removing ``neuronetes.io/assigned-gpus`` — on a pod
or through a Binding. Still allowed: the extender's Binding, pods without GPUs, and other writes
(labels, finalizers, status) to pods that carry an assignment.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_cluster import E2ECluster, run_documented_policy_wait, wait_until, wait_until_policies_enforced
from pod_builder import container, manifest

from neuronetes import contracts as c
from neuronetes.devcluster import POLICIES_DIR
from neuronetes.devcluster.policyprobe import PROBE_NAME, PROBES
from neuronetes.devcluster.startup import apply_manifests

pytestmark = pytest.mark.e2e

NAMESPACE = "policy-e2e"
NODE_LABEL = ("neuronetes.io/e2e-suite", "policies")
ASSIGNMENT = json.dumps(
    {
        "version": 1,
        "node": "policy-cpu-0",
        "containers": {
            "main": {
                "gpus": [{"uuid": "GPU-0", "index": 0, "memoryMiB": 1024, "computePercent": 100}],
                "priority": 0,
                "qos": "Guaranteed",
            }
        },
    }
)


def token_of(cluster: E2ECluster, namespace: str, account: str) -> str:
    got = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h")
    return got.stdout.strip()


@pytest.fixture(scope="module", autouse=True)
def enforced(cluster: E2ECluster) -> None:
    """Every test here relies on the policies being enforced, not merely created."""
    wait_until_policies_enforced(cluster)


@pytest.fixture(scope="module")
def tokens(cluster: E2ECluster) -> Iterator[dict[str, str]]:
    """Bearer tokens: ``tenant`` (edit + pods/binding in the namespace) and ``extender``."""
    cluster.add_nodes("cpu-only", 1, "policy-cpu", labels=dict([NODE_LABEL]))
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("create", "serviceaccount", "tenant", "-n", NAMESPACE)
    cluster.kubectl(
        "create",
        "rolebinding",
        "tenant-edit",
        "--clusterrole=edit",
        f"--serviceaccount={NAMESPACE}:tenant",
        "-n",
        NAMESPACE,
    )
    cluster.kubectl(
        "create", "role", "binder", "--verb=create", "--resource=pods/binding,bindings", "-n", NAMESPACE
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "tenant-binder",
        "--role=binder",
        f"--serviceaccount={NAMESPACE}:tenant",
        "-n",
        NAMESPACE,
    )
    extender = json.loads(cluster.extender_kubeconfig.read_text())["users"][0]["user"]["token"]
    try:
        yield {"tenant": token_of(cluster, NAMESPACE, "tenant"), "extender": extender}
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def as_user(cluster: E2ECluster, token: str | None, *args: str, input: str | None = None) -> Any:
    auth = ("--token", token) if token else ()
    return cluster.kubectl(*auth, *args, input=input, check=False)


def create(cluster: E2ECluster, token: str | None, obj: dict[str, Any]) -> Any:
    return as_user(cluster, token, "create", "-f", "-", input=json.dumps(obj))


def unscheduled(name: str, limits: dict[str, int] | None = None, **meta: Any) -> dict[str, Any]:
    """A pod no scheduler picks up (schedulerName nobody runs): the test binds it itself."""
    pod = manifest(name, limits, namespace=NAMESPACE, scheduler="nobody", node_selector=dict([NODE_LABEL]))
    pod["metadata"].update(meta)
    return pod


def binding(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"kind": "Node", "name": "policy-cpu-0"},
    }


def post_binding(
    cluster: E2ECluster, token: str, name: str, annotations: dict[str, str] | None = None, *, via: str = "pod"
) -> Any:
    """POST a Binding through ``pods/{name}/binding`` (`via` "pod") or the ``bindings`` resource."""
    path = f"/api/v1/namespaces/{NAMESPACE}/" + (f"pods/{name}/binding" if via == "pod" else "bindings")
    body = json.dumps(binding(name, annotations))
    return as_user(cluster, token, "create", "--raw", path, "-f", "-", input=body)


def pod_json(cluster: E2ECluster, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json").stdout))


@pytest.mark.parametrize(
    ("where", "resource"),
    [("main", c.RESOURCE_GPU), ("init", c.RESOURCE_GPU_MEMORY), ("main", c.mig_resource_name("1g.5gb"))],
)
def test_gpu_pod_with_preset_node_name_is_refused(
    cluster: E2ECluster, tokens: dict[str, str], where: str, resource: str
) -> None:
    limits = {resource: 1}
    name = f"preset-{where}-{resource.rsplit('/', 1)[1].replace('.', '-')}"
    if where == "init":
        pod = manifest(name, namespace=NAMESPACE, init=[container("prep", limits)], node="policy-cpu-0")
    else:
        pod = manifest(name, limits, namespace=NAMESPACE, node="policy-cpu-0")
    got = create(cluster, None, pod)  # not even the admin
    assert got.returncode != 0
    assert "neuronetes.io-gpu-pods-are-scheduled" in got.stderr and "spec.nodeName is preset" in got.stderr
    assert "Remove spec.nodeName" in got.stderr


def test_pods_without_gpus_may_preset_their_node(cluster: E2ECluster, tokens: dict[str, str]) -> None:
    pod = manifest("preset-cpu", namespace=NAMESPACE, node="policy-cpu-0")
    assert create(cluster, tokens["tenant"], pod).returncode == 0


def test_only_the_extender_writes_the_assignment(cluster: E2ECluster, tokens: dict[str, str]) -> None:
    tenant, extender = tokens["tenant"], tokens["extender"]
    key = c.ANNOTATION_ASSIGNED_GPUS
    # A tenant cannot create a pod that carries an assignment.
    forged = create(
        cluster, tenant, unscheduled("forged", {c.RESOURCE_GPU: 1}, annotations={key: ASSIGNMENT})
    )
    assert forged.returncode != 0 and f"metadata.annotations[{key}]" in forged.stderr
    assert "may not set or change it" in forged.stderr
    # ... nor bind one of its pods with an assignment (the Binding's annotations reach the pod).
    assert create(cluster, tenant, unscheduled("mine", {c.RESOURCE_GPU: 1})).returncode == 0
    for via in ("pod", "bindings"):
        bound = post_binding(cluster, tenant, "mine", {key: ASSIGNMENT}, via=via)
        assert bound.returncode != 0 and "written only by the NeuroNetes scheduler extender" in bound.stderr
    # The extender's own Binding passes, assignment and all.
    assert post_binding(cluster, extender, "mine", {key: ASSIGNMENT}).returncode == 0
    pod = pod_json(cluster, "mine")
    assert pod["spec"]["nodeName"] == "policy-cpu-0" and pod["metadata"]["annotations"][key] == ASSIGNMENT
    # After the bind: the tenant may not change or remove it, nor may the admin.
    changed = as_user(
        cluster, tenant, "annotate", "pod", "mine", "-n", NAMESPACE, f"{key}={{}}", "--overwrite"
    )
    assert changed.returncode != 0 and "may not set or change it" in changed.stderr
    removed = as_user(cluster, tenant, "annotate", "pod", "mine", "-n", NAMESPACE, f"{key}-")
    assert removed.returncode != 0 and "may not remove it" in removed.stderr
    admin = as_user(cluster, None, "annotate", "pod", "mine", "-n", NAMESPACE, f"{key}={{}}", "--overwrite")
    assert admin.returncode != 0 and "neuronetes-admin may not set or change it" in admin.stderr
    # Other writes pass: labels, other annotations, finalizers (tenant), status (a controller).
    assert as_user(cluster, tenant, "label", "pod", "mine", "-n", NAMESPACE, "team=a").returncode == 0
    assert as_user(cluster, tenant, "annotate", "pod", "mine", "-n", NAMESPACE, "note=x").returncode == 0
    fin = '{"metadata":{"finalizers":["example.com/keep"]}}'
    assert (
        as_user(
            cluster, tenant, "patch", "pod", "mine", "-n", NAMESPACE, "--type=merge", "-p", fin
        ).returncode
        == 0
    )
    status = '{"status":{"conditions":[{"type":"example.com/Checked","status":"True"}]}}'
    patched = as_user(
        cluster,
        None,
        "patch",
        "pod",
        "mine",
        "-n",
        NAMESPACE,
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    )
    assert patched.returncode == 0, patched.stderr
    unfin = '{"metadata":{"finalizers":null}}'
    assert (
        as_user(
            cluster, tenant, "patch", "pod", "mine", "-n", NAMESPACE, "--type=merge", "-p", unfin
        ).returncode
        == 0
    )
    assert pod_json(cluster, "mine")["metadata"]["annotations"][key] == ASSIGNMENT


def test_ordinary_pods_are_scheduled_and_bound(cluster: E2ECluster, tokens: dict[str, str]) -> None:
    selector = dict([NODE_LABEL])
    pod = manifest("plain", namespace=NAMESPACE, scheduler="default-scheduler", node_selector=selector)
    assert create(cluster, tokens["tenant"], pod).returncode == 0
    wait_until(
        lambda: pod_json(cluster, "plain")["spec"].get("nodeName"), timeout=60, what="kube-scheduler's bind"
    )


@pytest.mark.parametrize("policy", sorted(PROBES))
def test_each_probe_is_refused_by_its_policy_and_only_once_that_is_enforced(
    cluster: E2ECluster, policy: str
) -> None:
    """`wait_until_policies_enforced` can be trusted: the probe it sends for `policy` is refused
    because of that policy. Without the policy's binding the API server admits the probe; once the
    binding is created again, the probe is admitted until the API server has loaded it (the window
    the helper waits out, printed) and refused from then on."""
    probe = PROBES[policy]
    pool = json.dumps(probe.manifest) if probe.scale_to is not None else None
    if pool is not None:  # what the scale probe scales (wait_enforced creates it the same way)
        cluster.kubectl("create", "-f", "-", input=pool)

    def answer() -> Any:
        stdin = None if pool is not None else json.dumps(probe.manifest)
        return cluster.kubectl(*probe.kubectl_args(), input=stdin, check=False)

    try:
        assert probe.refused(answer())
        cluster.kubectl("delete", "validatingadmissionpolicybinding", policy)
        try:
            admitted = wait_until(
                lambda: (got := answer()).returncode == 0 and got,
                timeout=30,
                what=f"the probe of {policy} admitted without the policy's binding",
            )
            assert f"/{PROBE_NAME}" in admitted.stdout
        finally:
            apply_manifests(cluster.kubectl, POLICIES_DIR, lambda _: None)
            waited = wait_until_policies_enforced(cluster, [probe])
        print(f"\n{policy}: enforced {waited:.2f}s after its binding was created again")
        assert probe.refused(answer())
    finally:
        if pool is not None:
            cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=pool)


def test_the_documented_kubectl_probe_finds_the_policies_enforced(cluster: E2ECluster) -> None:
    """docs/webhook.md's block for platform teams, as written: here no webhook runs, so each refusal
    is the policy's own."""
    done = run_documented_policy_wait(cluster)
    assert done.returncode == 0, done.stderr
