"""Real nodes for the dev cluster: a kubelet and containerd (+ runc) per node, on this machine.

``neuronetes dev cluster up --real-nodes N`` adds nodes ``real-0`` … ``real-<N-1>`` beside the
simulated (kwok) ones. Each is one supervised process, ``hack/real-node.sh`` as PID 1 of a PID and
mount namespace of its own (``unshare``): containerd (NRI on, its own socket), the kubelet, the
runc shims and every container live in that PID namespace, every mount of the node in that mount
namespace, so stopping the node's process (``dev cluster down``, also from a new CLI after the
one that started it was SIGKILLed) leaves no process and no mount. The kubelet's cgroups live
under ``/neuronetes/<cluster>/<node>`` in each cgroup hierarchy, removed by `remove_cgroups` once
the nodes have stopped.

Networking: the node shares the host's network namespace (the API server reaches the kubelet
on a loopback port) and changes nothing in it. hostNetwork pods share it too; other pods get a
network namespace of their own with ``lo`` (CNI ``loopback``) and an ``eth0`` joined to nothing
(``hack/cni/neuronetes-pod-netns``): they have a pod IP and reach nothing outside themselves.

Images: nothing is pulled. The sandbox image and a busybox test image (`localimages`) are
imported into each node's containerd at start (``BUSYBOX_IMAGE``: use it with
``imagePullPolicy: Never``), and so are the archives of `NodeExtras` (in chart mode the
repository's image: `neuronetes.devcluster.realchart`, which also gives the node its labels,
taint and NVML).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from neuronetes.devcluster.api import ApiError, free_ports
from neuronetes.devcluster.components import POD_TOKENS, REAL_NODE_LABEL, SERVICE_CIDR
from neuronetes.devcluster.kubeletauth import apiserver_kubelet_client_args, kubelet_client_ca
from neuronetes.devcluster.localimages import BUSYBOX, busybox_image, pause_image, write_oci_archive
from neuronetes.devcluster.realchart import NodeExtras, chart_node_extras, missing_for_chart
from neuronetes.devcluster.state import ClusterError
from neuronetes.devcluster.tools import REPO_ROOT, Toolchain

if TYPE_CHECKING:
    from neuronetes.devcluster.cluster import DevCluster

__all__ = [
    "BUSYBOX_IMAGE",
    "PAUSE_IMAGE",
    "RealNodes",
    "apiserver_args",
    "is_real_node_process",
    "missing_requirements",
    "node_names",
    "remove_cgroups",
]

NODE_SCRIPT: Final = REPO_ROOT / "hack" / "real-node.sh"
POD_NET_PLUGIN: Final = REPO_ROOT / "hack" / "cni" / "neuronetes-pod-netns"
"""The CNI plugin giving a pod an address in a network namespace of its own, joined to nothing."""
NRI_SOCKET: Final = "/var/run/nri/nri.sock"
"""containerd's NRI socket, in the node's private /run (hack/real-node.sh mounts a tmpfs there)."""
CONTAINERD_SOCKET: Final = "/run/containerd/containerd.sock"
"""containerd's socket, in the node's private /run (hack/real-node.sh; the kubelet's endpoint)."""
RUNC: Final = Path("/usr/sbin/runc")
CNI_BIN_DIR: Final = Path("/usr/lib/cni")
CGROUP_FS: Final = Path("/sys/fs/cgroup")
PAUSE_IMAGE: Final = pause_image("busybox").ref
BUSYBOX_IMAGE: Final = busybox_image("local").ref

# The values the kubelet wants for six kernel settings (k8s.io/component-helpers sysctl): each
# node sees files holding them over /proc/sys, so it never writes the host's (hack/real-node.sh).
KUBELET_SYSCTLS: Final = {
    "vm.overcommit_memory": 1,
    "vm.panic_on_oom": 0,
    "kernel.panic": 10,
    "kernel.panic_on_oops": 1,
    "kernel.keys.root_maxkeys": 1000000,
    "kernel.keys.root_maxbytes": 25000000,
}


NODE_PREFIX: Final = "real-"


def apiserver_args(pki: Path, *, chart: bool) -> list[str]:
    """kube-apiserver's flags for real nodes: its kubelet client certificate (`kubeletauth`) and, in
    chart mode, the pods' service-account token volumes (the agent talks to the API server; a
    kwok-only cluster goes without the admission plugin that adds them)."""
    return [*apiserver_kubelet_client_args(pki), *([POD_TOKENS] if chart else [])]


def node_names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{i}" for i in range(count)]


def missing_requirements(tools: Toolchain, *, chart: bool = False) -> list[str]:
    """Why real nodes (`chart`: for the chart's agent) cannot run here (empty: they can)."""
    why: list[str] = missing_for_chart() if chart else []
    if os.geteuid() != 0:
        why.append("not root (containerd, runc and namespaces need it)")
    for path, source in [
        (RUNC, "Debian package runc"),
        (CNI_BIN_DIR / "loopback", "Debian package containernetworking-plugins"),
        (BUSYBOX, "Debian package busybox-static"),
        *((p, "hack/build-control-plane.sh kubelet containerd") for p in tools.node_binaries()),
    ]:
        if not path.exists():
            why.append(f"no {path} ({source}; hack/install-node-packages.sh installs the packages)")
    if shutil.which("unshare") is None:
        why.append("no unshare (util-linux)")
    if not (CGROUP_FS / "memory").is_dir() and not (CGROUP_FS / "cgroup.controllers").exists():
        why.append(f"no cgroup hierarchy at {CGROUP_FS}")
    return why


def cgroup_root(cluster: str, node: str) -> str:
    return f"/neuronetes/{cluster}/{node}"


def _cgroup_dirs(cluster: str) -> list[Path]:
    # cgroup v2: one unified hierarchy at the top; v1 or hybrid: one hierarchy per folder.
    unified = (CGROUP_FS / "cgroup.controllers").exists()
    hierarchies = [CGROUP_FS] if unified else [h for h in CGROUP_FS.iterdir() if h.is_dir()]
    return [h / "neuronetes" / cluster for h in hierarchies if (h / "neuronetes" / cluster).is_dir()]


def remove_cgroups(cluster: str, *, timeout_s: float = 10.0) -> list[str]:
    """Remove the cgroups of `cluster`'s real nodes, deepest first; return the ones left.

    Called once the nodes' processes have stopped: a cgroup empties as the kernel reaps the last
    process in it, so each is retried until `timeout_s`.
    """
    if not CGROUP_FS.is_dir():
        return []
    deadline = time.monotonic() + timeout_s
    while True:
        left: list[str] = []
        for top in _cgroup_dirs(cluster):
            for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                try:
                    os.rmdir(dirpath)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(dirpath)
            with contextlib.suppress(OSError):
                top.parent.rmdir()  # /neuronetes, once no cluster uses it
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


@dataclass(frozen=True, slots=True)
class NodeFiles:
    """What `render` writes for one node (its folder) and the kubelet's loopback ports."""

    name: str
    index: int
    folder: Path
    kubelet_port: int
    healthz_port: int


def _containerd_toml(folder: Path) -> str:
    cd = folder / "containerd"
    return f"""# containerd for dev-cluster node {folder.name} (rendered by neuronetes.devcluster.realnodes)
version = 3
root = '{cd / "root"}'
state = '{cd / "state"}'

# The sockets at containerd's usual paths, in the node's private /run: a Unix socket's path is
# limited to 108 bytes, which a path below the node's folder (under the user's cache) may pass.
[grpc]
  address = '{CONTAINERD_SOCKET}'

[ttrpc]
  address = '{CONTAINERD_SOCKET}.ttrpc'

[plugins.'io.containerd.internal.v1.opt']
  path = '{cd / "opt"}'

[plugins.'io.containerd.image-verifier.v1.bindir']
  bin_dir = '{cd / "image-verifier"}'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'

  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{PAUSE_IMAGE}'

[plugins.'io.containerd.cri.v1.runtime']
  # This machine's root may lack CAP_SYS_RESOURCE: no container gets a lower oom_score_adj than
  # containerd's own (the kubelet asks -998 for every sandbox, which runc could not set).
  restrict_oom_score_adj = true
  cdi_spec_dirs = ['{folder / "cdi"}']

  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{CNI_BIN_DIR}', '{POD_NET_PLUGIN.parent}']
    conf_dir = '{folder / "cni"}'

  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = '{RUNC}'
    SystemdCgroup = false

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'

# NRI (on by default in containerd 2.x): NeuroNetes' NRI plugin connects here. The socket is at
# the usual path (the chart's agent.hostPaths.nriSocketDir) in the node's own /run.
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = '{NRI_SOCKET}'
  plugin_path = '{folder / "nri" / "plugins"}'
  plugin_config_path = '{folder / "nri" / "conf.d"}'
"""


def _kubelet_yaml(
    files: NodeFiles, cluster: str, containerd_sock: Path, client_ca: Path, extras: NodeExtras
) -> str:
    root = files.folder / "kubelet"
    config: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine has cgroup v1 (v2 beside it, hybrid): kubelets of 1.35+ refuse v1 unless told.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root(cluster, files.name),
        "containerRuntimeEndpoint": f"unix://{containerd_sock}",
        "failSwapOn": False,
        "address": "127.0.0.1",
        "port": files.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": files.healthz_port,
        # Only the API server (its client certificate, `kubeletauth`) may call the kubelet.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        # Never touch the host: no iptables chains, and fail rather than set kernel sysctls.
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": True,
        # A workstation's disk and memory are shared with everything else: evict only when nearly full.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "/etc/resolv.conf",
        "staticPodPath": str(root / "manifests"),
        "serializeImagePulls": False,
        "registerNode": True,
        "registerWithTaints": [dict(t) for t in extras.taints],
    }
    return json.dumps(config, indent=2) + "\n"


