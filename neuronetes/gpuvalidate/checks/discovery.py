"""Check "discovery": the agent's NVML backend against ``nvidia-smi``, the operator's own tool.

The agent's `NvmlGpus.scan` (timed: the goal is < 1 s) is compared GPU by GPU with
``nvidia-smi -q -x`` (UUID, name, framebuffer MiB, MIG mode, PCIe bus id, minor number) and with
``nvidia-smi topo -m`` (the CPU NUMA node a GPU is attached to — its "NUMA Affinity" — and which GPUs
it reaches over NVLink, the ``NV#`` cells). The parsers are pure functions, tested on a recorded H100.
"""

from __future__ import annotations

import re
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Final

from ..context import Context
from ..model import Report

DISCOVERY_GOAL_S: Final = 1.0
_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True, slots=True)
class SmiGpu:
    """One GPU as ``nvidia-smi -q -x`` shows it."""

    uuid: str
    name: str
    memory_mib: int
    mig_enabled: bool
    pci_bus_id: str
    minor: int


def normal_bus_id(bus: str) -> str:
    """A PCI bus id with its domain as 8 hex digits, lower-case ("00000000:00:06.0")."""
    domain, _, rest = bus.strip().lower().partition(":")
    return f"{int(domain, 16):08x}:{rest}" if rest else bus.strip().lower()


def parse_smi_xml(text: str) -> list[SmiGpu]:
    root = ET.fromstring(text)
    gpus: list[SmiGpu] = []
    for gpu in root.findall("gpu"):
        total = (gpu.findtext("fb_memory_usage/total") or "0 MiB").split()[0]
        minor = gpu.findtext("minor_number") or "-1"
        gpus.append(
            SmiGpu(
                uuid=(gpu.findtext("uuid") or "").strip(),
                name=(gpu.findtext("product_name") or "").strip(),
                memory_mib=int(total) if total.isdigit() else -1,
                mig_enabled=(gpu.findtext("mig_mode/current_mig") or "").strip() == "Enabled",
                pci_bus_id=normal_bus_id(gpu.findtext("pci/pci_bus_id") or gpu.get("id") or ""),
                minor=int(minor) if minor.strip().lstrip("-").isdigit() else -1,
            )
        )
    return gpus


def parse_topology(text: str) -> dict[int, dict[str, Any]]:
    """``nvidia-smi topo -m``: for each GPU index, its NUMA affinity (None: N/A) and its NVLink peers."""
    rows = [_ANSI.sub("", line) for line in text.splitlines()]
    header = next((r for r in rows if "CPU Affinity" in r), None)
    if header is None:
        return {}
    columns = [c.strip() for c in header.split("\t") if c.strip()]
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        cells = [c.strip() for c in row.split("\t") if c.strip()]
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        values = dict(zip(columns, cells[1:], strict=False))
        numa_text = values.get("NUMA Affinity", "N/A").split(",")[0].split("-")[0]
        peers = sorted(
            int(col[3:]) for col, v in values.items() if re.fullmatch(r"GPU\d+", col) and v.startswith("NV")
        )
        out[int(cells[0][3:])] = {
            "numa": int(numa_text) if numa_text.isdigit() else None,
            "nvlink_peers": peers,
        }
    return out


def _smi(*args: str) -> str:
    return subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def compare(
    inventory: Any, smi: list[SmiGpu], topo: dict[int, dict[str, Any]]
) -> list[tuple[int, dict[str, Any]]]:
    """Per GPU index: each field as {agent, nvidia_smi, equal}."""
    out: list[tuple[int, dict[str, Any]]] = []
    by_uuid = {g.uuid: g for g in smi}
    for g in inventory.gpus:
        s = by_uuid.get(g.uuid)
        numa = topo.get(g.index, {}).get("numa")
        pairs: dict[str, tuple[Any, Any]] = {
            "uuid": (g.uuid, s.uuid if s else None),
            "name": (g.model, s.name if s else None),
            "memory_mib": (g.memory_mib, s.memory_mib if s else None),
            "mig_enabled": (g.mig_enabled, s.mig_enabled if s else None),
            "pci_bus_id": (normal_bus_id(g.pci_bus_id) if g.pci_bus_id else "", s.pci_bus_id if s else None),
            "minor": (g.minor, s.minor if s else None),
            "numa_node": (g.numa_node, -1 if numa is None else numa),
            "nvlink_peers": (list(g.nvlink_peers), topo.get(g.index, {}).get("nvlink_peers")),
        }
        fields = {k: {"agent": a, "nvidia_smi": b, "equal": a == b} for k, (a, b) in pairs.items()}
        out.append((g.index, fields))
    return out


def run(ctx: Context) -> Report:
    from neuronetes_agent.daemon.nvml import NvmlGpus, load_nvml

    report = Report()
    started = time.perf_counter()
    backend = NvmlGpus(load_nvml())
    try:
        inventory = backend.scan()
    finally:
        seconds = time.perf_counter() - started
        backend.close()
    smi = parse_smi_xml(_smi("-q", "-x"))
    topo = parse_topology(_smi("topo", "-m"))
    report.figures.update(
        discovery_seconds=round(seconds, 4),
        gpus=len(inventory.gpus),
        driver=inventory.driver_version,
        cuda=inventory.cuda_version,
    )
    report.check(
        "discovery.time",
        seconds < DISCOVERY_GOAL_S,
        f"{seconds * 1000:.0f} ms for {len(inventory.gpus)} GPU(s) (goal < {DISCOVERY_GOAL_S:g} s)",
        seconds=seconds,
    )
    report.check(
        "discovery.count",
        len(inventory.gpus) == len(smi),
        f"{len(inventory.gpus)} GPU(s); nvidia-smi lists {len(smi)}",
        agent=len(inventory.gpus),
        nvidia_smi=len(smi),
    )
    for index, fields in compare(inventory, smi, topo):
        wrong = [k for k, v in fields.items() if not v["equal"]]
        report.check(
            f"gpu{index}",
            not wrong,
            "every field equals nvidia-smi's"
            if not wrong
            else "differs from nvidia-smi: " + ", ".join(wrong),
            **{k: v["agent"] if v["equal"] else v for k, v in fields.items()},
        )
    return report
