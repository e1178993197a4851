/*
 * launch.c — compute: pacing by measured kernel time, pause/resume, stream capture, and the
 * launch family (cuLaunchKernel[Ex], cooperative launches, cuGraphLaunch, each with its _ptsz).
 *
 * Pacing. Each launch on a paced device (compute share < 100 %, not MIG) is bracketed by two
 * events; once the end event completes, the kernel's GPU time is added to this process's slot
 * (kernel_ns[dev], for the pacing window window_index) and to the device's kernel_ns_total. The
 * container may use share x window of GPU time per window (10 ms by default): before a launch
 * the shim sums the container's measured time in the current window over all live slots, plus
 * what this process has in flight (estimated from its measured kernels), and holds the launch
 * until the next window while the sum has reached the allowance. A kernel that overruns the
 * allowance (a 5 ms kernel at 10 % is five windows' worth) is carried into the following
 * windows as debt, so the long-run share is exact although single windows are not.
 *
 * Never while capturing: a launch into a stream being captured records a graph node, it runs
 * nothing, so it is neither timed nor held (the graph is paced when launched; capture tracking is
 * in graphmem.c).
 *
 * Pause: while the agent's NN_CTL_PAUSED is set, launches are held (polled every 100 us).
 */
#define _GNU_SOURCE
#include "shim.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NN_RING 512                      /* launches in flight per process, at most */
#define NN_POLL_NS UINT64_C(100000)      /* pause / in-flight polling period */

typedef struct nn_timing {
    CUevent begin, end;
    int dev;
    uint64_t estimate_ns;  /* what it counted as while in flight */
    uint64_t *transient;   /* graph memory to give back when it ends (NULL = none) */
} nn_timing;

/* Guards the ring and the pacing state. A spin lock: held for a few stores around a launch (never
 * while sleeping), so a waiter yields rather than parks; two atomics, cheaper than a mutex. */
static int g_pace_lock;

