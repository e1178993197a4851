"""One node's loop with the simulated backend and a recording stand-in for the API server:
transitions, events, capacity, eviction, reset, requests, the watchdog, the shim regions of
assigned containers, and the exporter (`promtool check metrics` on its output)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pod_builder import node_view
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from region_fakes import state_file

from neuronetes import contracts as c
from neuronetes.modelcache import MARKER
from neuronetes.profiles import PROFILES
from neuronetes_agent import region
from neuronetes_agent.daemon.exporter import AgentCollector
from neuronetes_agent.daemon.modelcache import HostModelCache
from neuronetes_agent.daemon.node import ANNOTATION_OFFLINE_GPUS, REQUEST_PREFIX, NodeAgent
from neuronetes_agent.daemon.pods import pod_use
from neuronetes_agent.daemon.regions import RegionKeeper
from neuronetes_agent.daemon.simulated import SimulatedGpus

pytestmark = pytest.mark.unit


class RecordingKube:
    """Records the agent's writes (the real API server is exercised in tests/e2e)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.gpunode: dict[str, Any] = {"metadata": {"name": "n0", "generation": 1}, "spec": {}}

    def ensure_gpunode(self, node: str, node_uid: str) -> dict[str, Any]:
        return self.gpunode

    def patch_gpunode_status(self, node: str, status: Any) -> None:
        self.calls.append(("status", status))

    def patch_gpunode(self, node: str, patch: Any) -> dict[str, Any]:
        self.calls.append(("gpunode", patch))
        return self.gpunode

    def patch_node_labels(self, node: str, labels: Any) -> None:
        self.calls.append(("labels", labels))

    def patch_node_capacity(self, node: str, resources: Any) -> None:
        self.calls.append(("capacity", dict(resources)))

    def node_event(self, node: str, node_uid: str, kind: str, reason: str, message: str) -> None:
        self.calls.append(("event", (reason, message)))

    def pod_event(
        self, namespace: str, name: str, uid: str, node: str, kind: str, reason: str, message: str
    ) -> None:
        self.calls.append(("pod event", (f"{namespace}/{name}", reason, message)))

    def evict(self, namespace: str, name: str) -> int:
        self.calls.append(("evict", f"{namespace}/{name}"))
        return 201

    def last(self, kind: str) -> Any:
        return [v for k, v in self.calls if k == kind][-1]

    def all(self, kind: str) -> list[Any]:
        return [v for k, v in self.calls if k == kind]


POD_UID = "0b6f3c8e-4c1d-4f57-9a1e-2f0c4a1b9d77"


def make_pod(node: str, uuid: str, index: int, name: str = "train", phase: str = "Running") -> dict[str, Any]:
    gpu = {"uuid": uuid, "index": index, "memoryMiB": 81920, "computePercent": 100}
    return node_view(node, POD_UID, name, {"main": [gpu]}, phase=phase)


@pytest.fixture
def agent() -> Any:
    kube = RecordingKube()
    resets = ThreadPoolExecutor(2)
    sim = SimulatedGpus(PROFILES["dgx-a100-80gb"], "n0", reset_seconds=0.05)
    a = NodeAgent("n0", "uid-n0", sim, kube, resets, agent_version="test")
    a.start()
    yield a, sim, kube
    sim.close()
    resets.shutdown()


