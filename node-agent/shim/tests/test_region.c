/*
 * test_region.c — the shim's region logic (src/region.c) on its own, run under ThreadSanitizer
 * and AddressSanitizer: where the region is read from, validation of both files, concurrent
 * check-and-charge never passing the limit, a lock holder that dies, slot claims, dead-process
 * reclaim and the agent's reclaim orders.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "../src/shim.h"
#include "nn_test.h"

static char g_dir[] = "/tmp/nn-region-test-XXXXXX";

static void dir_of(const char *name, char *out, size_t len) { snprintf(out, len, "%s/%s", g_dir, name); }

/* A fresh region: the agent's writable mapping in *agent, the shim's own mapping returned. */
static nn_region fresh(const char *name, uint64_t limit, nn_test_region *agent) {
    char dir[256];
    dir_of(name, dir, sizeof dir);
    nn_test_region t = nn_test_region_one(dir, limit, 100, 0);
    if (agent != NULL) *agent = t;
    nn_region r;
    char why[512];
    if (nn_region_map(dir, &r, why, sizeof why) != 0) fprintf(stderr, "map: %s\n", why);
    else return r;
    exit(1);
}

static void expect_refused(const char *name, void (*spoil)(nn_test_region *), const char *reason) {
    char dir[256];
    dir_of(name, dir, sizeof dir);
    nn_test_region t = nn_test_region_one(dir, MIB, 100, 0);
    spoil(&t);
    char why[512] = "";
    nn_region r;
    CHECK(nn_region_map(dir, &r, why, sizeof why) != 0);
    if (strstr(why, reason) == NULL) {
        fprintf(stderr, "%s: got \"%s\", expected \"%s\"\n", name, why, reason);
        exit(1);
    }
}

static void bad_magic(nn_test_region *t) { t->control->header.magic ^= 1; }
static void bad_major(nn_test_region *t) { t->control->header.version_major = 1; }
static void bad_slot(nn_test_region *t) { t->control->header.proc_slot_size = 384; }
static void not_ready(nn_test_region *t) { t->control->header.flags = 0; }
static void no_qos(nn_test_region *t) { t->control->container.qos = 0; }
static void no_devices(nn_test_region *t) { t->control->container.device_count = 0; }
static void many_devices(nn_test_region *t) { t->control->container.device_count = NN_MAX_DEVICES + 1; }
static void state_magic(nn_test_region *t) { t->state->header.magic = NN_CONTROL_MAGIC; }
static void state_major(nn_test_region *t) { t->state->header.version_major = 3; }
static void state_slot(nn_test_region *t) { t->state->header.proc_slot_size = 32; }
static void state_not_ready(nn_test_region *t) { t->state->header.flags = 0; }
static void other_pair(nn_test_region *t) { t->state->header.pair_id ^= 1; }
static void newer_minor(nn_test_region *t) {
    t->control->header.version_minor = 9;
    t->state->header.version_minor = 4;
}

