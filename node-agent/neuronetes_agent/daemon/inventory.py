"""The node inventory file the NRI plugin maps devices through, and the shim it names.

docs/contracts.md ("The node inventory file") is the schema; `node-agent/nri/inventory` is its
strict reader. `InventoryWriter` turns one discovery pass (`devices.Inventory`) into that document
and writes it atomically: at start, whenever the GPUs, MIG instances, shim or driver files change,
and at least every `REWRITE_S` seconds otherwise, with a `generation` that continues from the
file already there. Device numbers come from a `devicenodes.DeviceNodes` source (re-exported here
with its two kinds and `InventoryError`).

`install_shim` copies the shim library and writes its preload file where the inventory says they
are; it refuses a file that is not an ELF shared object, and the agent then writes no inventory
(every container with an assignment is refused by the plugin: fail closed).

docs/gpu-health.md ("Node inventory file and shim") is the prose.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec.yaml

from neuronetes import contracts as c

from .devicenodes import (
    CONTROL_DEVICES,
    DeviceNode,
    DeviceNodes,
    HostDeviceNodes,
    InventoryError,
    SimulatedDeviceNodes,
)
from .devices import Inventory

__all__ = [
    "CDI_SPECS",
    "CONTROL_DEVICES",
    "DEFAULT_SHIM_DIR",
    "DEFAULT_STATE_DIR",
    "INVENTORY_FILE",
    "REWRITE_S",
    "DeviceNode",
    "DeviceNodes",
    "DriverFiles",
    "HostDeviceNodes",
    "InventoryError",
    "InventoryWriter",
    "ShimError",
    "ShimPaths",
    "SimulatedDeviceNodes",
    "atomic_write",
    "driver_files_from_cdi",
    "install_shim",
]

log = logging.getLogger("neuronetes_agent")

INVENTORY_FILE: Final = "inventory.json"
DEFAULT_STATE_DIR: Final = Path(c.NODE_STATE_DIR)
DEFAULT_SHIM_DIR: Final = Path(c.NODE_SHIM_DIR)
SHIM_LIBRARY_NAME: Final = "libneuronetes-cuda.so"
SHIM_PRELOAD_NAME: Final = "ld.so.preload"
REWRITE_S: Final = 10.0  # the contract's bound is 30 s; a third of it survives a slow round or two
CDI_SPECS: Final = (Path("/etc/cdi/nvidia.yaml"), Path("/var/run/cdi/nvidia.yaml"))
DRIVER_CAPABILITIES: Final = "compute,utility"
_MAX_MOUNTS: Final = 1024
_MAX_HOOKS: Final = 16
# Where the plugin refuses a driver mount (docs/contracts.md): the agent drops those entries.
_FORBIDDEN_MOUNT_ROOTS: Final = (
    "/dev",
    "/proc",
    "/sys",
    "/run/neuronetes",
    posixpath.dirname(c.SHIM_LIBRARY_PATH),
    c.SHIM_PRELOAD_FILE,
)
_ENV_ENTRY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_ELF_MAGIC: Final = b"\x7fELF"
_ET_DYN: Final = 3


class ShimError(RuntimeError):
    """The shim library cannot be installed; the agent then advertises no GPU to containers."""


@dataclass(frozen=True, slots=True)
class ShimPaths:
    library: Path
    preload_file: Path


@dataclass(frozen=True, slots=True)
class DriverFiles:
    """The driver's user-space files and hooks GPU containers get (``driver`` of the document)."""

    mounts: tuple[tuple[str, str], ...] = ()  # (hostPath, containerPath)
    hooks: tuple[Mapping[str, Any], ...] = ()  # {"path", "args", "env"}
    capabilities: str = DRIVER_CAPABILITIES

    def doc(self) -> dict[str, Any]:
        return {
            "capabilities": self.capabilities,
            "mounts": [{"hostPath": h, "containerPath": p} for h, p in self.mounts],
            "hooks": [dict(h) for h in self.hooks],
        }


def _clean_abs(p: Any) -> bool:
    return isinstance(p, str) and p.startswith("/") and posixpath.normpath(p) == p and "\x00" not in p


def _strings(items: Any) -> bool:
    """A list the plugin accepts as a hook's args or env: at most 256 strings of at most 4096."""
    return (
        isinstance(items, list)
        and len(items) <= 256
        and all(isinstance(i, str) and len(i) <= 4096 and "\x00" not in i for i in items)
    )


def _forbidden(container_path: str) -> bool:
    inside = container_path + "/"
    return container_path == "/" or any(
        container_path == root or container_path.startswith(root + "/") or root.startswith(inside)
        for root in _FORBIDDEN_MOUNT_ROOTS
    )


