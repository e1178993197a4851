/*
 * neuronetes_region.h — the shared region between the NeuroNetes node agent and the CUDA shim.
 *
 * One region per container that has a GPU assignment: two files in one directory, which the agent
 * creates (on tmpfs, host side /run/neuronetes/containers/<pod-uid>/<container>/) before the
 * container's first process starts. The NRI plugin mounts them into the container at
 * NN_REGION_DIR (/run/neuronetes): the directory read-only, `control` read-only, `state` writable.
 *
 *   control (NN_CONTROL_SIZE bytes) — the AGENT's file. Limits, compute shares, the control word
 *     (admit, pause, drain), priority and QoS, the device entries, and per process slot the host
 *     PID and the reclaim order the agent writes. Containers map it read-only, so nothing a tenant
 *     does can change a value the agent wrote or reach the agent's memory through it. Only the
 *     agent writes it, with single aligned stores; it takes no lock.
 *   state (NN_STATE_SIZE bytes) — the CONTAINER's file. The shim processes' own robust mutex, the
 *     process slots, and per device the usage, peak, kernel time, throttled time and OOM refusals.
 *     The agent initialises it once, before publication, and afterwards only READS it: a bounded
 *     pread() into a private copy, validated field by field (every index and count bounded, every
 *     value range-checked) — it never maps it, never locks its mutex, never follows or trusts a
 *     pointer or a size found in it. A tenant can make the agent misreport its own container and
 *     nothing else.
 *
 * Why two files: a mutex that both the agent (root) and the tenant's processes lock carries
 * glibc's robust-list pointers, which the unlocking thread writes through; a tenant rewriting them
 * while the agent held the lock could make the agent write chosen values into its own memory. So
 * the agent shares no lock with tenants, and everything it writes lives in a file tenants cannot
 * write.
 *
 * Python mirror: node-agent/neuronetes_agent/region.py (neuronetes_agent.region), checked byte for byte against
 * this header by tests/unit/test_region_layout.py. Change both together.
 *
 * Versioning (docs/contracts.md "The shim's shared region"):
 *   - each file starts with an nn_file_header: magic (NN_CONTROL_MAGIC or NN_STATE_MAGIC) and
 *     version_major must match exactly; header_size, file_size, device_entry_size,
 *     proc_slot_size, max_devices and max_procs must equal this header's values for that file,
 *     and both files must carry the same pair_id. Anything else is a hard failure: the shim
 *     refuses CUDA (cuInit fails, one line on stderr) rather than run unlimited, and the agent
 *     reports the container.
 *   - version_minor grows when a field is carved out of a reserved area; a zero in a new field
 *     must mean "old behaviour", and a reader checks version_minor before using it. Readers
 *     accept any minor of their major. Moving, resizing or re-typing a field bumps the major.
 *     Major 1 was one file holding both sides (and a lock both sides took); major 2 is this pair.
 *
 * Concurrency:
 *   - state.lock: a process-shared, ROBUST pthread mutex (PTHREAD_PROCESS_SHARED +
 *     PTHREAD_MUTEX_ROBUST), initialised by the agent before publication and from then on taken
 *     only by the shim processes of the container. It guards slot state changes and memory
 *     accounting (procs[].used_bytes, devices[].memory_used_bytes, usage.memory_used_bytes), so
 *     "check the limit, then charge" is exact across processes. A holder that dies leaves it
 *     EOWNERDEAD; the next locker calls pthread_mutex_consistent() and recomputes every
 *     *_used_bytes from the per-process values (single aligned 8-byte stores, never torn). Nobody
 *     blocks on it without a timeout (pthread_mutex_timedlock). A tenant that holds it forever
 *     stalls only its own container.
 *   - Reclaim orders: a slot whose process is gone keeps its memory charged until NVML shows the
 *     driver released it. Then the agent writes the slot's claim_seq into
 *     control.procs[i].reclaim_claim_seq and bumps control.container.reclaim_generation. Every
 *     shim process that takes the lock (claim, charge, uncharge, reap) first applies pending orders
 *     (a slot whose claim_seq still equals its order is freed) and records the generation in
 *     state.usage.reclaim_generation_seen; a kernel launch applies them too when the lock is free
 *     at once (trylock), so the totals drop while the container only launches kernels.
 *   - Host PIDs: the agent writes control.procs[i] as host_pid = 0, then claim_seq and
 *     start_time_ticks, then host_pid. A reader loads claim_seq, host_pid, claim_seq again, and
 *     uses host_pid only when it is non-zero and both claim_seq loads equal the state slot's
 *     claim_seq: a registration is never paired with another claim of the slot.
 *   - Hot paths take no lock. Kernel time and heartbeats are written only by the slot's own
 *     process; counters (*_total) are __atomic_fetch_add'ed; control words are single aligned
 *     32/64-bit stores read with __atomic_load. No multi-word value changes after publication,
 *     except the host-PID registration above.
 *   - Publication: the agent fills each file under a temporary name, initialises the state's
 *     mutex, sets NN_REGION_F_READY and renames the state file into place, then the control file
 *     (whose presence means the pair is complete).
 *
 * Where the shim finds the files: NN_CONTROL_PATH and NN_STATE_PATH. Only where nothing exists at
 * NN_CONTROL_PATH (no container: tests, the workstation daemon's jobs) may the environment name
 * another directory (NEURONETES_REGION_DIR); in a container the environment is ignored.
 *
 * Fixed-width types only (plus the mutex, stored in a 64-byte union). All fields are plain
 * integers; C code accesses the shared ones with __atomic builtins, never through _Atomic types
 * (whose size and alignment the standard does not pin down).
 */
