/*
 * shim.h — internal interface of libneuronetes-cuda.so (see docs/shim.md).
 *
 * Every hook is defined under its cuda.h / nvml.h name in a file that includes the real headers
 * with __CUDA_API_VERSION_INTERNAL (so versioned `_v2` and per-thread-stream `_ptsz` names are all
 * declared, un-renamed): a hook whose signature differs from the header's is a compile error
 * ("conflicting types"). The real entry points are held in `nn_real`, whose fields are typed
 * `__typeof__(&name)` from the same declarations, and lookup.c asserts each hook and its real
 * pointer have one type.
 */
#ifndef NN_SHIM_H
#define NN_SHIM_H

#define __CUDA_API_VERSION_INTERNAL 1
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <cuda.h>
#include <nvml.h>

#include <stdint.h>
#include <sys/types.h>

#include "neuronetes_region.h"

#define NN_EXPORT __attribute__((visibility("default")))

/* A hook's preamble: the region is usable (else its refusal) and the real entry point exists. */
#define NN_REQUIRE(real)                                             \
    do {                                                             \
        CUresult nn_ready_ = nn_ready();                             \
        if (nn_ready_ != CUDA_SUCCESS) return nn_ready_;             \
        if ((real) == NULL) return CUDA_ERROR_NOT_FOUND;             \
    } while (0)
#define NN_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- the entry points the shim replaces (X(name)) ------------------------------------------ */

/* Entry points newer than the oldest cuda.h the shim is built against (CUDA 13.0, what a GPU machine's
 * toolkit may have): hooked only when the headers declare them. A shim built without one refuses the
 * driver's variant (its family is guarded in lookup.c), never hands it out unaccounted. */
#if CUDA_VERSION >= 13040
#define NN_CUDA_HOOKS_13040(X) X(cuGraphAddNode_v3)
#else
#define NN_CUDA_HOOKS_13040(X)
#endif

#define NN_CUDA_HOOKS(X)                                                                       \
    X(cuInit) X(cuGetProcAddress) X(cuGetProcAddress_v2)                                         \
    X(cuDevicePrimaryCtxRetain) X(cuCtxCreate) X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4) \
    X(cuMemAlloc_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged) X(cuMemFree_v2)                  \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz)          \
    X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) X(cuMemPoolCreate) X(cuMemPoolDestroy) \
    X(cuMemCreate) X(cuMemRelease) X(cuMemGetInfo_v2) X(cuDeviceTotalMem_v2)                     \
    X(cuMemAlloc) X(cuMemAllocPitch) X(cuMemGetInfo) X(cuDeviceTotalMem)                         \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz)        \
    X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz)                               \
    X(cuLaunchCooperativeKernelMultiDevice) X(cuGraphLaunch) X(cuGraphLaunch_ptsz)               \
    X(cuStreamBeginCapture) X(cuStreamBeginCapture_ptsz) X(cuStreamBeginCapture_v2)              \
    X(cuStreamBeginCapture_v2_ptsz) X(cuStreamBeginCaptureToGraph) X(cuStreamBeginCaptureToGraph_ptsz) \
    X(cuStreamEndCapture) X(cuStreamEndCapture_ptsz)                                             \
    X(cuGraphInstantiate) X(cuGraphInstantiate_v2) X(cuGraphInstantiateWithFlags) X(cuGraphInstantiateWithParams) \
    X(cuGraphInstantiateWithParams_ptsz)                                                         \
    X(cuGraphExecDestroy) X(cuGraphDestroy)                                                      \
    X(cuMemMap) X(cuMemUnmap) X(cuMemRetainAllocationHandle)                                     \
    X(cuArrayCreate) X(cuArrayCreate_v2) X(cuArray3DCreate) X(cuArray3DCreate_v2)                \
    X(cuMipmappedArrayCreate) X(cuArrayDestroy) X(cuMipmappedArrayDestroy)                       \
    X(cuGraphAddMemAllocNode) X(cuGraphAddMemFreeNode) X(cuGraphAddNode) X(cuGraphAddNode_v2)    \
    NN_CUDA_HOOKS_13040(X) X(cuGraphClone) X(cuCtxSetLimit)

#define NN_NVML_HOOKS(X) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2)

/* Driver entry points the shim calls but does not replace. */
#define NN_CUDA_HELPERS(X)                                                                     \
    X(cuCtxGetDevice) X(cuDeviceGetUuid_v2) X(cuEventCreate) X(cuEventRecord) X(cuEventRecord_ptsz) \
    X(cuEventElapsedTime_v2) X(cuEventDestroy_v2) X(cuStreamIsCapturing)          \
    X(cuStreamIsCapturing_ptsz) X(cuStreamGetCaptureInfo_v3) X(cuStreamGetCaptureInfo_v3_ptsz)   \
    X(cuCtxGetCurrent) X(cuCtxGetLimit) X(cuDeviceGetAttribute)

