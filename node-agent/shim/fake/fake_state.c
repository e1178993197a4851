/* fake_state.c — the simulated GPU's shared account (see fake_state.h). */
#define _GNU_SOURCE
#include "fake_state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static fake_state *g_state;
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t env_u64(const char *name, uint64_t fallback) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') return fallback;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    return (end != NULL && *end == '\0') ? (uint64_t)x : fallback;
}

static void init_state(fake_state *s) {
    memset(s, 0, sizeof *s);
    uint64_t count = env_u64("FAKE_CUDA_DEVICES", 1);
    if (count < 1 || count > FAKE_MAX_DEVICES) count = 1;
    s->device_count = (uint32_t)count;
    for (unsigned i = 0; i < count; i++)
        s->devices[i].total_bytes = env_u64("FAKE_CUDA_MEM_BYTES", FAKE_DEFAULT_MEM_BYTES);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    __atomic_store_n(&s->magic, FAKE_STATE_MAGIC, __ATOMIC_RELEASE);
}

fake_state *fake_state_open(void) {
    fake_state *s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
    if (s != NULL) return s;
    pthread_mutex_lock(&g_open_lock);
    if (g_state != NULL) {
        pthread_mutex_unlock(&g_open_lock);
        return g_state;
    }
    const char *path = getenv("FAKE_CUDA_STATE");
    if (path == NULL || *path == '\0') {
        pthread_mutex_unlock(&g_open_lock);
        return NULL;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fake libcuda: cannot open FAKE_CUDA_STATE=%s: %s\n", path, strerror(errno));
        pthread_mutex_unlock(&g_open_lock);
        return NULL;
    }
    flock(fd, LOCK_EX); /* one initialiser */
    struct stat st;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size < sizeof(fake_state) &&
        ftruncate(fd, (off_t)sizeof(fake_state)) != 0) {
        flock(fd, LOCK_UN);
        close(fd);
        pthread_mutex_unlock(&g_open_lock);
        return NULL;
    }
    void *p = mmap(NULL, sizeof(fake_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
        s = p;
        if (__atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) != FAKE_STATE_MAGIC) init_state(s);
        __atomic_store_n(&g_state, s, __ATOMIC_RELEASE);
    }
    flock(fd, LOCK_UN);
    close(fd);
    pthread_mutex_unlock(&g_open_lock);
    return s;
}

static void recompute(fake_state *s) {
    for (unsigned d = 0; d < FAKE_MAX_DEVICES; d++) {
        uint64_t used = 0;
        for (unsigned i = 0; i < FAKE_MAX_PROCS; i++)
            if (s->procs[i].pid != 0) used += s->procs[i].used[d];
        s->devices[d].used_bytes = used;
    }
}

void fake_state_lock(fake_state *s) {
    int rc = pthread_mutex_lock(&s->lock);
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(&s->lock);
        recompute(s);
    }
}

void fake_state_unlock(fake_state *s) { pthread_mutex_unlock(&s->lock); }

/* The start of a small /proc file into buf, NUL-terminated; 0 when unreadable or empty. */
static int read_proc_file(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    return 1;
}

/* Field `field` (1-based, as proc(5) numbers them) of a /proc/<pid>/stat file; 0 when unreadable. */
static uint64_t stat_field(const char *path, unsigned field) {
    char buf[1024];
    if (!read_proc_file(path, buf, sizeof buf)) return 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL) return 0;
    /* after ") " come fields 3.. */
    unsigned at = 2;
    while (*p != '\0' && at < field) {
        if (*p == ' ') at++;
        p++;
    }
    return *p == '\0' ? 0 : strtoull(p, NULL, 10);
}

#define STAT_FLAGS 9       /* the task's PF_* flags */
#define STAT_STARTTIME 22  /* clock ticks since boot: the same number seen from any namespace */
#define PF_KTHREAD_FLAG 0x00200000u

uint64_t fake_proc_start_ticks(int32_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    return stat_field(path, STAT_STARTTIME);
}

static fake_ns ns_at(const char *path) {
    struct stat st;
    fake_ns ns = {0, 0};
    if (stat(path, &st) == 0) {
        ns.dev = (uint64_t)st.st_dev;
        ns.ino = (uint64_t)st.st_ino;
    }
    return ns;
}

fake_ns fake_ns_self(void) { return ns_at("/proc/self/ns/pid"); }

static int same_ns(fake_ns a, fake_ns b) { return a.dev == b.dev && a.ino == b.ino; }

