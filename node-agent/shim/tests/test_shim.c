/*
 * test_shim.c — the shim end to end, without a GPU: this program is a CUDA application (it
 * resolves the driver as the runtime does), run with LD_PRELOAD=libneuronetes-cuda.so over the
 * fake libcuda.so.1 / libnvidia-ml.so.1. The fake's own account (FAKE_CUDA_STATE) is the oracle.
 *
 *   test_shim <case> <region dir>       (FAKE_CUDA_STATE must name a fresh state file)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "nn_test.h"

static nn_cuda C;
static nn_test_region R; /* both files, read-write: this program is also the agent */
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

static uint64_t region_used(void) { return __atomic_load_n(&R.state->devices[0].memory_used_bytes, __ATOMIC_ACQUIRE); }

/* ---- lookup ---------------------------------------------------------------------------------- */

static void case_lookup(void) {
    const char *hooked[] = {"cuGraphInstantiate", "cuMemAlloc", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuLaunchKernel",
                            "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch", "cuMemFreeAsync",
                            "cuGetProcAddress", "cuMemCreate", "cuMemGetInfo", "cuInit", "cuMemMap", "cuMemUnmap",
                            "cuMemRetainAllocationHandle", "cuArrayCreate", "cuArray3DCreate",
                            "cuMipmappedArrayCreate", "cuArrayDestroy", "cuMipmappedArrayDestroy",
                            "cuGraphAddMemAllocNode", "cuGraphAddMemFreeNode", "cuGraphAddNode", "cuGraphClone",
                            "cuCtxSetLimit"};
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
    /* every version the driver hands out maps to the hook of that exact version */
    const struct {
        const char *name;
        int version;
        const char *hook;
    } versions[] = {{"cuGraphAddNode", 12020, "cuGraphAddNode"},   {"cuGraphAddNode", 12030, "cuGraphAddNode_v2"},
#if CUDA_VERSION >= 13040
                    {"cuGraphAddNode", CUDA_VERSION, "cuGraphAddNode_v3"},
#endif
                    {"cuArrayCreate", 2000, "cuArrayCreate"},
                    {"cuArrayCreate", 3020, "cuArrayCreate_v2"}, {"cuArray3DCreate", 2000, "cuArray3DCreate"},
                    {"cuArray3DCreate", CUDA_VERSION, "cuArray3DCreate_v2"}};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        void *fn = NULL;
        CHECK_RC(C.getProc(versions[i].name, &fn, versions[i].version, 0, NULL), CUDA_SUCCESS);
        if (fn != dlsym(RTLD_DEFAULT, versions[i].hook)) {
            fprintf(stderr, "%s at %d is not the hook %s\n", versions[i].name, versions[i].version, versions[i].hook);
            exit(1);
        }
    }
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
    CHECK(R.state->devices[0].oom_refusals_total == 6);
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
    CHECK(R.state->devices[0].memory_peak_bytes == limit && R.state->usage.memory_used_bytes == 0);
    CHECK_RC(C.cuMemPoolDestroy(pool), CUDA_SUCCESS);
    check_reports(limit);
    /* the agent lowers the limit in one store: new allocations see it at once */
    __atomic_store_n(&R.control->devices[0].memory_limit_bytes, 8 * MIB, __ATOMIC_RELEASE);
    CHECK_RC(C.cuMemAlloc_v2(&a, 9 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    check_reports(8 * MIB);
    /* draining refuses everything new */
    __atomic_fetch_or(&R.control->container.control, NN_CTL_DRAINING, __ATOMIC_RELEASE);
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

static void launch_ns(CUstream s, uint64_t ns) {
    void *params[] = {&ns};
    CHECK_RC(C.cuLaunchKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
}

/* The region and the fake driver's own account agree on device 0. */
static void check_used(uint64_t bytes, int line) {
    uint64_t region = region_used(), gpu = oracle()->devices[0].used_bytes;
    if (region != bytes || gpu != bytes) {
        fprintf(stderr, "test_shim.c:%d: expected %llu bytes used, region %llu, driver %llu\n", line,
                (unsigned long long)bytes, (unsigned long long)region, (unsigned long long)gpu);
        exit(1);
    }
}
#define CHECK_USED(bytes) check_used((bytes), __LINE__)

static const CUmemAllocationProp g_vmm_prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                               .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};

static CUmemGenericAllocationHandle vmm_create(size_t bytes) {
    CUmemGenericAllocationHandle h;
    CHECK_RC(C.cuMemCreate(&h, bytes, &g_vmm_prop, 0), CUDA_SUCCESS);
    return h;
}

static void case_vmm_mapped(void) {
    /* the driver frees VMM memory when the handle is released AND unmapped (limit 128 MiB) */
    CUdeviceptr va;
    CHECK_RC(C.cuMemAddressReserve(&va, 1 * GIB, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = vmm_create(64 * MIB), h2, other;
    CHECK_RC(C.cuMemMap(va, 64 * MIB, 0, h, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuMemRelease(h), CUDA_SUCCESS); /* create -> map -> release: PyTorch's, NCCL's idiom */
    CHECK_USED(64 * MIB);
    CHECK_RC(C.cuMemCreate(&other, 80 * MIB, &g_vmm_prop, 0), CUDA_ERROR_OUT_OF_MEMORY); /* 64 still held */
    CHECK_RC(C.cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);    /* no reference left to release */
    CHECK_RC(C.cuMemUnmap(va, 32 * MIB), CUDA_ERROR_INVALID_VALUE); /* part of a mapping */
    CHECK_USED(64 * MIB);
    CHECK_RC(C.cuMemUnmap(va, 64 * MIB), CUDA_SUCCESS);
    CHECK_USED(0);
    other = vmm_create(80 * MIB);
    CHECK_RC(C.cuMemRelease(other), CUDA_SUCCESS);
    CHECK_USED(0);

    /* retain / release pairing: a retain is one more reference (NCCL frees through it) */
    h = vmm_create(64 * MIB);
    CHECK_RC(C.cuMemMap(va, 64 * MIB, 0, h, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(va + 4096)), CUDA_SUCCESS);
    CHECK(h2 == h);
    CHECK_RC(C.cuMemRelease(h2), CUDA_SUCCESS);
    CHECK_RC(C.cuMemUnmap(va, 64 * MIB), CUDA_SUCCESS);
    CHECK_USED(64 * MIB); /* unmapped, but cuMemCreate's reference is held */
    CHECK_RC(C.cuMemRelease(h), CUDA_SUCCESS);
    CHECK_USED(0);
    h = vmm_create(64 * MIB);
    CHECK_RC(C.cuMemMap(va, 64 * MIB, 0, h, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuMemRelease(h), CUDA_SUCCESS);
    CHECK_RC(C.cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)va), CUDA_SUCCESS); /* released, mapped */
    CHECK_RC(C.cuMemUnmap(va, 64 * MIB), CUDA_SUCCESS);
    CHECK_USED(64 * MIB); /* the retain's reference is held */
    CHECK_RC(C.cuMemRelease(h2), CUDA_SUCCESS);
    CHECK_USED(0);
    CHECK_RC(C.cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)va), CUDA_ERROR_INVALID_VALUE); /* nothing there */

    /* one handle mapped at two (then three) addresses: freed at the last unmap */
    h = vmm_create(64 * MIB);
    CHECK_RC(C.cuMemMap(va, 64 * MIB, 0, h, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuMemMap(va + 256 * MIB, 64 * MIB, 0, h, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuMemRelease(h), CUDA_SUCCESS);
    CHECK_USED(64 * MIB);
    CHECK_RC(C.cuMemUnmap(va, 64 * MIB), CUDA_SUCCESS);
    CHECK_USED(64 * MIB);
    CHECK_RC(C.cuMemMap(va + 512 * MIB, 64 * MIB, 0, h, 0), CUDA_SUCCESS); /* released but mapped: still mappable */
    CHECK_RC(C.cuMemUnmap(va + 256 * MIB, 64 * MIB), CUDA_SUCCESS);
    CHECK_USED(64 * MIB);
    CHECK_RC(C.cuMemUnmap(va + 512 * MIB, 64 * MIB), CUDA_SUCCESS);
    CHECK_USED(0);
    CHECK_RC(C.cuMemMap(va, 64 * MIB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* gone */

    /* one unmap over adjacent mappings of two handles ends both */
    h = vmm_create(32 * MIB);
    h2 = vmm_create(32 * MIB);
    CHECK_RC(C.cuMemMap(va, 32 * MIB, 0, h, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuMemMap(va + 32 * MIB, 32 * MIB, 0, h2, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuMemRelease(h), CUDA_SUCCESS);
    CHECK_RC(C.cuMemRelease(h2), CUDA_SUCCESS);
    CHECK_USED(64 * MIB);
    CHECK_RC(C.cuMemUnmap(va, 128 * MIB), CUDA_SUCCESS);
    CHECK_USED(0);
    CHECK_RC(C.cuMemAddressFree(va, 1 * GIB), CUDA_SUCCESS);
}

/* ---- CUDA arrays: charged at an estimate before the driver allocates ---------------------------------- */

/* Arrays and what each is charged: the estimate of src/arraysize.h, worked out by hand. */
static const struct {
    CUDA_ARRAY3D_DESCRIPTOR desc;
    unsigned levels; /* 0: a plain array (cuArray3DCreate_v2), else cuMipmappedArrayCreate */
    uint64_t bytes;
} g_arrays[] = {
    /* 8192 floats x 64 layers: 2 MiB of data, but 8 rows of a layer are the unit: 16 MiB (as an H100) */
    {{8192, 0, 64, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED}, 0, 16 * MIB},
    /* 100 x 300 x 77 floats: rows of 400 -> 448 bytes, 300 -> 384 rows (blocks of 16 x 8 rows), depth
     * 77 -> 96 (blocks 32 deep): 16.5 MB -> 16 MiB (an H100 took 12: 3D is where the bound is loose) */
    {{100, 300, 77, CU_AD_FORMAT_FLOAT, 1, 0}, 0, 16 * MIB},
    /* mipmapped 1024^2 float4, 40 levels asked, 11 exist: 16 + 4 + 1 + ... = 21.3 -> 22 MiB */
    {{1024, 1024, 0, CU_AD_FORMAT_FLOAT, 4, 0}, 40, 22 * MIB},
    /* a cubemap of 512^2 floats: 6 faces of 1 MiB */
    {{512, 512, 6, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_CUBEMAP}, 0, 6 * MIB},
    /* BC7: 16 bytes per 4x4 block, 1 byte a pixel: 16 MiB */
    {{4096, 4096, 0, CU_AD_FORMAT_BC7_UNORM, 4, 0}, 0, 16 * MIB},
    /* sparse: nothing until memory is mapped into it (cuMemCreate's, charged there) */
    {{1024, 1024, 1024, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE}, 0, 0},
};
#define NN_ARRAYS (sizeof g_arrays / sizeof g_arrays[0])

static void case_arrays(void) {
    union {
        CUarray array;
        CUmipmappedArray mipmapped;
    } made[NN_ARRAYS];
    CUarray a2d, big;
    CUDA_ARRAY_DESCRIPTOR d2 = {1024, 1024, CU_AD_FORMAT_FLOAT, 4}; /* the 2D entry point: 16 MiB */
    CHECK_RC(C.cuArrayCreate_v2(&a2d, &d2), CUDA_SUCCESS);
    uint64_t used = 16 * MIB;
    CHECK_USED(used);
    for (size_t i = 0; i < NN_ARRAYS; i++) {
        if (g_arrays[i].levels == 0)
            CHECK_RC(C.cuArray3DCreate_v2(&made[i].array, &g_arrays[i].desc), CUDA_SUCCESS);
        else
            CHECK_RC(C.cuMipmappedArrayCreate(&made[i].mipmapped, &g_arrays[i].desc, g_arrays[i].levels), CUDA_SUCCESS);
        used += g_arrays[i].bytes;
        CHECK_USED(used);
    }
    CHECK(used == 92 * MIB);
    /* over the limit (128 MiB): refused before the driver allocates */
    CUDA_ARRAY_DESCRIPTOR dbig = {2048, 1024, CU_AD_FORMAT_FLOAT, 4}; /* 32 MiB + 92 fits, twice does not */
    CHECK_RC(C.cuArrayCreate_v2(&big, &dbig), CUDA_SUCCESS);
    CHECK_USED(124 * MIB);
    CUarray refused;
    CHECK_RC(C.cuArrayCreate_v2(&refused, &dbig), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_USED(124 * MIB);
    CHECK_RC(C.cuArrayDestroy(big), CUDA_SUCCESS);
    /* the driver refuses (3 channels): the charge is given back */
    CUDA_ARRAY_DESCRIPTOR bad = {1024, 1024, CU_AD_FORMAT_FLOAT, 3};
    CHECK_RC(C.cuArrayCreate_v2(&refused, &bad), CUDA_ERROR_INVALID_VALUE);
    CHECK_USED(92 * MIB);
    /* the legacy 32-bit descriptors are refused, never passed through unaccounted */
    void *legacy = NULL, *legacy3d = NULL;
    CHECK_RC(C.getProc("cuArrayCreate", &legacy, 2000, 0, NULL), CUDA_SUCCESS);
    CHECK_RC(C.getProc("cuArray3DCreate", &legacy3d, 2000, 0, NULL), CUDA_SUCCESS);
    CUDA_ARRAY_DESCRIPTOR_v1 d1v = {4096, 4096, CU_AD_FORMAT_FLOAT, 4};
    CUDA_ARRAY3D_DESCRIPTOR_v1 d3v = {256, 256, 256, CU_AD_FORMAT_FLOAT, 4, 0};
    CHECK_RC(((__typeof__(&cuArrayCreate))legacy)(&refused, &d1v), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_RC(((__typeof__(&cuArray3DCreate))legacy3d)(&refused, &d3v), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_USED(92 * MIB);
    CHECK_RC(C.cuArrayDestroy(a2d), CUDA_SUCCESS);
    for (size_t i = 0; i < NN_ARRAYS; i++) {
        if (g_arrays[i].levels == 0) CHECK_RC(C.cuArrayDestroy(made[i].array), CUDA_SUCCESS);
        else CHECK_RC(C.cuMipmappedArrayDestroy(made[i].mipmapped), CUDA_SUCCESS);
    }
    CHECK_USED(0);
    CHECK(C.cuArrayDestroy(a2d) != CUDA_SUCCESS && region_used() == 0);
}

/* ---- graph memory nodes added explicitly: charged when the graph is launched ------------------------- */

static CUDA_MEM_ALLOC_NODE_PARAMS alloc_node(size_t bytes) {
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    return p;
}

static CUgraphExec instantiate(CUgraph g) {
    CUgraphExec e;
    CHECK_RC(C.cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    return e;
}

static void case_graph_nodes(void) {
    CUstream s = new_stream();
    CUgraph g, clone;
    CUgraphNode n;
    /* over the limit (128 MiB): the launch is refused and allocates nothing */
    CUDA_MEM_ALLOC_NODE_PARAMS huge = alloc_node(200 * MIB);
    CHECK_RC(C.cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphAddMemAllocNode(&n, g, NULL, 0, &huge), CUDA_SUCCESS);
    CHECK(huge.dptr != 0);
    CHECK_RC(C.cuGraphClone(&clone, g), CUDA_ERROR_NOT_SUPPORTED); /* the driver's answer for memory nodes */
    CUgraphExec e = instantiate(g);
    CHECK_RC(C.cuGraphLaunch(e, s), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_USED(0);
    CHECK_RC(C.cuGraphExecDestroy(e), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphDestroy(g), CUDA_SUCCESS);

    /* within it: charged at launch, not when added or instantiated; freed inside: until it ends */
    CUDA_MEM_ALLOC_NODE_PARAMS kept = alloc_node(40 * MIB);
    CUgraphNodeParams scratch = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC}, freed = {.type = CU_GRAPH_NODE_TYPE_MEM_FREE};
    scratch.alloc.poolProps = kept.poolProps;
    scratch.alloc.bytesize = 30 * MIB;
    CHECK_RC(C.cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphAddMemAllocNode(&n, g, NULL, 0, &kept), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphAddNode_v2(&n, g, NULL, NULL, 0, &scratch), CUDA_SUCCESS);
    CHECK(scratch.alloc.dptr != 0);
    freed.free.dptr = scratch.alloc.dptr;
    CHECK_RC(C.cuGraphAddNode_v2(&n, g, &n, NULL, 1, &freed), CUDA_SUCCESS);
    e = instantiate(g);
    CHECK_USED(0);
    CHECK_RC(C.cuGraphLaunch(e, s), CUDA_SUCCESS);
    CHECK(region_used() == 70 * MIB && oracle()->devices[0].used_bytes == 40 * MIB);
    CHECK_RC(C.cuStreamSynchronize(s), CUDA_SUCCESS);
    launch_ns(s, 1); /* a later launch settles finished ones */
    CHECK_USED(40 * MIB);
    CHECK_RC(C.cuGraphLaunch(e, s), CUDA_ERROR_INVALID_VALUE); /* its allocation is still live */
    CHECK_USED(40 * MIB);
    /* a free node in another graph gives it back when that graph runs */
    CUgraph g2;
    CHECK_RC(C.cuGraphCreate(&g2, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphAddMemFreeNode(&n, g2, NULL, 0, kept.dptr), CUDA_SUCCESS);
    CUgraphExec e2 = instantiate(g2);
    CHECK_RC(C.cuGraphLaunch(e2, s), CUDA_SUCCESS);
    CHECK_USED(0);

    /* CUDA 12.2's cuGraphAddNode (no edge data), freed by cuMemFree as the driver allows */
    void *add12 = NULL;
    CHECK_RC(C.getProc("cuGraphAddNode", &add12, 12020, 0, NULL), CUDA_SUCCESS);
    CUgraph g3;
    CUgraphNodeParams p12 = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC};
    p12.alloc.poolProps = kept.poolProps;
    p12.alloc.bytesize = 20 * MIB;
    CHECK_RC(C.cuGraphCreate(&g3, 0), CUDA_SUCCESS);
    CHECK_RC(((__typeof__(&cuGraphAddNode))add12)(&n, g3, NULL, 0, &p12), CUDA_SUCCESS);
    CUgraphExec e3 = instantiate(g3);
    CHECK_RC(C.cuGraphLaunch(e3, s), CUDA_SUCCESS);
    CHECK_USED(20 * MIB);
    CHECK_RC(C.cuMemFree_v2(p12.alloc.dptr), CUDA_SUCCESS);
    CHECK_USED(0);

    /* a child graph moved into its parent: its allocation nodes run with the parent */
    CUgraph child, parent;
    CUDA_MEM_ALLOC_NODE_PARAMS inner = alloc_node(50 * MIB);
    CHECK_RC(C.cuGraphCreate(&child, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphAddMemAllocNode(&n, child, NULL, 0, &inner), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphCreate(&parent, 0), CUDA_SUCCESS);
    CUgraphNodeParams move = {.type = CU_GRAPH_NODE_TYPE_GRAPH};
    move.graph.graph = child;
    move.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
    CHECK_RC(C.cuGraphAddNode_v2(&n, parent, NULL, NULL, 0, &move), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphDestroy(child), CUDA_ERROR_INVALID_VALUE); /* the parent's now */
    CUgraphExec e4 = instantiate(parent);
    CHECK_RC(C.cuGraphLaunch(e4, s), CUDA_SUCCESS);
    CHECK_USED(50 * MIB);
    CHECK_RC(C.cuMemFree_v2(inner.dptr), CUDA_SUCCESS);
    CHECK_USED(0);
    CUgraphExec execs[] = {e, e2, e3, e4};
    CUgraph graphs[] = {g, g2, g3, parent};
    for (int i = 0; i < 4; i++) {
        CHECK_RC(C.cuGraphExecDestroy(execs[i]), CUDA_SUCCESS);
        CHECK_RC(C.cuGraphDestroy(graphs[i]), CUDA_SUCCESS);
    }
}

/* ---- context limits that reserve device memory --------------------------------------------------------- */

static size_t get_limit(CUlimit limit) {
    size_t v = 0;
    CHECK_RC(C.cuCtxGetLimit(&v, limit), CUDA_SUCCESS);
    return v;
}

static void case_limits(void) {
    const uint64_t threads = 132 * 2048; /* the fake's SMs x threads per SM, as an H100 */
    const uint64_t fifo = 8650752, heap = 8 * MIB; /* the defaults: context memory, not charged */
    CHECK(get_limit(CU_LIMIT_STACK_SIZE) == 1024 && get_limit(CU_LIMIT_PRINTF_FIFO_SIZE) == fifo &&
          get_limit(CU_LIMIT_MALLOC_HEAP_SIZE) == heap);
    /* the stack is per thread, for every thread the device holds: 256 more bytes = 66 MiB */
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1280), CUDA_SUCCESS);
    CHECK_USED(256 * threads);
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 2048), CUDA_ERROR_OUT_OF_MEMORY); /* 264 MiB more */
    CHECK(get_limit(CU_LIMIT_STACK_SIZE) == 1280);
    CHECK_USED(256 * threads);
    /* the heap: the increase over the current value; a refused one leaves the limit as it was */
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 40 * MIB), CUDA_SUCCESS);
    CHECK_USED(256 * threads + 32 * MIB);
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 100000001), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(get_limit(CU_LIMIT_MALLOC_HEAP_SIZE) == 40 * MIB);
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 16 * MIB), CUDA_SUCCESS);
    CHECK_USED(256 * threads + 32 * MIB + 16 * MIB - fifo);
    /* a decrease gives back what was charged, no more: 1000 is set as 1008, below the default */
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1000), CUDA_SUCCESS);
    CHECK(get_limit(CU_LIMIT_STACK_SIZE) == 1008);
    CHECK_USED(32 * MIB + 16 * MIB - fifo);
    /* now it fits; the driver sets 100007936 (8 KiB steps) and the charge follows it */
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 100000001), CUDA_SUCCESS);
    CHECK(get_limit(CU_LIMIT_MALLOC_HEAP_SIZE) == 100007936);
    CHECK_USED(100007936 - heap + 16 * MIB - fifo);
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 0), CUDA_SUCCESS); /* set as 4 MiB */
    CHECK_USED(16 * MIB - fifo);
    /* raised from below its default, it is charged again: the default was never charged, so
     * nothing was given back when it was lowered (the driver's account does not show it) */
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, heap), CUDA_SUCCESS);
    CHECK(region_used() == 16 * MIB - fifo + 4 * MIB && oracle()->devices[0].used_bytes == 16 * MIB - fifo);
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 0), CUDA_SUCCESS);
    CHECK_USED(16 * MIB - fifo);
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, fifo), CUDA_SUCCESS);
    CHECK_USED(0);
    /* limits that reserve no memory pass through */
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 4096), CUDA_SUCCESS);
    CHECK_USED(0);
    /* each context has its own limits */
    CUcontext primary, other;
    CHECK_RC(C.cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuCtxCreate_v4(&other, NULL, 0, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuCtxSetCurrent(other), CUDA_SUCCESS);
    CHECK(get_limit(CU_LIMIT_MALLOC_HEAP_SIZE) == heap);
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 24 * MIB), CUDA_SUCCESS);
    CHECK_USED(16 * MIB);
    CHECK_RC(C.cuCtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 0), CUDA_SUCCESS); /* the primary's: nothing to give */
    CHECK_USED(16 * MIB);
    CHECK_RC(C.cuCtxSetCurrent(other), CUDA_SUCCESS);
    CHECK_RC(C.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, heap), CUDA_SUCCESS);
    CHECK_USED(0);
    CHECK_RC(C.cuCtxDestroy_v2(other), CUDA_SUCCESS);
    CHECK_RC(C.cuCtxSetCurrent(primary), CUDA_SUCCESS);
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
    CHECK(region_used() == 10 * MIB && (R.state->procs[0].flags & NN_PROC_F_CAPTURING) == 0);
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

