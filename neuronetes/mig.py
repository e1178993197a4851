"""MIG (Multi-Instance GPU) profile catalog and placement rules.

The model follows NVIDIA's (``nvidia-smi mig -lgip`` / ``-lgipp``, NVML
``nvmlDeviceGetGpuInstancePossiblePlacements``): a MIG-capable GPU has
:data:`MEMORY_SLICES` (8) memory slices and :data:`COMPUTE_SLICES` (7) compute slices.
A GPU instance of a profile occupies ``size`` consecutive memory slices starting at one
of the profile's allowed start slots, and may not overlap another instance. Placements
(start slots : size, in memory slices) on A100-40GB, A100-80GB and H100-80GB:

=========================  ==============  ====
profile (40GB / 80GB)      starts          size
=========================  ==============  ====
7g.40gb / 7g.80gb          0               8
4g.20gb / 4g.40gb          0               4
3g.20gb / 3g.40gb          0, 4            4
2g.10gb / 2g.20gb          0, 2, 4         2
1g.10gb / 1g.20gb          0, 2, 4, 6      2
1g.5gb  / 1g.10gb          0 .. 6          1
1g.5gb+me / 1g.10gb+me     0 .. 6          1   (at most one per GPU)
=========================  ==============  ====

Slot 7 is usable only by instances of size >= 2 that cover it, which is why seven
``1g.5gb`` fill an A100-40GB while ``4g.20gb`` needs slots 0-3 free.

``memory_mib`` is the usable framebuffer NVIDIA reports for the instance (below the
number in the profile name: ``1g.5gb`` is 4864 MiB). Reported sizes move slightly with
the driver; the catalog holds the smallest published value so that a pod that fits the
catalog fits the hardware.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

__all__ = [
    "COMPUTE_SLICES",
    "MEMORY_SLICES",
    "MigCatalog",
    "MigConfigError",
    "MigError",
    "MigLayout",
    "MigPlacementError",
    "MigProfile",
    "PlacedInstance",
    "UnsupportedGpuError",
    "catalog_for",
    "catalogs",
    "compute_milli",
    "format_mig_config",
    "is_mig_capable",
    "is_valid_profile_name",
    "normalize_profile_name",
    "parse_mig_config",
]

MEMORY_SLICES: Final = 8
"""Memory slices (placement slots) of a MIG-capable A100/H100."""
COMPUTE_SLICES: Final = 7
"""Compute slices (GPCs available to MIG) of a MIG-capable A100/H100."""

_PROFILE_NAME_RE: Final = re.compile(r"(?P<compute>[1-9][0-9]*)g\.(?P<memory>[1-9][0-9]*)gb(?P<me>\+me)?")


class MigError(Exception):
    """Base class of the errors this module raises on purpose."""


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
        if _PROFILE_NAME_RE.fullmatch(self.name) is None:
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


@dataclass(frozen=True, slots=True, repr=False)
class MigCatalog:
    """The MIG profiles one GPU model offers.

    Attributes:
        gpu_model: canonical model name (``"A100-40GB"``, ``"A100-80GB"``, ``"H100-80GB"``).
        profiles: the profiles, largest first.
    """

    gpu_model: str
    profiles: tuple[MigProfile, ...]
    _by_name: Mapping[str, MigProfile] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {p.name: p for p in self.profiles}
        if len(by_name) != len(self.profiles):
            raise ValueError(f"{self.gpu_model}: duplicate MIG profile names")
        object.__setattr__(self, "_by_name", by_name)

    def __repr__(self) -> str:
        return f"MigCatalog({self.gpu_model!r}, profiles={list(self.names)!r})"

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and normalize_profile_name(name) in self._by_name

    def __iter__(self) -> Iterator[MigProfile]:
        return iter(self.profiles)

    def __len__(self) -> int:
        return len(self.profiles)

    @property
    def names(self) -> tuple[str, ...]:
        """Profile names, largest profile first."""
        return tuple(p.name for p in self.profiles)

    def profile(self, name: str) -> MigProfile:
        """The profile called ``name`` (``"1g.5gb"``, ``"MIG 1g.5gb"``, ``"1g.5gb.me"`` ...).

        Raises:
            KeyError: the model has no such profile; the message lists the valid ones.
        """
        key = normalize_profile_name(name)
        try:
            return self._by_name[key]
        except KeyError:
            valid = ", ".join(self.names)
            raise KeyError(f"{self.gpu_model} has no MIG profile {name!r}; valid profiles: {valid}") from None

    def empty_layout(self) -> MigLayout:
        """A GPU of this model with MIG enabled and no instances."""
        return MigLayout(self)

    def layout_from_counts(self, counts: Mapping[str, int]) -> MigLayout:
        """A layout on ONE GPU holding exactly ``counts`` instances per profile name.

        Searches every placement (the space is tiny), so it finds a layout whenever one
        exists, e.g. ``{"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}`` (which first-fit from
        slot 0 would miss: the 3g instance must go to slot 4).

        Raises:
            KeyError: an unknown profile name.
            MigPlacementError: no layout holds these instances.
            ValueError: a negative count.
        """
        wanted: list[MigProfile] = []
        for name, count in counts.items():
            if count < 0:
                raise ValueError(f"negative MIG instance count {count} for {name!r}")
            wanted += [self.profile(name)] * count
        # Biggest first: fewer branches, and the first layout found packs small ones high.
        wanted.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
        found = _search(self.empty_layout(), wanted)
        if found is None:
            summary = format_mig_config(counts)
            raise MigPlacementError(f"{self.gpu_model}: no MIG layout holds {summary or 'nothing'}")
        return found


def _search(layout: MigLayout, remaining: Sequence[MigProfile]) -> MigLayout | None:
    if not remaining:
        return layout
    head, tail = remaining[0], remaining[1:]
    for start in layout.valid_starts(head):
        found = _search(layout.place_at(head, start), tail)
        if found is not None:
            return found
    return None


def _why_not(instances: Sequence[PlacedInstance], profile: MigProfile, start: int) -> str | None:
    """Why ``profile`` cannot be added at ``start`` next to ``instances`` (``None`` when it can)."""
    if start not in profile.starts:
        allowed = ", ".join(map(str, profile.starts))
        return f"{profile.name} cannot start at slot {start} (allowed: {allowed})"
    same = sum(1 for inst in instances if inst.profile.name == profile.name)
    if same >= profile.max_instances:
        return f"{profile.name} allows at most {profile.max_instances} instance(s) per GPU"
    if profile.media_extensions and any(inst.profile.media_extensions for inst in instances):
        return "only one media-extension (+me) instance per GPU"
    free_compute = COMPUTE_SLICES - sum(inst.profile.compute_slices for inst in instances)
    if profile.compute_slices > free_compute:
        return f"{profile.name} needs {profile.compute_slices} compute slices, {free_compute} free"
    used = {s for inst in instances for s in inst.slots}
    overlap = sorted(used.intersection(profile.slots(start)))
    if overlap:
        return f"{profile.name} at slot {start} overlaps occupied memory slice(s) {overlap}"
    return None


@dataclass(frozen=True, slots=True, repr=False)
class MigLayout:
    """The GPU instances on one GPU (immutable: placing or removing returns a new layout).

    Attributes:
        catalog: the GPU model's catalog; every instance's profile comes from it.
        instances: placed instances, ordered by start slot.
    """

    catalog: MigCatalog
    instances: tuple[PlacedInstance, ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.instances, key=lambda i: i.start))
        for i, inst in enumerate(ordered):
            if self.catalog._by_name.get(inst.profile.name) != inst.profile:
                model = self.catalog.gpu_model
                raise MigPlacementError(
                    f"invalid MIG layout: {inst.profile.name} is not a MIG profile of {model}"
                )
            reason = _why_not(ordered[:i], inst.profile, inst.start)
            if reason is not None:
                raise MigPlacementError(f"invalid MIG layout on {self.catalog.gpu_model}: {reason}")
        object.__setattr__(self, "instances", ordered)

    def __repr__(self) -> str:
        placed = ", ".join(f"{inst.profile.name}@{inst.start}" for inst in self.instances)
        return f"MigLayout({self.catalog.gpu_model!r}, [{placed}])"

    def __iter__(self) -> Iterator[PlacedInstance]:
        return iter(self.instances)

    def __len__(self) -> int:
        return len(self.instances)

    # -- occupancy -----------------------------------------------------------------

    @property
    def used_slots(self) -> frozenset[int]:
        """Memory slices occupied by some instance."""
        return frozenset(s for inst in self.instances for s in inst.slots)

    @property
    def free_slots(self) -> tuple[int, ...]:
        """Memory slices no instance occupies, ascending."""
        used = self.used_slots
        return tuple(s for s in range(MEMORY_SLICES) if s not in used)

    @property
    def free_memory_slices(self) -> int:
        """Number of memory slices no instance occupies."""
        return MEMORY_SLICES - len(self.used_slots)

    @property
    def used_compute_slices(self) -> int:
        """Compute slices taken by the placed instances."""
        return sum(inst.profile.compute_slices for inst in self.instances)

    @property
    def free_compute_slices(self) -> int:
        """Compute slices not yet taken."""
        return COMPUTE_SLICES - self.used_compute_slices

    @property
    def memory_mib(self) -> int:
        """Usable framebuffer of all placed instances together, in MiB."""
        return sum(inst.profile.memory_mib for inst in self.instances)

    def counts(self) -> dict[str, int]:
        """Instances per profile name, largest profile first."""
        tally = Counter(inst.profile.name for inst in self.instances)
        return {name: tally[name] for name in self.catalog.names if tally[name]}

    def to_config(self) -> str:
        """The layout's counts as ``"3g.20gb:1,1g.5gb:2"`` (see :func:`format_mig_config`)."""
        return format_mig_config(self.counts())

    # -- placement -----------------------------------------------------------------

    def _resolve(self, profile: MigProfile | str) -> MigProfile:
        if isinstance(profile, str):
            return self.catalog.profile(profile)
        if self.catalog._by_name.get(profile.name) != profile:
            raise MigPlacementError(
                f"profile {profile.name} is not a MIG profile of {self.catalog.gpu_model}"
            )
        return profile

    def _why_not(self, profile: MigProfile, start: int) -> str | None:
        """Why ``profile`` cannot go at ``start`` (``None`` when it can)."""
        return _why_not(self.instances, profile, start)

    def valid_starts(self, profile: MigProfile | str) -> tuple[int, ...]:
        """Every start slot where ``profile`` could be placed now, ascending."""
        prof = self._resolve(profile)
        return tuple(s for s in prof.starts if self._why_not(prof, s) is None)

    def can_place(self, profile: MigProfile | str) -> int | None:
        """The first start slot where ``profile`` fits now, or ``None``.

        A slot fits when it is one of the profile's allowed starts, the memory slices it
        covers are free, the profile's ``max_instances`` is not reached, no other ``+me``
        instance exists (for ``+me`` profiles) and enough compute slices are free.
        """
        starts = self.valid_starts(profile)
        return starts[0] if starts else None

    def place(self, profile: MigProfile | str, start: int | None = None) -> MigLayout:
        """A new layout with ``profile`` added at ``start``, or at its first fitting slot.

        Raises:
            MigPlacementError: it does not fit at ``start`` (or, without one, anywhere).
        """
        prof = self._resolve(profile)
        if start is not None:
            return self.place_at(prof, start)
        first = self.can_place(prof)
        if first is None:
            reasons = "; ".join(dict.fromkeys(r for s in prof.starts if (r := self._why_not(prof, s))))
            raise MigPlacementError(f"cannot place {prof.name} on {self.catalog.gpu_model}: {reasons}")
        return self.place_at(prof, first)

    def place_at(self, profile: MigProfile | str, start: int) -> MigLayout:
        """A new layout with ``profile`` added at ``start`` (e.g. mirroring what NVML reports).

        Raises:
            MigPlacementError: it does not fit there.
        """
        prof = self._resolve(profile)
        reason = self._why_not(prof, start)
        if reason is not None:
            raise MigPlacementError(f"cannot place on {self.catalog.gpu_model}: {reason}")
        return MigLayout(self.catalog, (*self.instances, PlacedInstance(prof, start)))

    def remove(self, start: int) -> MigLayout:
        """A new layout without the instance that starts at slot ``start``.

        Raises:
            MigPlacementError: no instance starts there.
        """
        kept = tuple(inst for inst in self.instances if inst.start != start)
        if len(kept) == len(self.instances):
            raise MigPlacementError(
                f"no MIG instance starts at slot {start} on this {self.catalog.gpu_model}"
            )
        return MigLayout(self.catalog, kept)