def render(
    state_dir: Path,
    cluster: str,
    files: NodeFiles,
    tools: Toolchain,
    kubeconfig: Path,
    apiserver_port: int,
    extras: NodeExtras,
) -> None:
    """Write everything `hack/real-node.sh` reads into the node's folder (fresh)."""
    folder = files.folder
    shutil.rmtree(folder, ignore_errors=True)
    for sub in (
        "containerd",
        "cni",
        "cdi",
        "nri/plugins",
        "nri/conf.d",
        "kubelet/manifests",
        "sysctl",
        "var-log",
        "images",
        "run",
    ):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "containerd.toml").write_text(_containerd_toml(folder))
    sock = Path(CONTAINERD_SOCKET)
    client_ca = kubelet_client_ca(state_dir / "pki")
    (folder / "kubelet.yaml").write_text(_kubelet_yaml(files, cluster, sock, client_ca, extras))
    # A pod of its own network namespace gets `lo` and an `eth0` joined to nothing (no bridge,
    # no host change): containerd wants an address for every pod that is not hostNetwork.
    pod_net = {
        "cniVersion": "1.0.0",
        "name": "neuronetes-pod-netns",
        "plugins": [
            {"type": "loopback"},
            {
                "type": POD_NET_PLUGIN.name,
                "subnet": f"10.244.{files.index}.0/24",
                "dataDir": str(folder / "cni-ipam"),
                # In-cluster clients (the agent) reach the API server at the `kubernetes` Service.
                "apiServer": {
                    "serviceIP": str(ipaddress.ip_network(SERVICE_CIDR)[1]),
                    "port": 443,
                    "target": f"127.0.0.1:{apiserver_port}",
                },
            },
        ],
    }
    (folder / "cni" / "10-pod-netns.conflist").write_text(json.dumps(pod_net, indent=2) + "\n")
    for key, value in KUBELET_SYSCTLS.items():
        (folder / "sysctl" / key).write_text(f"{value}\n")
    cd = tools.containerd_dir
    labels = ",".join(f"{k}={v}" for k, v in {REAL_NODE_LABEL: "true", **extras.labels}.items())
    devices = " ".join(f"{d.path}:{d.major}:{d.minor}" for d in extras.devices)
    for rel, source in extras.run_files.items():
        target = folder / "run" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, Path):
            shutil.copyfile(source, target)
        else:
            target.write_bytes(source)
    (folder / "kubelet.env").write_text(
        f"CONTAINERD_BIN='{cd}'\nKUBELET_BIN='{tools.kubelet}'\nNODE_NAME='{files.name}'\n"
        f"CGROUP_ROOT='{cgroup_root(cluster, files.name)}'\nKUBECONFIG_FILE='{kubeconfig}'\n"
        f"NODE_LABELS='{labels}'\nSTAND_IN_DEVICES='{devices}'\nFAKE_GPU_DIR='{extras.fake_gpu_dir}'\n"
        f"export PATH='{cd}:{CNI_BIN_DIR}:/usr/sbin:/usr/bin:/sbin:/bin'\n"
    )
    shared = state_dir / "real-nodes" / "images.tar"
    if not shared.exists():
        write_oci_archive([pause_image("busybox"), busybox_image("local")], shared)
    os.link(shared, folder / "images" / "0-local.tar")
    for i, archive in enumerate(extras.archives, start=1):
        (folder / "images" / f"{i}-{archive.name}").symlink_to(archive)


