"""What a pod's volumes and credentials become on the host: files under the pod's folder.

The half of `neuronetes.devcluster.podplan` that reads the pod's sources — its ConfigMaps and
Secrets (`PodObjects`), downward-API fields (`field_value`), its ServiceAccount token
(`Credentials`) — and turns its volumes into folders and files (`pod_volumes`), as a kubelet
would mount them; the mapping is described there.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

import msgspec

__all__ = [
    "Credentials",
    "HostFile",
    "PlanError",
    "PodObjects",
    "PodVolumes",
    "automounts_token",
    "field_value",
    "kubeconfig_text",
    "pod_volumes",
    "scheduler_config_with",
]


class PlanError(ValueError):
    """A pod the runner cannot run as it is written (a missing ConfigMap, an unknown volume type)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """A ServiceAccount token and what verifies the API server."""

    server: str
    ca_pem: bytes
    token: str


@dataclass(frozen=True, slots=True)
class HostFile:
    path: Path
    content: bytes
    mode: int = 0o644


_FIELD: Final = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: Mapping[str, Any], path: str, address: str) -> str:
    """A downward-API ``fieldRef`` (``status.podIP`` is the pod's loopback address)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": address,
        "status.podIPs": address,
        "status.hostIP": address.rsplit(".", 2)[0] + ".255.1",
        "status.hostIPs": address.rsplit(".", 2)[0] + ".255.1",
    }
    if path in simple:
        return str(simple[path] or "")
    m = _FIELD.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise PlanError(f"fieldRef {path!r} is not supported")


class PodObjects:
    """The ConfigMaps and Secrets of the pod's namespace (Secret data decoded)."""

    def __init__(
        self, config_maps: Mapping[str, Mapping[str, Any]], secrets: Mapping[str, Mapping[str, Any]]
    ):
        self.config_maps = config_maps
        self.secrets = secrets

    def data(self, kind: str, name: str, *, optional: bool) -> dict[str, bytes] | None:
        if kind == "configMap":
            obj = self.config_maps.get(name)
            if obj is not None:
                out = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
                out |= {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
                return out
        else:
            obj = self.secrets.get(name)
            if obj is not None:
                return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        if optional:
            return None
        raise PlanError(f"{kind} {name!r} not found")


def _key_files(data: Mapping[str, bytes], source: Mapping[str, Any], folder: Path) -> list[HostFile]:
    mode = int(source.get("defaultMode", 0o644))
    items = source.get("items")
    if items is None:
        return [HostFile(folder / key, value, mode) for key, value in sorted(data.items())]
    out = []
    for item in items:
        if item["key"] in data:
            out.append(HostFile(folder / item["path"], data[item["key"]], int(item.get("mode", mode))))
        elif not source.get("optional"):
            raise PlanError(f"key {item['key']!r} not found")
    return out


def _projected(
    source: Mapping[str, Any],
    pod: Mapping[str, Any],
    objs: PodObjects,
    creds: Credentials | None,
    folder: Path,
    address: str,
) -> list[HostFile]:
    out: list[HostFile] = []
    for part in source.get("sources") or ():
        if "configMap" in part or "secret" in part:
            kind = "configMap" if "configMap" in part else "secret"
            ref = part[kind]
            data = objs.data(kind, ref["name"], optional=bool(ref.get("optional")))
            if data is not None:
                out += _key_files(data, ref, folder)
        elif "serviceAccountToken" in part:
            if creds is not None:
                out.append(
                    HostFile(folder / part["serviceAccountToken"]["path"], creds.token.encode(), 0o600)
                )
        elif "downwardAPI" in part:
            for item in part["downwardAPI"].get("items") or ():
                value = field_value(pod, item["fieldRef"]["fieldPath"], address)
                out.append(HostFile(folder / item["path"], value.encode()))
        else:
            raise PlanError(f"projected source {sorted(part)} is not supported")
    return out


@dataclass
class PodVolumes:
    folders: dict[str, Path] = field(default_factory=dict)
    dirs: list[Path] = field(default_factory=list)
    files: list[HostFile] = field(default_factory=list)
    text_volumes: set[str] = field(default_factory=set)
    """Volumes whose files are configuration text (ConfigMaps): they get the mapping rewrite."""


def pod_volumes(
    pod: Mapping[str, Any],
    objs: PodObjects,
    creds: Credentials | None,
    root: Path,
    node_root: Path,
    address: str,
) -> PodVolumes:
    vols = PodVolumes()
    for vol in (pod.get("spec") or {}).get("volumes") or ():
        name = vol["name"]
        folder = root / "volumes" / name
        vols.folders[name] = folder
        if "configMap" in vol or "secret" in vol:
            kind = "configMap" if "configMap" in vol else "secret"
            src = vol[kind]
            data = objs.data(
                kind, src.get("name") or src.get("secretName", ""), optional=bool(src.get("optional"))
            )
            vols.files += _key_files(data or {}, src, folder)
            if kind == "configMap":
                vols.text_volumes.add(name)
        elif "emptyDir" in vol:
            vols.dirs.append(folder)
        elif "hostPath" in vol:
            host = node_root / PurePosixPath(vol["hostPath"]["path"]).relative_to("/")
            vols.folders[name] = host
            kind = vol["hostPath"].get("type", "")
            vols.dirs.append(
                host.parent if kind in ("File", "FileOrCreate", "Socket", "CharDevice") else host
            )
        elif "projected" in vol:
            vols.files += _projected(vol["projected"], pod, objs, creds, folder, address)
        elif "downwardAPI" in vol:
            vols.files += _projected({"sources": [vol]}, pod, objs, creds, folder, address)
        else:
            raise PlanError(f"volume {name!r}: type {sorted(set(vol) - {'name'})} is not supported")
    return vols


def automounts_token(pod: Mapping[str, Any], service_account: Mapping[str, Any] | None) -> bool:
    """The pod's ``automountServiceAccountToken``, else its ServiceAccount's, else true."""
    own = (pod.get("spec") or {}).get("automountServiceAccountToken")
    if own is not None:
        return bool(own)
    sa = (service_account or {}).get("automountServiceAccountToken")
    return True if sa is None else bool(sa)


def kubeconfig_text(creds: Credentials) -> str:
    ca = base64.b64encode(creds.ca_pem).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "cluster", "cluster": {"server": creds.server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": "pod", "user": {"token": creds.token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": "pod"}}],
        "current-context": "pod",
    }
    return json.dumps(doc, indent=2) + "\n"


def scheduler_config_with(text: str, kubeconfig: Path) -> str:
    """A KubeSchedulerConfiguration without a client kubeconfig gets the pod's (its in-cluster default)."""
    try:
        doc = msgspec.yaml.decode(text)
    except msgspec.DecodeError:
        return text
    if not isinstance(doc, dict) or doc.get("kind") != "KubeSchedulerConfiguration":
        return text
    conn = doc.setdefault("clientConnection", {})
    if conn.get("kubeconfig"):
        return text
    conn["kubeconfig"] = str(kubeconfig)
    return msgspec.yaml.encode(doc).decode()
