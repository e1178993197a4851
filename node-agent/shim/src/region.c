/*
 * region.c — the shared region from the shim's side: where it is, validation of both files, the
 * robust lock, process slots, check-and-charge, dead-process reclaim and the agent's reclaim
 * orders. Pure region logic (no CUDA), so it is tested on its own, under ThreadSanitizer too
 * (tests/test_region.c). Layout and rules: neuronetes_region.h.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A tenant holding its own region's lock forever stalls only itself; we stop waiting after this
 * and refuse the operation (fail closed). */
#define NN_LOCK_TIMEOUT_NS UINT64_C(2000000000)

/* The header checks both files share: magic, major version, every recorded size, READY. */
static int validate_header(const nn_file_header *h, uint64_t magic, const char *what, size_t file_size,
                           size_t want_size, uint32_t entry_size, uint32_t slot_size, char *why, size_t why_len) {
    if (file_size != want_size) {
        snprintf(why, why_len, "%s file: %zu bytes, expected %zu (truncated or not a region)", what, file_size,
                 want_size);
        return -1;
    }
    if (h->magic != magic) {
        snprintf(why, why_len, "%s file: bad magic %#018llx: not a NeuroNetes %s file", what,
                 (unsigned long long)h->magic, what);
        return -1;
    }
    if (h->version_major != NN_REGION_VERSION_MAJOR) {
        snprintf(why, why_len, "%s file: region version %u.%u is not readable by this shim (major %u)", what,
                 h->version_major, h->version_minor, NN_REGION_VERSION_MAJOR);
        return -1;
    }
    if (h->header_size != sizeof(nn_file_header) || h->file_size != want_size || h->device_entry_size != entry_size ||
        h->proc_slot_size != slot_size || h->max_devices != NN_MAX_DEVICES || h->max_procs != NN_MAX_PROCS) {
        snprintf(why, why_len, "%s file: region layout mismatch (header %u, file %llu, device %u, slot %u, %u devices, %u procs)",
                 what, h->header_size, (unsigned long long)h->file_size, h->device_entry_size, h->proc_slot_size,
                 h->max_devices, h->max_procs);
        return -1;
    }
    if (!(__atomic_load_n(&h->flags, __ATOMIC_ACQUIRE) & NN_REGION_F_READY)) {
        snprintf(why, why_len, "%s file: region is not ready", what);
        return -1;
    }
    return 0;
}

int nn_control_validate(const nn_control *c, size_t file_size, char *why, size_t why_len) {
    if (validate_header(&c->header, NN_CONTROL_MAGIC, "control", file_size, sizeof(nn_control),
                        sizeof(nn_device_control), sizeof(nn_proc_control), why, why_len) != 0)
        return -1;
    uint32_t qos = __atomic_load_n(&c->container.qos, __ATOMIC_RELAXED);
    if (qos < NN_QOS_GUARANTEED || qos > NN_QOS_BEST_EFFORT) {
        snprintf(why, why_len, "control file: region has no QoS class (%u)", qos);
        return -1;
    }
    uint32_t count = __atomic_load_n(&c->container.device_count, __ATOMIC_RELAXED);
    if (count < 1 || count > NN_MAX_DEVICES) {
        snprintf(why, why_len, "control file: region lists %u devices (1..%u)", count, NN_MAX_DEVICES);
        return -1;
    }
    return 0;
}

int nn_state_validate(const nn_state *s, size_t file_size, char *why, size_t why_len) {
    return validate_header(&s->header, NN_STATE_MAGIC, "state", file_size, sizeof(nn_state),
                           sizeof(nn_device_usage), sizeof(nn_proc_slot), why, why_len);
}

const char *nn_region_dir(const char *default_control, const char *env_dir) {
    struct stat st;
    if (lstat(default_control, &st) == 0) return NN_REGION_DIR; /* a container: never the environment */
    if (env_dir != NULL && *env_dir != '\0') return env_dir;
    return NN_REGION_DIR;
}