def tick_until(a: NodeAgent, cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        a.tick()
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


def test_start_publishes_labels_capacity_status(agent: Any) -> None:
    a, _, kube = agent
    assert kube.last("labels")[c.LABEL_GPU_COUNT] == "8"
    assert kube.last("capacity") == {
        c.RESOURCE_GPU: "8",
        c.RESOURCE_GPU_MEMORY: "655360",
        c.RESOURCE_GPU_COMPUTE: "800",
    }
    status = kube.last("status")
    assert status["gpuCount"] == 8 and status["healthyGPUs"] == 8 and status["observedGeneration"] == 1
    assert a.discovery_seconds < 1.0


def test_critical_xid_offline_evict_reset_available(agent: Any) -> None:
    a, sim, kube = agent
    gpu = a.inventory.gpus[3]
    pod = make_pod("n0", gpu.uuid, 3)
    a.set_pod(pod["metadata"]["uid"], pod_use(pod))
    a.tick()
    assert a.states[gpu.uuid][0].value == "InUse"
    assert kube.last("status")["gpus"][3]["allocations"][0]["pod"] == "train"
    sim.inject_xid(gpu.uuid, 48)
    a.tick()
    assert a.states[gpu.uuid][0].value == "Offline"
    assert kube.last("capacity")[c.RESOURCE_GPU] == "7"
    assert kube.all("evict") == ["ml/train"]
    a.tick()
    assert kube.all("evict") == ["ml/train"]  # not again before the retry interval
    a.set_pod(pod["metadata"]["uid"], None)  # the pod is gone
    tick_until(a, lambda: a.states[gpu.uuid][0].value == "Available")
    assert kube.last("capacity")[c.RESOURCE_GPU] == "8"
    reasons = [r for r, _ in kube.all("event")]
    assert reasons == ["GPUInUse", "GPUXid", "GPUOffline", "GPUPodEvicted", "GPUResetting", "GPUAvailable"]
    assert a.counters.transitions[(gpu.uuid, "InUse", "Offline")] == 1


def test_application_xid_changes_nothing(agent: Any) -> None:
    a, sim, kube = agent
    gpu = a.inventory.gpus[0]
    sim.inject_xid(gpu.uuid, 43)
    before = len(kube.all("capacity"))
    a.tick()
    assert a.states[gpu.uuid][0].value == "Available" and len(kube.all("capacity")) == before
    assert kube.all("evict") == []


def test_admin_offline_requests_and_cordon(agent: Any) -> None:
    a, sim, kube = agent
    u0, u1 = a.inventory.gpus[0].uuid, a.inventory.gpus[1].uuid
    a.set_gpunode(
        {
            "metadata": {"generation": 2, "annotations": {ANNOTATION_OFFLINE_GPUS: u0}},
            "spec": {"cordonedGPUs": [u1]},
        }
    )
    a.tick()
    assert a.states[u0][0].value == "Offline" and a.states[u1][0].value == "Available"
    assert kube.last("capacity")[c.RESOURCE_GPU] == "6"
    sim.fall_off_bus(u1)
    a.tick()
    assert a.states[u1][0].value == "Offline"
    key = f"{REQUEST_PREFIX}abc"
    a.set_gpunode(
        {
            "metadata": {"generation": 3, "annotations": {key: json.dumps({"verb": "online", "gpu": u1})}},
            "spec": {},
        }
    )
    a.tick()
    assert a.states[u1][0].value == "Available" and a.states[u0][0].value == "Available"
    assert ("gpunode", {"metadata": {"annotations": {key: None}}}) in kube.calls
    inject = f"{REQUEST_PREFIX}def"
    order = {"verb": "inject", "gpu": u0, "fault": {"temperatureCelsius": 92}}
    a.set_gpunode({"metadata": {"generation": 3, "annotations": {inject: json.dumps(order)}}, "spec": {}})
    a.tick()
    a.tick()
    assert a.states[u0][0].value == "Degraded" and "92" in a.states[u0][1]


def test_watchdog_degrades_a_hung_backend(agent: Any) -> None:
    a, sim, kube = agent
    sim.hang(0.5)
    t = threading.Thread(target=a.tick)
    t.start()
    time.sleep(0.2)
    assert a.watchdog(0.1)
    assert {s.value for s, _ in a.states.values()} == {"Degraded"}
    assert kube.last("status")["conditions"][0] == {**kube.last("status")["conditions"][0], "status": "False"}
    t.join()
    a.tick()
    assert {s.value for s, _ in a.states.values()} == {"Available"}


def test_exporter_output_is_promtool_clean(agent: Any, tmp_path: Any) -> None:
    a, sim, _ = agent
    gpu = a.inventory.gpus[2]
    pod = make_pod("n0", gpu.uuid, 2)
    a.set_pod(pod["metadata"]["uid"], pod_use(pod))
    sim.set_utilization(gpu.uuid, 55)
    sim.inject_xid(gpu.uuid, 13)
    a.tick()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(lambda: [a]))
    text = generate_latest(registry).decode()
    util = [line for line in text.splitlines() if line.startswith(c.METRIC_GPU_UTILIZATION + "{")]
    assert len(util) == 8
    assert any('pod="train"' in line and 'namespace="ml"' in line and line.endswith(" 55.0") for line in util)
    assert 'neuronetes_gpu_xid_errors_total{Hostname="n0"' in text and 'xid="13"' in text
    ecc = [line for line in text.splitlines() if line.startswith(c.METRIC_GPU_ECC_ERRORS + "{")]
    assert len(ecc) == 16
    assert (
        sum('type="corrected"' in line for line in ecc)
        == sum('type="uncorrected"' in line for line in ecc)
        == 8
    )
    for name in (
        c.METRIC_GPU_HEALTH,
        c.METRIC_AGENT_DISCOVERY,
        c.METRIC_GPU_STATE_TRANSITIONS,
        c.METRIC_GPU_LAST_XID,
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out.stdout + out.stderr


# ---- shim regions ----


def assigned_pod(
    node: str, containers: dict[str, Any], uid: str = POD_UID, assignment_uid: str = POD_UID
) -> dict[str, Any]:
    doc = {"version": 1, "node": node, "podUID": assignment_uid, "containers": containers}
    return {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "uid": uid,
            "annotations": {c.ANNOTATION_ASSIGNED_GPUS: json.dumps(doc)},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Pending"},
    }


def agent_for(profile: str, node: str, root: Path) -> tuple[NodeAgent, SimulatedGpus]:
    sim = SimulatedGpus(PROFILES[profile], node)
    a = NodeAgent(
        node, "u", sim, RecordingKube(), ThreadPoolExecutor(1), agent_version="t", regions=RegionKeeper(root)
    )
    a.start()
    return a, sim


def test_shared_slice_and_whole_gpu_regions(tmp_path: Path) -> None:
    a, sim = agent_for("dgx-a100-80gb", "n0", tmp_path)
    u1, u2 = c.simulated_gpu_uuid("n0", 1), c.simulated_gpu_uuid("n0", 2)
    p = assigned_pod(
        "n0",
        {
            "main": {
                "gpus": [{"uuid": u1, "index": 1, "memoryMiB": 8192, "computePercent": 25}],
                "priority": 7,
                "qos": "Burstable",
            },
            "side": {
                "gpus": [{"uuid": u2, "index": 2, "memoryMiB": 81920, "computePercent": 100}],
                "priority": 7,
                "qos": "Guaranteed",
            },
        },
    )
    a.set_pod(POD_UID, pod_use(p))
    a.tick()
    with region.open_region(tmp_path / POD_UID / "main", writable=False) as r:
        view = r.snapshot_control()
        dev = view.devices[0]
        assert (
            dev.uuid.decode() == u1
            and dev.memory_limit_bytes == 8192 << 20
            and dev.compute_share_percent == 25
        )
        assert view.container.priority == 7 and view.container.qos == region.QOS_BURSTABLE
        assert view.container.pod_uid.decode() == POD_UID and view.container.container_name.decode() == "main"
        # Admitted: the shim's first context does not wait (placement and the ledger admitted it).
        assert view.container.control & region.CTL_ADMITTED
    assert (tmp_path / POD_UID / "side" / region.CONTROL_NAME).exists()
    assert (tmp_path / POD_UID / "side" / region.STATE_NAME).exists()
    with state_file(tmp_path / POD_UID / "main" / region.STATE_NAME) as st:
        st.devices[0].memory_used_bytes = 3 << 30  # what the shim would account
        st.devices[0].kernel_ns_total = 2_500_000_000
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(lambda: [a]))
    text = generate_latest(registry).decode()
    want = {"Hostname": "n0", "namespace": "ml", "pod": "p", "container": "main", "UUID": u1}
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("neuronetes_slice_") and sample.labels == want
    }
    assert values[c.METRIC_SLICE_MEMORY_USED] == 3 << 30 and values[c.METRIC_SLICE_MEMORY_LIMIT] == 8192 << 20
    assert values[c.METRIC_SLICE_COMPUTE_SHARE] == 0.25 and values[c.METRIC_SLICE_KERNEL_TIME] == 2.5
    promtool = shutil.which("promtool")
    if promtool is not None:
        assert (
            subprocess.run(
                [promtool, "check", "metrics"], input=text, capture_output=True, text=True
            ).returncode
            == 0
        )
    a.set_pod(POD_UID, None)
    a.tick()
    assert not (tmp_path / POD_UID).exists()
    sim.close()