static void pace_lock(void) {
    while (__atomic_exchange_n(&g_pace_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
}

static void pace_unlock(void) { __atomic_store_n(&g_pace_lock, 0, __ATOMIC_RELEASE); }
static nn_timing g_ring[NN_RING];
static unsigned g_head, g_count;
static CUevent g_event_pool[2 * NN_RING];
static unsigned g_event_pool_count;
static uint64_t g_inflight_ns[NN_MAX_DEVICES]; /* sum of estimates of unfinished launches */
static uint64_t g_estimate_ns[NN_MAX_DEVICES]; /* moving average of measured kernels (0 = none yet) */
static unsigned g_slot_high = NN_MAX_PROCS;    /* slots above this are free (refreshed every window) */
/* What the last check left of the allowance, spent launch by launch (by the estimate) without
 * reading the clock or the other slots; at zero the next launch checks again. Other processes of
 * the container spend concurrently: an overrun that causes becomes debt like any other. */
static int64_t g_credit_ns[NN_MAX_DEVICES];
static uint32_t g_credit_share[NN_MAX_DEVICES];
/* Allowance left unused in earlier windows (we woke late, or queued behind another container's
 * kernels), usable later: a token bucket on top of the per-window allowance, so the long-run share
 * holds in both directions (overruns are carried as debt in kernel_ns). A process that was busy
 * (measured or owed time) keeps up to NN_BANK_WINDOWS windows of it, which absorbs late wake-ups
 * on a loaded CPU; an idle one fills up to one window, so a burst after idling stays short. */
#define NN_BANK_WINDOWS 4
static uint64_t g_bank_ns[NN_MAX_DEVICES];

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    nanosleep(&ts, NULL);
}

/* ---- measuring ---------------------------------------------------------------------------------------- */

static CUevent event_get(void) {
    if (g_event_pool_count > 0) return g_event_pool[--g_event_pool_count];
    CUevent e = NULL;
    if (nn_real.cuEventCreate == NULL || nn_real.cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
    return e;
}

static void event_put(CUevent e) {
    if (e == NULL) return;
    if (g_event_pool_count < 2 * NN_RING) g_event_pool[g_event_pool_count++] = e;
    else if (nn_real.cuEventDestroy_v2 != NULL) nn_real.cuEventDestroy_v2(e);
}

static nn_proc_slot *my_slot(void) { return &nn_g.region->state->procs[nn_g.slot]; }

static uint64_t window_ns(void) {
    uint64_t w = __atomic_load_n(&nn_g.region->control->container.pacing_window_ns, __ATOMIC_RELAXED);
    return w != 0 ? w : NN_DEFAULT_PACING_WINDOW_NS;
}

static uint64_t allowance_ns(int dev, uint64_t window) { return window / 100 * nn_device_share(dev); }

static int slot_live(const nn_proc_slot *s) {
    return __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == NN_SLOT_ACTIVE;
}

/* The container's measured GPU time on `dev` in window `w` (all live slots). */
static uint64_t window_usage(int dev, uint64_t w) {
    uint64_t sum = 0;
    for (unsigned i = 0; i < g_slot_high; i++) {
        const nn_proc_slot *s = &nn_g.region->state->procs[i];
        if (slot_live(s) && __atomic_load_n(&s->window_index, __ATOMIC_ACQUIRE) == w)
            sum += __atomic_load_n(&s->kernel_ns[dev], __ATOMIC_RELAXED);
    }
    return sum;
}

/* Move our slot to window `w`, keeping our part of the container's overrun as debt. */
static void roll_window(uint64_t w, uint64_t window) {
    nn_proc_slot *me = my_slot();
    uint64_t old = __atomic_load_n(&me->window_index, __ATOMIC_RELAXED);
    if (old == w) return;
    unsigned high = 0;
    for (unsigned i = 0; i < NN_MAX_PROCS; i++)
        if (__atomic_load_n(&nn_g.region->state->procs[i].state, __ATOMIC_RELAXED) != NN_SLOT_FREE) high = i + 1;
    g_slot_high = high;
    for (int d = 0; d < (int)NN_MAX_DEVICES; d++) {
        uint64_t mine = __atomic_load_n(&me->kernel_ns[d], __ATOMIC_RELAXED);
        uint64_t allowance = allowance_ns(d, window);
        uint64_t elapsed = w > old ? w - old : 1;
        uint64_t bank = g_bank_ns[d];
        g_credit_ns[d] = 0;
        if (mine == 0) { /* idle here: the bucket fills, up to one window */
            g_bank_ns[d] = bank + allowance * elapsed < allowance ? bank + allowance * elapsed : allowance;
            continue;
        }
        uint64_t total = window_usage(d, old);
        if (total < mine) total = mine;
        double part = (double)mine / (double)total; /* our part of the container's use */
        uint64_t allowed = allowance * elapsed + bank;
        if (total > allowed) { /* overrun: debt, paid from the next windows' allowance */
            __atomic_store_n(&me->kernel_ns[d], (uint64_t)((double)(total - allowed) * part), __ATOMIC_RELAXED);
            g_bank_ns[d] = 0;
        } else { /* underrun: usable later (we were busy but late: up to NN_BANK_WINDOWS) */
            __atomic_store_n(&me->kernel_ns[d], 0, __ATOMIC_RELAXED);
            uint64_t left = (uint64_t)((double)(allowed - total) * part);
            g_bank_ns[d] = left < allowance * NN_BANK_WINDOWS ? left : allowance * NN_BANK_WINDOWS;
        }
    }
    __atomic_store_n(&me->window_index, w, __ATOMIC_RELEASE);
}

/* Fold finished launches into the region. Caller holds g_pace_lock. */
static void harvest(void) {
    if (g_count == 0) return;
    uint64_t window = window_ns();
    roll_window(nn_now_ns() / window, window);
    uint64_t measured[NN_MAX_DEVICES] = {0}; /* published once per harvest, not per launch */
    int any[NN_MAX_DEVICES] = {0};
    while (g_count > 0) {
        nn_timing *t = &g_ring[g_head];
        float ms = 0;
        CUresult rc = nn_real.cuEventElapsedTime_v2(&ms, t->begin, t->end); /* NOT_READY until it ends */
        if (rc == CUDA_ERROR_NOT_READY) break;
        uint64_t ns = rc == CUDA_SUCCESS && ms > 0 ? (uint64_t)(ms * 1e6) : 0;
        if (t->dev >= 0) {
            measured[t->dev] += ns;
            any[t->dev] = 1;
            g_inflight_ns[t->dev] -= t->estimate_ns < g_inflight_ns[t->dev] ? t->estimate_ns : g_inflight_ns[t->dev];
            uint64_t est = g_estimate_ns[t->dev];
            g_estimate_ns[t->dev] = est == 0 ? (ns ? ns : 1) : (est * 7 + ns) / 8 + 1;
        }
        if (t->transient != NULL) {
            nn_release_transient(t->transient);
            free(t->transient);
        }
        event_put(t->begin);
        event_put(t->end);
        t->transient = NULL;
        g_head = (g_head + 1) % NN_RING;
        g_count--;
    }
    nn_proc_slot *me = my_slot();
    for (int d = 0; d < (int)NN_MAX_DEVICES; d++) {
        if (!any[d]) continue;
        __atomic_store_n(&me->kernel_ns[d], me->kernel_ns[d] + measured[d], __ATOMIC_RELEASE);
        __atomic_fetch_add(&nn_g.region->state->devices[d].kernel_ns_total, measured[d], __ATOMIC_RELAXED);
    }
}

/* ---- holding launches -------------------------------------------------------------------------------- */

static int paused(void) {
    return (__atomic_load_n(&nn_g.region->control->container.control, __ATOMIC_ACQUIRE) & NN_CTL_PAUSED) != 0;
}

static void hold_while_paused(int dev) {
    uint64_t start = 0;
    while (paused()) {
        if (start == 0) start = nn_now_ns();
        sleep_ns(NN_POLL_NS);
    }
    if (start != 0 && dev >= 0)
        __atomic_fetch_add(&nn_g.region->state->devices[dev].throttled_ns_total, nn_now_ns() - start, __ATOMIC_RELAXED);
}

/* Wait until the container may launch on `dev`. Caller holds g_pace_lock (released while sleeping). */
static void wait_for_allowance(int dev) {
    for (;;) {
        harvest();
        uint64_t window = window_ns();
        uint64_t now = nn_now_ns();
        uint64_t w = now / window;
        roll_window(w, window);
        int first = g_estimate_ns[dev] == 0;
        uint64_t used = window_usage(dev, w) + g_inflight_ns[dev];
        uint64_t allowance = allowance_ns(dev, window) + g_bank_ns[dev];
        /* until one kernel was measured, one in flight at a time */
        int allowed = first ? g_inflight_ns[dev] == 0 && g_count == 0 : used < allowance;
        if (allowed && g_count < NN_RING && !paused()) {
            g_credit_ns[dev] = first ? 0 : (int64_t)(allowance - used);
            g_credit_share[dev] = nn_device_share(dev);
            return;
        }
        uint64_t until_next = (w + 1) * window - now;
        uint64_t nap = (g_count > 0 && g_inflight_ns[dev] > 0 && until_next > NN_POLL_NS) ? NN_POLL_NS : until_next;
        if (!allowed && g_inflight_ns[dev] == 0 && !first) nap = until_next; /* measured time is spent */
        pace_unlock();
        if (paused()) hold_while_paused(dev);
        else sleep_ns(nap);
        __atomic_fetch_add(&nn_g.region->state->devices[dev].throttled_ns_total, nap, __ATOMIC_RELAXED);
        pace_lock();
    }
}

/* ---- the launch path ------------------------------------------------------------------------------------ */

typedef CUresult (*nn_launch_call)(void *ctx);

/* Launch on `stream`: held while paused or over the share, timed when paced. `transient` is graph
 * memory to give back when the launch ends (ownership passes here). */
static CUresult launch(CUstream stream, int ptds, nn_launch_call call, void *ctx, uint64_t *transient) {
    CUresult rc = nn_ready();
    if (NN_UNLIKELY(rc != CUDA_SUCCESS)) {
        free(transient);
        return rc;
    }
    (void)nn_region_poll_orders(nn_g.region); /* one load unless the agent ordered a reclaim */
    if (NN_UNLIKELY(nn_capturing(stream, ptds))) return call(ctx); /* a graph node: runs nothing now */
    int dev = nn_current_entry();
    if (NN_UNLIKELY(paused())) hold_while_paused(dev);
    uint32_t share = dev >= 0 ? nn_device_share(dev) : 100;
    int paced = share < 100;
    if (!paced && transient == NULL && __atomic_load_n(&g_count, __ATOMIC_RELAXED) == 0) return call(ctx);
    __typeof__(nn_real.cuEventRecord) record = ptds ? nn_real.cuEventRecord_ptsz : nn_real.cuEventRecord;
    pace_lock();
    if (paced) {
        /* fast path: credit left from the last check, room in the ring, the same share */
        if (g_credit_ns[dev] <= 0 || g_count >= NN_RING - 1 || g_credit_share[dev] != share)
            wait_for_allowance(dev);
        g_credit_ns[dev] -= (int64_t)g_estimate_ns[dev];
    } else {
        harvest(); /* settle earlier timed launches (graph memory) */
    }
    if (!paced && (transient == NULL || dev < 0)) {
        pace_unlock();
        if (transient != NULL) {
            nn_release_transient(transient);
            free(transient);
        }
        return call(ctx);
    }
    CUevent begin = event_get(), end = event_get();
    int timed = begin != NULL && end != NULL && record != NULL && record(begin, stream) == CUDA_SUCCESS;
    rc = call(ctx);
    if (timed && rc == CUDA_SUCCESS && record(end, stream) == CUDA_SUCCESS && g_count < NN_RING) {
        uint64_t est = g_estimate_ns[dev];
        g_ring[(g_head + g_count) % NN_RING] = (nn_timing){begin, end, dev, est, transient};
        g_count++;
        g_inflight_ns[dev] += est;
        transient = NULL;
    } else {
        event_put(begin);
        event_put(end);
    }
    pace_unlock();
    if (transient != NULL) { /* not timed: give graph memory back now rather than never */
        nn_release_transient(transient);
        free(transient);
    }
    return rc;
}

typedef struct {
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shared;
    CUstream stream;
    void **params, **extra;
    __typeof__(nn_real.cuLaunchKernel) fn;
} nn_kernel_args;

static CUresult call_kernel(void *p) {
    nn_kernel_args *a = p;
    return a->fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shared, a->stream, a->params, a->extra);
}

typedef struct {
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shared;
    CUstream stream;
    void **params;
    __typeof__(nn_real.cuLaunchCooperativeKernel) fn;
} nn_coop_args;

static CUresult call_coop(void *p) {
    nn_coop_args *a = p;
    return a->fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shared, a->stream, a->params);
}

