"""The placement engine: filters, scorers and GPU selection over a `ClusterState`.

One engine serves the extender and the simulator. Decisions are incremental: scores are cached
per request shape and only rows whose node generation changed are recomputed, so a decision
costs time proportional to what changed, not to the cluster's size.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from neuronetes.engine import select
from neuronetes.engine.evaluation import FEASIBLE, MAX_SCORE, Evaluation, scale_scores
from neuronetes.engine.explain import Separation, separate
from neuronetes.engine.filters import FILTERS, mig_slot, share_fit
from neuronetes.engine.policy import Policy, get_policy
from neuronetes.engine.profile import LargeShapes, ProfileArrays, WorkloadProfile
from neuronetes.engine.scorers import SCORERS, ScoreContext, Scorer
from neuronetes.inventory import Allocation, ClusterState
from neuronetes.model import GpuGrant, Placement, PodRequest

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BOOL = npt.NDArray[np.bool_]

__all__ = [
    "FEASIBLE",
    "MAX_SCORE",
    "Evaluation",
    "PlacementEngine",
    "Selection",
    "Unschedulable",
    "scale_scores",
]

_CACHE_SHAPES = 64


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """No fit: the typed status of a decision that found nothing (kube-scheduler's
    ``framework.Status`` with code Unschedulable), with the reason a user can act on."""

    reason: str


Selection = tuple[list[GpuGrant], str]
"""GPUs chosen on a node, and why."""


_MODEL_FILTER = next(k for k, f in enumerate(FILTERS) if f.name == "GpuModel")
_MODEL_CACHE = SCORERS["model_cache"]


@dataclass
class _ShapeCache:
    gen: I64  # node generation each row's filters were run at (-1: never)
    reason: npt.NDArray[np.int16]  # index into FILTERS of the first rejecting filter, or FEASIBLE
    score: F64  # [N] or [N, G]; -inf where a GPU cannot take the request
    scored: I64  # node generation each row's cached score was computed at (-1: never)


def _request_weights(
    req: PodRequest, terms: Sequence[tuple[Scorer, float]]
) -> Sequence[tuple[Scorer, float]]:
    """`terms` as this request weighs them: its own `model_cache` weight in place of the policy's
    (added when the policy has none, dropped at 0; `cacheAware.cacheHitWeight`), then each term
    times the request's multiplier of it (`PodRequest.weight_scale`; `dataLocality.localityWeight`).
    Both are part of the request's shape, so cached scores are never shared between requests of
    different weights."""
    weight = req.model_cache_weight
    if weight is not None:
        terms = [(s, w) for s, w in terms if s.name != _MODEL_CACHE.name]
        if weight > 0:
            terms = [*terms, (_MODEL_CACHE, weight)]
    if not req.weight_scale:
        return terms
    return [(s, w * req.weight_multiplier(s.name)) for s, w in terms]


class PlacementEngine:
    def __init__(
        self,
        state: ClusterState,
        policy: Policy | str = "default",
        profile: WorkloadProfile | None = None,
        seed: int = 0,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        self.state = state
        self.rng = np.random.default_rng(seed)
        self._cache: OrderedDict[PodRequest, _ShapeCache] = OrderedDict()
        self._next_start = 0  # where the next limited evaluation starts looking (`_sample`)
        self._use_policy(get_policy(policy) if isinstance(policy, str) else policy, weights or {})
        self.set_profile(profile or WorkloadProfile.empty())

    # ---- configuration -----------------------------------------------------------------------
    def set_profile(self, profile: WorkloadProfile, coverage: float = 0.95) -> None:
        """Replace the workload profile (fragmentation is measured against it); drops cached scores."""
        self.profile = profile
        self._profile: ProfileArrays = profile.arrays(self.state.models, coverage)
        self._large = LargeShapes.build(profile)
        self._cache.clear()

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Override some scorer weights (0 removes a term); drops cached scores."""
        self._use_policy(self.policy, weights)
        self._cache.clear()

    def _use_policy(self, policy: Policy, weights: Mapping[str, float]) -> None:
        self.policy = policy.with_weights(weights) if weights else policy
        terms = [(SCORERS[n], w) for n, w in self.policy.weights.items()]
        self._cached_terms = [(s, w) for s, w in terms if not s.volatile]
        self._volatile_terms = [(s, w) for s, w in terms if s.volatile]

    # ---- evaluation --------------------------------------------------------------------------
    def _context(self, req: PodRequest, rows: I64) -> ScoreContext:
        st = self.state
        if req.exclusive:
            fit = st.fully_free(rows)
        elif req.gpus > 0 and req.mig_profile is None:
            fit = share_fit(st, req, rows)
        else:
            fit = np.zeros((rows.size, st.max_gpus), dtype=bool)
        return ScoreContext(st, req, rows, fit, self._profile, self._large, self.rng)

    def _combine(self, ctx: ScoreContext, terms: Sequence[tuple[Scorer, float]]) -> F64:
        terms = _request_weights(ctx.req, terms)
        return self._total(ctx, [weight * scorer.fn(ctx) for scorer, weight in terms])

    @staticmethod
    def _total(ctx: ScoreContext, weighted: Sequence[F64]) -> F64:
        """The sum of weighted term values (per node, or per node and GPU for a one-GPU share;
        GPUs the pod does not fit score -inf)."""
        total: F64 | None = None
        for s in weighted:
            if total is None:
                total = s
            elif s.ndim == total.ndim:
                total = total + s
            elif s.ndim > total.ndim:
                total = total[:, None] + s
            else:
                total = total + s[:, None]
        if total is None:
            total = np.zeros(ctx.rows.size)
        if ctx.per_gpu:
            if total.ndim == 1:
                total = np.broadcast_to(total[:, None], ctx.gpu_fit.shape)
            total = np.where(ctx.gpu_fit, total, -np.inf)
        return total

    def _refresh(self, req: PodRequest, score_all: bool = True) -> _ShapeCache:
        """Filter reasons and cached scores of `req`'s shape, without its GPU model list.

        No cached scorer reads the model list, and the model filter is a per-model mask that
        `_with_model_filter` applies per evaluation; so pods pinned to different models share
        one cache entry (openb with 20 % pinned: 2,764 → 644 cold evaluations per seed).
        `score_all`: score every changed row that passes the filters (else only the filters are
        brought up to date, and `_score_rows` scores the rows a limited evaluation picks).
        """
        st = self.state
        req = key = replace(req.shape(), gpu_models=())
        cache = self._cache.get(key)
        per_gpu = req.shared and req.gpus == 1
        if cache is None:
            n = st.n_nodes
            shape = (n, st.max_gpus) if per_gpu else (n,)
            cache = _ShapeCache(
                np.full(n, -1, dtype=np.int64),
                np.zeros(n, dtype=np.int16),
                np.zeros(shape),
                np.full(n, -1, dtype=np.int64),
            )
            self._cache[key] = cache
            if len(self._cache) > _CACHE_SHAPES:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        stale = np.nonzero(cache.gen != st.gen)[0]
        if stale.size:
            reason = np.full(stale.size, FEASIBLE, dtype=np.int16)
            alive = np.arange(stale.size)
            for code, flt in enumerate(FILTERS):
                if alive.size == 0:
                    break
                ok = flt.fn(st, req, stale[alive])
                reason[alive[~ok]] = code
                alive = alive[ok]
            cache.reason[stale] = reason
            cache.gen[stale] = st.gen[stale]
            if alive.size and score_all:
                self._score_rows(req, cache, stale[alive])
        return cache

    def _score_rows(self, req: PodRequest, cache: _ShapeCache, rows: I64) -> None:
        """Bring the cached scores of `rows` (feasible for `req`'s shape) up to date."""
        rows = rows[cache.scored[rows] != self.state.gen[rows]]
        if rows.size:
            cache.score[rows] = self._combine(self._context(req, rows), self._cached_terms)
            cache.scored[rows] = self.state.gen[rows]

    def _sample(self, rows: I64, limit: int) -> I64:
        """At most `limit` of the feasible `rows` (ascending), kube-scheduler's way
        (``percentageOfNodesToScore``): the first `limit` in node order from a start that moves
        past the last node taken at each limited decision, wrapping round, so successive decisions
        look at successive parts of the cluster. Deterministic: the same decisions on the same
        state take the same nodes."""
        if limit <= 0 or rows.size <= limit:
            return rows
        first = int(np.searchsorted(rows, self._next_start))
        taken = np.concatenate((rows[first:], rows[:first]))[:limit]
        self._next_start = (int(taken[-1]) + 1) % self.state.n_nodes
        return np.sort(taken)

    def _with_model_filter(self, req: PodRequest, reasons: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """`reasons` with the GpuModel filter applied where it is the first to reject."""
        if req.gpus == 0 or not req.gpu_models:
            return reasons
        ok = FILTERS[_MODEL_FILTER].fn(self.state, req, np.arange(self.state.n_nodes))
        first = ~ok & ((reasons == FEASIBLE) | (reasons > _MODEL_FILTER))
        return np.where(first, np.int16(_MODEL_FILTER), reasons)

    def evaluate(self, req: PodRequest, candidates: Iterable[int] | None = None) -> Evaluation:
        """The feasible nodes among `candidates` (None: all) and their scores for `req`.

        With ``req.max_nodes_to_score`` set (the candidate limit, fastScheduling) at most that many
        feasible nodes are scored and returned (`_sample`); every node's filter reason is still
        given. Only the nodes taken are scored, which is where the time goes on a large cluster.
        """
        limited = req.max_nodes_to_score > 0
        cache = self._refresh(req, score_all=not limited)
        reasons = self._with_model_filter(req, cache.reason)
        feasible = reasons == FEASIBLE
        if candidates is not None:
            mask = np.zeros_like(feasible)
            # An array indexes as it is: np.fromiter would walk it one Python int at a time (the
            # extender passes its request's rows; `bench/e2e_throughput.py --profile-extender`).
            if isinstance(candidates, np.ndarray):
                mask[candidates.astype(np.int64, copy=False)] = True
            else:
                mask[np.fromiter(candidates, dtype=np.int64)] = True
            feasible &= mask
        rows = self._sample(np.nonzero(feasible)[0], req.max_nodes_to_score)
        self._score_rows(req, cache, rows)  # rows a limited evaluation left unscored, if any
        scores = cache.score[rows]
        if self._volatile_terms and rows.size:
            extra = self._combine(self._context(req, rows), self._volatile_terms)
            scores = scores + (extra if extra.ndim == scores.ndim else extra[:, None])
        if scores.ndim == 2:
            return Evaluation(rows, scores.max(axis=1, initial=-np.inf), scores, reasons)
        return Evaluation(rows, scores, None, reasons)

    def reasons(self, req: PodRequest) -> dict[str, str]:
        """Why each infeasible node was rejected (one categorical reason per node)."""
        ev = self.evaluate(req)
        bad = np.nonzero(ev.reasons != FEASIBLE)[0]
        return {self.state.nodes[int(i)].name: FILTERS[int(ev.reasons[i])].reason for i in bad}

    def explain(self, req: PodRequest, node_index: int) -> dict[str, float]:
        """The node's score for `req` broken down by scorer term (term name -> weighted value).

        Computed on demand for one node (an explanation, not the hot path). For a one-GPU share
        the terms are taken at the GPU the total scores best; an infeasible node gives {}.
        """
        rows = np.array([node_index], dtype=np.int64)
        if not self._passes_filters(req, rows)[0]:
            return {}
        names, values = self._weighted_terms(req, rows)
        return dict(zip(names, values[0].tolist(), strict=True))

    def separation(self, req: PodRequest, chosen: int, rivals: Sequence[int]) -> Separation | None:
        """How node `chosen` beat the best of `rivals` (node rows) for `req`: the runner-up's
        row, the margin and the terms that differ (`explain.separate`), as scored now.

        Rivals that no longer pass the filters are left out (no runner-up when none is left);
        None when `chosen` itself does not pass them. The cost is that of `explain` for
        1 + len(rivals) rows, not of an evaluation of the cluster: the caller names the
        runner-up it found among the scores it already had (`Evaluation.best_rows`).
        """
        rows = np.array([chosen, *rivals], dtype=np.int64)
        fits = self._passes_filters(req, rows)
        if not fits[0]:
            return None
        rows = rows[fits]
        names, values = self._weighted_terms(req, rows)
        found = separate(names, values, 0)
        if found.runner_up is None:
            return found
        return replace(found, runner_up=int(rows[found.runner_up]))

    def _passes_filters(self, req: PodRequest, rows: I64) -> BOOL:
        """Whether each of `rows` passes every filter for `req`'s shape (GPU models aside).

        The filters on these rows only, not `_refresh`: the shape's cache row would be scored
        in full only to be stale again at the next change of the node (the bind that follows),
        and the terms are each computed once by `_weighted_terms`. Two of three scoring passes
        per bind fewer (`bench/e2e_throughput.py --profile-extender`: "bind: cache").
        """
        shape = replace(req.shape(), gpu_models=())
        ok = np.ones(rows.size, dtype=bool)
        for flt in FILTERS:
            alive = np.nonzero(ok)[0]
            if alive.size == 0:
                break
            ok[alive] = flt.fn(self.state, shape, rows[alive])
        return ok

    def _weighted_terms(self, req: PodRequest, rows: I64) -> tuple[tuple[str, ...], F64]:
        """The terms' names and their weighted values on `rows` ([rows, terms]); for a one-GPU
        share each row's values are taken at the GPU its total scores best."""
        ctx = self._context(req, rows)
        scorers = (*_request_weights(req, self._cached_terms), *self._volatile_terms)
        values = [np.asarray(weight * scorer.fn(ctx), dtype=np.float64) for scorer, weight in scorers]
        total = self._total(ctx, values)
        column = np.argmax(total, axis=1) if total.ndim == 2 else np.zeros(rows.size, dtype=np.int64)
        out = np.empty((rows.size, len(values)))
        for t, v in enumerate(values):
            out[:, t] = v[np.arange(rows.size), column] if v.ndim == 2 else v.reshape(rows.size)
        return tuple(scorer.name for scorer, _ in scorers), out

    # ---- decisions ---------------------------------------------------------------------------
    def place(self, req: PodRequest, candidates: Iterable[int] | None = None) -> Placement | None:
        """Choose a node and GPUs for `req` (nothing is held until `commit`/`assume`); None: no fit.

        The best-scoring node (ties broken by the policy) gets the pod unless its GPU selection
        cannot honour the request (`Unschedulable`), then the next node by score does.
        """
        return self.place_evaluated(req, self.evaluate(req, candidates))

    def place_evaluated(self, req: PodRequest, ev: Evaluation) -> Placement | None:
        """`place` on `ev`, an evaluation of `req` just made (for a caller that reads more from
        the same scores: a runner-up, the next best nodes)."""
        if ev.rows.size == 0:
            return None
        best = ev.node_scores.max()
        ties = np.nonzero(ev.node_scores >= best - 1e-12)[0]
        k = int(ties[0]) if ties.size == 1 or self.policy.tie_break == "first" else int(self.rng.choice(ties))
        chosen = self._placement(req, ev, k)
        if chosen is not None:
            return chosen
        for j in np.argsort(-ev.node_scores, kind="stable").tolist():  # rare: the next nodes by score
            if j != k and (chosen := self._placement(req, ev, j)) is not None:
                return chosen
        return None

    def _placement(self, req: PodRequest, ev: Evaluation, k: int) -> Placement | None:
        node = int(ev.rows[k])
        gpu_row = ev.gpu_scores[k] if ev.gpu_scores is not None else None
        chosen = self.select_gpus(req, node, gpu_row)
        if isinstance(chosen, Unschedulable):
            return None
        grants, why = chosen
        return Placement(req, self.state.nodes[node].name, node, tuple(grants), float(ev.node_scores[k]), why)

    def select_gpus(
        self,
        req: PodRequest,
        node: int,
        gpu_scores: F64 | None = None,
        allowed_gpus: BOOL | None = None,
    ) -> Selection | Unschedulable:
        """GPUs on `node` for `req`, and why; `Unschedulable` when the node cannot supply them.

        Several GPUs under `nvlink` / `same-socket` locality come from the tightest group that
        holds them all (`select.locality_groups`); the policy's GPU selector chooses inside it.
        `gpu_scores` (one row of `Evaluation.gpu_scores`) decides a one-GPU share, the selector
        breaking exact ties. `allowed_gpus` ([G] mask) limits the choice further (a gang keeps
        its members inside one group); a MIG instance ignores it (MIG has no NVLink peers).
        """
        st = self.state
        if req.gpus == 0:
            return [], "no gpus requested"
        if req.mig_profile is not None:
            slot = mig_slot(st, node, req.mig_profile)
            if slot is None:
                return Unschedulable(f"no MIG slot for {req.mig_profile} on {st.nodes[node].name}")
            j, start = slot
            return [
                GpuGrant(j, 0, 0, req.mig_profile, start)
            ], f"mig {req.mig_profile} on gpu {j} slot {start}"
        rows = np.array([node])
        k = req.gpus
        cand = st.fully_free(rows)[0] if req.exclusive else share_fit(st, req, rows)[0]
        if allowed_gpus is not None:
            cand = cand & allowed_gpus
        if k > 1:
            groups = select.locality_groups(st, node, cand, k, req.locality, req.min_bandwidth_gbps)
            cand = groups[0] if groups else np.zeros_like(cand)
        if int(cand.sum()) < k:
            return Unschedulable(
                f"{st.nodes[node].name} cannot supply {k} gpus for {req.name!r} ({req.locality.value})"
            )
        sel = self.policy.gpu_selector
        if req.exclusive:
            if sel == "topology":
                idx, why = select.select_topology(st, node, cand, k)
            elif sel == "random":
                idx, why = select.select_random(cand, k, self.rng)
            else:
                idx, why = select.select_first(cand, k)
            return [
                GpuGrant(j, int(st.gpu_milli_cap[node, j]), int(st.gpu_mem_cap[node, j])) for j in idx
            ], why
        if gpu_scores is not None and k == 1:
            idx, why = self._best_scored_gpu(node, cand, gpu_scores)
        elif sel == "random":
            idx, why = select.select_random(cand, k, self.rng)
        else:
            idx, why = select.select_bestfit(cand, st.gpu_milli_free[node], k)
        return [GpuGrant(j, req.gpu_milli, req.gpu_memory_mib) for j in idx], why

    def _best_scored_gpu(self, node: int, cand: BOOL, gpu_scores: F64) -> tuple[list[int], str]:
        """The candidate GPU with the best score; the policy's selector breaks ties.

        Node-level scorers give every GPU of a node the same score, so the selector decides:
        "bestfit" / "topology" the tightest fit (lowest index among equals), "first" the lowest
        index (the FGD paper's rule), "random" a random one.
        """
        scores = np.where(cand, gpu_scores, -np.inf)
        ties = cand & (scores >= scores.max() - 1e-12)
        n = int(ties.sum())
        if n == 1:
            return [int(np.argmax(ties))], "gpu with the best score"
        sel = self.policy.gpu_selector
        if sel == "random":
            idx, _ = select.select_random(ties, 1, self.rng)
            return idx, f"random gpu among {n} with the best score"
        if sel == "first":
            idx, _ = select.select_first(ties, 1)
            return idx, f"lowest-index gpu among {n} with the best score"
        idx, _ = select.select_bestfit(ties, self.state.gpu_milli_free[node], 1)
        return idx, f"tightest-fitting gpu among {n} with the best score"

    def commit(self, placement: Placement, alloc_id: str, ttl: float | None = None) -> Allocation:
        """Hold the placement's resources; with a TTL it is an assumption that expires."""
        expires = None if ttl is None else time.monotonic() + ttl
        req = placement.request
        return self.state.allocate(
            alloc_id, placement.node_index, req.cpu_milli, req.memory_mib, placement.grants, expires
        )

    def release(self, alloc_id: str) -> Allocation:
        return self.state.release(alloc_id)

    def prioritize(self, req: PodRequest, node_indices: Sequence[int]) -> list[int]:
        """Extender-style 0–10 scores for the given nodes (0 for infeasible ones; `scale_scores`)."""
        rows = np.fromiter((int(i) for i in node_indices), dtype=np.int64, count=len(node_indices))
        return [int(x) for x in scale_scores(self.evaluate(req), rows).tolist()]
