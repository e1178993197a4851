/*
 * vmmtrack.h — the lifetime of VMM physical memory (a cuMemCreate handle) as the driver keeps it:
 * "the memory allocation will be freed when all outstanding mappings to the memory are unmapped
 * and when all outstanding references to the handle are also released" (cuMemRelease).
 *
 * A handle has references (cuMemCreate: 1, cuMemRetainAllocationHandle: +1, cuMemRelease: -1)
 * and mappings (cuMemMap adds a VA range; cuMemUnmap removes every range lying inside the one it
 * is given, so one unmap can end several adjacent mappings). Its memory is gone once both are
 * zero. A released handle that is still mapped stays usable: it can be mapped again and retained
 * (measured on an H100, driver 580.159 / CUDA 13.0). Used by the shim (when to give the charge
 * back) and by the fake driver (when its account frees the memory). Not thread-safe: callers hold
 * their own lock.
 */
#ifndef NN_VMMTRACK_H
#define NN_VMMTRACK_H

#include "ptrmap.h"

typedef struct nn_vmm_range {
    uint64_t va, size, handle;
} nn_vmm_range;

typedef struct nn_vmm {
    nn_ptrmap handles;    /* handle -> bytes (size), device (dev), references (kind), mappings (aux) */
    nn_vmm_range *ranges; /* mapped ranges, sorted by va, never overlapping */
    size_t count, cap;
} nn_vmm;

/* What an unmap does with a recorded range that only partly overlaps the unmapped one. */
enum { NN_VMM_STRICT, /* refuse the whole unmap, as the driver refuses to unmap part of a mapping */
       NN_VMM_OVERLAP /* drop it too: the driver unmapped the range, so the record was stale */ };

static inline uint64_t nn_vmm_end(uint64_t va, uint64_t size) { return size > UINT64_MAX - va ? UINT64_MAX : va + size; }

/* A new handle from cuMemCreate: one reference, no mapping. -1 when out of host memory. */
static inline int nn_vmm_create(nn_vmm *v, uint64_t handle, uint64_t size, int dev) {
    return nn_ptrmap_put(&v->handles, (nn_ptr_entry){handle, size, dev, 1, 0});
}

/* Index of the first range that ends after `va`. */
static inline size_t nn_vmm_lower(const nn_vmm *v, uint64_t va) {
    size_t lo = 0, hi = v->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (nn_vmm_end(v->ranges[mid].va, v->ranges[mid].size) <= va) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The handle mapped at `addr` (anywhere inside a mapping), 0 when none. */
static inline uint64_t nn_vmm_handle_at(const nn_vmm *v, uint64_t addr) {
    size_t i = nn_vmm_lower(v, addr);
    return (i < v->count && v->ranges[i].va <= addr) ? v->ranges[i].handle : 0;
}

/* Forget the handle once nothing holds its memory: 1 and its entry in *gone when that happened. */
static inline int nn_vmm_settle(nn_vmm *v, nn_ptr_entry *e, nn_ptr_entry *gone) {
    if (e->kind != 0 || e->aux != 0) return 0;
    if (gone != NULL) *gone = *e;
    nn_ptrmap_take(&v->handles, e->key, NULL);
    return 1;
}

/* cuMemRetainAllocationHandle returned `handle`: +1 reference. 0 when the handle is not known. */
static inline int nn_vmm_retain(nn_vmm *v, uint64_t handle) {
    nn_ptr_entry *e = nn_ptrmap_find(&v->handles, handle);
    if (e == NULL) return 0;
    e->kind++;
    return 1;
}

/* cuMemRelease: -1 = no reference left to release (unknown handle, or released already),
 * 0 = the memory is still held (mapped or retained), 1 = the memory is freed now (*gone). */
static inline int nn_vmm_release(nn_vmm *v, uint64_t handle, nn_ptr_entry *gone) {
    nn_ptr_entry *e = nn_ptrmap_find(&v->handles, handle);
    if (e == NULL || e->kind == 0) return -1;
    e->kind--;
    return nn_vmm_settle(v, e, gone);
}

/* cuMemUnmap of [va, va+size): removes the recorded ranges inside it (and, NN_VMM_OVERLAP, those
 * overlapping it); for each handle whose memory that frees, gone(ctx, entry). Returns how many
 * ranges were removed, or -1 (nothing changed) when NN_VMM_STRICT meets a range crossing an edge. */
static inline long nn_vmm_unmap(nn_vmm *v, uint64_t va, uint64_t size, int mode,
                                void (*gone)(void *ctx, const nn_ptr_entry *e), void *ctx) {
    uint64_t end = nn_vmm_end(va, size);
    size_t first = nn_vmm_lower(v, va), last = first;
    while (last < v->count && v->ranges[last].va < end) {
        const nn_vmm_range *r = &v->ranges[last];
        if (mode == NN_VMM_STRICT && (r->va < va || nn_vmm_end(r->va, r->size) > end)) return -1;
        last++;
    }
    for (size_t i = first; i < last; i++) {
        nn_ptr_entry *e = nn_ptrmap_find(&v->handles, v->ranges[i].handle);
        nn_ptr_entry freed;
        if (e == NULL) continue;
        if (e->aux > 0) e->aux--;
        if (nn_vmm_settle(v, e, &freed) && gone != NULL) gone(ctx, &freed);
    }
    memmove(&v->ranges[first], &v->ranges[last], (v->count - last) * sizeof *v->ranges);
    v->count -= last - first;
    return (long)(last - first);
}

/* cuMemMap of `handle` at [va, va+size): 0, -1 when the handle is not known, -2 when the range
 * overlaps a recorded mapping (nothing recorded), -3 when out of host memory: the mapping is
 * counted without its range, so it is never unmapped and the memory never freed (fail closed). */
static inline int nn_vmm_map(nn_vmm *v, uint64_t va, uint64_t size, uint64_t handle) {
    nn_ptr_entry *e = nn_ptrmap_find(&v->handles, handle);
    if (e == NULL || size == 0) return -1;
    size_t i = nn_vmm_lower(v, va);
    if (i < v->count && v->ranges[i].va < nn_vmm_end(va, size)) return -2;
    if (v->count == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        nn_vmm_range *ranges = realloc(v->ranges, cap * sizeof *ranges);
        if (ranges == NULL) {
            e->aux++;
            return -3;
        }
        v->ranges = ranges;
        v->cap = cap;
    }
    memmove(&v->ranges[i + 1], &v->ranges[i], (v->count - i) * sizeof *v->ranges);
    v->ranges[i] = (nn_vmm_range){va, size, handle};
    v->count++;
    e->aux++;
    return 0;
}

static inline void nn_vmm_clear(nn_vmm *v) {
    nn_ptrmap_clear(&v->handles);
    free(v->ranges);
    memset(v, 0, sizeof *v);
}

#endif
