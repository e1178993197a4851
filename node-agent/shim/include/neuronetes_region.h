/*
 * neuronetes_region.h — the shared region between the NeuroNetes node agent and the CUDA shim.
 *
 * One region per container that has a GPU assignment. The agent creates it (a 64 KiB file on
 * tmpfs, host side /run/neuronetes/containers/<pod-uid>/<container>/region) before the
 * container's first process starts; the NRI plugin mounts that directory into the container
 * at /run/neuronetes, and every process of the container maps NN_REGION_PATH MAP_SHARED.
 * The shim takes its limits only from here, never from tenant-controlled environment.
 *
 * Python mirror: node-agent/region.py (neuronetes.agent.region), checked byte for byte
 * against this header by tests/unit/test_region_layout.py. Change both together.
 *
 * Versioning (docs/contracts.md "Shim region"):
 *   - magic + version_major must match exactly; header_size, region_size, device_entry_size,
 *     proc_slot_size, max_devices and max_procs must equal this header's values. Anything else
 *     is a hard failure: the shim refuses CUDA (cuInit fails) rather than run unlimited.
 *   - version_minor grows when a field is carved out of a reserved area; a zero in a new field
 *     must mean "old behaviour", and a reader checks version_minor before using it. Readers
 *     accept any minor of their major. Moving, resizing or re-typing a field bumps the major.
 *
 * Concurrency (why this scheme):
 *   - lock: a process-shared, ROBUST pthread mutex (PTHREAD_PROCESS_SHARED +
 *     PTHREAD_MUTEX_ROBUST), initialised by the agent. It guards the slot table (state
 *     changes) and memory accounting (procs[].used_bytes, devices[].memory_used_bytes,
 *     container.memory_used_bytes). Memory allocation is a cold path (frameworks cache), so a
 *     lock costs nothing there and makes "check the limit, then charge" exact across processes.
 *     Robustness is the point: when a holder dies the kernel marks the futex OWNER_DIED and the
 *     next locker gets EOWNERDEAD instead of a deadlock (peers' semaphores hang here). The
 *     recoverer calls pthread_mutex_consistent() and recomputes every *_used_bytes from the
 *     per-process values, which are single aligned 8-byte stores and so never torn: the state
 *     is consistent again whatever instruction the holder died at. The futex word holds a TID
 *     from the holder's own PID namespace; the kernel's robust-list walk on thread exit uses
 *     the same namespace, so agent (host PID namespace) and shims (container namespace) can
 *     share the lock. Nobody ever blocks on it without a timeout (pthread_mutex_timedlock); a
 *     container whose own tenant holds it forever only stalls itself (one region per container).
 *   - Hot paths take no lock. Kernel time and heartbeats are written only by the slot's own
 *     process; counters (*_total) are __atomic_fetch_add'ed; control words written by the
 *     agent are single aligned 32/64-bit stores read with __atomic_load. A seqlock is not
 *     needed because no multi-word value changes after the region is published: everything
 *     written after NN_REGION_F_READY is one word that is meaningful on its own.
 *   - Publication: the agent fills a temporary file, initialises the mutex, sets
 *     NN_REGION_F_READY and renames the file into place; nobody maps a half-written region.
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

/* "NNREGION" in memory on a little-endian machine; on a big-endian reader it does not match,
 * which is what we want (the region is never shared across byte orders). */
#define NN_REGION_MAGIC UINT64_C(0x4E4F494745524E4E)
#define NN_REGION_VERSION_MAJOR 1u
#define NN_REGION_VERSION_MINOR 0u

#define NN_MAX_DEVICES 16u       /* GPUs (or MIG instances) one container can be assigned */
#define NN_MAX_PROCS 128u        /* CUDA processes of one container alive at once */
#define NN_UUID_BYTES 64u        /* "GPU-<36>" / "MIG-<36>" = 40 chars; legacy MIG ids are longer */
#define NN_LOCK_STORAGE_BYTES 64u
#define NN_POD_UID_BYTES 40u     /* 36-char UID + NUL padding */
#define NN_NAME_BYTES 64u        /* a DNS label (63) + NUL */
#define NN_REGION_SIZE 65536u    /* total file size; fixed per major version */

#define NN_DEFAULT_PACING_WINDOW_NS UINT64_C(10000000) /* 10 ms (docs/shim.md) */

/* Where the region is inside the container (the NRI plugin mounts the directory read-only;
 * the file itself is writable). Not overridable by environment in cluster mode. */
#define NN_REGION_PATH "/run/neuronetes/region"