/* Map one file of the region: its size checked before mapping (past EOF is SIGBUS). */
static void *map_file(const char *dir, const char *name, size_t size, int writable, char *why, size_t why_len) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) {
        snprintf(why, why_len, "%s file: path too long", name);
        return NULL;
    }
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        int err = errno;
        char legacy[4096];
        struct stat st;
        /* A major-1 region was one file named "region": say so rather than only "missing". */
        if (err == ENOENT && (size_t)snprintf(legacy, sizeof legacy, "%s/region", dir) < sizeof legacy &&
            stat(legacy, &st) == 0)
            snprintf(why, why_len, "%s file: cannot open (%s); %s is a region of major version 1, which this "
                     "shim (major %u) does not read", name, strerror(err), legacy, NN_REGION_VERSION_MAJOR);
        else
            snprintf(why, why_len, "%s file: cannot open: %s", name, strerror(err));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "%s file: not a regular file", name);
        close(fd);
        return NULL;
    }
    if ((size_t)st.st_size != size) {
        snprintf(why, why_len, "%s file: %lld bytes, expected %zu (truncated or not a region)", name,
                 (long long)st.st_size, size);
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(why, why_len, "%s file: mmap: %s", name, strerror(errno));
        return NULL;
    }
    return p;
}

int nn_region_map(const char *dir, nn_region *out, char *why, size_t why_len) {
    nn_control *c = map_file(dir, NN_CONTROL_NAME, sizeof(nn_control), 0, why, why_len);
    if (c == NULL) return -1;
    if (nn_control_validate(c, sizeof(nn_control), why, why_len) != 0) {
        munmap(c, sizeof(nn_control));
        return -1;
    }
    nn_state *s = map_file(dir, NN_STATE_NAME, sizeof(nn_state), 1, why, why_len);
    if (s == NULL) {
        munmap(c, sizeof(nn_control));
        return -1;
    }
    if (nn_state_validate(s, sizeof(nn_state), why, why_len) != 0 || s->header.pair_id != c->header.pair_id) {
        if (s->header.pair_id != c->header.pair_id && s->header.magic == NN_STATE_MAGIC)
            snprintf(why, why_len, "state file belongs to another region than the control file (pair id)");
        munmap(s, sizeof(nn_state));
        munmap(c, sizeof(nn_control));
        return -1;
    }
    out->control = c;
    out->state = s;
    return 0;
}

void nn_region_recompute(nn_region *r) {
    nn_state *st = r->state;
    uint64_t total = 0;
    for (unsigned d = 0; d < NN_MAX_DEVICES; d++) {
        uint64_t used = 0;
        for (unsigned i = 0; i < NN_MAX_PROCS; i++)
            if (st->procs[i].state != NN_SLOT_FREE) used += st->procs[i].used_bytes[d];
        nn_device_usage *e = &st->devices[d];
        __atomic_store_n(&e->memory_used_bytes, used, __ATOMIC_RELAXED);
        if (used > e->memory_peak_bytes) __atomic_store_n(&e->memory_peak_bytes, used, __ATOMIC_RELAXED);
        total += used;
    }
    __atomic_store_n(&st->usage.memory_used_bytes, total, __ATOMIC_RELAXED);
}

static void free_slot(nn_proc_slot *s) {
    uint64_t seq = s->claim_seq;
    memset(s, 0, sizeof *s);
    s->claim_seq = seq;
    __atomic_store_n(&s->state, NN_SLOT_FREE, __ATOMIC_RELEASE);
}

/* Under the lock: free every slot the agent ordered reclaimed whose claim is still the ordered one. */
static int apply_orders_locked(nn_region *r) {
    uint64_t gen = __atomic_load_n(&r->control->container.reclaim_generation, __ATOMIC_ACQUIRE);
    if (gen == r->state->usage.reclaim_generation_seen) return 0;
    int freed = 0;
    for (unsigned i = 0; i < NN_MAX_PROCS; i++) {
        uint64_t order = __atomic_load_n(&r->control->procs[i].reclaim_claim_seq, __ATOMIC_ACQUIRE);
        nn_proc_slot *s = &r->state->procs[i];
        if (order != 0 && s->state != NN_SLOT_FREE && s->claim_seq == order) {
            free_slot(s);
            freed++;
        }
    }
    __atomic_store_n(&r->state->usage.reclaim_generation_seen, gen, __ATOMIC_RELAXED);
    if (freed > 0) nn_region_recompute(r);
    return freed;
}

