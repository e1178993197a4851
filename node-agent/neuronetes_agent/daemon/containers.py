"""The containers' side of the shim regions: which processes a container has, and when it is gone
(docs/contracts.md "The container records", docs/node-injection.md "Container records").

The agent sees pods only through the API server, which does not say where a container's
processes are. The NRI plugin, which the runtime tells, writes one record per container with
GPUs into ``<state>/containers.d/`` (`read_records`): pod, container, container ID and the OCI
``linux.cgroupsPath``. `cgroup_dir` turns that path into the container's cgroup directory in
either form the runtime uses (systemd ``slice:prefix:name`` or a cgroupfs path) on cgroup v2 or
v1, and `ContainerTender.tend` then, every round, for each region:

- registers the host PIDs of the container's processes (`RegionKeeper.tend` with its
  ``cgroup.procs``; without a record, or with a cgroup that does not resolve, nothing is
  registered: the agent never guesses),
- orders the reclaim of the slots of dead processes once NVML shows their memory released (the
  shim frees them at its next lock),
- reports which pods still have live containers (`TendReport.live`), so the region of a pod
  already gone from the API server is kept until its last container is gone, and where each
  container's cgroup is (`TendReport.cgroups`, for NVML reconciliation: `daemon.backstop`),
- removes the records the plugin could not (it was down at the container's removal): those of
  pods no longer bound here whose cgroup is gone, once older than `RECORD_GRACE_S`.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Final

import msgspec

from neuronetes_agent import region as shim

from .devices import GpuProcess
from .hostpids import driver_holds_in
from .pods import PodUse
from .regions import RegionKeeper

__all__ = [
    "RECORDS_DIR",
    "ContainerRecord",
    "ContainerTender",
    "TendReport",
    "cgroup_dir",
    "read_records",
]

log = logging.getLogger("neuronetes_agent")

RECORDS_DIR: Final = "containers.d"
RECORD_GRACE_S: Final = 60.0  # a record is written before its cgroup exists: give it time
_MAX_RECORD_BYTES: Final = 16 * 1024  # the plugin's bound (node-agent/nri/records)
_RECORD_NAME: Final = re.compile(
    r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)\.json$"
)
# cgroup v1 hierarchies that hold every container's cgroup, in the order they are tried.
_V1_HIERARCHIES: Final = ("pids", "memory", "cpu,cpuacct", "systemd")


class ContainerRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """One record as the plugin writes it (the JSON names are the contract's)."""

    version: int
    pod_uid: str = msgspec.field(name="podUID")
    namespace: str
    pod: str
    container: str
    container_id: str = msgspec.field(name="containerID")
    cgroups_path: str
    region_dir: str
    written_at: datetime


def read_records(directory: Path) -> tuple[list[ContainerRecord], list[str]]:
    """The valid records in `directory` and one message per file that is not one (a record whose
    name and content disagree, of an unknown version, too big, not a regular file)."""
    records: list[ContainerRecord] = []
    errors: list[str] = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return records, errors
    except OSError as exc:
        return records, [f"container records {directory}: {exc}"]
    for name in names:
        match = _RECORD_NAME.match(name)
        if match is None:
            continue  # the plugin's temporary files, anything else
        path = directory / name
        try:
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_RECORD_BYTES:
                raise ValueError(f"not a regular file of at most {_MAX_RECORD_BYTES} bytes")
            record = msgspec.json.decode(path.read_bytes(), type=ContainerRecord)
            if record.version != 1:
                raise ValueError(f"version {record.version} is not supported")
            if (record.pod_uid, record.container) != (match.group(1), match.group(2)):
                raise ValueError("its pod UID and container do not match its name")
            if not record.cgroups_path or not record.container_id:
                raise ValueError("no cgroupsPath or containerID")
        except FileNotFoundError:
            continue  # removed meanwhile
        except (OSError, ValueError, msgspec.ValidationError) as exc:
            errors.append(f"container record {path}: {exc}")
            continue
        records.append(record)
    return records, errors


def _expand_slice(slice_name: str) -> str | None:
    """systemd's slice name to its path: ``a-b-c.slice`` -> ``a.slice/a-b.slice/a-b-c.slice``
    (runc's rule; ``-.slice`` is the root)."""
    if not slice_name.endswith(".slice") or "/" in slice_name:
        return None
    if slice_name == "-.slice":
        return ""
    stem = slice_name[: -len(".slice")]
    parts = stem.split("-")
    if not all(parts):
        return None
    return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def _relative_cgroup(cgroups_path: str) -> str | None:
    """The container's cgroup relative to a hierarchy's root, from the OCI ``cgroupsPath``:
    systemd form ``slice:prefix:name`` (unit ``prefix-name.scope`` in the expanded slice; an
    empty slice is ``system.slice``, as runc does) or a cgroupfs path (``/kubepods/...``)."""
    if ".." in cgroups_path.replace(":", "/").split("/"):
        return None  # never climb out of the hierarchy, even where the root would stop it
    if cgroups_path.startswith("/"):
        rel = posixpath.normpath(cgroups_path).lstrip("/")
    else:
        parts = cgroups_path.split(":")
        if len(parts) != 3 or not parts[2] or "/" in parts[1] + parts[2]:
            return None
        slice_name, prefix, name = parts
        slice_path = _expand_slice(slice_name or "system.slice")
        if slice_path is None or name.endswith(".slice"):
            return None
        unit = f"{prefix}-{name}.scope" if prefix else f"{name}.scope"
        rel = posixpath.join(slice_path, unit)
    return rel or None


def cgroup_dir(cgroups_path: str, root: Path) -> Path | None:
    """The container's cgroup directory under the cgroup mount `root` (``/sys/fs/cgroup``), or None
    when the path is of no known form or the directory does not exist (not yet, or no more). On
    cgroup v2 (``cgroup.controllers`` at the root) the one hierarchy; on v1 the first of the
    hierarchies every container joins that has it."""
    rel = _relative_cgroup(cgroups_path)
    if rel is None:
        return None
    unified = (root / "cgroup.controllers").is_file()
    for hierarchy in [root] if unified else [root / h for h in _V1_HIERARCHIES]:
        candidate = hierarchy / rel
        if (candidate / "cgroup.procs").is_file():
            return candidate
    return None


@dataclass(slots=True)
class TendReport:
    """One round: slots ordered reclaimed, pods with a live container, and what went wrong."""

    freed: int = 0  # slots of dead processes ordered reclaimed (the shim frees each at its next lock)
    registered: int = 0  # containers whose cgroup was read this round
    live: frozenset[str] = frozenset()
    warnings: list[str] = field(default_factory=list)
    # (pod UID, container) -> its cgroup directory, from a record naming the agent's region: where
    # NVML reconciliation (`daemon.backstop`) finds the container's processes
    cgroups: dict[tuple[str, str], Path] = field(default_factory=dict)


class ContainerTender:
    """Registers host PIDs and reclaims dead slots of every region, from the plugin's records."""

    def __init__(
        self,
        state_dir: Path,
        regions: RegionKeeper,
        *,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        proc_root: Path = Path("/proc"),
        clock: Callable[[], float],
    ) -> None:
        self.records_dir = state_dir / RECORDS_DIR
        self.regions = regions
        self.cgroup_root = cgroup_root
        self.proc_root = proc_root
        self.clock = clock  # wall-clock seconds (the records' writtenAt)

    def tend(self, pods: Mapping[str, PodUse], processes: Iterable[GpuProcess]) -> TendReport:
        """One round over the regions of `pods` (the API's view) and of the recorded containers."""
        report = TendReport()
        records, report.warnings = read_records(self.records_dir)
        cgroups: dict[tuple[str, str], Path] = {}
        live: set[str] = set()
        for r in records:
            if _relative_cgroup(r.cgroups_path) is None:
                report.warnings.append(
                    f"container {r.container_id} ({r.namespace}/{r.pod} {r.container}): cgroupsPath "
                    f"{r.cgroups_path!r} is of no known form; host PIDs not registered"
                )
            where = cgroup_dir(r.cgroups_path, self.cgroup_root)
            if where is None:  # not created yet, gone, or of no known form
                if r.pod_uid not in pods and self._older_than_grace(r):
                    self._remove(r)
                continue
            live.add(r.pod_uid)
            if str(self.regions.directory(r.pod_uid, r.container)) == r.region_dir:
                cgroups[(r.pod_uid, r.container)] = where / "cgroup.procs"
                report.cgroups[(r.pod_uid, r.container)] = where
            else:
                report.warnings.append(
                    f"container {r.container_id} ({r.namespace}/{r.pod} {r.container}): its record "
                    f"names region {r.region_dir}, the agent keeps {self.regions.root} (--state-dir "
                    "of the plugin and --region-dir of the agent disagree); host PIDs not registered"
                )
        report.live = frozenset(live)
        wanted = {(uid, name) for uid, use in pods.items() for name in use.assignment.containers}
        driver_holds = driver_holds_in(processes)
        for uid, name in sorted(wanted | {(r.pod_uid, r.container) for r in records}):
            if not self.regions.control_path(uid, name).is_file():
                continue
            procs = cgroups.get((uid, name))
            try:
                report.freed += len(self.regions.tend(uid, name, procs, driver_holds, self.proc_root))
            except (OSError, ValueError, shim.RegionError) as exc:  # this container's region only
                report.warnings.append(f"region of pod {uid} container {name}: {exc}")
                continue
            report.registered += procs is not None
        return report

    def _older_than_grace(self, r: ContainerRecord) -> bool:
        return self.clock() - r.written_at.timestamp() > RECORD_GRACE_S

    def _remove(self, r: ContainerRecord) -> None:
        path = self.records_dir / f"{r.pod_uid}.{r.container}.json"
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("container record %s not removed: %s", path, exc)
            return
        log.info("removed the record of container %s of gone pod %s/%s", r.container_id, r.namespace, r.pod)
