/*
 * vmm.c — VMM physical memory (PyTorch expandable segments, NCCL): cuMemCreate, cuMemMap,
 * cuMemUnmap, cuMemRetainAllocationHandle, cuMemRelease.
 *
 * cuMemCreate of device memory is charged before the driver allocates, like any allocation. The
 * usual idiom releases the handle right after mapping it (create -> map -> release), and the
 * driver frees the memory only "when all outstanding mappings to the memory are unmapped and when
 * all outstanding references to the handle are also released". So each handle keeps its
 * references (create 1, retain +1, release -1) and its mapped VA ranges (vmmtrack.h), and the
 * charge is given back, after the driver's call, only when both are gone: at the last cuMemRelease
 * of an unmapped handle, or at the cuMemUnmap that removes its last mapping. Address reservations
 * cost nothing. Handles of host memory and imported handles are not charged, so not tracked.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <pthread.h>
#include <string.h>

#include "vmmtrack.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static nn_vmm g_vmm; /* under g_lock */

static void give_back(void *ctx, const nn_ptr_entry *e) {
    (void)ctx;
    nn_uncharge(e->dev, e->size);
}

NN_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    NN_REQUIRE(nn_real.cuMemCreate);
    if (handle == NULL || prop == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return nn_real.cuMemCreate(handle, size, prop, flags);
    int dev = nn_device_entry_of(prop->location.id);
    CUresult rc = nn_charge(dev, size);
    if (rc != CUDA_SUCCESS) return rc;
    rc = nn_real.cuMemCreate(handle, size, prop, flags);
    if (rc != CUDA_SUCCESS) {
        nn_uncharge(dev, size);
        return rc;
    }
    pthread_mutex_lock(&g_lock);
    int failed = nn_vmm_create(&g_vmm, (uint64_t)*handle, size, dev);
    pthread_mutex_unlock(&g_lock);
    if (failed) nn_log("out of host memory tracking a VMM allocation: it stays charged");
    return rc;
}

NN_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    NN_REQUIRE(nn_real.cuMemRelease);
    CUresult rc = nn_real.cuMemRelease(handle);
    if (rc != CUDA_SUCCESS) return rc;
    nn_ptr_entry gone;
    pthread_mutex_lock(&g_lock);
    int freed = nn_vmm_release(&g_vmm, (uint64_t)handle, &gone) == 1;
    pthread_mutex_unlock(&g_lock);
    if (freed) give_back(NULL, &gone);
    return rc;
}

NN_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
    NN_REQUIRE(nn_real.cuMemMap);
    CUresult rc = nn_real.cuMemMap(ptr, size, offset, handle, flags);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_lock);
    int recorded = nn_vmm_map(&g_vmm, (uint64_t)ptr, size, (uint64_t)handle);
    if (recorded == -2) { /* the driver mapped it, so what we recorded there was unmapped unseen */
        nn_vmm_unmap(&g_vmm, (uint64_t)ptr, size, NN_VMM_OVERLAP, give_back, NULL);
        recorded = nn_vmm_map(&g_vmm, (uint64_t)ptr, size, (uint64_t)handle);
    }
    pthread_mutex_unlock(&g_lock);
    /* -1: not a handle we charged (host memory, imported): nothing to keep */
    if (recorded == -3) nn_log("out of host memory tracking a VMM mapping: its memory stays charged");
    return rc;
}

NN_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    NN_REQUIRE(nn_real.cuMemUnmap);
    CUresult rc = nn_real.cuMemUnmap(ptr, size);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&g_lock);
    nn_vmm_unmap(&g_vmm, (uint64_t)ptr, size, NN_VMM_OVERLAP, give_back, NULL);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* The handle behind a mapped address, with one more reference that a cuMemRelease must match
 * (NCCL frees through it). The driver returns the handle cuMemCreate returned (measured). */
NN_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    NN_REQUIRE(nn_real.cuMemRetainAllocationHandle);
    CUresult rc = nn_real.cuMemRetainAllocationHandle(handle, addr);
    if (rc != CUDA_SUCCESS || handle == NULL) return rc;
    pthread_mutex_lock(&g_lock);
    int known = nn_vmm_retain(&g_vmm, (uint64_t)*handle);
    uint64_t mapped = known ? 0 : nn_vmm_handle_at(&g_vmm, (uint64_t)(uintptr_t)addr);
    pthread_mutex_unlock(&g_lock);
    if (mapped != 0) { /* a driver that hands out another value for the same memory: keep it charged */
        static int logged;
        if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
            nn_log("cuMemRetainAllocationHandle returned a handle the shim does not know for mapped memory: "
                   "that memory stays charged until the process exits");
    }
    return rc;
}

void nn_vmm_after_fork(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&g_lock, &fresh, sizeof fresh);
    nn_vmm_clear(&g_vmm);
}