static void test_validation(void) {
    expect_refused("magic", bad_magic, "control file: bad magic");
    expect_refused("major", bad_major, "control file: region version 1.0 is not readable by this shim (major 2)");
    expect_refused("slot", bad_slot, "control file: region layout mismatch");
    expect_refused("ready", not_ready, "control file: region is not ready");
    expect_refused("qos", no_qos, "no QoS class");
    expect_refused("devices", no_devices, "lists 0 devices");
    expect_refused("devices17", many_devices, "lists 17 devices");
    expect_refused("smagic", state_magic, "state file: bad magic");
    expect_refused("smajor", state_major, "state file: region version 3.0 is not readable");
    expect_refused("sslot", state_slot, "state file: region layout mismatch");
    expect_refused("sready", state_not_ready, "state file: region is not ready");
    expect_refused("pair", other_pair, "belongs to another region");
    char dir[256], path[300], why[512];
    nn_region r;
    /* a truncated state file is refused before it is mapped (past EOF would be SIGBUS) */
    dir_of("short", dir, sizeof dir);
    nn_test_region_one(dir, MIB, 100, 0);
    snprintf(path, sizeof path, "%s/%s", dir, NN_STATE_NAME);
    CHECK(truncate(path, 4096) == 0);
    CHECK(nn_region_map(dir, &r, why, sizeof why) != 0 && strstr(why, "state file: 4096 bytes") != NULL);
    /* a major-1 region (one file named "region") is named as such */
    dir_of("v1", dir, sizeof dir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/region", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 65536) == 0);
    close(fd);
    CHECK(nn_region_map(dir, &r, why, sizeof why) != 0 && strstr(why, "region of major version 1") != NULL);
    dir_of("minor", dir, sizeof dir);
    nn_test_region t = nn_test_region_one(dir, MIB, 100, 0);
    newer_minor(&t);
    CHECK(nn_region_map(dir, &r, why, sizeof why) == 0); /* readers accept any minor of their major */
}

/* In a container (something exists at the default control path) the environment cannot move the
 * region; elsewhere (tests, the workstation daemon's jobs) it may. */
static void test_region_dir(void) {
    char present[256], absent[256];
    dir_of("default-control", present, sizeof present);
    dir_of("no-such-file", absent, sizeof absent);
    int fd = open(present, O_RDWR | O_CREAT, 0600);
    CHECK(fd >= 0);
    close(fd);
    CHECK(strcmp(nn_region_dir(present, "/tmp/tenant"), NN_REGION_DIR) == 0);
    CHECK(strcmp(nn_region_dir(present, NULL), NN_REGION_DIR) == 0);
    CHECK(strcmp(nn_region_dir(absent, "/tmp/tenant"), "/tmp/tenant") == 0);
    CHECK(strcmp(nn_region_dir(absent, ""), NN_REGION_DIR) == 0);
    CHECK(strcmp(nn_region_dir(absent, NULL), NN_REGION_DIR) == 0);
    /* a symlink (even a dangling one) at the default path counts as present */
    char link[300];
    snprintf(link, sizeof link, "%s/dangling", g_dir);
    CHECK(symlink("/nonexistent", link) == 0);
    CHECK(strcmp(nn_region_dir(link, "/tmp/tenant"), NN_REGION_DIR) == 0);
}

/* ---- concurrent check-and-charge ---------------------------------------------------------------- */

#define THREADS 8
static nn_region g_r;
static const uint64_t g_limit = 64 * MIB;
static uint64_t g_held[THREADS];
static int g_stop;

static void *charger(void *arg) {
    int id = (int)(intptr_t)arg;
    int slot = nn_region_claim(&g_r, 1000000 + id, (uint64_t)id + 1);
    CHECK(slot >= 0);
    unsigned seed = (unsigned)id * 7919u + 1;
    uint64_t held[32] = {0};
    for (int i = 0; i < 4000; i++) {
        int k = (int)(rand_r(&seed) % 32);
        if (held[k] != 0) {
            nn_region_uncharge(&g_r, slot, 0, held[k]);
            held[k] = 0;
        } else {
            uint64_t size = (uint64_t)(rand_r(&seed) % (8 * MIB)) + 1;
            if (nn_region_charge(&g_r, slot, 0, size, g_limit) == 1) held[k] = size;
        }
    }
    uint64_t sum = 0;
    for (int k = 0; k < 32; k++) sum += held[k];
    g_held[id] = sum;
    CHECK(__atomic_load_n(&g_r.state->procs[slot].used_bytes[0], __ATOMIC_RELAXED) == sum);
    return NULL;
}

static void *watcher(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&g_stop, __ATOMIC_ACQUIRE)) {
        CHECK(__atomic_load_n(&g_r.state->devices[0].memory_used_bytes, __ATOMIC_RELAXED) <= g_limit);
        CHECK(__atomic_load_n(&g_r.state->usage.memory_used_bytes, __ATOMIC_RELAXED) <= g_limit);
    }
    return NULL;
}

