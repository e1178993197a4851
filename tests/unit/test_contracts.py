"""Contracts: names, the assignment annotation (schema, strict decoding, versioning), the pod-spec
reader (wire -> PodRequest) and the builder from engine output (Placement -> annotation)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from node_factory import NodeFactory

from neuronetes import contracts as c
from neuronetes.assignment import (
    ContainerRole,
    GpuKind,
    PodGpuRequest,
    ResourceRequestError,
    build_assignment,
    gang_of,
    pod_gpu_request,
)
from neuronetes.engine import PlacementEngine
from neuronetes.inventory import ClusterState
from neuronetes.mig import catalog_for, normalize_profile_name
from neuronetes.model import GpuGrant, GpuSpec, NodeSpec, Placement, PodRequest

pytestmark = pytest.mark.unit

UUID0 = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000000"
UUID1 = "GPU-5e6c1b1e-0a1b-4c2d-8e3f-000000000001"

EXAMPLE = {
    "version": 1,
    "node": "gpu-node-1",
    "podUID": "0b6f3c8e-4c1d-4f57-9a1e-2f0c4a1b9d77",
    "containers": {
        "trainer": {
            "gpus": [
                {"uuid": UUID0, "index": 0, "memoryMiB": 81920, "computePercent": 100},
                {"uuid": UUID1, "index": 1, "memoryMiB": 81920, "computePercent": 100},
            ],
            "priority": 1000,
            "qos": "Guaranteed",
        },
        "warmup": {
            "gpus": [{"uuid": UUID0, "index": 0, "memoryMiB": 81920, "computePercent": 100}],
            "priority": 1000,
            "qos": "Guaranteed",
        },
    },
    "gang": {"name": "llama-train", "size": 4},
}


def doc(**changes: Any) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(json.dumps(EXAMPLE))
    d.update(changes)
    return d


def decode(d: dict[str, Any]) -> c.Assignment:
    return c.decode_assignment(json.dumps(d))


def refused(d: dict[str, Any] | str, *fragments: str) -> str:
    text = d if isinstance(d, str) else json.dumps(d)
    with pytest.raises(c.AssignmentError) as info:
        c.decode_assignment(text)
    message = str(info.value)
    assert message.startswith(c.ANNOTATION_ASSIGNED_GPUS)
    for fragment in fragments:
        assert fragment in message, message
    return message


def real_uuids(node: NodeSpec) -> NodeSpec:
    """Fixture nodes carry readable fake UUIDs ("GPU-dgx-0"); the annotation wants NVML's format."""
    gpus = tuple(replace(g, uuid=c.simulated_gpu_uuid(node.name, g.index)) for g in node.gpus)
    return replace(node, gpus=gpus)


# ---- names ------------------------------------------------------------------------------------


def test_existing_names_are_kept() -> None:
    assert c.RESOURCE_GPU == "neuronetes.io/gpu"
    assert c.RESOURCE_GPU_MEMORY == "neuronetes.io/gpu-memory"
    assert c.RESOURCE_GPU_COMPUTE == "neuronetes.io/gpu-compute"
    assert c.ANNOTATION_ASSIGNED_GPUS == "neuronetes.io/assigned-gpus"
    assert c.ASSIGNMENT_SCHEMA_VERSION == 1
    assert c.GANG_KEYS == (
        "neuronetes.io/gang",
        "scheduling.x-k8s.io/pod-group",
        "scheduling.k8s.io/group-name",
    )
    assert c.API_VERSION == "neuronetes.io/v1alpha1"
    assert c.SCHEDULER_NAME == "neuronetes-scheduler"


@pytest.mark.parametrize("profile", ["1g.5gb", "1g.5gb+me", "3g.40gb", "7g.80gb"])
def test_mig_resource_names_round_trip(profile: str) -> None:
    name = c.mig_resource_name(profile)
    assert "+" not in name and name.startswith(c.RESOURCE_MIG_PREFIX)
    assert re.fullmatch(r"[a-z0-9.\-/]+", name)
    assert normalize_profile_name(name) == profile


