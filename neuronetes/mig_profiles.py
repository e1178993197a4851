"""MIG profiles, their names and configuration strings: what one GPU instance is.

The part of the MIG model every other part builds on (`neuronetes.mig` has the catalogs of the
modelled GPUs, `neuronetes.mig_layout` the instances on one GPU; `neuronetes.mig` re-exports
both): the slice counts of a MIG-capable GPU, the errors, `MigProfile`, and the spelling of
profile names and of ``"1g.5gb:7,2g.10gb:3"`` configuration strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

__all__ = [
    "COMPUTE_SLICES",
    "MEMORY_SLICES",
    "PROFILE_NAME_RE",
    "MigConfigError",
    "MigError",
    "MigPlacementError",
    "MigProfile",
    "PlacedInstance",
    "UnsupportedGpuError",
    "compute_milli",
    "format_mig_config",
    "normalize_profile_name",
]

MEMORY_SLICES: Final = 8
"""Memory slices (placement slots) of a MIG-capable A100/H100."""
COMPUTE_SLICES: Final = 7
"""Compute slices (GPCs available to MIG) of a MIG-capable A100/H100."""

PROFILE_NAME_RE: Final = re.compile(r"(?P<compute>[1-9][0-9]*)g\.(?P<memory>[1-9][0-9]*)gb(?P<me>\+me)?")


class MigError(Exception):
    """Base class of the errors the MIG modules raise on purpose."""


class MigPlacementError(MigError, ValueError):
    """A profile cannot be placed (or removed) on a GPU's current layout."""


class MigConfigError(MigError, ValueError):
    """A MIG configuration string (``"1g.5gb:7,2g.10gb:3"``) is malformed."""


class UnsupportedGpuError(MigError, KeyError, ValueError):
    """The GPU model has no MIG catalog (not MIG-capable, or not modelled yet).

    A ``KeyError`` (a failed lookup) and a ``ValueError`` (a bad argument) at once, so
    callers may catch either.
    """

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model.

    Attributes:
        name: NVIDIA's profile name, e.g. ``"1g.5gb"`` or ``"1g.5gb+me"``.
        compute_slices: compute slices (the ``Ng`` of the name).
        memory_slices: memory slices occupied, i.e. the placement size.
        memory_mib: usable framebuffer of one instance in MiB.
        max_instances: most instances of this profile one GPU can hold.
        starts: allowed start slots (index of the first memory slice), ascending.
        media_extensions: the ``+me`` variant that owns the GPU's shared media engines
            (JPEG/OFA); at most one such instance per GPU.
    """

    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_instances: int
    starts: tuple[int, ...]
    media_extensions: bool = False

    def __post_init__(self) -> None:
        if PROFILE_NAME_RE.fullmatch(self.name) is None:
            raise ValueError(f"invalid MIG profile name {self.name!r}")
        if not 1 <= self.compute_slices <= COMPUTE_SLICES:
            raise ValueError(f"{self.name}: compute_slices {self.compute_slices} not in 1..{COMPUTE_SLICES}")
        if not self.starts or list(self.starts) != sorted(set(self.starts)):
            raise ValueError(f"{self.name}: starts must be non-empty, ascending and unique")
        if self.starts[0] < 0 or self.starts[-1] + self.memory_slices > MEMORY_SLICES:
            raise ValueError(f"{self.name}: placements exceed the GPU's {MEMORY_SLICES} memory slices")
        if self.media_extensions != self.name.endswith("+me"):
            raise ValueError(f"{self.name}: media_extensions must match the '+me' suffix")

    @property
    def resource_name(self) -> str:
        """The name as Kubernetes resource names and label values can spell it (``+me`` -> ``.me``)."""
        return self.name.replace("+", ".")

    def slots(self, start: int) -> range:
        """Memory slices an instance placed at ``start`` occupies."""
        return range(start, start + self.memory_slices)


class PlacedInstance(NamedTuple):
    """A GPU instance on a GPU: its profile and start slot."""

    profile: MigProfile
    start: int

    @property
    def slots(self) -> range:
        """Memory slices the instance occupies."""
        return self.profile.slots(self.start)


def normalize_profile_name(name: str) -> str:
    """Canonical spelling of a profile name.

    Strips a leading ``"MIG "`` (as ``nvidia-smi`` prints), an ``nvidia.com/mig-`` or
    ``neuronetes.io/mig-`` resource prefix, lower-cases, and turns the resource-safe
    ``.me`` suffix back into ``+me``. Does not check that the result is valid.
    """
    text = name.strip()
    lowered = text.lower()
    for prefix in ("mig ", "nvidia.com/mig-", "neuronetes.io/mig-"):
        if lowered.startswith(prefix):
            text = text[len(prefix) :]
            lowered = lowered[len(prefix) :]
            break
    text = lowered.strip()
    if text.endswith(".me"):
        text = text[: -len(".me")] + "+me"
    return text


def compute_milli(name: str) -> int:
    """A profile's share of its GPU's compute in milli-GPU (``3g.20gb`` → 428): the fraction
    usage views and the simulator's trace count a MIG instance as. ValueError for a bad name."""
    m = PROFILE_NAME_RE.fullmatch(normalize_profile_name(name))
    if m is None or int(m["compute"]) > COMPUTE_SLICES:
        raise ValueError(f"invalid MIG profile name {name!r}")
    return int(m["compute"]) * 1000 // COMPUTE_SLICES


def format_mig_config(
    counts: Mapping[str, int] | Iterable[tuple[str, int]], *, label_safe: bool = False
) -> str:
    """Spell instance counts as a configuration string (inverse of :func:`parse_mig_config`).

    ``label_safe=False`` gives ``"1g.5gb:7,2g.10gb:3"``; ``label_safe=True`` gives a valid
    Kubernetes label value, ``"1g.5gb-7_2g.10gb-3"``. Zero counts are left out; order is kept.
    """
    items = counts.items() if isinstance(counts, Mapping) else counts
    parts: list[str] = []
    for name, count in items:
        if count < 0:
            raise ValueError(f"negative MIG instance count {count} for {name!r}")
        if count == 0:
            continue
        canonical = normalize_profile_name(name)
        if label_safe:
            parts.append(f"{canonical.replace('+', '.')}-{count}")
        else:
            parts.append(f"{canonical}:{count}")
    return ("_" if label_safe else ",").join(parts)
