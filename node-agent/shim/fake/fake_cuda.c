/*
 * fake_cuda.c — a fake libcuda.so.1 for testing the shim without a GPU (never shipped).
 *
 * Compiled against the real cuda.h (with __CUDA_API_VERSION_INTERNAL, as the driver itself is,
 * so every versioned and per-thread-stream name is declared and each definition here is checked
 * against the header's prototype). It simulates:
 *   - devices with FAKE_CUDA_MEM_BYTES of memory, whose account (per device and per process) is
 *     kept in the shared state file (fake_state.h): the oracle;
 *   - one GPU engine per device that runs kernels one at a time, in submission order across all
 *     processes. A kernel "runs" for the nanoseconds in its first parameter (a uint64_t that
 *     kernelParams[0] points to) or FAKE_CUDA_KERNEL_NS; nothing really executes, the fake only
 *     keeps time, so stream and event waits sleep until the simulated completion;
 *   - events stamped with simulated GPU time: an event recorded just before a kernel is stamped
 *     with that kernel's start (as the GPU processes it when it gets to it), one after with its end;
 *   - stream capture into graphs (kernel, memory-allocation and free nodes), memory nodes added
 *     explicitly (cuGraphAddMemAllocNode/FreeNode, cuGraphAddNode, a child graph moved into its
 *     parent), graph launch; a graph with memory nodes cannot be cloned, and one whose allocation is
 *     still live cannot be launched again, as on the driver;
 *   - pools, managed and pitched allocations; VMM as the driver keeps it (src/vmmtrack.h): a
 *     handle's memory stays until it is released AND unmapped;
 *   - CUDA arrays and mipmapped arrays, accounted as src/arraysize.h estimates them (sparse and
 *     deferred-mapping arrays hold nothing);
 *   - context limits: CU_LIMIT_STACK_SIZE (x 132 SMs x 2048 threads), CU_LIMIT_PRINTF_FIFO_SIZE and
 *     CU_LIMIT_MALLOC_HEAP_SIZE reserve what they grow above their defaults (the driver's defaults
 *     and rounding, measured on an H100);
 *   - cuGetProcAddress / cuGetProcAddress_v2 with versioned and _ptsz variants;
 *   - the checkpoint API's state machine: RUNNING -> LOCKED -> CHECKPOINTED -> LOCKED -> RUNNING;
 *     a checkpoint moves the process's device memory out of the account, a restore brings it back,
 *     and the locked process's allocations and launches wait until it runs again.
 * One file, long, because it stands for one library; its sections follow the driver's API families.
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/arraysize.h"
#include "../src/ptrmap.h"
#include "../src/vmmtrack.h"
#include "fake_state.h"

#define EXPORT __attribute__((visibility("default")))
#define FAKE_SMS 132 /* an H100's */
#define FAKE_THREADS_PER_SM 2048

/* ---- time and the account ------------------------------------------------------------------ */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000u), (long)(t % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* The latest clock reading: events complete in order, so most completion checks are answered
 * without reading the clock again (a system call on some machines). */
static uint64_t g_seen_now;

static int reached(uint64_t t) {
    if (t <= __atomic_load_n(&g_seen_now, __ATOMIC_RELAXED)) return 1;
    uint64_t now = now_ns();
    __atomic_store_n(&g_seen_now, now, __ATOMIC_RELAXED);
    return t <= now;
}

static int g_initialized;
static fake_state *g_state;
static fake_proc *g_self; /* this process's entry (dropped in a forked child) */
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void forget_self(void) { g_self = NULL; }
static void install_atfork(void) { pthread_atfork(NULL, NULL, forget_self); }

static fake_proc *self_entry(void) {
    fake_proc *p = __atomic_load_n(&g_self, __ATOMIC_ACQUIRE);
    if (p != NULL) return p;
    pthread_once(&g_atfork_once, install_atfork);
    fake_state_lock(g_state);
    p = fake_state_self(g_state);
    fake_state_unlock(g_state);
    __atomic_store_n(&g_self, p, __ATOMIC_RELEASE);
    return p;
}

/* A checkpoint-locked process's API calls block until it runs again (as the driver's locks do). */
static void ckpt_gate(fake_proc *self) {
    while (self != NULL && __atomic_load_n(&self->ckpt_state, __ATOMIC_ACQUIRE) != FAKE_CKPT_RUNNING)
        usleep(500);
}

#define REQUIRE_INIT()                                    \
    do {                                                  \
        if (!__atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE)) \
            return CUDA_ERROR_NOT_INITIALIZED;            \
    } while (0)

/* ---- process-local objects ------------------------------------------------------------------- */

enum { LIMIT_STACK, LIMIT_PRINTF, LIMIT_HEAP, LIMIT_KINDS };

typedef struct fake_ctx {
    int dev;
    int primary;
    unsigned limits_set;        /* bit per LIMIT_*: set by cuCtxSetLimit (else the default) */
    size_t limit[LIMIT_KINDS];  /* under g_map_lock */
} fake_ctx;

static void ctx_limits_free(const fake_ctx *c);

typedef struct fake_event {
    uint64_t ts;  /* simulated GPU time the event completes */
    int recorded;
} fake_event;

enum { NODE_KERNEL, NODE_ALLOC, NODE_FREE };
typedef struct fake_node {
    int type;
    uint64_t value; /* kernel ns, or the allocation's address */
    uint64_t size;
    int dev;
} fake_node;

typedef struct fake_graph {
    fake_node *nodes;
    size_t count, cap;
    int owned;                     /* a child graph moved into a parent: the parent destroys it */
    struct fake_graph *moved;      /* child graphs moved into this one (their nodes were copied in) */
    struct fake_graph *moved_next; /* next sibling on the parent's list */
} fake_graph;

typedef struct fake_stream {
    pthread_mutex_t lock;
    int dev;
    uint64_t tail;             /* simulated time its last queued work completes */
    fake_event *pending_begin; /* recorded right before the next work: stamped with its start */
    fake_graph *capture;       /* non-NULL while capturing */
    uint64_t capture_id;
} fake_stream;

typedef struct fake_pool {
    int dev;
} fake_pool;

static fake_ctx g_primary[FAKE_MAX_DEVICES] = {{.dev = 0, .primary = 1}, {.dev = 1, .primary = 1},
                                               {.dev = 2, .primary = 1}, {.dev = 3, .primary = 1}};
