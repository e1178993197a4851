"""The chart helm/neuronetes: lint, its generated docs, and what it renders.

What the chart renders is compared with what the code renders for a local cluster (the scheduler
configuration, the extender's and operator's settings, the webhook configurations), so the two
cannot drift; the CRDs and admission policies are links to the repository's own files, and the
rendered objects are compared with them (test_chart_inputs.py; RBAC: test_chart_rbac.py).
"""

from __future__ import annotations

import base64
import copy
import importlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import click
import msgspec
import pytest
import yaml
from chart_render import (
    CHART,
    NAMESPACE,
    REPO_ROOT,
    chart_docs,
    containers,
    default_objects,
    find,
    helm,
    one,
    parse_cli,
    render,
    template_args,
)
from cryptography import x509

from neuronetes.devcluster.config import (
    BUILTIN_EXTENDER_WEIGHT,
    ExtenderConfig,
    LeaderElection,
    extender_settings,
    scheduler_config,
)
from neuronetes.devcluster.tools import Toolchain, read_versions
from neuronetes.pricing import parse_price_table

pytestmark = pytest.mark.unit

launch: Any = importlib.import_module("neuronetes_operator.launch")
operator_settings: Any = importlib.import_module("neuronetes_operator.settings")
extender_config: Any = importlib.import_module("neuronetes_extender.config")


def _config_map_file(objects: Any, name: str, key: str) -> Any:
    return yaml.safe_load(one(objects, "ConfigMap", name)["data"][key])


# ---- lint and docs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [[], ["--set", "webhook.certManager.enabled=true", "--set", "monitoring.serviceMonitor.enabled=true"]],
    ids=["defaults", "cert-manager-and-service-monitor"],
)
def test_helm_lint_strict_is_clean(extra: list[str]) -> None:
    done = helm("lint", "--strict", CHART, "--namespace", NAMESPACE, *extra)
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


def test_readme_values_table_and_rbac_doc_are_up_to_date() -> None:
    docs = chart_docs()
    for path, text in docs.generated().items():
        assert path.read_text() == text, f"{path} is out of date: run python hack/chart-docs.py"


def test_every_value_is_documented_and_an_undocumented_one_is_named() -> None:
    docs = chart_docs()
    rows = docs.value_rows((CHART / "values.yaml").read_text())
    assert {"scheduler.extender.settings.maxGangSize", "webhook.replicas"} <= {r.key for r in rows}
    with pytest.raises(docs.DocsError, match=r"agent\.secret has no '# --' description"):
        docs.value_rows("agent:\n  # -- documented\n  interval: 1\n  secret: 2\n")


# ---- the default rendering ----------------------------------------------------------------------


def test_default_rendering_has_every_component_in_the_release_namespace() -> None:
    objects = default_objects()
    for kind, name in [
        ("Deployment", "gpu-scheduler"),
        ("Deployment", "neuronetes-operator"),
        ("Deployment", "neuronetes-webhook"),
        ("DaemonSet", "neuronetes-agent"),
        ("PodDisruptionBudget", "gpu-scheduler"),
        ("PodDisruptionBudget", "neuronetes-webhook"),
        ("Service", "neuronetes-webhook"),
        ("Secret", "neuronetes-webhook-tls"),
    ]:
        assert one(objects, kind, name)["metadata"]["namespace"] == NAMESPACE
    assert one(objects, "Deployment", "gpu-scheduler")["spec"]["replicas"] >= 2
    assert one(objects, "Deployment", "neuronetes-webhook")["spec"]["replicas"] >= 2
    assert not find(objects, "ServiceMonitor") and not find(objects, "PrometheusRule")