typedef struct {
    const CUlaunchConfig *config;
    CUfunction f;
    void **params, **extra;
    __typeof__(nn_real.cuLaunchKernelEx) fn;
} nn_ex_args;

static CUresult call_ex(void *p) {
    nn_ex_args *a = p;
    return a->fn(a->config, a->f, a->params, a->extra);
}

#define NN_KERNEL_HOOK(name, ptds)                                                                       \
    NN_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                            unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {      \
        if (NN_UNLIKELY(nn_real.name == NULL)) return CUDA_ERROR_NOT_FOUND;                             \
        nn_kernel_args a = {f, gx, gy, gz, bx, by, bz, shared, s, params, extra, nn_real.name};          \
        return launch(s, ptds, call_kernel, &a, NULL);                                                   \
    }

NN_KERNEL_HOOK(cuLaunchKernel, 0)
NN_KERNEL_HOOK(cuLaunchKernel_ptsz, 1)

#define NN_COOP_HOOK(name, ptds)                                                                          \
    NN_EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                            unsigned bz, unsigned shared, CUstream s, void **params) {                    \
        if (NN_UNLIKELY(nn_real.name == NULL)) return CUDA_ERROR_NOT_FOUND;                             \
        nn_coop_args a = {f, gx, gy, gz, bx, by, bz, shared, s, params, nn_real.name};                   \
        return launch(s, ptds, call_coop, &a, NULL);                                                     \
    }