static void test_concurrent_charge(void) {
    g_r = fresh("charge", g_limit, NULL);
    pthread_t t[THREADS], w;
    pthread_create(&w, NULL, watcher, NULL);
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, charger, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
    pthread_join(w, NULL);
    uint64_t sum = 0;
    for (int i = 0; i < THREADS; i++) sum += g_held[i];
    CHECK(g_r.state->devices[0].memory_used_bytes == sum && g_r.state->usage.memory_used_bytes == sum);
    CHECK(g_r.state->devices[0].memory_peak_bytes <= g_limit && g_r.state->devices[0].memory_peak_bytes > g_limit / 2);
}

/* ---- a holder that dies, dead processes, reclaim orders ----------------------------------------- */

static void test_dead_holder(void) {
    nn_region r = fresh("lockdie", 64 * MIB, NULL);
    pid_t pid = fork();
    if (pid == 0) { /* take the lock, update half of the accounting, die */
        if (nn_region_lock(&r) != 0) _exit(2);
        r.state->procs[5].state = NN_SLOT_ACTIVE;
        r.state->procs[5].used_bytes[0] = 777;
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(nn_region_lock(&r) == 0); /* recovered, not wedged */
    CHECK(r.state->lock.owner_died_total == 1);
    CHECK(r.state->devices[0].memory_used_bytes == 777 && r.state->usage.memory_used_bytes == 777);
    nn_region_unlock(&r);
    CHECK(nn_region_lock(&r) == 0 && r.state->lock.owner_died_total == 1);
    nn_region_unlock(&r);
}

static int g_driver_has;
static int driver_has(int32_t pid) {
    (void)pid;
    return g_driver_has;
}

static void test_reclaim(void) {
    nn_test_region agent;
    nn_region r = fresh("reap", 64 * MIB, &agent);
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    pid_t pid = fork();
    if (pid == 0) { /* a process of the container: claims a slot, allocates, is killed */
        int slot = nn_region_claim(&r, getpid(), nn_proc_start_ticks(getpid()));
        if (slot < 0 || nn_region_charge(&r, slot, 0, 10 * MIB, 64 * MIB) != 1) _exit(2);
        if (write(pipefd[1], "x", 1) != 1) _exit(3);
        pause();
        _exit(0);
    }
    char c;
    CHECK(read(pipefd[0], &c, 1) == 1);
    int me = nn_region_claim(&r, getpid(), nn_proc_start_ticks(getpid()));
    CHECK(me >= 0 && r.state->devices[0].memory_used_bytes == 10 * MIB);
    CHECK(nn_region_lock(&r) == 0);
    CHECK(nn_region_reap_locked(&r, me, driver_has) == 0); /* alive: untouched */
    nn_region_unlock(&r);
    kill(pid, SIGKILL);
    CHECK(waitpid(pid, NULL, 0) == pid);
    int other = me == 0 ? 1 : 0;
    g_driver_has = 0;
    CHECK(nn_region_lock(&r) == 0);
    CHECK(nn_region_reap_locked(&r, me, driver_has) == 0); /* no host PID yet: stays DEAD, charged */
    CHECK(r.state->procs[other].state == NN_SLOT_DEAD && r.state->devices[0].memory_used_bytes == 10 * MIB);
    nn_test_agent_register_host_pids(&agent);
    CHECK(nn_region_host_pid(&r, other) == pid);
    g_driver_has = 1;
    CHECK(nn_region_reap_locked(&r, me, driver_has) == 0); /* the driver still holds it */
    g_driver_has = 0;
    CHECK(nn_region_reap_locked(&r, me, driver_has) == 1); /* released: reclaimed */
    CHECK(r.state->procs[other].state == NN_SLOT_FREE && r.state->devices[0].memory_used_bytes == 0);
    nn_region_unlock(&r);
    /* the registration belonged to that claim: a new claim of the slot has no host PID yet */
    CHECK(nn_region_claim(&r, 4243, 7) == other && nn_region_host_pid(&r, other) == 0);
    /* a full table reaps before refusing */
    for (unsigned i = 0; i < NN_MAX_PROCS; i++)
        if (r.state->procs[i].state == NN_SLOT_FREE) {
            r.state->procs[i].state = NN_SLOT_ACTIVE;
            r.state->procs[i].container_pid = 999999999; /* no such process */
        }
    CHECK(nn_region_claim(&r, 4242, 1) >= 0);
}

/* The agent's reclaim order: applied by the next locker (or a launch that gets the lock at once),
 * only to the claim it names. */
static void test_orders(void) {
    nn_test_region agent;
    nn_region r = fresh("orders", 64 * MIB, &agent);
    int a = nn_region_claim(&r, 999999990, 1); /* processes that do not exist: only the agent decides */
    int b = nn_region_claim(&r, 999999991, 2);
    CHECK(a >= 0 && b >= 0 && nn_region_charge(&r, a, 0, 10 * MIB, 64 * MIB) == 1);
    CHECK(nn_region_charge(&r, b, 0, 20 * MIB, 64 * MIB) == 1);
    nn_test_agent_order_reclaim(&agent, (unsigned)a);
    CHECK(r.state->usage.memory_used_bytes == 30 * MIB); /* nothing happens until a shim locks */
    /* while another process holds the lock, a launch does not wait: the order stays pending */
    CHECK(pthread_mutex_lock(&r.state->lock.mutex) == 0); /* a holder that has not looked at orders */
    pid_t child = fork();
    if (child == 0) _exit(nn_region_poll_orders(&r) == 0 ? 0 : 1);
    int status;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(pthread_mutex_unlock(&r.state->lock.mutex) == 0);
    CHECK(r.state->procs[a].state == NN_SLOT_ACTIVE);
    CHECK(nn_region_poll_orders(&r) == 1); /* the lock is free: applied */
    CHECK(r.state->procs[a].state == NN_SLOT_FREE && r.state->usage.memory_used_bytes == 20 * MIB);
    CHECK(r.state->usage.reclaim_generation_seen == agent.control->container.reclaim_generation);
    CHECK(nn_region_poll_orders(&r) == 0); /* nothing new: one load, no lock */
    /* the slot is claimed again: the old order names the old claim and is not applied to it */
    int a2 = nn_region_claim(&r, 999999992, 3);
    CHECK(a2 == a && nn_region_charge(&r, a2, 0, 5 * MIB, 64 * MIB) == 1);
    agent.control->container.reclaim_generation++;
    CHECK(nn_region_lock(&r) == 0);
    nn_region_unlock(&r);
    CHECK(r.state->procs[a2].state == NN_SLOT_ACTIVE && r.state->usage.memory_used_bytes == 25 * MIB);
    /* an order is applied by an allocation's lock before it checks the limit */
    nn_test_agent_order_reclaim(&agent, (unsigned)b);
    CHECK(nn_region_charge(&r, a2, 0, 50 * MIB, 64 * MIB) == 1); /* 25 + 50 > 64 without the order */
    CHECK(r.state->procs[b].state == NN_SLOT_FREE && r.state->usage.memory_used_bytes == 55 * MIB);
}

/* `test_region threads` runs only the in-process thread tests: ThreadSanitizer models threads,
 * not processes, so the cross-process lock tests run under AddressSanitizer only. */
int main(int argc, char **argv) {
    int threads_only = argc > 1 && strcmp(argv[1], "threads") == 0;
    CHECK(mkdtemp(g_dir) != NULL);
    test_validation();
    test_region_dir();
    if (!threads_only) {
        test_dead_holder();
        test_reclaim();
        test_orders();
    }
    test_concurrent_charge(); /* threads last: fork above stays single-threaded */
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    printf("test_region: ok\n");
    return 0;
}
