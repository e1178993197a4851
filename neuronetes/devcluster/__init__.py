"""A local Kubernetes control plane with simulated GPU nodes, for development and e2e tests.

`DevCluster` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler (with the
``neuronetes-scheduler`` profile) and kwok on loopback, from the binaries
``hack/build-control-plane.sh`` builds, and the NeuroNetes extender beside each kube-scheduler
(or points kube-scheduler at an external one); `profiles` holds the named GPU node topologies,
`config` the documents kube-scheduler and the extender read, `access` the extender's identity.
The CLI is ``neuronetes dev cluster up|down|status|kubeconfig``; ``neuronetes demo`` (`demo`)
runs the sample workload on it.
"""

from __future__ import annotations

from neuronetes.devcluster.api import ApiError, KubectlError
from neuronetes.devcluster.cluster import POLICIES_DIR, DevCluster
from neuronetes.devcluster.config import ExtenderConfig, LeaderElection
from neuronetes.devcluster.state import ClusterError
from neuronetes.devcluster.status import ClusterStatus, ComponentStatus
from neuronetes.devcluster.tools import BuildError, Toolchain, Versions, build, read_versions
from neuronetes.profiles import (
    PROFILES,
    TopologyProfile,
    node_manifest,
    parse_node_counts,
    profile,
)

__all__ = [
    "POLICIES_DIR",
    "PROFILES",
    "ApiError",
    "BuildError",
    "ClusterError",
    "ClusterStatus",
    "ComponentStatus",
    "DevCluster",
    "ExtenderConfig",
    "KubectlError",
    "LeaderElection",
    "Toolchain",
    "TopologyProfile",
    "Versions",
    "build",
    "node_manifest",
    "parse_node_counts",
    "profile",
    "read_versions",
]