NN_COOP_HOOK(cuLaunchCooperativeKernel, 0)
NN_COOP_HOOK(cuLaunchCooperativeKernel_ptsz, 1)

#define NN_EX_HOOK(name, ptds)                                                                           \
    NN_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {   \
        if (NN_UNLIKELY(nn_real.name == NULL)) return CUDA_ERROR_NOT_FOUND;                             \
        if (config == NULL) return CUDA_ERROR_INVALID_VALUE;                                             \
        nn_ex_args a = {config, f, params, extra, nn_real.name};                                         \
        return launch(config->hStream, ptds, call_ex, &a, NULL);                                         \
    }

NN_EX_HOOK(cuLaunchKernelEx, 0)
NN_EX_HOOK(cuLaunchKernelEx_ptsz, 1)

typedef struct {
    CUDA_LAUNCH_PARAMS *list;
    unsigned n, flags;
} nn_multi_args;

static CUresult call_multi(void *p) {
    nn_multi_args *a = p;
    return nn_real.cuLaunchCooperativeKernelMultiDevice(a->list, a->n, a->flags);
}

/* Deprecated, but still a way to launch: paced on the first device's stream. */
NN_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n, unsigned int flags) {
    if (nn_real.cuLaunchCooperativeKernelMultiDevice == NULL) return CUDA_ERROR_NOT_FOUND;
    if (list == NULL || n == 0) return CUDA_ERROR_INVALID_VALUE;
    nn_multi_args a = {list, n, flags};
    return launch(list[0].hStream, 0, call_multi, &a, NULL);
}

