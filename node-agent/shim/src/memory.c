/*
 * memory.c — the allocation family, memory reporting, and graph memory.
 *
 * Every allocation is check-and-charge BEFORE the driver allocates (under the region's robust
 * lock, against the device and container limits of all the container's processes), and uncharged
 * AFTER the driver frees, so the driver's own account is never above the region's, and the
 * region's never above the limit. Over a limit the caller gets CUDA_ERROR_OUT_OF_MEMORY.
 * Reporting: total = min(limit, physical), free = total - the container's usage, through
 * cuMemGetInfo_v2 and cuDeviceTotalMem_v2 here and NVML in nvml.c.
 *
 * Stream capture: cuMemAllocAsync / cuMemFreeAsync on a capturing stream allocate nothing yet;
 * they are handed to graphmem.c, which charges them when the graph is launched.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ptrmap.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static nn_ptrmap g_ptrs;    /* device address or CUDA array -> charged bytes */
static nn_ptrmap g_pools;   /* memory pool -> region entry (in .dev) */
static uint64_t g_last_reap_ns;

#define NN_REAP_INTERVAL_NS UINT64_C(20000000) /* at most every 20 ms per process */

/* ---- charging ------------------------------------------------------------------------------------- */

/* Does NVML still list `host_pid` on any device (the driver still holds its memory)? */
static int driver_has_pid(int32_t host_pid) {
    nn_resolve_nvml();
    static int nvml_started; /* NVML counts its initialisations: ours does not end the app's */
    if (!__atomic_load_n(&nvml_started, __ATOMIC_ACQUIRE) && nn_real.nvmlInit_v2 != NULL &&
        nn_real.nvmlInit_v2() == NVML_SUCCESS)
        __atomic_store_n(&nvml_started, 1, __ATOMIC_RELEASE);
    if (!__atomic_load_n(&nvml_started, __ATOMIC_ACQUIRE) || nn_real.nvmlDeviceGetCount_v2 == NULL || nn_real.nvmlDeviceGetHandleByIndex_v2 == NULL ||
        nn_real.nvmlDeviceGetComputeRunningProcesses_v3 == NULL)
        return 1; /* cannot tell: keep it charged (the agent orders the reclaim) */
    unsigned count = 0;
    if (nn_real.nvmlDeviceGetCount_v2(&count) != NVML_SUCCESS) return 1;
    for (unsigned d = 0; d < count; d++) {
        nvmlDevice_t dev;
        nvmlProcessInfo_t infos[256];
        unsigned n = 256;
        if (nn_real.nvmlDeviceGetHandleByIndex_v2(d, &dev) != NVML_SUCCESS) return 1;
        if (nn_real.nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, infos) != NVML_SUCCESS) return 1;
        for (unsigned i = 0; i < n; i++)
            if ((int32_t)infos[i].pid == host_pid) return 1;
    }
    return 0;
}

static int reap(void) {
    uint64_t now = nn_now_ns();
    uint64_t last = __atomic_load_n(&g_last_reap_ns, __ATOMIC_RELAXED);
    if (now - last < NN_REAP_INTERVAL_NS && last != 0) return 0;
    __atomic_store_n(&g_last_reap_ns, now, __ATOMIC_RELAXED);
    if (nn_region_lock(nn_g.region) != 0) return 0;
    int freed = nn_region_reap_locked(nn_g.region, nn_g.slot, driver_has_pid);
    nn_region_unlock(nn_g.region);
    return freed;
}

