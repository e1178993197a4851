"""The chart runner's pure parts: a pod's plan (podplan), the agent fleet, the egress proxy's protocol.

The last tests render the real chart (``helm template``, skipped without the pinned helm) and
plan every workload of it, so a chart change the runner cannot run fails here first.
"""

from __future__ import annotations

import base64
import socket
import subprocess
import threading
import types
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest

from neuronetes.devcluster.chartmode import CHART_DIR, LOCAL_VALUES, system_node_manifest
from neuronetes.devcluster.chartrun import FLEET, fleet_launch, is_node_agent
from neuronetes.devcluster.egress import EgressProxy, egress_selector_config, parse_connect
from neuronetes.devcluster.fleetauth import fleet_identity, fleet_service_account
from neuronetes.devcluster.podlogs import log_lines
from neuronetes.devcluster.podplan import (
    SERVICE_ACCOUNT_DIR,
    ContainerLaunch,
    Credentials,
    Entrypoints,
    PlanError,
    automounts_token,
    expand,
    plan_pod,
    pod_address,
    rewrite,
)
from neuronetes.devcluster.tools import Toolchain

pytestmark = pytest.mark.unit

ENTRY = Entrypoints(
    programs={"neuronetes": ("/venv/python", "-m", "neuronetes.cli"), "kube-scheduler": ("/bin/ks",)},
    not_run={"neuronetes-nri": "no runtime"},
)
CREDS = Credentials("https://127.0.0.1:6443", b"CA", "TOKEN")


