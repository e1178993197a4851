/*
 * fake_state.h — the simulated GPU's own account, shared by every process that loads the fake
 * libcuda.so.1 / libnvidia-ml.so.1 (tests and benchmarks only; never shipped).
 *
 * The account lives in a file named by FAKE_CUDA_STATE, mapped MAP_SHARED, so it is the GPU's
 * view across processes: device memory per device and per process, and GPU busy time. It is
 * the ORACLE the shim's figures are checked against: the shim never writes it, the fake updates
 * it as a driver would (memory at allocation and free, busy time as kernels run on a GPU that
 * executes one kernel at a time, a dead process's memory released by the "driver").
 *
 * PID namespaces (containers). An entry is its process as the process saw itself: getpid() in its
 * own PID namespace (pid 1 of a container is 1), that namespace's identity (the inode of
 * /proc/self/ns/pid) and its start time (/proc/self/stat starttime, since boot: the same number
 * from every namespace). So pid 1 of container A and pid 1 of container B are two entries.
 *   - A caller reports and looks up PIDs as ITS /proc shows them (fake_state_survey,
 *     fake_state_find): an entry of its own namespace by its pid; an entry of another namespace by
 *     the <n> of /proc/<n> whose ns/pid, innermost NSpid and starttime are the entry's (one /proc
 *     scan per call, only when such entries exist). An entry the caller cannot see is not listed.
 *     The host, or a node agent with hostPID, thus sees every entry by its host PID, as NVML on a
 *     real node does. (The real driver is not namespace-aware and reports host PIDs even inside a
 *     container, where they name nothing; the fake lists a container only its own processes.)
 *   - Liveness. An entry of the caller's own namespace: kill(pid, 0) + /proc/<pid>/stat, as
 *     before. An entry of another namespace can only be judged from an ANCESTOR namespace (one
 *     that sees the process): fake_state_reap (libcuda) never touches one; fake_state_survey (the
 *     NVML reader) frees one it cannot find only when the caller is proven an ancestor of its
 *     namespace: it once saw the process (seen_from), or sees another process of that namespace
 *     now, or is the machine's initial PID namespace (it sees kthreadd). So run the reader that
 *     should release dead containers' memory in an ancestor namespace (the host, or the node agent
 *     with hostPID); a reader inside a container never frees another container's memory. An entry
 *     of a container that exited before any ancestor saw it stays charged unless the reader is in
 *     the initial namespace.
 *   - A container needs its own /proc (runc mounts one; `unshare --pid --fork --mount-proc`).
 */
#ifndef NN_FAKE_STATE_H
#define NN_FAKE_STATE_H

#include <pthread.h>
#include <stdint.h>

#define FAKE_STATE_MAGIC UINT64_C(0x324B414641445543) /* "CUDAFAK2": entries carry their PID namespace */
#define FAKE_MAX_DEVICES 4
#define FAKE_MAX_PROCS 512
#define FAKE_DEFAULT_MEM_BYTES (UINT64_C(80) << 30)
#define FAKE_SEEN_FROM 4 /* ancestor namespaces remembered per entry */

/* checkpoint states, same numbers as CUprocessState */
#define FAKE_CKPT_RUNNING 0u
#define FAKE_CKPT_LOCKED 1u
#define FAKE_CKPT_CHECKPOINTED 2u

/* A PID namespace: stat(/proc/<pid>/ns/pid) st_dev and st_ino; {0, 0} = unknown. */
typedef struct fake_ns {
    uint64_t dev;
    uint64_t ino;
} fake_ns;

typedef struct fake_proc {
    int32_t pid;             /* getpid() of the process, in its own namespace; 0 = free entry */
    uint32_t ckpt_state;     /* FAKE_CKPT_*: the checkpoint API's state machine */
    uint64_t start_ticks;    /* /proc/self/stat starttime: a reused PID is another process */
    fake_ns pidns;           /* the process's PID namespace */
    fake_ns seen_from[FAKE_SEEN_FROM]; /* other namespaces that saw it alive: its ancestors */
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
/* The entry of the process the caller knows as `pid` (its own namespace's number, or the number
 * its /proc gives a process of a descendant namespace), or NULL; call under the lock. */
fake_proc *fake_state_find(fake_state *s, int32_t pid);
/* Release the memory of processes of the caller's own PID namespace that no longer exist, as the
 * driver does when a process's device file closes; call under the lock. Entries of other
 * namespaces are left alone (the caller may not see them). */
void fake_state_reap(fake_state *s);
/* The reader's pass (NVML): fake_state_reap, then the entries of other namespaces: shown[i] = the
 * PID the caller's /proc gives entry i, 0 when it cannot see it; one it cannot see is freed when the
 * caller is proven its ancestor (see the top of this file). Call under the lock. */
void fake_state_survey(fake_state *s, int32_t shown[FAKE_MAX_PROCS]);
/* The caller's PID namespace ({0, 0} when /proc cannot tell). */
fake_ns fake_ns_self(void);
/* The deterministic UUID of fake device `index` ("GPU-…", 40 chars + NUL). */
void fake_device_uuid(unsigned index, char out[41]);
/* /proc/<pid>/stat start time, 0 when the process does not exist. */
uint64_t fake_proc_start_ticks(int32_t pid);

#endif
