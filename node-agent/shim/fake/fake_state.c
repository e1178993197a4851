/* fake_state.c — the simulated GPU's shared account (see fake_state.h). */
#define _GNU_SOURCE
#include "fake_state.h"

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

uint64_t fake_proc_start_ticks(int32_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL) return 0;
    /* after ") " come fields 3.. ; starttime is field 22 */
    unsigned field = 2;
    while (*p != '\0' && field < 22) {
        if (*p == ' ') field++;
        p++;
    }
    return *p == '\0' ? 0 : strtoull(p, NULL, 10);
}

fake_proc *fake_state_find(fake_state *s, int32_t pid) {
    for (unsigned i = 0; i < FAKE_MAX_PROCS; i++)
        if (s->procs[i].pid == pid) return &s->procs[i];
    return NULL;
}

fake_proc *fake_state_self(fake_state *s) {
    int32_t pid = (int32_t)getpid();
    uint64_t start = fake_proc_start_ticks(pid);
    fake_proc *p = fake_state_find(s, pid);
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
    recompute(s);
    return p;
}

static int alive(const fake_proc *p) {
    if (kill(p->pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t start = fake_proc_start_ticks(p->pid);
    return start != 0 && start == p->start_ticks;
}

void fake_state_reap(fake_state *s) {
    int changed = 0;
    for (unsigned i = 0; i < FAKE_MAX_PROCS; i++) {
        fake_proc *p = &s->procs[i];
        if (p->pid == 0 || alive(p)) continue;
        memset(p, 0, sizeof *p);
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