# -- catalogs ----------------------------------------------------------------------

_STARTS_1 = (0, 1, 2, 3, 4, 5, 6)
_STARTS_2_HALF = (0, 2, 4, 6)  # 1g profiles with two memory slices
_STARTS_2 = (0, 2, 4)
_STARTS_4 = (0, 4)


def _catalog(model: str, mem: Mapping[str, int], unit: int) -> MigCatalog:
    """Build the A100/H100 catalog; ``unit`` is the memory (GB, in names) of one memory slice."""
    u = unit

    def p(name: str, compute: int, size: int, max_n: int, starts: tuple[int, ...]) -> MigProfile:
        return MigProfile(name, compute, size, mem[name], max_n, starts, name.endswith("+me"))

    return MigCatalog(
        model,
        (
            p(f"7g.{8 * u}gb", 7, 8, 1, (0,)),
            p(f"4g.{4 * u}gb", 4, 4, 1, (0,)),
            p(f"3g.{4 * u}gb", 3, 4, 2, _STARTS_4),
            p(f"2g.{2 * u}gb", 2, 2, 3, _STARTS_2),
            p(f"1g.{2 * u}gb", 1, 2, 4, _STARTS_2_HALF),
            p(f"1g.{u}gb", 1, 1, 7, _STARTS_1),
            p(f"1g.{u}gb+me", 1, 1, 1, _STARTS_1),
        ),
    )