/* After a successful lock: recover a dead holder's half-done update, apply pending orders (the
 * number of slots they freed). */
static int locked(nn_region *r, int rc) {
    if (rc == EOWNERDEAD) {
        /* The holder died mid-update: per-process values are single aligned stores and never torn,
         * so rebuilding the totals from them makes the region consistent again. */
        pthread_mutex_consistent(&r->state->lock.mutex);
        __atomic_fetch_add(&r->state->lock.owner_died_total, 1, __ATOMIC_RELAXED);
        nn_region_recompute(r);
    }
    return apply_orders_locked(r);
}

int nn_region_lock(nn_region *r) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    uint64_t ns = (uint64_t)deadline.tv_nsec + NN_LOCK_TIMEOUT_NS;
    deadline.tv_sec += (time_t)(ns / 1000000000u);
    deadline.tv_nsec = (long)(ns % 1000000000u);
    int rc = pthread_mutex_timedlock(&r->state->lock.mutex, &deadline);
    if (rc != 0 && rc != EOWNERDEAD) return -1;
    (void)locked(r, rc);
    return 0;
}

void nn_region_unlock(nn_region *r) { pthread_mutex_unlock(&r->state->lock.mutex); }

int nn_region_poll_orders(nn_region *r) {
    uint64_t gen = __atomic_load_n(&r->control->container.reclaim_generation, __ATOMIC_ACQUIRE);
    if (NN_UNLIKELY(gen != __atomic_load_n(&r->state->usage.reclaim_generation_seen, __ATOMIC_RELAXED))) {
        int rc = pthread_mutex_trylock(&r->state->lock.mutex);
        if (rc != 0 && rc != EOWNERDEAD) return 0; /* busy: the holder or a later call applies them */
        int freed = locked(r, rc);
        nn_region_unlock(r);
        return freed;
    }
    return 0;
}

int32_t nn_region_host_pid(const nn_region *r, int i) {
    if (i < 0 || i >= (int)NN_MAX_PROCS) return 0;
    const nn_proc_control *pc = &r->control->procs[i];
    uint64_t seq = __atomic_load_n(&pc->claim_seq, __ATOMIC_ACQUIRE);
    int32_t pid = __atomic_load_n(&pc->host_pid, __ATOMIC_ACQUIRE);
    uint64_t again = __atomic_load_n(&pc->claim_seq, __ATOMIC_ACQUIRE);
    uint64_t mine = __atomic_load_n(&r->state->procs[i].claim_seq, __ATOMIC_ACQUIRE);
    return (pid > 0 && seq == again && seq == mine) ? pid : 0;
}

uint64_t nn_proc_start_ticks(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL) return 0;
    unsigned field = 2; /* starttime is field 22 */
    while (*p != '\0' && field < 22) {
        if (*p == ' ') field++;
        p++;
    }
    return *p == '\0' ? 0 : strtoull(p, NULL, 10);
}

static int slot_process_alive(const nn_proc_slot *s) {
    pid_t pid = s->container_pid;
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t start = nn_proc_start_ticks(pid);
    return start != 0 && start == s->start_time_ticks; /* a reused PID is another process */
}

int nn_region_reap_locked(nn_region *r, int self_slot, int (*driver_has_pid)(int32_t host_pid)) {
    int freed = 0;
    for (int i = 0; i < (int)NN_MAX_PROCS; i++) {
        nn_proc_slot *s = &r->state->procs[i];
        if (i == self_slot || s->state == NN_SLOT_FREE) continue;
        if (s->state == NN_SLOT_ACTIVE && !slot_process_alive(s))
            __atomic_store_n(&s->state, NN_SLOT_DEAD, __ATOMIC_RELEASE);
        if (s->state != NN_SLOT_DEAD) continue;
        int holds_memory = 0;
        for (unsigned d = 0; d < NN_MAX_DEVICES; d++) holds_memory |= s->used_bytes[d] != 0;
        /* Memory stays charged until the driver shows it released; without the agent-registered
         * host PID we cannot ask, and the agent orders the reclaim. */
        int32_t host_pid = nn_region_host_pid(r, i);
        if (holds_memory && (host_pid <= 0 || driver_has_pid == NULL || driver_has_pid(host_pid))) continue;
        free_slot(s);
        freed++;
    }
    if (freed > 0) nn_region_recompute(r);
    return freed;
}

