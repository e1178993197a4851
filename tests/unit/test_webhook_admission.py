"""The admission webhook's checks, in process: pods (refusals per field, the mutation) and objects.

tests/e2e/test_webhook_e2e.py sends the same cases through the real API server.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
import yaml
from webhook_cases import OBJECT_CASES, POD_CASES, VALID_OBJECTS, gpu_pod

from neuronetes import contracts as c
from neuronetes.devcluster.tools import REPO_ROOT
from neuronetes_operator import admission
from neuronetes_operator.admission import POD_CHECKS, asks_for_gpus, review_pod
from neuronetes_operator.validation import review_object
from neuronetes_operator.webhook import admission_response

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("case", POD_CASES, ids=[case.name for case in POD_CASES])
def test_pod_is_refused_naming_the_field(case: Any) -> None:
    verdict = review_pod(case.pod)
    assert not verdict.allowed
    assert any(case.expect in refusal for refusal in verdict.refusals), verdict.refusals
    assert verdict.patch == []


def test_gpu_pod_gets_the_scheduler_name_and_nothing_else() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]
    pod["metadata"]["annotations"] = {c.ANNOTATION_LOCALITY: "same-node"}
    verdict = review_pod(pod)
    assert verdict.allowed
    assert verdict.patch == [{"op": "add", "path": "/spec/schedulerName", "value": c.SCHEDULER_NAME}]


def test_ten_thousand_mib_written_with_k_is_allowed() -> None:
    pod = gpu_pod({c.RESOURCE_GPU_MEMORY: "10k", c.RESOURCE_GPU_COMPUTE: "50"})
    assert review_pod(pod).allowed


def test_only_pods_asking_for_neuronetes_resources_are_in_scope() -> None:
    plain = gpu_pod({"cpu": "1"})
    plain["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert not asks_for_gpus(plain)
    review = {"request": {"uid": "u1", "operation": "CREATE", "object": plain}}
    assert admission_response("/pods", review)["response"] == {"uid": "u1", "allowed": True}
    named = copy.deepcopy(plain)
    named["metadata"]["annotations"] = {"neuronetes.io/slice": "s"}
    assert asks_for_gpus(named)


def test_admission_review_carries_the_refusal_and_the_patch() -> None:
    refused = admission_response(
        "/pods", {"request": {"uid": "a", "operation": "CREATE", "object": POD_CASES[0].pod}}
    )["response"]
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    allowed = admission_response(
        "/pods", {"request": {"uid": "b", "operation": "CREATE", "object": gpu_pod()}}
    )
    patch = json.loads(base64.b64decode(allowed["response"]["patch"]))
    assert allowed["response"]["patchType"] == "JSONPatch" and patch[0]["value"] == c.SCHEDULER_NAME


@pytest.mark.parametrize("body", [{}, {"request": {}}, {"request": {"uid": 3}}])
def test_malformed_review_is_a_value_error(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="AdmissionReview"):
        admission_response("/pods", body)


def test_every_pod_check_is_exercised() -> None:
    hit = {name for name, check in POD_CHECKS.items() for case in POD_CASES if check(case.pod)}
    assert hit == set(POD_CHECKS)


WEBHOOK_OBJECT_CASES = [case for case in OBJECT_CASES if case.where == "webhook"]


@pytest.mark.parametrize("case", WEBHOOK_OBJECT_CASES, ids=[case.name for case in WEBHOOK_OBJECT_CASES])
def test_object_is_refused_by_the_webhook_naming_the_field(case: Any) -> None:
    refusals = review_object(yaml.safe_load(case.text))
    assert any(case.expect in r for r in refusals), refusals


@pytest.mark.parametrize("case", VALID_OBJECTS, ids=[case.name for case in VALID_OBJECTS])
def test_valid_edge_case_is_accepted_by_the_webhook(case: Any) -> None:
    assert review_object(yaml.safe_load(case.text)) == []


def _update(old: dict[str, Any], new: dict[str, Any], user: str = "alice") -> dict[str, Any]:
    return {
        "request": {
            "uid": "u",
            "operation": "UPDATE",
            "object": new,
            "oldObject": old,
            "userInfo": {"username": user},
        }
    }


def test_update_touching_neuronetes_annotations_is_refused_unless_trusted() -> None:
    old = gpu_pod()
    old["metadata"]["annotations"] = {c.ANNOTATION_ASSIGNED_GPUS: "{}", "team": "a"}
    forged = copy.deepcopy(old)
    forged["metadata"]["annotations"][c.ANNOTATION_ASSIGNED_GPUS] = '{"version": 1}'
    refused = admission_response("/pods", _update(old, forged))["response"]
    assert not refused["allowed"]
    assert f"metadata.annotations[{c.ANNOTATION_ASSIGNED_GPUS}]" in refused["status"]["message"]
    trusted = admission_response(
        "/pods",
        _update(old, forged, "system:serviceaccount:nn:extender"),
        frozenset({"system:serviceaccount:nn:extender"}),
    )
    assert trusted["response"]["allowed"]
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["annotations"]["team"] = "b"
    assert admission_response("/pods", _update(old, relabelled))["response"]["allowed"]


def _mounting(path: str) -> dict[str, Any]:
    pod = gpu_pod()
    pod["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
    return pod


@pytest.mark.parametrize("protected", sorted(c.TENANT_FORBIDDEN_HOST_PATHS))
@pytest.mark.parametrize(
    "dress",
    [
        pytest.param(lambda p: p, id="as-is"),
        pytest.param(lambda p: p + "/", id="trailing-slash"),
        pytest.param(lambda p: p + "//", id="trailing-slashes"),
        pytest.param(lambda p: "/" + p, id="leading-double-slash"),
        pytest.param(lambda p: p.replace("/", "//"), id="doubled-slashes"),
        pytest.param(lambda p: p.replace("/", "/./"), id="dot-parts"),
        pytest.param(lambda p: p.lstrip("/"), id="relative"),
        pytest.param(lambda p: p + "/sub/dir", id="inside"),
        pytest.param(lambda p: p.rsplit("/", 1)[0] or "/", id="parent"),
        pytest.param(lambda p: "/var" + p if p.startswith("/run") else p, id="var-run-alias"),
    ],
)
def test_every_protected_host_path_is_refused_however_written(protected: str, dress: Any) -> None:
    path = dress(protected)
    verdict = review_pod(_mounting(path))
    assert not verdict.allowed
    (refusal,) = verdict.refusals
    assert refusal.startswith(f"spec.volumes[0].hostPath.path: {path!r}") and "remove the volume" in refusal


@pytest.mark.parametrize(
    ("path", "names"),
    [
        (
            "/var/lib/neuronetes/shim",
            "lies inside /var/lib/neuronetes (the NeuroNetes agent's host directory",
        ),
        ("/run/neuronetes/containers", "lies inside /run/neuronetes (the NeuroNetes agent's state"),
        ("/var/run/nri/", "'/var/run/nri/' (/run/nri) is /run/nri (the container runtime's NRI socket"),
        ("/etc", "'/etc' contains /etc/cdi (CDI specs"),
        ("/", "'/' contains /dev"),
        ("/var/lib/kubelet/pods/x/volumes", "lies inside /var/lib/kubelet (the kubelet's state"),
        ("/var/lib/../../etc/cdi", "has a '..' part"),
        ("/home/../run/neuronetes", "has a '..' part"),
    ],
)
def test_the_refusal_names_the_protected_path_and_why(path: str, names: str) -> None:
    (refusal,) = review_pod(_mounting(path)).refusals
    assert names in refusal, refusal


@pytest.mark.parametrize(
    "path",
    [
        "/home/user/datasets",
        "/mnt/models",
        "/var/lib/kubelet-data",  # a sibling, not inside
        "/etc/cdi-notes",
        "/runtime",
        "/devices",
        "/var/lib/postgres",
        "/data/run/neuronetes",  # the same names elsewhere are other directories
    ],
)
def test_other_host_paths_stay_allowed(path: str) -> None:
    assert review_pod(_mounting(path)).allowed


def test_the_agents_configured_host_paths_are_protected_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """``webhook serve --protected-host-path``: the chart passes agent.hostPaths, wherever they are."""
    monkeypatch.setattr(admission, "_protected_host_paths", dict(admission._protected_host_paths))
    assert review_pod(_mounting("/opt/gpu/shim")).allowed
    admission.protect_host_paths(["/opt/gpu/shim/", "/run/neuronetes"])
    (refusal,) = review_pod(_mounting("/opt/gpu")).refusals
    assert "'/opt/gpu' contains /opt/gpu/shim (a NeuroNetes agent directory" in refusal
    # A path already protected keeps its own reason.
    assert "the NeuroNetes agent's state" in review_pod(_mounting("/run/neuronetes")).refusals[0]


def test_the_node_directories_the_agent_uses_are_protected() -> None:
    """The chart's agent.hostPaths defaults are the contracts' node directories, and each is refused."""
    values = yaml.safe_load((REPO_ROOT / "helm" / "neuronetes" / "values.yaml").read_text())
    host_paths = values["agent"]["hostPaths"]
    assert host_paths["stateDir"] == c.NODE_STATE_DIR
    assert host_paths["shimDir"] == c.NODE_SHIM_DIR
    assert host_paths["nriSocketDir"] == c.NODE_NRI_SOCKET_DIR
    for path in (c.NODE_STATE_DIR, c.NODE_SHIM_DIR, c.NODE_NRI_SOCKET_DIR, "/etc/cdi", "/var/run/cdi"):
        assert admission.forbidden_host_path(path) is not None, path
