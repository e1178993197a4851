"""What the chart takes in: its values (the schema refuses bad ones, install-time checks refuse bad
combinations), its monitoring files (any dashboards and rule files), and the repository's CRDs and
admission policies it links to (one source, byte for byte in the package). The renderings
themselves: test_chart.py; RBAC: test_chart_rbac.py.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from chart_render import (
    CHART,
    NAMESPACE,
    REPO_ROOT,
    containers,
    default_objects,
    find,
    helm,
    one,
    render,
    template_args,
)

pytestmark = pytest.mark.unit


# ---- monitoring ---------------------------------------------------------------------------------


def _chart_copy(tmp_path: Path) -> Path:
    """A copy of the chart with its links resolved and no dashboards or rules of its own."""
    chart = tmp_path / "neuronetes"
    shutil.copytree(CHART, chart, symlinks=False)
    for folder in ("dashboards", "rules"):
        shutil.rmtree(chart / "files" / folder, ignore_errors=True)
        (chart / "files" / folder).mkdir()
    return chart


def test_monitoring_renders_any_dashboards_and_rule_files(tmp_path: Path) -> None:
    chart = _chart_copy(tmp_path)
    dashboards = {"gpus": {"title": "GPUs", "panels": []}, "queue": {"title": "Queue", "panels": []}}
    for name, doc in dashboards.items():
        (chart / "files" / "dashboards" / f"{name}.json").write_text(json.dumps(doc))
    groups = [
        {"name": "a", "rules": [{"alert": "A", "expr": "up == 0", "for": "5m"}]},
        {"name": "b", "rules": [{"record": "b:sum", "expr": "sum(up)"}]},
    ]
    (chart / "files" / "rules" / "one.yaml").write_text(yaml.safe_dump({"groups": groups[:1]}))
    (chart / "files" / "rules" / "two.yaml").write_text(yaml.safe_dump({"groups": groups[1:]}))
    values = {
        "monitoring": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "prometheusRule": {"enabled": True},
        }
    }
    objects = render(values, chart=chart, tmp=tmp_path)
    assert one(objects, "PrometheusRule", "neuronetes")["spec"]["groups"] == groups
    for name, doc in dashboards.items():
        cm = one(objects, "ConfigMap", f"neuronetes-dashboard-{name}")
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(cm["data"][f"{name}.json"]) == doc
    monitor = one(objects, "ServiceMonitor", "neuronetes-agent")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    agent = containers(one(objects, "DaemonSet", "neuronetes-agent"))["agent"]
    assert "--metrics-host=$(POD_IP)" in agent["args"]
    assert one(objects, "Service", "neuronetes-agent-metrics")["spec"]["clusterIP"] == "None"
    # The extender: a metrics-only listener on the pod's IP; the verbs stay on loopback.
    assert one(objects, "ServiceMonitor", "neuronetes-scheduler")["metadata"]["labels"]["release"] == "prom"
    assert one(objects, "Service", "neuronetes-scheduler-metrics")["spec"]["ports"][0]["port"] == 9465
    extender = containers(one(objects, "Deployment", "gpu-scheduler"))["extender"]
    assert "--metrics-bind-address=$(POD_IP):9465" in extender["args"]
    assert "--host=127.0.0.1" in extender["args"]


def test_without_monitoring_the_extender_serves_on_loopback_only() -> None:
    extender = containers(one(render(), "Deployment", "gpu-scheduler"))["extender"]
    assert not any(arg.startswith("--metrics-bind-address") for arg in extender["args"])
    assert "ports" not in extender


def test_prometheus_rule_without_rule_files_is_one_clear_error(tmp_path: Path) -> None:
    chart = _chart_copy(tmp_path)
    values = {"monitoring": {"prometheusRule": {"enabled": True}}}
    done = helm(*template_args(values, chart=chart, tmp=tmp_path), check=False)
    assert done.returncode != 0 and "no rule groups in files/rules" in done.stderr


def test_the_charts_own_dashboards_and_rules_render_whole() -> None:
    dashboards = sorted((CHART / "files" / "dashboards").glob("*.json"))
    rules = sorted((CHART / "files" / "rules").glob("*.yaml"))
    if not dashboards and not rules:
        pytest.skip("the chart ships no dashboards or rule files")
    extra = ["--set", "monitoring.prometheusRule.enabled=true"] if rules else []
    objects = render(extra=extra)
    for path in dashboards:
        cm = one(objects, "ConfigMap", f"neuronetes-dashboard-{path.stem}")
        assert json.loads(cm["data"][path.name]) == json.loads(path.read_text())
    if rules:
        groups = [g for path in rules for g in yaml.safe_load(path.read_text())["groups"]]
        assert one(objects, "PrometheusRule", "neuronetes")["spec"]["groups"] == groups


# ---- the schema ---------------------------------------------------------------------------------


BAD_VALUES = [
    ({"webhook": {"replicas": 1}}, "/webhook/replicas"),
    ({"scheduler": {"replicas": 1}}, "/scheduler/replicas"),
    ({"schedulr": {}}, "schedulr"),
    ({"scheduler": {"extender": {"settings": {"maxGangSise": 8}}}}, "maxGangSise"),
    ({"scheduler": {"extender": {"settings": {"filterTopK": 0}}}}, "/scheduler/extender/settings/filterTopK"),
    (
        {"scheduler": {"extender": {"settings": {"weights": {"cost": -1}}}}},
        "/scheduler/extender/settings/weights/cost",
    ),
    ({"scheduler": {"extender": {"settings": {"policy": "fastest"}}}}, "/scheduler/extender/settings/policy"),
    ({"scheduler": {"kubeScheduler": {"leaderElection": {"leaseDuration": "15"}}}}, "leaseDuration"),
    ({"scheduler": {"kubeScheduler": {"bindTimeout": "2m"}}}, "/scheduler/kubeScheduler/bindTimeout"),
    ({"logLevel": "verbose"}, "/logLevel"),
    ({"agent": {"hostPaths": {"stateDir": "run/neuronetes"}}}, "/agent/hostPaths/stateDir"),
    ({"agent": {"reconcile": {"mode": "evict"}}}, "/agent/reconcile/mode"),
    ({"agent": {"reconcile": {"graceSeconds": -1}}}, "/agent/reconcile/graceSeconds"),
    ({"agent": {"reconcile": {"contextAllowanceMiB": 0.5}}}, "/agent/reconcile/contextAllowanceMiB"),
    ({"agent": {"reconcile": {"grace": 10}}}, "/agent/reconcile"),
    ({"operator": {"settings": {"workers": 0}}}, "/operator/settings/workers"),
    ({"operator": {"settings": {"batchSize": 0}}}, "/operator/settings/batchSize"),
    ({"agentPools": {"maxReplicas": 4097}}, "/agentPools/maxReplicas"),
    ({"agentPools": {"maxReplicas": 0}}, "/agentPools/maxReplicas"),
    ({"webhook": {"timeoutSeconds": 31}}, "/webhook/timeoutSeconds"),
    ({"webhook": {"externalURL": "http://127.0.0.1:9443"}}, "/webhook/externalURL"),
    ({"priorityTiers": [{"name": "top", "value": 2000000000}]}, "/priorityTiers/0/value"),
    ({"priorityTiers": [{"name": "Gold", "value": 5}]}, "/priorityTiers/0/name"),
    ({"priorityTiers": [{"name": "x", "value": 5, "namespace": ["a"]}]}, "/priorityTiers/0"),
]


@pytest.mark.parametrize(("values", "where"), BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_schema_refuses_bad_values(values: dict[str, Any], where: str, tmp_path: Path) -> None:
    done = helm(*template_args(values, tmp=tmp_path), check=False)
    assert done.returncode != 0
    assert "don't meet the specifications of the schema" in done.stderr and where in done.stderr, done.stderr


BAD_COMBINATIONS = [
    (
        {"scheduler": {"kubeScheduler": {"leaderElection": {"renewDeadline": "20s"}}}},
        "need leaseDuration > renewDeadline > 1.2 x retryPeriod > 0 (got 15s, 20s, 2s)",
    ),
    (
        {"scheduler": {"extender": {"settings": {"bindWaitSeconds": 200}}}},
        "bindWaitSeconds (200) must stay below scheduler.kubeScheduler.bindTimeout (130s)",
    ),
    (
        {"priorityTiers": [{"name": "a", "value": 5}, {"name": "a", "value": 6}]},
        "priorityTiers: the name a is used by more than one tier",
    ),
    (
        {"priorityTiers": [{"name": "a", "value": 5}, {"name": "b", "value": 5}]},
        "priorityTiers: the value 5 is used by more than one tier",
    ),
]


@pytest.mark.parametrize(
    ("values", "message"), BAD_COMBINATIONS, ids=["leader-election", "bind-wait", "tier-name", "tier-value"]
)
def test_combinations_kube_scheduler_or_the_extender_would_refuse_fail_the_install(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    done = helm(*template_args(values, tmp=tmp_path), check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr


# ---- one source: CRDs and admission policies ----------------------------------------------------


def _crds_from_repo() -> list[Any]:
    return [yaml.safe_load(p.read_text()) for p in sorted((REPO_ROOT / "crds").glob("*.yaml"))]


def test_chart_crds_are_the_repositorys_crds() -> None:
    link = CHART / "crds"
    assert link.is_symlink() and link.resolve() == (REPO_ROOT / "crds").resolve()
    rendered = [o for o in render(extra=["--include-crds"]) if o["kind"] == "CustomResourceDefinition"]
    key = lambda o: o["metadata"]["name"]  # noqa: E731
    assert sorted(rendered, key=key) == sorted(_crds_from_repo(), key=key)


def test_packaged_chart_carries_the_crds_and_policies_byte_for_byte(tmp_path: Path) -> None:
    helm("package", CHART, "--destination", tmp_path)
    (archive,) = tmp_path.glob("neuronetes-*.tgz")
    with tarfile.open(archive) as tar:
        packed = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    for source, inside in [
        (REPO_ROOT / "crds", "crds"),
        (REPO_ROOT / "manifests" / "policies", "files/policies"),
    ]:
        for path in source.glob("*.yaml"):
            assert packed[f"neuronetes/{inside}/{path.name}"] == path.read_bytes()


def _policies(objects: Any) -> list[Any]:
    kinds = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    return [o for o in objects if o["kind"] in kinds]


@pytest.mark.parametrize("namespace", [NAMESPACE, "gpu-platform"])
def test_admission_policies_are_manifests_policies_naming_the_releases_extender(namespace: str) -> None:
    """... and the release's node agent (the policy that holds each agent to its own node)."""
    expected = []
    user = f"system:serviceaccount:{namespace}:neuronetes-scheduler"
    agent = f"system:serviceaccount:{namespace}:neuronetes-agent"
    for path in sorted((REPO_ROOT / "manifests" / "policies").glob("*.yaml")):
        text = (
            path.read_text()
            .replace("'system:serviceaccount:neuronetes-system:neuronetes-scheduler'", f"'{user}'")
            .replace("'system:serviceaccount:neuronetes-system:neuronetes-agent'", f"'{agent}'")
        )
        expected += [d for d in yaml.safe_load_all(text) if d]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(_policies(render(namespace=namespace)), key=key) == sorted(expected, key=key)
    assert any(f"'{user}'" in json.dumps(p) for p in expected)
    assert any(f"'{agent}'" in json.dumps(p) for p in expected)