def test_metric_table() -> None:
    names = [m.name for m in c.METRICS]
    assert len(names) == len(set(names))
    constants = {v for k, v in vars(c).items() if k.startswith("METRIC_") and isinstance(v, str)}
    assert constants == set(names)
    for m in c.METRICS:
        assert re.fullmatch(r"neuronetes_[a-z_]+", m.name), m.name
        assert m.name.endswith("_total") == (m.type is c.MetricType.COUNTER), m.name
        assert len(set(m.labels)) == len(m.labels)
        if m.type is c.MetricType.HISTOGRAM:
            assert m.name.endswith("_seconds")
    seed = {
        "neuronetes_scheduler_latency_seconds",
        "neuronetes_scheduler_attempts_total",
        "neuronetes_scheduler_success_total",
        "neuronetes_scheduler_pending_pods",
        "neuronetes_gpu_utilization_percent",
        "neuronetes_scheduler_topology_violations_total",
    }
    assert seed <= set(names)


def test_simulated_uuids_are_valid_stable_and_distinct() -> None:
    a = c.simulated_gpu_uuid("node-a", 0)
    assert re.fullmatch(c.GPU_UUID_PATTERN, a)
    assert a == c.simulated_gpu_uuid("node-a", 0)
    assert len({c.simulated_gpu_uuid(f"n{i}", j) for i in range(20) for j in range(8)}) == 160


def test_region_path_matches_the_agent_mirror() -> None:
    from neuronetes_agent import region

    assert (region.REGION_DIR, region.CONTROL_PATH, region.STATE_PATH) == (
        c.SHIM_REGION_DIR,
        c.SHIM_CONTROL_PATH,
        c.SHIM_STATE_PATH,
    )


# ---- the annotation: decoding -------------------------------------------------------------------


def test_example_decodes_and_round_trips() -> None:
    a = decode(EXAMPLE)
    assert a.version == 1 and a.node == "gpu-node-1"
    assert list(a.containers) == ["trainer", "warmup"]
    trainer = a.containers["trainer"]
    assert [g.index for g in trainer.gpus] == [0, 1]
    assert trainer.qos is c.QoS.GUARANTEED and trainer.priority == 1000
    assert trainer.gpus[0].mig_profile is None
    assert a.gang == c.GangAssignment(name="llama-train", size=4)
    text = c.encode_assignment(a)
    assert json.loads(text) == EXAMPLE  # same keys, camelCase, optional fields omitted
    assert c.decode_assignment(text) == a
    assert c.decode_assignment(text.encode()) == a


def test_mig_entry() -> None:
    d = doc()
    d["containers"] = {
        "app": {
            "gpus": [
                {
                    "uuid": UUID0,
                    "index": 0,
                    "memoryMiB": 4864,
                    "computePercent": 100,
                    "migProfile": "1g.5gb",
                    "migStart": 6,
                }
            ],
            "priority": 0,
            "qos": "BestEffort",
        }
    }
    gpu = decode(d).containers["app"].gpus[0]
    assert (gpu.mig_profile, gpu.mig_start) == ("1g.5gb", 6)
    assert json.loads(c.encode_assignment(decode(d))) == d


