"""MIG (Multi-Instance GPU) profile catalog and placement rules.

The model follows NVIDIA's (``nvidia-smi mig -lgip`` / ``-lgipp``, NVML
``nvmlDeviceGetGpuInstancePossiblePlacements``): a MIG-capable GPU has
:data:`MEMORY_SLICES` (8) memory slices and :data:`COMPUTE_SLICES` (7) compute slices.
A GPU instance of a profile occupies ``size`` consecutive memory slices starting at one
of the profile's allowed start slots, and may not overlap another instance. Placements
(start slots : size, in memory slices) on A100-40GB, A100-80GB, H100-80GB and H200 (141 GB):

=======================================  ==============  ====
profile (40GB / 80GB / H200)             starts          size
=======================================  ==============  ====
7g.40gb / 7g.80gb / 7g.141gb             0               8
4g.20gb / 4g.40gb / 4g.71gb              0               4
3g.20gb / 3g.40gb / 3g.71gb              0, 4            4
2g.10gb / 2g.20gb / 2g.35gb              0, 2, 4         2
1g.10gb / 1g.20gb / 1g.35gb              0, 2, 4, 6      2
1g.5gb  / 1g.10gb / 1g.18gb              0 .. 6          1
1g.5gb+me / 1g.10gb+me / 1g.18gb+me      0 .. 6          1   (at most one per GPU)
=======================================  ==============  ====

Slot 7 is usable only by instances of size >= 2 that cover it, which is why seven
``1g.5gb`` fill an A100-40GB while ``4g.20gb`` needs slots 0-3 free.

``memory_mib`` is the usable framebuffer NVIDIA reports for the instance (below the
number in the profile name: ``1g.5gb`` is 4864 MiB). Reported sizes move slightly with
the driver; the catalog holds the smallest published value so that a pod that fits the
catalog fits the hardware.

Three modules, re-exported here: `neuronetes.mig_profiles` (a profile, its name, configuration
strings), `neuronetes.mig_layout` (the instances on one GPU and the search for a layout) and this
one, the catalogs of the modelled GPUs and the lookups that need them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from neuronetes.mig_layout import MigLayout, first_layout
from neuronetes.mig_profiles import (
    COMPUTE_SLICES,
    MEMORY_SLICES,
    PROFILE_NAME_RE,
    MigConfigError,
    MigError,
    MigPlacementError,
    MigProfile,
    PlacedInstance,
    UnsupportedGpuError,
    compute_milli,
    format_mig_config,
    normalize_profile_name,
)

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


@dataclass(frozen=True, slots=True, repr=False)
class MigCatalog:
    """The MIG profiles one GPU model offers.

    Attributes:
        gpu_model: canonical model name (``"A100-40GB"``, ``"A100-80GB"``, ``"H100-80GB"``,
            ``"H200"``).
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

    def offers(self, profile: MigProfile) -> bool:
        """Whether ``profile`` is this catalog's own profile of that name (not another model's)."""
        return self._by_name.get(profile.name) == profile

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
        found = first_layout(self.empty_layout(), wanted)
        if found is None:
            summary = format_mig_config(counts)
            raise MigPlacementError(f"{self.gpu_model}: no MIG layout holds {summary or 'nothing'}")
        return found


# -- catalogs ----------------------------------------------------------------------

_STARTS_1 = (0, 1, 2, 3, 4, 5, 6)
_STARTS_2_HALF = (0, 2, 4, 6)  # 1g profiles with two memory slices
_STARTS_2 = (0, 2, 4)
_STARTS_4 = (0, 4)


def _catalog(model: str, mem: Mapping[str, int]) -> MigCatalog:
    """Build an A100/H100/H200 catalog from its seven profile names (in the order of the table in
    this module's docstring: 7g, 4g, 3g, 2g, 1g of two slices, 1g, 1g+me) and their usable MiB."""
    shapes = (  # compute slices, memory slices, most per GPU, start slots
        (7, 8, 1, (0,)),
        (4, 4, 1, (0,)),
        (3, 4, 2, _STARTS_4),
        (2, 2, 3, _STARTS_2),
        (1, 2, 4, _STARTS_2_HALF),
        (1, 1, 7, _STARTS_1),
        (1, 1, 1, _STARTS_1),
    )
    return MigCatalog(
        model,
        tuple(
            MigProfile(name, compute, size, mib, max_n, starts, name.endswith("+me"))
            for (name, mib), (compute, size, max_n, starts) in zip(mem.items(), shapes, strict=True)
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
)
# H200 (141 GB; SXM and NVL): the profile names do not scale from one slice's size as the others do.
_H200: Final = _catalog(
    "H200",
    {
        "7g.141gb": 143360,
        "4g.71gb": 67072,
        "3g.71gb": 67072,
        "2g.35gb": 33280,
        "1g.35gb": 33280,
        "1g.18gb": 16384,
        "1g.18gb+me": 16384,
    },
)

_CATALOGS: Final[dict[str, MigCatalog]] = {
    c.gpu_model: c for c in (_A100_40GB, _A100_80GB, _H100_80GB, _H200)
}


def catalogs() -> tuple[MigCatalog, ...]:
    """Every modelled catalog."""
    return tuple(_CATALOGS.values())


def _canonical_model(gpu_model: str) -> str:
    """Map an NVML / label / trace spelling of a GPU model onto a catalog key.

    Raises:
        UnsupportedGpuError: not an A100 40/80 GB, H100 80 GB or H200 141 GB.
    """
    text = gpu_model.upper().replace("_", "-")
    family_match = re.search(r"(?<![A-Z0-9])(A100|H100|H200)(?![0-9])", text)
    if family_match is None:
        raise UnsupportedGpuError(
            f"no MIG catalog for GPU model {gpu_model!r}: "
            "supported are A100-40GB, A100-80GB, H100-80GB and H200"
        )
    family = family_match.group(1)
    sizes = {int(m) for m in re.findall(r"(?<![0-9])([0-9]+)\s*GI?B?(?![A-Z])", text)}
    if family == "H200":
        if sizes - {141}:
            raise UnsupportedGpuError(
                f"no MIG catalog for GPU model {gpu_model!r}: only the 141 GB H200 is modelled"
            )
        return "H200"  # SXM and NVL alike: 141 GB, the same seven profiles
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
    ``"NVIDIA H100 PCIe"``, ``"NVIDIA H200"``, ``"NVIDIA H200 NVL"``.

    Raises:
        UnsupportedGpuError: (a ``KeyError`` and a ``ValueError``) the model is not
            MIG-capable or not modelled (e.g. ``"V100"``, ``"H100 NVL"``, ``"GH200"``), or an A100
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


def is_valid_profile_name(name: str, gpu_model: str | None = None) -> bool:
    """Whether ``name`` is a MIG profile name (``<N>g.<M>gb`` with optional ``+me``).

    Exact canonical spelling only (see :func:`normalize_profile_name` for others). With
    ``gpu_model``, also whether that model offers the profile (``False`` for a model
    without a catalog).
    """
    if PROFILE_NAME_RE.fullmatch(name) is None:
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