#define NN_NVML_HELPERS(X)                                                                     \
    X(nvmlInit_v2) X(nvmlDeviceGetUUID) X(nvmlDeviceGetCount_v2) X(nvmlDeviceGetHandleByIndex_v2)               \
    X(nvmlDeviceGetComputeRunningProcesses_v3)

#define NN_REAL_FIELD(name) __typeof__(&name) name;
typedef struct nn_real_table {
    NN_CUDA_HOOKS(NN_REAL_FIELD)
    NN_CUDA_HELPERS(NN_REAL_FIELD)
    NN_NVML_HOOKS(NN_REAL_FIELD)
    NN_NVML_HELPERS(NN_REAL_FIELD)
} nn_real_table;
#undef NN_REAL_FIELD

extern nn_real_table nn_real; /* resolved from libcuda.so.1 / libnvidia-ml.so.1 (lookup.c) */

/* lookup.c */
void nn_resolve_cuda(void); /* idempotent */
void nn_resolve_nvml(void); /* idempotent; NVML is optional */

/* ---- process state (state.c) ------------------------------------------------------------------ */

/* One container's region as a process maps it: the agent's control file read-only, the container's
 * state file read-write (neuronetes_region.h). */
typedef struct nn_region {
    const nn_control *control;
    nn_state *state;
} nn_region;

typedef struct nn_shim {
    int status;           /* NN_ST_*: written once under g_init_lock, then read with acquire */
    CUresult refusal;     /* what every hook returns when status is NN_ST_REFUSED */
    nn_region *region;    /* the container's region (both files mapped MAP_SHARED) */
    int slot;             /* our process slot, -1 before the claim */
    pid_t pid;            /* the process the slot belongs to (fork detection) */
    int admitted;         /* the agent admitted this process's first context */
    uint64_t env_limit[NN_MAX_DEVICES]; /* workstation env limits (0 = none) */
    uint32_t env_share[NN_MAX_DEVICES]; /* workstation env compute shares (0 = none) */
} nn_shim;

#define NN_ST_UNINIT 0
#define NN_ST_READY 1
#define NN_ST_REFUSED 2

extern nn_shim nn_g;

/* Open the region, claim a slot: CUDA_SUCCESS, or the refusal every hook then returns. */
CUresult nn_ready(void);
/* Region entry of CUDA device `dev` (cached), or -1 when the container was not given it. */
int nn_device_entry_of(CUdevice dev);
/* Region entry of the current context's device, or -1. */
int nn_current_entry(void);
/* Wait for the agent's admission before the first context (NN_CTL_ADMITTED). */
CUresult nn_admit(void);
/* The effective limits of entry `i` (region, narrowed by workstation env). */
uint64_t nn_device_limit(int i);
uint32_t nn_device_share(int i);
void nn_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t nn_now_ns(void);

/* ---- the region (region.c: pure region logic, no CUDA; tested on its own) --------------------- */

/* Validate a mapped control / state file: 0, or -1 with a reason in `why`. */
int nn_control_validate(const nn_control *c, size_t file_size, char *why, size_t why_len);
int nn_state_validate(const nn_state *s, size_t file_size, char *why, size_t why_len);
/* The directory the region is read from: NN_REGION_DIR whenever something exists at
 * `default_control` (a container: the environment is ignored), else `env_dir` when set (tests, the
 * workstation daemon's jobs), else NN_REGION_DIR. */
const char *nn_region_dir(const char *default_control, const char *env_dir);
/* Map `dir`/control read-only and `dir`/state read-write and validate both (and that they are one
 * pair): 0, or -1 with a reason in `why` (which names the file). */
int nn_region_map(const char *dir, nn_region *out, char *why, size_t why_len);
/* The robust lock, never waiting forever: 0 = held (pending reclaim orders applied), -1 = not taken
 * in time. */
int nn_region_lock(nn_region *r);
void nn_region_unlock(nn_region *r);
/* Apply the agent's pending reclaim orders if the lock can be taken at once (launch path): the
 * number of slots freed. */
int nn_region_poll_orders(nn_region *r);
/* Recompute device and container totals from the slots (under the lock). */
void nn_region_recompute(nn_region *r);
/* Claim a free slot for (pid, start_ticks), reaping dead ones if full: slot index or -1. */
int nn_region_claim(nn_region *r, pid_t pid, uint64_t start_ticks);
/* Charge `size` bytes on entry `dev` to `slot` if the device limit `dev_limit` and the container
 * limit allow it: 1 = charged, 0 = over a limit (refusal counted), -1 = lock not taken. */
