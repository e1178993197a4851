"""A local Kubernetes control plane with simulated GPU nodes, for development and e2e tests.

`DevCluster` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler (with the
``neuronetes-scheduler`` profile and, optionally, our extender) and kwok on loopback, from the
binaries ``hack/build-control-plane.sh`` builds; `profiles` holds the named GPU node topologies.
The CLI is ``neuronetes dev cluster up|down|status|kubeconfig``.
"""

from __future__ import annotations

from neuronetes.devcluster.cluster import (
    ApiError,
    ClusterError,
    ClusterStatus,
    ComponentStatus,
    DevCluster,
    KubectlError,
    parse_node_counts,
)
from neuronetes.devcluster.config import ExtenderConfig
from neuronetes.devcluster.profiles import PROFILES, TopologyProfile, node_manifest, profile
from neuronetes.devcluster.tools import BuildError, Toolchain, Versions, build, read_versions

__all__ = [
    "PROFILES",
    "ApiError",
    "BuildError",
    "ClusterError",
    "ClusterStatus",
    "ComponentStatus",
    "DevCluster",
    "ExtenderConfig",
    "KubectlError",
    "Toolchain",
    "TopologyProfile",
    "Versions",
    "build",
    "node_manifest",
    "parse_node_counts",
    "profile",
    "read_versions",
]