CUresult nn_charge(int dev, uint64_t size) {
    CUresult rc = nn_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (dev < 0) return CUDA_ERROR_OUT_OF_MEMORY; /* a device the container was not given */
    if (size == 0) return CUDA_SUCCESS;
    int ok = nn_region_charge(nn_g.region, nn_g.slot, dev, size, nn_device_limit(dev));
    if (ok == 0 && reap() > 0) ok = nn_region_charge(nn_g.region, nn_g.slot, dev, size, nn_device_limit(dev));
    if (ok == 1) return CUDA_SUCCESS;
    if (ok < 0) nn_log("region lock not taken in time: allocation refused");
    __atomic_fetch_add(&nn_g.region->state->devices[dev].oom_refusals_total, 1, __ATOMIC_RELAXED);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

void nn_uncharge(int dev, uint64_t size) {
    if (nn_g.region != NULL && nn_g.slot >= 0) nn_region_uncharge(nn_g.region, nn_g.slot, dev, size);
}

void nn_track(uint64_t key, uint64_t size, int dev, uint32_t kind) {
    pthread_mutex_lock(&g_lock);
    int rc = nn_ptrmap_put(&g_ptrs, (nn_ptr_entry){key, size, dev, kind, 0});
    pthread_mutex_unlock(&g_lock);
    if (rc != 0) nn_log("out of host memory tracking an allocation: it stays charged");
}

int nn_tracked(uint64_t key) {
    pthread_mutex_lock(&g_lock);
    int found = nn_ptrmap_find(&g_ptrs, key) != NULL;
    pthread_mutex_unlock(&g_lock);
    return found;
}

int nn_untrack(uint64_t key, uint64_t *size, int *dev) {
    nn_ptr_entry e;
    pthread_mutex_lock(&g_lock);
    int found = nn_ptrmap_take(&g_ptrs, key, &e);
    pthread_mutex_unlock(&g_lock);
    if (found) {
        *size = e.size;
        *dev = e.dev;
    }
    return found;
}

void nn_untrack_and_uncharge(uint64_t key) {
    uint64_t size;
    int dev;
    if (nn_untrack(key, &size, &dev)) nn_uncharge(dev, size);
}

/* ---- synchronous allocations --------------------------------------------------------------------------- */

NN_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    NN_REQUIRE(nn_real.cuMemAlloc_v2);
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    NN_CHARGED_CALL(nn_current_entry(), size, *dptr, NN_KIND_ALLOC, nn_real.cuMemAlloc_v2(dptr, size));
}

NN_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    NN_REQUIRE(nn_real.cuMemAllocManaged);
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    NN_CHARGED_CALL(nn_current_entry(), size, *dptr, NN_KIND_ALLOC, nn_real.cuMemAllocManaged(dptr, size, flags));
}

NN_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned int elem) {
    NN_REQUIRE(nn_real.cuMemAllocPitch_v2);
    if (dptr == NULL || pitch == NULL) return CUDA_ERROR_INVALID_VALUE;
    int dev = nn_current_entry();
    /* the pitch is known only afterwards: charge the widest the driver pads to, then settle */
    if (width > SIZE_MAX - 511 || (height != 0 && ((width + 511) & ~(size_t)511) > SIZE_MAX / height))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t estimate = (uint64_t)((width + 511) & ~(size_t)511) * height;
    CUresult rc = nn_charge(dev, estimate);
    if (rc != CUDA_SUCCESS) return rc;
    rc = nn_real.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS) {
        nn_uncharge(dev, estimate);
        return rc;
    }
    uint64_t actual = (uint64_t)*pitch * height;
    if (actual > estimate && nn_charge(dev, actual - estimate) != CUDA_SUCCESS) {
        if (nn_real.cuMemFree_v2 != NULL) nn_real.cuMemFree_v2(*dptr);
        nn_uncharge(dev, estimate);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < estimate) nn_uncharge(dev, estimate - actual);
    nn_track((uint64_t)*dptr, actual, dev, NN_KIND_ALLOC);
    return CUDA_SUCCESS;
}

NN_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    NN_REQUIRE(nn_real.cuMemFree_v2);
    CUresult rc = nn_real.cuMemFree_v2(dptr);
    if (rc == CUDA_SUCCESS) nn_untrack_and_uncharge((uint64_t)dptr);
    return rc;
}