@pytest.mark.parametrize("version", [0, 2, 99])
def test_unknown_version_is_refused_clearly(version: int) -> None:
    refused(doc(version=version), f"schema version {version} is not supported", "reads 1")


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[]", '{"node": "x"}', '{"version": "1"}', '{"version": 1.0}', '{"version": true}'],
)
def test_unversioned_documents_are_refused(text: str) -> None:
    refused(text, "not a versioned assignment document")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("gpus", 0, "memoryMiB"), -1, "memoryMiB"),
        (("gpus", 0, "memoryMiB"), 0, "memoryMiB"),
        (("gpus", 0, "memoryMiB"), c.MAX_GPU_MEMORY_MIB + 1, "memoryMiB"),
        (("gpus", 0, "memoryMiB"), 2**70, "memoryMiB"),
        (("gpus", 0, "computePercent"), 0, "computePercent"),
        (("gpus", 0, "computePercent"), 101, "computePercent"),
        (("gpus", 0, "index"), -1, "index"),
        (("gpus", 0, "index"), c.MAX_GPU_INDEX + 1, "index"),
        (("gpus", 0, "uuid"), "GPU-not-a-uuid", "uuid"),
        (("gpus", 0, "uuid"), UUID0.upper().replace("GPU", "GPU"), "uuid"),
        (("gpus", 0, "uuid"), "MIG-5e6c1b1e-0a1b-4c2d-8e3f-000000000000", "uuid"),
        (("gpus", 0, "uuid"), UUID0 + "\n", "uuid"),
        (("gpus", 0, "migProfile"), "1g.5gb", "migProfile and migStart"),
        (("gpus", 0, "memoryMiB"), "81920", "memoryMiB"),
        (("gpus", 0, "memoryMiB"), 1.5, "memoryMiB"),
        (("priority",), 2**31, "priority"),
        (("priority",), -(2**31) - 1, "priority"),
        (("qos",), "Gold", "qos"),
        (("gpus",), [], "gpus"),
        (("extra",), 1, "extra"),
        (("gpus", 0, "exclusive"), True, "exclusive"),
    ],
)
def test_bad_values_are_refused_naming_the_field(path: tuple[Any, ...], value: Any, field: str) -> None:
    d = doc()
    target = d["containers"]["trainer"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    refused(d, field)


def test_document_level_checks() -> None:
    refused(doc(node="Not_A_Node"), "node")
    refused(doc(node=""), "node")
    refused(doc(containers={}), "containers")
    refused(doc(podUID="nope"), "podUID")
    refused(doc(gang={"name": "g", "size": 0}), "size")
    refused(doc(gang={"name": "g"}), "size")
    refused(doc(unknown=True), "unknown")
    bad_name = doc()
    bad_name["containers"] = {"Trainer": bad_name["containers"]["trainer"]}
    refused(bad_name, "key")
    missing = doc()
    del missing["containers"]["trainer"]["qos"]
    refused(missing, "qos")


def test_mig_rules() -> None:
    d = doc()
    gpu = d["containers"]["trainer"]["gpus"][0]
    gpu.update(migStart=0)
    refused(d, "migProfile and migStart go together")
    gpu.update(migProfile="1g.5gb", computePercent=50)
    refused(d, "computePercent of a MIG instance must be 100")
    gpu.update(computePercent=100, migProfile="1g.5gb+me", migStart=8)
    refused(d, "migStart")
    gpu.update(migStart=0, migProfile="MIG 1g.5gb")
    refused(d, "migProfile")


def test_cross_gpu_consistency() -> None:
    d = doc()
    d["containers"]["trainer"]["gpus"][1]["uuid"] = UUID0
    refused(d, "listed twice")
    d = doc()
    d["containers"]["warmup"]["gpus"][0]["index"] = 5
    refused(d, "has index 5", "'warmup'", "'trainer'")


@pytest.mark.parametrize("data", ['{"version": 1, "node": "\ud800"}', b'{"version": 1, "node": "\xff"}'])
def test_text_that_is_not_utf8_is_refused_as_an_assignment_error(data: str | bytes) -> None:
    with pytest.raises(c.AssignmentError, match="not UTF-8"):
        c.decode_assignment(data)


def test_size_limit() -> None:
    refused(" " * (c.MAX_ASSIGNMENT_BYTES + 1), "bytes, more than")


def test_encode_refuses_what_the_node_would_refuse() -> None:
    bad = c.Assignment(
        version=1,
        node="n",
        containers={
            "a": c.ContainerAssignment(
                gpus=(c.GpuAssignment(uuid="GPU-x", index=0, memory_mib=1, compute_percent=100),),
                priority=0,
                qos=c.QoS.GUARANTEED,
            )
        },
    )
    with pytest.raises(c.AssignmentError, match="uuid"):
        c.encode_assignment(bad)


# hypothesis: every valid document survives encode -> decode unchanged

uuids = st.builds(lambda i: c.simulated_gpu_uuid("h", i), st.integers(0, 10_000))
profiles = st.sampled_from(["1g.5gb", "1g.5gb+me", "2g.10gb", "3g.40gb", "7g.80gb", "1g.10gb"])


@st.composite
def gpu_entries(draw: st.DrawFn) -> c.GpuAssignment:
    mig = draw(st.booleans())
    return c.GpuAssignment(
        uuid=draw(uuids),
        index=0,  # fixed below so one UUID has one index
        memory_mib=draw(st.integers(1, c.MAX_GPU_MEMORY_MIB)),
        compute_percent=100 if mig else draw(st.integers(1, 100)),
        mig_profile=draw(profiles) if mig else None,
        mig_start=draw(st.integers(0, 7)) if mig else None,
    )


@st.composite
def assignments(draw: st.DrawFn) -> c.Assignment:
    names = draw(
        st.lists(st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True), min_size=1, max_size=5)
    )
    containers = {}
    for name in names:
        gpus = draw(
            st.lists(gpu_entries(), min_size=1, max_size=4, unique_by=lambda g: (g.uuid, g.mig_start))
        )
        gpus = [replace_gpu(g, index=int(g.uuid[-2:], 16) % (c.MAX_GPU_INDEX + 1)) for g in gpus]
        containers[name] = c.ContainerAssignment(
            gpus=tuple(gpus),
            priority=draw(st.integers(c.PRIORITY_MIN, c.PRIORITY_MAX)),
            qos=draw(st.sampled_from(list(c.QoS))),
        )
    gang = draw(
        st.none()
        | st.builds(
            c.GangAssignment,
            name=st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,30}[A-Za-z0-9])?", fullmatch=True),
            size=st.integers(1, c.MAX_GANG_SIZE),
        )
    )
    node = draw(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?(\.[a-z0-9]{1,10}){0,2}", fullmatch=True))
    pod_uid = draw(st.none() | st.uuids().map(str))
    return c.Assignment(version=1, node=node, containers=containers, gang=gang, pod_uid=pod_uid)


def replace_gpu(g: c.GpuAssignment, **changes: Any) -> c.GpuAssignment:
    fields = {f: getattr(g, f) for f in g.__struct_fields__}
    fields.update(changes)
    return c.GpuAssignment(**fields)


@given(assignments())
@settings(max_examples=200, deadline=None)
def test_hypothesis_round_trip(a: c.Assignment) -> None:
    text = c.encode_assignment(a)
    assert c.decode_assignment(text) == a
    raw = json.loads(text)
    assert raw["version"] == 1
    for container in raw["containers"].values():
        for gpu in container["gpus"]:
            assert set(gpu) <= {"uuid", "index", "memoryMiB", "computePercent", "migProfile", "migStart"}


@given(assignments(), st.sampled_from(["memoryMiB", "computePercent", "index"]), st.integers(-(2**40), -1))
@settings(max_examples=100, deadline=None)
def test_hypothesis_negative_numbers_never_pass(a: c.Assignment, field: str, value: int) -> None:
    raw = json.loads(c.encode_assignment(a))
    first = next(iter(raw["containers"].values()))
    first["gpus"][0][field] = value
    refused(raw, field)


# ---- pod spec -> request --------------------------------------------------------------------


def ctr(
    name: str, limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "x", "resources": resources, **kw}


def spec(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), **kw: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"containers": list(containers), **kw}
    if init:
        s["initContainers"] = list(init)
    return s