static __thread fake_ctx *t_ctx;
static fake_stream g_legacy_stream = {PTHREAD_MUTEX_INITIALIZER, 0, 0, NULL, NULL, 0};
static __thread fake_stream *t_ptds_stream;
static fake_pool g_default_pool[FAKE_MAX_DEVICES] = {{0}, {1}, {2}, {3}};
static pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;
static nn_ptrmap g_allocs;  /* device address -> bytes (device memory the fake holds for us) */
static nn_vmm g_vmm;        /* VMM handles and their mappings */
static nn_ptrmap g_arrays;  /* CUDA array or mipmapped array -> bytes */
static uint64_t g_next_va = UINT64_C(0x7f0000000000);
static uint64_t g_capture_seq;
static uint64_t g_last_tail; /* latest completion of anything this process queued */

static int current_dev(void) { return t_ctx != NULL ? t_ctx->dev : 0; }

static uint64_t reserve_va(uint64_t size) {
    uint64_t aligned = (size + 0x1fffff) & ~UINT64_C(0x1fffff);
    return __atomic_fetch_add(&g_next_va, aligned ? aligned : 0x200000, __ATOMIC_RELAXED);
}

static fake_stream *stream_of(CUstream s, int per_thread) {
    if (s == CU_STREAM_PER_THREAD || (s == NULL && per_thread)) {
        if (t_ptds_stream == NULL) {
            /* one per thread for the process's lifetime, as the driver's per-thread stream */
            t_ptds_stream = calloc(1, sizeof *t_ptds_stream);
            if (t_ptds_stream == NULL) abort();
            pthread_mutex_init(&t_ptds_stream->lock, NULL);
            t_ptds_stream->dev = current_dev();
        }
        return t_ptds_stream;
    }
    if (s == NULL || s == CU_STREAM_LEGACY) return &g_legacy_stream;
    return (fake_stream *)s;
}

