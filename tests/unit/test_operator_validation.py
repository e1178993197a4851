"""Constants the CRDs repeat agree with the code, and the launch objects say what docs/webhook.md says."""

from __future__ import annotations

import base64
import json
import re

import pytest
import yaml
from apitools import CRD_DIR

from neuronetes.api.models import DEFAULT_MAX_REPLICAS, MAX_REPLICAS
from neuronetes.api.units import MAX_GPU_MEMORY_GB
from neuronetes.devcluster import POLICIES_DIR
from neuronetes.devcluster.tools import REPO_ROOT
from neuronetes_operator.launch import (
    AGENT_USERNAME,
    EVICTION_MATCH_CONDITION,
    POD_EVENT_MATCH_CONDITION,
    POD_MATCH_CONDITION,
    operator_rbac,
    webhook_configurations,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("crd", ["neuronetes.io_agentpools.yaml", "neuronetes.io_gpuslices.yaml"])
def test_crd_memory_bound_is_the_largest_gpu(crd: str) -> None:
    text = (CRD_DIR / crd).read_text()
    assert f"quantity('{MAX_GPU_MEMORY_GB}Gi')" in text
    assert f"self <= {MAX_GPU_MEMORY_GB * 2**30}" in text
    assert f"at most {MAX_GPU_MEMORY_GB}Gi" in text


def test_replica_bounds_agree_crd_policy_and_chart() -> None:
    """The CRD's bound (which nothing raises) and the policy's default (which the chart sets)."""
    crd = yaml.safe_load((CRD_DIR / "neuronetes.io_agentpools.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert [spec[f]["maximum"] for f in ("replicas", "minReplicas", "maxReplicas")] == [MAX_REPLICAS] * 3
    chart = REPO_ROOT / "helm" / "neuronetes"
    schema = json.loads((chart / "values.schema.json").read_text())
    assert schema["properties"]["agentPools"]["properties"]["maxReplicas"]["maximum"] == MAX_REPLICAS
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["agentPools"]["maxReplicas"] == DEFAULT_MAX_REPLICAS < MAX_REPLICAS
    policies = [d for d in yaml.safe_load_all((POLICIES_DIR / "agentpool-replicas.yaml").read_text()) if d]
    bounds = {
        p["metadata"]["name"]: {v["name"]: v["expression"] for v in p["spec"]["variables"]}["maxReplicas"]
        for p in policies
        if p["kind"] == "ValidatingAdmissionPolicy"
    }
    assert bounds == {
        "neuronetes.io-agentpool-replicas": str(DEFAULT_MAX_REPLICAS),
        "neuronetes.io-agentpool-scale": str(DEFAULT_MAX_REPLICAS),
    }
    text = (POLICIES_DIR / "agentpool-replicas.yaml").read_text()
    assert text.count(f'"{DEFAULT_MAX_REPLICAS}"  # agentPools.maxReplicas') == 2  # what the chart replaces


def test_webhook_configurations_fail_closed_and_are_scoped() -> None:
    mutating, validating = webhook_configurations(b"PEM", "https://127.0.0.1:9443")
    pods, evictions = mutating["webhooks"]
    objects, events = validating["webhooks"]
    for hook in (pods, evictions, objects, events):
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == b"PEM"
    assert pods["clientConfig"]["url"] == "https://127.0.0.1:9443/pods"
    # Only the node agent's evictions reach the webhook (which holds them to the agent's node).
    assert evictions["clientConfig"]["url"] == "https://127.0.0.1:9443/evictions"
    assert evictions["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/eviction"],
         "scope": "Namespaced"}
    ]  # fmt: skip
    assert evictions["matchConditions"][0]["expression"] == EVICTION_MATCH_CONDITION
    assert f"request.userInfo.username == '{AGENT_USERNAME}'" == EVICTION_MATCH_CONDITION
    # ... and only its Events about pods (the admission policy decides its others).
    assert events["clientConfig"]["url"] == "https://127.0.0.1:9443/events"
    assert events["rules"][0]["resources"] == ["events"] and events["rules"][0]["apiGroups"] == [""]
    assert [m["expression"] for m in events["matchConditions"]] == [
        EVICTION_MATCH_CONDITION,
        POD_EVENT_MATCH_CONDITION,
    ]
    assert pods["matchConditions"][0]["expression"] == POD_MATCH_CONDITION
    assert set(pods["rules"][0]["operations"]) == {"CREATE", "UPDATE"}
    assert objects["rules"][0]["resources"] == ["agentpools", "gpuslices"]
    # The scope names the resource prefix and the slice annotation, in limits, requests and init containers.
    assert re.search(r"limits\.exists\(k, k\.startsWith\('neuronetes\.io/'\)\)", POD_MATCH_CONDITION)
    assert "initContainers" in POD_MATCH_CONDITION and "'neuronetes.io/slice' in" in POD_MATCH_CONDITION


def test_operator_rbac_is_least_privilege() -> None:
    account, role, binding = operator_rbac("neuronetes-system")
    rules: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                rules.setdefault((g, r), set()).update(rule["verbs"])
    # patch: only to remove the carbon scheduling gate (carbon_gate).
    assert rules[("", "pods")] == {"get", "list", "watch", "create", "delete", "patch"}
    # patch: the MIG layout controller's nvidia.com/mig.config label and cordon (mig_layouts).
    assert rules[("", "nodes")] == {"get", "list", "watch", "patch"}
    # get and patch of mig-manager's ConfigMap by name; create cannot be limited to a name.
    (named,) = [r for r in role["rules"] if r["resources"] == ["configmaps"] and r.get("resourceNames")]
    assert named["resourceNames"] == ["neuronetes-mig-parted-config"] and named["verbs"] == ["get", "patch"]
    assert rules[("", "configmaps")] == {"get", "patch", "create"}
    assert "delete" not in rules[("neuronetes.io", "agentpools")]
    assert all("*" not in verbs for verbs in rules.values())
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
