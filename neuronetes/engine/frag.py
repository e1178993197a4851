"""Fragmentation of free GPU capacity against a workload profile (FGD, ATC'23), vectorised.

For one node and one typical shape t, the node's free GPU capacity is *fragment* when t cannot
use it: all of it when t cannot fit at all (too few GPUs with enough free, too little CPU,
wrong model), and otherwise the free capacity on GPUs too small for t. A node's fragmentation
is the weighted sum over shapes. CPU-only shapes count every free GPU as fragment (they can
never use it), exactly as the paper's simulator does; this is a constant for a given placement
and never changes which node wins.

GPU models: a shape's pods may be pinned to some models. Shapes that differ only in their model
lists share one column, with `access[model, t]` the share of t's pods that may use the model
(`ProfileArrays`); for the rest of t, all of a node's free capacity is fragment. A node of a
model no typical shape may use is therefore all fragment.

All functions take node rows as arrays: `left[R, G]` free milli-GPU per usable GPU (0 for
missing/unusable GPUs), `cpu[R]` free CPU, `model[R]` GPU model ids.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from neuronetes.engine.profile import ProfileArrays

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def _combine(
    p: ProfileArrays,
    fits_gpu: npt.NDArray[np.bool_],
    frag_if_fit: F64,
    total: F64,
    cpu: I64,
    access: F64,
) -> F64:
    """Σ_t w_t · (free capacity the pods of t cannot use); `access` the share of t that may."""
    fits = fits_gpu & (cpu[..., None] >= p.cpu) & (p.milli > 0)
    every = total[..., None]
    return (every - np.where(fits, access, 0.0) * (every - frag_if_fit)) @ p.weight


def node_fragmentation(left: I64, cpu: I64, model: I64, p: ProfileArrays) -> F64:
    """Fragmentation (milli-GPU) of each node row as it stands."""
    if p.weight.size == 0:
        return np.zeros(left.shape[0])
    ge = left[:, :, None] >= p.milli  # [R, G, T]
    count = ge.sum(axis=1)  # GPUs that can hold t
    small = np.where(ge, 0, left[:, :, None]).sum(axis=1)  # free capacity on GPUs too small for t
    total = left.sum(axis=1).astype(np.float64)
    return _combine(p, count >= p.gpus, small.astype(np.float64), total, cpu, p.access[model])


def fragmentation_after_whole_gpus(
    left: I64, cpu: I64, model: I64, p: ProfileArrays, n_gpus: int, cpu_req: int
) -> F64:
    """Fragmentation after taking `n_gpus` fully free GPUs and `cpu_req` CPU on each row.

    Which fully free GPUs are taken does not change fragmentation: they are interchangeable.
    """
    if p.weight.size == 0:
        return np.zeros(left.shape[0])
    ge = left[:, :, None] >= p.milli
    count = ge.sum(axis=1) - n_gpus  # a full GPU is large enough for every shape
    small = np.where(ge, 0, left[:, :, None]).sum(axis=1)
    total = left.sum(axis=1).astype(np.float64) - 1000.0 * n_gpus
    return _combine(p, count >= p.gpus, small.astype(np.float64), total, cpu - cpu_req, p.access[model])


def fragmentation_after_share(
    left: I64, cpu: I64, model: I64, p: ProfileArrays, milli: int, cpu_req: int
) -> F64:
    """Fragmentation `[R, G]` after taking `milli` on GPU g (for every g) and `cpu_req` CPU.

    Entries for GPUs with less than `milli` free are meaningless; callers mask them.
    """
    r, g = left.shape
    if p.weight.size == 0:
        return np.zeros((r, g))
    ge = left[:, :, None] >= p.milli  # [R, G, T]
    count = ge.sum(axis=1)  # [R, T]
    small_parts = np.where(ge, 0, left[:, :, None])
    small = small_parts.sum(axis=1)
    after = left - milli  # [R, G]
    ge_after = after[:, :, None] >= p.milli
    count_after = count[:, None, :] - ge + ge_after  # [R, G, T]
    small_after = small[:, None, :] - small_parts + np.where(ge_after, 0, after[:, :, None])
    total_after = left.sum(axis=1)[:, None].astype(np.float64) - milli  # [R, 1]
    total_after = np.broadcast_to(total_after, (r, g))
    access = p.access[model][:, None, :]
    return _combine(
        p,
        count_after >= p.gpus,
        small_after.astype(np.float64),
        total_after,
        (cpu - cpu_req)[:, None],
        access,
    )


def capacity_fragmentation(left: I64, cpu: I64, model: I64, p: ProfileArrays) -> F64:
    """Free GPU capacity that typical shapes cannot turn into placed pods, counting instances.

    FGD asks only whether one pod of a shape still fits. This counts how many would: per shape,
    `min(GPU-limited instances, CPU-limited instances)`; everything beyond those instances'
    GPU demand is fragment. A GPU with 0.9 free holds one 0.5 pod (0.4 is fragment), and an
    8-GPU node with CPU for three 12-core pods strands five GPUs: both invisible to FGD.
    Works on any leading batch shape: `left[..., G]`, `cpu[...]`, `model[...]`.
    """
    if p.weight.size == 0:
        return np.zeros(left.shape[:-1])
    milli = np.maximum(p.milli, 1)
    per_gpu = left[..., :, None] // milli  # [..., G, T] instances each GPU holds
    by_gpu = per_gpu.sum(axis=-2) // np.maximum(p.gpus, 1)  # [..., T]
    by_cpu = np.where(p.cpu > 0, cpu[..., None] // np.maximum(p.cpu, 1), np.iinfo(np.int64).max)
    usable = np.minimum(by_gpu, by_cpu) * (p.gpus * p.milli)
    usable = np.where(p.milli > 0, usable, 0)
    total = left.sum(axis=-1)[..., None]
    return (total - np.minimum(usable, total) * p.access[model]) @ p.weight  # type: ignore[no-any-return]


def capacity_fragmentation_after_share(
    left: I64, cpu: I64, model: I64, p: ProfileArrays, milli: int, cpu_req: int
) -> F64:
    """`capacity_fragmentation` `[R, G]` after taking `milli` on GPU g (for every g) and `cpu_req`.

    Only GPU g's instance count changes, so this is O(R·G·T), not a full recount per choice.
    Entries for GPUs with less than `milli` free are meaningless; callers mask them.
    """
    r, g = left.shape
    if p.weight.size == 0:
        return np.zeros((r, g))
    shape_milli = np.maximum(p.milli, 1)
    per_gpu = left[:, :, None] // shape_milli  # [R, G, T]
    after_gpu = np.maximum(left - milli, 0)[:, :, None] // shape_milli
    instances = per_gpu.sum(axis=1)[:, None, :] - per_gpu + after_gpu  # [R, G, T]
    by_gpu = instances // np.maximum(p.gpus, 1)
    cpu_after = (cpu - cpu_req)[:, None]
    by_cpu = np.where(p.cpu > 0, cpu_after // np.maximum(p.cpu, 1), np.iinfo(np.int64).max)  # [R, T]
    usable = np.minimum(by_gpu, by_cpu[:, None, :]) * (p.gpus * p.milli)
    usable = np.where(p.milli > 0, usable, 0)
    total = (left.sum(axis=1)[:, None] - np.minimum(left, milli))[:, :, None]  # [R, G, 1]
    return (total - np.minimum(usable, total) * p.access[model][:, None, :]) @ p.weight  # type: ignore[no-any-return]