# Usable MiB per instance: the smallest value published by nvidia-smi across drivers.
_A100_40GB: Final = _catalog(
    "A100-40GB",
    {
        "7g.40gb": 40192,
        "4g.20gb": 19968,
        "3g.20gb": 19968,
        "2g.10gb": 9856,
        "1g.10gb": 9856,
        "1g.5gb": 4864,
        "1g.5gb+me": 4864,
    },
    5,
)
_A100_80GB: Final = _catalog(
    "A100-80GB",
    {
        "7g.80gb": 81152,
        "4g.40gb": 40192,
        "3g.40gb": 40192,
        "2g.20gb": 19968,
        "1g.20gb": 19968,
        "1g.10gb": 9728,
        "1g.10gb+me": 9728,
    },
    10,
)
_H100_80GB: Final = _catalog(
    "H100-80GB",
    {
        "7g.80gb": 81152,
        "4g.40gb": 40192,
        "3g.40gb": 40192,
        "2g.20gb": 19968,
        "1g.20gb": 19968,
        "1g.10gb": 9856,
        "1g.10gb+me": 9856,
    },
    10,
)

_CATALOGS: Final[dict[str, MigCatalog]] = {c.gpu_model: c for c in (_A100_40GB, _A100_80GB, _H100_80GB)}