def test_mig_instance_region_uses_the_mig_uuid(tmp_path: Path) -> None:
    a, sim = agent_for("a100-40gb-mig", "m0", tmp_path)
    gpu = a.inventory.gpus[0]  # type: ignore[union-attr]
    inst = next(d for d in gpu.mig_devices if d.profile == "2g.10gb")
    p = assigned_pod(
        "m0",
        {
            "main": {
                "gpus": [
                    {
                        "uuid": gpu.uuid,
                        "index": 0,
                        "memoryMiB": inst.memory_mib,
                        "computePercent": 100,
                        "migProfile": "2g.10gb",
                        "migStart": inst.start,
                    }
                ],
                "priority": 0,
                "qos": "Guaranteed",
            }
        },
    )
    a.set_pod(POD_UID, pod_use(p))
    a.tick()
    with region.open_region(tmp_path / POD_UID / "main", writable=False) as r:
        dev = r.snapshot_control().devices[0]
        assert dev.uuid.decode() == inst.uuid and dev.flags & region.DEV_F_MIG
    sim.close()


def test_refused_assignments_get_no_region(tmp_path: Path) -> None:
    a, sim = agent_for("dgx-a100-80gb", "n0", tmp_path)
    grant: dict[str, Any] = {
        "gpus": [{"uuid": c.simulated_gpu_uuid("n0", 0), "index": 0, "memoryMiB": 1, "computePercent": 100}],
        "priority": 0,
        "qos": "Guaranteed",
    }
    copied = assigned_pod("n0", {"main": grant}, assignment_uid="11111111-2222-3333-4444-555555555555")
    assert pod_use(copied) is None
    elsewhere = assigned_pod("n0", {"main": grant})
    elsewhere["spec"]["nodeName"] = "n9"
    assert pod_use(elsewhere) is None
    unknown = assigned_pod(
        "n0", {"main": {**grant, "gpus": [{**grant["gpus"][0], "uuid": c.simulated_gpu_uuid("zz", 0)}]}}
    )
    a.set_pod(POD_UID, pod_use(unknown))
    a.tick()
    assert not (tmp_path / POD_UID / "main").exists()
    assert any(k == "event" and v[0] == "GPURegionFailed" for k, v in a.kube.calls)  # type: ignore[attr-defined]
    sim.close()