static void case_capture_never_sleeps(void) {
    CUstream s = new_stream();
    launch_ns(s, 2000000); /* 2 ms at a 10 % share: two windows of debt */
    CHECK_RC(C.cuStreamSynchronize(s), CUDA_SUCCESS);
    uint64_t throttled = R.state->devices[0].throttled_ns_total;
    CHECK_RC(C.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK(R.state->procs[0].flags & NN_PROC_F_CAPTURING);
    __atomic_fetch_or(&R.control->container.control, NN_CTL_PAUSED, __ATOMIC_RELEASE); /* not even a pause */
    for (int i = 0; i < 100; i++) launch_ns(s, 100000);
    CUgraph g;
    CHECK_RC(C.cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK(R.state->devices[0].throttled_ns_total == throttled); /* nothing was held while capturing */
    __atomic_fetch_and(&R.control->container.control, ~NN_CTL_PAUSED, __ATOMIC_RELEASE);
    /* the graph itself is paced: the next launch after it waits out its debt */
    CUgraphExec exec;
    CHECK_RC(C.cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphLaunch(exec, s), CUDA_SUCCESS);
    CHECK_RC(C.cuStreamSynchronize(s), CUDA_SUCCESS);
    launch_ns(s, 1000);
    CHECK(R.state->devices[0].throttled_ns_total > throttled);
    CHECK(R.state->devices[0].kernel_ns_total >= 12000000u); /* the kernel's 2 ms and the graph's 10 ms */
    CHECK_RC(C.cuGraphExecDestroy(exec), CUDA_SUCCESS);
    CHECK_RC(C.cuGraphDestroy(g), CUDA_SUCCESS);
}

static volatile int g_released;

static void *release_later(void *arg) {
    uint32_t flag = (uint32_t)(uintptr_t)arg;
    nn_test_sleep_ms(50);
    g_released = 1;
    if (flag == NN_CTL_PAUSED) __atomic_fetch_and(&R.control->container.control, ~flag, __ATOMIC_RELEASE);
    else __atomic_fetch_or(&R.control->container.control, flag, __ATOMIC_RELEASE);
    return NULL;
}

static void case_pause(void) {
    CUstream s = new_stream();
    launch_ns(s, 1000);
    uint64_t launches = oracle()->procs[0].launches;
    __atomic_fetch_or(&R.control->container.control, NN_CTL_PAUSED, __ATOMIC_RELEASE);
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
    CHECK(g_released && (R.state->procs[0].flags & NN_PROC_F_ADMITTED));
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
    /* CUDA_DEVICE_MEMORY_LIMIT=64m in the environment; honoured only in a WORKSTATION region */
    int workstation = (R.control->header.flags & NN_REGION_F_WORKSTATION) != 0;
    uint64_t want = workstation ? 64 * MIB : 128 * MIB;
    size_t free_b, total;
    CHECK_RC(C.cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
    CHECK(total == want);
    CUdeviceptr p;
    CHECK_RC(C.cuMemAlloc_v2(&p, 100 * MIB), workstation ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS);
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
    for (unsigned i = 0; i < NN_MAX_PROCS; i++) slots += R.state->procs[i].state == NN_SLOT_ACTIVE;
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
        fprintf(stderr, "usage: %s <case> <region dir>\n", argv[0]);
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
    R = nn_test_region_open(REGION);
    if (strcmp(name, "admission") == 0) {
        case_admission();
        return 0;
    }
    nn_cuda_start(&C);
    if (strcmp(name, "lookup") == 0) case_lookup();
    else if (strcmp(name, "memory") == 0) case_memory();
    else if (strcmp(name, "vmm") == 0) case_vmm();
    else if (strcmp(name, "vmm-mapped") == 0) case_vmm_mapped();
    else if (strcmp(name, "arrays") == 0) case_arrays();
    else if (strcmp(name, "graph-nodes") == 0) case_graph_nodes();
    else if (strcmp(name, "limits") == 0) case_limits();
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
