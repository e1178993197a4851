#!/usr/bin/env python3
"""Read a real GPU's MIG profile catalog through NVML and compare it with `neuronetes.mig`'s.

    python hack/mig-catalog-probe.py [--json FILE]

Read-only: it queries the MIG mode, each GPU instance profile (name, memory, slices, most
instances) and its possible placements (start slot, size). It never enables or disables MIG and
creates or destroys nothing. NVML answers the profile queries only where the driver exposes them
(some need MIG mode on): what it refused is reported as such, not as a mismatch. Exit status 0
when every profile NVML reported matches the catalog (or NVML reported none), 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pynvml

from neuronetes.mig import UnsupportedGpuError, catalog_for


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _placements(handle: Any, profile_id: int, most: int) -> list[tuple[int, int]]:
    """(start, size) of every placement NVML allows the profile (its low-level call fills an array)."""
    buffer = (pynvml.c_nvmlGpuInstancePlacement_t * max(most, 8))()
    count = ctypes.c_uint(len(buffer))
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, buffer, ctypes.byref(count))
    return [(int(buffer[i].start), int(buffer[i].size)) for i in range(count.value)]


def probe(index: int) -> dict[str, Any]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(pynvml.nvmlDeviceGetName(handle))
    found: dict[str, Any] = {"gpu": name, "profiles": [], "refused": {}}
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        found["mig_mode"] = {"current": current, "pending": pending}
    except pynvml.NVMLError as exc:
        found["mig_mode"] = f"refused: {exc}"
    for profile_id in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfoV(handle, profile_id)
        except pynvml.NVMLError as exc:
            found["refused"][str(profile_id)] = str(exc)
            continue
        entry: dict[str, Any] = {
            "profile_id": profile_id,
            "name": _text(getattr(info, "name", "")),
            "memory_mib": int(info.memorySizeMB),
            "slices": int(info.sliceCount),
            "instances": int(info.instanceCount),
        }
        try:
            entry["placements"] = _placements(handle, int(info.id), int(info.instanceCount))
        except pynvml.NVMLError as exc:
            entry["placements"] = f"refused: {exc}"
        found["profiles"].append(entry)
    return found


def compare(found: dict[str, Any]) -> list[str]:
    """Mismatches between what NVML reported and the catalog (names normalised: NVML prints
    ``MIG 1g.18gb``)."""
    try:
        catalog = catalog_for(found["gpu"])
    except UnsupportedGpuError as exc:
        return [f"no catalog: {exc}"]
    problems: list[str] = []
    for entry in found["profiles"]:
        name = entry["name"].removeprefix("MIG ").strip()
        if name not in catalog:
            problems.append(f"{name}: NVML offers it, the catalog does not")
            continue
        profile = catalog.profile(name)
        if entry["memory_mib"] < profile.memory_mib:
            problems.append(f"{name}: NVML {entry['memory_mib']} MiB < catalog {profile.memory_mib} MiB")
        if isinstance(entry["placements"], list):
            starts = tuple(sorted(start for start, _ in entry["placements"]))
            sizes = {size for _, size in entry["placements"]}
            if starts != tuple(profile.starts) or sizes != {profile.memory_slices}:
                problems.append(
                    f"{name}: NVML placements {entry['placements']} vs catalog starts "
                    f"{profile.starts} size {profile.memory_slices}"
                )
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the findings here")
    args = parser.parse_args()
    pynvml.nvmlInit()
    try:
        gpus = [probe(i) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    for gpu in gpus:
        gpu["mismatches"] = compare(gpu)
    text = json.dumps(gpus, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if any(g["mismatches"] for g in gpus) else 0


if __name__ == "__main__":
    sys.exit(main())
