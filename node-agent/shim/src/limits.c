/*
 * limits.c — context limits that reserve device memory: cuCtxSetLimit with
 * CU_LIMIT_MALLOC_HEAP_SIZE (bytes of the device malloc() heap), CU_LIMIT_PRINTF_FIFO_SIZE (bytes
 * of the printf() FIFO) and CU_LIMIT_STACK_SIZE (bytes per thread, reserved for every thread the
 * device can hold: value x CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT x
 * CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, exactly what an H100 reserved when measured).
 *
 * The increase over the context's current value (cuCtxGetLimit) is charged before the driver's
 * call and refused with CUDA_ERROR_OUT_OF_MEMORY when it does not fit; after the call the charge
 * is settled to the value the driver really set (it rounds: the stack to 16 bytes, the heap to
 * 8 KiB). A decrease gives back, after the call, what earlier increases of that context and limit
 * charged (never more). The defaults each context starts with are context memory, not charged.
 * Other limits pass through.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "arraysize.h"

#define NN_LIMIT_KINDS 3 /* stack, printf FIFO, malloc heap */

typedef struct nn_ctx_limits {
    CUcontext ctx;
    int dev;                          /* region entry of the context's device */
    uint64_t charged[NN_LIMIT_KINDS]; /* bytes charged for raising each limit */
} nn_ctx_limits;

/* Held across the whole get / charge / set / settle of one cuCtxSetLimit, so concurrent sets of
 * one context cannot both charge the same increase (the region lock is taken inside it). */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static nn_ctx_limits *g_ctxs;
static size_t g_count, g_cap;

static int limit_kind(CUlimit limit) {
    switch (limit) {
    case CU_LIMIT_STACK_SIZE: return 0;
    case CU_LIMIT_PRINTF_FIFO_SIZE: return 1;
    case CU_LIMIT_MALLOC_HEAP_SIZE: return 2;
    default: return -1;
    }
}

/* The device memory a limit of `value` reserves; UINT64_MAX when it cannot be told. */
static uint64_t reserved_bytes(CUlimit limit, size_t value, CUdevice dev) {
    if (limit != CU_LIMIT_STACK_SIZE) return value;
    int sms = 0, per_sm = 0;
    if (nn_real.cuDeviceGetAttribute == NULL ||
        nn_real.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
        nn_real.cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS ||
        sms <= 0 || per_sm <= 0)
        return UINT64_MAX;
    return nn_sat_mul(nn_sat_mul(value, (uint64_t)sms), (uint64_t)per_sm);
}

/* This context's record (created on first use); NULL when out of host memory. Under g_lock. */
static nn_ctx_limits *ctx_limits(CUcontext ctx, int dev) {
    for (size_t i = 0; i < g_count; i++)
        if (g_ctxs[i].ctx == ctx) return &g_ctxs[i];
    if (g_count == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 8;
        nn_ctx_limits *more = realloc(g_ctxs, cap * sizeof *more);
        if (more == NULL) return NULL;
        g_ctxs = more;
        g_cap = cap;
    }
    g_ctxs[g_count] = (nn_ctx_limits){ctx, dev, {0, 0, 0}};
    return &g_ctxs[g_count++];
}

/* The driver took the new value: from `charged_up` (charged before the call for the increase
 * from `before` to the requested value) to what the value it really set reserves. */
static CUresult settle(nn_ctx_limits *c, int kind, CUlimit limit, size_t old_value, CUdevice cudev,
                       uint64_t before, uint64_t charged_up) {
    size_t value = 0;
    if (nn_real.cuCtxGetLimit(&value, limit) != CUDA_SUCCESS) { /* keep what was charged */
        c->charged[kind] += charged_up;
        return CUDA_SUCCESS;
    }
    uint64_t now = reserved_bytes(limit, value, cudev);
    uint64_t up = now > before ? now - before : 0;
    if (up > charged_up && nn_charge(c->dev, up - charged_up) != CUDA_SUCCESS) {
        nn_real.cuCtxSetLimit(limit, old_value); /* the driver rounded above what fits: undo */
        nn_uncharge(c->dev, charged_up);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (up < charged_up) nn_uncharge(c->dev, charged_up - up);
    c->charged[kind] += up;
    if (now < before) { /* a decrease: give back what earlier increases charged, no more */
        uint64_t back = before - now < c->charged[kind] ? before - now : c->charged[kind];
        nn_uncharge(c->dev, back);
        c->charged[kind] -= back;
    }
    return CUDA_SUCCESS;
}

NN_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    NN_REQUIRE(nn_real.cuCtxSetLimit);
    int kind = limit_kind(limit);
    if (kind < 0) return nn_real.cuCtxSetLimit(limit, value);
    CUcontext ctx = NULL;
    CUdevice cudev;
    size_t old_value = 0;
    if (nn_real.cuCtxGetCurrent == NULL || nn_real.cuCtxGetDevice == NULL || nn_real.cuCtxGetLimit == NULL)
        return CUDA_ERROR_NOT_SUPPORTED; /* cannot tell what it would reserve: refused, never unaccounted */
    CUresult rc = nn_real.cuCtxGetCurrent(&ctx);
    if (rc == CUDA_SUCCESS && ctx == NULL) return nn_real.cuCtxSetLimit(limit, value); /* no context: the driver's error */
    if (rc == CUDA_SUCCESS) rc = nn_real.cuCtxGetDevice(&cudev);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_lock);
    rc = nn_real.cuCtxGetLimit(&old_value, limit);
    nn_ctx_limits *c = rc == CUDA_SUCCESS ? ctx_limits(ctx, nn_device_entry_of(cudev)) : NULL;
    if (c == NULL) {
        pthread_mutex_unlock(&g_lock);
        return rc != CUDA_SUCCESS ? rc : CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t before = reserved_bytes(limit, old_value, cudev), want = reserved_bytes(limit, value, cudev);
    if (before == UINT64_MAX) before = 0; /* the stack's multiplier unknown: any set is refused below */
    uint64_t up = want > before ? want - before : 0;
    rc = up > 0 ? nn_charge(c->dev, up) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) {
        rc = nn_real.cuCtxSetLimit(limit, value);
        if (rc != CUDA_SUCCESS) nn_uncharge(c->dev, up);
        else rc = settle(c, kind, limit, old_value, cudev, before, up);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

void nn_limits_after_fork(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&g_lock, &fresh, sizeof fresh);
    free(g_ctxs);
    g_ctxs = NULL;
    g_count = g_cap = 0;
}
