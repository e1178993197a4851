"""What a kubelet would run for one pod, mapped onto this host: the pure half of the chart runner.

kwok runs no containers, so `neuronetes.devcluster.chartrun` starts a pod's containers as host
processes from the plan `plan_pod` makes. The plan keeps everything the chart rendered — the
container's command and args, its env (values, downward-API fields, ConfigMap and Secret keys),
its volumes and its ServiceAccount — and maps onto one host only what a pod's own network
namespace and mount namespace would give it (docs/dev-cluster.md, "Chart workloads"):

- network: each pod gets a loopback address of its own, ``127.N.B.C`` for the pod IP ``10.A.B.C``
  (``N``: the cluster's own /16 of 127.0.0.0/8, so clusters on one host do not collide), which is
  also the pod's ``localhost``. In command, args, env values and ConfigMap files, ``0.0.0.0``,
  ``127.0.0.1`` and ``localhost`` become that address, so two replicas listen on the same ports
  without colliding and nothing listens beyond loopback; ``status.podIP`` reads as it. A
  host-network pod gets ``127.N.255.1``, the cluster's "host";
- files: every volume is a folder under the pod's root (``hostPath`` volumes under the node's
  folder), and each mountPath in command, args, env values and ConfigMap files is rewritten to it;
- credentials: the ServiceAccount token the API server would project (a TokenRequest bound to the
  pod) is written with the CA as the folder of ``/var/run/secrets/kubernetes.io/serviceaccount``,
  and as a kubeconfig in ``$KUBECONFIG`` (the in-cluster loaders read fixed paths; every
  component falls back to ``$KUBECONFIG``). A ``KubeSchedulerConfiguration`` without a
  ``clientConnection.kubeconfig`` gets that kubeconfig, kube-scheduler's in-cluster default.
  No token when automounting is off (pod or ServiceAccount): the process gets no credentials;
- entry points: a command's first word names a host program (`Entrypoints`); one this host
  cannot run (the NRI plugin: simulated nodes have no container runtime) is skipped with its reason.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

from neuronetes.devcluster.podfiles import (
    Credentials,
    HostFile,
    PlanError,
    PodObjects,
    PodVolumes,
    automounts_token,
    field_value,
    kubeconfig_text,
    pod_volumes,
    scheduler_config_with,
)
from neuronetes.quantity import QuantityError, parse_quantity

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "ContainerLaunch",
    "Credentials",
    "Entrypoints",
    "HostFile",
    "PlanError",
    "PodPlan",
    "Skipped",
    "automounts_token",
    "expand",
    "plan_pod",
    "pod_address",
    "rewrite",
]

SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
_LOOPBACK_NAMES: Final = re.compile(r"(?<![\w.:-])(0\.0\.0\.0|127\.0\.0\.1|localhost)(?![\w.-])")
_VAR_REF: Final = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(frozen=True, slots=True)
class ContainerLaunch:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Skipped:
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class PodPlan:
    root: Path
    address: str
    dirs: tuple[Path, ...]
    files: tuple[HostFile, ...]
    containers: tuple[ContainerLaunch, ...]
    skipped: tuple[Skipped, ...]


@dataclass(frozen=True, slots=True)
class Entrypoints:
    """Command name (or, for a container without a command, image name) → host argv prefix."""

    programs: Mapping[str, tuple[str, ...]]
    not_run: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_host(cls, kube_scheduler: Path) -> Entrypoints:
        return cls(
            programs={
                "neuronetes": (sys.executable, "-m", "neuronetes.cli"),
                "kube-scheduler": (str(kube_scheduler),),
            },
            not_run={
                "neuronetes-nri": "simulated nodes have no container runtime for the NRI plugin to plug into",
            },
        )


# ---- network -------------------------------------------------------------------------------------


def pod_address(pod: Mapping[str, Any], net: int) -> str:
    """The pod's loopback address in ``127.<net>.0.0/16``: ``10.A.B.C`` → ``127.<net>.B.C``;
    host network (or no pod IP yet): ``127.<net>.255.1``."""
    if not 0 < net < 255:
        raise ValueError(f"loopback network {net}: 1-254")
    ip = str((pod.get("status") or {}).get("podIP") or "")
    parts = ip.split(".")
    if (pod.get("spec") or {}).get("hostNetwork") or len(parts) != 4 or not all(p.isdigit() for p in parts):
        return f"127.{net}.255.1"
    return f"127.{net}.{parts[2]}.{parts[3]}"


def rewrite(text: str, mounts: Sequence[tuple[str, Path]], address: str) -> str:
    """`text` with loopback names → `address` and each mountPath → its host folder (longest first)."""
    out = _LOOPBACK_NAMES.sub(address, text)
    hosts: dict[str, str] = {}
    for mount_path, host in mounts:
        hosts.setdefault(mount_path.rstrip("/") or "/", str(host))
    if not hosts:
        return out
    # One pass: a host folder may itself start with a mount path (a pod root under /tmp).
    alternatives = "|".join(re.escape(m) for m in sorted(hosts, key=len, reverse=True))
    pattern = re.compile(r"(?<![\w./-])(" + alternatives + r")(?=/|$|[^\w.-])")
    return pattern.sub(lambda m: hosts[m.group(1)], out)


# ---- env -----------------------------------------------------------------------------------------


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion (``$$`` is a literal ``$``; unknown names stay as written)."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(one, text)


def _resource_value(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    kind, _, name = str(ref.get("resource", "")).partition(".")
    raw = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if raw is None:
        return "0"
    try:
        value = parse_quantity(str(raw)) / parse_quantity(str(ref.get("divisor") or "1"))
    except (QuantityError, ZeroDivisionError) as exc:
        raise PlanError(f"resourceFieldRef {ref}: {exc}") from None
    return str(-(-value.numerator // value.denominator))  # the kubelet rounds up


def _env_from_source(
    source: Mapping[str, Any],
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    objs: PodObjects,
    address: str,
) -> str | None:
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"], address)
    if "resourceFieldRef" in source:
        return _resource_value(container, source["resourceFieldRef"])
    for key, kind in (("configMapKeyRef", "configMap"), ("secretKeyRef", "secret")):
        if key in source:
            ref = source[key]
            data = objs.data(kind, ref["name"], optional=bool(ref.get("optional")))
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    return None
                raise PlanError(f"{kind} {ref['name']!r} has no key {ref['key']!r}")
            return data[ref["key"]].decode()
    raise PlanError(f"env source {sorted(source)} is not supported")


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], objs: PodObjects, address: str
) -> dict[str, str]:
    """envFrom, then env in order, each value expanded against what came before (as the kubelet)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        kind = "configMap" if "configMapRef" in source else "secret"
        ref = source.get("configMapRef") or source.get("secretRef") or {}
        data = objs.data(kind, ref["name"], optional=bool(ref.get("optional"))) or {}
        env |= {source.get("prefix", "") + k: v.decode() for k, v in data.items()}
    for var in container.get("env") or ():
        if "valueFrom" in var:
            value = _env_from_source(var["valueFrom"], pod, container, objs, address)
            if value is not None:
                env[var["name"]] = value
        else:
            env[var["name"]] = expand(str(var.get("value", "")), env)
    return env