def pod(**spec: Any) -> dict[str, Any]:
    base = {
        "serviceAccountName": "app",
        "nodeName": "system-0",
        "containers": [
            {
                "name": "main",
                "command": ["neuronetes"],
                "args": ["serve", "--host=$(POD_IP)", "--port=8888", "--config=/etc/app/settings.yaml"],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "WHERE", "value": "$(NODE)/x $$(NODE)"},
                    {
                        "name": "MEM",
                        "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
                    },
                    {
                        "name": "LEVEL",
                        "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "level"}},
                    },
                ],
                "resources": {"limits": {"memory": "512Mi"}},
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/app"},
                    {"name": "tls", "mountPath": "/etc/tls", "readOnly": True},
                    {"name": "state", "mountPath": "/run/app"},
                ],
            }
        ],
        "volumes": [
            {"name": "config", "configMap": {"name": "app-config"}},
            {
                "name": "tls",
                "secret": {"secretName": "app-tls", "items": [{"key": "tls.crt", "path": "cert.pem"}]},
            },
            {"name": "state", "hostPath": {"path": "/run/app", "type": "DirectoryOrCreate"}},
        ],
    }
    return {
        "metadata": {"name": "app-0", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
        "spec": base | spec,
        "status": {"phase": "Running", "podIP": "10.64.3.7"},
    }


CONFIG_MAPS = {
    "app-config": {
        "data": {
            "level": "info",
            "settings.yaml": "url: http://127.0.0.1:8888\nstate: /run/app/db\nkeep: 127.0.0.10\n",
        }
    },
    "sched": {"data": {"config.yaml": "kind: KubeSchedulerConfiguration\nclientConnection: {qps: 5}\n"}},
}
SECRETS = {"app-tls": {"data": {"tls.crt": base64.b64encode(b"PEM").decode()}}}


def plan(p: dict[str, Any], tmp: Path, creds: Credentials | None = CREDS) -> Any:
    return plan_pod(
        p,
        config_maps=CONFIG_MAPS,
        secrets=SECRETS,
        credentials=creds,
        entrypoints=ENTRY,
        root=tmp / "pod",
        node_root=tmp / "node",
        base_env={"PATH": "/usr/bin"},
        net=42,
    )


def test_pod_address_is_a_loopback_address_of_the_clusters_own_network() -> None:
    assert pod_address(pod(), 42) == "127.42.3.7"
    assert pod_address(pod(hostNetwork=True), 42) == "127.42.255.1"
    with pytest.raises(ValueError):
        pod_address(pod(), 0)


def test_rewrite_maps_loopback_names_and_mount_paths_at_their_boundaries(tmp_path: Path) -> None:
    mounts = [("/etc/app", tmp_path / "v"), ("/etc/app/sub", tmp_path / "s")]
    text = "--host=0.0.0.0 http://localhost:1 127.0.0.1:2 127.0.0.10 /etc/app/x /etc/apple /etc/app/sub/y"
    want = "--host=127.42.0.1 http://127.42.0.1:1 127.42.0.1:2 127.0.0.10"
    assert rewrite(text, mounts, "127.42.0.1") == f"{want} {tmp_path}/v/x /etc/apple {tmp_path}/s/y"


def test_rewrite_is_one_pass_even_when_a_host_folder_starts_with_a_mount_path() -> None:
    mounts = [("/etc/app", Path("/tmp/pods/p/volumes/config")), ("/tmp", Path("/tmp/pods/p/volumes/tmp"))]
    got = rewrite("--config=/etc/app/s.yaml --scratch=/tmp/x", mounts, "127.42.0.1")
    assert got == "--config=/tmp/pods/p/volumes/config/s.yaml --scratch=/tmp/pods/p/volumes/tmp/x"


def test_expand_is_the_kubelets_variable_expansion() -> None:
    assert expand("$(A)-$(B)-$$(A)", {"A": "1"}) == "1-$(B)-$(A)"


def test_plan_runs_the_rendered_command_with_env_volumes_and_credentials(tmp_path: Path) -> None:
    got = plan(pod(), tmp_path)
    (main,) = got.containers
    root = tmp_path / "pod"
    assert got.address == "127.42.3.7"
    assert main.argv == (
        "/venv/python", "-m", "neuronetes.cli", "serve", "--host=127.42.3.7", "--port=8888",
        f"--config={root}/volumes/config/settings.yaml",
    )  # fmt: skip
    assert main.env["NODE"] == "system-0" and main.env["WHERE"] == "system-0/x $(NODE)"
    assert main.env["MEM"] == "512" and main.env["LEVEL"] == "info"
    assert main.env["KUBECONFIG"] == str(root / "kubeconfig") and main.env["HOSTNAME"] == "app-0"
    files = {f.path: f.content for f in got.files}
    settings = files[root / "volumes" / "config" / "settings.yaml"].decode()
    assert settings == f"url: http://127.42.3.7:8888\nstate: {tmp_path}/node/run/app/db\nkeep: 127.0.0.10\n"
    assert files[root / "volumes" / "tls" / "cert.pem"] == b"PEM"
    assert files[root / "serviceaccount" / "token"] == b"TOKEN"
    assert files[root / "serviceaccount" / "namespace"] == b"ns"
    kubeconfig = msgspec.json.decode(files[root / "kubeconfig"])
    assert kubeconfig["users"][0]["user"] == {"token": "TOKEN"}
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert tmp_path / "node" / "run" / "app" in got.dirs


def test_no_credentials_when_the_token_is_not_mounted(tmp_path: Path) -> None:
    assert automounts_token(pod(), {"automountServiceAccountToken": False}) is False
    assert automounts_token(pod(automountServiceAccountToken=True), {"automountServiceAccountToken": False})
    assert automounts_token(pod(), None) is True
    got = plan(pod(), tmp_path, creds=None)
    assert "KUBECONFIG" not in got.containers[0].env
    assert not [f for f in got.files if "serviceaccount" in str(f.path)]


def test_service_account_paths_in_args_point_at_the_pods_token_folder(tmp_path: Path) -> None:
    p = pod()
    p["spec"]["containers"][0]["args"] = [f"--token-file={SERVICE_ACCOUNT_DIR}/token"]
    (main,) = plan(p, tmp_path).containers
    assert main.argv[-1] == f"--token-file={tmp_path}/pod/serviceaccount/token"


def test_a_kube_scheduler_configuration_gets_the_pods_kubeconfig(tmp_path: Path) -> None:
    p = pod(volumes=[{"name": "config", "configMap": {"name": "sched"}}])
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "config", "mountPath": "/etc/app"}]
    p["spec"]["containers"][0]["env"] = []
    files = {f.path.name: f.content for f in plan(p, tmp_path).files}
    doc = msgspec.yaml.decode(files["config.yaml"])
    assert doc["clientConnection"] == {"qps": 5, "kubeconfig": str(tmp_path / "pod" / "kubeconfig")}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["spec"]["volumes"].append({"name": "x", "csi": {}}), "not supported"),
        (lambda p: p["spec"].update(volumes=p["spec"]["volumes"][:1]), "names no volume"),
        (lambda p: p["spec"]["volumes"][0].update(configMap={"name": "nope"}), "not found"),
        (lambda p: p["spec"]["containers"][0]["env"].append(
            {"name": "Z", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}), "not supported"),
    ],
)  # fmt: skip
def test_what_cannot_run_is_one_plan_error(tmp_path: Path, change: Any, message: str) -> None:
    p = pod()
    change(p)
    with pytest.raises(PlanError, match=message):
        plan(p, tmp_path)


