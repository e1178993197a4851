"""Scorers: small named units that rate feasible node rows in [0, 1], registered in one table.

(Exception: `scarcity` is a penalty, at most 1 and unbounded below; see its docstring.)

A scorer returns either one score per row, or — for a request that takes a share of a single
GPU — one score per (row, GPU), so the engine can pick the node and the GPU in one step. Every
scorer depends only on the rows' current state and the request, which lets the engine cache
scores per request shape and recompute only rows that changed (`volatile` scorers excepted).

The paper baselines (`bestfit`, `dotprod`, `packing`, `clustering`, `fgd`, `random`) are
reimplemented from the FGD paper's simulator and keep its integer 0–100 score quantisation,
because the ties it creates (broken at random, as kube-scheduler does) are part of how those
policies behave.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from neuronetes.engine import frag
from neuronetes.engine.filters import group_free_counts
from neuronetes.engine.profile import LargeShapes, ProfileArrays
from neuronetes.inventory import ClusterState
from neuronetes.model import MILLI_PER_GPU, PodRequest
from neuronetes.modelcache import hit_entries

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BOOL = npt.NDArray[np.bool_]

MAX_SPEC_CPU = 128_000.0  # the paper's normalisers for its baselines (milli-CPU, milli-GPU)
MAX_SPEC_GPU = 8_000.0


@dataclass
class ScoreContext:
    state: ClusterState
    req: PodRequest
    rows: I64
    gpu_fit: BOOL  # [R, G] GPUs this request could use (fully free for exclusive requests)
    profile: ProfileArrays
    large: LargeShapes
    rng: np.random.Generator

    @cached_property
    def free_milli(self) -> I64:
        """Free milli-GPU per usable GPU, 0 elsewhere (read-only; computed once for all scorers)."""
        st = self.state
        free = np.where(st.usable_gpus(self.rows), st.gpu_milli_free[self.rows], 0)
        free.setflags(write=False)
        return free

    @property
    def per_gpu(self) -> bool:
        return self.req.shared and self.req.gpus == 1


ScorerFn = Callable[[ScoreContext], F64]


@dataclass(frozen=True, slots=True)
class Scorer:
    name: str
    fn: ScorerFn
    volatile: bool = False
    """Volatile scorers (random) are recomputed on every decision, never cached."""


def _quantise(score: F64) -> F64:
    """The paper's int64 truncation of a 0–100 score, back on a 0–1 scale."""
    return np.trunc(score * 100.0) / 100.0


# ---- paper baselines -------------------------------------------------------------------------
def score_random(ctx: ScoreContext) -> F64:
    return ctx.rng.random(ctx.rows.size)


def score_bestfit(ctx: ScoreContext) -> F64:
    st, req = ctx.state, ctx.req
    cpu_left = (st.cpu_free[ctx.rows] - req.cpu_milli) / MAX_SPEC_CPU
    gpu_left = (ctx.free_milli.sum(axis=1) - req.gpu_milli_total) / MAX_SPEC_GPU
    return _quantise(1.0 - 0.5 * cpu_left - 0.5 * gpu_left)


def score_dotprod(ctx: ScoreContext) -> F64:
    """Tetris-style alignment of the node's free vector with the request (lower dot is better)."""
    st, req = ctx.state, ctx.req
    left = ctx.free_milli
    cpu = st.cpu_free[ctx.rows] / MAX_SPEC_CPU
    pod_cpu, pod_gpu = req.cpu_milli / MAX_SPEC_CPU, req.gpu_milli_total / MAX_SPEC_GPU
    full = left >= MILLI_PER_GPU
    idle = full.sum(axis=1) * float(MILLI_PER_GPU)
    best = np.full(ctx.rows.size, -1.0)
    if req.gpus == 0:
        best = 1.0 - (cpu * pod_cpu + left.sum(axis=1) / MAX_SPEC_GPU * pod_gpu) / 2.0
    else:
        if req.shared:
            partial = ctx.gpu_fit & ~full
            cand = 1.0 - (cpu[:, None] * pod_cpu + left / MAX_SPEC_GPU * pod_gpu) / 2.0
            best = np.where(partial, cand, -1.0).max(axis=1)
        ok_idle = idle >= req.gpu_milli_total
        best = np.maximum(
            best, np.where(ok_idle, 1.0 - (cpu * pod_cpu + idle / MAX_SPEC_GPU * pod_gpu) / 2.0, -1.0)
        )
    return _quantise(np.maximum(best, 0.0))


