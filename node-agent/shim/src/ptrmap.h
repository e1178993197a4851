/*
 * ptrmap.h — a small open-addressing map from a device address or handle (non-zero 64-bit key)
 * to what was allocated there. Used by the shim (to uncharge a free) and by the fake driver (to
 * release its account). Not thread-safe: callers hold their own lock.
 */
#ifndef NN_PTRMAP_H
#define NN_PTRMAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct nn_ptr_entry {
    uint64_t key;  /* 0 = empty, NN_PTRMAP_TOMB = deleted */
    uint64_t size; /* bytes charged */
    int32_t dev;   /* device index the bytes were charged to */
    uint32_t kind; /* caller-defined (which API allocated it) */
    uint64_t aux;  /* caller-defined */
} nn_ptr_entry;

typedef struct nn_ptrmap {
    nn_ptr_entry *slots;
    size_t cap;  /* power of two */
    size_t used; /* live + tombstones */
    size_t live;
} nn_ptrmap;

#define NN_PTRMAP_TOMB UINT64_MAX

static inline size_t nn_ptrmap_hash(uint64_t key) {
    key ^= key >> 33;
    key *= UINT64_C(0xff51afd7ed558ccd);
    key ^= key >> 33;
    return (size_t)key;
}

static inline nn_ptr_entry *nn_ptrmap_find(nn_ptrmap *m, uint64_t key) {
    if (m->cap == 0 || key == 0 || key == NN_PTRMAP_TOMB) return NULL;
    for (size_t i = nn_ptrmap_hash(key) & (m->cap - 1), n = 0; n < m->cap; i = (i + 1) & (m->cap - 1), n++) {
        if (m->slots[i].key == key) return &m->slots[i];
        if (m->slots[i].key == 0) return NULL;
    }
    return NULL;
}

static inline int nn_ptrmap_grow(nn_ptrmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    if (m->live * 4 < m->cap) cap = m->cap; /* mostly tombstones: rehash in place size */
    nn_ptr_entry *slots = calloc(cap, sizeof *slots);
    if (slots == NULL) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        uint64_t k = m->slots[i].key;
        if (k == 0 || k == NN_PTRMAP_TOMB) continue;
        size_t j = nn_ptrmap_hash(k) & (cap - 1);
        while (slots[j].key != 0) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    m->used = m->live;
    return 0;
}

/* Insert or replace; returns -1 when out of host memory. */
static inline int nn_ptrmap_put(nn_ptrmap *m, nn_ptr_entry e) {
    nn_ptr_entry *old = nn_ptrmap_find(m, e.key);
    if (old != NULL) {
        *old = e;
        return 0;
    }
    if ((m->used + 1) * 2 > m->cap && nn_ptrmap_grow(m) != 0) return -1;
    size_t i = nn_ptrmap_hash(e.key) & (m->cap - 1);
    while (m->slots[i].key != 0 && m->slots[i].key != NN_PTRMAP_TOMB) i = (i + 1) & (m->cap - 1);
    if (m->slots[i].key == 0) m->used++;
    m->slots[i] = e;
    m->live++;
    return 0;
}

/* Remove `key`; returns 1 and the entry in *out when it was there. */
static inline int nn_ptrmap_take(nn_ptrmap *m, uint64_t key, nn_ptr_entry *out) {
    nn_ptr_entry *e = nn_ptrmap_find(m, key);
    if (e == NULL) return 0;
    if (out != NULL) *out = *e;
    e->key = NN_PTRMAP_TOMB;
    m->live--;
    return 1;
}

static inline void nn_ptrmap_clear(nn_ptrmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

#endif