def test_an_entry_point_the_host_cannot_run_is_skipped_with_its_reason(tmp_path: Path) -> None:
    p = pod()
    p["spec"]["containers"].append({"name": "nri", "command": ["/usr/local/bin/neuronetes-nri"]})
    p["spec"]["containers"].append({"name": "other", "image": "example/thing:1"})
    got = plan(p, tmp_path)
    assert [c.name for c in got.containers] == ["main"]
    assert [(s.name, s.reason) for s in got.skipped] == [
        ("nri", "neuronetes-nri: no runtime"),
        ("other", "thing: no host program for this entry point"),
    ]


def test_the_agent_fleet_serves_the_nodes_in_place_of_one() -> None:
    agent = ContainerLaunch(
        "agent", ("py", "-m", "neuronetes.cli", "agent", "run", "--node=n1", "--interval=1"), {}
    )
    assert is_node_agent(agent)
    assert not is_node_agent(ContainerLaunch("x", ("py", "extender", "serve", "--node-cache"), {}))
    fleet = fleet_launch(agent, ["n2", "n1"])
    assert fleet.name == FLEET
    assert fleet.argv == (
        "py", "-m", "neuronetes.cli", "agent", "run", "--simulate-nodes", "kubernetes.io/hostname in (n1,n2)",
        "--interval=1",
    )  # fmt: skip
    # With an identity of its own: its kubeconfig, not the first agent pod's.
    own = fleet_launch(replace(agent, env={"KUBECONFIG": "/pod/kubeconfig", "A": "1"}), ["n1"], Path("/f/kc"))
    assert own.env == {"KUBECONFIG": "/f/kc", "A": "1"} and own.argv[-2:] == (
        "kubernetes.io/hostname in (n1)",
        "--interval=1",
    )


def _binding(kind: str, name: str, subject: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": kind.replace("Binding", ""),
            "name": name,
        },
        "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": "nn"}],
    }


