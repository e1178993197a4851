"""Validation cases shared by the unit and e2e tests of the webhook and the CRD rules.

`OBJECT_CASES`: NeuroNetes objects that must be refused, with the substring of the refusal that
names the field and where the refusal comes from (``crd``: the API server's schema/CEL,
``webhook``: `neuronetes_operator.validation`). `VALID_OBJECTS`: edge cases that must be accepted.
`POD_CASES`: pods asking for NeuroNetes GPUs that the pod webhook must refuse.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from neuronetes import contracts as c


@dataclass(frozen=True)
class ObjectCase:
    name: str
    text: str
    expect: str
    where: str  # "crd" | "webhook"


def pool(name: str, spec: str) -> str:
    body = "\n".join("  " + line for line in spec.strip("\n").splitlines())
    return f"apiVersion: neuronetes.io/v1alpha1\nkind: AgentPool\nmetadata:\n  name: {name}\nspec:\n{body}\n"


def _template(spec: str) -> str:
    return "template:\n  spec:\n" + "\n".join("    " + line for line in spec.strip("\n").splitlines())


OBJECT_CASES = [
    ObjectCase(
        "mig-profile-no-gpu-offers", pool("v-mig1", 'migProfile: "9g.99gb"'), "spec.migProfile", "webhook"
    ),
    ObjectCase(
        "mig-profile-not-on-type",
        pool("v-mig2", 'migProfile: "1g.5gb"\ngpuRequirements:\n  type: H100'),
        "H100 GPUs do not offer",
        "webhook",
    ),
    ObjectCase(
        "mig-profile-on-type-without-mig",
        pool("v-mig3", 'migProfile: "1g.5gb"\ngpuRequirements:\n  type: T4'),
        "spec.gpuRequirements.type: 'T4' has no MIG support",
        "webhook",
    ),
    ObjectCase(
        "gpu-type-unknown",
        pool("v-type1", "gpuRequirements:\n  type: Z100"),
        "spec.gpuRequirements.type: 'Z100' is no GPU model NeuroNetes knows; use one of A10, A100,",
        "webhook",
    ),
    ObjectCase(
        "gpu-type-a-model",
        pool("v-type2", "gpuRequirements:\n  type: A100-80GB"),
        "spec.gpuRequirements.type: 'A100-80GB' is a model, not a GPU type",
        "webhook",
    ),
    ObjectCase(
        "memory-1e9999",
        pool("v-mem1", "gpuRequirements:\n  memory: 1e9999"),
        "spec.gpuRequirements.memory",
        "crd",
    ),
    ObjectCase("memory-10Ei", pool("v-mem2", "gpuRequirements:\n  memory: 10Ei"), "at most 288Gi", "crd"),
    ObjectCase("memory-289Gi", pool("v-mem3", "gpuRequirements:\n  memory: 289Gi"), "at most 288Gi", "crd"),
    ObjectCase(
        "agentpool-without-spec",
        "apiVersion: neuronetes.io/v1alpha1\nkind: AgentPool\nmetadata:\n  name: v-nospec\n",
        "spec: Required value",
        "crd",
    ),
    ObjectCase(
        "toolbinding-without-spec",
        "apiVersion: neuronetes.io/v1alpha1\nkind: ToolBinding\nmetadata:\n  name: v-tb-nospec\n",
        "spec: Required value",
        "crd",
    ),
    ObjectCase(
        "toolbinding-bad-pool-name",
        "apiVersion: neuronetes.io/v1alpha1\nkind: ToolBinding\nmetadata:\n  name: v-tb-name\n"
        'spec:\n  poolRef:\n    name: "Bad Name!"\n',
        "spec.poolRef.name",
        "crd",
    ),
    ObjectCase(
        "time-zone-unknown",
        pool(
            "v-tz1",
            "scheduling:\n  carbonAware:\n    timeShifting:\n      enabled: true\n"
            '      cleanEnergyHours: "09:00-17:00"\n      timeZone: Mars/Olympus',
        ),
        "timeZone: 'Mars/Olympus' is not an IANA time zone",
        "webhook",
    ),
    ObjectCase(
        "time-zone-malformed",
        pool("v-tz2", 'scheduling:\n  carbonAware:\n    timeShifting:\n      timeZone: "Bad Zone!"'),
        "spec.scheduling.carbonAware.timeShifting.timeZone",
        "crd",
    ),
    ObjectCase(
        "template-node-name",
        pool("v-tpl1", _template("nodeName: gpu-node-1\ncontainers:\n- name: a\n  image: x")),
        "spec.template.spec.nodeName: must not be set",
        "webhook",
    ),
    ObjectCase(
        "template-scheduler-name",
        pool("v-tpl2", _template("schedulerName: default-scheduler\ncontainers:\n- name: a\n  image: x")),
        "spec.template.spec.schedulerName: must not be set",
        "webhook",
    ),
    ObjectCase(
        "template-priority-class",
        pool("v-tpl3", _template("priorityClassName: high\ncontainers:\n- name: a\n  image: x")),
        "spec.template.spec.priorityClassName: must not be set",
        "webhook",
    ),
    ObjectCase(
        "template-gpu-resource",
        pool(
            "v-tpl4",
            _template(
                "containers:\n- name: a\n  image: x\n  resources:\n    limits:\n      neuronetes.io/gpu: 2"
            ),
        ),
        "resources.limits[neuronetes.io/gpu]: must not be set",
        "webhook",
    ),
    ObjectCase(
        "template-privileged",
        pool(
            "v-tpl5",
            _template("containers:\n- name: a\n  image: x\n  securityContext:\n    privileged: true"),
        ),
        "spec.containers[0].securityContext.privileged",
        "webhook",
    ),
    ObjectCase(
        "template-nvidia-env",
        pool(
            "v-tpl6",
            _template(
                "containers:\n- name: a\n  image: x\n  env:\n  - name: NVIDIA_VISIBLE_DEVICES\n    value: all"
            ),
        ),
        "spec.containers[0].env[0]: NVIDIA_VISIBLE_DEVICES",
        "webhook",
    ),
    ObjectCase(
        "bandwidth-above-any-gpu",
        pool("v-bw1", "gpuRequirements:\n  topology:\n    minBandwidth: 2000Gi"),
        "more than any GPU's NVLink",
        "webhook",
    ),
    ObjectCase(
        "bandwidth-on-pcie-type",
        pool("v-bw2", "gpuRequirements:\n  type: T4\n  topology:\n    minBandwidth: 100Gi"),
        "T4 GPUs have no NVLink",
        "webhook",
    ),
    ObjectCase(
        "bandwidth-above-type",
        pool("v-bw3", "gpuRequirements:\n  type: A100\n  topology:\n    minBandwidth: 900Gi"),
        "more than A100 NVLink",
        "webhook",
    ),
    ObjectCase(
        "gang-replicas-not-whole-gangs",
        pool(
            "v-gang1",
            "replicas: 6\nminReplicas: 4\nmaxReplicas: 8\n"
            "scheduling:\n  gangScheduling:\n    enabled: true\n    minMembers: 4",
        ),
        "spec.replicas must be a multiple of the gang size",
        "crd",
    ),
    ObjectCase(
        "gang-min-replicas-not-whole-gangs",
        pool(
            "v-gang2", "minReplicas: 6\nscheduling:\n  gangScheduling:\n    enabled: true\n    minMembers: 4"
        ),
        "spec.scheduling.gangScheduling.minMembers must divide spec.minReplicas",
        "crd",
    ),
    ObjectCase(
        # minReplicas unset is 1 (the CRD's default): the message starts with what the user wrote
        "gang-without-min-replicas",
        pool("v-gang4", "scheduling:\n  gangScheduling:\n    enabled: true\n    minMembers: 4"),
        "spec.scheduling.gangScheduling.minMembers must divide spec.minReplicas, which is 1 when not set",
        "crd",
    ),
    ObjectCase(
        "gang-without-size",
        pool("v-gang3", "minReplicas: 0\nscheduling:\n  gangScheduling:\n    enabled: true"),
        "spec.scheduling.gangScheduling.minMembers is required",
        "crd",
    ),
    ObjectCase(
        "autoscaling-without-max",
        pool("v-as1", "autoscaling:\n  enabled: true\n  ttftMs: 500"),
        "spec.maxReplicas is required when spec.autoscaling.enabled",
        "crd",
    ),
    ObjectCase(
        "pool-name-too-long",
        pool("v-" + "x" * 49, "minReplicas: 1"),
        "metadata.name: at most 50 characters",
        "webhook",
    ),
    ObjectCase(
        "preferred-region-not-a-label",
        pool("v-region", 'scheduling:\n  carbonAware:\n    preferredRegions:\n    - "us west 2"'),
        "spec.scheduling.carbonAware.preferredRegions[0]",
        "crd",
    ),
    ObjectCase(
        "slice-memory-above-any-gpu",
        "apiVersion: neuronetes.io/v1alpha1\nkind: GPUSlice\nmetadata:\n  name: v-slice1\n"
        "spec:\n  memory: 300Gi\n",
        "spec.memory must be at most 288Gi",
        "crd",
    ),
    ObjectCase(
        "slice-mig-profile-no-gpu-offers",
        "apiVersion: neuronetes.io/v1alpha1\nkind: GPUSlice\nmetadata:\n  name: v-slice2\nspec:\n"
        "  memory: 10Gi\n  migProfile: 9g.99gb\n",
        "spec.migProfile: '9g.99gb' is offered by no MIG-capable GPU",
        "webhook",
    ),
]

VALID_OBJECTS = [
    ObjectCase("memory-exactly-288Gi", pool("ok-mem", "gpuRequirements:\n  memory: 288Gi"), "", "crd"),
    ObjectCase("gpu-type-lower-case", pool("ok-type1", "gpuRequirements:\n  type: l40s"), "", ""),
    ObjectCase(
        "mig-1g5gb-on-a100", pool("ok-mig1", 'migProfile: "1g.5gb"\ngpuRequirements:\n  type: A100'), "", ""
    ),
    ObjectCase(
        "mig-1g10gb-on-h100", pool("ok-mig2", 'migProfile: "1g.10gb"\ngpuRequirements:\n  type: H100'), "", ""
    ),
    ObjectCase(
        "time-zone-europe-paris",
        pool(
            "ok-tz",
            "scheduling:\n  carbonAware:\n    timeShifting:\n      enabled: true\n"
            '      cleanEnergyHours: "22:00-06:00"\n      timeZone: Europe/Paris',
        ),
        "",
        "",
    ),
    ObjectCase(
        "bandwidth-900-on-h100",
        pool("ok-bw", "gpuRequirements:\n  type: H100\n  topology:\n    minBandwidth: 900Gi"),
        "",
        "",
    ),
    ObjectCase(
        "gang-two-whole-gangs",
        pool(
            "ok-gang",
            "replicas: 8\nminReplicas: 4\nmaxReplicas: 8\n"
            "scheduling:\n  gangScheduling:\n    enabled: true\n    minMembers: 4",
        ),
        "",
        "",
    ),
    ObjectCase(
        "template-with-selector-and-cuda-visible-devices",
        pool(
            "ok-tpl",
            _template(
                "nodeSelector:\n  team: a\ncontainers:\n- name: a\n  image: x\n  env:\n"
                "  - name: CUDA_VISIBLE_DEVICES\n    value: '0'"
            ),
        ),
        "",
        "",
    ),
    ObjectCase("pool-name-50-characters", pool("ok-" + "x" * 47, "minReplicas: 0"), "", ""),
]


@dataclass(frozen=True)
class PodCase:
    name: str
    pod: dict[str, Any]
    expect: str


def gpu_pod(limits: dict[str, str] | None = None, name: str = "p") -> dict[str, Any]:
    """A pod asking for one whole GPU (or `limits`), as the API server hands it to the webhook."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/w:1",
                    "resources": {"limits": limits or {c.RESOURCE_GPU: "1"}},
                }
            ],
        },
    }