int nn_region_claim(nn_region *r, pid_t pid, uint64_t start_ticks) {
    if (nn_region_lock(r) != 0) return -1;
    /* A slot already holding our PID is this process before an exec (the driver released its
     * memory: CUDA's device files close on exec) or a dead process whose PID we reuse (gone, and
     * its memory with it): free it. */
    int freed = 0;
    for (int i = 0; i < (int)NN_MAX_PROCS; i++) {
        nn_proc_slot *s = &r->state->procs[i];
        if (s->state != NN_SLOT_FREE && s->container_pid == (int32_t)pid) {
            free_slot(s);
            freed = 1;
        }
    }
    if (freed) nn_region_recompute(r);
    int slot = -1;
    for (int pass = 0; pass < 2 && slot < 0; pass++) {
        if (pass == 1) nn_region_reap_locked(r, -1, NULL);
        for (int i = 0; i < (int)NN_MAX_PROCS && slot < 0; i++)
            if (r->state->procs[i].state == NN_SLOT_FREE) slot = i;
    }
    if (slot >= 0) {
        nn_proc_slot *s = &r->state->procs[slot];
        uint64_t seq = s->claim_seq + 1;
        memset(s, 0, sizeof *s);
        s->container_pid = (int32_t)pid;
        s->start_time_ticks = start_ticks;
        s->claim_seq = seq;
        __atomic_store_n(&s->state, NN_SLOT_ACTIVE, __ATOMIC_RELEASE);
    }
    nn_region_unlock(r);
    return slot;
}

int nn_region_charge(nn_region *r, int slot, int dev, uint64_t size, uint64_t dev_limit) {
    if (slot < 0 || dev < 0 || dev >= (int)NN_MAX_DEVICES) return 0;
    if (nn_region_lock(r) != 0) return -1;
    nn_device_usage *e = &r->state->devices[dev];
    nn_usage *u = &r->state->usage;
    const nn_container *c = &r->control->container;
    uint64_t container_limit = __atomic_load_n(&c->memory_limit_bytes, __ATOMIC_ACQUIRE);
    uint32_t control = __atomic_load_n(&c->control, __ATOMIC_ACQUIRE);
    int ok = !(control & NN_CTL_DRAINING) && e->memory_used_bytes <= dev_limit &&
             size <= dev_limit - e->memory_used_bytes && u->memory_used_bytes <= container_limit &&
             size <= container_limit - u->memory_used_bytes;
    if (ok) {
        nn_proc_slot *s = &r->state->procs[slot];
        __atomic_store_n(&s->used_bytes[dev], s->used_bytes[dev] + size, __ATOMIC_RELAXED);
        uint64_t used = e->memory_used_bytes + size;
        __atomic_store_n(&e->memory_used_bytes, used, __ATOMIC_RELAXED);
        if (used > e->memory_peak_bytes) __atomic_store_n(&e->memory_peak_bytes, used, __ATOMIC_RELAXED);
        __atomic_store_n(&u->memory_used_bytes, u->memory_used_bytes + size, __ATOMIC_RELAXED);
    }
    nn_region_unlock(r);
    return ok;
}

static uint64_t minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

void nn_region_uncharge(nn_region *r, int slot, int dev, uint64_t size) {
    if (slot < 0 || dev < 0 || dev >= (int)NN_MAX_DEVICES || size == 0) return;
    if (nn_region_lock(r) != 0) return; /* stays charged: fail closed */
    nn_proc_slot *s = &r->state->procs[slot];
    uint64_t give = size < s->used_bytes[dev] ? size : s->used_bytes[dev];
    __atomic_store_n(&s->used_bytes[dev], s->used_bytes[dev] - give, __ATOMIC_RELAXED);
    nn_device_usage *e = &r->state->devices[dev];
    __atomic_store_n(&e->memory_used_bytes, minus(e->memory_used_bytes, give), __ATOMIC_RELAXED);
    __atomic_store_n(&r->state->usage.memory_used_bytes, minus(r->state->usage.memory_used_bytes, give),
                     __ATOMIC_RELAXED);
    nn_region_unlock(r);
}