def test_the_agentpool_replica_maximum_is_the_chart_value(tmp_path: Path) -> None:
    def bounds(objects: Any) -> dict[str, str]:
        return {
            p["metadata"]["name"]: v["expression"]
            for p in _policies(objects)
            if p["kind"] == "ValidatingAdmissionPolicy"
            for v in p["spec"].get("variables") or []
            if v["name"] == "maxReplicas"
        }

    assert bounds(render()) == {
        "neuronetes.io-agentpool-replicas": "1024",
        "neuronetes.io-agentpool-scale": "1024",
    }
    raised = bounds(render({"agentPools": {"maxReplicas": 4096}}, tmp=tmp_path))
    assert raised == {"neuronetes.io-agentpool-replicas": "4096", "neuronetes.io-agentpool-scale": "4096"}


def test_the_scheduler_gets_the_api_priority_kube_scheduler_has(tmp_path: Path) -> None:
    (schema,) = find(default_objects(), "FlowSchema")
    assert schema["metadata"]["name"].endswith("-gpu-scheduler")
    assert schema["spec"]["priorityLevelConfiguration"]["name"] == "workload-high"
    (subject,) = schema["spec"]["rules"][0]["subjects"]
    assert subject["serviceAccount"] == {"name": "neuronetes-scheduler", "namespace": NAMESPACE}
    off = render({"scheduler": {"flowSchema": {"enabled": False}}}, tmp=tmp_path)
    assert not [o for o in off if o["kind"] == "FlowSchema"]


