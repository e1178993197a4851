/*
 * nn_test.h — helpers for the shim's C tests and benchmark: checks, a region written the way the
 * node agent writes it, and a driver program's view of CUDA (dlopen + cuGetProcAddress_v2, as the
 * CUDA runtime resolves entry points).
 */
#ifndef NN_TEST_H
#define NN_TEST_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define __CUDA_API_VERSION_INTERNAL 1
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <cuda.h>
#include <nvml.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../fake/fake_state.h"
#include "neuronetes_region.h"

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);          \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

#define CHECK_RC(expr, want)                                                                  \
    do {                                                                                      \
        long nn_got_ = (long)(expr);                                                          \
        if (nn_got_ != (long)(want)) {                                                        \
            fprintf(stderr, "%s:%d: %s returned %ld, expected %ld\n", __FILE__, __LINE__, #expr, \
                    nn_got_, (long)(want));                                                   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

static inline uint64_t nn_test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void nn_test_sleep_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms - (double)(time_t)(ms / 1000) * 1000) * 1e6)};
    nanosleep(&ts, NULL);
}

/* ---- a region as the agent writes it (node-agent/neuronetes_agent/region.py create_region does the same) ------ */

typedef struct nn_test_region_spec {
    uint64_t limit_bytes[NN_MAX_DEVICES]; /* per device; the container limit is their sum */
    uint32_t share[NN_MAX_DEVICES];       /* 0 = 100 */
    unsigned devices;
    uint32_t control; /* NN_CTL_* */
    uint32_t flags;   /* NN_REGION_F_* besides READY (control file) */
} nn_test_region_spec;

/* Both files of a region, mapped read-write: the test plays the agent (control) and the tenant
 * (state) at once. */
typedef struct nn_test_region {
    nn_control *control;
    nn_state *state;
} nn_test_region;

/* `dir`/`name` filled under a temporary name; renamed into place by nn_test_publish. */
static inline void *nn_test_new_file(const char *dir, const char *name, size_t size, char *tmp, size_t tmp_len) {
    snprintf(tmp, tmp_len, "%s/.%s.tmp%d", dir, name, (int)getpid());
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, (off_t)size) == 0);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED);
    close(fd);
    return p;
}

static inline void nn_test_publish(const char *dir, const char *name, const char *tmp) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK(rename(tmp, path) == 0);
}

static inline void nn_test_header(nn_file_header *h, uint64_t magic, size_t size, uint32_t entry, uint32_t slot,
                                  uint64_t pair_id) {
    h->magic = magic;
    h->version_major = NN_REGION_VERSION_MAJOR;
    h->version_minor = NN_REGION_VERSION_MINOR;
    h->header_size = sizeof(nn_file_header);
    h->file_size = size;
    h->device_entry_size = entry;
    h->proc_slot_size = slot;
    h->max_devices = NN_MAX_DEVICES;
    h->max_procs = NN_MAX_PROCS;
    h->creator_pid = (uint32_t)getpid();
    h->pair_id = pair_id;
}

/* Write the region's two files into the directory `dir` (created if missing): the state file
 * first, the control file last (its presence means the pair is complete). */
static inline nn_test_region nn_test_region_create(const char *dir, const nn_test_region_spec *spec) {
    CHECK(mkdir(dir, 0777) == 0 || errno == EEXIST);
    uint64_t pair_id = nn_test_now() ^ ((uint64_t)getpid() << 32);
    char tmp_state[4096], tmp_control[4096];
    nn_test_region t;
    t.state = nn_test_new_file(dir, NN_STATE_NAME, sizeof(nn_state), tmp_state, sizeof tmp_state);
    nn_test_header(&t.state->header, NN_STATE_MAGIC, sizeof(nn_state), sizeof(nn_device_usage), sizeof(nn_proc_slot),
                   pair_id);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    CHECK(pthread_mutex_init(&t.state->lock.mutex, &attr) == 0);
    pthread_mutexattr_destroy(&attr);
    __atomic_store_n(&t.state->header.flags, NN_REGION_F_READY, __ATOMIC_RELEASE);
    nn_test_publish(dir, NN_STATE_NAME, tmp_state);

    t.control = nn_test_new_file(dir, NN_CONTROL_NAME, sizeof(nn_control), tmp_control, sizeof tmp_control);
    nn_test_header(&t.control->header, NN_CONTROL_MAGIC, sizeof(nn_control), sizeof(nn_device_control),
                   sizeof(nn_proc_control), pair_id);
    uint64_t total = 0;
    for (unsigned i = 0; i < spec->devices; i++) {
        char uuid[41];
        fake_device_uuid(i, uuid);
        nn_device_control *d = &t.control->devices[i];
        memcpy(d->uuid, uuid, sizeof uuid);
        d->memory_limit_bytes = spec->limit_bytes[i];
        d->memory_total_bytes = FAKE_DEFAULT_MEM_BYTES;
        d->compute_share_percent = spec->share[i] ? spec->share[i] : 100;
        d->host_index = i;
        total += spec->limit_bytes[i];
    }
    nn_container *c = &t.control->container;
    c->memory_limit_bytes = total;
    c->pacing_window_ns = NN_DEFAULT_PACING_WINDOW_NS;
    c->qos = NN_QOS_GUARANTEED;
    c->control = spec->control;
    c->device_count = spec->devices;
    __atomic_store_n(&t.control->header.flags, NN_REGION_F_READY | spec->flags, __ATOMIC_RELEASE);
    nn_test_publish(dir, NN_CONTROL_NAME, tmp_control);
    return t;
}

