/*
 * fake_nvml.c — a fake libnvidia-ml.so.1 over the same simulated GPUs as fake_cuda.c (tests and
 * benchmarks only). Memory figures and the process list come from the shared account
 * (fake_state.h), so NVML and CUDA agree, as on a real node. Compiled against the real nvml.h.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>

#include <stdio.h>
#include <string.h>

#include "fake_state.h"

#define EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st {
    unsigned index;
};

static struct nvmlDevice_st g_devices[FAKE_MAX_DEVICES] = {{0}, {1}, {2}, {3}};
static fake_state *g_state;

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    g_state = fake_state_open();
    return g_state != NULL ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
}

EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    return result == NVML_SUCCESS ? "Success" : "Fake NVML error";
}

static int valid(nvmlDevice_t d) {
    return g_state != NULL && d != NULL && d >= g_devices && d < g_devices + FAKE_MAX_DEVICES &&
           d->index < g_state->device_count;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (g_state == NULL) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_state->device_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (g_state == NULL) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= g_state->device_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    if (!valid(device) || index == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (!valid(device) || uuid == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    char buf[41];
    fake_device_uuid(device->index, buf);
    if (length < sizeof buf) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, buf, sizeof buf);
    return NVML_SUCCESS;
}

static void memory_of(unsigned index, unsigned long long *total, unsigned long long *used) {
    fake_state_lock(g_state);
    fake_state_reap(g_state);
    *total = g_state->devices[index].total_bytes;
    *used = g_state->devices[index].used_bytes;
    fake_state_unlock(g_state);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!valid(device) || memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total, used;
    memory_of(device->index, &total, &used);
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (!valid(device) || memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used;
    memory_of(device->index, &total, &used);
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

/* Processes holding memory on the device (the driver's view: dead processes are gone). */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    if (!valid(device) || count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0, cap = *count;
    fake_state_lock(g_state);
    fake_state_reap(g_state);
    for (unsigned i = 0; i < FAKE_MAX_PROCS; i++) {
        const fake_proc *p = &g_state->procs[i];
        if (p->pid == 0) continue;
        if (infos != NULL && n < cap) {
            infos[n].pid = (unsigned)p->pid;
            infos[n].usedGpuMemory = p->used[device->index];
            infos[n].gpuInstanceId = 0xFFFFFFFFu;
            infos[n].computeInstanceId = 0xFFFFFFFFu;
        }
        n++;
    }
    fake_state_unlock(g_state);
    *count = n;
    return (infos == NULL && n > 0) || n > cap ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