# ---- MIG layouts ----


def mig_agent(profile: str = "a100-40gb-mig") -> tuple[NodeAgent, SimulatedGpus, RecordingKube]:
    kube = RecordingKube()
    sim = SimulatedGpus(PROFILES[profile], "m0")
    a = NodeAgent("m0", "u", sim, kube, ThreadPoolExecutor(1), agent_version="t")
    a.start()
    return a, sim, kube


def mig_user(gpu: Any, inst: Any) -> dict[str, Any]:
    """A pod of the node assigned MIG instance `inst` of `gpu`."""
    grant = {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "memoryMiB": inst.memory_mib,
        "computePercent": 100,
        "migProfile": inst.profile,
        "migStart": inst.start,
    }
    return assigned_pod("m0", {"main": {"gpus": [grant], "priority": 0, "qos": "Guaranteed"}})


def layout(generation: int, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "spec": {"migLayout": list(entries)}}


def test_mig_layout_applied_after_the_users_leave() -> None:
    a, _, kube = mig_agent()
    gpu0 = a.inventory.gpus[0]  # type: ignore[union-attr]
    inst = gpu0.mig_devices[0]
    user = mig_user(gpu0, inst)
    a.set_pod(POD_UID, pod_use(user))
    a.set_gpunode(layout(2, {"gpuIndex": 0, "instances": [{"profile": "1g.5gb", "count": 7}]}))
    a.tick()
    assert a.mig_state == "Pending" and kube.all("evict") == ["ml/p"]
    assert kube.last("capacity")[c.mig_resource_name("1g.5gb")] == "14"  # GPU 0's instances left
    a.set_pod(POD_UID, None)
    a.tick()
    a.tick()
    assert a.mig_state == "Applied" and kube.last("status")["migConfigState"] == "Applied"
    assert [d.profile for d in a.inventory.gpus[0].mig_devices] == ["1g.5gb"] * 7  # type: ignore[union-attr]
    assert kube.last("capacity")[c.mig_resource_name("1g.5gb")] == "21"
    assert kube.last("labels")[c.LABEL_MIG_CONFIG] == "3g.20gb-7_2g.10gb-7_1g.5gb-21"
    # MIG off on GPU 1: it becomes a whole GPU.
    a.set_gpunode(layout(3, {"gpuIndex": 1, "migEnabled": False}))
    a.tick()
    assert a.mig_state == "Applying" and a.states[a.inventory.gpus[1].uuid][0].value == "Degraded"  # type: ignore[union-attr]
    a.tick()
    assert a.mig_state == "Applied" and kube.last("capacity")[c.RESOURCE_GPU] == "1"


