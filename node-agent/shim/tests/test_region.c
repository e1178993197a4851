/*
 * test_region.c — the shim's region logic (src/region.c) on its own, run under ThreadSanitizer
 * and AddressSanitizer: validation, concurrent check-and-charge never passing the limit, a lock
 * holder that dies, slot claims and dead-process reclaim.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "../src/shim.h"
#include "nn_test.h"

static char g_dir[] = "/tmp/nn-region-test-XXXXXX";

static nn_region *fresh(const char *name, uint64_t limit) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    nn_test_region_one(path, limit, 100, 0);
    char why[256];
    nn_region *r = nn_region_map(path, why, sizeof why);
    if (r == NULL) fprintf(stderr, "map: %s\n", why);
    CHECK(r != NULL);
    return r;
}

static void expect_refused(const char *name, void (*spoil)(nn_region *), const char *reason) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    nn_region *w = nn_test_region_one(path, MIB, 100, 0);
    spoil(w);
    char why[256] = "";
    CHECK(nn_region_map(path, why, sizeof why) == NULL);
    if (strstr(why, reason) == NULL) {
        fprintf(stderr, "%s: got \"%s\", expected \"%s\"\n", name, why, reason);
        exit(1);
    }
}

static void bad_magic(nn_region *r) { r->header.magic ^= 1; }
static void bad_major(nn_region *r) { r->header.version_major = 2; }
static void bad_slot(nn_region *r) { r->header.proc_slot_size = 256; }
static void not_ready(nn_region *r) { r->header.flags = 0; }
static void no_qos(nn_region *r) { r->container.qos = 0; }
static void no_devices(nn_region *r) { r->container.device_count = 0; }
static void newer_minor(nn_region *r) { r->header.version_minor = 9; }

static void test_validation(void) {
    expect_refused("magic", bad_magic, "bad magic");
    expect_refused("major", bad_major, "version 2.0 is not readable");
    expect_refused("slot", bad_slot, "layout mismatch");
    expect_refused("ready", not_ready, "not ready");
    expect_refused("qos", no_qos, "no QoS class");
    expect_refused("devices", no_devices, "lists 0 devices");
    char path[256], why[256];
    snprintf(path, sizeof path, "%s/short", g_dir);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
    close(fd);
    CHECK(nn_region_map(path, why, sizeof why) == NULL && strstr(why, "4096 bytes") != NULL);
    snprintf(path, sizeof path, "%s/minor", g_dir);
    newer_minor(nn_test_region_one(path, MIB, 100, 0));
    CHECK(nn_region_map(path, why, sizeof why) != NULL); /* readers accept any minor of their major */
}

/* ---- concurrent check-and-charge ---------------------------------------------------------------- */

#define THREADS 8
static nn_region *g_r;
static const uint64_t g_limit = 64 * MIB;
static uint64_t g_held[THREADS];
static int g_stop;

static void *charger(void *arg) {
    int id = (int)(intptr_t)arg;
    int slot = nn_region_claim(g_r, 1000000 + id, (uint64_t)id + 1);
    CHECK(slot >= 0);
    unsigned seed = (unsigned)id * 7919u + 1;
    uint64_t held[32] = {0};
    for (int i = 0; i < 4000; i++) {
        int k = (int)(rand_r(&seed) % 32);
        if (held[k] != 0) {
            nn_region_uncharge(g_r, slot, 0, held[k]);
            held[k] = 0;
        } else {
            uint64_t size = (uint64_t)(rand_r(&seed) % (8 * MIB)) + 1;
            if (nn_region_charge(g_r, slot, 0, size, g_limit) == 1) held[k] = size;
        }
    }
    uint64_t sum = 0;
    for (int k = 0; k < 32; k++) sum += held[k];
    g_held[id] = sum;
    CHECK(__atomic_load_n(&g_r->procs[slot].used_bytes[0], __ATOMIC_RELAXED) == sum);
    return NULL;
}

static void *watcher(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&g_stop, __ATOMIC_ACQUIRE)) {
        CHECK(__atomic_load_n(&g_r->devices[0].memory_used_bytes, __ATOMIC_RELAXED) <= g_limit);
        CHECK(__atomic_load_n(&g_r->container.memory_used_bytes, __ATOMIC_RELAXED) <= g_limit);
    }
    return NULL;
}