def node_argv(folder: Path) -> list[str]:
    """The node's process: `hack/real-node.sh` as PID 1 of new PID and mount namespaces."""
    return [
        "unshare",
        "--fork",
        "--pid",
        "--mount-proc",
        "--mount",
        "--propagation",
        "private",
        "--kill-child=SIGKILL",
        "bash",
        str(NODE_SCRIPT),
        str(folder),
    ]


def process_name(node: str) -> str:
    return f"node-{node}"


def is_real_node_process(name: str) -> bool:
    """Whether a supervised process is a real node (not, say, the direct mode's ``node-agent``)."""
    return name.startswith(process_name(NODE_PREFIX))


class RealNodes:
    """Start a running cluster's real nodes and wait until they are Ready."""

    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster

    def start(self, names: Sequence[str], *, timeout_s: float = 120.0, chart: bool = False) -> None:
        """Spawn `names` (each recorded in the cluster's state at once) and wait until each Node
        is Ready. `chart`: GPU nodes for the chart's agent (`neuronetes.devcluster.realchart`)."""
        dev = self.cluster
        why = missing_requirements(dev.tools, chart=chart)
        extras = chart_node_extras() if chart else NodeExtras()
        if why:
            raise ClusterError("real nodes cannot run here: " + "; ".join(why))
        with dev.store.locked():
            state = dev.store.running()
            remove_cgroups(dev.name)  # of a run that was never `down`ed
            ports = free_ports(2 * len(names))
            for i, name in enumerate(names):
                folder = dev.state_dir / "real-nodes" / name
                files = NodeFiles(name, i, folder, ports[2 * i], ports[2 * i + 1])
                state.ports[f"kubelet-{name}"] = files.kubelet_port
                state.ports[f"kubelet_healthz-{name}"] = files.healthz_port
                render(
                    dev.state_dir, dev.name, files, dev.tools, dev.kubeconfig,
                    state.ports["apiserver"], extras,
                )  # fmt: skip
                dev.log(f"starting real node {name} (kubelet on 127.0.0.1:{files.kubelet_port})")
                dev.sup.spawn(state, process_name(name), node_argv(files.folder))
            deadline = time.monotonic() + timeout_s
            for name in names:
                dev.sup.wait(state, process_name(name), lambda n=name: self._ready(n), deadline)  # type: ignore[misc]
                dev.log(f"real node {name} Ready")

    def _ready(self, name: str) -> tuple[bool, str]:
        try:
            node = self.cluster.api().request("GET", f"/api/v1/nodes/{name}")
        except (ApiError, OSError) as exc:
            return False, f"node {name}: {exc}"
        status = node.get("status", {})
        if not any(a.get("type") == "InternalIP" for a in status.get("addresses", [])):
            # The kubelet refuses a loopback --node-ip ("nodeIP can't be loopback address") and then
            # leaves the addresses alone: the API server finds the kubelet (logs, exec) through this.
            with contextlib.suppress(ApiError, OSError):
                self.cluster.api().request(
                    "PATCH",
                    f"/api/v1/nodes/{name}/status",
                    {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}},
                    content_type="application/merge-patch+json",
                )
            return False, f"node {name}: no InternalIP yet"
        for cond in status.get("conditions", []):
            if cond.get("type") == "Ready":
                return cond.get("status") == "True", f"Ready={cond.get('status')}: {cond.get('message')}"
        return False, f"node {name} has no Ready condition yet"