def sidecar(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    return ctr(name, limits, restartPolicy="Always")


GPU = c.RESOURCE_GPU
MEM = c.RESOURCE_GPU_MEMORY
CMP = c.RESOURCE_GPU_COMPUTE


def test_whole_gpus() -> None:
    r = pod_gpu_request(spec(ctr("a", {GPU: 2, "cpu": "4", "memory": "16Gi"})))
    assert r is not None and r.kind is GpuKind.WHOLE
    assert r.request == PodRequest(name="", cpu_milli=4000, memory_mib=16384, gpus=2)
    assert r.request.exclusive
    (a,) = r.containers
    assert (a.name, a.role, a.request.gpus, a.request.name) == ("a", ContainerRole.APP, 2, "a")


def test_shared_slice() -> None:
    r = pod_gpu_request(spec(ctr("a", {MEM: "10240", CMP: 30}, {MEM: 10240, CMP: "30", "cpu": "500m"})))
    assert r is not None and r.kind is GpuKind.SHARED
    assert (r.request.gpus, r.request.gpu_milli, r.request.gpu_memory_mib) == (1, 300, 10240)
    assert r.request.shared and r.request.cpu_milli == 500


@pytest.mark.parametrize(
    ("resource", "profile"), [("mig-1g.5gb", "1g.5gb"), ("mig-1g.10gb.me", "1g.10gb+me")]
)
def test_mig_instance(resource: str, profile: str) -> None:
    r = pod_gpu_request(spec(ctr("a", {c.RESOURCE_PREFIX + resource: 1})))
    assert r is not None and r.kind is GpuKind.MIG
    assert (r.request.gpus, r.request.mig_profile) == (1, profile)


def test_no_neuronetes_resources() -> None:
    assert pod_gpu_request(spec(ctr("a", {"cpu": 1}))) is None
    assert pod_gpu_request(spec(ctr("a", {"nvidia.com/gpu": 1}))) is None
    assert pod_gpu_request(spec(ctr("a", {GPU: 0, MEM: "0"}))) is None
    assert pod_gpu_request(spec(ctr("a"))) is None
    assert pod_gpu_request({"containers": [{"name": "a"}]}) is None


def test_pod_object_name_and_priority() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": spec(ctr("a", {GPU: 1}), priority=1000),
    }
    r = pod_gpu_request(pod)
    assert r is not None
    assert (r.request.name, r.request.priority) == ("ns/p", 1000)
    assert r.containers[0].request.priority == 1000
    assert pod_gpu_request(pod, name="x") is not None
    assert pod_gpu_request(pod, name="x").request.name == "x"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("container", "fragments"),
    [
        (ctr("a", None, {GPU: 1}), ["'a'", GPU, "not in limits"]),
        (ctr("a", {GPU: 2}, {GPU: 1}), ["requests (1) != limits (2)"]),
        (ctr("a", {GPU: "500m"}), ["not an integer"]),
        (ctr("a", {GPU: "1.5"}), ["not an integer"]),
        (ctr("a", {GPU: 1.5}), ["not an integer"]),
        (ctr("a", {GPU: "-1"}), ["negative"]),
        (ctr("a", {GPU: True}), ["not a quantity"]),
        (ctr("a", {GPU: "two"}), ["not a quantity"]),
        (ctr("a", {"neuronetes.io/gpus": 1}), ["unknown NeuroNetes resource", "neuronetes.io/gpus"]),
        (ctr("a", {"neuronetes.io/mig-9g.1gb": 1}), ["not a MIG profile"]),
        (ctr("a", {"neuronetes.io/mig-1g.5gb": 1, GPU: 1}), ["mixes MIG instances with whole GPUs"]),
        (ctr("a", {"neuronetes.io/mig-1g.5gb": 1, MEM: 10}), ["mixes MIG instances with a shared slice"]),
        (ctr("a", {"neuronetes.io/mig-1g.5gb": 2}), ["more than one MIG instance"]),
        (ctr("a", {"neuronetes.io/mig-1g.5gb": 1, "neuronetes.io/mig-2g.10gb": 1}), ["several MIG profiles"]),
        (ctr("a", {GPU: 1, MEM: 1024}), ["whole GPUs and cannot be combined"]),
        (ctr("a", {MEM: 1024}), ["needs both", f"{CMP} is missing"]),
        (ctr("a", {CMP: 50}), ["needs both", f"{MEM} is missing"]),
        (ctr("a", {MEM: 1024, CMP: 150}), ["more than one GPU"]),
        (ctr("a", {GPU: 1, "nvidia.com/gpu": 1}), ["never ask for nvidia.com/gpu"]),
        (ctr("a", {GPU: 1, "cpu": "lots"}), ["cpu", "not a quantity"]),
        ({"image": "x"}, ["has no name"]),
        ({"name": "a", "resources": {"limits": [1]}}, ["resources.limits", "mapping"]),
    ],
)
def test_bad_requests(container: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(ResourceRequestError) as info:
        pod_gpu_request(spec(container))
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_pod_level_errors() -> None:
    with pytest.raises(ResourceRequestError, match="same kind"):
        pod_gpu_request(spec(ctr("a", {GPU: 1}), ctr("b", {MEM: 10, CMP: 10})))
    with pytest.raises(ResourceRequestError, match="same kind"):
        pod_gpu_request(spec(ctr("a", {GPU: 1}), init=(ctr("i", {"neuronetes.io/mig-1g.5gb": 1}),)))
    with pytest.raises(ResourceRequestError, match="2 MIG instances at once"):
        pod_gpu_request(
            spec(ctr("a", {"neuronetes.io/mig-1g.5gb": 1}), ctr("b", {"neuronetes.io/mig-1g.5gb": 1}))
        )
    with pytest.raises(ResourceRequestError, match="different MIG profiles"):
        pod_gpu_request(
            spec(
                ctr("a", {"neuronetes.io/mig-1g.5gb": 1}), init=(ctr("i", {"neuronetes.io/mig-2g.10gb": 1}),)
            )
        )
    with pytest.raises(ResourceRequestError, match="add up to 120%"):
        pod_gpu_request(spec(ctr("a", {MEM: 10, CMP: 60}), ctr("b", {MEM: 10, CMP: 60})))
    with pytest.raises(ResourceRequestError, match=r"spec\.priority"):
        pod_gpu_request(spec(ctr("a", {GPU: 1}), priority="high"))


def test_init_containers_combine_like_kubernetes() -> None:
    # init 4 runs alone; app containers 1 + 1 run together: the pod needs max(4, 2) = 4
    r = pod_gpu_request(spec(ctr("a", {GPU: 1}), ctr("b", {GPU: 1}), init=(ctr("i", {GPU: 4}),)))
    assert r is not None and r.request.gpus == 4
    assert [x.role for x in r.containers] == [ContainerRole.INIT, ContainerRole.APP, ContainerRole.APP]
    # a sidecar runs beside the init containers after it and beside the app: 1 + max(2, 1) = 3
    r = pod_gpu_request(spec(ctr("a", {GPU: 1}), init=(sidecar("s", {GPU: 1}), ctr("i", {GPU: 2}))))
    assert r is not None and r.request.gpus == 3
    # an init container before the sidecar does not run beside it: max(3, 1 + 1) = 3
    r = pod_gpu_request(spec(ctr("a", {GPU: 1}), init=(ctr("i", {GPU: 3}), sidecar("s", {GPU: 1}))))
    assert r is not None and r.request.gpus == 3
    # shared slices: per resource, the same rule; init 50% alone, app 30% + sidecar 20%
    r = pod_gpu_request(
        spec(
            ctr("a", {MEM: 2048, CMP: 30}),
            init=(ctr("i", {MEM: 1024, CMP: 50}), sidecar("s", {MEM: 512, CMP: 20})),
        )
    )
    assert r is not None
    assert (r.request.gpu_milli, r.request.gpu_memory_mib) == (500, 2560)
    # a MIG instance used by an init container and then by the app container: one instance
    mig = {"neuronetes.io/mig-1g.5gb": 1}
    r = pod_gpu_request(spec(ctr("a", mig), init=(ctr("i", mig),)))
    assert r is not None and r.request.mig_profile == "1g.5gb"
    # CPU and memory follow the same rule (GPU-less containers included)
    r = pod_gpu_request(
        spec(
            ctr("a", {GPU: 1, "cpu": 1}),
            ctr("b", {"cpu": "2", "memory": "1Gi"}),
            init=(ctr("i", {"cpu": 8}),),
        )
    )
    assert r is not None
    assert (r.request.cpu_milli, r.request.memory_mib) == (8000, 1024)
    assert [x.name for x in r.containers] == ["a"]


roles = st.sampled_from([ContainerRole.INIT, ContainerRole.SIDECAR, ContainerRole.APP])


@st.composite
def whole_gpu_pods(draw: st.DrawFn) -> list[tuple[ContainerRole, int]]:
    items = draw(st.lists(st.tuples(roles, st.integers(0, 3)), min_size=1, max_size=7))
    if not any(n for _, n in items):
        items.append((ContainerRole.APP, 1))
    if not any(r is ContainerRole.APP for r, _ in items):
        items.append((ContainerRole.APP, 0))
    return items


def build_spec(items: list[tuple[ContainerRole, int]]) -> dict[str, Any]:
    init, app = [], []
    for k, (role, n) in enumerate(items):
        limits = {GPU: n} if n else {}
        if role is ContainerRole.APP:
            app.append(ctr(f"c{k}", limits))
        elif role is ContainerRole.SIDECAR:
            init.append(sidecar(f"c{k}", limits))
        else:
            init.append(ctr(f"c{k}", limits))
    return spec(*app, init=tuple(init))


def moments(items: list[tuple[ContainerRole, int]]) -> list[list[int]]:
    """Which containers (by position) run at the same time, as Kubernetes runs them."""
    order = [k for k, (r, _) in enumerate(items) if r is not ContainerRole.APP]
    apps = [k for k, (r, _) in enumerate(items) if r is ContainerRole.APP]
    running_sidecars: list[int] = []
    out = []
    for k in order:
        if items[k][0] is ContainerRole.SIDECAR:
            running_sidecars.append(k)
            out.append(list(running_sidecars))
        else:
            out.append([*running_sidecars, k])
    out.append([*running_sidecars, *apps])
    return out


@given(whole_gpu_pods())
@settings(max_examples=200, deadline=None)
def test_hypothesis_effective_request_and_disjoint_gpus(items: list[tuple[ContainerRole, int]]) -> None:
    r = pod_gpu_request(build_spec(items))
    assert r is not None
    need = max(sum(items[k][1] for k in m) for m in moments(items))
    assert r.request.gpus == need  # the Kubernetes rule, computed by simulation

    node = real_uuids(NodeSpec("n", 64_000, 256_000, tuple(_gpu(j) for j in range(max(need, 1)))))
    placement = Placement(r.request, "n", 0, tuple(GpuGrant(j, 1000, 81920) for j in range(need)), 0.0)
    a = build_assignment(placement, node, r)
    got = {name: {g.uuid for g in x.gpus} for name, x in a.containers.items()}
    for k, (_, n) in enumerate(items):
        assert len(got.get(f"c{k}", ())) == n
    for m in moments(items):  # containers running together never share a GPU
        seen: set[str] = set()
        for k in m:
            mine = got.get(f"c{k}", set())
            assert not (mine & seen)
            seen |= mine
    assert c.decode_assignment(c.encode_assignment(a)) == a


def _gpu(j: int) -> GpuSpec:
    return GpuSpec(index=j, uuid=f"x{j}", model="A100-SXM4-80GB", memory_mib=81920)


# ---- engine output -> assignment -----------------------------------------------------------


def test_build_whole_gpu_assignment_from_the_engine(nodes: NodeFactory) -> None:
    node = real_uuids(nodes.dgx("dgx-1"))
    pod = pod_gpu_request(
        {
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": spec(
                ctr("main", {GPU: 2}), ctr("side", {GPU: 1}), init=(ctr("warm", {GPU: 1}),), priority=7
            ),
        }
    )
    assert pod is not None and pod.request.gpus == 3
    placement = PlacementEngine(ClusterState([node])).place(pod.request)
    assert placement is not None
    gang = c.GangAssignment(name="g", size=2)
    uid = "0b6f3c8e-4c1d-4f57-9a1e-2f0c4a1b9d77"
    a = build_assignment(placement, node, pod, qos=c.QoS.BURSTABLE, gang=gang, pod_uid=uid)
    assert a.node == "dgx-1" and a.gang == gang and a.pod_uid == uid
    main, side, warm = (a.containers[n] for n in ("main", "side", "warm"))
    granted = [node.gpus[g.gpu_index].uuid for g in placement.grants]
    assert [g.uuid for g in main.gpus] + [g.uuid for g in side.gpus] == granted
    assert [g.uuid for g in warm.gpus] == granted[:1]
    for x in (main, side, warm):
        assert x.priority == 7 and x.qos is c.QoS.BURSTABLE
        for g in x.gpus:
            assert g.compute_percent == 100 and g.memory_mib == 81920
            assert node.gpus[g.index].uuid == g.uuid
    assert c.decode_assignment(c.encode_assignment(a)) == a


