"""Acceptance: least-privilege RBAC. Every rendered Role and ClusterRole is read: no ``*``, nothing
bound to cluster-admin, and each component's permissions are exactly the ones listed in
docs/rbac.md (generated from the chart's files/rbac.yaml, the one source), which are the calls
its code makes (the code's own local registrations agree, and each "called by" entry is found)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from chart_render import NAMESPACE, REPO_ROOT, containers, default_objects, find, rbac_source

from neuronetes.devcluster.access import EXTENDER_NAMESPACE, EXTENDER_SERVICE_ACCOUNT, extender_rules

pytestmark = pytest.mark.unit

launch: Any = importlib.import_module("neuronetes_operator.launch")
ROLE_KINDS = ("Role", "ClusterRole")
BINDING_KINDS = ("RoleBinding", "ClusterRoleBinding")


def _rule_set(rules: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str, str]]:
    """Rules as (group, resource, resourceName, verb) grants: equal sets grant the same."""
    return {
        (g, r, n, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for n in rule.get("resourceNames") or ["<any>"]
        for v in rule["verbs"]
    }


def _subject_component(binding: Mapping[str, Any]) -> str:
    (subject,) = binding["subjects"]
    assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE
    by_sa = {spec["serviceAccount"]: name for name, spec in rbac_source()["components"].items()}
    return str(by_sa[subject["name"]])


def test_no_wildcards_in_any_rendered_role() -> None:
    roles = [o for o in default_objects() if o["kind"] in ROLE_KINDS]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert not any("*" in item for item in rule.get(field) or []), (
                    role["metadata"]["name"],
                    rule,
                )
            assert "nonResourceURLs" not in rule


def test_nothing_bound_to_cluster_admin_and_only_listed_cluster_roles() -> None:
    source = rbac_source()["components"]
    allowed_cluster = {f"neuronetes:{c}" for c in source} | {
        b["name"] for spec in source.values() for b in spec.get("boundClusterRoles") or []
    }
    allowed_roles = {f"neuronetes:{c}" for c in source} | {
        b["name"] for spec in source.values() for b in spec.get("boundRoles") or []
    }
    bindings = [o for o in default_objects() if o["kind"] in BINDING_KINDS]
    for b in bindings:
        ref = b["roleRef"]["name"]
        assert ref not in ("cluster-admin", "admin", "edit"), ref
        assert all(sub["kind"] == "ServiceAccount" for sub in b["subjects"]), b["metadata"]["name"]
        assert ref in (allowed_cluster if b["roleRef"]["kind"] == "ClusterRole" else allowed_roles), ref
    assert {"system:kube-scheduler", "system:volume-scheduler"} <= allowed_cluster


def _rendered_grants() -> dict[str, dict[str, set[tuple[str, str, str, str]]]]:
    """component -> scope ("cluster" or a namespace) -> grants of its own Roles."""
    objects = default_objects()
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ROLE_KINDS
    }
    grants: dict[str, dict[str, set[tuple[str, str, str, str]]]] = {}
    for b in (o for o in objects if o["kind"] in BINDING_KINDS):
        ns = b["metadata"].get("namespace")
        key = (b["roleRef"]["kind"], ns if b["roleRef"]["kind"] == "Role" else None, b["roleRef"]["name"])
        if key not in roles:
            continue  # a role the cluster defines itself (checked above)
        scope = "cluster" if b["kind"] == "ClusterRoleBinding" else ns
        grants.setdefault(_subject_component(b), {})[scope] = _rule_set(roles[key]["rules"])
    return grants


def test_each_components_rendered_permissions_are_exactly_the_listed_ones() -> None:
    expected: dict[str, dict[str, set[tuple[str, str, str, str]]]] = {}
    for name, spec in rbac_source()["components"].items():
        scopes = {}
        if spec.get("clusterRole"):
            scopes["cluster"] = _rule_set(spec["clusterRole"])
        for role in spec.get("roles") or []:
            scopes[role["namespace"] or NAMESPACE] = _rule_set(role["rules"])
        if scopes:
            expected[name] = scopes
    assert _rendered_grants() == expected


def test_listed_permissions_equal_the_codes_own_registrations() -> None:
    source = rbac_source()["components"]
    assert (
        source["scheduler"]["serviceAccount"] == EXTENDER_SERVICE_ACCOUNT and NAMESPACE == EXTENDER_NAMESPACE
    )
    assert _rule_set(source["scheduler"]["clusterRole"]) == _rule_set(extender_rules())
    (operator_role,) = [o for o in launch.operator_rbac(NAMESPACE) if o["kind"] == "ClusterRole"]
    assert _rule_set(source["operator"]["clusterRole"]) == _rule_set(operator_role["rules"])


def test_every_called_by_entry_names_code_that_holds_it() -> None:
    for name, spec in rbac_source()["components"].items():
        rules = [
            *(spec.get("clusterRole") or []),
            *(r for role in spec.get("roles") or [] for r in role["rules"]),
        ]
        for rule in rules:
            assert rule.get("calledBy"), (name, rule)
            for entry in rule["calledBy"]:
                path, _, needle = entry.partition(": ")
                text = (REPO_ROOT / path).read_text()
                assert needle in text, f"{name}: {path} has no {needle!r}"


def test_each_workload_runs_as_its_components_service_account() -> None:
    source = rbac_source()["components"]
    workloads = {
        "gpu-scheduler": "scheduler",
        "neuronetes-operator": "operator",
        "neuronetes-webhook": "webhook",
        "neuronetes-agent": "agent",
    }
    objects = [*find(default_objects(), "Deployment"), *find(default_objects(), "DaemonSet")]
    assert {o["metadata"]["name"] for o in objects} == set(workloads)
    for obj in objects:
        spec = obj["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == source[workloads[obj["metadata"]["name"]]]["serviceAccount"]
    # A component without any permission gets no token either.
    for obj in objects:
        component = source[workloads[obj["metadata"]["name"]]]
        without = not (component.get("clusterRole") or component.get("roles"))
        assert (obj["spec"]["template"]["spec"].get("automountServiceAccountToken") is False) == without


def test_the_webhook_trusts_the_extender_and_the_policies_name_it() -> None:
    objects = default_objects()
    user = f"system:serviceaccount:{NAMESPACE}:{rbac_source()['components']['scheduler']['serviceAccount']}"
    webhook = containers(next(iter(find(objects, "Deployment", "neuronetes-webhook"))))["webhook"]
    assert [a for a in webhook["args"] if a.startswith("--trusted-user")] == [f"--trusted-user={user}"]
    policy = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy" and "extenderUser" in str(o))
    (var,) = [v for v in policy["spec"]["variables"] if v["name"] == "extenderUser"]
    assert var["expression"] == f"'{user}'"


def test_the_node_restriction_names_the_agents_service_account() -> None:
    """The policy and the eviction webhook that hold each agent to its own node match exactly the
    release's agent ServiceAccount (the DaemonSet's)."""
    objects = default_objects()
    agent = f"system:serviceaccount:{NAMESPACE}:{rbac_source()['components']['agent']['serviceAccount']}"
    (policy,) = [
        o for o in find(objects, "ValidatingAdmissionPolicy") if o["metadata"]["name"].endswith("-its-node")
    ]
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{agent}'"
    assert any(
        o["spec"]["policyName"] == policy["metadata"]["name"]
        for o in find(objects, "ValidatingAdmissionPolicyBinding")
    )
    hooks = [h for kind in ("Mutating", "Validating") for o in find(objects, f"{kind}WebhookConfiguration")
             for h in o["webhooks"]]  # fmt: skip
    (evictions,) = [h for h in hooks if h["name"] == "evictions.neuronetes.io"]
    assert evictions["matchConditions"] == [
        {"name": "by-the-node-agent", "expression": condition["expression"]}
    ]
    (events,) = [h for h in hooks if h["name"] == "events.neuronetes.io"]
    assert events["matchConditions"][0] == evictions["matchConditions"][0]
    assert agent == launch.AGENT_USERNAME
    # The webhook may read the pod an Eviction names.
    webhook = rbac_source()["components"]["webhook"]["clusterRole"]
    assert ("", "pods", "<any>", "get") in _rule_set(webhook)


def test_the_lease_role_names_the_scheduler_configurations_lease() -> None:
    (role,) = [
        o
        for o in default_objects()
        if o["kind"] == "Role"
        and o["metadata"]["namespace"] == NAMESPACE
        and o["metadata"]["name"] == "neuronetes:scheduler"
    ]
    (rule,) = [r for r in role["rules"] if r["resources"] == ["leases"]]
    config = next(o for o in find(default_objects(), "ConfigMap", "gpu-scheduler-config"))["data"][
        "config.yaml"
    ]
    lease = re.search(r"resourceName: (\S+)", config)
    assert lease is not None and rule["resourceNames"] == [lease[1]]


def test_the_configmaps_the_operator_and_the_extender_may_read_are_named() -> None:
    """The price table, and for the operator mig-manager's config (docs/rbac.md): every read names
    its ConfigMap; the operator's create of the mig-parted config cannot be limited to a name."""
    objects = default_objects()
    (table,) = find(objects, "ConfigMap", "neuronetes-price-table")
    price_table = {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [table["metadata"]["name"]],
        "verbs": ["get", "list", "watch"],
    }
    mig_parted = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["neuronetes-mig-parted-config"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
    ]
    for component in ("operator", "scheduler"):
        roles = [
            o
            for o in objects
            if o["kind"] in ("Role", "ClusterRole") and o["metadata"]["name"] == f"neuronetes:{component}"
        ]
        configmaps = [r for role in roles for r in role["rules"] if "configmaps" in r["resources"]]
        expected = [*mig_parted, price_table] if component == "operator" else [price_table]
        assert configmaps == expected, component
        assert all(
            r["metadata"]["namespace"] == table["metadata"]["namespace"] for r in roles if r["kind"] == "Role"
        )