# ---- priority tiers -----------------------------------------------------------------------------


def test_the_priority_tiers_are_the_operators_defaults_and_their_classes_the_local_clusters() -> None:
    """The chart creates the tiers' PriorityClasses and hands the operator and the webhook the same
    tiers file: what a local cluster gets from neuronetes_operator.launch."""
    from neuronetes_operator import launch, tiers

    values = yaml.safe_load((CHART / "values.yaml").read_text())["priorityTiers"]
    assert msgspec.convert(values, list[tiers.PriorityTier]) == list(tiers.DEFAULT_TIERS)
    rendered = one(default_objects(), "ConfigMap", "neuronetes-priority-tiers")["data"]["tiers.yaml"]
    assert msgspec.yaml.decode(rendered, type=list[tiers.PriorityTier]) == list(tiers.DEFAULT_TIERS)

    def bare(o: dict[str, Any]) -> dict[str, Any]:
        labels = o["metadata"]["labels"]
        return {
            **o,
            "metadata": {"name": o["metadata"]["name"], "tier": labels["neuronetes.io/priority-tier"]},
        }

    key = lambda o: o["metadata"]["name"]  # noqa: E731
    classes = sorted(map(bare, find(default_objects(), "PriorityClass")), key=key)
    assert classes == sorted(map(bare, launch.priority_classes(tiers.DEFAULT_TIERS)), key=key)
    for name in ("neuronetes-operator", "neuronetes-webhook"):
        (ctr,) = containers(one(default_objects(), "Deployment", name)).values()
        assert "--priority-tiers=/etc/neuronetes/priority-tiers/tiers.yaml" in ctr["args"]
        mount = next(m for m in ctr["volumeMounts"] if m["name"] == "priority-tiers")
        assert mount["mountPath"] == "/etc/neuronetes/priority-tiers"
