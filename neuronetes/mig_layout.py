"""The GPU instances on one GPU: `MigLayout`, where a profile may go and why not, and the search.

`neuronetes.mig` re-exports `MigLayout` and `PlacedInstance`; a catalog's `empty_layout` and
`layout_from_counts` are where layouts start. The rules (NVIDIA's placements, in
`neuronetes.mig`'s table): an instance starts at one of its profile's start slots, overlaps no
other instance's memory slices, stays within the profile's instance count and the GPU's compute
slices, and at most one ``+me`` instance holds the media engines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuronetes.mig_profiles import (
    COMPUTE_SLICES,
    MEMORY_SLICES,
    MigPlacementError,
    MigProfile,
    PlacedInstance,
    format_mig_config,
)

if TYPE_CHECKING:
    # Only a type here: the catalog module imports this one (a catalog's layouts start here).
    from neuronetes.mig import MigCatalog

__all__ = ["MigLayout", "first_layout", "why_not"]


def why_not(instances: Sequence[PlacedInstance], profile: MigProfile, start: int) -> str | None:
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
            if not self.catalog.offers(inst.profile):
                model = self.catalog.gpu_model
                raise MigPlacementError(
                    f"invalid MIG layout: {inst.profile.name} is not a MIG profile of {model}"
                )
            reason = why_not(ordered[:i], inst.profile, inst.start)
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
        if not self.catalog.offers(profile):
            raise MigPlacementError(
                f"profile {profile.name} is not a MIG profile of {self.catalog.gpu_model}"
            )
        return profile

    def _why_not(self, profile: MigProfile, start: int) -> str | None:
        """Why ``profile`` cannot go at ``start`` (``None`` when it can)."""
        return why_not(self.instances, profile, start)

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


def first_layout(layout: MigLayout, remaining: Sequence[MigProfile]) -> MigLayout | None:
    """The first layout (depth first, in `remaining`'s order) that adds every profile to `layout`."""
    if not remaining:
        return layout
    head, tail = remaining[0], remaining[1:]
    for start in layout.valid_starts(head):
        found = first_layout(layout.place_at(head, start), tail)
        if found is not None:
            return found
    return None