/* header.flags */
#define NN_REGION_F_READY (1u << 0)      /* every field below is valid; set last, before rename */
#define NN_REGION_F_STANDALONE (1u << 1) /* workstation mode: the shim may also read the HAMi-style
                                            env limits (the user owns the box); never in a cluster */

/* container.qos — zero is not a class: a region without one is refused (fail closed). */
#define NN_QOS_GUARANTEED 1u
#define NN_QOS_BURSTABLE 2u
#define NN_QOS_BEST_EFFORT 3u

/* container.control — written by the agent, polled by the shim. */
#define NN_CTL_ADMITTED (1u << 0) /* the node's admission let this container start using the GPU;
                                     until then the shim holds the first context creation */
#define NN_CTL_PAUSED (1u << 1)   /* hold new kernel launches (priority inside the node) */
#define NN_CTL_DRAINING (1u << 2) /* refuse new allocations and contexts (eviction, MIG change) */

/* device.flags */
#define NN_DEV_F_MIG (1u << 0) /* the entry is a MIG instance: no pacing, hardware isolation */

/* proc.state — changed only under the lock. */
#define NN_SLOT_FREE 0u
#define NN_SLOT_ACTIVE 1u /* a live process of the container holds the slot */
#define NN_SLOT_DEAD 2u   /* the process is gone but the driver may not have freed its memory yet:
                             its used_bytes stay charged until the agent sees NVML release it */

/* proc.flags */
#define NN_PROC_F_ADMITTED (1u << 0)  /* the agent admitted this process's first context */
#define NN_PROC_F_CAPTURING (1u << 1) /* a stream capture is in progress: no pacing, no sleeping */

/* ---- the layout ------------------------------------------------------------------------------ */

/* 128 bytes at offset 0: what a reader checks before trusting anything else. */
typedef struct nn_region_header {
    uint64_t magic;             /* NN_REGION_MAGIC: this is a region, and of our byte order */
    uint16_t version_major;     /* must equal NN_REGION_VERSION_MAJOR */
    uint16_t version_minor;     /* fields added since: read newer ones only if minor is high enough */
    uint32_t header_size;       /* sizeof(nn_region_header): catches a header compiled differently */
    uint64_t region_size;       /* sizeof(nn_region) == file size: catches truncation */
    uint32_t device_entry_size; /* sizeof(nn_device_entry) */
    uint32_t proc_slot_size;    /* sizeof(nn_proc_slot) */
    uint32_t max_devices;       /* NN_MAX_DEVICES the writer was built with */
    uint32_t max_procs;         /* NN_MAX_PROCS the writer was built with */
    uint32_t flags;             /* NN_REGION_F_* */
    uint32_t creator_pid;       /* host PID of the agent that created it (diagnostics) */
    uint64_t created_realtime_ns; /* CLOCK_REALTIME at creation (diagnostics, stale-file cleanup) */
    uint8_t reserved[72];       /* future header fields (minor versions) */
} nn_region_header;

/* 128 bytes at offset 128: the lock on its own cache lines, away from read-mostly data. */
typedef struct nn_lock {
    union {
        pthread_mutex_t mutex;                  /* robust + process-shared; the agent inits it */
        uint8_t storage[NN_LOCK_STORAGE_BYTES]; /* fixes the size whatever the libc's mutex is */
    };
    uint64_t owner_died_total; /* times a locker recovered from EOWNERDEAD (exported, diagnostics) */
    uint8_t reserved[56];
} nn_lock;

/* 256 bytes at offset 256: the container's policy (agent-written) and totals. */
typedef struct nn_container {
    uint64_t memory_limit_bytes; /* cap across all devices; normally their sum. The agent can drop
                                    it to 0 in one store to refuse every new allocation */
    uint64_t pacing_window_ns;   /* compute is paced over windows of this length (default 10 ms) */
    int32_t priority;            /* the pod's priority (assignment), for the node's queue */
    uint32_t qos;                /* NN_QOS_*: how the compute share is enforced */
    uint32_t control;            /* NN_CTL_*, agent-written single word */
    uint32_t device_count;       /* valid entries in devices[] (the rest are zero) */
    uint64_t memory_used_bytes;  /* sum of devices[].memory_used_bytes (under the lock) */
    char pod_uid[NN_POD_UID_BYTES];    /* whose region this is (diagnostics, agent re-adoption) */
    char namespace_[NN_NAME_BYTES];    /* pod namespace (metrics labels after an agent restart) */
    char container_name[NN_NAME_BYTES];/* container name (ditto) */
    uint8_t reserved[48];
} nn_container;

