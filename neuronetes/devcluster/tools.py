"""Where the control-plane binaries live, which versions are pinned, and how to build them.

The versions are pinned once, in ``hack/versions.env``; ``hack/build-control-plane.sh`` builds them
into per-tool, per-version folders under the binary cache, and this module finds them there.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "REPO_ROOT",
    "BuildError",
    "Toolchain",
    "Versions",
    "build",
    "cache_root",
    "read_versions",
    "want_controller_manager",
]

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
"""The source checkout this package runs from (the package is installed editable)."""
VERSIONS_FILE: Final = REPO_ROOT / "hack" / "versions.env"
BUILD_SCRIPT: Final = REPO_ROOT / "hack" / "build-control-plane.sh"


class BuildError(RuntimeError):
    """The control-plane binaries are missing and could not be built."""


@dataclass(frozen=True, slots=True)
class Versions:
    kubernetes: str
    etcd: str
    kwok: str
    helm: str
    containerd: str


def read_versions(path: Path | None = None) -> Versions:
    """Parse ``hack/versions.env`` (``KEY=value`` lines; ``#`` comments)."""
    path = path or Path(os.environ.get("NEURONETES_VERSIONS_FILE", VERSIONS_FILE))
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: not KEY=value: {raw!r}")
        values[key.strip()] = value.strip()
    try:
        return Versions(
            kubernetes=values["KUBERNETES_VERSION"],
            etcd=values["ETCD_VERSION"],
            kwok=values["KWOK_VERSION"],
            helm=values["HELM_VERSION"],
            containerd=values["CONTAINERD_VERSION"],
        )
    except KeyError as exc:
        raise ValueError(f"{path}: missing {exc.args[0]}") from None


def cache_root() -> Path:
    """``$NEURONETES_CACHE_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/neuronetes`` (as the script)."""
    explicit = os.environ.get("NEURONETES_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "neuronetes"


def want_controller_manager() -> bool:
    """False when ``NEURONETES_SKIP_KUBE_CONTROLLER_MANAGER=1`` (the build script then skips it)."""
    return os.environ.get("NEURONETES_SKIP_KUBE_CONTROLLER_MANAGER", "0") != "1"


def bin_root() -> Path:
    explicit = os.environ.get("NEURONETES_BIN_DIR")
    return Path(explicit) if explicit else cache_root() / "bin"


@dataclass(frozen=True, slots=True)
class Toolchain:
    """Paths of the pinned binaries (they may not exist yet: see `missing`)."""

    versions: Versions
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    kwok_stages: Path
    helm: Path
    kubelet: Path
    containerd_dir: Path
    """containerd, containerd-shim-runc-v2 and ctr (real nodes: `neuronetes.devcluster.realnodes`)."""

    @classmethod
    def pinned(cls, versions: Versions | None = None) -> Toolchain:
        v = versions or read_versions()
        root = bin_root()
        k8s = root / f"kubernetes-{v.kubernetes}"
        kwok = root / f"kwok-{v.kwok}"
        return cls(
            versions=v,
            etcd=root / f"etcd-{v.etcd}" / "etcd",
            kube_apiserver=k8s / "kube-apiserver",
            kube_controller_manager=k8s / "kube-controller-manager",
            kube_scheduler=k8s / "kube-scheduler",
            kubectl=k8s / "kubectl",
            kwok=kwok / "kwok",
            kwok_stages=kwok / "stages.yaml",
            helm=root / f"helm-{v.helm}" / "helm",
            kubelet=root / f"kubelet-{v.kubernetes}" / "kubelet",
            containerd_dir=root / f"containerd-{v.containerd}",
        )

    def required(self, *, controller_manager: bool | None = None) -> list[Path]:
        """The binaries a cluster needs (kube-controller-manager unless opted out)."""
        paths = [
            self.etcd,
            self.kube_apiserver,
            self.kube_scheduler,
            self.kubectl,
            self.kwok,
            self.kwok_stages,
        ]
        if want_controller_manager() if controller_manager is None else controller_manager:
            paths.append(self.kube_controller_manager)
        return paths

    def missing(self, *, controller_manager: bool | None = None) -> list[Path]:
        return [p for p in self.required(controller_manager=controller_manager) if not p.exists()]

    def node_binaries(self) -> list[Path]:
        """What a real node runs (the kubelet, containerd, its runc shim, ctr)."""
        d = self.containerd_dir
        return [self.kubelet, d / "containerd", d / "containerd-shim-runc-v2", d / "ctr"]


def build(*, quiet: bool = False, log: Path | None = None) -> Toolchain:
    """Run ``hack/build-control-plane.sh`` (a no-op when everything pinned is built).

    Progress goes to stderr, or to `log` when given. Raises `BuildError` when the script fails
    or is not there (an installed, non-editable copy of the package has no ``hack/``).
    """
    if not BUILD_SCRIPT.exists():
        raise BuildError(f"{BUILD_SCRIPT} not found: build the control plane from a source checkout")
    cmd = ["bash", str(BUILD_SCRIPT)]
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    elif quiet:
        rc = subprocess.call(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
    else:
        rc = subprocess.call(cmd, stdout=2, stdin=subprocess.DEVNULL)  # progress on stderr
    if rc != 0:
        where = f"; see {log}" if log is not None else ""
        raise BuildError(f"{BUILD_SCRIPT} failed with exit status {rc}{where}")
    tools = Toolchain.pinned()
    missing = tools.missing()
    if missing:
        raise BuildError(f"built, but still missing: {', '.join(map(str, missing))}")
    return tools