static void note_tail(uint64_t t) {
    uint64_t old = __atomic_load_n(&g_last_tail, __ATOMIC_RELAXED);
    while (old < t && !__atomic_compare_exchange_n(&g_last_tail, &old, t, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void graph_add(fake_graph *g, fake_node n) {
    if (g->count == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        fake_node *nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (nodes == NULL) abort();
        g->nodes = nodes;
        g->cap = cap;
    }
    g->nodes[g->count++] = n;
}

/* ---- memory in the account ------------------------------------------------------------------- */

/* Take the account's lock for a change of this process's own memory, waiting while the process is
 * checkpoint-locked. The state is read under the lock, so a checkpoint Lock either comes before the
 * change or waits for it to finish, as the driver's lock waits for the calls in flight. */
static void lock_running(fake_proc *self) {
    for (;;) {
        fake_state_lock(g_state);
        if (self == NULL || __atomic_load_n(&self->ckpt_state, __ATOMIC_ACQUIRE) == FAKE_CKPT_RUNNING) return;
        fake_state_unlock(g_state);
        usleep(500);
    }
}

static CUresult account_alloc(int dev, uint64_t size) {
    fake_proc *self = self_entry();
    if (self == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    lock_running(self);
    fake_device *d = &g_state->devices[dev];
    if (d->used_bytes + size > d->total_bytes) fake_state_reap(g_state);
    CUresult rc = CUDA_SUCCESS;
    if (d->used_bytes + size > d->total_bytes) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        self->used[dev] += size;
        d->used_bytes += size;
        if (d->used_bytes > d->peak_bytes) d->peak_bytes = d->used_bytes;
    }
    fake_state_unlock(g_state);
    return rc;
}

static void account_free(int dev, uint64_t size) {
    fake_proc *self = self_entry();
    if (self == NULL) return;
    lock_running(self);
    self->used[dev] -= size < self->used[dev] ? size : self->used[dev];
    g_state->devices[dev].used_bytes -= size < g_state->devices[dev].used_bytes ? size : g_state->devices[dev].used_bytes;
    fake_state_unlock(g_state);
}

static CUresult alloc_at(uint64_t va, uint64_t size, int dev, nn_ptrmap *map) {
    CUresult rc = account_alloc(dev, size);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_map_lock);
    int ok = nn_ptrmap_put(map, (nn_ptr_entry){va, size, dev, 0, 0});
    pthread_mutex_unlock(&g_map_lock);
    if (ok != 0) {
        account_free(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

static CUresult alloc_new(CUdeviceptr *dptr, uint64_t size, int dev) {
    if (dptr == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t va = reserve_va(size);
    CUresult rc = alloc_at(va, size, dev, &g_allocs);
    if (rc == CUDA_SUCCESS) *dptr = (CUdeviceptr)va;
    return rc;
}

static CUresult free_at(uint64_t key, nn_ptrmap *map) {
    nn_ptr_entry e;
    pthread_mutex_lock(&g_map_lock);
    int found = nn_ptrmap_take(map, key, &e);
    pthread_mutex_unlock(&g_map_lock);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    account_free(e.dev, e.size);
    return CUDA_SUCCESS;
}

/* ---- init, devices, contexts ----------------------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    g_state = fake_state_open();
    if (g_state == NULL) return CUDA_ERROR_NO_DEVICE;
    static int image_started;
    if (!__atomic_exchange_n(&image_started, 1, __ATOMIC_ACQ_REL)) {
        /* first cuInit of this program image: memory an earlier image of this PID held (before an
         * exec) was released when its device files closed */
        fake_state_lock(g_state);
        fake_proc *p = fake_state_find(g_state, (int32_t)getpid());
        if (p != NULL) {
            for (unsigned d = 0; d < FAKE_MAX_DEVICES; d++) {
                g_state->devices[d].used_bytes -= p->used[d];
                p->used[d] = 0;
            }
        }
        fake_state_unlock(g_state);
    }
    __atomic_store_n(&g_initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    REQUIRE_INIT();
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    *count = (int)g_state->device_count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    REQUIRE_INIT();
    if (device == NULL || ordinal < 0 || ordinal >= (int)g_state->device_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static int valid_dev(CUdevice dev) { return g_state != NULL && dev >= 0 && dev < (int)g_state->device_count; }

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    REQUIRE_INIT();
    if (name == NULL || len <= 0 || !valid_dev(dev)) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "NeuroNetes Fake GPU %d", dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    REQUIRE_INIT();
    if (uuid == NULL || !valid_dev(dev)) return CUDA_ERROR_INVALID_VALUE;
    /* the bytes of fake_device_uuid() ("GPU-" and 32 hex digits with dashes) */
    char text[41];
    fake_device_uuid((unsigned)dev, text);
    unsigned n = 0;
    for (const char *c = text + 4; *c != '\0' && n < 32; c++) {
        if (*c == '-') continue;
        unsigned v = (unsigned)(*c <= '9' ? *c - '0' : (*c | 0x20) - 'a' + 10);
        uuid->bytes[n / 2] = (char)(n % 2 == 0 ? v << 4 : ((unsigned char)uuid->bytes[n / 2] | v));
        n++;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    REQUIRE_INIT();
    if (bytes == NULL || !valid_dev(dev)) return CUDA_ERROR_INVALID_VALUE;
    *bytes = g_state->devices[dev].total_bytes;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    REQUIRE_INIT();
    if (pi == NULL || !valid_dev(dev)) return CUDA_ERROR_INVALID_VALUE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = FAKE_SMS; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = FAKE_THREADS_PER_SM; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    default: *pi = 1; break;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    REQUIRE_INIT();
    if (pctx == NULL || !valid_dev(dev)) return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)&g_primary[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    REQUIRE_INIT();
    return valid_dev(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static CUresult ctx_create(CUcontext *pctx, CUdevice dev) {
    REQUIRE_INIT();
    if (pctx == NULL || !valid_dev(dev)) return CUDA_ERROR_INVALID_VALUE;
    fake_ctx *c = calloc(1, sizeof *c);
    if (c == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    c->dev = dev;
    t_ctx = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev) {
    (void)params, (void)n, (void)flags;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
    (void)params, (void)flags;
    return ctx_create(pctx, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    REQUIRE_INIT();
    fake_ctx *c = (fake_ctx *)ctx;
    if (c == NULL || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx == c) t_ctx = NULL;
    ctx_limits_free(c);
    free(c);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    REQUIRE_INIT();
    t_ctx = (fake_ctx *)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    REQUIRE_INIT();
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)t_ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    REQUIRE_INIT();
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    *device = t_ctx->dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    REQUIRE_INIT();
    sleep_until(__atomic_load_n(&g_last_tail, __ATOMIC_RELAXED));
    return CUDA_SUCCESS;
}

/* ---- memory ------------------------------------------------------------------------------------ */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    REQUIRE_INIT();
    return alloc_new(dptr, bytesize, current_dev());
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height, unsigned int elem) {
    REQUIRE_INIT();
    if (pPitch == NULL || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (width + 511) & ~(size_t)511;
    CUresult rc = alloc_new(dptr, (uint64_t)pitch * height, current_dev());
    if (rc == CUDA_SUCCESS) *pPitch = pitch;
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    REQUIRE_INIT();
    (void)flags;
    return alloc_new(dptr, bytesize, current_dev());
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REQUIRE_INIT();
    if (dptr == 0) return CUDA_SUCCESS;
    return free_at((uint64_t)dptr, &g_allocs);
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t size, int dev, CUstream hStream, int ptds) {
    REQUIRE_INIT();
    if (dptr == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
    fake_stream *s = stream_of(hStream, ptds);
    pthread_mutex_lock(&s->lock);
    fake_graph *g = s->capture;
    if (g != NULL) { /* captured: a memory node, allocated when the graph is launched */
        uint64_t va = reserve_va(size);
        graph_add(g, (fake_node){NODE_ALLOC, va, size, dev});
        pthread_mutex_unlock(&s->lock);
        *dptr = (CUdeviceptr)va;
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&s->lock);
    return alloc_new(dptr, size, dev);
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream, int ptds) {
    REQUIRE_INIT();
    fake_stream *s = stream_of(hStream, ptds);
    pthread_mutex_lock(&s->lock);
    fake_graph *g = s->capture;
    if (g != NULL) {
        graph_add(g, (fake_node){NODE_FREE, (uint64_t)dptr, 0, 0});
        pthread_mutex_unlock(&s->lock);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&s->lock);
    return free_at((uint64_t)dptr, &g_allocs);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) { return alloc_async(dptr, size, current_dev(), s, 0); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) { return alloc_async(dptr, size, current_dev(), s, 1); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { return free_async(dptr, s, 0); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return free_async(dptr, s, 1); }

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, size, ((fake_pool *)pool)->dev, s, 0);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, size, ((fake_pool *)pool)->dev, s, 1);
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    REQUIRE_INIT();
    if (pool == NULL || props == NULL || !valid_dev(props->location.id)) return CUDA_ERROR_INVALID_VALUE;
    fake_pool *p = calloc(1, sizeof *p);
    if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    p->dev = props->location.id;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    REQUIRE_INIT();
    fake_pool *p = (fake_pool *)pool;
    if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (p < g_default_pool || p >= g_default_pool + FAKE_MAX_DEVICES) free(p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    (void)keep;
    REQUIRE_INIT();
    return pool != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    REQUIRE_INIT();
    if (pool == NULL || !valid_dev(dev)) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)&g_default_pool[dev];
    return CUDA_SUCCESS;
}

/* VMM: physical memory is held from cuMemCreate until the handle is released and unmapped (as the
 * driver: a released handle that is still mapped keeps its memory, can be mapped again and
 * retained; an unmap frees every mapping inside its range and refuses to cut one). */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    REQUIRE_INIT();
    (void)flags;
    if (handle == NULL || prop == NULL || size == 0 || !valid_dev(prop->location.id)) return CUDA_ERROR_INVALID_VALUE;
    uint64_t key = reserve_va(1) | 1; /* unique, never 0 */
    CUresult rc = account_alloc(prop->location.id, size);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_map_lock);
    int failed = nn_vmm_create(&g_vmm, key, size, prop->location.id);
    pthread_mutex_unlock(&g_map_lock);
    if (failed) {
        account_free(prop->location.id, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)key;
    return CUDA_SUCCESS;
}

static void vmm_gone(void *ctx, const nn_ptr_entry *e) { ((uint64_t *)ctx)[e->dev] += e->size; }

static void vmm_account_free(const uint64_t freed[FAKE_MAX_DEVICES]) {
    for (int d = 0; d < FAKE_MAX_DEVICES; d++)
        if (freed[d] != 0) account_free(d, freed[d]);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REQUIRE_INIT();
    uint64_t freed[FAKE_MAX_DEVICES] = {0};
    nn_ptr_entry gone;
    pthread_mutex_lock(&g_map_lock);
    int rc = nn_vmm_release(&g_vmm, (uint64_t)handle, &gone);
    pthread_mutex_unlock(&g_map_lock);
    if (rc < 0) return CUDA_ERROR_INVALID_VALUE; /* not a handle, or released already */
    if (rc == 1) vmm_gone(freed, &gone);
    vmm_account_free(freed);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    REQUIRE_INIT();
    if (handle == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_map_lock);
    uint64_t h = nn_vmm_handle_at(&g_vmm, (uint64_t)(uintptr_t)addr);
    if (h != 0) nn_vmm_retain(&g_vmm, h);
    pthread_mutex_unlock(&g_map_lock);
    if (h == 0) return CUDA_ERROR_INVALID_VALUE;
    *handle = (CUmemGenericAllocationHandle)h;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    REQUIRE_INIT();
    (void)align, (void)addr, (void)flags;
    if (ptr == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
    *ptr = (CUdeviceptr)reserve_va(size);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    REQUIRE_INIT();
    return (ptr != 0 && size != 0) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
    REQUIRE_INIT();
    (void)flags;
    if (ptr == 0 || size == 0 || offset != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_map_lock);
    int rc = nn_vmm_map(&g_vmm, (uint64_t)ptr, size, (uint64_t)handle); /* a live handle, a free range */
    pthread_mutex_unlock(&g_map_lock);
    if (rc == -3) abort(); /* host OOM in a test: the account would be wrong */
    return rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    REQUIRE_INIT();
    if (ptr == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t freed[FAKE_MAX_DEVICES] = {0};
    pthread_mutex_lock(&g_map_lock);
    long rc = nn_vmm_unmap(&g_vmm, (uint64_t)ptr, size, NN_VMM_STRICT, vmm_gone, freed);
    pthread_mutex_unlock(&g_map_lock);
    if (rc < 0) return CUDA_ERROR_INVALID_VALUE; /* would cut a mapping */
    vmm_account_free(freed);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    REQUIRE_INIT();
    return (ptr != 0 && size != 0 && desc != NULL && count > 0) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option) {
    REQUIRE_INIT();
    (void)option;
    if (granularity == NULL || prop == NULL) return CUDA_ERROR_INVALID_VALUE;
    *granularity = 2u << 20;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    REQUIRE_INIT();
    if (free_bytes == NULL || total == NULL) return CUDA_ERROR_INVALID_VALUE;
    int dev = current_dev();
    fake_state_lock(g_state);
    fake_state_reap(g_state);
    fake_device *d = &g_state->devices[dev];
    *total = d->total_bytes;
    *free_bytes = d->total_bytes - d->used_bytes;
    fake_state_unlock(g_state);
    return CUDA_SUCCESS;
}

/* ---- CUDA arrays -------------------------------------------------------------------------------- */

static CUresult array_new(uint64_t *key, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    REQUIRE_INIT();
    if (key == NULL || d == NULL || d->Width == 0 || (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t va = reserve_va(1);
    CUresult rc = alloc_at(va, nn_array_bytes(d->Format, d->NumChannels, d->Width, d->Height, d->Depth, d->Flags, levels),
                           current_dev(), &g_arrays);
    if (rc == CUDA_SUCCESS) *key = va;
    return rc;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc) {
    if (handle == NULL || desc == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d = {desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 0};
    return array_new((uint64_t *)handle, &d, 1);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    return array_new((uint64_t *)handle, desc, 1);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels) {
    return array_new((uint64_t *)handle, desc, levels);
}

EXPORT CUresult cuArrayDestroy(CUarray array) {
    REQUIRE_INIT();
    return free_at((uint64_t)(uintptr_t)array, &g_arrays) == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) { return cuArrayDestroy((CUarray)array); }

/* The 32-bit descriptors of CUDA < 3.2: a current driver answers them so in a current context. */
EXPORT CUresult cuArrayCreate(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc) {
    (void)handle, (void)desc;
    return CUDA_ERROR_INVALID_CONTEXT;
}

EXPORT CUresult cuArray3DCreate(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc) {
    (void)handle, (void)desc;
    return CUDA_ERROR_INVALID_CONTEXT;
}

/* ---- context limits: what a limit reserves above its default is device memory ---------------------- */

static const size_t g_limit_default[LIMIT_KINDS] = {1024, 8650752, 8388608}; /* an H100's defaults */

static int limit_kind(CUlimit limit) {
    switch (limit) {
    case CU_LIMIT_STACK_SIZE: return LIMIT_STACK;
    case CU_LIMIT_PRINTF_FIFO_SIZE: return LIMIT_PRINTF;
    case CU_LIMIT_MALLOC_HEAP_SIZE: return LIMIT_HEAP;
    default: return -1;
    }
}

/* Device memory held above the default for a limit of `value` (the stack: for every thread). */
static uint64_t limit_extra(int kind, size_t value) {
    uint64_t per = kind == LIMIT_STACK ? (uint64_t)FAKE_SMS * FAKE_THREADS_PER_SM : 1;
    return value > g_limit_default[kind] ? nn_sat_mul(value - g_limit_default[kind], per) : 0;
}

static size_t ctx_limit(const fake_ctx *c, int kind) {
    return (c->limits_set >> kind) & 1 ? c->limit[kind] : g_limit_default[kind];
}

EXPORT CUresult cuCtxGetLimit(size_t *value, CUlimit limit) {
    REQUIRE_INIT();
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    int kind = limit_kind(limit);
    pthread_mutex_lock(&g_map_lock);
    *value = kind < 0 ? 0 : ctx_limit(t_ctx, kind);
    pthread_mutex_unlock(&g_map_lock);
    return CUDA_SUCCESS;
}

/* Rounded as the driver does (measured): the stack to 16 bytes, the FIFO to 256 bytes (at least
 * 512 KiB), the heap to 8 KiB (at least 4 MiB). */
EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    REQUIRE_INIT();
    fake_ctx *c = t_ctx;
    if (c == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    int kind = limit_kind(limit);
    if (kind < 0) return CUDA_SUCCESS;
    static const size_t round_to[LIMIT_KINDS] = {16, 256, 8192}, at_least[LIMIT_KINDS] = {16, 512 << 10, 4 << 20};
    if (value > SIZE_MAX - round_to[kind]) return CUDA_ERROR_INVALID_VALUE;
    value = (value + round_to[kind] - 1) / round_to[kind] * round_to[kind];
    if (value < at_least[kind]) value = at_least[kind];
    pthread_mutex_lock(&g_map_lock); /* one set at a time: the account follows the value */
    uint64_t before = limit_extra(kind, ctx_limit(c, kind)), after = limit_extra(kind, value);
    CUresult rc = after > before ? account_alloc(c->dev, after - before) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) {
        if (after < before) account_free(c->dev, before - after);
        c->limit[kind] = value;
        c->limits_set |= 1u << kind;
    }
    pthread_mutex_unlock(&g_map_lock);
    return rc;
}

/* A destroyed context's reservations go back with it. */
static void ctx_limits_free(const fake_ctx *c) {
    for (int k = 0; k < LIMIT_KINDS; k++) {
        uint64_t extra = limit_extra(k, ctx_limit(c, k));
        if (extra != 0) account_free(c->dev, extra);
    }
}

/* ---- streams, events, capture ------------------------------------------------------------------- */

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int flags) {
    REQUIRE_INIT();
    (void)flags;
    if (phStream == NULL) return CUDA_ERROR_INVALID_VALUE;
    fake_stream *s = calloc(1, sizeof *s);
    if (s == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_init(&s->lock, NULL);
    s->dev = current_dev();
    *phStream = (CUstream)s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
    REQUIRE_INIT();
    fake_stream *s = (fake_stream *)hStream;
    if (s == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_destroy(&s->lock);
    free(s->capture);
    free(s);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h, int ptds) {
    REQUIRE_INIT();
    fake_stream *s = stream_of(h, ptds);
    pthread_mutex_lock(&s->lock);
    uint64_t tail = s->tail;
    int capturing = s->capture != NULL;
    pthread_mutex_unlock(&s->lock);
    if (capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    sleep_until(tail);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream h) { return stream_sync(h, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream h) { return stream_sync(h, 1); }

static CUresult stream_query(CUstream h, int ptds) {
    REQUIRE_INIT();
    fake_stream *s = stream_of(h, ptds);
    pthread_mutex_lock(&s->lock);
    uint64_t tail = s->tail;
    pthread_mutex_unlock(&s->lock);
    return tail <= now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuStreamQuery(CUstream h) { return stream_query(h, 0); }
EXPORT CUresult cuStreamQuery_ptsz(CUstream h) { return stream_query(h, 1); }

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, int ptds) {
    REQUIRE_INIT();
    (void)mode;
    if (h == NULL || h == CU_STREAM_LEGACY) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    fake_stream *s = stream_of(h, ptds);
    pthread_mutex_lock(&s->lock);
    CUresult rc = CUDA_ERROR_ILLEGAL_STATE;
    if (s->capture == NULL) {
        s->capture = calloc(1, sizeof *s->capture);
        s->capture_id = __atomic_add_fetch(&g_capture_seq, 1, __ATOMIC_RELAXED);
        rc = s->capture != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) { return begin_capture(h, mode, 0); }
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode) { return begin_capture(h, mode, 1); }

static CUresult end_capture(CUstream h, CUgraph *graph, int ptds) {
    REQUIRE_INIT();
    if (graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    fake_stream *s = stream_of(h, ptds);
    pthread_mutex_lock(&s->lock);
    fake_graph *g = s->capture;
    s->capture = NULL;
    s->capture_id = 0;
    pthread_mutex_unlock(&s->lock);
    if (g == NULL) return CUDA_ERROR_ILLEGAL_STATE;
    *graph = (CUgraph)g;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph *graph) { return end_capture(h, graph, 0); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *graph) { return end_capture(h, graph, 1); }

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *status, cuuint64_t *id, int ptds) {
    REQUIRE_INIT();
    if (status == NULL) return CUDA_ERROR_INVALID_VALUE;
    fake_stream *s = stream_of(h, ptds);
    pthread_mutex_lock(&s->lock);
    *status = s->capture != NULL ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id != NULL) *id = s->capture_id;
    pthread_mutex_unlock(&s->lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st) { return is_capturing(h, st, NULL, 0); }
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *st) { return is_capturing(h, st, NULL, 1); }

EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *graph,
                                          const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps) {
    (void)graph, (void)deps, (void)edges;
    if (ndeps != NULL) *ndeps = 0;
    return is_capturing(h, st, id, 0);
}

EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *graph,
                                               const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps) {
    (void)graph, (void)deps, (void)edges;
    if (ndeps != NULL) *ndeps = 0;
    return is_capturing(h, st, id, 1);
}

EXPORT CUresult cuEventCreate(CUevent *ev, unsigned int flags) {
    REQUIRE_INIT();
    (void)flags;
    if (ev == NULL) return CUDA_ERROR_INVALID_VALUE;
    fake_event *e = calloc(1, sizeof *e);
    if (e == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *ev = (CUevent)e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent ev) {
    REQUIRE_INIT();
    if (ev == NULL) return CUDA_ERROR_INVALID_HANDLE;
    free(ev);
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent ev, CUstream h, int ptds) {
    REQUIRE_INIT();
    fake_event *e = (fake_event *)ev;
    if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
    fake_stream *s = stream_of(h, ptds);
    pthread_mutex_lock(&s->lock);
    if (s->capture == NULL) {
        e->ts = s->tail; /* refined to the next kernel's start if one follows (run_kernels) */
        e->recorded = 1;
        s->pending_begin = e;
    }
    pthread_mutex_unlock(&s->lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent ev, CUstream h) { return event_record(ev, h, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent ev, CUstream h) { return event_record(ev, h, 1); }

static uint64_t event_time(const fake_event *e) { return __atomic_load_n(&e->ts, __ATOMIC_ACQUIRE); }

EXPORT CUresult cuEventQuery(CUevent ev) {
    REQUIRE_INIT();
    fake_event *e = (fake_event *)ev;
    if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
    return reached(event_time(e)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent ev) {
    REQUIRE_INIT();
    fake_event *e = (fake_event *)ev;
    if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
    sleep_until(event_time(e));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end) {
    REQUIRE_INIT();
    fake_event *a = (fake_event *)start, *b = (fake_event *)end;
    if (ms == NULL || a == NULL || b == NULL || !a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t ta = event_time(a), tb = event_time(b);
    if (!reached(ta) || !reached(tb)) return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(tb - ta)) / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) { return cuEventElapsedTime_v2(ms, start, end); }

/* ---- launches ---------------------------------------------------------------------------------- */

static uint64_t g_default_kernel_ns;

static uint64_t kernel_ns(void **params) {
    if (params != NULL && params[0] != NULL) return *(const uint64_t *)params[0];
    uint64_t d = __atomic_load_n(&g_default_kernel_ns, __ATOMIC_RELAXED);
    if (d == 0) {
        const char *v = getenv("FAKE_CUDA_KERNEL_NS");
        d = v != NULL ? strtoull(v, NULL, 10) : 10000;
        if (d == 0) d = 1;
        __atomic_store_n(&g_default_kernel_ns, d, __ATOMIC_RELAXED);
    }
    return d;
}

/* Queue `ns` of GPU work on stream `s` (locked by the caller): it starts when both the stream
 * and the device's engine are free, and the engine is taken until it ends. */
static void run_kernels(fake_stream *s, uint64_t ns, uint64_t count) {
    fake_proc *self = self_entry();
    ckpt_gate(self);
    fake_device *d = &g_state->devices[s->dev];
    uint64_t now = now_ns();
    uint64_t start, end;
    uint64_t busy = __atomic_load_n(&d->busy_until_ns, __ATOMIC_RELAXED);
    do {
        start = now > s->tail ? now : s->tail;
        if (busy > start) start = busy;
        end = start + ns;
    } while (!__atomic_compare_exchange_n(&d->busy_until_ns, &busy, end, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
    if (s->pending_begin != NULL) {
        __atomic_store_n(&s->pending_begin->ts, start, __ATOMIC_RELEASE);
        s->pending_begin = NULL;
    }
    s->tail = end;
    note_tail(end);
    __atomic_fetch_add(&d->busy_ns_total, ns, __ATOMIC_RELAXED);
    if (self != NULL) {
        __atomic_fetch_add(&self->busy_ns[s->dev], ns, __ATOMIC_RELAXED);
        __atomic_fetch_add(&self->launches, count, __ATOMIC_RELAXED);
    }
}

static CUresult launch(CUfunction f, CUstream h, void **params, int ptds) {
    REQUIRE_INIT();
    if (f == NULL) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t ns = kernel_ns(params);
    fake_stream *s = stream_of(h, ptds);
    pthread_mutex_lock(&s->lock);
    if (s->capture != NULL)
        graph_add(s->capture, (fake_node){NODE_KERNEL, ns, 0, s->dev});
    else
        run_kernels(s, ns, 1);
    pthread_mutex_unlock(&s->lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, CUstream h, void **params, void **extra) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)extra;
    return launch(f, h, params, 0);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shared, CUstream h, void **params, void **extra) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)extra;
    return launch(f, h, params, 1);
}

/* The same function under a name the shim does not hook: the benchmark's "direct" baseline. */
EXPORT CUresult fake_direct_cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                           unsigned, CUstream, void **, void **)
    __attribute__((alias("cuLaunchKernel")));

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    (void)extra;
    if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->hStream, params, 0);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    (void)extra;
    if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->hStream, params, 1);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shared, CUstream h, void **params) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
    return launch(f, h, params, 0);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shared, CUstream h, void **params) {
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
    return launch(f, h, params, 1);
}

/* ---- graphs -------------------------------------------------------------------------------------- */

static CUresult instantiate(CUgraphExec *exec, CUgraph graph) {
    REQUIRE_INIT();
    fake_graph *g = (fake_graph *)graph;
    if (exec == NULL || g == NULL) return CUDA_ERROR_INVALID_VALUE;
    fake_graph *copy = calloc(1, sizeof *copy);
    if (copy == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < g->count; i++) graph_add(copy, g->nodes[i]);
    *exec = (CUgraphExec)copy;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    (void)flags;
    return instantiate(exec, graph);
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    (void)p;
    return instantiate(exec, graph);
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    (void)p;
    return instantiate(exec, graph);
}

static void graph_free(fake_graph *g) {
    while (g != NULL) {
        graph_free(g->moved);
        fake_graph *next = g->moved_next;
        free(g->nodes);
        free(g);
        g = next;
    }
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
    REQUIRE_INIT();
    graph_free((fake_graph *)exec);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(CUgraph graph) {
    REQUIRE_INIT();
    fake_graph *g = (fake_graph *)graph;
    if (g == NULL || g->owned) return CUDA_ERROR_INVALID_VALUE; /* a moved child is its parent's */
    graph_free(g);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags) {
    REQUIRE_INIT();
    if (graph == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    fake_graph *g = calloc(1, sizeof *g);
    if (g == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *graph = (CUgraph)g;
    return CUDA_SUCCESS;
}

static CUgraphNode new_node(void) {
    static uint64_t seq;
    return (CUgraphNode)(uintptr_t)__atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
}

/* An allocation node: its address now, its memory when the graph is launched. */
static CUresult add_alloc_node(CUgraphNode *node, fake_graph *g, const CUmemPoolProps *props, size_t size,
                               CUdeviceptr *dptr) {
    REQUIRE_INIT();
    if (node == NULL || g == NULL || g->owned || size == 0 || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_dev(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t va = reserve_va(size);
    graph_add(g, (fake_node){NODE_ALLOC, va, size, props->location.id});
    *dptr = (CUdeviceptr)va;
    *node = new_node();
    return CUDA_SUCCESS;
}

static CUresult add_free_node(CUgraphNode *node, fake_graph *g, CUdeviceptr dptr) {
    REQUIRE_INIT();
    if (node == NULL || g == NULL || g->owned || dptr == 0) return CUDA_ERROR_INVALID_VALUE;
    graph_add(g, (fake_node){NODE_FREE, (uint64_t)dptr, 0, 0});
    *node = new_node();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    (void)deps, (void)ndeps;
    if (params == NULL) return CUDA_ERROR_INVALID_VALUE;
    return add_alloc_node(node, (fake_graph *)graph, &params->poolProps, params->bytesize, &params->dptr);
}

EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                      CUdeviceptr dptr) {
    (void)deps, (void)ndeps;
    return add_free_node(node, (fake_graph *)graph, dptr);
}

/* Memory nodes, and a child graph moved into its parent (its nodes run as the parent's); other
 * node types are accepted and do nothing. */
static CUresult add_node(CUgraphNode *node, CUgraph graph, CUgraphNodeParams *p) {
    REQUIRE_INIT();
    fake_graph *g = (fake_graph *)graph, *child;
    if (p == NULL || node == NULL || g == NULL) return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: return add_alloc_node(node, g, &p->alloc.poolProps, p->alloc.bytesize, &p->alloc.dptr);
    case CU_GRAPH_NODE_TYPE_MEM_FREE: return add_free_node(node, g, p->free.dptr);
    case CU_GRAPH_NODE_TYPE_GRAPH:
        child = (fake_graph *)p->graph.graph;
        if (child == NULL || child == g || child->owned) return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < child->count; i++) {
            if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE && child->nodes[i].type != NODE_KERNEL)
                return CUDA_ERROR_INVALID_VALUE; /* a cloned child may not hold memory nodes */
        }
        for (size_t i = 0; i < child->count; i++) graph_add(g, child->nodes[i]);
        if (p->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE) {
            child->owned = 1;
            child->moved_next = g->moved;
            g->moved = child;
        }
        break;
    default: break;
    }
    *node = new_node();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                               CUgraphNodeParams *params) {
    (void)deps, (void)ndeps;
    return add_node(node, graph, params);
}

EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                  const CUgraphEdgeData *edges, size_t ndeps, CUgraphNodeParams *params) {
    (void)deps, (void)edges, (void)ndeps;
    return add_node(node, graph, params);
}

#if CUDA_VERSION >= 13040
EXPORT CUresult cuGraphAddNode_v3(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                  const CUgraphEdgeData *edges, size_t ndeps, CUgraphNodeParams *params) {
    (void)deps, (void)edges, (void)ndeps;
    return add_node(node, graph, params);
}
#endif

/* The driver does not clone a graph with memory nodes (CUDA_ERROR_NOT_SUPPORTED, measured). */
EXPORT CUresult cuGraphClone(CUgraph *clone, CUgraph original) {
    REQUIRE_INIT();
    fake_graph *g = (fake_graph *)original;
    if (clone == NULL || g == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g->count; i++)
        if (g->nodes[i].type != NODE_KERNEL) return CUDA_ERROR_NOT_SUPPORTED;
    fake_graph *copy = calloc(1, sizeof *copy);
    if (copy == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < g->count; i++) graph_add(copy, g->nodes[i]);
    *clone = (CUgraph)copy;
    return CUDA_SUCCESS;
}

/* Memory nodes allocate when the graph runs and free at its free nodes; kernels run back to back.
 * A graph whose allocation is still live cannot run again (CUDA_ERROR_INVALID_VALUE, as the
 * driver); a launch that cannot allocate everything allocates nothing. */
static CUresult graph_launch(CUgraphExec exec, CUstream h, int ptds) {
    REQUIRE_INIT();
    fake_graph *g = (fake_graph *)exec;
    if (g == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint64_t ns = 0, kernels = 0;
    int live = 0;
    pthread_mutex_lock(&g_map_lock);
    for (size_t i = 0; i < g->count && !live; i++)
        live = g->nodes[i].type == NODE_ALLOC && nn_ptrmap_find(&g_allocs, g->nodes[i].value) != NULL;
    pthread_mutex_unlock(&g_map_lock);
    if (live) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g->count; i++) {
        fake_node *n = &g->nodes[i];
        if (n->type == NODE_ALLOC) {
            CUresult rc = alloc_at(n->value, n->size, n->dev, &g_allocs);
            if (rc != CUDA_SUCCESS) {
                for (size_t j = 0; j < i; j++)
                    if (g->nodes[j].type == NODE_ALLOC) free_at(g->nodes[j].value, &g_allocs);
                return rc;
            }
        } else if (n->type == NODE_FREE) {
            free_at(n->value, &g_allocs);
        } else {
            ns += n->value;
            kernels++;
        }
    }
    fake_stream *s = stream_of(h, ptds);
    pthread_mutex_lock(&s->lock);
    if (kernels > 0) run_kernels(s, ns, kernels);
    pthread_mutex_unlock(&s->lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream h) { return graph_launch(exec, h, 0); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream h) { return graph_launch(exec, h, 1); }

/* ---- checkpoint API ------------------------------------------------------------------------------ */

static CUresult ckpt_transition(int pid, uint32_t from, uint32_t to, int move_memory) {
    REQUIRE_INIT();
    fake_state_lock(g_state);
    fake_proc *p = fake_state_find(g_state, pid);
    CUresult rc = CUDA_SUCCESS;
    if (p == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (p->ckpt_state != from) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        for (unsigned d = 0; d < FAKE_MAX_DEVICES && move_memory != 0; d++) {
            fake_device *dev = &g_state->devices[d];
            if (move_memory > 0) { /* checkpoint: device memory out to the host */
                p->checkpointed[d] = p->used[d];
                dev->used_bytes -= p->used[d];
                p->used[d] = 0;
            } else {
                /* the room of processes that exited is free again, as in the driver */
                if (dev->used_bytes + p->checkpointed[d] > dev->total_bytes) fake_state_reap(g_state);
                if (dev->used_bytes + p->checkpointed[d] > dev->total_bytes)
                    rc = CUDA_ERROR_OUT_OF_MEMORY; /* restore needs the room back */
            }
        }
        if (move_memory < 0 && rc == CUDA_SUCCESS) {
            for (unsigned d = 0; d < FAKE_MAX_DEVICES; d++) {
                p->used[d] = p->checkpointed[d];
                g_state->devices[d].used_bytes += p->checkpointed[d];
                if (g_state->devices[d].used_bytes > g_state->devices[d].peak_bytes)
                    g_state->devices[d].peak_bytes = g_state->devices[d].used_bytes;
                p->checkpointed[d] = 0;
            }
        }
        if (rc == CUDA_SUCCESS) __atomic_store_n(&p->ckpt_state, to, __ATOMIC_RELEASE);
    }
    fake_state_unlock(g_state);
    return rc;
}

EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
    (void)args;
    return ckpt_transition(pid, FAKE_CKPT_RUNNING, FAKE_CKPT_LOCKED, 0);
}

EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
    (void)args;
    return ckpt_transition(pid, FAKE_CKPT_LOCKED, FAKE_CKPT_CHECKPOINTED, 1);
}

EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
    (void)args;
    return ckpt_transition(pid, FAKE_CKPT_CHECKPOINTED, FAKE_CKPT_LOCKED, -1);
}

EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
    (void)args;
    return ckpt_transition(pid, FAKE_CKPT_LOCKED, FAKE_CKPT_RUNNING, 0);
}

EXPORT CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state) {
    REQUIRE_INIT();
    if (state == NULL) return CUDA_ERROR_INVALID_VALUE;
    fake_state_lock(g_state);
    fake_proc *p = fake_state_find(g_state, pid);
    if (p != NULL) *state = (CUprocessState)p->ckpt_state;
    fake_state_unlock(g_state);
    return p != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
    REQUIRE_INIT();
    if (tid == NULL) return CUDA_ERROR_INVALID_VALUE;
    fake_state_lock(g_state);
    int known = fake_state_find(g_state, pid) != NULL;
    fake_state_unlock(g_state);
    if (!known) return CUDA_ERROR_INVALID_VALUE;
    *tid = pid; /* the fake restores on the process's main thread */
    return CUDA_SUCCESS;
}

/* ---- errors, export tables ------------------------------------------------------------------------ */

EXPORT CUresult cuGetErrorString(CUresult error, const char **str) {
    if (str == NULL) return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *str = "no error"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "initialization error"; break;
    default: *str = "unknown error"; break;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **str) {
    if (str == NULL) return CUDA_ERROR_INVALID_VALUE;
    *str = error == CUDA_SUCCESS ? "CUDA_SUCCESS" : error == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
                                                                                     : "CUDA_ERROR_UNKNOWN";
    return CUDA_SUCCESS;
}

/* Private tables the runtime asks for by UUID; the fake has one, the same for every id. */
static const uintptr_t g_export_table[4] = {sizeof g_export_table, 0x5eed, 0, 0};

EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    if (table == NULL || id == NULL) return CUDA_ERROR_INVALID_VALUE;
    *table = g_export_table;
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress -------------------------------------------------------------------------------- */

/* What a real 580 driver hands out for "cuGraphInstantiate" from CUDA 12.0 on: an entry point of
 * its own (no exported symbol) with cuGraphInstantiateWithFlags' ABI (seen on an H100). */
static CUresult graph_instantiate_internal(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    return cuGraphInstantiateWithFlags(exec, graph, flags);
}

typedef struct proc_entry {
    const char *name;   /* base name the caller asks for */
    int min_version;    /* first CUDA version (1000*major + 10*minor) that has this variant */
    void *legacy;       /* default-stream variant */
    void *per_thread;   /* _ptsz/_ptds variant, or NULL when the same */
} proc_entry;

#define E(n, v, f) {n, v, (void *)(f), NULL}
#define P(n, v, f) {n, v, (void *)(f), (void *)(f##_ptsz)}
/* Newest variant first: the first entry whose min_version the caller reaches wins. */
static const proc_entry g_procs[] = {
    E("cuInit", 2000, cuInit), E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuDeviceGet", 2000, cuDeviceGet), E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGetName", 2000, cuDeviceGetName), E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    E("cuDeviceGetUuid", 9020, cuDeviceGetUuid), E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuCtxCreate", 12050, cuCtxCreate_v4), E("cuCtxCreate", 11040, cuCtxCreate_v3),
    E("cuCtxCreate", 3020, cuCtxCreate_v2), E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent), E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice), E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuMemAlloc", 3020, cuMemAlloc_v2), E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged), E("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync), P("cuMemFreeAsync", 11020, cuMemFreeAsync),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    E("cuMemPoolCreate", 11020, cuMemPoolCreate), E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    E("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo), E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    E("cuMemCreate", 10020, cuMemCreate), E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemAddressReserve", 10020, cuMemAddressReserve), E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemMap", 10020, cuMemMap), E("cuMemUnmap", 10020, cuMemUnmap), E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    E("cuArrayCreate", 3020, cuArrayCreate_v2), E("cuArrayCreate", 2000, cuArrayCreate),
    E("cuArray3DCreate", 3020, cuArray3DCreate_v2), E("cuArray3DCreate", 2000, cuArray3DCreate),
    E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate), E("cuArrayDestroy", 2000, cuArrayDestroy),
    E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    E("cuCtxSetLimit", 3010, cuCtxSetLimit), E("cuCtxGetLimit", 3010, cuCtxGetLimit),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuStreamCreate", 2000, cuStreamCreate), E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize), P("cuStreamQuery", 2000, cuStreamQuery),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2), P("cuStreamEndCapture", 10000, cuStreamEndCapture),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    P("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3),
    E("cuEventCreate", 2000, cuEventCreate), E("cuEventDestroy", 4000, cuEventDestroy_v2),
    P("cuEventRecord", 2000, cuEventRecord), E("cuEventQuery", 2000, cuEventQuery),
    E("cuEventSynchronize", 2000, cuEventSynchronize), E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    E("cuEventElapsedTime", 2000, cuEventElapsedTime),
    P("cuLaunchKernel", 4000, cuLaunchKernel), P("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    E("cuGraphInstantiate", 12000, graph_instantiate_internal), E("cuGraphInstantiate", 11040, cuGraphInstantiateWithFlags),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    P("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy), E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuGraphCreate", 10000, cuGraphCreate), E("cuGraphClone", 10000, cuGraphClone),
    E("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode), E("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode),
#if CUDA_VERSION >= 13040
    E("cuGraphAddNode", 13040, cuGraphAddNode_v3),
#endif
    E("cuGraphAddNode", 12030, cuGraphAddNode_v2),
    E("cuGraphAddNode", 12020, cuGraphAddNode),
    P("cuGraphLaunch", 10000, cuGraphLaunch),
    E("cuCheckpointProcessLock", 12080, cuCheckpointProcessLock),
    E("cuCheckpointProcessCheckpoint", 12080, cuCheckpointProcessCheckpoint),
    E("cuCheckpointProcessRestore", 12080, cuCheckpointProcessRestore),
    E("cuCheckpointProcessUnlock", 12080, cuCheckpointProcessUnlock),
    E("cuCheckpointProcessGetState", 12080, cuCheckpointProcessGetState),
    E("cuCheckpointProcessGetRestoreThreadId", 12080, cuCheckpointProcessGetRestoreThreadId),
    E("cuGetErrorString", 6000, cuGetErrorString), E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetExportTable", 3000, cuGetExportTable),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2), E("cuGetProcAddress", 11030, cuGetProcAddress),
};
#undef E
#undef P

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int found_older = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const proc_entry *e = &g_procs[i];
        if (strcmp(e->name, symbol) != 0) continue;
        if (version < e->min_version) {
            found_older = 1;
            continue;
        }
        *pfn = (per_thread && e->per_thread != NULL) ? e->per_thread : e->legacy;
        if (status != NULL) *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    *pfn = NULL;
    if (status != NULL)
        *status = found_older ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
