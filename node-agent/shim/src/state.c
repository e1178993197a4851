/*
 * state.c — the process's view: open the region on first CUDA use (never at load time, so
 * processes that never touch CUDA are unaffected), claim a slot, map CUDA devices to region
 * entries, admission, workstation env limits, fork.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

nn_shim nn_g = {.slot = -1};
static nn_region g_region; /* both mappings, once mapped */
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_dev_entry[64]; /* CUdevice -> region entry + 2 (0 = not looked up yet, 1 = none) */

uint64_t nn_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void nn_log(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "neuronetes-cuda[%d]: %s\n", (int)getpid(), buf);
}

/* HAMi-style sizes: "4096" bytes, "4096k", "512m", "2g" (binary units). 0 = absent or invalid. */
static uint64_t parse_size(const char *v) {
    if (v == NULL || *v == '\0') return 0;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v) return 0;
    unsigned shift = 0;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: return 0;
    }
    if (*end != '\0' || x > (UINT64_MAX >> shift)) return 0;
    return (uint64_t)x << shift;
}

static uint32_t parse_share(const char *v) {
    if (v == NULL || *v == '\0') return 0;
    char *end = NULL;
    unsigned long x = strtoul(v, &end, 10);
    return (*end == '\0' && x >= 1 && x <= 100) ? (uint32_t)x : 0;
}

/* Workstation mode only: the user owns the machine, so their env may narrow the region's limits.
 * In a cluster these variables would let a tenant choose its own limit and are ignored. */
static void read_workstation_env(const nn_region *r) {
    if (!(r->control->header.flags & NN_REGION_F_WORKSTATION)) return;
    uint64_t all_mem = parse_size(getenv("CUDA_DEVICE_MEMORY_LIMIT"));
    uint32_t all_share = parse_share(getenv("CUDA_DEVICE_SM_LIMIT"));
    for (unsigned i = 0; i < NN_MAX_DEVICES; i++) {
        char name[64];
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%u", i);
        uint64_t mem = parse_size(getenv(name));
        nn_g.env_limit[i] = mem ? mem : all_mem;
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%u", i);
        uint32_t share = parse_share(getenv(name));
        nn_g.env_share[i] = share ? share : all_share;
    }
}

uint64_t nn_device_limit(int i) {
    uint64_t limit = __atomic_load_n(&nn_g.region->control->devices[i].memory_limit_bytes, __ATOMIC_ACQUIRE);
    uint64_t env = nn_g.env_limit[i];
    return (env != 0 && env < limit) ? env : limit;
}

uint32_t nn_device_share(int i) {
    const nn_device_control *e = &nn_g.region->control->devices[i];
    if (__atomic_load_n(&e->flags, __ATOMIC_RELAXED) & NN_DEV_F_MIG) return 100; /* hardware-isolated */
    uint32_t share = __atomic_load_n(&e->compute_share_percent, __ATOMIC_RELAXED);
    uint32_t env = nn_g.env_share[i];
    if (env != 0 && env < share) share = env;
    return share == 0 ? 1 : share; /* 0 is not a share: treat as the smallest */
}

static void after_fork_child(void) {
    /* The child is a new process: it claims its own slot on first use; allocations and events
     * belong to the parent's CUDA context, which the child does not inherit. */
    nn_g.slot = -1;
    nn_g.pid = 0;
    nn_g.admitted = 0;
    nn_memory_after_fork();
    nn_vmm_after_fork();
    nn_limits_after_fork();
    nn_graphmem_after_fork();
    nn_launch_after_fork();
}

static CUresult refuse(CUresult rc, const char *path, const char *why) {
    nn_log("%s: %s; CUDA is refused in this process (the shim never runs without limits)", path, why);
    nn_g.refusal = rc;
    __atomic_store_n(&nn_g.status, NN_ST_REFUSED, __ATOMIC_RELEASE);
    return rc;
}

