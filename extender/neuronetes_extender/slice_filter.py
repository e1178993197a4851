"""The filter of a pod that names a GPUSlice: the slice's node or nothing (docs/gpuslice.md).

The slice already holds the GPU share, so the pod's hold takes only its CPU and memory on the
slice's node; the bind (`binding.prepare_bind`) then gives the pod the slice's GPU and share.
A slice that is not Bound yet rejects the pod for now (it is nudged when the slice binds); a pod
whose request is not the slice's share, or that is a gang member, is refused for good.
"""

from __future__ import annotations

from .books import CacheBooks
from .decisions import short
from .holds import owned_by
from .pods import PodInfo
from .results import Explanation, FilterDecision, Hold
from .slices import gpu_index, slice_request_mismatch
from .snapshot import REASON_UNKNOWN_NODE, NodeLookup

__all__ = ["filter_slice_pod"]


def _refused(lookup: NodeLookup, why: str) -> FilterDecision:
    """Every node unresolvable for `why` (preemption cannot help)."""
    nodes = lookup.state.nodes
    unresolvable = {nodes[i].name: short(why) for i in lookup.candidates.tolist()}
    return FilterDecision((), dict.fromkeys(lookup.unknown, REASON_UNKNOWN_NODE), unresolvable, None)


def filter_slice_pod(books: CacheBooks, pod: PodInfo, lookup: NodeLookup) -> FilterDecision:
    """Hold `pod`'s CPU and memory on its slice's node, if that node is among the looked-up ones."""
    snap = books.snap
    st = snap.state
    books.release_hold_of(pod.id, refilter=True)
    sl = books.store.slices.get(pod.slice_key)
    if pod.gpu_error:
        return _refused(lookup, f"invalid gpu request: {pod.gpu_error}")
    if sl is None:
        waiting = f"GPUSlice {pod.slice} is not Bound (no GPU reserved for it yet); the pod waits for it"
        return FilterDecision((), lookup.reject_all(waiting, REASON_UNKNOWN_NODE), {}, None)
    mismatch = slice_request_mismatch(pod, sl)
    if mismatch is not None:
        return _refused(lookup, mismatch)
    i = st.index.get(sl.node, -1)
    elsewhere = f"the pod's GPUSlice {sl.name} is reserved on node {sl.node}"
    j = gpu_index(st, i, sl.gpu_uuid) if i >= 0 else None
    if i < 0 or i not in lookup.candidates.tolist() or j is None:
        return FilterDecision((), lookup.reject_all(elsewhere, REASON_UNKNOWN_NODE), {}, None)
    if sl.alloc_id not in st.allocations:  # its share overlaps a bound pod's: not counted, not used
        taken = f"GPUSlice {sl.name}'s share on {sl.node} is held by a bound pod; the pod waits"
        return FilterDecision((), lookup.reject_all(taken, REASON_UNKNOWN_NODE), {}, None)
    failed = lookup.reject_all(elsewhere, REASON_UNKNOWN_NODE, keep=i)
    explanation = Explanation(sl.node, (j,), (sl.gpu_uuid,), f"inside GPUSlice {sl.name}")
    hold = Hold(
        alloc_id="hold/" + pod.id,
        node=sl.node,
        request=pod.request,
        grants=(),  # the GPU share is the slice's allocation
        expires_at=snap.now() + snap.settings.assume_ttl_seconds,
        reason=explanation.reason,
        explanation=explanation,
        **owned_by(pod),
    )
    if not books.holds.allocate(st, hold):
        failed[sl.node] = "insufficient cpu or memory for the pod beside its GPUSlice"
        return FilterDecision((), failed, {}, None)
    books.holds.put(hold)
    return FilterDecision((sl.node,), failed, {}, hold, None, explanation)
