"""The engine's view the decisions work on: the `ClusterState`, its `PlacementEngine` and the
settings in force, rebuilt from the store's node specs when the node set changes; and the
small reads every decision makes of it (a request's node rows, a placement's locality)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from neuronetes.engine import PlacementEngine
from neuronetes.inventory import ClusterState, StateInvariantError
from neuronetes.model import Locality, NodeSpec, Placement

from .config import ExtenderSettings
from .results import CacheInvariantError, Hold

__all__ = ["REASON_UNKNOWN_NODE", "NodeLookup", "Snapshot", "check_books", "violated_locality"]

REASON_UNKNOWN_NODE: Final = "node not in the gpu inventory yet"
"""Why a node the request names is refused: the cache has no GPU inventory for it (yet)."""


def _engine(state: ClusterState, settings: ExtenderSettings) -> PlacementEngine:
    return PlacementEngine(state, settings.policy, weights=dict(settings.weights) or None)


@dataclass(slots=True, eq=False)
class Snapshot:
    """Mutable in place (the decisions keep a reference): `rebuild` swaps state and engine."""

    state: ClusterState
    engine: PlacementEngine
    settings: ExtenderSettings
    clock: Callable[[], float]
    rebuilds: int = 0

    @classmethod
    def empty(cls, settings: ExtenderSettings, clock: Callable[[], float]) -> Snapshot:
        state = ClusterState([])
        return cls(state, _engine(state, settings), settings, clock)

    def now(self) -> float:
        return self.clock()

    def use_settings(self, settings: ExtenderSettings, *, rebuild_pending: bool) -> None:
        """New settings; a new policy or weights take a new engine (unless a rebuild makes one)."""
        changed = (settings.policy, settings.weights) != (self.settings.policy, self.settings.weights)
        self.settings = settings
        if changed and not rebuild_pending:
            self.engine = _engine(self.state, settings)

    def rebuild(self, specs: Iterable[NodeSpec]) -> None:
        """An empty state over `specs` (sorted by name); the caller replays what is allocated."""
        self.state = ClusterState(sorted(specs, key=lambda s: s.name))
        self.engine = _engine(self.state, self.settings)
        self.rebuilds += 1


@dataclass(frozen=True, slots=True, eq=False)
class NodeLookup:
    """Rows of a request's node names in one state (kube-scheduler repeats its node list)."""

    state: ClusterState
    names: list[str]
    rows: npt.NDArray[np.int64]  # per name: its row, -1 when unknown
    candidates: npt.NDArray[np.int64]  # known rows, first occurrence order, no duplicates
    unknown: tuple[str, ...]

    @classmethod
    def build(cls, state: ClusterState, names: Sequence[str]) -> NodeLookup:
        # C-level map and dict work, no per-name Python loop: kube-scheduler sends a different
        # list of its nodes each cycle (up to all of them), so this runs once per filter, and a
        # loop over 1,000 names was a quarter of the decision (`bench/e2e_throughput.py
        # --profile-extender`: "filter: decision").
        index = state.index
        try:
            found = list(map(index.__getitem__, names))
        except KeyError:  # a name the cache does not know
            found = [index.get(n, -1) for n in names]
        first = dict.fromkeys(found)  # first occurrences, in order
        unknown: tuple[str, ...] = ()
        if first.pop(-1, 0) is None:
            unknown = tuple(dict.fromkeys(n for n, r in zip(names, found, strict=True) if r < 0))
        rows = np.array(found, dtype=np.int64)
        candidates = (
            rows if len(first) == len(found) else np.fromiter(first, dtype=np.int64, count=len(first))
        )
        return cls(state, list(names), rows, candidates, unknown)

    def matches(self, state: ClusterState, names: Sequence[str]) -> bool:
        return self.state is state and self.names == names

    def reject_all(self, reason: str, unknown_reason: str, keep: int = -1) -> dict[str, str]:
        """Every candidate but row `keep` failed for `reason`; unknown names for `unknown_reason`."""
        nodes = self.state.nodes
        failed = {nodes[i].name: reason for i in self.candidates.tolist() if i != keep}
        failed.update(dict.fromkeys(self.unknown, unknown_reason))
        return failed


def violated_locality(state: ClusterState, placement: Placement) -> str | None:
    """The locality a placement's GPUs do not honour (None: honoured, or none asked)."""
    req = placement.request
    if len(placement.grants) < 2 or req.locality not in (Locality.NVLINK, Locality.SAME_SOCKET):
        return None
    i = placement.node_index
    cols = [g.gpu_index for g in placement.grants]
    if req.locality is Locality.NVLINK:
        groups = {int(state.gpu_nvlink_group[i, j]) for j in cols}
        ok = len(groups) == 1 and min(groups) >= 0
    else:
        ok = len({int(state.gpu_socket[i, j]) for j in cols}) == 1
    return None if ok else req.locality.value


def check_books(
    state: ClusterState, pod_ids: Collection[str], holds: Iterable[Hold], slice_keys: Collection[str] = ()
) -> None:
    """`ClusterState.check_invariants` plus: every allocation belongs to a known pod
    (``pod/<id>``), a Bound GPUSlice (``slice/<ns>/<name>``) or a hold, and every hold on a known
    node holds something.

    Raises:
        CacheInvariantError: the first disagreement found.
    """
    try:
        state.check_invariants()
    except StateInvariantError as exc:
        raise CacheInvariantError(f"cluster state: {exc}") from None
    held = {h.alloc_id: h for h in holds}
    for alloc_id in state.allocations:
        if alloc_id.startswith("pod/"):
            owned = alloc_id[4:] in pod_ids
        elif alloc_id.startswith("slice/"):
            owned = alloc_id[6:] in slice_keys
        else:
            owned = alloc_id in held
        if not owned:
            raise CacheInvariantError(f"leaked allocation {alloc_id}")
    for hold in held.values():
        if hold.node in state.index and hold.alloc_id not in state.allocations:  # else dormant
            raise CacheInvariantError(f"hold {hold.alloc_id} holds nothing")
