"""What the dev cluster renders for kube-scheduler, the extender and the API server (offline)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuronetes.cli.dev import feature_gates as _feature_gates
from neuronetes.contracts import ANNOTATION_ASSIGNED_GPUS, GROUP, SCHEDULER_NAME
from neuronetes.devcluster import POLICIES_DIR, ExtenderConfig, LeaderElection, procs
from neuronetes.devcluster.access import (
    EXTENDER_NAMESPACE,
    EXTENDER_SERVICE_ACCOUNT,
    EXTENDER_USERNAME,
    SCHEDULER_USER,
    extender_identity,
    extender_rules,
    kubeconfig,
    scheduler_lease_access,
    static_tokens,
    token_request,
)
from neuronetes.devcluster.api import object_path
from neuronetes.devcluster.components import Layout, extender_argv, pair_names, scheduler_argv
from neuronetes.devcluster.config import DEV_LEADER_ELECTION, extender_settings, scheduler_config
from neuronetes.devcluster.state import ClusterError, RunState, StateStore
from neuronetes.devcluster.supervisor import Supervisor
from neuronetes.devcluster.tools import Toolchain

pytestmark = pytest.mark.unit


def layout(count: int) -> Layout:
    ports = {"etcd": 1, "etcd_peer": 2, "apiserver": 3, "controller_manager": 4, "kwok": 5}
    for i in range(count):
        sfx = pair_names(i, count)[2]
        ports["scheduler" + sfx] = 100 + i
        ports["extender" + sfx] = 200 + i
    return Layout(Path("/state"), "t", ports, Toolchain.pinned())


def test_one_scheduler_runs_without_leader_election() -> None:
    doc = scheduler_config(Path("/k"), None)
    assert doc["leaderElection"] == {"leaderElect": False}


def test_leader_election_uses_one_lease_with_short_dev_timings() -> None:
    doc = scheduler_config(Path("/k"), None, leader_election=DEV_LEADER_ELECTION)
    le = doc["leaderElection"]
    assert le["leaderElect"] is True and le["resourceLock"] == "leases"
    # Not the cluster's own kube-scheduler's Lease; kube-scheduler's stock identity may hold it.
    assert (le["resourceNamespace"], le["resourceName"]) == ("kube-system", "neuronetes-scheduler")
    role, binding = scheduler_lease_access(le["resourceName"])
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["neuronetes-scheduler"],
            "verbs": ["get", "update"],
        }
    ]
    assert binding["subjects"][0]["name"] == SCHEDULER_USER and role["metadata"]["namespace"] == "kube-system"
    assert (le["leaseDuration"], le["renewDeadline"], le["retryPeriod"]) == ("4s", "3s", "1s")
    assert LeaderElection().to_json()["leaseDuration"] == "15s"  # kube-scheduler's own default
    with pytest.raises(ValueError, match="leaseDuration > renewDeadline"):
        LeaderElection(lease_duration_s=3, renew_deadline_s=3, retry_period_s=1)


def test_each_pair_has_its_own_extender_on_its_own_loopback_port() -> None:
    at = layout(2)
    names = [pair_names(i, 2) for i in range(2)]
    assert names == [("kube-scheduler-1", "extender-1", "-1"), ("kube-scheduler-2", "extender-2", "-2")]
    assert pair_names(0, 1) == ("kube-scheduler", "extender", "")
    configs = set()
    for i in range(2):
        argv = extender_argv(at, i, 2)
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--port") + 1] == str(200 + i)
        assert argv[argv.index("--kubeconfig") + 1] == str(at.extender_kubeconfig)
        assert argv[argv.index("--config") + 1] == str(at.extender_settings)
        sched = scheduler_argv(at, i, 2, feature_gates={"GenericWorkload": True})
        assert f"--secure-port={100 + i}" in sched and "--bind-address=127.0.0.1" in sched
        assert "--feature-gates=GenericWorkload=true" in sched
        configs.add(next(a for a in sched if a.startswith("--config=")))
    assert len(configs) == 2


def test_scheduler_config_calls_its_pairs_extender_with_both_entries() -> None:
    ext = ExtenderConfig(url="http://127.0.0.1:200", weight=20)
    doc = scheduler_config(Path("/k"), ext, leader_election=DEV_LEADER_ELECTION)
    decide, bind = doc["extenders"]
    assert decide["urlPrefix"] == bind["urlPrefix"] == "http://127.0.0.1:200"
    assert decide["weight"] == 20 and bind["bindVerb"] == "bind" and not bind["ignorable"]
    assert [p["schedulerName"] for p in doc["profiles"]] == [SCHEDULER_NAME]


def test_kube_scheduler_runs_as_its_stock_identity() -> None:
    admin, scheduler = static_tokens("a", "s").splitlines()
    assert admin == 'a,neuronetes-admin,neuronetes-admin,"system:masters"'
    assert scheduler == "s,system:kube-scheduler,system:kube-scheduler"
    at = layout(1)
    argv = scheduler_argv(at, 0, 1, feature_gates={})
    assert f"--authentication-kubeconfig={at.scheduler_kubeconfig}" in argv
    assert all(str(at.kubeconfig) not in a for a in argv)


def test_extender_settings_file_keys() -> None:
    assert extender_settings() == {"filterTopK": 3}
    assert extender_settings(gangTTLSeconds=60) == {"filterTopK": 3, "gangTTLSeconds": 60}


def rules_by_resource() -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in extender_rules():
        assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames, no nonResourceURLs"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_extender_role_holds_exactly_the_calls_its_code_makes() -> None:
    watch = {"list", "watch"}
    assert rules_by_resource() == {
        ("", "nodes"): watch,
        ("", "pods"): watch | {"get", "patch"},
        ("", "pods/binding"): {"create"},
        ("", "pods/eviction"): {"create"},  # the preemption controller
        ("policy", "poddisruptionbudgets"): watch,  # ... and the PDBs that order its victims
        ("events.k8s.io", "events"): {"create"},
        (GROUP, "gangreservations"): watch | {"create", "patch", "delete"},
        (GROUP, "gangreservations/status"): {"patch"},
        (GROUP, "gpunodes"): watch,
        (GROUP, "gpuslices"): watch,
        ("scheduling.x-k8s.io", "podgroups"): watch,
        ("scheduling.volcano.sh", "podgroups"): watch,
    }
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in extender_rules())


def test_extender_identity_objects_bind_the_role_to_the_service_account() -> None:
    objs = {o["kind"]: o for o in extender_identity()}
    assert set(objs) == {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    (subject,) = objs["ClusterRoleBinding"]["subjects"]
    assert (subject["namespace"], subject["name"]) == (EXTENDER_NAMESPACE, EXTENDER_SERVICE_ACCOUNT)
    assert objs["ClusterRoleBinding"]["roleRef"]["name"] == objs["ClusterRole"]["metadata"]["name"]
    assert f"system:serviceaccount:{EXTENDER_NAMESPACE}:{EXTENDER_SERVICE_ACCOUNT}" == EXTENDER_USERNAME
    assert object_path(objs["ServiceAccount"]) == (
        f"/api/v1/namespaces/{EXTENDER_NAMESPACE}/serviceaccounts/{EXTENDER_SERVICE_ACCOUNT}"
    )
    assert object_path(objs["ClusterRole"]).startswith("/apis/rbac.authorization.k8s.io/v1/clusterroles/")
    path, body = token_request()
    assert (
        path.endswith(f"/serviceaccounts/{EXTENDER_SERVICE_ACCOUNT}/token") and body["kind"] == "TokenRequest"
    )
    kc = kubeconfig(name="c", server="https://127.0.0.1:1", ca_pem=b"x", token="t", user="sa")
    assert kc["users"] == [{"name": "c-sa", "user": {"token": "t"}}]


def policies() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for f in sorted(POLICIES_DIR.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def test_admission_policies_parse_and_each_is_bound_to_deny() -> None:
    docs = policies()
    assert {d["apiVersion"] for d in docs} == {"admissionregistration.k8s.io/v1"}
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    pols, binds = by_kind["ValidatingAdmissionPolicy"], by_kind["ValidatingAdmissionPolicyBinding"]
    assert len(pols) == 5 and {b["spec"]["policyName"] for b in binds.values()} == set(pols)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in binds.values())
    for pol in pols.values():
        spec = pol["spec"]
        assert spec["failurePolicy"] == "Fail"
        assert all(v.get("message") or v.get("messageExpression") for v in spec["validations"])


def test_the_assignment_policy_trusts_exactly_the_extender_identity() -> None:
    (pol,) = [
        d for d in policies() if "assigned-gpus" in d["metadata"]["name"] and "policyName" not in d["spec"]
    ]
    variables = {v["name"]: v["expression"] for v in pol["spec"]["variables"]}
    assert variables["extenderUser"] == repr(EXTENDER_USERNAME)
    assert variables["key"] == repr(ANNOTATION_ASSIGNED_GPUS)
    (rule,) = pol["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert set(rule["resources"]) == {"pods", "pods/*", "bindings"}


def test_the_agent_policy_matches_the_agent_and_lets_it_change_only_its_own_labels() -> None:
    """neuronetes.io-agent-writes-only-its-node: the agent's user (the webhook's eviction check
    names the same), the writes RBAC grants it, and exactly the labels the agent publishes."""
    from neuronetes_agent.daemon.publish import GPU_LABEL_KEYS
    from neuronetes_operator.launch import AGENT_USERNAME

    (pol,) = [d for d in policies() if d["metadata"]["name"].endswith("agent-writes-only-its-node")
              and d["kind"] == "ValidatingAdmissionPolicy"]  # fmt: skip
    (condition,) = pol["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == {AGENT_USERNAME!r}"
    variables = {v["name"]: v["expression"] for v in pol["spec"]["variables"]}
    assert yaml.safe_load(variables["agentLabels"]) == list(GPU_LABEL_KEYS)
    assert variables["nodeKey"] == repr("authentication.kubernetes.io/node-name")
    covered = {
        (g, r) for rule in pol["spec"]["matchConstraints"]["resourceRules"]
        for g in rule["apiGroups"] for r in rule["resources"]
    }  # fmt: skip
    assert covered == {
        ("", "nodes"), ("", "nodes/status"), ("", "events"), ("events.k8s.io", "events"),
        ("neuronetes.io", "gpunodes"), ("neuronetes.io", "gpunodes/status"),
    }  # fmt: skip


def test_state_records_the_shape_of_the_cluster() -> None:
    state = RunState(
        name="t",
        ports={"scheduler-1": 1, "scheduler-2": 2, "extender-1": 3, "extender-2": 4},
        versions={},
        run_extender=True,
        schedulers=2,
        feature_gates={"GangScheduling": True},
    )
    state.processes["etcd"] = procs.ProcessRecord("etcd", 1, 2, ("etcd",), "/l")
    again = RunState.from_json(state.to_json())
    assert again == state
    assert again.extender_urls() == ["http://127.0.0.1:3", "http://127.0.0.1:4"]
    external = RunState(name="t", ports={}, versions={}, extender={"urlPrefix": "http://x:1"}, schedulers=2)
    assert external.extender_urls() == ["http://x:1", "http://x:1"]


def test_feature_gates_option() -> None:
    assert _feature_gates(["GenericWorkload=true,GangScheduling=TRUE", "Foo=false"]) == {
        "GenericWorkload": True,
        "GangScheduling": True,
        "Foo": False,
    }
    with pytest.raises(ValueError, match="NAME=true"):
        _feature_gates(["GenericWorkload"])


def test_a_crashed_process_restarts_with_its_recorded_command_line(tmp_path: Path) -> None:
    store = StateStore("t", tmp_path / "t")
    store.wipe()
    sup = Supervisor(store)
    state = RunState(name="t", ports={}, versions={})
    first = sup.spawn(state, "sleeper", ["sleep", "60"])
    try:
        assert store.running().processes["sleeper"] == first
        sup.kill(state, ["sleeper"])
        assert not procs.is_running(first)
        with pytest.raises(ClusterError, match="no process 'nope'"):
            sup.kill(state, ["nope"])
        sup.restart(state, "sleeper", lambda: (True, ""), time.monotonic() + 5)
        again = store.running().processes["sleeper"]
        assert again.argv == first.argv and again.pid != first.pid and procs.is_running(again)
    finally:
        sup.stop(state, grace_s=2)
    assert procs.survivors(store.records()) == []