int nn_region_charge(nn_region *r, int slot, int dev, uint64_t size, uint64_t dev_limit);
/* Give back bytes charged earlier (clamped at zero). */
void nn_region_uncharge(nn_region *r, int slot, int dev, uint64_t size);
/* The host PID the agent registered for slot `i`'s current claim, or 0 (neuronetes_region.h). */
int32_t nn_region_host_pid(const nn_region *r, int i);
/* Mark slots of processes that are gone DEAD; free DEAD slots whose host PID the driver no longer
 * lists (`driver_has_pid` says whether NVML still shows it; NULL = keep DEAD ones). Under the lock.
 * Returns how many slots were freed. */
int nn_region_reap_locked(nn_region *r, int self_slot, int (*driver_has_pid)(int32_t host_pid));
/* /proc/<pid>/stat start time (0 = no such process). */
uint64_t nn_proc_start_ticks(pid_t pid);

/* ---- memory.c / launch.c ------------------------------------------------------------------------ */

/* Charge for an allocation on entry `dev` (reaping dead processes once when over the limit):
 * CUDA_SUCCESS or CUDA_ERROR_OUT_OF_MEMORY. */
CUresult nn_charge(int dev, uint64_t size);
void nn_uncharge(int dev, uint64_t size);
/* Remember / forget a charged allocation (key: address or VMM handle). */
void nn_track(uint64_t key, uint64_t size, int dev, uint32_t kind);
int nn_untrack(uint64_t key, uint64_t *size, int *dev);
int nn_tracked(uint64_t key);
void nn_untrack_and_uncharge(uint64_t key);
/* Charge `size` on entry `dev`, make `call`, give the charge back if it fails, else track
 * `key_expr` (evaluated after the call) as `kind`; returns from the enclosing hook. */
#define NN_CHARGED_CALL(dev, size, key_expr, kind, call)                           \
    do {                                                                           \
        int nn_dev_ = (dev); /* evaluated once: the device of the charge */        \
        uint64_t nn_size_ = (size);                                                \
        CUresult nn_rc_ = nn_charge(nn_dev_, nn_size_);                            \
        if (nn_rc_ != CUDA_SUCCESS) return nn_rc_;                                 \
        nn_rc_ = (call);                                                           \
        if (nn_rc_ != CUDA_SUCCESS) nn_uncharge(nn_dev_, nn_size_);                \
        else nn_track((uint64_t)(key_expr), nn_size_, nn_dev_, (kind));            \
        return nn_rc_;                                                             \
    } while (0)
/* graphmem.c: an allocation (or free, is_free) captured on `stream`; the capture became `graph`. */
void nn_capture_record(CUstream stream, int ptds, uint64_t ptr, uint64_t size, int dev, int is_free);
void nn_capture_to_graph(uint64_t capture_id, CUgraph graph);
/* A memory node added to `graph` explicitly (graphnodes.c): recorded as a captured one is. */
void nn_graph_record(CUgraph graph, uint64_t ptr, uint64_t size, int dev, int is_free);
/* cuGraphClone: the clone gets a copy of the graph's memory nodes. */
void nn_graph_copy(CUgraph from, CUgraph to);
/* A child graph moved into `parent` (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE): its nodes become the parent's. */
void nn_graph_move(CUgraph child, CUgraph parent);
void nn_graphmem_after_fork(void);
/* Graph memory: charge the allocations captured into `exec` when it is launched; `*charged`
 * (free() it) lists what was charged and tracked, for nn_graph_unwind if the launch fails. */
CUresult nn_graph_charge(CUgraphExec exec, uint64_t transient[NN_MAX_DEVICES], uint64_t **charged, size_t *count);
void nn_graph_unwind(const uint64_t *charged, size_t count);
void nn_graph_settle(CUgraphExec exec);
/* Bytes charged at a graph launch for allocations freed inside it: given back when it ends. */
void nn_release_transient(const uint64_t transient[NN_MAX_DEVICES]);
/* Is `stream` being captured (cheap when no capture is active in the process)? */
int nn_capturing(CUstream stream, int ptds);
/* Capture id of `stream` (0 = not capturing). */
uint64_t nn_capture_id(CUstream stream, int ptds);
void nn_memory_after_fork(void);
void nn_launch_after_fork(void);
void nn_vmm_after_fork(void);    /* vmm.c */
void nn_limits_after_fork(void); /* limits.c */

#define NN_KIND_ALLOC 1u
#define NN_KIND_ARRAY 3u

#endif
