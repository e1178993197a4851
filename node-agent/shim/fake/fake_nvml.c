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
#include <time.h>

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
    int32_t shown[FAKE_MAX_PROCS];
    fake_state_lock(g_state);
    fake_state_survey(g_state, shown);
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

/* Processes holding memory on the device (the driver's view: dead processes are gone), by the PIDs
 * the caller's /proc gives them: host PIDs for the host or a hostPID agent (fake_state.h). */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    if (!valid(device) || count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0, cap = *count;
    int32_t shown[FAKE_MAX_PROCS];
    fake_state_lock(g_state);
    fake_state_survey(g_state, shown);
    for (unsigned i = 0; i < FAKE_MAX_PROCS; i++) {
        const fake_proc *p = &g_state->procs[i];
        if (p->pid == 0 || shown[i] == 0) continue;
        if (infos != NULL && n < cap) {
            infos[n].pid = (unsigned)shown[i];
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

/* ---- discovery: what the node agent's NVML backend (neuronetes_agent.daemon.nvml) asks ------
 * A plain PCIe GPU without NVLink or MIG: the readings a GPU may lack answer NOT_SUPPORTED (the
 * agent records them as unknown), XID events never come (a wait sleeps its timeout). */

struct nvmlEventSet_st {
    int unused;
};
static struct nvmlEventSet_st g_event_set;

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (!valid(device) || name == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    int n = snprintf(name, length, "NVIDIA Fake GPU");
    return n < 0 || (unsigned)n >= length ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    if (!valid(device) || pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->bus = device->index + 1;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    pci->pciDeviceId = 0x233010DE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    if (!valid(device) || minorNumber == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (g_state == NULL) return NVML_ERROR_UNINITIALIZED;
    int n = snprintf(version, length, "550.0.fake");
    return n < 0 || (unsigned)n >= length ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    if (cudaDriverVersion == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = 12040;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                                unsigned long *nodeSet, nvmlAffinityScope_t scope) {
    (void)nodeSetSize, (void)nodeSet, (void)scope;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet) {
    (void)cpuSetSize, (void)cpuSet;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen) {
    (void)currLinkGen;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    (void)currentMode, (void)pendingMode;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    (void)link, (void)isActive;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    (void)utilization;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    (void)temperature;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    (void)power;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    (void)errorType, (void)counterType, (void)eccCounts;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    (void)reasons;
    return valid(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *set = &g_event_set;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    (void)eventTypes;
    return valid(device) && set == &g_event_set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (set != &g_event_set || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec ts = {timeoutms / 1000, (long)(timeoutms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    return NVML_ERROR_TIMEOUT;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    return set == &g_event_set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}
