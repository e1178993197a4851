"""The chart on real nodes: what a real node needs so that the chart's agent DaemonSet runs there.

In chart mode (`neuronetes.devcluster.chartmode`) with ``--real-nodes``, each real node is a GPU
node the way a cluster's are: labelled ``nvidia.com/gpu.present=true`` (what GPU feature discovery
sets, the agent DaemonSet's node selector), its containerd holding the repository's image
(``hack/build-image.sh``'s OCI archive, imported at the node's start: nothing is pulled), and a
driver's NVML at the path NVIDIA's GPU operator uses (``/run/nvidia/driver/…``, in the node's own
``/run``): the fake ``libnvidia-ml.so.1`` of ``node-agent/shim`` (one simulated GPU). The node is
also tainted ``dev.neuronetes.io/real-node:NoSchedule``, so that the chart's Deployments stay on
``system-0`` (the chart runner runs them) and only what tolerates the taint (the agent, through
``hack/real-node-values.yaml``) lands there. The agent pod and its NRI plugin then run as real
containers of that node; the chart runner leaves pods on real nodes alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from neuronetes import __version__
from neuronetes.devcluster.components import REAL_NODE_LABEL
from neuronetes.devcluster.tools import REPO_ROOT, cache_root

__all__ = [
    "NODE_NVML",
    "REAL_NODE_VALUES",
    "NodeExtras",
    "chart_node_extras",
    "image_archive",
    "missing_for_chart",
]

REAL_NODE_VALUES: Final = REPO_ROOT / "hack" / "real-node-values.yaml"
"""The chart's values for real nodes, on top of ``hack/local-values.yaml``."""
FAKE_NVML: Final = REPO_ROOT / "node-agent" / "shim" / "build" / "release" / "fake" / "libnvidia-ml.so.1"
NODE_NVML: Final = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
"""Where a real node has its (fake) NVML: ``agent.hostPaths.nvmlLibrary`` of REAL_NODE_VALUES."""
GPU_LABEL: Final = "nvidia.com/gpu.present"


def image_archive() -> Path:
    """The OCI archive of the repository's image that ``hack/build-image.sh`` writes."""
    return cache_root() / "images" / f"neuronetes-{__version__}.oci.tar"


@dataclass(frozen=True, slots=True)
class NodeExtras:
    """What a real node gets beyond a plain one: labels, taints, image archives, an NVML."""

    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, Any]] = ()
    archives: Sequence[Path] = ()
    nvml: Path | None = None


def missing_for_chart() -> list[str]:
    """Why the chart's agent cannot run on real nodes here (empty: it can)."""
    why: list[str] = []
    if not image_archive().exists():
        why.append(f"no image archive {image_archive()} (run hack/build-image.sh)")
    if not FAKE_NVML.exists():
        why.append(f"no fake NVML {FAKE_NVML} (run make -C node-agent/shim)")
    return why


def chart_node_extras() -> NodeExtras:
    return NodeExtras(
        labels={GPU_LABEL: "true"},
        taints=[{"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}],
        archives=[image_archive()],
        nvml=FAKE_NVML,
    )