def test_build_shared_assignment_from_the_engine(nodes: NodeFactory) -> None:
    node = real_uuids(nodes.t4("t4-1"))
    pod = pod_gpu_request(spec(ctr("a", {MEM: 4096, CMP: 30}), ctr("b", {MEM: 1024, CMP: 10})))
    assert pod is not None
    placement = PlacementEngine(ClusterState([node])).place(pod.request)
    assert placement is not None
    a = build_assignment(placement, node, pod)
    (ga,), (gb,) = a.containers["a"].gpus, a.containers["b"].gpus
    assert ga.uuid == gb.uuid == node.gpus[placement.grants[0].gpu_index].uuid
    assert (ga.memory_mib, ga.compute_percent, gb.memory_mib, gb.compute_percent) == (4096, 30, 1024, 10)


def test_build_mig_assignment_from_the_engine(nodes: NodeFactory) -> None:
    node = real_uuids(nodes.mig("mig-1"))
    pod = pod_gpu_request(spec(ctr("a", {c.mig_resource_name("2g.10gb"): 1})))
    assert pod is not None
    placement = PlacementEngine(ClusterState([node])).place(pod.request)
    assert placement is not None
    a = build_assignment(placement, node, pod, priority=-5)
    (g,) = a.containers["a"].gpus
    assert g.mig_profile == "2g.10gb" and g.mig_start == placement.grants[0].mig_start
    assert g.memory_mib == catalog_for(node.gpus[0].model).profile("2g.10gb").memory_mib
    assert g.compute_percent == 100 and a.containers["a"].priority == -5


