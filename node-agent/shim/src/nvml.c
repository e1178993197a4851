/*
 * nvml.c — NVML memory figures seen from inside the container: the same numbers as
 * cuMemGetInfo_v2 (total = min(limit, physical), used = the container's usage, free = the rest),
 * so a framework that sizes its cache from NVML (vLLM's pattern) sees the slice, not the GPU.
 * A device the container was not given reports 0 bytes.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <string.h>

int nn_nvml_entry_of(const char *uuid); /* state.c */
void nn_report_nvml(int entry, unsigned long long *total, unsigned long long *free_bytes,
                    unsigned long long *used); /* memory.c */

static int entry_of(nvmlDevice_t device) {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (nn_real.nvmlDeviceGetUUID == NULL || nn_real.nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return -1;
    return nn_nvml_entry_of(uuid);
}

/* NVML has no error for "no region": report nothing usable, as cuInit refuses. */
static int region_ready(void) { return nn_ready() == CUDA_SUCCESS; }

NN_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nn_resolve_nvml();
    if (nn_real.nvmlDeviceGetMemoryInfo == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = nn_real.nvmlDeviceGetMemoryInfo(device, memory);
    if (rc != NVML_SUCCESS || memory == NULL) return rc;
    if (!region_ready()) return NVML_ERROR_NO_PERMISSION;
    nn_report_nvml(entry_of(device), &memory->total, &memory->free, &memory->used);
    return rc;
}

NN_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nn_resolve_nvml();
    if (nn_real.nvmlDeviceGetMemoryInfo_v2 == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = nn_real.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (rc != NVML_SUCCESS || memory == NULL) return rc;
    if (!region_ready()) return NVML_ERROR_NO_PERMISSION;
    memory->reserved = 0; /* the slice has no driver-reserved part: total = used + free */
    nn_report_nvml(entry_of(device), &memory->total, &memory->free, &memory->used);
    return rc;
}
