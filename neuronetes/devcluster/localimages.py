"""OCI image archives made on this machine, for real nodes that cannot pull from a registry.

A real node's containerd imports them (``ctr -n k8s.io images import``): the sandbox ("pause")
image every pod needs and a small test image. Both are one layer holding Debian's static busybox
(package ``busybox-static``, ``/bin/busybox``) and a symlink per applet; the pause image's entry
point sleeps forever (a pod sandbox only has to hold its namespaces open). The archives are
byte-for-byte reproducible (fixed times, owners and order), so the image IDs only change with
busybox.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["BUSYBOX", "LocalImage", "busybox_image", "pause_image", "write_oci_archive"]

BUSYBOX: Final = Path("/bin/busybox")
"""Debian's static busybox (``busybox-static``): one file runs in an otherwise empty rootfs."""

IMAGE_PREFIX: Final = "neuronetes.local"
"""The images' registry part: a name no registry answers for, so nothing ever tries to pull it."""


@dataclass(frozen=True, slots=True)
class LocalImage:
    """An image to build: its reference, a rootfs of busybox applets, its entry point."""

    ref: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]


def pause_image(tag: str) -> LocalImage:
    # busybox sleep as the sandbox's process: PID 1 of the pod ignores SIGTERM, and containerd
    # stops a sandbox with SIGKILL anyway.
    return LocalImage(f"{IMAGE_PREFIX}/pause:{tag}", ("/bin/sleep", "2147483647"), ())


def busybox_image(tag: str) -> LocalImage:
    return LocalImage(f"{IMAGE_PREFIX}/busybox:{tag}", (), ("/bin/sh",))


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout
    return sorted({a for a in out.split() if a and "/" not in a and a != "busybox"})


def _tar_entry(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes | None = None) -> None:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _rootfs_layer(busybox: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("bin", "dev", "etc", "proc", "sys", "tmp"):
            d = tarfile.TarInfo(folder)
            d.type, d.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            _tar_entry(tar, d)
        exe = tarfile.TarInfo("bin/busybox")
        data = busybox.read_bytes()
        exe.size, exe.mode = len(data), 0o755
        _tar_entry(tar, exe, data)
        for applet in _applets(busybox):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            _tar_entry(tar, link)
        for name, text in (("etc/passwd", "root:x:0:0:root:/:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            f = tarfile.TarInfo(name)
            body = text.encode()
            f.size, f.mode = len(body), 0o644
            _tar_entry(tar, f, body)
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _canonical(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def write_oci_archive(images: Sequence[LocalImage], out: Path, *, busybox: Path = BUSYBOX) -> Path:
    """Write an OCI image layout archive (tar) holding `images`, each named by its ref."""
    layer = _rootfs_layer(busybox)
    blobs: dict[str, bytes] = {}
    layer_desc = _blob(blobs, layer, "application/vnd.oci.image.layer.v1.tar")
    manifests: list[dict[str, object]] = []
    for image in images:
        config: dict[str, object] = {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/bin"],
                "WorkingDir": "/",
                **({"Entrypoint": list(image.entrypoint)} if image.entrypoint else {}),
                **({"Cmd": list(image.cmd)} if image.cmd else {}),
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": _blob(blobs, _canonical(config), "application/vnd.oci.image.config.v1+json"),
            "layers": [layer_desc],
        }
        desc = _blob(blobs, _canonical(manifest), "application/vnd.oci.image.manifest.v1+json")
        desc["annotations"] = {
            "org.opencontainers.image.ref.name": image.ref,
            "io.containerd.image.name": image.ref,
        }
        desc["platform"] = {"architecture": "amd64", "os": "linux"}
        manifests.append(desc)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [
            ("oci-layout", _canonical({"imageLayoutVersion": "1.0.0"})),
            ("index.json", _canonical(index)),
            *((f"blobs/sha256/{d.removeprefix('sha256:')}", b) for d, b in sorted(blobs.items())),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            _tar_entry(tar, info, data)
    return out