def test_builder_refuses_mismatches(nodes: NodeFactory) -> None:
    node = real_uuids(nodes.t4("t4-1"))
    pod = pod_gpu_request(spec(ctr("a", {GPU: 2})))
    assert isinstance(pod, PodGpuRequest)
    good = Placement(pod.request, "t4-1", 0, (GpuGrant(0, 1000, 15109), GpuGrant(1, 1000, 15109)), 1.0)
    build_assignment(good, node, pod)
    with pytest.raises(ValueError, match="not 'other'"):
        build_assignment(good, replace(node, name="other"), pod)
    with pytest.raises(ValueError, match="grants 1 GPUs"):
        build_assignment(replace(good, grants=good.grants[:1]), node, pod)
    with pytest.raises(ValueError, match="node 't4-1' has 4 GPUs"):
        build_assignment(replace(good, grants=(GpuGrant(0, 1000, 1), GpuGrant(9, 1000, 1))), node, pod)
    with pytest.raises(c.AssignmentError, match="uuid"):
        build_assignment(good, nodes.t4("t4-1"), pod)  # fixture UUIDs are not NVML's format


# ---- gangs -------------------------------------------------------------------------------------


def test_gang_keys_in_order() -> None:
    assert gang_of({"metadata": {}}) is None
    assert gang_of({"metadata": {"labels": {c.LABEL_GANG: "g", c.LABEL_GANG_SIZE: "4"}}}) == (
        c.LABEL_GANG,
        "g",
        4,
    )
    assert gang_of({"metadata": {"labels": {c.LABEL_POD_GROUP_X_K8S: "pg"}}}) == (
        c.LABEL_POD_GROUP_X_K8S,
        "pg",
        None,
    )
    volcano = {"metadata": {"annotations": {c.ANNOTATION_GROUP_NAME_VOLCANO: "vg"}}}
    assert gang_of(volcano) == (c.ANNOTATION_GROUP_NAME_VOLCANO, "vg", None)
    both = {"metadata": {"labels": {c.LABEL_GANG: "ours", c.LABEL_POD_GROUP_X_K8S: "theirs"}}}
    assert gang_of(both) == (c.LABEL_GANG, "ours", None)
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(ResourceRequestError, match="gang-size"):
            gang_of({"metadata": {"labels": {c.LABEL_GANG: "g", c.LABEL_GANG_SIZE: bad}}})


def test_fallback_visible_devices_annotations() -> None:
    from neuronetes.assignment import visible_devices_annotations

    a = decode(EXAMPLE)
    assert visible_devices_annotations(a) == {
        "neuronetes.io/visible-devices-trainer": f"{UUID0},{UUID1}",
        "neuronetes.io/visible-devices-warmup": UUID0,
    }
    d = doc()
    d["containers"] = {"x" * 63: d["containers"]["trainer"]}
    d["containers"]["m"] = {
        "gpus": [
            {
                "uuid": UUID0,
                "index": 0,
                "memoryMiB": 1,
                "computePercent": 100,
                "migProfile": "1g.5gb",
                "migStart": 0,
            }
        ],
        "priority": 0,
        "qos": "Guaranteed",
    }
    assert visible_devices_annotations(decode(d)) == {}