def score_packing(ctx: ScoreContext) -> F64:
    """Prefer shared GPUs, then free GPUs on used nodes, then idle nodes (GPU packing)."""
    req = ctx.req
    if req.gpus == 0:
        return np.zeros(ctx.rows.size)
    left = ctx.free_milli
    exists = ctx.state.gpu_exists[ctx.rows]
    full = (left >= MILLI_PER_GPU) & exists
    n_full = full.sum(axis=1)
    idle_node = n_full == exists.sum(axis=1)
    # GPUs chosen smallest-free-first among those that fit.
    fit = (left >= req.gpu_milli) & exists
    order = np.argsort(np.where(fit, left, 10**9), axis=1, kind="stable")[:, : req.gpus]
    chosen_left = np.take_along_axis(left, order, axis=1)
    uses_full = (chosen_left >= MILLI_PER_GPU).sum(axis=1)
    shared_ratio = (chosen_left * 100 // MILLI_PER_GPU).sum(axis=1)
    case1 = np.maximum(100 - shared_ratio // 10, 50)
    case2 = np.maximum(50 - uses_full, 33)
    case3 = np.maximum(33 - n_full, n_full)
    score = np.where(idle_node, case3, np.where(uses_full > 0, case2, case1))
    return score.astype(np.float64) / 100.0  # type: ignore[no-any-return]


def _gpu_tag(gpus: int, milli: int) -> int:
    return gpus * 10_000 + milli


def score_clustering(ctx: ScoreContext) -> F64:
    """Pack pods of the same GPU request type together (GPU clustering)."""
    st, req = ctx.state, ctx.req
    if req.gpus == 0:
        return np.zeros(ctx.rows.size)
    tag = _gpu_tag(req.gpus, req.gpu_milli)
    left_total = ctx.free_milli.sum(axis=1)
    base = (MAX_SPEC_GPU - left_total) / MAX_SPEC_GPU * 25.0
    out = np.empty(ctx.rows.size)
    for k, i in enumerate(ctx.rows):
        tags = {
            _gpu_tag(len(a.grants), a.grants[0].milli)
            for a in (st.allocations[x] for x in st.by_node[int(i)])
            if a.grants
        }
        if tag in tags:
            out[k] = 75.0 if len(tags) == 1 else 50.0
        else:
            out[k] = 0.0 if tags else 25.0
    return np.trunc(base + out) / 100.0  # type: ignore[no-any-return]


def _fgd_delta(ctx: ScoreContext, profile: ProfileArrays) -> F64:
    """Increase of fragmentation caused by the placement: [R] or, per GPU, [R, G]."""
    st, req = ctx.state, ctx.req
    left = ctx.free_milli
    cpu = st.cpu_free[ctx.rows]
    model = st.model_id[ctx.rows]
    before = frag.node_fragmentation(left, cpu, model, profile)
    if ctx.per_gpu:
        after = frag.fragmentation_after_share(left, cpu, model, profile, req.gpu_milli, req.cpu_milli)
        return after - before[:, None]
    if req.exclusive:
        after1 = frag.fragmentation_after_whole_gpus(left, cpu, model, profile, req.gpus, req.cpu_milli)
    elif req.gpus == 0:
        after1 = frag.node_fragmentation(left, cpu - req.cpu_milli, model, profile)
    else:  # a share of several GPUs: take the tightest-fitting GPUs, as the engine will
        after_left = left.copy()
        order = np.argsort(np.where(ctx.gpu_fit, left, 10**9), axis=1, kind="stable")[:, : req.gpus]
        np.put_along_axis(after_left, order, np.take_along_axis(left, order, axis=1) - req.gpu_milli, axis=1)
        after1 = frag.node_fragmentation(after_left, cpu - req.cpu_milli, model, profile)
    return after1 - before


def score_fgd(ctx: ScoreContext) -> F64:
    """The paper's FGD: sigmoid of the fragmentation decrease, truncated to 0–100."""
    delta = _fgd_delta(ctx, ctx.profile)
    return _quantise(1.0 / (1.0 + np.exp(delta / 1000.0)))


# ---- NeuroNetes terms ------------------------------------------------------------------------
def _capacity_delta(ctx: ScoreContext) -> F64:
    """Increase of capacity fragmentation caused by the placement: [R] or, per GPU, [R, G]."""
    st, req, p = ctx.state, ctx.req, ctx.profile
    left = ctx.free_milli
    cpu = st.cpu_free[ctx.rows]
    model = st.model_id[ctx.rows]
    before = frag.capacity_fragmentation(left, cpu, model, p)
    if ctx.per_gpu:
        after = frag.capacity_fragmentation_after_share(left, cpu, model, p, req.gpu_milli, req.cpu_milli)
        return after - before[:, None]
    after_left = left.copy()
    if req.gpus:
        order = np.argsort(np.where(ctx.gpu_fit, left, 10**9), axis=1, kind="stable")[:, : req.gpus]
        taken = np.maximum(np.take_along_axis(left, order, axis=1) - req.gpu_milli, 0)
        np.put_along_axis(after_left, order, taken, axis=1)
    return frag.capacity_fragmentation(after_left, cpu - req.cpu_milli, model, p) - before


def score_capacity_frag(ctx: ScoreContext) -> F64:
    """Capacity-aware fragmentation gradient, continuous: finer than FGD's, breaks its ties."""
    return np.clip(0.5 - _capacity_delta(ctx) / (2 * MAX_SPEC_GPU), 0.0, 1.0)


def score_share_waste(ctx: ScoreContext) -> F64:
    """For a one-GPU share: how much the GPU's expected final waste grows (Bellman look-ahead)."""
    if not ctx.per_gpu:
        return np.ones(ctx.rows.size)
    waste = ctx.profile.leftover_waste
    left = np.clip(ctx.free_milli, 0, MILLI_PER_GPU)
    after = np.clip(left - ctx.req.gpu_milli, 0, MILLI_PER_GPU)
    return np.clip(0.5 - (waste[after] - waste[left]) / (2 * MILLI_PER_GPU), 0.0, 1.0)


def _cpu_stranded(gpu_free: F64, cpu_free: F64, ratio: float) -> F64:
    """Free milli-GPU the node's free CPU cannot feed at `ratio` milli-CPU per milli-GPU."""
    return np.maximum(gpu_free - cpu_free / ratio, 0.0)


def score_cpu_strand(ctx: ScoreContext) -> F64:
    """How much GPU capacity the placement leaves without the CPU to use it.

    GPU pods bring CPU with them: `ratio` milli-CPU per milli-GPU on average over the workload
    (`ProfileArrays.cpu_per_gpu_milli`). A node with G free milli-GPU and C free milli-CPU can
    feed at most C / ratio of its free GPU capacity; the rest is stranded (without this term,
    15–28 GPUs' worth of whole GPUs and ≥ 0.2 leftovers end an openb run on nodes without the
    CPU for any pod that fits them, seed 42). Placing a CPU-hungry pod on a node whose CPU is
    already short strands GPUs; placing it where CPU is plentiful does not. FGD sees CPU only
    through whether each typical shape fits, and `capacity_frag` only per shape as if the node
    filled with that one shape. Same scale as
    `capacity_frag`: 0.5 − Δstranded / 16 GPUs; neutral (1) without GPU pods in the profile.
    """
    ratio = ctx.profile.cpu_per_gpu_milli
    if ratio <= 0:
        return np.ones(ctx.rows.size)
    st, req = ctx.state, ctx.req
    gpu = ctx.free_milli.sum(axis=1).astype(np.float64)
    cpu = st.cpu_free[ctx.rows].astype(np.float64)
    before = _cpu_stranded(gpu, cpu, ratio)
    after = _cpu_stranded(gpu - req.gpu_milli_total, cpu - req.cpu_milli, ratio)
    return np.clip(0.5 - (after - before) / (2 * MAX_SPEC_GPU), 0.0, 1.0)


def score_scarcity(ctx: ScoreContext) -> F64:
    """Penalty for taking away a node's ability to host a large shape few nodes can still host.

    Each large shape t the placement would stop this node from hosting costs its frequency ×
    GPUs × (nodes / nodes that can host t now): losing one of 39 hosts of a shape costs 31×
    what losing one of 1,213 does. A large shape pinned to GPU models counts only nodes of its
    models as hosts. The score is 1 − cost: the one scorer that may go below 0, on purpose —
    as a shape's last hosts go, the penalty must be able to outweigh every other term
    (bounding it, by clipping or 1/(1+cost), measured worse on openb). Depends on cluster-wide
    counts, hence volatile.
    """
    large, st, req, rows = ctx.large, ctx.state, ctx.req, ctx.rows
    if large.gpus.size == 0:
        return np.ones(rows.size)
    access = large.access(st.models)  # [model, shape]
    full_all = st.fully_free().sum(axis=1)
    can = access[st.model_id] & (st.cpu_free[:, None] >= large.cpu)  # [N, shape]
    hosts = ((full_all[:, None] >= large.gpus) & can).sum(axis=0)
    cost = large.freq * large.gpus * st.n_nodes / np.maximum(hosts, 1)
    full, can_rows = full_all[rows], can[rows]
    before = (full[:, None] >= large.gpus) & can_rows
    cpu_ok_after = access[st.model_id[rows]] & (st.cpu_free[rows, None] - req.cpu_milli >= large.cpu)
    if ctx.per_gpu:
        full_after = full[:, None] - (ctx.free_milli >= MILLI_PER_GPU)  # [R, G]: taking GPU g
        after = (full_after[:, :, None] >= large.gpus) & cpu_ok_after[:, None, :]
        return 1.0 - ((before[:, None, :] & ~after) * cost).sum(axis=-1)  # type: ignore[no-any-return]
    full_after = full - (req.gpus if req.exclusive else 0)
    after = (full_after[:, None] >= large.gpus) & cpu_ok_after
    return 1.0 - ((before & ~after) * cost).sum(axis=-1)  # type: ignore[no-any-return]


def _reserve_shortfall(share: F64, free_all: F64 | float, free_in_set: F64) -> F64:
    """Milli-GPU by which the models of each set hold less than their pinned share of all free."""
    return np.maximum(share * free_all - free_in_set, 0.0)


def score_pinned_reserve(ctx: ScoreContext) -> F64:
    """How far the placement pushes GPU models below what pods pinned to them still need.

    Pods pinned to a set S of models (`PinnedDemand`) ask for `share[S]` of all GPU demand, so
    until the cluster is full they will claim about that share of whatever capacity is still
    free, and only S's nodes can give it. When S's free capacity falls below share × all free
    capacity, every further GPU taken on S by a pod that could have gone elsewhere is a pinned
    pod turned away later (openb, 20 % of pods pinned: 200 GPUs of T4-pinned pods fail at 100 %
    arrived under FGD, while 300 GPUs of the largest model stay free). The cost is the growth
    of that shortfall over all sets, on the scale of `cpu_strand` (0.5 − Δ / 16 GPUs); a pod
    pinned to S itself pays the same on every node it may use, so only a choice between models
    is steered. Depends on cluster-wide free capacity, hence volatile.
    """
    pinned, st, req, rows = ctx.profile.pinned, ctx.state, ctx.req, ctx.rows
    if pinned.share.size == 0 or req.gpus == 0:
        return np.ones(rows.size)
    free_node = np.where(st.usable_gpus(), st.gpu_milli_free, 0).sum(axis=1)
    free_model = np.bincount(st.model_id, weights=free_node, minlength=len(st.models))
    free_set = np.asarray(pinned.sets @ free_model, dtype=np.float64)  # [S]
    free_all = float(free_model.sum())
    before = _reserve_shortfall(pinned.share, free_all, free_set).sum()
    taken = float(req.gpu_milli_total)
    in_set = pinned.sets[:, st.model_id[rows]].T  # [R, S]
    after = _reserve_shortfall(pinned.share, free_all - taken, free_set - taken * in_set).sum(axis=1)
    return np.clip(0.5 - (after - before) / (2 * MAX_SPEC_GPU), 0.0, 1.0)  # type: ignore[no-any-return]


def score_availability(ctx: ScoreContext) -> F64:
    """How tightly the node's free GPUs fit the request (1: nothing left over)."""
    st, req = ctx.state, ctx.req
    if req.gpus == 0:
        return np.ones(ctx.rows.size)
    left = ctx.free_milli
    if ctx.per_gpu:
        return np.where(ctx.gpu_fit, 1.0 - (left - req.gpu_milli) / MILLI_PER_GPU, 0.0)
    count = np.maximum(st.gpu_count[ctx.rows], 1)
    spare = ctx.gpu_fit.sum(axis=1) - req.gpus
    return np.clip(1.0 - spare / count, 0.0, 1.0)  # type: ignore[no-any-return]


def score_topology(ctx: ScoreContext) -> F64:
    """Best achievable GPU grouping for a multi-GPU request: NVLink > NUMA > socket > spread."""
    st, req = ctx.state, ctx.req
    if req.gpus <= 1:
        return np.ones(ctx.rows.size)
    free = ctx.gpu_fit
    rows = ctx.rows
    nv = group_free_counts(st.gpu_nvlink_group[rows], free) >= req.gpus
    numa = group_free_counts(st.gpu_numa[rows], free) >= req.gpus
    sock = group_free_counts(st.gpu_socket[rows], free) >= req.gpus
    level = np.where(nv, 1.0, np.where(numa, 0.66, np.where(sock, 0.33, 0.0)))
    pcie = np.where(st.gpu_exists[rows], st.gpu_pcie_gen[rows], 0).max(axis=1) / 6.0
    return 0.9 * level + 0.1 * np.clip(pcie, 0.0, 1.0)  # type: ignore[no-any-return]


def score_model_cache(ctx: ScoreContext) -> F64:
    """1 on a node caching the request's model where the request may use it (shared, or in the
    pod's namespace: `PodRequest.model_cache_names`), 0 elsewhere; 1 everywhere without a model."""
    name = ctx.req.model_name
    if not name:
        return np.ones(ctx.rows.size)
    hits = ctx.req.model_cache_names or hit_entries(name, None)
    nodes = ctx.state.nodes
    return np.array([0.0 if nodes[int(i)].cached_models.isdisjoint(hits) else 1.0 for i in ctx.rows])


def score_cost(ctx: ScoreContext) -> F64:
    """1 − price / the cluster's highest known price (`neuronetes.pricing`). A node of unknown
    price scores 0, as the most expensive known one: never as free. Without any known price (or
    with every known price 0) prices say nothing and every node of known price scores 1."""
    st = ctx.state
    price = st.price_per_hour[ctx.rows]
    known = ~np.isnan(price)
    top = st.price_top
    if top is None:
        return np.ones(ctx.rows.size)
    if top <= 0:
        return known.astype(np.float64)
    return np.where(known, 1.0 - np.where(known, price, 0.0) / top, 0.0)


ZONE_OF_DATA: float = 0.5
"""Data-locality score of a node in a preferred zone when nodes are named too (the data's own
nodes score 1): a zone neighbour is better than elsewhere, not as good as the data's node."""


def _named_rows(state: ClusterState, names: tuple[str, ...], rows: I64) -> BOOL:
    """Whether each of `rows` is one of the nodes `names` (names the state lacks are ignored)."""
    named = np.zeros(state.n_nodes, dtype=bool)
    named[[state.index[n] for n in names if n in state.index]] = True
    return named[rows]


def score_data_locality(ctx: ScoreContext) -> F64:
    """Nearness to the pod's data, away from the workloads it avoids (`neuronetes.locality`).

    Attraction: a node in `preferred_nodes` (where the data's pods run) scores 1, a node in one
    of `preferred_zones` `ZONE_OF_DATA` (1 when no node is named: the zone is then the finest
    level asked for), any other node 0; without either list every node scores 1. Repulsion: a
    node in `avoid_nodes` scores 0 whatever its attraction. A score, never a filter: with the
    data's nodes full the pod still lands elsewhere.
    """
    req, st, rows = ctx.req, ctx.state, ctx.rows
    score = np.ones(rows.size)
    if req.preferred_nodes or req.preferred_zones:
        in_zone = np.array([z in req.preferred_zones for z in st.zones], dtype=bool)[st.zone_id[rows]]
        score = np.where(in_zone, ZONE_OF_DATA if req.preferred_nodes else 1.0, 0.0)
        if req.preferred_nodes:
            score = np.where(_named_rows(st, req.preferred_nodes, rows), 1.0, score)
    if req.avoid_nodes:
        score = np.where(_named_rows(st, req.avoid_nodes, rows), 0.0, score)
    return score


SCORERS: dict[str, Scorer] = {
    s.name: s
    for s in (
        Scorer("random", score_random, volatile=True),
        Scorer("bestfit", score_bestfit),
        Scorer("dotprod", score_dotprod),
        Scorer("packing", score_packing),
        Scorer("clustering", score_clustering),
        Scorer("fgd", score_fgd),
        Scorer("capacity_frag", score_capacity_frag),
        Scorer("share_waste", score_share_waste),
        Scorer("cpu_strand", score_cpu_strand),
        Scorer("scarcity", score_scarcity, volatile=True),
        Scorer("pinned_reserve", score_pinned_reserve, volatile=True),
        Scorer("availability", score_availability),
        Scorer("topology", score_topology),
        Scorer("model_cache", score_model_cache),
        Scorer("cost", score_cost),
        Scorer("data_locality", score_data_locality),
    )
}
