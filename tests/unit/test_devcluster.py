"""The dev cluster's data: topology profiles, Node manifests, scheduler configuration, versions."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from neuronetes.contracts import (
    LABEL_GPU_MEMORY,
    LABEL_MIG_CONFIG,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    SCHEDULER_NAME,
)
from neuronetes.devcluster import ExtenderConfig, parse_node_counts, procs, profile, read_versions
from neuronetes.devcluster.config import default_managed_resources, default_scheduler_config, scheduler_config
from neuronetes.engine.core import PlacementEngine
from neuronetes.inventory import ClusterState
from neuronetes.model import Locality, PodRequest
from neuronetes.profiles import (
    PROFILES,
    gpu_type_label,
    mig_resource_name,
    node_labels,
    node_manifest,
    node_resources,
)

pytestmark = pytest.mark.unit


def test_required_profiles_describe_the_hardware() -> None:
    a100 = profile("dgx-a100-80gb").node_spec("a")
    assert len(a100.gpus) == 8 and {g.model for g in a100.gpus} == {"A100-SXM4-80GB"}
    assert {g.nvlink_group for g in a100.gpus} == {0}  # NVSwitch: one NVLink domain
    assert {g.nvlink_bandwidth_gbps for g in a100.gpus} == {600.0}
    assert [g.numa_node for g in a100.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.socket for g in a100.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(len(g.nvlink_peers) == 7 for g in a100.gpus)

    h100 = profile("dgx-h100").node_spec("h")
    assert len(h100.gpus) == 8 and {g.nvlink_bandwidth_gbps for g in h100.gpus} == {900.0}

    t4 = profile("t4x4-pcie").node_spec("t")
    assert len(t4.gpus) == 4 and {g.nvlink_group for g in t4.gpus} == {-1}
    assert [g.socket for g in t4.gpus] == [0, 0, 1, 1] and all(g.nvlink_peers == () for g in t4.gpus)

    mig_node = profile("a100-40gb-mig").node_spec("m")
    assert all(g.mig_enabled and g.memory_mib == 40960 for g in mig_node.gpus)


def test_gpu_uuids_are_stable_and_unique() -> None:
    p = profile("dgx-h100")
    first, again, other = p.node_spec("n1"), p.node_spec("n1"), p.node_spec("n2")
    assert [g.uuid for g in first.gpus] == [g.uuid for g in again.gpus]
    uuids = [g.uuid for g in first.gpus + other.gpus]
    assert len(set(uuids)) == 16 and all(u.startswith("GPU-") for u in uuids)


def test_node_manifest_labels_capacity_taint() -> None:
    m = node_manifest(profile("dgx-a100-80gb").node_spec("a-0", zone="z1", region="r", spot=True))
    labels = m["metadata"]["labels"]
    assert labels["neuronetes.io/gpu-type"] == "A100"
    assert labels[LABEL_GPU_MEMORY] == "80Gi"
    assert labels["neuronetes.io/spot"] == "true"
    assert float(labels["neuronetes.io/price-per-hour"]) < PROFILES["dgx-a100-80gb"].price_per_hour
    assert labels["topology.kubernetes.io/zone"] == "z1"
    assert m["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert m["spec"]["taints"] == [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]
    cap = m["status"]["capacity"]
    assert (
        cap[RESOURCE_GPU] == "8"
        and cap[RESOURCE_GPU_MEMORY] == "655360"
        and cap[RESOURCE_GPU_COMPUTE] == "800"
    )
    assert m["status"]["allocatable"] == cap
    # Every label value is a valid Kubernetes label value.
    for value in labels.values():
        assert len(value) <= 63 and all(c.isalnum() or c in "-_." for c in value), value


def test_mig_node_advertises_instances_not_whole_gpus() -> None:
    spec = profile("a100-40gb-mig").node_spec("m-0")
    res = node_resources(spec)
    assert res[RESOURCE_GPU] == "0" and res[RESOURCE_GPU_MEMORY] == "0"
    assert res[mig_resource_name("1g.5gb")] == "16"
    assert res[mig_resource_name("2g.10gb")] == "8"
    assert res[mig_resource_name("3g.20gb")] == "8"
    assert node_labels(spec)[LABEL_MIG_CONFIG] == "3g.20gb-8_2g.10gb-8_1g.5gb-16"
    assert mig_resource_name("1g.10gb+me") == "neuronetes.io/mig-1g.10gb.me"


def test_engine_places_on_profile_nodes_as_the_cluster_advertises() -> None:
    nodes = [
        profile("t4x4-pcie").node_spec("t4"),
        profile("dgx-a100-80gb").node_spec("a100"),
        profile("a100-40gb-mig").node_spec("mig"),
    ]
    engine = PlacementEngine(ClusterState(nodes))
    eight = engine.place(PodRequest("p", gpus=8, locality=Locality.NVLINK, min_bandwidth_gbps=600))
    assert eight is not None and eight.node == "a100"
    # The MIG node advertises no whole GPUs, and the engine agrees: it never grants one there.
    for _ in range(3):
        p = engine.place(PodRequest("q", gpus=1))
        assert p is not None and p.node != "mig"
    assert engine.place(PodRequest("m", gpus=1, mig_profile="1g.5gb")) is not None


@pytest.mark.parametrize(
    ("model", "label"),
    [("A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"), ("T4", "T4"), ("Tesla T4", "TESLA")],
)
def test_gpu_type_label(model: str, label: str) -> None:
    assert gpu_type_label(model) == label


def test_scheduler_config_profile_and_extender() -> None:
    doc = scheduler_config(Path("/k"), None)
    assert "extenders" not in doc
    prof = {p["schedulerName"]: p for p in doc["profiles"]}
    ours = prof[SCHEDULER_NAME]
    assert ours["percentageOfNodesToScore"] == 100
    fit = ours["pluginConfig"][0]
    assert fit["name"] == "NodeResourcesFit" and fit["args"]["scoringStrategy"]["type"] == "MostAllocated"
    assert "default-scheduler" not in prof  # extenders apply to every profile: it runs apart
    (stock,) = default_scheduler_config(Path("/k"))["profiles"]
    assert stock == {"schedulerName": "default-scheduler"}
    ext = ExtenderConfig.from_url("http://127.0.0.1:9999/scheduler/")
    assert ext is not None
    doc = scheduler_config(Path("/k"), ext)
    e, b = doc["extenders"]
    assert e["urlPrefix"] == "http://127.0.0.1:9999/scheduler"
    assert e["nodeCacheCapable"] is True and e["ignorable"] is False
    assert e["filterVerb"] == "filter" and e["weight"] > 0 and "bindVerb" not in e
    assert e["httpTimeout"] == "5s"
    # Bind on its own entry: the gang barrier's long timeout is not the filter's.
    assert b["urlPrefix"] == e["urlPrefix"] and b["bindVerb"] == "bind" and "filterVerb" not in b
    assert "managedResources" not in b and float(b["httpTimeout"].rstrip("s")) > 110
    managed = {r["name"] for r in e["managedResources"]}
    assert {RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_COMPUTE, "neuronetes.io/mig-1g.5gb"} <= managed
    assert len(default_managed_resources()) == len(set(default_managed_resources()))


def test_extender_from_env() -> None:
    assert ExtenderConfig.from_env({}) is None
    assert ExtenderConfig.from_env({"NEURONETES_EXTENDER_URL": ""}) is None
    cfg = ExtenderConfig.from_env({"NEURONETES_EXTENDER_URL": "http://x:1"})
    assert cfg is not None and cfg.url == "http://x:1"


def test_parse_node_counts() -> None:
    assert parse_node_counts(["dgx-h100=2", "t4x4-pcie"]) == [("dgx-h100", 2), ("t4x4-pcie", 1)]
    with pytest.raises(ValueError, match="unknown node profile"):
        parse_node_counts(["nope=1"])
    with pytest.raises(ValueError, match="integer"):
        parse_node_counts(["dgx-h100=x"])


def test_versions_are_pinned() -> None:
    v = read_versions()
    assert v.kubernetes.startswith("v1.36.") and v.etcd.startswith("v3.6.") and v.kwok.startswith("v0.8.")
    assert v.helm.startswith(("v3.21.", "v4.2."))


def test_process_groups_are_stopped_whole(tmp_path: Path) -> None:
    """A component and the children it forks die together; a stale record signals nothing."""
    proc, rec = procs.spawn(
        "sleeper", ["bash", "-c", "sleep 60 & sleep 60 & wait"], log=tmp_path / "s.log", cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 5
        while len(procs.survivors([rec])) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(procs.survivors([rec])) == 3  # bash and its two sleeps, one process group
        assert procs.is_running(rec)
        stale = dataclasses.replace(rec, start_time=rec.start_time + 1)  # "the pid was reused"
        assert not procs.is_running(stale)
        procs.stop_all([stale], grace_s=0.2)
        assert procs.is_running(rec)  # not ours any more, so left alone
        procs.stop_all([rec], grace_s=5)
        assert procs.survivors([rec]) == []
        assert not procs.is_running(rec)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_addons_are_recorded_in_the_run_state_and_the_agent_serves_every_simulated_node(
    tmp_path: Path,
) -> None:
    from neuronetes.devcluster.addons import KWOK_SELECTOR, agent_argv
    from neuronetes.devcluster.components import Layout
    from neuronetes.devcluster.state import RunState
    from neuronetes.devcluster.tools import Toolchain
    from neuronetes.profiles import node_labels, profile

    state = RunState(name="x", ports={"agent_metrics": 9500}, versions={}, run_agent=True, run_operator=True)
    again = RunState.from_json(state.to_json())
    assert (again.run_agent, again.run_operator) == (True, True)
    assert RunState.from_json({**state.to_json(), "runAgent": False}).run_agent is False
    at = Layout(tmp_path, name="x", ports={"agent_metrics": 9500}, tools=Toolchain.pinned())
    argv = agent_argv(at)
    assert argv[argv.index("--simulate-nodes") + 1] == KWOK_SELECTOR
    assert argv[argv.index("--metrics-port") + 1] == "9500"
    key, value = KWOK_SELECTOR.split("=")
    assert node_labels(profile("dgx-a100-80gb").node_spec("n"))[key] == value


def test_interrupt_on_turns_a_signal_into_keyboard_interrupt() -> None:
    import os
    import signal

    from neuronetes.devcluster.procs import interrupt_on

    before = signal.getsignal(signal.SIGUSR2)
    try:
        interrupt_on(signal.SIGUSR2)
        with pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGUSR2)}"):
            os.kill(os.getpid(), signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_the_readme_shows_the_demos_sample_pool_and_slice_and_node_count() -> None:
    import yaml

    from neuronetes.devcluster.demo import DEMO_NODES, SAMPLE_POOL, SAMPLE_SLICE

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("```yaml\napiVersion: neuronetes.io/v1alpha1\nkind: AgentPool\n", 1)[1]
    shown = list(
        yaml.safe_load_all("apiVersion: neuronetes.io/v1alpha1\nkind: AgentPool\n" + block.split("```")[0])
    )
    assert shown == [SAMPLE_POOL, SAMPLE_SLICE]
    assert f"adds {sum(n for _, n in DEMO_NODES)} simulated nodes" in " ".join(readme.split())
