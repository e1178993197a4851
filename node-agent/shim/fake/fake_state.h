/*
 * fake_state.h — the simulated GPU's own account, shared by every process that loads the fake
 * libcuda.so.1 / libnvidia-ml.so.1 (tests and benchmarks only; never shipped).
 *
 * The account lives in a file named by FAKE_CUDA_STATE, mapped MAP_SHARED, so it is the GPU's
 * view across processes: device memory per device and per process, and GPU busy time. It is
 * the ORACLE the shim's figures are checked against: the shim never writes it, the fake updates
 * it as a driver would (memory at allocation and free, busy time as kernels run on a GPU that
 * executes one kernel at a time, a dead process's memory released by the "driver").
 */
#ifndef NN_FAKE_STATE_H
#define NN_FAKE_STATE_H

#include <pthread.h>
#include <stdint.h>

#define FAKE_STATE_MAGIC UINT64_C(0x4B41464141445543) /* "CUDAAFAK" */
#define FAKE_MAX_DEVICES 4
#define FAKE_MAX_PROCS 512
#define FAKE_DEFAULT_MEM_BYTES (UINT64_C(80) << 30)

/* checkpoint states, same numbers as CUprocessState */
#define FAKE_CKPT_RUNNING 0u
#define FAKE_CKPT_LOCKED 1u
#define FAKE_CKPT_CHECKPOINTED 2u

typedef struct fake_proc {
    int32_t pid;             /* 0 = free entry */
    uint32_t ckpt_state;     /* FAKE_CKPT_*: the checkpoint API's state machine */
    uint64_t start_ticks;    /* /proc/<pid>/stat starttime: a reused PID is another process */
    uint64_t used[FAKE_MAX_DEVICES];         /* device memory this process holds */
    uint64_t checkpointed[FAKE_MAX_DEVICES]; /* memory moved out to the host by a checkpoint */
    uint64_t busy_ns[FAKE_MAX_DEVICES];      /* GPU time of this process's kernels */
    uint64_t launches;       /* kernels (and graph kernels) this process ran */
} fake_proc;

typedef struct fake_device {
    uint64_t total_bytes;    /* physical memory */
    uint64_t used_bytes;     /* sum of procs[].used (under lock) */
    uint64_t peak_bytes;     /* high-water mark of used_bytes: the race test's verdict */
    uint64_t busy_until_ns;  /* CLOCK_MONOTONIC when the GPU finishes its queued work (atomic CAS) */
    uint64_t busy_ns_total;  /* GPU time of every kernel ever queued (atomic add) */
} fake_device;

typedef struct fake_state {
    uint64_t magic;
    uint32_t device_count;
    uint32_t reserved;
    pthread_mutex_t lock;    /* robust, process-shared: guards memory and the process table */
    fake_device devices[FAKE_MAX_DEVICES];
    fake_proc procs[FAKE_MAX_PROCS];
} fake_state;

/* Map (creating and initialising on first use) the state file named by FAKE_CUDA_STATE. Device
 * count from FAKE_CUDA_DEVICES (default 1), memory from FAKE_CUDA_MEM_BYTES (default 80 GiB).
 * Returns NULL when FAKE_CUDA_STATE is unset or unusable. */
fake_state *fake_state_open(void);
/* Lock/unlock the state (recovers a dead holder's lock). */
void fake_state_lock(fake_state *s);
void fake_state_unlock(fake_state *s);
/* This process's entry (created on first use); call under the lock. */
fake_proc *fake_state_self(fake_state *s);
/* The entry of `pid`, or NULL; call under the lock. */
fake_proc *fake_state_find(fake_state *s, int32_t pid);
/* Release the memory of processes that no longer exist, as the driver does when a process's
 * device file closes; call under the lock. */
void fake_state_reap(fake_state *s);
/* The deterministic UUID of fake device `index` ("GPU-…", 40 chars + NUL). */
void fake_device_uuid(unsigned index, char out[41]);
/* /proc/<pid>/stat start time, 0 when the process does not exist. */
uint64_t fake_proc_start_ticks(int32_t pid);

#endif