def test_scheduler_configuration_is_the_dev_clusters_with_one_profile() -> None:
    objects = default_objects()
    rendered = _config_map_file(objects, "gpu-scheduler-config", "config.yaml")
    extender = ExtenderConfig(url="http://127.0.0.1:8888", weight=BUILTIN_EXTENDER_WEIGHT)
    expected = scheduler_config(
        Path("/in-cluster"), extender, leader_election=LeaderElection(namespace=NAMESPACE)
    )
    del expected["clientConnection"]["kubeconfig"]  # in a pod: the in-cluster configuration
    assert rendered == expected
    assert [p["schedulerName"] for p in rendered["profiles"]] == ["neuronetes-scheduler"]
    deployment = one(objects, "Deployment", "gpu-scheduler")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kubectl.kubernetes.io/default-container"] == "extender"
    pod = containers(deployment)
    assert pod["kube-scheduler"]["image"] == f"registry.k8s.io/kube-scheduler:{read_versions().kubernetes}"
    assert "--config=/etc/neuronetes/scheduler/config.yaml" in pod["kube-scheduler"]["args"]


def test_kube_scheduler_accepts_the_rendered_configuration(tmp_path: Path) -> None:
    """The pinned kube-scheduler loads and validates the configuration (``--write-config-to``
    exits after validation); the only change is a kubeconfig, since no pod runs here."""
    binary = Toolchain.pinned().kube_scheduler
    if not binary.exists():
        pytest.skip(f"kube-scheduler not built ({binary})")
    config = _config_map_file(default_objects(), "gpu-scheduler-config", "config.yaml")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    config["clientConnection"]["kubeconfig"] = str(kubeconfig)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [
            str(binary),
            f"--config={tmp_path / 'config.yaml'}",
            f"--write-config-to={tmp_path / 'out.yaml'}",
            "--secure-port=0",  # serve nothing: only the configuration is checked
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    written = yaml.safe_load((tmp_path / "out.yaml").read_text())
    assert [p["schedulerName"] for p in written["profiles"]] == ["neuronetes-scheduler"]
    assert written["leaderElection"]["leaderElect"] is True


def test_extender_settings_load_and_equal_the_dev_clusters() -> None:
    rendered = _config_map_file(default_objects(), "neuronetes-extender-settings", "settings.yaml")
    loaded = msgspec.convert(rendered, extender_config.ExtenderSettings)
    assert loaded == msgspec.convert(extender_settings(), extender_config.ExtenderSettings)


def test_schema_of_extender_settings_names_exactly_the_settings_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    props = schema["properties"]["scheduler"]["properties"]["extender"]["properties"]["settings"]
    fields = msgspec.structs.fields(extender_config.ExtenderSettings)
    assert set(props["properties"]) == {f.encode_name for f in fields}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["scheduler"]["extender"]["settings"]) == set(props["properties"])
    from neuronetes.engine.policy import POLICIES

    assert set(props["properties"]["policy"]["enum"]) == set(POLICIES)


def test_changed_weights_reach_the_settings_file_and_load(tmp_path: Path) -> None:
    values = {
        "scheduler": {"extender": {"settings": {"weights": {"availability": 0.5}, "gangTTLSeconds": 60}}}
    }
    rendered = _config_map_file(render(values, tmp=tmp_path), "neuronetes-extender-settings", "settings.yaml")
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(rendered))
    settings = extender_config.load_settings(path)
    assert settings.weights == {"availability": 0.5} and settings.gang_ttl_seconds == 60
    # --set passes decimals as strings; the settings file still gets a number.
    extra = ["--set", "scheduler.extender.settings.weights.cost=0.25"]
    rendered = _config_map_file(render(extra=extra), "neuronetes-extender-settings", "settings.yaml")
    assert rendered["weights"] == {"cost": 0.25}


def test_schema_of_operator_settings_names_exactly_the_settings_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    props = schema["properties"]["operator"]["properties"]["settings"]["properties"]
    fields = msgspec.structs.fields(operator_settings.OperatorSettings)
    assert set(props) == {f.encode_name for f in fields}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["operator"]["settings"]) == set(props)  # every setting shown in the values