def catalogs() -> tuple[MigCatalog, ...]:
    """Every modelled catalog."""
    return tuple(_CATALOGS.values())


def _canonical_model(gpu_model: str) -> str:
    """Map an NVML / label / trace spelling of a GPU model onto a catalog key.

    Raises:
        UnsupportedGpuError: not an A100 40/80 GB or H100 80 GB.
    """
    text = gpu_model.upper().replace("_", "-")
    family_match = re.search(r"(?<![A-Z0-9])(A100|H100)(?![0-9])", text)
    if family_match is None:
        raise UnsupportedGpuError(
            f"no MIG catalog for GPU model {gpu_model!r}: supported are A100-40GB, A100-80GB and H100-80GB"
        )
    family = family_match.group(1)
    sizes = {int(m) for m in re.findall(r"(?<![0-9])([0-9]+)\s*GI?B?(?![A-Z])", text)}
    if family == "H100":
        if "NVL" in text or sizes - {80}:
            raise UnsupportedGpuError(
                f"no MIG catalog for GPU model {gpu_model!r}: only the 80 GB H100 is modelled"
            )
        return "H100-80GB"  # every H100 without a size in its name (H100 PCIe, SXM5) has 80 GB
    if sizes == {40}:
        return "A100-40GB"
    if sizes == {80}:
        return "A100-80GB"
    raise UnsupportedGpuError(
        f"ambiguous or unsupported A100 model {gpu_model!r}: name the memory size (A100-40GB or A100-80GB)"
    )