typedef struct {
    CUgraphExec exec;
    CUstream stream;
    __typeof__(nn_real.cuGraphLaunch) fn;
} nn_graph_args;

static CUresult call_graph(void *p) {
    nn_graph_args *a = p;
    return a->fn(a->exec, a->stream);
}

/* A graph is paced like one long kernel; its captured allocations are charged first. */
static CUresult graph_launch(CUgraphExec exec, CUstream s, int ptds, __typeof__(nn_real.cuGraphLaunch) fn) {
    CUresult rc = nn_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (fn == NULL) return CUDA_ERROR_NOT_FOUND;
    nn_graph_args a = {exec, s, fn};
    if (nn_capturing(s, ptds)) return fn(exec, s); /* a child-graph node: charged when its parent runs */
    uint64_t transient_now[NN_MAX_DEVICES] = {0};
    uint64_t *charged = NULL;
    size_t ncharged = 0;
    rc = nn_graph_charge(exec, transient_now, &charged, &ncharged);
    if (rc != CUDA_SUCCESS) return rc;
    uint64_t *transient = NULL;
    for (int d = 0; d < (int)NN_MAX_DEVICES; d++) {
        if (transient_now[d] == 0) continue;
        if (transient == NULL) transient = calloc(NN_MAX_DEVICES, sizeof *transient);
        if (transient != NULL) transient[d] = transient_now[d];
    }
    rc = launch(s, ptds, call_graph, &a, transient); /* gives transient memory back if it fails */
    if (rc == CUDA_SUCCESS) nn_graph_settle(exec);
    else nn_graph_unwind(charged, ncharged); /* nothing was allocated */
    free(charged);
    return rc;
}

NN_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) { return graph_launch(exec, s, 0, nn_real.cuGraphLaunch); }
NN_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) {
    return graph_launch(exec, s, 1, nn_real.cuGraphLaunch_ptsz);
}

void nn_launch_after_fork(void) {
    g_pace_lock = 0;
    for (unsigned i = 0; i < g_count; i++) free(g_ring[(g_head + i) % NN_RING].transient);
    memset(g_ring, 0, sizeof g_ring);
    g_head = g_count = 0;
    g_event_pool_count = 0; /* events of the parent's context */
    memset(g_inflight_ns, 0, sizeof g_inflight_ns);
    memset(g_estimate_ns, 0, sizeof g_estimate_ns);
    memset(g_credit_ns, 0, sizeof g_credit_ns);
    memset(g_bank_ns, 0, sizeof g_bank_ns);
}
