/*
 * region.c — the shared region from the shim's side: validation, the robust lock, process slots,
 * check-and-charge, dead-process reclaim. Pure region logic (no CUDA), so it is tested on its own,
 * under ThreadSanitizer too (tests/test_region.c). Layout and rules: neuronetes_region.h.
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

int nn_region_validate(const nn_region *r, size_t file_size, char *why, size_t why_len) {
    const nn_region_header *h = &r->header;
    if (file_size != sizeof(nn_region)) {
        snprintf(why, why_len, "%zu bytes, expected %zu (truncated or not a region)", file_size, sizeof(nn_region));
        return -1;
    }
    if (h->magic != NN_REGION_MAGIC) {
        snprintf(why, why_len, "bad magic %#018llx: not a NeuroNetes region", (unsigned long long)h->magic);
        return -1;
    }
    if (h->version_major != NN_REGION_VERSION_MAJOR) {
        snprintf(why, why_len, "region version %u.%u is not readable by this shim (major %u)", h->version_major,
                 h->version_minor, NN_REGION_VERSION_MAJOR);
        return -1;
    }
    if (h->header_size != sizeof(nn_region_header) || h->region_size != sizeof(nn_region) ||
        h->device_entry_size != sizeof(nn_device_entry) || h->proc_slot_size != sizeof(nn_proc_slot) ||
        h->max_devices != NN_MAX_DEVICES || h->max_procs != NN_MAX_PROCS) {
        snprintf(why, why_len, "region layout mismatch (header %u, region %llu, device %u, slot %u, %u devices, %u procs)",
                 h->header_size, (unsigned long long)h->region_size, h->device_entry_size, h->proc_slot_size,
                 h->max_devices, h->max_procs);
        return -1;
    }
    if (!(__atomic_load_n(&h->flags, __ATOMIC_ACQUIRE) & NN_REGION_F_READY)) {
        snprintf(why, why_len, "region is not ready");
        return -1;
    }
    uint32_t qos = __atomic_load_n(&r->container.qos, __ATOMIC_RELAXED);
    if (qos < NN_QOS_GUARANTEED || qos > NN_QOS_BEST_EFFORT) {
        snprintf(why, why_len, "region has no QoS class (%u)", qos);
        return -1;
    }
    uint32_t count = __atomic_load_n(&r->container.device_count, __ATOMIC_RELAXED);
    if (count < 1 || count > NN_MAX_DEVICES) {
        snprintf(why, why_len, "region lists %u devices (1..%u)", count, NN_MAX_DEVICES);
        return -1;
    }
    return 0;
}

nn_region *nn_region_map(const char *path, char *why, size_t why_len) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(why, why_len, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "not a regular file");
        close(fd);
        return NULL;
    }
    if ((size_t)st.st_size != sizeof(nn_region)) { /* check before mapping: past EOF is SIGBUS */
        snprintf(why, why_len, "%lld bytes, expected %zu (truncated or not a region)", (long long)st.st_size,
                 sizeof(nn_region));
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, sizeof(nn_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(why, why_len, "mmap: %s", strerror(errno));
        return NULL;
    }
    if (nn_region_validate(p, sizeof(nn_region), why, why_len) != 0) {
        munmap(p, sizeof(nn_region));
        return NULL;
    }
    return p;
}

void nn_region_recompute(nn_region *r) {
    uint64_t total = 0;
    for (unsigned d = 0; d < NN_MAX_DEVICES; d++) {
        uint64_t used = 0;
        for (unsigned i = 0; i < NN_MAX_PROCS; i++)
            if (r->procs[i].state != NN_SLOT_FREE) used += r->procs[i].used_bytes[d];
        nn_device_entry *e = &r->devices[d];
        __atomic_store_n(&e->memory_used_bytes, used, __ATOMIC_RELAXED);
        if (used > e->memory_peak_bytes) __atomic_store_n(&e->memory_peak_bytes, used, __ATOMIC_RELAXED);
        total += used;
    }
    __atomic_store_n(&r->container.memory_used_bytes, total, __ATOMIC_RELAXED);
}