def test_operator_settings_load_with_the_operators_defaults() -> None:
    rendered = _config_map_file(default_objects(), "neuronetes-operator-settings", "settings.yaml")
    loaded = msgspec.convert(rendered, operator_settings.OperatorSettings)
    # The one setting the chart fills in: the price table it renders (pricing.priceTable).
    assert loaded == msgspec.structs.replace(
        operator_settings.OperatorSettings(), price_table=f"{NAMESPACE}/neuronetes-price-table"
    )


def test_autoscaler_settings_and_the_metrics_port_reach_the_operator(tmp_path: Path) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    props = schema["properties"]["operator"]["properties"]["settings"]["properties"]["autoscaler"]
    fields = msgspec.structs.fields(operator_settings.AutoscalerSettings)
    assert set(props["properties"]) == {f.encode_name for f in fields}
    values = {
        "operator": {
            "settings": {
                "metricsPort": 9102,
                "autoscaler": {"intervalSeconds": 2, "prometheusURL": "http://prometheus.monitoring:9090"},
            }
        }
    }
    objects = render(values, tmp=tmp_path)
    loaded = msgspec.convert(
        _config_map_file(objects, "neuronetes-operator-settings", "settings.yaml"),
        operator_settings.OperatorSettings,
    )
    assert loaded.metrics_port == 9102 and loaded.autoscaler.interval_seconds == 2
    assert loaded.autoscaler.prometheus_url == "http://prometheus.monitoring:9090"
    operator = containers(one(objects, "Deployment", "neuronetes-operator"))["operator"]
    assert operator["ports"] == [{"name": "metrics", "containerPort": 9102}]
    assert "ports" not in containers(one(default_objects(), "Deployment", "neuronetes-operator"))["operator"]


def _webhooks_without_client_config(objects: Any) -> list[dict[str, Any]]:
    out = []
    for obj in objects:
        obj = copy.deepcopy(obj)
        obj["metadata"] = {"name": obj["metadata"]["name"]}
        for hook in obj["webhooks"]:
            del hook["clientConfig"]
        out.append(obj)
    return out


def test_webhook_configurations_are_the_ones_the_webhook_registers_locally() -> None:
    objects = default_objects()
    rendered = [
        one(objects, "MutatingWebhookConfiguration", launch.MUTATING_WEBHOOK_NAME),
        one(objects, "ValidatingWebhookConfiguration", launch.VALIDATING_WEBHOOK_NAME),
    ]
    expected = launch.webhook_configurations(b"ca", "https://127.0.0.1:9443")
    assert _webhooks_without_client_config(rendered) == _webhooks_without_client_config(expected)
    hooks = [hook for obj in rendered for hook in obj["webhooks"]]
    for hook, path in zip(hooks, ["/pods", "/evictions", "/objects", "/events"], strict=True):
        service = hook["clientConfig"]["service"]
        assert service == {"name": "neuronetes-webhook", "namespace": NAMESPACE, "path": path, "port": 443}


