"""The chart on real nodes: what a real node needs so that the chart's agent DaemonSet runs there.

In chart mode (`neuronetes.devcluster.chartmode`) with ``--real-nodes``, each real node is a GPU
node the way a cluster's are: labelled ``nvidia.com/gpu.present=true`` (what GPU feature discovery
sets, the agent DaemonSet's node selector), its containerd holding the repository's image
(``hack/build-image.sh``'s OCI archive, imported at the node's start: nothing is pulled), and a
driver's NVML at the path NVIDIA's GPU operator uses (``/run/nvidia/driver/…``, in the node's own
``/run``): the fake ``libcuda.so.1`` and ``libnvidia-ml.so.1`` of ``node-agent/shim`` (one
simulated GPU), with what a driver install gives a node besides: the GPU's and the driver's
control device nodes (stand-ins: the numbers NVIDIA's driver uses, in the node's private
``/dev``; nothing opens them, the fake driver is the GPU) and NVIDIA's CDI spec
(``/run/cdi/nvidia.yaml``, as ``nvidia-ctk cdi generate`` writes it: the driver libraries a GPU
container gets mounted, which the agent reads into its node inventory). The node is
also tainted ``dev.neuronetes.io/real-node:NoSchedule``, so that the chart's Deployments stay on
``system-0`` (the chart runner runs them) and only what tolerates the taint (the agent, through
``hack/real-node-values.yaml``) lands there. The agent pod and its NRI plugin then run as real
containers of that node; the chart runner leaves pods on real nodes alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from neuronetes import __version__
from neuronetes.devcluster.components import REAL_NODE_LABEL
from neuronetes.devcluster.tools import REPO_ROOT, cache_root
from neuronetes_agent.daemon.devicenodes import NVIDIA_MAJOR, DeviceNode, SimulatedDeviceNodes

__all__ = [
    "GPU_PROBE_IMAGE",
    "NODE_DRIVER_DIR",
    "NODE_NVML",
    "REAL_NODE_VALUES",
    "NodeExtras",
    "chart_node_extras",
    "image_archive",
    "missing_for_chart",
]

REAL_NODE_VALUES: Final = REPO_ROOT / "hack" / "real-node-values.yaml"
"""The chart's values for real nodes, on top of ``hack/local-values.yaml``."""
FAKE_DRIVER: Final = REPO_ROOT / "node-agent" / "shim" / "build" / "release" / "fake"
FAKE_NVML: Final = FAKE_DRIVER / "libnvidia-ml.so.1"
FAKE_CUDA: Final = FAKE_DRIVER / "libcuda.so.1"
NODE_DRIVER_DIR: Final = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu"
"""Where a real node has its (fake) driver libraries, as NVIDIA's GPU operator installs them."""
NODE_NVML: Final = f"{NODE_DRIVER_DIR}/libnvidia-ml.so.1"
"""Where a real node has its (fake) NVML: ``agent.hostPaths.nvmlLibrary`` of REAL_NODE_VALUES."""
CONTAINER_DRIVER_DIR: Final = "/usr/lib/x86_64-linux-gnu"
"""Where a GPU container sees the driver's libraries (the CDI spec's container paths)."""
FAKE_STATE_DIR: Final = "/mnt/neuronetes-fake-gpu"
"""Where the fake driver keeps its GPU's account on a node (the agent's FAKE_CUDA_STATE folder):
outside ``/run``, which GPU pods may not mount, in a tmpfs of the node's own over ``/mnt``."""
GPU_LABEL: Final = "nvidia.com/gpu.present"
NODE_GPUS: Final = 1
"""Simulated GPUs per real node (the fake driver's default device count)."""


GPU_PROBE_IMAGE: Final = f"localhost/neuronetes-gpu-probe:{__version__}"
"""The real-node e2e tests' GPU workload (``tests/images/gpu-probe``), when built."""


def image_archive(name: str = "neuronetes") -> Path:
    """The OCI archive of a local image (by default the repository's) ``hack/build-image.sh`` writes."""
    return cache_root() / "images" / f"{name}-{__version__}.oci.tar"


def gpu_probe_archives() -> list[Path]:
    """The GPU probe image's archive when it was built (tests build it; the demo does not need it)."""
    archive = image_archive("neuronetes-gpu-probe")
    return [archive] if archive.exists() else []


@dataclass(frozen=True, slots=True)
class NodeExtras:
    """What a real node gets beyond a plain one: labels, taints, image archives, an NVML."""

    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, Any]] = ()
    archives: Sequence[Path] = ()
    run_files: Mapping[str, Path | bytes] = field(default_factory=dict)
    """Files of the node's private ``/run`` (path below it → a file to copy or the content)."""
    fake_gpu_dir: str = ""
    """The fake driver's folder on the node (a tmpfs of the node's own), empty: none."""
    devices: Sequence[DeviceNode] = ()
    """Stand-in character devices of the node's private ``/dev``."""


def missing_for_chart() -> list[str]:
    """Why the chart's agent cannot run on real nodes here (empty: it can)."""
    why: list[str] = []
    if not image_archive().exists():
        why.append(f"no image archive {image_archive()} (run hack/build-image.sh)")
    for lib in (FAKE_NVML, FAKE_CUDA):
        if not lib.exists():
            why.append(f"no fake driver library {lib} (run make -C node-agent/shim)")
    return why


def driver_cdi_spec() -> bytes:
    """NVIDIA's CDI spec for the node's (fake) driver, in the shape ``nvidia-ctk cdi generate``
    writes: a device per GPU and, common to all, the driver libraries' mounts. JSON is YAML."""
    libs = [FAKE_CUDA.name, FAKE_NVML.name]
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": str(i), "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}}
            for i in range(NODE_GPUS)
        ],
        "containerEdits": {
            "mounts": [
                {
                    "hostPath": f"{NODE_DRIVER_DIR}/{lib}",
                    "containerPath": f"{CONTAINER_DRIVER_DIR}/{lib}",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
                for lib in libs
            ]
        },
    }
    return (json.dumps(spec, indent=2) + "\n").encode()


def stand_in_devices() -> list[DeviceNode]:
    """The device nodes NVIDIA's driver makes on a node of NODE_GPUS GPUs, with its numbers."""
    simulated = SimulatedDeviceNodes()
    return [*simulated.control(), *(DeviceNode(f"/dev/nvidia{i}", NVIDIA_MAJOR, i) for i in range(NODE_GPUS))]


def chart_node_extras() -> NodeExtras:
    return NodeExtras(
        labels={GPU_LABEL: "true"},
        taints=[{"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}],
        archives=[image_archive(), *gpu_probe_archives()],
        run_files={
            NODE_NVML.removeprefix("/run/"): FAKE_NVML,
            f"{NODE_DRIVER_DIR}/{FAKE_CUDA.name}".removeprefix("/run/"): FAKE_CUDA,
            "cdi/nvidia.yaml": driver_cdi_spec(),
        },
        devices=stand_in_devices(),
        fake_gpu_dir=FAKE_STATE_DIR,
    )