static void test_concurrent_charge(void) {
    g_r = fresh("charge", g_limit);
    pthread_t t[THREADS], w;
    pthread_create(&w, NULL, watcher, NULL);
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, charger, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
    pthread_join(w, NULL);
    uint64_t sum = 0;
    for (int i = 0; i < THREADS; i++) sum += g_held[i];
    CHECK(g_r->devices[0].memory_used_bytes == sum && g_r->container.memory_used_bytes == sum);
    CHECK(g_r->devices[0].memory_peak_bytes <= g_limit && g_r->devices[0].memory_peak_bytes > g_limit / 2);
}

/* ---- a holder that dies, dead processes --------------------------------------------------------- */

static void test_dead_holder(void) {
    nn_region *r = fresh("lockdie", 64 * MIB);
    pid_t pid = fork();
    if (pid == 0) { /* take the lock, update half of the accounting, die */
        if (nn_region_lock(r) != 0) _exit(2);
        r->procs[5].state = NN_SLOT_ACTIVE;
        r->procs[5].used_bytes[0] = 777;
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(nn_region_lock(r) == 0); /* recovered, not wedged */
    CHECK(r->lock.owner_died_total == 1);
    CHECK(r->devices[0].memory_used_bytes == 777 && r->container.memory_used_bytes == 777);
    nn_region_unlock(r);
    CHECK(nn_region_lock(r) == 0 && r->lock.owner_died_total == 1);
    nn_region_unlock(r);
}

static int g_driver_has;
static int driver_has(int32_t pid) {
    (void)pid;
    return g_driver_has;
}

static void test_reclaim(void) {
    nn_region *r = fresh("reap", 64 * MIB);
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    pid_t pid = fork();
    if (pid == 0) { /* a process of the container: claims a slot, allocates, is killed */
        int slot = nn_region_claim(r, getpid(), nn_proc_start_ticks(getpid()));
        if (slot < 0 || nn_region_charge(r, slot, 0, 10 * MIB, 64 * MIB) != 1) _exit(2);
        if (write(pipefd[1], "x", 1) != 1) _exit(3);
        pause();
        _exit(0);
    }
    char c;
    CHECK(read(pipefd[0], &c, 1) == 1);
    int me = nn_region_claim(r, getpid(), nn_proc_start_ticks(getpid()));
    CHECK(me >= 0 && r->devices[0].memory_used_bytes == 10 * MIB);
    CHECK(nn_region_lock(r) == 0);
    CHECK(nn_region_reap_locked(r, me, driver_has) == 0); /* alive: untouched */
    nn_region_unlock(r);
    kill(pid, SIGKILL);
    CHECK(waitpid(pid, NULL, 0) == pid);
    int other = me == 0 ? 1 : 0;
    g_driver_has = 0;
    CHECK(nn_region_lock(r) == 0);
    CHECK(nn_region_reap_locked(r, me, driver_has) == 0); /* no host PID yet: stays DEAD, charged */
    CHECK(r->procs[other].state == NN_SLOT_DEAD && r->devices[0].memory_used_bytes == 10 * MIB);
    nn_test_agent_register_host_pids(r);
    g_driver_has = 1;
    CHECK(nn_region_reap_locked(r, me, driver_has) == 0); /* the driver still holds it */
    g_driver_has = 0;
    CHECK(nn_region_reap_locked(r, me, driver_has) == 1); /* released: reclaimed */
    CHECK(r->procs[other].state == NN_SLOT_FREE && r->devices[0].memory_used_bytes == 0);
    nn_region_unlock(r);
    /* a full table reaps before refusing */
    for (unsigned i = 0; i < NN_MAX_PROCS; i++)
        if (r->procs[i].state == NN_SLOT_FREE) {
            r->procs[i].state = NN_SLOT_ACTIVE;
            r->procs[i].container_pid = 999999999; /* no such process */
        }
    CHECK(nn_region_claim(r, 4242, 1) >= 0);
}

/* `test_region threads` runs only the in-process thread tests: ThreadSanitizer models threads,
 * not processes, so the cross-process lock tests run under AddressSanitizer only. */
int main(int argc, char **argv) {
    int threads_only = argc > 1 && strcmp(argv[1], "threads") == 0;
    CHECK(mkdtemp(g_dir) != NULL);
    test_validation();
    if (!threads_only) {
        test_dead_holder();
        test_reclaim();
    }
    test_concurrent_charge(); /* threads last: fork above stays single-threaded */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    printf("test_region: ok\n");
    return 0;
}