/* Legacy 32-bit entry points (CUDA < 3.2): never accounted, so refused. */
NN_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size) {
    (void)dptr, (void)size;
    return CUDA_ERROR_NOT_SUPPORTED;
}

NN_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                                   unsigned int e) {
    (void)dptr, (void)pitch, (void)w, (void)h, (void)e;
    return CUDA_ERROR_NOT_SUPPORTED;
}

NN_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total) {
    (void)free_bytes, (void)total;
    return CUDA_ERROR_NOT_SUPPORTED;
}

NN_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    (void)bytes, (void)dev;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- stream-ordered allocations and pools ----------------------------------------------------------------- */

static CUresult alloc_async(CUdeviceptr *dptr, size_t size, int dev, CUstream stream, int ptds,
                            CUresult (*call)(CUdeviceptr *, size_t, void *, CUstream), void *pool) {
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (nn_capturing(stream, ptds)) { /* a graph memory node: charged when the graph runs */
        CUresult rc = call(dptr, size, pool, stream);
        if (rc == CUDA_SUCCESS) nn_capture_record(stream, ptds, (uint64_t)*dptr, size, dev, 0);
        return rc;
    }
    NN_CHARGED_CALL(dev, size, *dptr, NN_KIND_ALLOC, call(dptr, size, pool, stream));
}

static CUresult call_async(CUdeviceptr *p, size_t n, void *pool, CUstream s) {
    (void)pool;
    return nn_real.cuMemAllocAsync(p, n, s);
}
static CUresult call_async_ptsz(CUdeviceptr *p, size_t n, void *pool, CUstream s) {
    (void)pool;
    return nn_real.cuMemAllocAsync_ptsz(p, n, s);
}
static CUresult call_pool(CUdeviceptr *p, size_t n, void *pool, CUstream s) {
    return nn_real.cuMemAllocFromPoolAsync(p, n, (CUmemoryPool)pool, s);
}
static CUresult call_pool_ptsz(CUdeviceptr *p, size_t n, void *pool, CUstream s) {
    return nn_real.cuMemAllocFromPoolAsync_ptsz(p, n, (CUmemoryPool)pool, s);
}

NN_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
    NN_REQUIRE(nn_real.cuMemAllocAsync);
    return alloc_async(dptr, size, nn_current_entry(), s, 0, call_async, NULL);
}

NN_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
    NN_REQUIRE(nn_real.cuMemAllocAsync_ptsz);
    return alloc_async(dptr, size, nn_current_entry(), s, 1, call_async_ptsz, NULL);
}

#define NN_HOST_POOL (-3)

static int pool_entry(CUmemoryPool pool) {
    pthread_mutex_lock(&g_lock);
    nn_ptr_entry *e = nn_ptrmap_find(&g_pools, (uint64_t)(uintptr_t)pool);
    int dev = e != NULL ? e->dev : -2;
    pthread_mutex_unlock(&g_lock);
    return dev == -2 ? nn_current_entry() : dev; /* a device's default pool: the current device */
}

NN_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    NN_REQUIRE(nn_real.cuMemAllocFromPoolAsync);
    int dev = pool_entry(pool);
    if (dev == NN_HOST_POOL) return nn_real.cuMemAllocFromPoolAsync(dptr, size, pool, s);
    return alloc_async(dptr, size, dev, s, 0, call_pool, pool);
}

NN_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    NN_REQUIRE(nn_real.cuMemAllocFromPoolAsync_ptsz);
    int dev = pool_entry(pool);
    if (dev == NN_HOST_POOL) return nn_real.cuMemAllocFromPoolAsync_ptsz(dptr, size, pool, s);
    return alloc_async(dptr, size, dev, s, 1, call_pool_ptsz, pool);
}

static CUresult free_async(CUdeviceptr dptr, CUstream s, int ptds, CUresult (*call)(CUdeviceptr, CUstream)) {
    int capturing = nn_capturing(s, ptds);
    CUresult rc = call(dptr, s);
    if (rc != CUDA_SUCCESS) return rc;
    if (capturing)
        nn_capture_record(s, ptds, (uint64_t)dptr, 0, -1, 1);
    else
        nn_untrack_and_uncharge((uint64_t)dptr);
    return rc;
}