/* 256 bytes each, from offset 512: one per assigned device, in the assignment's order. */
typedef struct nn_device_entry {
    char uuid[NN_UUID_BYTES];       /* NVML UUID the container sees (GPU-… or MIG-…), NUL-padded;
                                       the shim maps CUdevice -> entry by cuDeviceGetUuid */
    uint64_t memory_limit_bytes;    /* hard limit on this device for the container (memoryMiB) */
    uint64_t memory_used_bytes;     /* sum of procs[].used_bytes[i] (under the lock) */
    uint64_t memory_total_bytes;    /* physical/instance memory per NVML: the shim reports
                                       total = min(limit, this) and free = total - used */
    uint32_t compute_share_percent; /* 1..100 of the device's compute per pacing window; 100 = none */
    uint32_t host_index;            /* GPU index on the host (metrics label `gpu`) */
    uint32_t flags;                 /* NN_DEV_F_* */
    uint32_t mig_start;             /* MIG placement start slot (NN_DEV_F_MIG only; diagnostics) */
    uint64_t kernel_ns_total;       /* measured kernel time, all processes ever (atomic add) */
    uint64_t throttled_ns_total;    /* time launches were held to keep the share (atomic add) */
    uint64_t oom_refusals_total;    /* allocations refused because of a limit (atomic add) */
    uint64_t memory_peak_bytes;     /* high-water mark of memory_used_bytes (under the lock) */
    uint8_t reserved[120];
} nn_device_entry;

/* 384 bytes each, from offset 4608: one per live CUDA process of the container. */
typedef struct nn_proc_slot {
    uint32_t state;            /* NN_SLOT_*, under the lock */
    int32_t container_pid;     /* getpid() in the container's PID namespace (the shim writes it) */
    int32_t host_pid;          /* the same process in the host namespace; written by the agent
                                  (it matches /proc/<pid>/status NSpid + start time). 0 = not yet
                                  known. The shim never guesses it (peers' NVML guess fails open) */
    uint32_t flags;            /* NN_PROC_F_* */
    uint64_t start_time_ticks; /* /proc/self/stat starttime: tells a reused PID from this process */
    uint64_t claim_seq;        /* bumped on every claim, so a scan can tell a slot was reused */
    uint64_t heartbeat_ns;     /* CLOCK_MONOTONIC of the last alloc/launch (diagnostics) */
    uint64_t window_index;     /* pacing window kernel_ns[] belongs to: CLOCK_MONOTONIC / window */
    uint8_t reserved0[16];
    uint64_t used_bytes[NN_MAX_DEVICES]; /* memory this process holds per device (under the lock);
                                            dropped when the slot is reclaimed */
    uint64_t kernel_ns[NN_MAX_DEVICES];  /* kernel time measured in window_index, per device (only
                                            the owner writes; pacing sums it over slots) */
    uint8_t reserved1[64];
} nn_proc_slot;

/* The whole file. */
typedef struct nn_region {
    nn_region_header header;
    nn_lock lock;
    nn_container container;
    nn_device_entry devices[NN_MAX_DEVICES];
    nn_proc_slot procs[NN_MAX_PROCS];
    uint8_t reserved[11776]; /* room for new arrays in minor versions; pads to NN_REGION_SIZE */
} nn_region;

/* ---- the layout is part of the contract: pin it ------------------------------------------------ */