#ifndef NEURONETES_REGION_H
#define NEURONETES_REGION_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define NN_STATIC_ASSERT static_assert
extern "C" {
#else
#define NN_STATIC_ASSERT _Static_assert
#endif

/* ---- identity and sizes ------------------------------------------------------------------ */

/* "NNCONTRL" and "NNSTATES" in memory on a little-endian machine; on a big-endian reader they do
 * not match, which is what we want (the files are never shared across byte orders). */
#define NN_CONTROL_MAGIC UINT64_C(0x4C52544E4F434E4E)
#define NN_STATE_MAGIC UINT64_C(0x5345544154534E4E)
#define NN_REGION_VERSION_MAJOR 2u
#define NN_REGION_VERSION_MINOR 0u

#define NN_MAX_DEVICES 16u       /* GPUs (or MIG instances) one container can be assigned */
#define NN_MAX_PROCS 128u        /* CUDA processes of one container alive at once */
#define NN_UUID_BYTES 64u        /* "GPU-<36>" / "MIG-<36>" = 40 chars; legacy MIG ids are longer */
#define NN_LOCK_STORAGE_BYTES 64u
#define NN_POD_UID_BYTES 40u     /* 36-char UID + NUL padding */
#define NN_NAME_BYTES 64u        /* a DNS label (63) + NUL */
#define NN_CONTROL_SIZE 16384u   /* control file size; fixed per major version */
#define NN_STATE_SIZE 65536u     /* state file size; fixed per major version */

#define NN_DEFAULT_PACING_WINDOW_NS UINT64_C(10000000) /* 10 ms (docs/shim.md) */

/* Where the region is inside the container: the NRI plugin mounts the directory read-only, the
 * control file read-only and the state file writable. */
#define NN_REGION_DIR "/run/neuronetes"
#define NN_CONTROL_NAME "control"
#define NN_STATE_NAME "state"
#define NN_CONTROL_PATH NN_REGION_DIR "/" NN_CONTROL_NAME
#define NN_STATE_PATH NN_REGION_DIR "/" NN_STATE_NAME

/* header.flags (both files) */
#define NN_REGION_F_READY (1u << 0)      /* every field below is valid; set last, before rename */
#define NN_REGION_F_WORKSTATION (1u << 1) /* control only — workstation mode: the shim may also read
                                            the HAMi-style env limits (the user owns the box);
                                            never in a cluster */

/* container.qos — zero is not a class: a region without one is refused (fail closed). */
#define NN_QOS_GUARANTEED 1u
#define NN_QOS_BURSTABLE 2u
#define NN_QOS_BEST_EFFORT 3u

/* container.control — written by the agent, polled by the shim. */
#define NN_CTL_ADMITTED (1u << 0) /* the node's admission let this container start using the GPU;
                                     until then the shim holds the first context creation */
#define NN_CTL_PAUSED (1u << 1)   /* hold new kernel launches (priority inside the node) */
#define NN_CTL_DRAINING (1u << 2) /* refuse new allocations and contexts (eviction, MIG change) */

/* devices[].flags (control) */
#define NN_DEV_F_MIG (1u << 0) /* the entry is a MIG instance: no pacing, hardware isolation */

/* procs[].state (state) — changed only under the lock. */
#define NN_SLOT_FREE 0u
#define NN_SLOT_ACTIVE 1u /* a live process of the container holds the slot */
#define NN_SLOT_DEAD 2u   /* the process is gone but the driver may not have freed its memory yet:
                             its used_bytes stay charged until NVML shows them released */

/* procs[].flags (state) */
#define NN_PROC_F_ADMITTED (1u << 0)  /* the agent admitted this process's first context */
#define NN_PROC_F_CAPTURING (1u << 1) /* a stream capture is in progress: no pacing, no sleeping */

/* ---- both files: the header ------------------------------------------------------------------ */

/* 128 bytes at offset 0 of each file: what a reader checks before trusting anything else. */
typedef struct nn_file_header {
    uint64_t magic;             /* NN_CONTROL_MAGIC / NN_STATE_MAGIC: which file, and our byte order */
    uint16_t version_major;     /* must equal NN_REGION_VERSION_MAJOR */
    uint16_t version_minor;     /* fields added since: read newer ones only if minor is high enough */
    uint32_t header_size;       /* sizeof(nn_file_header): catches a header compiled differently */
    uint64_t file_size;         /* sizeof(nn_control) / sizeof(nn_state) == file size: truncation */
    uint32_t device_entry_size; /* sizeof(nn_device_control) / sizeof(nn_device_usage) */
    uint32_t proc_slot_size;    /* sizeof(nn_proc_control) / sizeof(nn_proc_slot) */
    uint32_t max_devices;       /* NN_MAX_DEVICES the writer was built with */
    uint32_t max_procs;         /* NN_MAX_PROCS the writer was built with */
    uint32_t flags;             /* NN_REGION_F_* */
    uint32_t creator_pid;       /* host PID of the agent that created it (diagnostics) */
    uint64_t created_realtime_ns; /* CLOCK_REALTIME at creation (diagnostics, stale-file cleanup) */
    uint64_t pair_id;           /* random, the same in both files of one region: a state file is
                                   never used with another creation's control file */
    uint8_t reserved[64];       /* future header fields (minor versions) */
} nn_file_header;

/* ---- the control file (the agent's; read-only in the container) ------------------------------ */

/* 256 bytes at offset 128: the container's policy. */
typedef struct nn_container {
    uint64_t memory_limit_bytes; /* cap across all devices; normally their sum. The agent can drop
                                    it to 0 in one store to refuse every new allocation */
    uint64_t pacing_window_ns;   /* compute is paced over windows of this length (default 10 ms) */
    int32_t priority;            /* the pod's priority (assignment), for the node's queue */
    uint32_t qos;                /* NN_QOS_*: how the compute share is enforced */
    uint32_t control;            /* NN_CTL_*, agent-written single word */
    uint32_t device_count;       /* valid entries in devices[] of both files (the rest are zero) */
    uint64_t reclaim_generation; /* bumped after new reclaim orders are written (procs[]) */
    char pod_uid[NN_POD_UID_BYTES];    /* whose region this is (diagnostics, agent re-adoption) */
    char namespace_[NN_NAME_BYTES];    /* pod namespace (metrics labels after an agent restart) */
    char container_name[NN_NAME_BYTES];/* container name (ditto) */
    uint8_t reserved[48];
} nn_container;

/* 128 bytes each, from offset 384: one per assigned device, in the assignment's order. */
typedef struct nn_device_control {
    char uuid[NN_UUID_BYTES];       /* NVML UUID the container sees (GPU-… or MIG-…), NUL-padded;
                                       the shim maps CUdevice -> entry by cuDeviceGetUuid */
    uint64_t memory_limit_bytes;    /* hard limit on this device for the container (memoryMiB) */
    uint64_t memory_total_bytes;    /* physical/instance memory per NVML: the shim reports
                                       total = min(limit, this) and free = total - used */
    uint32_t compute_share_percent; /* 1..100 of the device's compute per pacing window; 100 = none */
    uint32_t host_index;            /* GPU index on the host (metrics label `gpu`) */
    uint32_t flags;                 /* NN_DEV_F_* */
    uint32_t mig_start;             /* MIG placement start slot (NN_DEV_F_MIG only; diagnostics) */
    uint8_t reserved[32];
} nn_device_control;

/* 32 bytes each, from offset 2432: the agent's side of process slot i of the state file. */
typedef struct nn_proc_control {
    int32_t host_pid;            /* the slot's process in the host PID namespace, found by the agent
                                    (/proc/<pid>/status NSpid + start time of a member of the
                                    container's cgroup); 0 = not known. The shim never guesses it */
    uint32_t reserved0;
    uint64_t claim_seq;          /* the state slot's claim_seq this host_pid belongs to */
    uint64_t start_time_ticks;   /* /proc/<host_pid>/stat start time as the agent read it: its own
                                    liveness check never uses a tenant-written value */
    uint64_t reclaim_claim_seq;  /* reclaim order: free the slot while its claim_seq equals this
                                    (its process is gone and NVML shows its memory released); 0 = none */
} nn_proc_control;

/* The whole control file. */
typedef struct nn_control {
    nn_file_header header;
    nn_container container;
    nn_device_control devices[NN_MAX_DEVICES];
    nn_proc_control procs[NN_MAX_PROCS];
    uint8_t reserved[9856]; /* room for minor versions; pads to NN_CONTROL_SIZE */
} nn_control;

/* ---- the state file (the container's; the agent only reads copies of it) ---------------------- */

/* 128 bytes at offset 128: the lock on its own cache lines, away from read-mostly data. */
typedef struct nn_lock {
    union {
        pthread_mutex_t mutex;                  /* robust + process-shared; the agent inits it once */
        uint8_t storage[NN_LOCK_STORAGE_BYTES]; /* fixes the size whatever the libc's mutex is */
    };
    uint64_t owner_died_total; /* times a locker recovered from EOWNERDEAD (diagnostics) */
    uint8_t reserved[56];
} nn_lock;

/* 64 bytes at offset 256: the container's totals. */
typedef struct nn_usage {
    uint64_t memory_used_bytes;       /* sum of devices[].memory_used_bytes (under the lock) */
    uint64_t reclaim_generation_seen; /* the control file's reclaim_generation last applied */
    uint8_t reserved[48];
} nn_usage;

/* 64 bytes each, from offset 320: per device, the same order as the control file's devices[]. */
typedef struct nn_device_usage {
    uint64_t memory_used_bytes;  /* sum of procs[].used_bytes[i] (under the lock) */
    uint64_t memory_peak_bytes;  /* high-water mark of memory_used_bytes (under the lock) */
    uint64_t kernel_ns_total;    /* measured kernel time, all processes ever (atomic add) */
    uint64_t throttled_ns_total; /* time launches were held to keep the share (atomic add) */
    uint64_t oom_refusals_total; /* allocations refused because of a limit (atomic add) */
    uint8_t reserved[24];
} nn_device_usage;

/* 384 bytes each, from offset 1344: one per live CUDA process of the container. */
typedef struct nn_proc_slot {
    uint32_t state;            /* NN_SLOT_*, under the lock */
    int32_t container_pid;     /* getpid() in the container's PID namespace (the shim writes it) */
    uint32_t flags;            /* NN_PROC_F_* */
    uint32_t reserved_u32;
    uint64_t start_time_ticks; /* /proc/self/stat starttime: tells a reused PID from this process */
    uint64_t claim_seq;        /* bumped on every claim, so a reader can tell a slot was reused */
    uint64_t heartbeat_ns;     /* CLOCK_MONOTONIC of the last alloc/launch (diagnostics) */
    uint64_t window_index;     /* pacing window kernel_ns[] belongs to: CLOCK_MONOTONIC / window */
    uint8_t reserved0[16];
    uint64_t used_bytes[NN_MAX_DEVICES]; /* memory this process holds per device (under the lock);
                                            dropped when the slot is freed */
    uint64_t kernel_ns[NN_MAX_DEVICES];  /* kernel time measured in window_index, per device (only
                                            the owner writes; pacing sums it over slots) */
    uint8_t reserved1[64];
} nn_proc_slot;

/* The whole state file. */
typedef struct nn_state {
    nn_file_header header;
    nn_lock lock;
    nn_usage usage;
    nn_device_usage devices[NN_MAX_DEVICES];
    nn_proc_slot procs[NN_MAX_PROCS];
    uint8_t reserved[15040]; /* room for minor versions; pads to NN_STATE_SIZE */
} nn_state;

/* ---- the layout is part of the contract: pin it ------------------------------------------------ */

#define NN_ASSERT_OFFSET(type, field, offset) \
    NN_STATIC_ASSERT(offsetof(type, field) == (offset), #type "." #field " moved")

NN_STATIC_ASSERT(sizeof(pthread_mutex_t) <= NN_LOCK_STORAGE_BYTES, "pthread_mutex_t does not fit");
NN_STATIC_ASSERT(sizeof(nn_file_header) == 128, "nn_file_header size");
NN_STATIC_ASSERT(sizeof(nn_container) == 256, "nn_container size");
NN_STATIC_ASSERT(sizeof(nn_device_control) == 128, "nn_device_control size");
NN_STATIC_ASSERT(sizeof(nn_proc_control) == 32, "nn_proc_control size");
NN_STATIC_ASSERT(sizeof(nn_control) == NN_CONTROL_SIZE, "nn_control size");
NN_STATIC_ASSERT(sizeof(nn_lock) == 128, "nn_lock size");
NN_STATIC_ASSERT(sizeof(nn_usage) == 64, "nn_usage size");
NN_STATIC_ASSERT(sizeof(nn_device_usage) == 64, "nn_device_usage size");
NN_STATIC_ASSERT(sizeof(nn_proc_slot) == 384, "nn_proc_slot size");
NN_STATIC_ASSERT(sizeof(nn_state) == NN_STATE_SIZE, "nn_state size");

NN_ASSERT_OFFSET(nn_file_header, magic, 0);
NN_ASSERT_OFFSET(nn_file_header, version_major, 8);
NN_ASSERT_OFFSET(nn_file_header, version_minor, 10);
NN_ASSERT_OFFSET(nn_file_header, header_size, 12);
NN_ASSERT_OFFSET(nn_file_header, file_size, 16);
NN_ASSERT_OFFSET(nn_file_header, device_entry_size, 24);
NN_ASSERT_OFFSET(nn_file_header, proc_slot_size, 28);
NN_ASSERT_OFFSET(nn_file_header, max_devices, 32);
NN_ASSERT_OFFSET(nn_file_header, max_procs, 36);
NN_ASSERT_OFFSET(nn_file_header, flags, 40);
NN_ASSERT_OFFSET(nn_file_header, creator_pid, 44);
NN_ASSERT_OFFSET(nn_file_header, created_realtime_ns, 48);
NN_ASSERT_OFFSET(nn_file_header, pair_id, 56);
NN_ASSERT_OFFSET(nn_file_header, reserved, 64);

NN_ASSERT_OFFSET(nn_container, memory_limit_bytes, 0);
NN_ASSERT_OFFSET(nn_container, pacing_window_ns, 8);
NN_ASSERT_OFFSET(nn_container, priority, 16);
NN_ASSERT_OFFSET(nn_container, qos, 20);
NN_ASSERT_OFFSET(nn_container, control, 24);
NN_ASSERT_OFFSET(nn_container, device_count, 28);
NN_ASSERT_OFFSET(nn_container, reclaim_generation, 32);
NN_ASSERT_OFFSET(nn_container, pod_uid, 40);
NN_ASSERT_OFFSET(nn_container, namespace_, 80);
NN_ASSERT_OFFSET(nn_container, container_name, 144);
NN_ASSERT_OFFSET(nn_container, reserved, 208);

NN_ASSERT_OFFSET(nn_device_control, uuid, 0);
NN_ASSERT_OFFSET(nn_device_control, memory_limit_bytes, 64);
NN_ASSERT_OFFSET(nn_device_control, memory_total_bytes, 72);
NN_ASSERT_OFFSET(nn_device_control, compute_share_percent, 80);
NN_ASSERT_OFFSET(nn_device_control, host_index, 84);
NN_ASSERT_OFFSET(nn_device_control, flags, 88);
NN_ASSERT_OFFSET(nn_device_control, mig_start, 92);
NN_ASSERT_OFFSET(nn_device_control, reserved, 96);

NN_ASSERT_OFFSET(nn_proc_control, host_pid, 0);
NN_ASSERT_OFFSET(nn_proc_control, reserved0, 4);
NN_ASSERT_OFFSET(nn_proc_control, claim_seq, 8);
NN_ASSERT_OFFSET(nn_proc_control, start_time_ticks, 16);
NN_ASSERT_OFFSET(nn_proc_control, reclaim_claim_seq, 24);

NN_ASSERT_OFFSET(nn_control, header, 0);
NN_ASSERT_OFFSET(nn_control, container, 128);
NN_ASSERT_OFFSET(nn_control, devices, 384);
NN_ASSERT_OFFSET(nn_control, procs, 2432);
NN_ASSERT_OFFSET(nn_control, reserved, 6528);

NN_ASSERT_OFFSET(nn_lock, storage, 0);
NN_ASSERT_OFFSET(nn_lock, mutex, 0);
NN_ASSERT_OFFSET(nn_lock, owner_died_total, 64);
NN_ASSERT_OFFSET(nn_lock, reserved, 72);

NN_ASSERT_OFFSET(nn_usage, memory_used_bytes, 0);
NN_ASSERT_OFFSET(nn_usage, reclaim_generation_seen, 8);
NN_ASSERT_OFFSET(nn_usage, reserved, 16);

NN_ASSERT_OFFSET(nn_device_usage, memory_used_bytes, 0);
NN_ASSERT_OFFSET(nn_device_usage, memory_peak_bytes, 8);
NN_ASSERT_OFFSET(nn_device_usage, kernel_ns_total, 16);
NN_ASSERT_OFFSET(nn_device_usage, throttled_ns_total, 24);
NN_ASSERT_OFFSET(nn_device_usage, oom_refusals_total, 32);
NN_ASSERT_OFFSET(nn_device_usage, reserved, 40);

NN_ASSERT_OFFSET(nn_proc_slot, state, 0);
NN_ASSERT_OFFSET(nn_proc_slot, container_pid, 4);
NN_ASSERT_OFFSET(nn_proc_slot, flags, 8);
NN_ASSERT_OFFSET(nn_proc_slot, reserved_u32, 12);
NN_ASSERT_OFFSET(nn_proc_slot, start_time_ticks, 16);
NN_ASSERT_OFFSET(nn_proc_slot, claim_seq, 24);
NN_ASSERT_OFFSET(nn_proc_slot, heartbeat_ns, 32);
NN_ASSERT_OFFSET(nn_proc_slot, window_index, 40);
NN_ASSERT_OFFSET(nn_proc_slot, reserved0, 48);
NN_ASSERT_OFFSET(nn_proc_slot, used_bytes, 64);
NN_ASSERT_OFFSET(nn_proc_slot, kernel_ns, 192);
NN_ASSERT_OFFSET(nn_proc_slot, reserved1, 320);

NN_ASSERT_OFFSET(nn_state, header, 0);
NN_ASSERT_OFFSET(nn_state, lock, 128);
NN_ASSERT_OFFSET(nn_state, usage, 256);
NN_ASSERT_OFFSET(nn_state, devices, 320);
NN_ASSERT_OFFSET(nn_state, procs, 1344);
NN_ASSERT_OFFSET(nn_state, reserved, 50496);

/* Every 8-byte field is 8-aligned (atomic, untearable); hot per-process data starts on a cache
 * line so one process's updates do not bounce another's. */
NN_STATIC_ASSERT(offsetof(nn_state, procs) % 64 == 0, "procs not cache-line aligned");
NN_STATIC_ASSERT(sizeof(nn_proc_slot) % 64 == 0, "proc slot not a whole number of cache lines");
NN_STATIC_ASSERT(offsetof(nn_state, lock) % 64 == 0, "lock not cache-line aligned");
NN_STATIC_ASSERT(offsetof(nn_control, procs) % 32 == 0, "control procs not aligned");

#ifdef __cplusplus
}
#endif

#endif /* NEURONETES_REGION_H */