/* Is `p` of the caller's namespace `me`? Where either is unknown (no /proc), every entry is. */
static int is_own(const fake_proc *p, fake_ns me) {
    return me.ino == 0 || p->pidns.ino == 0 || same_ns(p->pidns, me);
}

/* The last number of the NSpid: line of <dir>/status: the process's PID in its own namespace. */
static int32_t innermost_pid(const char *dir) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "%s/status", dir);
    if (!read_proc_file(path, buf, sizeof buf)) return 0;
    const char *line = strstr(buf, "\nNSpid:");
    if (line == NULL) return 0;
    const char *p = line + 7;
    long last = 0;
    while (*p != '\0' && *p != '\n') {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        last = v;
        p = end;
    }
    return (int32_t)last;
}

fake_proc *fake_state_find(fake_state *s, int32_t pid) {
    if (pid <= 0) return NULL;
    fake_ns me = fake_ns_self();
    int foreign = 0;
    for (unsigned i = 0; i < FAKE_MAX_PROCS; i++) {
        fake_proc *p = &s->procs[i];
        if (p->pid == 0) continue;
        if (!is_own(p, me)) foreign = 1;
        else if (p->pid == pid) return p;
    }
    if (!foreign) return NULL;
    /* a process of a descendant namespace, by the number the caller's /proc gives it */
    char dir[32], path[64];
    snprintf(dir, sizeof dir, "/proc/%d", (int)pid);
    snprintf(path, sizeof path, "%s/ns/pid", dir);
    fake_ns ns = ns_at(path);
    if (ns.ino == 0 || same_ns(ns, me)) return NULL;
    int32_t inner = innermost_pid(dir);
    snprintf(path, sizeof path, "%s/stat", dir);
    uint64_t start = stat_field(path, STAT_STARTTIME);
    for (unsigned i = 0; i < FAKE_MAX_PROCS; i++) {
        fake_proc *p = &s->procs[i];
        if (p->pid != 0 && p->pid == inner && p->start_ticks == start && same_ns(p->pidns, ns)) return p;
    }
    return NULL;
}

fake_proc *fake_state_self(fake_state *s) {
    int32_t pid = (int32_t)getpid();
    uint64_t start = stat_field("/proc/self/stat", STAT_STARTTIME);
    fake_ns me = fake_ns_self();
    fake_proc *p = NULL;
    for (unsigned i = 0; i < FAKE_MAX_PROCS && p == NULL; i++)
        if (s->procs[i].pid == pid && same_ns(s->procs[i].pidns, me)) p = &s->procs[i];
    if (p != NULL && p->start_ticks == start) return p;
    if (p != NULL) memset(p, 0, sizeof *p); /* a previous process with our PID: the driver freed it */
    for (unsigned i = 0; i < FAKE_MAX_PROCS && p == NULL; i++)
        if (s->procs[i].pid == 0) p = &s->procs[i];
    if (p == NULL) {
        fake_state_reap(s);
        for (unsigned i = 0; i < FAKE_MAX_PROCS && p == NULL; i++)
            if (s->procs[i].pid == 0) p = &s->procs[i];
    }
    if (p == NULL) return NULL;
    memset(p, 0, sizeof *p);
    p->pid = pid;
    p->start_ticks = start;
    p->pidns = me;
    recompute(s);
    return p;
}