static CUresult claim_slot(void) {
    pid_t pid = getpid();
    int slot = nn_region_claim(nn_g.region, pid, nn_proc_start_ticks(pid));
    if (slot < 0) {
        nn_log("no free process slot in the region (or its lock is held): CUDA refused");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    nn_g.slot = slot;
    __atomic_store_n(&nn_g.pid, pid, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

CUresult nn_ready(void) {
    int status = __atomic_load_n(&nn_g.status, __ATOMIC_ACQUIRE);
    if (status == NN_ST_READY && __atomic_load_n(&nn_g.pid, __ATOMIC_ACQUIRE) != 0) return CUDA_SUCCESS;
    if (status == NN_ST_REFUSED) return nn_g.refusal;
    pthread_mutex_lock(&g_init_lock);
    CUresult rc = CUDA_SUCCESS;
    status = nn_g.status;
    if (status == NN_ST_UNINIT) {
        nn_resolve_cuda();
        if (nn_real.cuInit == NULL) {
            rc = refuse(CUDA_ERROR_NO_DEVICE, "libcuda.so.1", "the driver library cannot be loaded");
        } else {
            /* In a container (something at the default path) the environment cannot move it. */
            const char *dir = nn_region_dir(NN_CONTROL_PATH, getenv("NEURONETES_REGION_DIR"));
            char why[512];
            if (nn_region_map(dir, &g_region, why, sizeof why) != 0) {
                rc = refuse(CUDA_ERROR_NOT_PERMITTED, dir, why);
            } else {
                nn_g.region = &g_region;
                read_workstation_env(&g_region);
                pthread_atfork(NULL, NULL, after_fork_child);
                __atomic_store_n(&nn_g.status, NN_ST_READY, __ATOMIC_RELEASE);
            }
        }
    } else if (status == NN_ST_REFUSED) {
        rc = nn_g.refusal;
    }
    if (rc == CUDA_SUCCESS && nn_g.pid == 0) rc = claim_slot();
    pthread_mutex_unlock(&g_init_lock);
    return rc;
}

static void format_uuid(const CUuuid *u, char out[37]) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* "GPU-<uuid>" / "MIG-<uuid>": the 36 characters after the prefix identify the device. */
static int match_entry(const char *uuid36) {
    uint32_t count = __atomic_load_n(&nn_g.region->control->container.device_count, __ATOMIC_RELAXED);
    if (count > NN_MAX_DEVICES) count = NN_MAX_DEVICES;
    for (uint32_t i = 0; i < count; i++) {
        char entry[NN_UUID_BYTES + 1];
        memcpy(entry, nn_g.region->control->devices[i].uuid, NN_UUID_BYTES);
        entry[NN_UUID_BYTES] = '\0';
        if (strlen(entry) == 40 && strcmp(entry + 4, uuid36) == 0) return (int)i;
    }
    return -1;
}

int nn_device_entry_of(CUdevice dev) {
    if (dev < 0 || dev >= 64) return -1;
    int cached = __atomic_load_n(&g_dev_entry[dev], __ATOMIC_RELAXED);
    if (cached != 0) return cached - 2;
    CUuuid uuid;
    int entry = -1;
    if (nn_real.cuDeviceGetUuid_v2 != NULL && nn_real.cuDeviceGetUuid_v2(&uuid, dev) == CUDA_SUCCESS) {
        char text[37];
        format_uuid(&uuid, text);
        entry = match_entry(text);
    }
    __atomic_store_n(&g_dev_entry[dev], entry + 2, __ATOMIC_RELAXED);
    return entry;
}

/* NVML device -> region entry, by its UUID string (nvml.c). */
int nn_nvml_entry_of(const char *uuid);
int nn_nvml_entry_of(const char *uuid) {
    if (uuid == NULL || strlen(uuid) != 40) return -1;
    return match_entry(uuid + 4);
}

int nn_current_entry(void) {
    CUdevice dev;
    if (nn_real.cuCtxGetDevice == NULL || nn_real.cuCtxGetDevice(&dev) != CUDA_SUCCESS) return -1;
    return nn_device_entry_of(dev);
}

CUresult nn_admit(void) {
    CUresult rc = nn_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (__atomic_load_n(&nn_g.admitted, __ATOMIC_ACQUIRE)) return CUDA_SUCCESS;
    const nn_container *c = &nn_g.region->control->container;
    int logged = 0;
    for (;;) {
        uint32_t control = __atomic_load_n(&c->control, __ATOMIC_ACQUIRE);
        if (control & NN_CTL_DRAINING) return CUDA_ERROR_NOT_PERMITTED;
        if (control & NN_CTL_ADMITTED) break;
        if (!logged) {
            nn_log("waiting for the node agent to admit this container to the GPU");
            logged = 1;
        }
        struct timespec ts = {0, 1000000}; /* 1 ms: admission is rare and not latency-critical */
        nanosleep(&ts, NULL);
    }
    nn_proc_slot *s = &nn_g.region->state->procs[nn_g.slot];
    __atomic_fetch_or(&s->flags, NN_PROC_F_ADMITTED, __ATOMIC_RELEASE);
    __atomic_store_n(&nn_g.admitted, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

/* ---- entry: cuInit and context creation ------------------------------------------------------------- */

/* A missing or mismatched region makes cuInit fail: the process gets no CUDA rather than
 * unlimited CUDA. */
NN_EXPORT CUresult cuInit(unsigned int flags) {
    CUresult rc = nn_ready();
    if (rc != CUDA_SUCCESS) return rc;
    return nn_real.cuInit(flags);
}

#define NN_CONTEXT_HOOK(name, params, args)                        \
    NN_EXPORT CUresult name params {                               \
        CUresult rc = nn_admit();                                  \
        if (rc != CUDA_SUCCESS) return rc;                         \
        if (nn_real.name == NULL) return CUDA_ERROR_NOT_FOUND;     \
        return nn_real.name args;                                  \
    }

NN_CONTEXT_HOOK(cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev), (pctx, dev))
NN_CONTEXT_HOOK(cuCtxCreate, (CUcontext * pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))
NN_CONTEXT_HOOK(cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))
NN_CONTEXT_HOOK(cuCtxCreate_v3,
                (CUcontext * pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev),
                (pctx, params, n, flags, dev))
NN_CONTEXT_HOOK(cuCtxCreate_v4, (CUcontext * pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev),
                (pctx, params, flags, dev))