def catalog_for(gpu_model: str) -> MigCatalog:
    """The MIG catalog of a GPU model.

    Accepts the usual spellings: ``"A100-SXM4-40GB"``, ``"A100-PCIE-40GB"``,
    ``"A100-80GB"``, ``"NVIDIA A100 80GB PCIe"``, ``"H100-80GB"``, ``"NVIDIA H100 80GB HBM3"``,
    ``"NVIDIA H100 PCIe"``.

    Raises:
        UnsupportedGpuError: (a ``KeyError`` and a ``ValueError``) the model is not
            MIG-capable or not modelled (e.g. ``"V100"``, ``"H100 NVL"``), or an A100
            without its memory size.
    """
    return _CATALOGS[_canonical_model(gpu_model)]


def is_mig_capable(gpu_model: str) -> bool:
    """Whether :func:`catalog_for` knows the model."""
    try:
        _canonical_model(gpu_model)
    except UnsupportedGpuError:
        return False
    return True


# -- names and configuration strings ------------------------------------------------


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
    m = _PROFILE_NAME_RE.fullmatch(normalize_profile_name(name))
    if m is None or int(m["compute"]) > COMPUTE_SLICES:
        raise ValueError(f"invalid MIG profile name {name!r}")
    return int(m["compute"]) * 1000 // COMPUTE_SLICES


def is_valid_profile_name(name: str, gpu_model: str | None = None) -> bool:
    """Whether ``name`` is a MIG profile name (``<N>g.<M>gb`` with optional ``+me``).

    Exact canonical spelling only (see :func:`normalize_profile_name` for others). With
    ``gpu_model``, also whether that model offers the profile (``False`` for a model
    without a catalog).
    """
    if _PROFILE_NAME_RE.fullmatch(name) is None:
        return False
    if gpu_model is None:
        return True
    try:
        catalog = catalog_for(gpu_model)
    except UnsupportedGpuError:
        return False
    return name in catalog._by_name


_CONFIG_ITEM_RE: Final = re.compile(r"(?P<name>[^:=\s]+?)\s*(?:[:=]|-(?=[0-9]+$))\s*(?P<count>[0-9]+)")


def parse_mig_config(text: str, catalog: MigCatalog | None = None) -> dict[str, int]:
    """Parse a MIG configuration string into instance counts per profile.

    Two spellings are accepted:

    * human / annotation form, as in the design docs: ``"1g.5gb:7,2g.10gb:3"``
      (``=`` works as well as ``:``);
    * label-safe form, for Kubernetes label values (which allow only alphanumerics,
      ``-``, ``_`` and ``.``): ``"1g.5gb-7_2g.10gb-3"``, with ``+me`` spelled ``.me``.

    Counts of a repeated profile add up. The empty string is no instances. Counts are
    the configuration's totals: on a multi-GPU node they span all its GPUs; use
    :meth:`MigCatalog.layout_from_counts` to check one GPU.

    Args:
        text: the configuration string.
        catalog: when given, every profile must exist in it.

    Raises:
        MigConfigError: malformed string, invalid profile name, or (with ``catalog``)
            a profile the model does not offer.
    """
    result: dict[str, int] = {}
    body = text.strip()
    if not body:
        return result
    for raw in re.split(r"[,_;]", body):
        item = raw.strip()
        if not item:
            raise MigConfigError(f"invalid MIG config {text!r}: empty item")
        match = _CONFIG_ITEM_RE.fullmatch(item)
        if match is None:
            raise MigConfigError(
                f"invalid MIG config item {item!r} in {text!r}: expected PROFILE:COUNT such as 1g.5gb:7"
            )
        name = normalize_profile_name(match["name"])
        if not is_valid_profile_name(name):
            raise MigConfigError(f"invalid MIG profile name {match['name']!r} in {text!r}")
        if catalog is not None and name not in catalog:
            raise MigConfigError(
                f"{catalog.gpu_model} has no MIG profile {name!r} (in {text!r}); "
                f"valid profiles: {', '.join(catalog.names)}"
            )
        result[name] = result.get(name, 0) + int(match["count"])
    return result


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
