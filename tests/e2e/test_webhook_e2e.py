"""The admission webhook (two replicas, one port) and the CRD rules against the real API server.

Refusals per field (pods and NeuroNetes objects, `webhook_cases`), valid edge cases accepted,
the scheduler name set, and failure handling: one replica down keeps admission working, both
down refuse NeuroNetes pods (``failurePolicy: Fail``) and leave other pods alone.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster
from webhook_cases import OBJECT_CASES, POD_CASES, VALID_OBJECTS, ObjectCase, PodCase, gpu_pod

from neuronetes import contracts as c
from neuronetes.devcluster.localstack import LocalStack

pytestmark = pytest.mark.e2e

NS = "webhook-e2e"


@pytest.fixture(scope="module")
def webhooks(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    local = LocalStack(cluster.kubeconfig, Path(tmp_path_factory.mktemp("webhook")), cluster.kubectl)
    try:
        local.start()
        cluster.kubectl("create", "namespace", NS)
        yield local
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        local.stop()


def create(cluster: E2ECluster, obj: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["namespace"] = NS
    return cluster.kubectl("create", "-f", "-", *extra, input=json.dumps(obj), check=False)


def apply_text(cluster: E2ECluster, text: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "--dry-run=server", "-n", NS, "-f", "-", input=text, check=False)


@pytest.mark.parametrize("case", POD_CASES, ids=[case.name for case in POD_CASES])
def test_pod_refused_naming_the_field(cluster: E2ECluster, webhooks: LocalStack, case: PodCase) -> None:
    result = create(cluster, case.pod, "--dry-run=server")
    assert result.returncode != 0, result.stdout
    assert "denied the request" in result.stderr and case.expect in result.stderr, result.stderr


@pytest.mark.parametrize("case", OBJECT_CASES, ids=[case.name for case in OBJECT_CASES])
def test_object_refused_naming_the_field(cluster: E2ECluster, webhooks: LocalStack, case: ObjectCase) -> None:
    result = apply_text(cluster, case.text)
    assert result.returncode != 0, result.stdout
    assert case.expect in result.stderr, result.stderr
    if case.where == "webhook":
        assert "denied the request" in result.stderr


@pytest.mark.parametrize("case", VALID_OBJECTS, ids=[case.name for case in VALID_OBJECTS])
def test_valid_edge_case_accepted(cluster: E2ECluster, webhooks: LocalStack, case: ObjectCase) -> None:
    result = apply_text(cluster, case.text)
    assert result.returncode == 0, result.stderr


def test_gpu_pod_gets_the_neuronetes_scheduler(cluster: E2ECluster, webhooks: LocalStack) -> None:
    pod = gpu_pod(name="mutated")
    del pod["spec"]["schedulerName"]
    assert create(cluster, pod).returncode == 0
    stored = json.loads(cluster.kubectl("get", "pod", "mutated", "-n", NS, "-o", "json").stdout)
    assert stored["spec"]["schedulerName"] == c.SCHEDULER_NAME


def test_one_replica_down_admission_works_both_down_fails_closed(
    cluster: E2ECluster, webhooks: LocalStack
) -> None:
    plain = gpu_pod({"cpu": "100m"}, name="plain")
    try:
        webhooks.webhooks[0].kill()
        time.sleep(1.0)
        for i in range(5):
            ok = create(cluster, gpu_pod(name=f"one-down-{i}"), "--dry-run=server")
            assert ok.returncode == 0, ok.stderr
        webhooks.webhooks[1].kill()
        time.sleep(1.0)
        refused = create(cluster, gpu_pod(name="both-down"), "--dry-run=server")
        assert refused.returncode != 0 and "failed calling webhook" in refused.stderr, refused.stderr
        assert create(cluster, plain).returncode == 0
    finally:
        webhooks.start_webhook(0)
        webhooks.start_webhook(1)
    assert create(cluster, gpu_pod(name="back"), "--dry-run=server").returncode == 0


def test_annotations_of_an_existing_gpu_pod_are_protected(cluster: E2ECluster, webhooks: LocalStack) -> None:
    assert create(cluster, gpu_pod(name="annotated")).returncode == 0
    forged = cluster.kubectl(
        "annotate", "pod", "annotated", "-n", NS, f"{c.ANNOTATION_ASSIGNED_GPUS}={{}}", check=False
    )
    assert forged.returncode != 0 and f"metadata.annotations[{c.ANNOTATION_ASSIGNED_GPUS}]" in forged.stderr
    assert cluster.kubectl("annotate", "pod", "annotated", "-n", NS, "team=b", check=False).returncode == 0