#define NN_ASSERT_OFFSET(type, field, offset) \
    NN_STATIC_ASSERT(offsetof(type, field) == (offset), #type "." #field " moved")

NN_STATIC_ASSERT(sizeof(pthread_mutex_t) <= NN_LOCK_STORAGE_BYTES, "pthread_mutex_t does not fit");
NN_STATIC_ASSERT(sizeof(nn_region_header) == 128, "nn_region_header size");
NN_STATIC_ASSERT(sizeof(nn_lock) == 128, "nn_lock size");
NN_STATIC_ASSERT(sizeof(nn_container) == 256, "nn_container size");
NN_STATIC_ASSERT(sizeof(nn_device_entry) == 256, "nn_device_entry size");
NN_STATIC_ASSERT(sizeof(nn_proc_slot) == 384, "nn_proc_slot size");
NN_STATIC_ASSERT(sizeof(nn_region) == NN_REGION_SIZE, "nn_region size");

NN_ASSERT_OFFSET(nn_region_header, magic, 0);
NN_ASSERT_OFFSET(nn_region_header, version_major, 8);
NN_ASSERT_OFFSET(nn_region_header, version_minor, 10);
NN_ASSERT_OFFSET(nn_region_header, header_size, 12);
NN_ASSERT_OFFSET(nn_region_header, region_size, 16);
NN_ASSERT_OFFSET(nn_region_header, device_entry_size, 24);
NN_ASSERT_OFFSET(nn_region_header, proc_slot_size, 28);
NN_ASSERT_OFFSET(nn_region_header, max_devices, 32);
NN_ASSERT_OFFSET(nn_region_header, max_procs, 36);
NN_ASSERT_OFFSET(nn_region_header, flags, 40);
NN_ASSERT_OFFSET(nn_region_header, creator_pid, 44);
NN_ASSERT_OFFSET(nn_region_header, created_realtime_ns, 48);
NN_ASSERT_OFFSET(nn_region_header, reserved, 56);

NN_ASSERT_OFFSET(nn_lock, storage, 0);
NN_ASSERT_OFFSET(nn_lock, mutex, 0);
NN_ASSERT_OFFSET(nn_lock, owner_died_total, 64);
NN_ASSERT_OFFSET(nn_lock, reserved, 72);

NN_ASSERT_OFFSET(nn_container, memory_limit_bytes, 0);
NN_ASSERT_OFFSET(nn_container, pacing_window_ns, 8);
NN_ASSERT_OFFSET(nn_container, priority, 16);
NN_ASSERT_OFFSET(nn_container, qos, 20);
NN_ASSERT_OFFSET(nn_container, control, 24);
NN_ASSERT_OFFSET(nn_container, device_count, 28);
NN_ASSERT_OFFSET(nn_container, memory_used_bytes, 32);
NN_ASSERT_OFFSET(nn_container, pod_uid, 40);
NN_ASSERT_OFFSET(nn_container, namespace_, 80);
NN_ASSERT_OFFSET(nn_container, container_name, 144);
NN_ASSERT_OFFSET(nn_container, reserved, 208);

NN_ASSERT_OFFSET(nn_device_entry, uuid, 0);
NN_ASSERT_OFFSET(nn_device_entry, memory_limit_bytes, 64);
NN_ASSERT_OFFSET(nn_device_entry, memory_used_bytes, 72);
NN_ASSERT_OFFSET(nn_device_entry, memory_total_bytes, 80);
NN_ASSERT_OFFSET(nn_device_entry, compute_share_percent, 88);
NN_ASSERT_OFFSET(nn_device_entry, host_index, 92);
NN_ASSERT_OFFSET(nn_device_entry, flags, 96);
NN_ASSERT_OFFSET(nn_device_entry, mig_start, 100);
NN_ASSERT_OFFSET(nn_device_entry, kernel_ns_total, 104);
NN_ASSERT_OFFSET(nn_device_entry, throttled_ns_total, 112);
NN_ASSERT_OFFSET(nn_device_entry, oom_refusals_total, 120);
NN_ASSERT_OFFSET(nn_device_entry, memory_peak_bytes, 128);
NN_ASSERT_OFFSET(nn_device_entry, reserved, 136);

NN_ASSERT_OFFSET(nn_proc_slot, state, 0);
NN_ASSERT_OFFSET(nn_proc_slot, container_pid, 4);
NN_ASSERT_OFFSET(nn_proc_slot, host_pid, 8);
NN_ASSERT_OFFSET(nn_proc_slot, flags, 12);
NN_ASSERT_OFFSET(nn_proc_slot, start_time_ticks, 16);
NN_ASSERT_OFFSET(nn_proc_slot, claim_seq, 24);
NN_ASSERT_OFFSET(nn_proc_slot, heartbeat_ns, 32);
NN_ASSERT_OFFSET(nn_proc_slot, window_index, 40);
NN_ASSERT_OFFSET(nn_proc_slot, reserved0, 48);
NN_ASSERT_OFFSET(nn_proc_slot, used_bytes, 64);
NN_ASSERT_OFFSET(nn_proc_slot, kernel_ns, 192);
NN_ASSERT_OFFSET(nn_proc_slot, reserved1, 320);

NN_ASSERT_OFFSET(nn_region, header, 0);
NN_ASSERT_OFFSET(nn_region, lock, 128);
NN_ASSERT_OFFSET(nn_region, container, 256);
NN_ASSERT_OFFSET(nn_region, devices, 512);
NN_ASSERT_OFFSET(nn_region, procs, 4608);
NN_ASSERT_OFFSET(nn_region, reserved, 53760);

/* Every 8-byte field is 8-aligned (atomic, untearable); hot per-process data starts on a cache
 * line so one process's updates do not bounce another's. */
NN_STATIC_ASSERT(offsetof(nn_region, procs) % 64 == 0, "procs not cache-line aligned");
NN_STATIC_ASSERT(sizeof(nn_proc_slot) % 64 == 0, "proc slot not a whole number of cache lines");
NN_STATIC_ASSERT(offsetof(nn_region, lock) % 64 == 0, "lock not cache-line aligned");

#ifdef __cplusplus
}
#endif

#endif /* NEURONETES_REGION_H */