static int alive(const fake_proc *p) {
    if (kill(p->pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t start = fake_proc_start_ticks(p->pid);
    return start != 0 && start == p->start_ticks;
}

void fake_state_reap(fake_state *s) {
    fake_ns me = fake_ns_self();
    int changed = 0;
    for (unsigned i = 0; i < FAKE_MAX_PROCS; i++) {
        fake_proc *p = &s->procs[i];
        if (p->pid == 0 || !is_own(p, me) || alive(p)) continue;
        memset(p, 0, sizeof *p);
        changed = 1;
    }
    if (changed) recompute(s);
}

/* Kernel threads are visible only from the machine's initial PID namespace: kthreadd (pid 2) of
 * the caller's own /proc carrying PF_KTHREAD means the caller is there, an ancestor of all. */
static int in_initial_ns(fake_ns me) {
    return same_ns(ns_at("/proc/2/ns/pid"), me) && (stat_field("/proc/2/stat", STAT_FLAGS) & PF_KTHREAD_FLAG) != 0;
}

static int was_seen_from(const fake_proc *p, fake_ns me) {
    for (unsigned k = 0; k < FAKE_SEEN_FROM; k++)
        if (same_ns(p->seen_from[k], me)) return 1;
    return 0;
}

static void remember_seen_from(fake_proc *p, fake_ns me) {
    if (was_seen_from(p, me)) return;
    unsigned k = 0;
    while (k < FAKE_SEEN_FROM - 1 && p->seen_from[k].ino != 0) k++;
    p->seen_from[k] = me; /* all taken: the last slot changes hands */
}

static int all_digits(const char *name) {
    if (*name == '\0') return 0;
    for (; *name != '\0'; name++)
        if (*name < '0' || *name > '9') return 0;
    return 1;
}

/* One pass over the caller's /proc: shown[i] for the foreign entries idx[0..n), and whether some
 * process of each one's namespace is visible at all (then the caller is its ancestor). */
static void scan_proc(const fake_state *s, fake_ns me, const unsigned *idx, unsigned n, int32_t *shown,
                      unsigned char *ns_visible) {
    DIR *d = opendir("/proc");
    if (d == NULL) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!all_digits(e->d_name) || strlen(e->d_name) > 10) continue;
        long pid = strtol(e->d_name, NULL, 10);
        char dir[32], path[64];
        snprintf(dir, sizeof dir, "/proc/%ld", pid);
        snprintf(path, sizeof path, "%s/ns/pid", dir);
        fake_ns ns = ns_at(path);
        if (ns.ino == 0 || same_ns(ns, me)) continue;
        int32_t inner = -1;
        uint64_t start = 0;
        for (unsigned j = 0; j < n; j++) {
            const fake_proc *p = &s->procs[idx[j]];
            if (!same_ns(p->pidns, ns)) continue;
            ns_visible[idx[j]] = 1;
            if (inner < 0) {
                inner = innermost_pid(dir);
                snprintf(path, sizeof path, "%s/stat", dir);
                start = stat_field(path, STAT_STARTTIME);
            }
            if (p->pid == inner && p->start_ticks == start) shown[idx[j]] = (int32_t)pid;
        }
    }
    closedir(d);
}

void fake_state_survey(fake_state *s, int32_t shown[FAKE_MAX_PROCS]) {
    fake_state_reap(s);
    fake_ns me = fake_ns_self();
    unsigned idx[FAKE_MAX_PROCS], n = 0;
    for (unsigned i = 0; i < FAKE_MAX_PROCS; i++) {
        const fake_proc *p = &s->procs[i];
        shown[i] = 0;
        if (p->pid == 0) continue;
        if (is_own(p, me)) shown[i] = p->pid;
        else idx[n++] = i;
    }
    if (n == 0) return; /* one namespace: no scan */
    unsigned char ns_visible[FAKE_MAX_PROCS] = {0};
    scan_proc(s, me, idx, n, shown, ns_visible);
    int initial = -1, changed = 0;
    for (unsigned j = 0; j < n; j++) {
        fake_proc *p = &s->procs[idx[j]];
        if (shown[idx[j]] != 0) {
            remember_seen_from(p, me);
            continue;
        }
        if (!ns_visible[idx[j]] && !was_seen_from(p, me)) {
            if (initial < 0) initial = in_initial_ns(me);
            if (!initial) continue; /* perhaps alive where the caller cannot see: not ours to judge */
        }
        memset(p, 0, sizeof *p); /* an ancestor that cannot find it: gone, and its memory with it */
        changed = 1;
    }
    if (changed) recompute(s);
}

void fake_device_uuid(unsigned index, char out[41]) {
    /* FAKE_CUDA_UUIDS="GPU-…,GPU-…" names the devices (a simulated node's GPUs, so a region the agent
     * wrote for them matches); otherwise fa4e0000-0000-4000-8000-<index as 12 hex digits> */
    const char *list = getenv("FAKE_CUDA_UUIDS");
    for (unsigned i = 0; list != NULL && *list != '\0'; i++) {
        const char *end = strchr(list, ',');
        size_t len = end != NULL ? (size_t)(end - list) : strlen(list);
        if (i == index && len == 40 && strncmp(list, "GPU-", 4) == 0) {
            memcpy(out, list, 40);
            out[40] = '\0';
            return;
        }
        list = end != NULL ? end + 1 : NULL;
    }
    snprintf(out, 41, "GPU-fa4e0000-0000-4000-8000-%012x", index);
}