def test_impossible_layout_fails_once_and_mig_manager_nodes_are_left_alone() -> None:
    a, _, kube = mig_agent()
    a.set_gpunode(layout(2, {"gpuIndex": 0, "instances": [{"profile": "3g.20gb", "count": 3}]}))
    a.tick()
    a.tick()
    assert a.mig_state == "Failed" and [r for r, _ in kube.all("event")].count("MIGFailed") == 1
    a.set_gpunode(layout(3, {"gpuIndex": 9, "instances": [{"profile": "1g.5gb", "count": 1}]}))
    a.tick()
    assert a.mig_state == "Failed" and "index [9]" in kube.all("event")[-1][1]
    t4, _, _ = mig_agent("t4x4-pcie")
    t4.set_gpunode(layout(2, {"gpuIndex": 0, "instances": [{"profile": "1g.5gb", "count": 1}]}))
    t4.tick()
    assert t4.mig_state == "Failed"
    owned = NodeAgent(
        "m1",
        "u",
        SimulatedGpus(PROFILES["a100-40gb-mig"], "m1"),
        RecordingKube(),
        ThreadPoolExecutor(1),
        agent_version="t",
    )
    owned.start({"metadata": {"labels": {"nvidia.com/mig.config": "all-balanced"}}, "status": {}})
    owned.set_gpunode(layout(2, {"gpuIndex": 0, "instances": [{"profile": "1g.5gb", "count": 7}]}))
    owned.tick()
    assert owned.mig_state == "None" and len(owned.inventory.gpus[0].mig_devices) == 4  # type: ignore[union-attr]