def test_the_fleet_identity_is_the_agents_bindings_for_an_account_of_its_own() -> None:
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "agent", "namespace": "nn", "uid": "u"},
    }
    objects = fleet_identity(
        account,
        [
            _binding("ClusterRoleBinding", "nn:agent", "agent"),
            _binding("ClusterRoleBinding", "nn:other", "other"),
        ],
        [_binding("RoleBinding", "nn:agent", "agent", "default")],
    )
    sa, crb, rb = objects
    assert (
        sa["kind"] == "ServiceAccount"
        and sa["metadata"]["name"] == fleet_service_account("agent") == "agent-fleet"
    )
    assert sa["metadata"]["ownerReferences"][0]["uid"] == "u"
    for obj, source in ((crb, "ClusterRoleBinding"), (rb, "RoleBinding")):
        assert obj["kind"] == source and obj["metadata"]["name"] == "nn:agent:fleet"
        assert obj["roleRef"]["name"] == "nn:agent"
        assert obj["subjects"] == [{"kind": "ServiceAccount", "name": "agent-fleet", "namespace": "nn"}]
        # Owned by the binding it copies: gone with the release.
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": source,
                "name": "nn:agent",
                "uid": "uid-nn:agent",
            }
        ]
    assert rb["metadata"]["namespace"] == "default" and "namespace" not in crb["metadata"]


def test_parse_connect_reads_only_connect_requests() -> None:
    assert parse_connect(b"CONNECT 10.0.0.5:443 HTTP/1.1\r\nHost: x\r\n\r\n") == ("10.0.0.5", 443)
    assert parse_connect(b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n") == ("::1", 443)
    for bad in (
        b"GET / HTTP/1.1\r\n\r\n",
        b"CONNECT nohost HTTP/1.1\r\n\r\n",
        b"CONNECT a:b HTTP/1.1\r\n\r\n",
    ):
        assert parse_connect(bad) is None
    doc = egress_selector_config(Path("/s.sock"))
    assert doc["egressSelections"][0]["connection"]["transport"] == {"uds": {"udsName": "/s.sock"}}


def test_the_egress_proxy_tunnels_to_what_the_resolver_names(tmp_path: Path) -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    port = upstream.getsockname()[1]

    def echo() -> None:
        conn, _ = upstream.accept()
        with conn:
            conn.sendall(conn.recv(100).upper())

    threading.Thread(target=echo, daemon=True).start()
    proxy = EgressProxy(
        tmp_path / "e.sock", lambda h, p: ("127.0.0.1", port) if h == "10.0.0.9" else None, dial_wait_s=0.3
    )
    try:
        for target, status in (("10.0.0.9:443", b"200"), ("10.0.0.1:443", b"502")):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(tmp_path / "e.sock"))
                s.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
                head = s.recv(100)
                assert head.split()[1] == status
                if status == b"200":
                    s.sendall(b"hello")
                    assert s.recv(100) == b"HELLO"
    finally:
        proxy.close()
        upstream.close()
    assert not (tmp_path / "e.sock").exists()


def test_container_logs_leave_out_the_runners_start_lines(tmp_path: Path) -> None:
    log = tmp_path / "c.log"
    log.write_text("\n=== 2026-01-01T00:00:00 argv\none\n\ntwo\n\n=== 2026-01-01T00:00:05 argv\nthree\n")
    assert log_lines(log, None)[0] == ["one\n", "\n", "two\n", "three\n"]
    lines, offset = log_lines(log, 2)
    assert lines == ["two\n", "three\n"] and offset == log.stat().st_size
    assert log_lines(log, 0)[0] == []


def test_the_system_node_is_kwoks_without_taint_or_gpus() -> None:
    node = system_node_manifest()
    assert not node["spec"].get("taints")
    assert "nvidia.com/gpu.present" not in node["metadata"]["labels"]
    assert "neuronetes.io/gpu" not in node["status"]["capacity"]


# ---- the real chart ------------------------------------------------------------------------------