def driver_files_from_cdi(specs: tuple[Path, ...] = CDI_SPECS) -> DriverFiles:
    """The common container edits of NVIDIA's CDI spec (``nvidia-ctk cdi generate``): its mounts
    and ``createContainer`` hooks. No spec: no driver files (logged; the node's runtime must then
    provide the driver libraries). Entries the plugin would refuse are dropped with a warning."""
    spec_path = next((p for p in specs if p.is_file()), None)
    if spec_path is None:
        log.warning("no NVIDIA CDI spec at %s: the inventory lists no driver mounts or hooks",
                    " or ".join(map(str, specs)))  # fmt: skip
        return DriverFiles()
    try:
        spec = msgspec.yaml.decode(spec_path.read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise InventoryError(f"CDI spec {spec_path}: {exc}") from None
    edits = (spec or {}).get("containerEdits") if isinstance(spec, dict) else None
    edits = edits if isinstance(edits, dict) else {}
    mounts: dict[str, tuple[str, str]] = {}
    for m in edits.get("mounts") or ():
        host, target = (m.get("hostPath"), m.get("containerPath")) if isinstance(m, dict) else (None, None)
        if not (_clean_abs(host) and _clean_abs(target)) or _forbidden(str(target)) or target in mounts:
            log.warning("CDI spec %s: mount %r dropped (not a path the plugin accepts)", spec_path, m)
            continue
        mounts[str(target)] = (str(host), str(target))
    hooks: list[Mapping[str, Any]] = []
    for h in edits.get("hooks") or ():
        if not isinstance(h, dict) or h.get("hookName") != "createContainer":
            continue
        args, env = h.get("args") or [], h.get("env") or []
        well_formed = _clean_abs(h.get("path")) and _strings(args) and _strings(env)
        if not well_formed or not all(_ENV_ENTRY.match(e) for e in env):
            log.warning("CDI spec %s: hook %r dropped (malformed)", spec_path, h)
            continue
        hooks.append({"path": h["path"], "args": list(args), "env": list(env)})
    if len(mounts) > _MAX_MOUNTS or len(hooks) > _MAX_HOOKS:
        raise InventoryError(f"CDI spec {spec_path}: more than {_MAX_MOUNTS} mounts or {_MAX_HOOKS} hooks")
    log.info("driver files from %s: %d mounts, %d hooks", spec_path, len(mounts), len(hooks))
    return DriverFiles(mounts=tuple(mounts.values()), hooks=tuple(hooks))


# ---- files ---------------------------------------------------------------------------------------


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `path` so a reader sees the old or the new content, never a mix: a temporary file
    ``.<name>.<pid>.tmp`` in the same directory, fsync'd, renamed over it, the directory fsync'd."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # the umask does not decide a contract's mode
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def install_shim(source: Path, install_dir: Path) -> ShimPaths:
    """Copy the shim library into `install_dir` and write the preload file naming its path inside
    containers (`contracts.SHIM_LIBRARY_PATH`). Raises `ShimError` when `source` is missing or not
    an ELF shared object."""
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise ShimError(f"shim library {source}: {exc.strerror}") from None
    e_type = int.from_bytes(data[16:18], "little" if data[5:6] == b"\x01" else "big") if len(data) > 18 else 0
    if data[:4] != _ELF_MAGIC or e_type != _ET_DYN:
        raise ShimError(f"shim library {source} is not an ELF shared object")
    install_dir = Path(os.path.abspath(install_dir))
    paths = ShimPaths(install_dir / SHIM_LIBRARY_NAME, install_dir / SHIM_PRELOAD_NAME)
    try:
        atomic_write(paths.library, data)
        atomic_write(paths.preload_file, f"{c.SHIM_LIBRARY_PATH}\n".encode())
    except OSError as exc:
        raise ShimError(f"cannot install the shim into {install_dir}: {exc}") from None
    return paths


def _previous_generation(path: Path) -> int:
    """The generation of the file already there (0 when none or unreadable)."""
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as exc:
        log.warning("node inventory %s unreadable (%s): generations start again at 1", path, exc)
        return 0
    generation = doc.get("generation") if isinstance(doc, dict) else None
    if isinstance(generation, int) and not isinstance(generation, bool) and generation > 0:
        return generation
    log.warning("node inventory %s has no generation: generations start again at 1", path)
    return 0


class InventoryWriter:
    """Writes one node's inventory file (``<state_dir>/inventory.json``)."""

    def __init__(
        self,
        node: str,
        state_dir: Path,
        shim: ShimPaths,
        devices: DeviceNodes,
        driver: DriverFiles,
        *,
        rewrite_s: float = REWRITE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.path = Path(os.path.abspath(state_dir)) / INVENTORY_FILE
        self.shim = shim
        self.devices = devices
        self.driver = driver
        self.rewrite_s = rewrite_s
        self.clock = clock
        self.generation = _previous_generation(self.path)
        self._content = ""  # the document less generation and updatedAt, as last written
        self._written_at = float("-inf")
        self._last_error = ""

    def body(self, inventory: Inventory) -> dict[str, Any]:
        """Everything but version, node, generation and updatedAt. Raises `InventoryError`."""
        gpus = []
        for g in sorted(inventory.gpus, key=lambda g: g.index):
            instances = [
                {
                    "uuid": m.uuid,
                    "profile": m.profile,
                    "start": m.start,
                    "caps": [d.doc() for d in self.devices.mig_caps(g, m)],
                }
                for m in g.mig_devices
            ]
            device = self.devices.gpu(g).doc()
            gpus.append({"uuid": g.uuid, "index": g.index, "device": device, "migInstances": instances})
        return {
            "controlDevices": [d.doc() for d in self.devices.control()],
            "gpus": gpus,
            "shim": {"library": str(self.shim.library), "preloadFile": str(self.shim.preload_file)},
            "driver": self.driver.doc(),
        }

    def refresh(self, inventory: Inventory) -> bool:
        """Write the file when its content changed or `rewrite_s` passed; True when written.
        Errors are logged (once each) and leave the old file to go stale: the plugin then refuses."""
        try:
            body = self.body(inventory)
            content = json.dumps(body, sort_keys=True)
            if content == self._content and self.clock() - self._written_at < self.rewrite_s:
                return False
            doc = {
                "version": 1,
                "node": self.node,
                "generation": self.generation + 1,
                "updatedAt": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                **body,
            }
            atomic_write(self.path, json.dumps(doc, separators=(",", ":")).encode() + b"\n")
        except (InventoryError, OSError) as exc:
            message = f"node {self.node}: inventory {self.path} not written: {exc}"
            if message != self._last_error:
                log.error("%s", message)
                self._last_error = message
            return False
        self.generation += 1
        self._content, self._written_at, self._last_error = content, self.clock(), ""
        return True