def test_model_cache_reported_on_every_gpu_once_complete(tmp_path: Path) -> None:
    """The host cache directory (`HostModelCache`, rescanned every round here): a model is
    reported once its marker is written, on every GPU, the platform's (``shared/``) as the model and
    a namespace's as ``<namespace>:<model>``, and a change republishes the status."""
    cache = tmp_path / "models"
    kube = RecordingKube()
    resets = ThreadPoolExecutor(1)
    sim = SimulatedGpus(PROFILES["dgx-a100-80gb"], "n0")
    a = NodeAgent(
        "n0", "uid-n0", sim, kube, resets, agent_version="test", model_cache=HostModelCache(cache, every_s=0)
    )
    try:
        a.start()
        assert {tuple(g["cachedModels"]) for g in kube.last("status")["gpus"]} == {()}
        fetched = cache / "namespaces" / "team-a" / "org--llama-8b"
        fetched.mkdir(parents=True)
        (fetched / "weights.safetensors").write_bytes(b"x")
        a.tick()  # downloading: no marker yet
        assert {tuple(g["cachedModels"]) for g in kube.last("status")["gpus"]} == {()}
        (fetched / MARKER).write_text("org/llama-8b")
        (cache / "shared" / "bert").mkdir(parents=True)
        (cache / "shared" / "bert" / MARKER).write_text("bert")
        a.tick()
        status = kube.last("status")
        assert len(status["gpus"]) == 8
        assert all(g["cachedModels"] == ["bert", "team-a:org/llama-8b"] for g in status["gpus"])
        shutil.rmtree(fetched)
        a.tick()
        assert all(g["cachedModels"] == ["bert"] for g in kube.last("status")["gpus"])
    finally:
        sim.close()
        resets.shutdown()


def test_placements_layout_is_applied_instance_by_instance_and_never_destroys_one_in_use() -> None:
    """A placements layout (the operator's MIG layout controller): the GPU stays in service, nobody
    is evicted, an instance with an allocation waits, and kept instances keep their UUIDs."""
    a, sim, kube = mig_agent()
    gpu0 = a.inventory.gpus[0]  # type: ignore[union-attr]
    by_start = {d.start: d for d in gpu0.mig_devices}  # 2g.10gb@0, 1g.5gb@2, 1g.5gb@3, 3g.20gb@4
    assert sorted((d.profile, s) for s, d in by_start.items()) == [
        ("1g.5gb", 2),
        ("1g.5gb", 3),
        ("2g.10gb", 0),
        ("3g.20gb", 4),
    ]
    held = by_start[2]
    user = mig_user(gpu0, held)
    a.set_pod(POD_UID, pod_use(user))
    # 2g.10gb@0 becomes 1g.10gb@0 (free), 1g.5gb@2 (held) would go for nothing: the layout waits.
    wanted = [("1g.10gb", 0), ("1g.5gb", 3), ("3g.20gb", 4)]
    entry = {"gpuIndex": 0, "placements": [{"profile": p, "start": s} for p, s in wanted]}
    a.set_gpunode(layout(2, entry))
    a.tick()
    assert a.mig_state == "Pending" and not kube.all("evict")
    assert a.states[gpu0.uuid][0].value != "Degraded"  # in service throughout
    assert [r for r, _ in kube.all("event")].count("MIGInstanceBusy") == 1
    assert held.uuid in {d.uuid for d in a.inventory.gpus[0].mig_devices}  # type: ignore[union-attr]
    # Keeping the held instance: applied at once, the others untouched.
    kept = [("1g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3), ("3g.20gb", 4)]
    a.set_gpunode(layout(3, {"gpuIndex": 0, "placements": [{"profile": p, "start": s} for p, s in kept]}))
    a.tick()
    a.tick()
    now = {(d.profile, d.start): d.uuid for d in a.inventory.gpus[0].mig_devices}  # type: ignore[union-attr]
    assert sorted(now) == sorted(kept) and a.mig_state == "Applied"
    assert now[("1g.5gb", 2)] == held.uuid and now[("3g.20gb", 4)] == by_start[4].uuid
    assert kube.last("capacity")[c.mig_resource_name("1g.10gb")] == "1"
    assert not kube.all("evict")
    # A process in an instance to destroy: the backend refuses, the layout fails with its reason.
    sim.set_mig_process(now[("1g.5gb", 3)], True)
    a.set_pod(POD_UID, None)
    gone = [("1g.10gb", 0), ("1g.10gb", 2), ("3g.20gb", 4)]
    a.set_gpunode(layout(4, {"gpuIndex": 0, "placements": [{"profile": p, "start": s} for p, s in gone]}))
    a.tick()
    assert a.mig_state == "Failed" and "running processes" in kube.all("event")[-1][1]