def rendered_workloads() -> list[dict[str, Any]]:
    helm = Toolchain.pinned().helm
    if not helm.exists():
        pytest.skip(f"{helm} not built")
    out = subprocess.run(
        [str(helm), "template", "nn", str(CHART_DIR), "--namespace=neuronetes-system", f"-f={LOCAL_VALUES}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    docs = [d for d in (msgspec.yaml.decode(part) for part in out.split("\n---\n")) if isinstance(d, dict)]
    return [d for d in docs if d.get("kind") in ("Deployment", "DaemonSet")]


def test_every_workload_of_the_chart_has_a_plan(tmp_path: Path) -> None:
    workloads = rendered_workloads()
    assert {w["metadata"]["name"] for w in workloads} >= {
        "gpu-scheduler",
        "neuronetes-webhook",
        "neuronetes-agent",
    }
    entry = Entrypoints.for_host(Path("/bin/kube-scheduler"))
    for w in workloads:
        template = w["spec"]["template"]
        p = {
            "metadata": {"name": "p", "namespace": "neuronetes-system", "uid": "u", **template["metadata"]},
            "spec": {**template["spec"], "nodeName": "n"},
            "status": {"podIP": "10.64.0.9"},
        }
        config_maps = {name: {"data": {"x": "y"}} for name in _named(p, "configMap", "name")}
        secrets: dict[str, dict[str, Any]] = {
            name: {"data": {}} for name in _named(p, "secret", "secretName")
        }
        got = plan_pod(
            p, config_maps=config_maps, secrets=secrets, credentials=CREDS, entrypoints=entry,
            root=tmp_path / "pod", node_root=tmp_path / "node", base_env={}, net=9,
        )  # fmt: skip
        ran = {c.name for c in got.containers} | {s.name for s in got.skipped}
        assert ran == {c["name"] for c in template["spec"]["containers"]}
        for c in got.containers:
            text = " ".join(c.argv)
            assert "0.0.0.0" not in text and "$(" not in text and "/etc/neuronetes" not in text, text
        if w["kind"] == "DaemonSet":
            assert [c.name for c in got.containers if is_node_agent(c)] == ["agent"]
            assert [s.name for s in got.skipped] == ["nri-plugin"]


def _named(p: dict[str, Any], kind: str, key: str) -> set[str]:
    return {v[kind][key] for v in p["spec"].get("volumes") or () if kind in v}


def test_dev_cluster_status_names_the_extender_the_charts_gpu_scheduler_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Chart mode runs no extender of the cluster's own: status names the gpu-scheduler pod's."""
    from neuronetes.cli.dev import _status, status_document
    from neuronetes.devcluster.chartmode import chart_extenders
    from neuronetes.devcluster.components import StatePaths
    from neuronetes.devcluster.status import ClusterStatus, ComponentStatus

    (tmp_path / "chart").mkdir()
    scheduler = {"argv": ["kube-scheduler", "--config=/etc/x"], "pid": 11}
    extender = {"argv": ["neuronetes", "extender", "serve", "--host=127.0.9.2", "--port=8888"], "pid": 12}
    runner = {
        "pods": {
            "u1": {
                "name": "neuronetes-gpu-scheduler-0",
                "address": "127.0.9.2",
                "containers": {"kube-scheduler": scheduler, "extender": extender},
                "agentOf": [],
            },
            "u2": {"name": "neuronetes-operator-0", "address": "127.0.9.3", "containers": {}, "agentOf": []},
        },
        "fleet": None,
        "errors": {},
    }
    (tmp_path / "chart" / "runner.json").write_text(msgspec.json.encode(runner).decode())
    urls = chart_extenders(StatePaths(tmp_path))
    assert urls == ["http://127.0.9.2:8888 (pod neuronetes-gpu-scheduler-0)"]

    st = ClusterStatus(
        "demo",
        tmp_path,
        None,
        "https://127.0.0.1:6443",
        {},
        (ComponentStatus("chart-runner", 1, True, True),),
        True,
        "v1.36.4",
        2,
        tuple(urls),
        chart_release="neuronetes",
    )
    assert _status(cast(Any, types.SimpleNamespace(status=lambda: st)), "table") == 0
    out = capsys.readouterr().out
    assert (
        "extender http://127.0.9.2:8888 (pod neuronetes-gpu-scheduler-0) (release neuronetes's gpu-scheduler)"
        in out
    )
    assert status_document(st)["chartRelease"] == "neuronetes"
