"""The autoscaling controller end to end: the operator as a process, a real Prometheus, fake engines.

The pools' pods are kwok pods (no process runs in them), so their vLLM metrics come from
`fake_vllm` (one HTTP process on loopback serving ``/pods/<pod>/metrics`` for any pod name, its load
set per pool by the test). A real Prometheus scrapes one target per live pod of the namespace,
discovered through a file_sd file this test keeps in step with the pods, with the pod's
``namespace`` and ``pod`` labels as a cluster's Kubernetes discovery gives them; the controller's
pool-scoped PromQL (``source: prometheus``) then selects exactly the pool's pods. This is the
production path (Prometheus HTTP API, the scale subresource, status, Events, the operator's
/metrics, which Prometheus scrapes for the dashboard's autoscaling panels) with only the engines
simulated.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from e2e_prometheus import PrometheusServer, free_port, needs_prometheus
from observability import Query, dashboard_queries
from operator_stack import operator_stack

from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.pods import LABEL_POOL

pytestmark = [pytest.mark.e2e, needs_prometheus]

NS = "autoscaling-e2e"
# KEDA's ScaledObject as far as the controller reads it (the real CRD's schema is KEDA's; the
# controller lists the objects and reads spec.scaleTargetRef).
KEDA_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "scaledobjects.keda.sh"},
    "spec": {
        "group": "keda.sh",
        "scope": "Namespaced",
        "names": {"plural": "scaledobjects", "singular": "scaledobject", "kind": "ScaledObject"},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}
FAKE = Path(__file__).with_name("fake_vllm.py")


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


def apply(cluster: E2ECluster, text: str) -> None:
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=text)


def post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as answer:
        answer.read()


class Engines:
    """The fake engines' process, and the file_sd file listing the namespace's live pods."""

    def __init__(self, cluster: E2ECluster, workdir: Path) -> None:
        self.cluster, self.port = cluster, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = workdir / "pods.json"
        self.targets.write_text("[]")
        self.proc = subprocess.Popen([sys.executable, str(FAKE), str(self.port)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sync, daemon=True)
        wait_until(self._up, timeout=30, what="fake engines listening")
        self._thread.start()

    def _up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/pods/x/metrics", timeout=2):
                return True
        except OSError:
            return False

    def load(self, pool: str, **load: float) -> None:
        post(f"{self.url}/load", {"pods": f"{pool}-", **load})

    def queue(self, depth: float) -> None:
        post(f"{self.url}/queue", {"depth": depth})

    def _sync(self) -> None:
        host = f"127.0.0.1:{self.port}"
        while not self._stop.wait(0.5):
            found = self.cluster.kubectl("get", "pods", "-n", NS, "-o", "json", check=False)
            if found.returncode != 0:
                continue
            groups = [
                {
                    "targets": [host],
                    "labels": {"namespace": NS, "pod": p["metadata"]["name"], "__metrics_path__": path},
                }
                for p in json.loads(found.stdout)["items"]
                if not p["metadata"].get("deletionTimestamp")
                for path in [f"/pods/{p['metadata']['name']}/metrics"]
            ]
            groups.append({"targets": [host], "labels": {"__metrics_path__": "/queue/metrics"}})
            tmp = self.targets.with_suffix(".tmp")
            tmp.write_text(json.dumps(groups))
            tmp.replace(self.targets)  # Prometheus never reads a half-written file

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def env(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = Path(tmp_path_factory.mktemp("autoscaling"))
    metrics_port = free_port()
    settings = {
        **dev_operator_settings(),
        "metricsPort": metrics_port,
        "autoscaler": {"intervalSeconds": 1, "rateWindowSeconds": 4},
    }
    with operator_stack(cluster, work, NS, settings=settings, replicas=1) as up:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(KEDA_CRD))
        cluster.kubectl("wait", "--for=condition=Established", "crd/scaledobjects.keda.sh", "--timeout=60s")
        up.add_nodes("dgx-a100-80gb", 2, "as-dgx")
        engines = Engines(cluster, work)
        (work / "prom").mkdir()
        # Prometheus scrapes the engines (their pods' labels from the file) and the operator itself.
        prom = PrometheusServer(
            work / "prom", {"operator": [f"127.0.0.1:{metrics_port}"]}, file_sd={"pods": engines.targets}
        )
        try:
            with prom:
                up.local.start()
                yield {
                    "engines": engines,
                    "prom": prom,
                    "metrics": f"http://127.0.0.1:{metrics_port}/metrics",
                }
        finally:
            cluster.kubectl("delete", "crd", "scaledobjects.keda.sh", "--wait=false", check=False)
            engines.stop()


def pool_yaml(
    name: str, prometheus: str, *, replicas: int, extra: str = "", cooldown: int = 2, window: int = 2
) -> str:
    return f"""\