static inline nn_test_region nn_test_region_one(const char *dir, uint64_t limit, uint32_t share, uint32_t flags) {
    nn_test_region_spec spec = {.devices = 1, .control = NN_CTL_ADMITTED, .flags = flags};
    spec.limit_bytes[0] = limit;
    spec.share[0] = share;
    return nn_test_region_create(dir, &spec);
}

/* Both files of an existing region, mapped read-write (a test program looking at what the shim
 * in it wrote, and acting as the agent). */
static inline nn_test_region nn_test_region_open(const char *dir) {
    nn_test_region t;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, NN_CONTROL_NAME);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0);
    t.control = mmap(NULL, sizeof(nn_control), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(t.control != MAP_FAILED);
    close(fd);
    snprintf(path, sizeof path, "%s/%s", dir, NN_STATE_NAME);
    fd = open(path, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0);
    t.state = mmap(NULL, sizeof(nn_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(t.state != MAP_FAILED);
    close(fd);
    return t;
}

/* The agent's part in tests: it finds host PIDs itself (here one PID namespace: the same) and
 * registers them in the control file for the slot's current claim (neuronetes_region.h). */
static inline void nn_test_agent_register_host_pids(nn_test_region *t) {
    for (unsigned i = 0; i < NN_MAX_PROCS; i++) {
        const nn_proc_slot *s = &t->state->procs[i];
        nn_proc_control *pc = &t->control->procs[i];
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == NN_SLOT_FREE) continue;
        uint64_t seq = __atomic_load_n(&s->claim_seq, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&pc->host_pid, __ATOMIC_ACQUIRE) != 0 && __atomic_load_n(&pc->claim_seq, __ATOMIC_ACQUIRE) == seq)
            continue;
        __atomic_store_n(&pc->host_pid, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&pc->claim_seq, seq, __ATOMIC_RELEASE);
        __atomic_store_n(&pc->start_time_ticks, s->start_time_ticks, __ATOMIC_RELEASE);
        __atomic_store_n(&pc->host_pid, s->container_pid, __ATOMIC_RELEASE);
    }
}

/* The agent's reclaim order for slot `i`'s current claim. */
static inline void nn_test_agent_order_reclaim(nn_test_region *t, unsigned i) {
    __atomic_store_n(&t->control->procs[i].reclaim_claim_seq, t->state->procs[i].claim_seq, __ATOMIC_RELEASE);
    __atomic_fetch_add(&t->control->container.reclaim_generation, 1, __ATOMIC_RELEASE);
}