# ---- the plan ------------------------------------------------------------------------------------


def _command(container: Mapping[str, Any], entry: Entrypoints) -> tuple[str, list[str]] | Skipped:
    command = [str(c) for c in container.get("command") or ()]
    args = [str(a) for a in container.get("args") or ()]
    if command:
        program, rest = command[0], command[1:] + args
    else:
        program, rest = str(container.get("image", "")).rsplit("/", 1)[-1].split(":", 1)[0], args
    key = PurePosixPath(program).name
    if key in entry.not_run:
        return Skipped(container["name"], f"{key}: {entry.not_run[key]}")
    if key not in entry.programs:
        return Skipped(container["name"], f"{program}: no host program for this entry point")
    return key, rest


def plan_pod(
    pod: Mapping[str, Any],
    *,
    config_maps: Mapping[str, Mapping[str, Any]],
    secrets: Mapping[str, Mapping[str, Any]],
    credentials: Credentials | None,
    entrypoints: Entrypoints,
    root: Path,
    node_root: Path,
    base_env: Mapping[str, str],
    net: int,
) -> PodPlan:
    """The host processes and files of `pod` (raises `PlanError` for what cannot run); `net`:
    the cluster's loopback /16 (`pod_address`)."""
    address = pod_address(pod, net)
    objs = PodObjects(config_maps, secrets)
    vols = pod_volumes(pod, objs, credentials, root, node_root, address)
    sa_dir = root / "serviceaccount"
    kubeconfig = root / "kubeconfig"
    files: list[HostFile] = []
    pod_mounts: list[tuple[str, Path]] = []
    if credentials is not None:
        namespace = str(pod["metadata"].get("namespace", "default"))
        files += [
            HostFile(sa_dir / "token", credentials.token.encode(), 0o600),
            HostFile(sa_dir / "ca.crt", credentials.ca_pem),
            HostFile(sa_dir / "namespace", namespace.encode()),
            HostFile(kubeconfig, kubeconfig_text(credentials).encode(), 0o600),
        ]
        pod_mounts.append((SERVICE_ACCOUNT_DIR, sa_dir))
    spec = pod.get("spec") or {}
    all_containers = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    for ctr in all_containers:
        pod_mounts += [(m["mountPath"], _mount_host(vols, m)) for m in ctr.get("volumeMounts") or ()]
    for f in vols.files:
        if f.path.parent.name and f.path.is_relative_to(root / "volumes"):
            volume = f.path.relative_to(root / "volumes").parts[0]
            if volume in vols.text_volumes:
                text = rewrite(f.content.decode(errors="replace"), pod_mounts, address)
                if credentials is not None:
                    text = scheduler_config_with(text, kubeconfig)
                f = HostFile(f.path, text.encode(), f.mode)
        files.append(f)
    launches: list[ContainerLaunch] = []
    skipped: list[Skipped] = []
    for ctr in spec.get("containers") or ():
        command = _command(ctr, entrypoints)
        if isinstance(command, Skipped):
            skipped.append(command)
            continue
        program, rest = command
        mounts = [(m["mountPath"], _mount_host(vols, m)) for m in ctr.get("volumeMounts") or ()]
        if credentials is not None:
            mounts.append((SERVICE_ACCOUNT_DIR, sa_dir))
        env = {k: rewrite(v, mounts, address) for k, v in container_env(pod, ctr, objs, address).items()}
        argv = [rewrite(expand(a, env), mounts, address) for a in rest]
        full_env = {**base_env, "HOSTNAME": str(pod["metadata"]["name"]), "HOME": str(root), **env}
        if credentials is not None:
            full_env["KUBECONFIG"] = str(kubeconfig)
        launches.append(ContainerLaunch(ctr["name"], (*entrypoints.programs[program], *argv), full_env))
    for ctr in spec.get("initContainers") or ():
        skipped.append(Skipped(ctr["name"], "init containers are not run"))
    return PodPlan(root, address, tuple(vols.dirs), tuple(files), tuple(launches), tuple(skipped))


def _mount_host(vols: PodVolumes, mount: Mapping[str, Any]) -> Path:
    folder = vols.folders.get(mount["name"])
    if folder is None:
        raise PlanError(f"volumeMount {mount['name']!r} names no volume of the pod")
    sub = mount.get("subPath")
    return folder / sub if sub else folder