def test_self_generated_certificate_serves_the_service_and_is_signed_by_the_ca_bundle() -> None:
    objects = default_objects()
    secret = one(objects, "Secret", "neuronetes-webhook-tls")["data"]
    bundle = one(objects, "MutatingWebhookConfiguration", "neuronetes-pods")["webhooks"][0]["clientConfig"]
    assert bundle["caBundle"] == secret["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"neuronetes-webhook.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    webhook = containers(one(objects, "Deployment", "neuronetes-webhook"))["webhook"]
    assert "--cert-dir=/etc/neuronetes/webhook-certs" in webhook["args"]
    assert webhook["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_the_webhook_protects_the_agents_host_paths_wherever_they_are(tmp_path: Path) -> None:
    """GPU pods may not mount the agent's host directories (docs/webhook.md): the webhook is told
    where agent.hostPaths puts them."""

    def protected(objects: Any) -> list[str]:
        args = containers(one(objects, "Deployment", "neuronetes-webhook"))["webhook"]["args"]
        return [a.split("=", 1)[1] for a in args if a.startswith("--protected-host-path=")]

    assert protected(default_objects()) == ["/run/neuronetes", "/var/lib/neuronetes/shim", "/var/run/nri"]
    moved = {"agent": {"hostPaths": {"shimDir": "/opt/gpu/shim", "stateDir": "/srv/neuronetes"}}}
    assert protected(render(moved, tmp=tmp_path)) == ["/srv/neuronetes", "/opt/gpu/shim", "/var/run/nri"]


def test_external_url_variant_registers_the_url_and_certifies_its_address(tmp_path: Path) -> None:
    """Replicas served outside the cluster (``webhook.externalURL``): the configurations call the
    URL, and the generated certificate holds its IP address."""
    webhook = {"externalURL": "https://127.0.0.1:9443", "certificates": {"extraIPAddresses": ["127.0.0.1"]}}
    objects = render({"webhook": webhook}, tmp=tmp_path)
    pods = one(objects, "MutatingWebhookConfiguration", "neuronetes-pods")["webhooks"][0]["clientConfig"]
    assert pods["url"] == "https://127.0.0.1:9443/pods" and "service" not in pods
    secret = one(objects, "Secret", "neuronetes-webhook-tls")["data"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_cert_manager_variant_issues_the_secret_and_injects_the_ca(tmp_path: Path) -> None:
    objects = render({"webhook": {"certManager": {"enabled": True}}}, tmp=tmp_path)
    assert not find(objects, "Secret")
    cert = one(objects, "Certificate", "neuronetes-webhook")
    assert cert["spec"]["secretName"] == "neuronetes-webhook-tls"
    assert cert["spec"]["issuerRef"] == {"name": "neuronetes-selfsigned", "kind": "Issuer"}
    assert one(objects, "Issuer", "neuronetes-selfsigned")["spec"] == {"selfSigned": {}}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (obj,) = find(objects, kind)
        assert (
            obj["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            == f"{NAMESPACE}/neuronetes-webhook"
        )
        assert "caBundle" not in obj["webhooks"][0]["clientConfig"]
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer"}
    objects = render({"webhook": {"certManager": {"enabled": True, "issuerRef": issuer}}}, tmp=tmp_path)
    assert not find(objects, "Issuer")
    assert one(objects, "Certificate", "neuronetes-webhook")["spec"]["issuerRef"] == issuer


# ---- containers ---------------------------------------------------------------------------------


def _expand(arg: str) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: {"POD_IP": "10.1.2.3", "NODE_NAME": "gpu-1"}[m[1]], arg)


def test_neuronetes_containers_run_real_entry_points_with_valid_arguments() -> None:
    seen = set()
    for obj in [*find(default_objects(), "Deployment"), *find(default_objects(), "DaemonSet")]:
        for c in containers(obj).values():
            if c["command"] == ["neuronetes"]:
                seen.add(parse_cli([_expand(a) for a in c["args"]]))
    assert seen == {"extender", "operator", "webhook", "agent"}
    with pytest.raises((SystemExit, click.UsageError)):  # a refused flag: argparse exits, click raises
        parse_cli(["extender", "serve", "--hots=127.0.0.1"])


def test_ports_stay_on_loopback_or_the_pods_own_address() -> None:
    objects = default_objects()
    extender = containers(one(objects, "Deployment", "gpu-scheduler"))["extender"]
    assert "--host=127.0.0.1" in extender["args"] and "ports" not in extender
    agent = containers(one(objects, "DaemonSet", "neuronetes-agent"))["agent"]
    assert "--metrics-host=127.0.0.1" in agent["args"]
    for obj in [*find(objects, "Deployment"), *find(objects, "DaemonSet")]:
        spec = obj["spec"]["template"]["spec"]
        assert not spec.get("hostNetwork"), obj["metadata"]["name"]
        # Only the agent shares the host's PID namespace (it registers containers' host PIDs).
        assert bool(spec.get("hostPID")) == (obj["metadata"]["name"] == "neuronetes-agent")
        for c in spec["containers"]:
            assert not any(a.startswith("--host=0.0.0.0") or "--insecure" in a for a in c.get("args", []))


def test_security_contexts_only_the_agent_is_privileged() -> None:
    for obj in [*find(default_objects(), "Deployment"), *find(default_objects(), "DaemonSet")]:
        for name, c in containers(obj).items():
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, name
            if name == "agent":
                assert sc["privileged"] is True
                continue
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], name
            if name != "nri-plugin":  # root for the runtime's socket, without capabilities
                assert sc["runAsNonRoot"] is True, name


def test_agent_serves_its_own_node_not_a_fleet() -> None:
    ds = one(default_objects(), "DaemonSet", "neuronetes-agent")
    agent = containers(ds)["agent"]
    assert "--node=$(NODE_NAME)" in agent["args"]
    assert not any(a.startswith("--simulate-nodes") for a in agent["args"])
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # NVML is the one host library on the agent's library path (a host folder would shadow the
    # image's own libraries, glibc included).
    (nvml,) = [m for m in agent["volumeMounts"] if m["name"] == "nvml"]
    assert env["LD_LIBRARY_PATH"]["value"] + "/libnvidia-ml.so.1" == nvml["mountPath"]
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["nvml"]["hostPath"]["type"] == "File"
    # The host's cgroup mount, read-only at its own path, is the agent's --cgroup-root.
    (cgroup,) = [m for m in agent["volumeMounts"] if m["name"] == "cgroup"]
    assert cgroup["readOnly"] and f"--cgroup-root={cgroup['mountPath']}" in agent["args"]
    assert volumes["cgroup"]["hostPath"]["path"] == cgroup["mountPath"]
    # NVML reconciliation enforces by default, with the documented grace and tolerance.
    assert {"--reconcile=enforce", "--reconcile-grace=30", "--reconcile-context-allowance=1024"} <= set(
        agent["args"]
    ) and "--reconcile-margin=64" in agent["args"]
    # The NRI plugin writes only its container records (and the runtime's socket).
    plugin = containers(ds)["nri-plugin"]
    writable = {m["mountPath"] for m in plugin["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/run/neuronetes/containers.d", "/var/run/nri"}


def test_the_agent_installs_the_shim_from_where_containers_see_it() -> None:
    from neuronetes.contracts import SHIM_LIBRARY_PATH

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["agent"]["shimLibrary"] == SHIM_LIBRARY_PATH  # the image puts the shim there


def test_the_nri_plugin_runs_the_binary_the_image_build_installs() -> None:
    script = REPO_ROOT / "hack" / "build-image-contents.sh"
    if not script.exists():
        pytest.skip("no image build script (hack/build-image-contents.sh) to compare the path with")
    (binary,) = re.findall(r"^NRI_BINARY=(\S+)$", script.read_text(), re.M)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["agent"]["nri"]["command"] == "/" + binary


def test_image_tag_defaults_to_the_app_version_which_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in pyproject
    operator = containers(one(default_objects(), "Deployment", "neuronetes-operator"))["operator"]
    assert operator["image"].endswith(f":{chart['appVersion']}")


def test_the_agent_takes_extra_volumes_and_the_nri_plugin_can_be_left_out() -> None:
    extra = [
        "--set-json",
        'agent.extraVolumes=[{"name":"driver","hostPath":{"path":"/run/nvidia/driver","type":"Directory"}}]',
        "--set-json",
        'agent.extraVolumeMounts=[{"name":"driver","mountPath":"/run/nvidia/driver","readOnly":true}]',
    ]
    agent = one(render(extra=extra), "DaemonSet", "neuronetes-agent")
    assert {"name": "driver", "hostPath": {"path": "/run/nvidia/driver", "type": "Directory"}} in agent[
        "spec"
    ]["template"]["spec"]["volumes"]
    mounts = containers(agent)["agent"]["volumeMounts"]
    assert {"name": "driver", "mountPath": "/run/nvidia/driver", "readOnly": True} in mounts
    assert set(containers(agent)) == {"agent", "nri-plugin"}
    # Nodes whose runtime has no NRI: the agent alone.
    without = one(render(extra=["--set", "agent.nri.enabled=false"]), "DaemonSet", "neuronetes-agent")
    assert set(containers(without)) == {"agent"}


def test_the_operator_mounts_the_carbon_sources_secret_and_the_settings_name_it() -> None:
    """docs/carbon.md's chart example: the Secret is mounted where credentialFile points, an
    environment variable from a secretKeyRef is set, and the settings load."""
    source = {
        "type": "electricity-maps",
        "url": "https://api.electricitymap.org",
        "location": "FR",
        "credentialFile": "/var/run/secrets/electricity-maps/token",
    }
    secret = {"secretName": "electricity-maps", "items": [{"key": "token", "path": "token"}]}
    env = {"name": "WT_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "watttime", "key": "password"}}}
    mount = {"name": "em", "mountPath": "/var/run/secrets/electricity-maps", "readOnly": True}
    extra = [
        "--set-json", f"operator.settings.carbon.source={json.dumps(source)}",
        "--set-json", f"operator.extraVolumes={json.dumps([{'name': 'em', 'secret': secret}])}",
        "--set-json", f"operator.extraVolumeMounts={json.dumps([mount])}",
        "--set-json", f"operator.extraEnv={json.dumps([env])}",
    ]  # fmt: skip
    objects = render(extra=extra)
    op = one(objects, "Deployment", "neuronetes-operator")
    assert {"name": "em", "secret": secret} in op["spec"]["template"]["spec"]["volumes"]
    ctr = containers(op)["operator"]
    assert mount in ctr["volumeMounts"] and ctr["env"] == [env]
    settings = _config_map_file(objects, "neuronetes-operator-settings", "settings.yaml")
    loaded = msgspec.convert(settings, operator_settings.OperatorSettings)
    assert loaded.carbon.source.credential_file == "/var/run/secrets/electricity-maps/token"
    # Without extras the operator has neither.
    plain = containers(one(render(), "Deployment", "neuronetes-operator"))["operator"]
    assert "env" not in plain and [m["name"] for m in plain["volumeMounts"]] == [
        "settings",
        "priority-tiers",
        "tmp",
    ]


def test_the_price_table_value_becomes_the_configmap_both_components_watch(tmp_path: Path) -> None:
    table = {"p4d.24xlarge": {"on-demand": 32.77, "spot": 13.11}, "g5.48xlarge": {"on-demand": 16.29}}
    objects = render({"pricing": {"priceTable": table}}, tmp=tmp_path)
    rendered = one(objects, "ConfigMap", "neuronetes-price-table")["data"]["prices.yaml"]
    parsed = parse_price_table(rendered)
    assert (
        parsed.lookup("p4d.24xlarge", "spot") == 13.11 and parsed.lookup("g5.48xlarge", "on-demand") == 16.29
    )
    ref = f"{NAMESPACE}/neuronetes-price-table"
    assert _config_map_file(objects, "neuronetes-operator-settings", "settings.yaml")["priceTable"] == ref
    assert (
        f"--price-table={ref}" in containers(one(objects, "Deployment", "gpu-scheduler"))["extender"]["args"]
    )
    # The schema refuses a price that is no price, naming the entry, before anything is installed.
    bad = helm(
        *template_args({"pricing": {"priceTable": {"p4d.24xlarge": {"spot": -1}}}}, tmp=tmp_path), check=False
    )
    assert bad.returncode != 0 and "p4d.24xlarge" in bad.stderr and "spot" in bad.stderr