static inline fake_state *nn_test_oracle(void) {
    const char *path = getenv("FAKE_CUDA_STATE");
    CHECK(path != NULL);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0);
    fake_state *s = mmap(NULL, sizeof(fake_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(s != MAP_FAILED);
    close(fd);
    return s;
}

/* ---- the driver program: entry points as the CUDA runtime gets them --------------------------- */

typedef struct nn_cuda {
    void *lib, *nvml;
    __typeof__(&cuGetProcAddress_v2) getProc;
#define NN_CUDA_FNS(X)                                                                              \
    X(cuInit) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent)     \
    X(cuCtxCreate_v4) X(cuMemAlloc_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) X(cuMemFree_v2)   \
    X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuMemAllocFromPoolAsync) X(cuMemPoolCreate)              \
    X(cuMemPoolDestroy) X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemMap)           \
    X(cuMemUnmap) X(cuMemAddressFree) X(cuMemGetInfo_v2) X(cuDeviceTotalMem_v2) X(cuLaunchKernel)   \
    X(cuLaunchKernelEx) X(cuLaunchCooperativeKernel) X(cuGraphLaunch) X(cuStreamCreate)             \
    X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture)                         \
    X(cuGraphInstantiateWithFlags) X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuGetExportTable)      \
    X(cuCheckpointProcessLock) X(cuCheckpointProcessCheckpoint) X(cuCheckpointProcessRestore)       \
    X(cuCheckpointProcessUnlock) X(cuCheckpointProcessGetState) X(cuCheckpointProcessGetRestoreThreadId) \
    X(cuCtxDestroy_v2) X(cuMemRetainAllocationHandle) X(cuArrayCreate_v2) X(cuArray3DCreate_v2)     \
    X(cuMipmappedArrayCreate) X(cuArrayDestroy) X(cuMipmappedArrayDestroy) X(cuGraphCreate)         \
    X(cuGraphAddMemAllocNode) X(cuGraphAddMemFreeNode) X(cuGraphAddNode_v2) X(cuGraphClone)         \
    X(cuCtxSetLimit) X(cuCtxGetLimit)
#define NN_FIELD(name) __typeof__(&name) name;
    NN_CUDA_FNS(NN_FIELD)
    __typeof__(&nvmlInit_v2) nvmlInit_v2;
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) nvmlDeviceGetHandleByIndex_v2;
    __typeof__(&nvmlDeviceGetMemoryInfo) nvmlDeviceGetMemoryInfo;
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) nvmlDeviceGetMemoryInfo_v2;
#undef NN_FIELD
} nn_cuda;

/* The base name cuGetProcAddress is asked for (what the runtime passes): drop _v2.._v4. */
static inline void nn_base_name(const char *name, char *out, size_t len) {
    snprintf(out, len, "%s", name);
    size_t n = strlen(out);
    if (n > 3 && out[n - 3] == '_' && out[n - 2] == 'v' && out[n - 1] >= '2' && out[n - 1] <= '9') out[n - 3] = '\0';
    if (strcmp(out, "cuGraphInstantiate") == 0) snprintf(out, len, "cuGraphInstantiateWithFlags");
}

static inline void nn_cuda_load(nn_cuda *c, cuuint64_t flags) {
    memset(c, 0, sizeof *c);
    c->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(c->lib != NULL);
    c->getProc = (__typeof__(c->getProc))dlsym(c->lib, "cuGetProcAddress_v2");
    CHECK(c->getProc != NULL);
    char base[128];
    CUdriverProcAddressQueryResult status;
#define NN_RESOLVE(name)                                                                         \
    nn_base_name(#name, base, sizeof base);                                                      \
    CHECK_RC(c->getProc(base, (void **)&c->name, CUDA_VERSION, flags, &status), CUDA_SUCCESS);  \
    CHECK(c->name != NULL);
    NN_CUDA_FNS(NN_RESOLVE)
#undef NN_RESOLVE
    c->nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(c->nvml != NULL);
    c->nvmlInit_v2 = (__typeof__(c->nvmlInit_v2))dlsym(c->nvml, "nvmlInit_v2");
    c->nvmlDeviceGetHandleByIndex_v2 =
        (__typeof__(c->nvmlDeviceGetHandleByIndex_v2))dlsym(c->nvml, "nvmlDeviceGetHandleByIndex_v2");
    c->nvmlDeviceGetMemoryInfo = (__typeof__(c->nvmlDeviceGetMemoryInfo))dlsym(c->nvml, "nvmlDeviceGetMemoryInfo");
    c->nvmlDeviceGetMemoryInfo_v2 =
        (__typeof__(c->nvmlDeviceGetMemoryInfo_v2))dlsym(c->nvml, "nvmlDeviceGetMemoryInfo_v2");
    CHECK(c->nvmlInit_v2 && c->nvmlDeviceGetHandleByIndex_v2 && c->nvmlDeviceGetMemoryInfo &&
          c->nvmlDeviceGetMemoryInfo_v2);
}

/* cuInit + the primary context of device 0, current on this thread. */
static inline void nn_cuda_start(nn_cuda *c) {
    CHECK_RC(c->cuInit(0), CUDA_SUCCESS);
    CUcontext ctx;
    CHECK_RC(c->cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    CHECK_RC(c->cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

#endif