NN_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
    NN_REQUIRE(nn_real.cuMemFreeAsync);
    return free_async(dptr, s, 0, nn_real.cuMemFreeAsync);
}

NN_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) {
    NN_REQUIRE(nn_real.cuMemFreeAsync_ptsz);
    return free_async(dptr, s, 1, nn_real.cuMemFreeAsync_ptsz);
}

NN_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    NN_REQUIRE(nn_real.cuMemPoolCreate);
    CUresult rc = nn_real.cuMemPoolCreate(pool, props);
    if (rc != CUDA_SUCCESS || pool == NULL || props == NULL) return rc;
    /* a pool of host memory charges nothing on the GPU; a device pool charges its device */
    int dev = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? nn_device_entry_of(props->location.id)
                                                                   : NN_HOST_POOL;
    pthread_mutex_lock(&g_lock);
    nn_ptrmap_put(&g_pools, (nn_ptr_entry){(uint64_t)(uintptr_t)*pool, 0, dev, 0, 0});
    pthread_mutex_unlock(&g_lock);
    return rc;
}

NN_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    NN_REQUIRE(nn_real.cuMemPoolDestroy);
    CUresult rc = nn_real.cuMemPoolDestroy(pool);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_lock);
        nn_ptrmap_take(&g_pools, (uint64_t)(uintptr_t)pool, NULL);
        pthread_mutex_unlock(&g_lock);
    }
    return rc;
}

/* ---- reporting ------------------------------------------------------------------------------------------------ */

/* total = min(device limit, container limit, physical); free = total - the container's usage. */
static void report(int entry, size_t *free_bytes, size_t *total) {
    if (entry < 0) { /* not the container's device */
        if (free_bytes != NULL) *free_bytes = 0;
        if (total != NULL) *total = 0;
        return;
    }
    uint64_t limit = nn_device_limit(entry);
    uint64_t container = __atomic_load_n(&nn_g.region->control->container.memory_limit_bytes, __ATOMIC_ACQUIRE);
    uint64_t t = total != NULL ? (uint64_t)*total : UINT64_MAX;
    if (limit < t) t = limit;
    if (container < t) t = container;
    uint64_t used = __atomic_load_n(&nn_g.region->state->devices[entry].memory_used_bytes, __ATOMIC_ACQUIRE);
    if (total != NULL) *total = (size_t)t;
    if (free_bytes != NULL) *free_bytes = (size_t)(t > used ? t - used : 0);
}

/* NVML's numbers for region entry `entry` (nvml.c). */
void nn_report_nvml(int entry, unsigned long long *total, unsigned long long *free_bytes, unsigned long long *used);
void nn_report_nvml(int entry, unsigned long long *total, unsigned long long *free_bytes, unsigned long long *used) {
    size_t t = (size_t)*total, f = 0;
    report(entry, &f, &t);
    *total = t;
    *free_bytes = f;
    *used = t - f;
}

NN_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    NN_REQUIRE(nn_real.cuMemGetInfo_v2);
    CUresult rc = nn_real.cuMemGetInfo_v2(free_bytes, total);
    if (rc == CUDA_SUCCESS) report(nn_current_entry(), free_bytes, total);
    return rc;
}

NN_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    NN_REQUIRE(nn_real.cuDeviceTotalMem_v2);
    CUresult rc = nn_real.cuDeviceTotalMem_v2(bytes, dev);
    if (rc == CUDA_SUCCESS) report(nn_device_entry_of(dev), NULL, bytes);
    return rc;
}

void nn_memory_after_fork(void) {
    /* the lock may have been held by another thread of the parent at fork time */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&g_lock, &fresh, sizeof fresh);
    nn_ptrmap_clear(&g_ptrs);
    nn_ptrmap_clear(&g_pools);
}
