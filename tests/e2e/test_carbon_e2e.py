"""Carbon-aware time shifting on the local control plane: the webhook gates a time-shifted pool's
pods with ``neuronetes.io/carbon`` and the operator's carbon gate controller releases them — by the
clean-energy window opening, by the intensity falling under ``maxCarbonIntensity`` (the file
source updated), by the deadline, and by a stale source (fail open, a Warning Event). The operator,
two webhook replicas and the extender run as real processes (`LocalStack`); the intensity source is
a file the test writes, as a mounted ConfigMap would be updated. Short settings keep it fast.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import E2ECluster, wait_until
from operator_stack import operator_stack

from neuronetes.carbon.release import GATE
from neuronetes.devcluster.localstack import LocalStack
from neuronetes_operator.launch import dev_operator_settings
from neuronetes_operator.pods import LABEL_POOL

pytestmark = pytest.mark.e2e

NS = "carbon-e2e"
REFRESH_S = 30  # a reading older than 60 s is stale


def write_intensity(path: Path, intensity: float, age_s: float = 0) -> None:
    at = (datetime.now(UTC) - timedelta(seconds=age_s)).isoformat()
    path.write_text(json.dumps({"intensity": intensity, "at": at}))


def closed_window() -> str:
    start = datetime.now(UTC) + timedelta(hours=3)
    return f"{start:%H}:00-{(start + timedelta(hours=1)):%H}:00"


def open_window() -> str:
    start = datetime.now(UTC) - timedelta(hours=1)
    return f"{start:%H}:00-{(start + timedelta(hours=3)):%H}:00"


@pytest.fixture(scope="module")
def stack(cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, Path]]:
    work = Path(tmp_path_factory.mktemp("carbon"))
    source = work / "intensity.json"
    write_intensity(source, 400)
    settings = {
        **dev_operator_settings(),
        "carbon": {
            "intervalSeconds": 0.5,
            "source": {"type": "file", "path": str(source), "refreshSeconds": REFRESH_S},
        },
    }
    with operator_stack(cluster, work, NS, settings=settings, log_lines=15) as up:
        up.local.start()
        up.add_nodes("t4x4-pcie", 4, "carbon-t4")  # 16 GPUs: 11 pods
        yield up.local, source


def get_json(cluster: E2ECluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


def apply_pool(
    cluster: E2ECluster, name: str, carbon: dict[str, Any], annotations: dict[str, str] | None = None
) -> None:
    pool: dict[str, Any] = {
        "apiVersion": "neuronetes.io/v1alpha1",
        "kind": "AgentPool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": 2, "minReplicas": 1, "scheduling": {"carbonAware": {"enabled": True, **carbon}}},
    }
    if annotations:
        pool["spec"]["template"] = {"metadata": {"annotations": annotations}}
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(pool), check=False)
    assert result.returncode == 0, result.stderr


def pod(cluster: E2ECluster, name: str) -> dict[str, Any] | None:
    found = get_json(cluster, "pods", "-n", NS, "-l", f"{LABEL_POOL}={name.rsplit('-', 1)[0]}")["items"]
    return next((p for p in found if p["metadata"]["name"] == name), None)


def gated(cluster: E2ECluster, name: str) -> bool:
    p = pod(cluster, name)
    return p is not None and any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or [])


def released_event(cluster: E2ECluster, pool: str, reason: str) -> dict[str, Any] | None:
    events = get_json(cluster, "events", "-n", NS, "--field-selector", f"involvedObject.name={pool}")["items"]
    return next(
        (e for e in events if e["reason"] == "CarbonGateReleased" and f"released ({reason})" in e["message"]),
        None,
    )


def held_then_released(cluster: E2ECluster, pool: str, reason: str, act: Any) -> dict[str, Any]:
    """The pool's floor pod runs ungated, its second pod waits behind the gate until `act` makes
    `reason` hold; then it is released, scheduled, and the pool says so (Event, status.carbon)."""
    wait_until(lambda: gated(cluster, f"{pool}-1"), timeout=60, what=f"{pool}-1 gated")
    first = wait_until(lambda: pod(cluster, f"{pool}-0"), timeout=60, what=f"{pool}-0 created")
    assert not first["spec"].get("schedulingGates"), "the pool's floor (minReplicas) is never gated"
    status = wait_until(
        lambda: (get_json(cluster, "agentpool", pool, "-n", NS).get("status") or {}).get("carbon"),
        timeout=30,
        what="status.carbon",
    )
    assert status["accounting"] == "location-based"
    act()
    wait_until(lambda: not gated(cluster, f"{pool}-1"), timeout=60, what=f"{pool}-1 released")
    wait_until(
        lambda: (pod(cluster, f"{pool}-1") or {}).get("spec", {}).get("nodeName"), timeout=60, what="bound"
    )
    event = wait_until(lambda: released_event(cluster, pool, reason), timeout=30, what=f"Event ({reason})")
    carbon = wait_until(
        lambda: (
            ((get_json(cluster, "agentpool", pool, "-n", NS).get("status") or {}).get("carbon") or {}).get(
                "lastReleaseReason"
            )
            == reason
            and get_json(cluster, "agentpool", pool, "-n", NS)["status"]["carbon"]
        ),
        timeout=30,
        what="status.carbon.lastReleaseReason",
    )
    assert carbon["releasedPods"] == 1 and carbon["gatedPods"] == 0
    return dict(event)


def test_intensity_falling_under_the_maximum_releases_the_gate(
    cluster: E2ECluster, stack: tuple[LocalStack, Path]
) -> None:
    _, source = stack
    write_intensity(source, 400)
    apply_pool(
        cluster,
        "by-intensity",
        {"maxCarbonIntensity": 100, "timeShifting": {"enabled": True, "cleanEnergyHours": closed_window()}},
    )
    event = held_then_released(cluster, "by-intensity", "intensity", lambda: write_intensity(source, 50))
    assert event["type"] == "Normal" and "intensity 50 gCO2/kWh" in event["message"]
    write_intensity(source, 400)


def test_the_window_opening_releases_the_gate(cluster: E2ECluster, stack: tuple[LocalStack, Path]) -> None:
    _, source = stack
    write_intensity(source, 400)
    apply_pool(cluster, "by-window", {"timeShifting": {"enabled": True, "cleanEnergyHours": closed_window()}})

    def open_it() -> None:
        patch = {
            "spec": {"scheduling": {"carbonAware": {"timeShifting": {"cleanEnergyHours": open_window()}}}}
        }
        cluster.kubectl("patch", "agentpool", "by-window", "-n", NS, "--type=merge", "-p", json.dumps(patch))

    held_then_released(cluster, "by-window", "window", open_it)


def test_the_deadline_minus_the_run_time_releases_the_gate(
    cluster: E2ECluster, stack: tuple[LocalStack, Path]
) -> None:
    _, source = stack
    write_intensity(source, 400)
    deadline = (datetime.now(UTC) + timedelta(seconds=90)).strftime("%Y-%m-%dT%H:%M:%SZ")
    apply_pool(
        cluster,
        "by-deadline",
        {"timeShifting": {"enabled": True, "cleanEnergyHours": closed_window()}},
        {"neuronetes.io/deadline": deadline, "neuronetes.io/expected-runtime": "60s"},
    )
    held_then_released(cluster, "by-deadline", "deadline", lambda: None)


def test_a_pod_created_by_hand_with_the_pool_label_is_gated(
    cluster: E2ECluster, stack: tuple[LocalStack, Path]
) -> None:
    """The webhook reads the pool a pod's label names, so a user's own pod is held too (before the
    stale-source test, which releases every gated pod)."""
    write_intensity(stack[1], 400)
    apply_pool(cluster, "by-hand", {"timeShifting": {"enabled": True, "cleanEnergyHours": closed_window()}})
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mine", "namespace": NS, "labels": {LABEL_POOL: "by-hand"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"neuronetes.io/gpu": "1"}},
                }
            ],
            "tolerations": dev_operator_settings()["podTolerations"],
        },
    }
    result: subprocess.CompletedProcess[str] = cluster.kubectl(
        "apply", "-f", "-", input=json.dumps(manifest), check=False
    )
    assert result.returncode == 0, result.stderr
    got = get_json(cluster, "pod", "mine", "-n", NS)
    assert {"name": GATE} in got["spec"]["schedulingGates"]


def test_a_stale_source_releases_the_gate_with_a_warning(
    cluster: E2ECluster, stack: tuple[LocalStack, Path]
) -> None:
    _, source = stack
    write_intensity(source, 400)
    apply_pool(cluster, "by-stale", {"timeShifting": {"enabled": True, "cleanEnergyHours": closed_window()}})
    event = held_then_released(
        cluster, "by-stale", "stale", lambda: write_intensity(source, 400, age_s=10 * REFRESH_S)
    )
    assert event["type"] == "Warning" and "fail open" in event["message"]