apiVersion: neuronetes.io/v1alpha1
kind: AgentPool
metadata:
  name: {name}
spec:
  replicas: {replicas}
  minReplicas: 1
  maxReplicas: 4
  autoscaling:
    ttftMs: 2000
    tokensPerSecond: 1000
    cooldownSeconds: {cooldown}
    modelLoadSeconds: 1
    behavior:
      stabilizationWindowSeconds: {window}
    metrics:
      source: prometheus
      prometheusURL: {prometheus}
{extra}"""


def pool(cluster: E2ECluster, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "agentpool", name, "-n", NS))


def replicas(cluster: E2ECluster, name: str) -> int:
    return int(pool(cluster, name)["spec"]["replicas"])


def rule(cluster: E2ECluster, name: str) -> str | None:
    return ((pool(cluster, name).get("status") or {}).get("autoscaling") or {}).get("rule")


def condition(cluster: E2ECluster, name: str, kind: str) -> dict[str, Any] | None:
    found = (pool(cluster, name).get("status") or {}).get("conditions") or []
    return next((cd for cd in found if cd["type"] == kind), None)


AUTOSCALING_PANELS = (
    "panel 'Pool replicas wanted by the autoscaler'",
    "panel 'Autoscaler decisions by rule (5 min)'",
    "panel 'Scale-up decision to Ready'",
)


def events(cluster: E2ECluster, name: str) -> list[dict[str, Any]]:
    found = get_json(cluster, "events", "-n", NS, "--field-selector", f"involvedObject.name={name}")["items"]
    return sorted(found, key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]))


def operator_metric(env: dict[str, Any], line_start: str) -> float:
    with urllib.request.urlopen(env["metrics"], timeout=5) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def decisions(env: dict[str, Any], name: str, rule_name: str) -> float:
    return operator_metric(
        env, f'neuronetes_autoscaler_decisions_total{{namespace="{NS}",pool="{name}",rule="{rule_name}"}}'
    )


def test_load_scales_up_and_idle_steps_down_one_at_a_time_to_min(
    cluster: E2ECluster, env: dict[str, Any]
) -> None:
    engines, prom = env["engines"], env["prom"]
    # The stabilization window (10 s) is longer than the operator's rate window (4 s), as the defaults
    # are (300 s and 60 s): by the time the pool has been quiet for a window after the load stops, the
    # request rate the metrics show is 0, so only the idle step-down acts (docs/autoscaling.md, "Rules").
    apply(cluster, pool_yaml("chat", f"http://127.0.0.1:{prom.port}", replicas=1, cooldown=2, window=10))
    # The pool is seen with fresh metrics (idle: held by the first reading's cooldown, then at min).
    wait_until(
        lambda: rule(cluster, "chat") in ("hold:cooldown", "hold:bounds"), timeout=90, what="chat read"
    )
    # 6 requests of 1000 tokens waiting per replica (under the saturation bound of 8), prefilled at
    # 1000 tokens/s each: 6 s + 1 s of model load expected TTFT > 2 s.
    engines.load("chat", waiting=6, running=1, requestsPerSecond=1, promptTokensPerRequest=1000)
    wait_until(lambda: replicas(cluster, "chat") > 1, timeout=60, what="chat scaled up")
    up = [e for e in events(cluster, "chat") if e["reason"] == "AutoscaledUp"]
    # The breach scales at the first decision that sees it: by the backlog floor (ttft-slo) or by the
    # arrival rate it comes with, whichever asks for more (docs/autoscaling.md, "Rules").
    assert up and any(f"1 -> 2 replicas by {r}" in up[0]["message"] for r in ("ttft-slo", "arrival-rate")), up
    st = pool(cluster, "chat")["status"]["autoscaling"]
    assert st["desiredReplicas"] >= 2 and st["inputs"]["slo_ttft_s"] == 2
    # One decision: the first that saw the breach scaled (none held it for another reason).
    assert decisions(env, "chat", "ttft-slo") + decisions(env, "chat", "arrival-rate") >= 1
    for held in ("hold:tolerance", "hold:no-throughput", "hold:orphaned-queue"):
        assert decisions(env, "chat", held) == 0, held
    wait_until(lambda: replicas(cluster, "chat") == 4, timeout=120, what="chat at maxReplicas")
    wait_until(
        lambda: (
            operator_metric(
                env, f'neuronetes_scaleup_decision_to_ready_seconds_count{{namespace="{NS}",pool="chat"}}'
            )
            >= 1
        ),
        timeout=60,
        what="a scale-up's time to Ready observed",
    )
    # The dashboard's autoscaling panels show this pool from Prometheus's scrapes of the operator.
    panels = [q for q in dashboard_queries() if q.where.startswith(AUTOSCALING_PANELS)]
    assert len(panels) == 4, panels
    for query in panels:

        def shows_the_pool(query: Query = query) -> bool:
            return any(r["metric"].get("pool") == "chat" for r in prom.query(query.expr))

        wait_until(shows_the_pool, timeout=60, what=f"{query.where} shows the pool")

    engines.load("chat", waiting=0, running=0, requestsPerSecond=0)
    seen = [replicas(cluster, "chat")]

    def stepped_to_min() -> bool:
        now = replicas(cluster, "chat")
        if now != seen[-1]:
            seen.append(now)
        return now == 1

    wait_until(stepped_to_min, timeout=180, interval=0.2, what="chat back to minReplicas")
    # Load stopped: down after the cooldown, one replica at a time (the idle step-down), never below
    # minReplicas.
    assert seen == [4, 3, 2, 1], seen
    down = [e["message"] for e in events(cluster, "chat") if e["reason"] == "AutoscaledDown"]
    assert len(down) == 3 and all("by idle-step-down" in m for m in down), down
    for message in down:
        found = re.search(r"(\d+) -> (\d+) replicas", message)
        assert found and int(found[2]) == int(found[1]) - 1, message
    assert replicas(cluster, "chat") == 1


def test_a_stopped_prometheus_never_scales_down(
    cluster: E2ECluster, env: dict[str, Any], tmp_path: Path
) -> None:
    engines = env["engines"]
    own = PrometheusServer(tmp_path, {}, file_sd={"pods": engines.targets})
    with own:
        # A long stabilization window: no right-sizing step-down while the metrics are fresh either.
        apply(
            cluster, pool_yaml("steady", f"http://127.0.0.1:{own.port}", replicas=3, cooldown=1, window=600)
        )
        # Demand that three replicas carry (its steady-state target is under 3: no scale-up).
        engines.load("steady", waiting=0, running=1, requestsPerSecond=1)
        wait_until(
            lambda: rule(cluster, "steady") not in (None, "hold:stale-metrics"),
            timeout=90,
            what="steady read, busy",
        )
        assert replicas(cluster, "steady") == 3
        # A new pool's pods not scraped yet were already worth a Warning: counted apart.
        earlier = len([e for e in events(cluster, "steady") if e["reason"] == "MetricsStale"])
    # Prometheus has stopped, and so do the requests: with metrics, the idle pool would step down.
    engines.load("steady", waiting=0, running=0, requestsPerSecond=0)

    def stale_condition() -> dict[str, Any] | None:
        found = condition(cluster, "steady", "MetricsStale")
        return found if found and "did not answer" in found["message"] else None

    stale = wait_until(stale_condition, timeout=30, what="MetricsStale: Prometheus did not answer")
    assert stale["reason"] == "NoScaleDown" and stale["status"] == "True"
    before = decisions(env, "steady", "hold:stale-metrics")
    wait_until(
        lambda: decisions(env, "steady", "hold:stale-metrics") >= before + 8,
        timeout=60,
        what="8 stale decisions",
    )
    assert replicas(cluster, "steady") == 3
    assert rule(cluster, "steady") == "hold:stale-metrics"
    # One Warning per change of what is wrong (a Prometheus shutting down may answer 503 first),
    # not one per tick.
    warnings = [e for e in events(cluster, "steady") if e["reason"] == "MetricsStale"][earlier:]
    assert 1 <= len(warnings) <= 2 and all(e["type"] == "Warning" for e in warnings), warnings
    assert "did not answer" in warnings[-1]["message"]


def stays_passive(cluster: E2ECluster, env: dict[str, Any], name: str, other: dict[str, Any]) -> str:
    """Pool `name` at 1 replica and `other` (an autoscaler's object, without ``scaleTargetRef``)
    targeting it: under load that would scale it, it stays put for 5 decisions, naming `other`."""
    apply(cluster, pool_yaml(name, f"http://127.0.0.1:{env['prom'].port}", replicas=1))
    other["spec"]["scaleTargetRef"] = {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "name": name,
    }
    apply(cluster, json.dumps(other))
    kind = {"HorizontalPodAutoscaler": "HorizontalPodAutoscaler", "ScaledObject": "KEDA ScaledObject"}
    named = f"{kind[other['kind']]} {NS}/{other['metadata']['name']}"
    env["engines"].load(name, waiting=50, running=1, requestsPerSecond=1)
    found = wait_until(lambda: condition(cluster, name, "AutoscalerConflict"), timeout=60, what="conflict")
    assert named in found["message"]
    before = decisions(env, name, "hold:conflict")
    wait_until(
        lambda: decisions(env, name, "hold:conflict") >= before + 5, timeout=60, what="5 passive ticks"
    )
    assert replicas(cluster, name) == 1
    assert pool(cluster, name)["status"]["autoscaling"]["conflict"] == named
    return named


def test_an_hpa_on_the_pool_makes_the_autoscaler_passive(cluster: E2ECluster, env: dict[str, Any]) -> None:
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "web-hpa"},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 90}},
                }
            ],
        },
    }
    assert stays_passive(cluster, env, "web", hpa) == f"HorizontalPodAutoscaler {NS}/web-hpa"


def test_a_bindings_lag_over_its_threshold_scales_its_pool(cluster: E2ECluster, env: dict[str, Any]) -> None:
    engines, prom = env["engines"], env["prom"]
    apply(
        cluster,
        """\
apiVersion: neuronetes.io/v1alpha1
kind: AgentPool
metadata:
  name: workers
spec:
  replicas: 1
  minReplicas: 1
  maxReplicas: 5
""",
    )
    engines.queue(60)
    apply(
        cluster,
        f"""\
apiVersion: neuronetes.io/v1alpha1
kind: ToolBinding
metadata:
  name: tasks
spec:
  poolRef: {{name: workers}}
  queue:
    type: prometheus
    name: sum(kafka_consumergroup_lag{{consumergroup="workers"}})
    address: http://127.0.0.1:{prom.port}
  queueConfig:
    autoscaleOnLag: true
    maxLagThreshold: 100
    prefetch: 10
    throughput: 1
""",
    )

    def binding() -> dict[str, Any]:
        return dict(get_json(cluster, "toolbinding", "tasks", "-n", NS).get("status") or {})

    wait_until(lambda: binding().get("queueDepth") == 60, timeout=60, what="depth 60 read")
    assert binding()["lag"] == 50 and replicas(cluster, "workers") == 1  # 60 − 1×10×1: under 100
    engines.queue(130)  # lag 120 > 100: ceil((130 − 100) / 10) = 3 replicas
    wait_until(lambda: replicas(cluster, "workers") == 3, timeout=60, what="workers at 3")
    assert binding()["desiredReplicas"] == 3
    up = [e["message"] for e in events(cluster, "workers") if e["reason"] == "AutoscaledUp"]
    assert up and "by toolbinding-lag (ToolBinding tasks)" in up[0]
    assert [p for p in get_json(cluster, "pods", "-n", NS, "-l", f"{LABEL_POOL}=workers")["items"]]


def test_a_keda_scaledobject_on_the_pool_makes_the_autoscaler_passive(
    cluster: E2ECluster, env: dict[str, Any]
) -> None:
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "batch-so"},
        "spec": {
            "triggers": [{"type": "prometheus", "metadata": {"query": "sum(up)", "threshold": "1"}}],
        },
    }
    assert stays_passive(cluster, env, "batch", scaled) == f"KEDA ScaledObject {NS}/batch-so"
    # The ScaledObject goes: the controller acts again, and the condition goes with the conflict.
    cluster.kubectl("delete", "scaledobject", "batch-so", "-n", NS)
    wait_until(lambda: replicas(cluster, "batch") > 1, timeout=60, what="batch scaled up once free")
    wait_until(
        lambda: condition(cluster, "batch", "AutoscalerConflict") is None, timeout=30, what="conflict gone"
    )