int nn_region_lock(nn_region *r) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    uint64_t ns = (uint64_t)deadline.tv_nsec + NN_LOCK_TIMEOUT_NS;
    deadline.tv_sec += (time_t)(ns / 1000000000u);
    deadline.tv_nsec = (long)(ns % 1000000000u);
    int rc = pthread_mutex_timedlock(&r->lock.mutex, &deadline);
    if (rc == EOWNERDEAD) {
        /* The holder died mid-update: per-process values are single aligned stores and never torn,
         * so rebuilding the totals from them makes the region consistent again. */
        pthread_mutex_consistent(&r->lock.mutex);
        __atomic_fetch_add(&r->lock.owner_died_total, 1, __ATOMIC_RELAXED);
        nn_region_recompute(r);
        return 0;
    }
    return rc == 0 ? 0 : -1;
}

void nn_region_unlock(nn_region *r) { pthread_mutex_unlock(&r->lock.mutex); }

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

static void free_slot(nn_proc_slot *s) {
    uint64_t seq = s->claim_seq;
    memset(s, 0, sizeof *s);
    s->claim_seq = seq;
    __atomic_store_n(&s->state, NN_SLOT_FREE, __ATOMIC_RELEASE);
}

int nn_region_reap_locked(nn_region *r, int self_slot, int (*driver_has_pid)(int32_t host_pid)) {
    int freed = 0;
    for (int i = 0; i < (int)NN_MAX_PROCS; i++) {
        nn_proc_slot *s = &r->procs[i];
        if (i == self_slot || s->state == NN_SLOT_FREE) continue;
        if (s->state == NN_SLOT_ACTIVE && !slot_process_alive(s))
            __atomic_store_n(&s->state, NN_SLOT_DEAD, __ATOMIC_RELEASE);
        if (s->state != NN_SLOT_DEAD) continue;
        int holds_memory = 0;
        for (unsigned d = 0; d < NN_MAX_DEVICES; d++) holds_memory |= s->used_bytes[d] != 0;
        /* Memory stays charged until the driver shows it released; without the agent-written host
         * PID we cannot ask, and the agent reclaims the slot. */
        int32_t host_pid = __atomic_load_n(&s->host_pid, __ATOMIC_ACQUIRE);
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
        nn_proc_slot *s = &r->procs[i];
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
            if (r->procs[i].state == NN_SLOT_FREE) slot = i;
    }
    if (slot >= 0) {
        nn_proc_slot *s = &r->procs[slot];
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
    nn_device_entry *e = &r->devices[dev];
    nn_container *c = &r->container;
    uint64_t container_limit = __atomic_load_n(&c->memory_limit_bytes, __ATOMIC_ACQUIRE);
    uint32_t control = __atomic_load_n(&c->control, __ATOMIC_ACQUIRE);
    int ok = !(control & NN_CTL_DRAINING) && e->memory_used_bytes <= dev_limit &&
             size <= dev_limit - e->memory_used_bytes && c->memory_used_bytes <= container_limit &&
             size <= container_limit - c->memory_used_bytes;
    if (ok) {
        nn_proc_slot *s = &r->procs[slot];
        __atomic_store_n(&s->used_bytes[dev], s->used_bytes[dev] + size, __ATOMIC_RELAXED);
        uint64_t used = e->memory_used_bytes + size;
        __atomic_store_n(&e->memory_used_bytes, used, __ATOMIC_RELAXED);
        if (used > e->memory_peak_bytes) __atomic_store_n(&e->memory_peak_bytes, used, __ATOMIC_RELAXED);
        __atomic_store_n(&c->memory_used_bytes, c->memory_used_bytes + size, __ATOMIC_RELAXED);
    }
    nn_region_unlock(r);
    return ok;
}

static uint64_t minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

void nn_region_uncharge(nn_region *r, int slot, int dev, uint64_t size) {
    if (slot < 0 || dev < 0 || dev >= (int)NN_MAX_DEVICES || size == 0) return;
    if (nn_region_lock(r) != 0) return; /* stays charged: fail closed */
    nn_proc_slot *s = &r->procs[slot];
    uint64_t give = size < s->used_bytes[dev] ? size : s->used_bytes[dev];
    __atomic_store_n(&s->used_bytes[dev], s->used_bytes[dev] - give, __ATOMIC_RELAXED);
    nn_device_entry *e = &r->devices[dev];
    __atomic_store_n(&e->memory_used_bytes, minus(e->memory_used_bytes, give), __ATOMIC_RELAXED);
    __atomic_store_n(&r->container.memory_used_bytes, minus(r->container.memory_used_bytes, give),
                     __ATOMIC_RELAXED);
    nn_region_unlock(r);
}