def _with(path: str, value: Any, limits: dict[str, str] | None = None) -> dict[str, Any]:
    pod = gpu_pod(limits)
    target: Any = pod
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target.setdefault(key, {})
    target[keys[-1]] = copy.deepcopy(value)
    return pod


def _env(name: str) -> dict[str, Any]:
    return _with("spec.containers.0.env", [{"name": name, "value": "x"}])


POD_CASES = [
    PodCase(
        "gpu-memory-in-gibibytes",
        gpu_pod({c.RESOURCE_GPU_MEMORY: "16Gi", c.RESOURCE_GPU_COMPUTE: "50"}),
        "'16Gi' has a unit suffix, but the resource counts MiB",
    ),
    PodCase(
        "whole-gpus-with-a-slice",
        gpu_pod({c.RESOURCE_GPU: "1", c.RESOURCE_GPU_MEMORY: "1024", c.RESOURCE_GPU_COMPUTE: "10"}),
        "cannot be combined with",
    ),
    PodCase(
        "containers-of-different-kinds",
        _with(
            "spec.containers",
            [
                {"name": "a", "resources": {"limits": {c.RESOURCE_GPU: "1"}}},
                {"name": "b", "resources": {"limits": {c.mig_resource_name("1g.5gb"): "1"}}},
            ],
        ),
        "must ask for the same kind",
    ),
    PodCase(
        "requests-differ-from-limits",
        _with("spec.containers.0.resources.requests", {c.RESOURCE_GPU: "2"}),
        "requests (2) != limits (1)",
    ),
    PodCase(
        "nvidia-gpu-beside-ours", gpu_pod({c.RESOURCE_GPU: "1", "nvidia.com/gpu": "1"}), "[nvidia.com/gpu]"
    ),
    PodCase(
        "privileged",
        _with("spec.containers.0.securityContext", {"privileged": True}),
        "securityContext.privileged",
    ),
    PodCase("host-pid", _with("spec.hostPID", True), "spec.hostPID"),
    PodCase("host-ipc", _with("spec.hostIPC", True), "spec.hostIPC"),
    PodCase(
        "sys-admin-capability",
        _with("spec.containers.0.securityContext", {"capabilities": {"add": ["SYS_ADMIN"]}}),
        "capabilities.add: SYS_ADMIN",
    ),
    PodCase(
        "host-path-dev",
        _with("spec.volumes", [{"name": "d", "hostPath": {"path": "/dev"}}]),
        "spec.volumes[0].hostPath",
    ),
    # The agent's and the runtime's host directories, written as a tenant might dress them up.
    *(
        PodCase(
            f"host-path-{name}",
            _with("spec.volumes", [{"name": "d", "hostPath": {"path": path}}]),
            f"spec.volumes[0].hostPath.path: {path!r}",
        )
        for name, path in (
            ("shim-dir", "/var/lib/neuronetes/shim"),
            ("agent-state-trailing-slash", "/run/neuronetes/"),
            ("etc-cdi-trailing-slash", "/etc/cdi/"),
            ("var-run-cdi", "/var/run/cdi"),
            ("nri-socket-dir", "/run/nri"),
            ("kubelet-doubled-slash-and-dot", "//var/lib/./kubelet/pods"),
            ("parent-of-kubelet-and-agent", "/var/lib"),
        )
    ),
    PodCase("preset-node-name", _with("spec.nodeName", "gpu-node-1"), "spec.nodeName: must not be set"),
    PodCase("other-scheduler", _with("spec.schedulerName", "my-scheduler"), "spec.schedulerName"),
    PodCase("env-nvidia-visible-devices", _env("NVIDIA_VISIBLE_DEVICES"), "env[0]: NVIDIA_VISIBLE_DEVICES"),
    PodCase("env-ld-preload", _env("LD_PRELOAD"), "env[0]: LD_PRELOAD"),
    PodCase("env-cuda-device-order", _env("CUDA_DEVICE_ORDER"), "env[0]: CUDA_DEVICE_ORDER"),
    PodCase("env-neuronetes", _env("NEURONETES_REGION"), "env[0]: NEURONETES_REGION"),
    PodCase(
        "init-container-env",
        _with(
            "spec.initContainers", [{"name": "i", "image": "x", "env": [{"name": "LD_AUDIT", "value": "x"}]}]
        ),
        "spec.initContainers[0].env[0]: LD_AUDIT",
    ),
    PodCase(
        "assignment-annotation",
        _with("metadata.annotations", {c.ANNOTATION_ASSIGNED_GPUS: "{}"}),
        f"metadata.annotations[{c.ANNOTATION_ASSIGNED_GPUS}]",
    ),
    PodCase(
        "visible-devices-annotation",
        _with("metadata.annotations", {c.ANNOTATION_VISIBLE_DEVICES_PREFIX + "main": "GPU-1"}),
        "metadata.annotations[neuronetes.io/visible-devices-main]",
    ),
    PodCase(
        "cdi-annotation",
        _with("metadata.annotations", {"cdi.k8s.io/x": "nvidia.com/gpu=all"}),
        "metadata.annotations[cdi.k8s.io/x]",
    ),
]
