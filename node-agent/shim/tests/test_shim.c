/*
 * test_shim.c — the shim end to end, without a GPU: this program is a CUDA application (it
 * resolves the driver as the runtime does), run with LD_PRELOAD=libneuronetes-cuda.so over the
 * fake libcuda.so.1 / libnvidia-ml.so.1. The fake's own account (FAKE_CUDA_STATE) is the oracle.
 *
 *   test_shim <case> <region path>      (FAKE_CUDA_STATE must name a fresh state file)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "nn_test.h"

static nn_cuda C;
static nn_region *R;
static const char *REGION;

static fake_state *oracle(void) { return nn_test_oracle(); }

/* Streams of the case, destroyed before exit (LeakSanitizer watches the fake too). */
static CUstream g_streams[8];
static int g_nstreams;

static CUstream new_stream(void) {
    CUstream s;
    CHECK_RC(C.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    CHECK(g_nstreams < 8);
    g_streams[g_nstreams++] = s;
    return s;
}

static void destroy_streams(void) {
    for (int i = 0; i < g_nstreams; i++) CHECK_RC(C.cuStreamDestroy_v2(g_streams[i]), CUDA_SUCCESS);
    g_nstreams = 0;
}

static int in_library(const void *fn, const char *needle) {
    Dl_info info;
    return dladdr(fn, &info) != 0 && info.dli_fname != NULL && strstr(info.dli_fname, needle) != NULL;
}

static uint64_t region_used(void) { return __atomic_load_n(&R->devices[0].memory_used_bytes, __ATOMIC_ACQUIRE); }

/* ---- lookup ---------------------------------------------------------------------------------- */

static void case_lookup(void) {
    const char *hooked[] = {"cuMemAlloc", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuLaunchKernel",
                            "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch", "cuMemFreeAsync",
                            "cuGetProcAddress", "cuMemCreate", "cuMemGetInfo", "cuInit"};
    cuuint64_t modes[] = {CU_GET_PROC_ADDRESS_LEGACY_STREAM, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
    for (size_t m = 0; m < 2; m++) {
        for (size_t i = 0; i < sizeof hooked / sizeof hooked[0]; i++) {
            void *fn = NULL;
            CUdriverProcAddressQueryResult st;
            CHECK_RC(C.getProc(hooked[i], &fn, CUDA_VERSION, modes[m], &st), CUDA_SUCCESS);
            if (!in_library(fn, "libneuronetes-cuda")) {
                fprintf(stderr, "%s (mode %zu) not hooked\n", hooked[i], m);
                exit(1);
            }
        }
    }
    /* the per-thread variant maps to the _ptsz hook, the legacy one to the plain hook */
    void *legacy = NULL, *ptsz = NULL;
    CHECK_RC(C.getProc("cuLaunchKernel", &legacy, CUDA_VERSION, CU_GET_PROC_ADDRESS_LEGACY_STREAM, NULL), CUDA_SUCCESS);
    CHECK_RC(C.getProc("cuLaunchKernel", &ptsz, CUDA_VERSION, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL),
             CUDA_SUCCESS);
    CHECK(legacy != ptsz && legacy == dlsym(RTLD_DEFAULT, "cuLaunchKernel") &&
          ptsz == dlsym(RTLD_DEFAULT, "cuLaunchKernel_ptsz"));
    /* the v1 cuGetProcAddress hands out hooks too */
    void *v1 = NULL, *alloc = NULL;
    CHECK_RC(C.getProc("cuGetProcAddress", &v1, 11030, 0, NULL), CUDA_SUCCESS);
    CHECK(in_library(v1, "libneuronetes-cuda"));
    CHECK_RC(((__typeof__(&cuGetProcAddress))v1)("cuMemAlloc", &alloc, CUDA_VERSION, 0), CUDA_SUCCESS);
    CHECK(in_library(alloc, "libneuronetes-cuda"));
    /* dlsym on the driver's handle (bypasses LD_PRELOAD without the dlsym override) */
    CHECK(in_library(dlsym(C.lib, "cuMemAlloc_v2"), "libneuronetes-cuda"));
    CHECK(in_library(dlsym(C.nvml, "nvmlDeviceGetMemoryInfo"), "libneuronetes-cuda"));
    /* RTLD_NEXT stays relative to its caller: from this program, the next cuMemAlloc_v2 is the
     * preloaded shim's (relative to the shim it would be none: the driver is not global) */
    CHECK(dlsym(RTLD_NEXT, "cuMemAlloc_v2") == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    CHECK(in_library(dlsym(RTLD_NEXT, "cuMemAlloc_v2"), "libneuronetes-cuda"));
    /* passed through untouched */
    CHECK(in_library(dlsym(C.lib, "cuStreamCreate"), "libcuda"));
    CHECK(in_library((void *)C.cuGetExportTable, "libcuda"));
    const void *table = NULL;
    CUuuid id = {{0}};
    CHECK_RC(C.cuGetExportTable(&table, &id), CUDA_SUCCESS);
    CHECK(table != NULL && ((const uintptr_t *)table)[1] == 0x5eed);
    /* an unknown symbol is still "not found", not a crash */
    void *none = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CHECK(C.getProc("cuNoSuchThing", &none, CUDA_VERSION, 0, &st) != CUDA_SUCCESS);
    CHECK(none == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    /* an older variant of a wrapped family than the shim wraps is refused, never handed out */
    void *old = NULL;
    CHECK(C.getProc("cuCtxCreate", &old, 3020, 0, NULL) == CUDA_SUCCESS && in_library(old, "libneuronetes-cuda"));
}

/* ---- memory ------------------------------------------------------------------------------------ */

static void check_reports(uint64_t limit) {
    size_t free_b = 0, total = 0, dev_total = 0;
    CHECK_RC(C.cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CHECK_RC(C.cuDeviceTotalMem_v2(&dev_total, 0), CUDA_SUCCESS);
    uint64_t used = region_used();
    CHECK(total == limit && dev_total == limit && free_b == limit - used);
    nvmlDevice_t dev;
    CHECK_RC(C.nvmlDeviceGetHandleByIndex_v2(0, &dev), NVML_SUCCESS);
    nvmlMemory_t m1;
    CHECK_RC(C.nvmlDeviceGetMemoryInfo(dev, &m1), NVML_SUCCESS);
    CHECK(m1.total == limit && m1.used == used && m1.free == limit - used);
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    CHECK_RC(C.nvmlDeviceGetMemoryInfo_v2(dev, &m2), NVML_SUCCESS);
    CHECK(m2.total == limit && m2.used == used && m2.free == limit - used && m2.reserved == 0);
}

static void case_memory(void) {
    const uint64_t limit = 256 * MIB;
    check_reports(limit);
    CUdeviceptr a, b, c, d, e, pitched;
    CUstream s = new_stream();
    CHECK_RC(C.cuMemAlloc_v2(&a, 100 * MIB), CUDA_SUCCESS);
    CHECK_RC(C.cuMemAllocManaged(&b, 50 * MIB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    CHECK_RC(C.cuMemAllocAsync(&c, 50 * MIB, s), CUDA_SUCCESS);
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemoryPool pool;
    CHECK_RC(C.cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
    CHECK_RC(C.cuMemAllocFromPoolAsync(&d, 40 * MIB, pool, s), CUDA_SUCCESS);
    size_t pitch = 0;
    CHECK_RC(C.cuMemAllocPitch_v2(&pitched, &pitch, 1000, 1024, 4), CUDA_SUCCESS); /* 1024 x 1024 */
    CHECK(pitch == 1024 && region_used() == 241 * MIB);
    check_reports(limit);
    /* 15 MiB left: every API is refused past it, none crashes */
    CHECK_RC(C.cuMemAlloc_v2(&e, 16 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_RC(C.cuMemAllocManaged(&e, 16 * MIB, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_RC(C.cuMemAllocAsync(&e, 16 * MIB, s), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_RC(C.cuMemAllocFromPoolAsync(&e, 16 * MIB, pool, s), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_RC(C.cuMemAllocPitch_v2(&e, &pitch, 4096, 4096, 4), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_RC(C.cuMemAlloc_v2(&e, UINT64_MAX - 5), CUDA_ERROR_OUT_OF_MEMORY); /* no overflow */
    CHECK(R->devices[0].oom_refusals_total == 6);
    CHECK_RC(C.cuMemAlloc_v2(&e, 15 * MIB), CUDA_SUCCESS); /* exactly up to the limit */
    CHECK(region_used() == limit && oracle()->devices[0].used_bytes == limit);
    check_reports(limit);
    /* frees give it back */
    CHECK_RC(C.cuMemFree_v2(a), CUDA_SUCCESS);
    CHECK_RC(C.cuMemFree_v2(b), CUDA_SUCCESS);
    CHECK_RC(C.cuMemFreeAsync(c, s), CUDA_SUCCESS);
    CHECK_RC(C.cuMemFreeAsync(d, s), CUDA_SUCCESS);
    CHECK_RC(C.cuMemFree_v2(pitched), CUDA_SUCCESS);
    CHECK_RC(C.cuMemFree_v2(e), CUDA_SUCCESS);
    CHECK(C.cuMemFree_v2(e) != CUDA_SUCCESS); /* a double free is the driver's error, not a second credit */
    CHECK(region_used() == 0 && oracle()->devices[0].used_bytes == 0);
    CHECK(R->devices[0].memory_peak_bytes == limit && R->container.memory_used_bytes == 0);
    CHECK_RC(C.cuMemPoolDestroy(pool), CUDA_SUCCESS);
    check_reports(limit);
    /* the agent lowers the limit in one store: new allocations see it at once */
    __atomic_store_n(&R->devices[0].memory_limit_bytes, 8 * MIB, __ATOMIC_RELEASE);
    CHECK_RC(C.cuMemAlloc_v2(&a, 9 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    check_reports(8 * MIB);
    /* draining refuses everything new */
    __atomic_fetch_or(&R->container.control, NN_CTL_DRAINING, __ATOMIC_RELEASE);
    CHECK_RC(C.cuMemAlloc_v2(&a, 1 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
}

static void case_vmm(void) {
    /* PyTorch's expandable segments: reserve address space, create physical chunks, map them */
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUdeviceptr va;
    CHECK_RC(C.cuMemAddressReserve(&va, 1 * GIB, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h[8];
    for (int i = 0; i < 6; i++) {
        CHECK_RC(C.cuMemCreate(&h[i], 20 * MIB, &prop, 0), CUDA_SUCCESS);
        CHECK_RC(C.cuMemMap(va + (CUdeviceptr)i * 20 * MIB, 20 * MIB, 0, h[i], 0), CUDA_SUCCESS);
    }
    CHECK(region_used() == 120 * MIB && oracle()->devices[0].used_bytes == 120 * MIB);
    CHECK_RC(C.cuMemCreate(&h[6], 20 * MIB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY); /* limit 128 MiB */
    for (int i = 0; i < 6; i++) {
        CHECK_RC(C.cuMemUnmap(va + (CUdeviceptr)i * 20 * MIB, 20 * MIB), CUDA_SUCCESS);
        CHECK_RC(C.cuMemRelease(h[i]), CUDA_SUCCESS);
    }
    CHECK_RC(C.cuMemAddressFree(va, 1 * GIB), CUDA_SUCCESS);
    CHECK(region_used() == 0 && oracle()->devices[0].used_bytes == 0);
    CHECK(C.cuMemRelease(h[0]) != CUDA_SUCCESS && region_used() == 0);
}

/* ---- graphs: a captured cuMemAllocAsync is charged at launch ------------------------------------- */

static void case_graph(void) {
    CUstream s = new_stream();
    CUdeviceptr kept, scratch, outside;
    CHECK_RC(C.cuMemAlloc_v2(&outside, 10 * MIB), CUDA_SUCCESS);
    CHECK_RC(C.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_RC(C.cuMemAllocAsync(&kept, 40 * MIB, s), CUDA_SUCCESS);    /* lives after the graph */
    CHECK_RC(C.cuMemAllocAsync(&scratch, 30 * MIB, s), CUDA_SUCCESS); /* freed inside it */
    uint64_t ns = 1000;
    void *params[] = {&ns};
    CHECK_RC(C.cuLaunchKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
    CHECK_RC(C.cuMemFreeAsync(scratch, s), CUDA_SUCCESS);
    CHECK_RC(C.cuMemFreeAsync(outside, s), CUDA_SUCCESS); /* freed when the graph runs */
    CUgraph g;
    CHECK_RC(C.cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK(region_used() == 10 * MIB && (R->procs[0].flags & NN_PROC_F_CAPTURING) == 0);
    CUgraphExec exec;
    CHECK_RC(C.cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
    CHECK(region_used() == 10 * MIB); /* nothing allocated yet */
    CHECK_RC(C.cuGraphLaunch(exec, s), CUDA_SUCCESS);
    /* kept (40) + scratch until the launch ends (30); outside (10) given back */
    CHECK(region_used() == 70 * MIB);
    CHECK_RC(C.cuStreamSynchronize(s), CUDA_SUCCESS);
    CUdeviceptr tmp;
    CHECK_RC(C.cuMemAlloc_v2(&tmp, 1 * MIB), CUDA_SUCCESS); /* any later call settles finished launches */
    uint64_t ns2 = 1;
    void *p2[] = {&ns2};
    CHECK_RC(C.cuLaunchKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, s, p2, NULL), CUDA_SUCCESS);
    CHECK(region_used() == 41 * MIB);
    CHECK(oracle()->devices[0].used_bytes <= region_used());
    CHECK_RC(C.cuMemFree_v2(kept), CUDA_SUCCESS);
    CHECK_RC(C.cuMemFree_v2(tmp), CUDA_SUCCESS);
    CHECK(region_used() == 0);
    /* over the limit at launch: refused, nothing runs, nothing charged */
    CHECK_RC(C.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CUdeviceptr big;
    CHECK_RC(C.cuMemAllocAsync(&big, 200 * MIB, s), CUDA_SUCCESS); /* limit 128 MiB: fine while capturing */
    CUgraph g2;
    CUgraphExec exec2;
    CHECK_RC(C.cuStreamEndCapture(s, &g2), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphInstantiateWithFlags(&exec2, g2, 0), CUDA_SUCCESS);
    uint64_t launches = oracle()->procs[0].launches;
    CHECK_RC(C.cuGraphLaunch(exec2, s), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(region_used() == 0 && oracle()->devices[0].used_bytes == 0 && oracle()->procs[0].launches == launches);
    CHECK_RC(C.cuGraphExecDestroy(exec), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphExecDestroy(exec2), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphDestroy(g), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphDestroy(g2), CUDA_SUCCESS);
}

/* ---- compute: capture never sleeps, pause holds, admission waits ----------------------------------- */

static void launch_ns(CUstream s, uint64_t ns) {
    void *params[] = {&ns};
    CHECK_RC(C.cuLaunchKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
}

static void case_capture_never_sleeps(void) {
    CUstream s = new_stream();
    launch_ns(s, 2000000); /* 2 ms at a 10 % share: two windows of debt */
    CHECK_RC(C.cuStreamSynchronize(s), CUDA_SUCCESS);
    uint64_t throttled = R->devices[0].throttled_ns_total;
    CHECK_RC(C.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK(R->procs[0].flags & NN_PROC_F_CAPTURING);
    __atomic_fetch_or(&R->container.control, NN_CTL_PAUSED, __ATOMIC_RELEASE); /* not even a pause */
    for (int i = 0; i < 100; i++) launch_ns(s, 100000);
    CUgraph g;
    CHECK_RC(C.cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK(R->devices[0].throttled_ns_total == throttled); /* nothing was held while capturing */
    __atomic_fetch_and(&R->container.control, ~NN_CTL_PAUSED, __ATOMIC_RELEASE);
    /* the graph itself is paced: the next launch after it waits out its debt */
    CUgraphExec exec;
    CHECK_RC(C.cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphLaunch(exec, s), CUDA_SUCCESS);
    CHECK_RC(C.cuStreamSynchronize(s), CUDA_SUCCESS);
    launch_ns(s, 1000);
    CHECK(R->devices[0].throttled_ns_total > throttled);
    CHECK(R->devices[0].kernel_ns_total >= 12000000u); /* the kernel's 2 ms and the graph's 10 ms */
    CHECK_RC(C.cuGraphExecDestroy(exec), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphDestroy(g), CUDA_SUCCESS);
}

static volatile int g_released;

static void *release_later(void *arg) {
    uint32_t flag = (uint32_t)(uintptr_t)arg;
    nn_test_sleep_ms(50);
    g_released = 1;
    if (flag == NN_CTL_PAUSED) __atomic_fetch_and(&R->container.control, ~flag, __ATOMIC_RELEASE);
    else __atomic_fetch_or(&R->container.control, flag, __ATOMIC_RELEASE);
    return NULL;
}

static void case_pause(void) {
    CUstream s = new_stream();
    launch_ns(s, 1000);
    uint64_t launches = oracle()->procs[0].launches;
    __atomic_fetch_or(&R->container.control, NN_CTL_PAUSED, __ATOMIC_RELEASE);
    pthread_t t;
    pthread_create(&t, NULL, release_later, (void *)(uintptr_t)NN_CTL_PAUSED);
    launch_ns(s, 1000); /* held until the agent resumes */
    CHECK(g_released && oracle()->procs[0].launches == launches + 1);
    pthread_join(t, NULL);
}

static void case_admission(void) {
    /* the region was written without NN_CTL_ADMITTED: the first context waits for it */
    CHECK_RC(C.cuInit(0), CUDA_SUCCESS);
    pthread_t t;
    pthread_create(&t, NULL, release_later, (void *)(uintptr_t)NN_CTL_ADMITTED);
    CUcontext ctx;
    CHECK_RC(C.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    CHECK(g_released && (R->procs[0].flags & NN_PROC_F_ADMITTED));
    pthread_join(t, NULL);
}

/* ---- refusals: no region, bad region -> cuInit fails ------------------------------------------------ */

static void case_refused(void) {
    CHECK(C.cuInit(0) == CUDA_ERROR_NOT_PERMITTED);
    CUdeviceptr p;
    CHECK(C.cuMemAlloc_v2(&p, 1) == CUDA_ERROR_NOT_PERMITTED);
    CHECK(C.cuLaunchKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_NOT_PERMITTED);
    CHECK(oracle()->devices[0].used_bytes == 0);
}

/* ---- workstation env -------------------------------------------------------------------------------- */

static void case_env_limit(void) {
    /* CUDA_DEVICE_MEMORY_LIMIT=64m in the environment; honoured only in a STANDALONE region */
    int standalone = (R->header.flags & NN_REGION_F_STANDALONE) != 0;
    uint64_t want = standalone ? 64 * MIB : 128 * MIB;
    size_t free_b, total;
    CHECK_RC(C.cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CHECK(total == want);
    CUdeviceptr p;
    CHECK_RC(C.cuMemAlloc_v2(&p, 100 * MIB), standalone ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS);
}

/* ---- children: forked and exec'd processes are covered and share the limit ---------------------------- */

static void case_children(const char *self) {
    CUdeviceptr p;
    CHECK_RC(C.cuMemAlloc_v2(&p, 60 * MIB), CUDA_SUCCESS);
    pid_t pid = fork();
    if (pid == 0) { /* a forked child: its own slot, the same container limit */
        nn_cuda_start(&C);
        CUdeviceptr q;
        if (C.cuMemAlloc_v2(&q, 60 * MIB) != CUDA_SUCCESS) _exit(2);
        if (C.cuMemAlloc_v2(&q, 60 * MIB) != CUDA_ERROR_OUT_OF_MEMORY) _exit(3); /* 128 MiB */
        execl(self, self, "child-exec", REGION, (char *)NULL);
        _exit(4);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void case_child_exec(void) {
    /* exec'd by the forked child: the preload covers the new image, which claims a slot anew */
    CHECK(region_used() == 60 * MIB); /* the parent's; this PID's pre-exec 60 MiB were released */
    CHECK(oracle()->devices[0].used_bytes == 60 * MIB);
    CUdeviceptr q;
    CHECK_RC(C.cuMemAlloc_v2(&q, 60 * MIB), CUDA_SUCCESS);
    CHECK_RC(C.cuMemAlloc_v2(&q, 9 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    int slots = 0;
    for (unsigned i = 0; i < NN_MAX_PROCS; i++) slots += R->procs[i].state == NN_SLOT_ACTIVE;
    CHECK(slots == 2); /* the parent's and ours (fork and exec keep the PID: one slot, reclaimed) */
}

/* ---- the checkpoint API of the fake (for the workstation daemon's preemption tests) --------------------- */

static void case_checkpoint(void) {
    CUdeviceptr p;
    CHECK_RC(C.cuMemAlloc_v2(&p, 100 * MIB), CUDA_SUCCESS);
    int pid = getpid();
    CUprocessState st;
    CHECK_RC(C.cuCheckpointProcessGetState(pid, &st), CUDA_SUCCESS);
    CHECK(st == CU_PROCESS_STATE_RUNNING);
    CHECK_RC(C.cuCheckpointProcessCheckpoint(pid, NULL), CUDA_ERROR_ILLEGAL_STATE); /* must lock first */
    CHECK_RC(C.cuCheckpointProcessLock(pid, NULL), CUDA_SUCCESS);
    CHECK_RC(C.cuCheckpointProcessGetState(pid, &st), CUDA_SUCCESS);
    CHECK(st == CU_PROCESS_STATE_LOCKED);
    CHECK_RC(C.cuCheckpointProcessCheckpoint(pid, NULL), CUDA_SUCCESS);
    CHECK_RC(C.cuCheckpointProcessGetState(pid, &st), CUDA_SUCCESS);
    CHECK(st == CU_PROCESS_STATE_CHECKPOINTED && oracle()->devices[0].used_bytes == 0);
    CHECK_RC(C.cuCheckpointProcessUnlock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
    int tid = 0;
    CHECK_RC(C.cuCheckpointProcessGetRestoreThreadId(pid, &tid), CUDA_SUCCESS);
    CHECK(tid == pid);
    CHECK_RC(C.cuCheckpointProcessRestore(pid, NULL), CUDA_SUCCESS);
    CHECK_RC(C.cuCheckpointProcessGetState(pid, &st), CUDA_SUCCESS);
    CHECK(st == CU_PROCESS_STATE_LOCKED && oracle()->devices[0].used_bytes == 100 * MIB);
    CHECK_RC(C.cuCheckpointProcessUnlock(pid, NULL), CUDA_SUCCESS);
    CHECK_RC(C.cuCheckpointProcessGetState(pid, &st), CUDA_SUCCESS);
    CHECK(st == CU_PROCESS_STATE_RUNNING);
    CHECK_RC(C.cuCheckpointProcessLock(999999999, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_RC(C.cuMemFree_v2(p), CUDA_SUCCESS);
}

/* ---- a device the container was not given (FAKE_CUDA_DEVICES=2, the region lists device 0) ---------- */

static void case_unassigned(void) {
    CUcontext ctx;
    CHECK_RC(C.cuDevicePrimaryCtxRetain(&ctx, 1), CUDA_SUCCESS);
    CHECK_RC(C.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CUdeviceptr p;
    CHECK_RC(C.cuMemAlloc_v2(&p, 1 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    size_t free_b = 1, total = 1, dev_total = 1;
    CHECK_RC(C.cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CHECK_RC(C.cuDeviceTotalMem_v2(&dev_total, 1), CUDA_SUCCESS);
    CHECK(free_b == 0 && total == 0 && dev_total == 0);
    nvmlDevice_t dev;
    nvmlMemory_t m;
    CHECK_RC(C.nvmlDeviceGetHandleByIndex_v2(1, &dev), NVML_SUCCESS);
    CHECK_RC(C.nvmlDeviceGetMemoryInfo(dev, &m), NVML_SUCCESS);
    CHECK(m.total == 0 && m.free == 0);
    CHECK(oracle()->devices[1].used_bytes == 0);
    /* device 0 still works */
    CHECK_RC(C.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CHECK_RC(C.cuMemAlloc_v2(&p, 1 * MIB), CUDA_SUCCESS);
    CHECK_RC(C.cuMemFree_v2(p), CUDA_SUCCESS);
}

/* ---- with the agent's own region writer (tests/unit/test_shim_region.py drives this) ------------- */

static void case_agent(void) {
    CUdeviceptr p;
    CHECK_RC(C.cuMemAlloc_v2(&p, 48 * MIB), CUDA_SUCCESS);
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemGenericAllocationHandle h;
    CHECK_RC(C.cuMemCreate(&h, 16 * MIB, &prop, 0), CUDA_SUCCESS);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    CHECK(fgets(line, sizeof line, stdin) != NULL); /* the agent changed the region meanwhile */
    size_t free_b, total;
    CHECK_RC(C.cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CUdeviceptr q;
    CUresult rc = C.cuMemAlloc_v2(&q, 40 * MIB);
    printf("total %zu free %zu alloc40 %d\n", total, free_b, (int)rc);
    fflush(stdout);
    CHECK(fgets(line, sizeof line, stdin) != NULL); /* wait to be killed holding the memory */
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s <case> <region>\n", argv[0]);
        return 64;
    }
    const char *name = argv[1];
    REGION = argv[2];
    nn_cuda_load(&C, CU_GET_PROC_ADDRESS_DEFAULT);
    CHECK_RC(C.nvmlInit_v2(), NVML_SUCCESS);
    if (strcmp(name, "refused") == 0) {
        case_refused();
        return 0;
    }
    int fd = open(REGION, O_RDWR);
    CHECK(fd >= 0);
    R = mmap(NULL, sizeof(nn_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(R != MAP_FAILED);
    close(fd);
    if (strcmp(name, "admission") == 0) {
        case_admission();
        return 0;
    }
    nn_cuda_start(&C);
    if (strcmp(name, "lookup") == 0) case_lookup();
    else if (strcmp(name, "memory") == 0) case_memory();
    else if (strcmp(name, "vmm") == 0) case_vmm();
    else if (strcmp(name, "graph") == 0) case_graph();
    else if (strcmp(name, "capture") == 0) case_capture_never_sleeps();
    else if (strcmp(name, "pause") == 0) case_pause();
    else if (strcmp(name, "env") == 0) case_env_limit();
    else if (strcmp(name, "children") == 0) case_children(argv[0]);
    else if (strcmp(name, "child-exec") == 0) case_child_exec();
    else if (strcmp(name, "checkpoint") == 0) case_checkpoint();
    else if (strcmp(name, "agent") == 0) case_agent();
    else if (strcmp(name, "unassigned") == 0) case_unassigned();
    else {
        fprintf(stderr, "unknown case %s\n", name);
        return 64;
    }
    destroy_streams();
    return 0;
}
