/*
 * bench — the shim's acceptance benchmark over the fake driver (no GPU). Prints one JSON object:
 *   {"direct_call_ns", "hooked_call_ns", "overhead_ns", "pacing": [{"quota", "achieved", ...}],
 *    "two_tenants": {"quota": [0.3, 0.7], "achieved": [a, b]},
 *    "memory_race": {"limit_bytes", "max_observed_bytes", "reclaim_ms"}, "pause_ms"}
 * Figures are wall-clock measurements of this run (details on stderr). The orchestrator runs
 * unshimmed; every workload is a child process with LD_PRELOAD=libneuronetes-cuda.so.
 *
 *   bench <build dir>                      (LD_LIBRARY_PATH must hold <build dir>/fake)
 */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <sys/wait.h>

#include "nn_test.h"

static const char *g_build, *g_self;
static char g_dir[] = "/tmp/nn-shim-bench-XXXXXX";

/* ---- workers (children, shimmed) ----------------------------------------------------------------- */

static nn_cuda C;

static void launch_kind(CUstream s, int kind, uint64_t ns, CUgraphExec *graphs, unsigned ngraphs, unsigned *seed) {
    void *params[] = {&ns};
    switch (kind) {
    case 0: CHECK_RC(C.cuLaunchKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_SUCCESS); break;
    case 1: {
        CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1, .blockDimY = 1,
                              .blockDimZ = 1, .hStream = s};
        CHECK_RC(C.cuLaunchKernelEx(&cfg, (CUfunction)1, params, NULL), CUDA_SUCCESS);
        break;
    }
    case 2: CHECK_RC(C.cuLaunchCooperativeKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, s, params), CUDA_SUCCESS); break;
    default: CHECK_RC(C.cuGraphLaunch(graphs[rand_r(seed) % ngraphs], s), CUDA_SUCCESS); break;
    }
}

/* Kernels of 0.1-5 ms back to back from `start` for `ms`; prints "<busy ns> <wall ns>". kinds: a
 * bit mask of the launch APIs to use (1 kernel, 2 Ex, 4 cooperative, 8 graph). */
static int worker_pace(uint64_t start, double ms, unsigned kinds, unsigned seed) {
    nn_cuda_load(&C, CU_GET_PROC_ADDRESS_DEFAULT);
    nn_cuda_start(&C);
    CUstream s;
    CHECK_RC(C.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    CUgraphExec graphs[8];
    for (unsigned g = 0; g < 8; g++) { /* graphs of one captured kernel of 0.1-5 ms */
        CHECK_RC(C.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        launch_kind(s, 0, 100000 + (uint64_t)(rand_r(&seed) % 4900000), NULL, 0, &seed);
        CUgraph graph;
        CHECK_RC(C.cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
        CHECK_RC(C.cuGraphInstantiateWithFlags(&graphs[g], graph, 0), CUDA_SUCCESS);
    }
    int allowed[4], n = 0;
    for (int k = 0; k < 4; k++)
        if (kinds & (1u << k)) allowed[n++] = k;
    fake_state *oracle = nn_test_oracle();
    fake_proc *me = NULL;
    while (nn_test_now() < start) nn_test_sleep_ms(0.2);
    /* warm up (the pacer learns kernel times), then measure from an idle stream */
    uint64_t warm_end = nn_test_now() + 200000000u, end;
    while (nn_test_now() < warm_end) launch_kind(s, allowed[rand_r(&seed) % n], 100000 + rand_r(&seed) % 4900000, graphs, 8, &seed);
    CHECK_RC(C.cuStreamSynchronize(s), CUDA_SUCCESS);
    for (unsigned i = 0; i < FAKE_MAX_PROCS && me == NULL; i++)
        if (oracle->procs[i].pid == getpid()) me = &oracle->procs[i];
    CHECK(me != NULL);
    uint64_t busy0 = __atomic_load_n(&me->busy_ns[0], __ATOMIC_ACQUIRE), t0 = nn_test_now();
    end = t0 + (uint64_t)(ms * 1e6);
    while (nn_test_now() < end)
        launch_kind(s, allowed[rand_r(&seed) % n], 100000 + (uint64_t)(rand_r(&seed) % 4900000), graphs, 8, &seed);
    CHECK_RC(C.cuStreamSynchronize(s), CUDA_SUCCESS);
    uint64_t t1 = nn_test_now(), busy1 = __atomic_load_n(&me->busy_ns[0], __ATOMIC_ACQUIRE);
    printf("%llu %llu\n", (unsigned long long)(busy1 - busy0), (unsigned long long)(t1 - t0));
    for (unsigned g = 0; g < 8; g++) C.cuGraphExecDestroy(graphs[g]);
    return 0;
}

/* Launch cost: the fake's entry directly vs the shim's hook, same process, same kernels. */
static int worker_overhead(void) {
    nn_cuda_load(&C, CU_GET_PROC_ADDRESS_DEFAULT);
    nn_cuda_start(&C);
    __typeof__(&cuLaunchKernel) direct = (__typeof__(&cuLaunchKernel))dlsym(C.lib, "fake_direct_cuLaunchKernel");
    CHECK(direct != NULL && (void *)direct != (void *)C.cuLaunchKernel);
    CUstream s;
    CHECK_RC(C.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    uint64_t ns = 1; /* kernels that finish at once: the quota is never exhausted */
    void *params[] = {&ns};
    /* many short rounds, best of each: a round the (shared) CPU was taken away is discarded */
    const int n = 20000;
    double best_direct = 1e18, best_hooked = 1e18;
    for (int round = 0; round < 41; round++) {
        for (int hooked = round % 2, k = 0; k < 2; k++, hooked = !hooked) { /* alternate which goes first */
            __typeof__(&cuLaunchKernel) fn = hooked ? C.cuLaunchKernel : direct;
            uint64_t t0 = nn_test_now();
            for (int i = 0; i < n; i++) fn((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
            double per_call = (double)(nn_test_now() - t0) / n;
            if (hooked) best_hooked = fmin(best_hooked, per_call);
            else best_direct = fmin(best_direct, per_call);
        }
    }
    printf("%.2f %.2f\n", best_direct, best_hooked);
    return 0;
}

/* Short kernels back to back, each synchronised, until killed (the pause probe). */
static int worker_spin(void) {
    nn_cuda_load(&C, CU_GET_PROC_ADDRESS_DEFAULT);
    nn_cuda_start(&C);
    CUstream s;
    CHECK_RC(C.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    uint64_t ns = 50000;
    void *params[] = {&ns};
    for (;;) {
        CHECK_RC(C.cuLaunchKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
        CHECK_RC(C.cuStreamSynchronize(s), CUDA_SUCCESS);
    }
}

/* ---- the orchestrator ---------------------------------------------------------------------------- */

typedef struct child {
    pid_t pid;
    FILE *out;
} child;

/* Start `argv` with the shim preloaded, the given region and GPU state; stdout is piped back. */
static child spawn(char *const argv[], const char *region, const char *gpu) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        char preload[4096];
        snprintf(preload, sizeof preload, "%s/lib/libneuronetes-cuda.so", g_build);
        setenv("LD_PRELOAD", preload, 1);
        setenv("NEURONETES_REGION_DIR", region, 1);
        setenv("FAKE_CUDA_STATE", gpu, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    return (child){pid, fdopen(fds[0], "r")};
}

static void finish(child c) {
    int status;
    CHECK(waitpid(c.pid, &status, 0) == c.pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "bench: worker %d failed (status %d)\n", c.pid, status);
        exit(1);
    }
    fclose(c.out);
}

static void path(char *out, size_t len, const char *name) { snprintf(out, len, "%s/%s", g_dir, name); }

static child spawn_pace(const char *tag, uint32_t share, const char *gpu, uint64_t start, unsigned kinds, unsigned seed) {
    char region[512], start_s[32], kinds_s[16], seed_s[16];
    path(region, sizeof region, tag);
    nn_test_region_one(region, 1 * GIB, share, 0);
    snprintf(start_s, sizeof start_s, "%llu", (unsigned long long)start);
    snprintf(kinds_s, sizeof kinds_s, "%u", kinds);
    snprintf(seed_s, sizeof seed_s, "%u", seed);
    char *argv[] = {(char *)g_self, (char *)g_build, "pace", start_s, "2000", kinds_s, seed_s, NULL};
    return spawn(argv, region, gpu);
}

static double read_share(child c) {
    unsigned long long busy = 0, wall = 1;
    CHECK(fscanf(c.out, "%llu %llu", &busy, &wall) == 2);
    finish(c);
    return (double)busy / (double)wall;
}

static double pacing_run(const char *tag, uint32_t share, unsigned kinds) {
    char gpu[512];
    path(gpu, sizeof gpu, tag);
    strcat(gpu, ".gpu");
    double achieved = read_share(spawn_pace(tag, share, gpu, nn_test_now(), kinds, share * 7u + kinds));
    fprintf(stderr, "bench: pacing %s quota %u%% -> %.2f%%\n", tag, share, achieved * 100);
    return achieved;
}

static void overhead(double *direct, double *hooked) {
    char region[512], gpu[512];
    path(region, sizeof region, "overhead");
    path(gpu, sizeof gpu, "overhead.gpu");
    nn_test_region_one(region, 1 * GIB, 50, 0); /* paced (50 %), quota never exhausted */
    char *argv[] = {(char *)g_self, (char *)g_build, "overhead", NULL};
    child c = spawn(argv, region, gpu);
    CHECK(fscanf(c.out, "%lf %lf", direct, hooked) == 2);
    finish(c);
}

/* How long after the agent's order the last kernel started (pause), or the first (resume). */
static double pause_probe(void) {
    char region_path[512], gpu[512];
    path(region_path, sizeof region_path, "pause");
    path(gpu, sizeof gpu, "pause.gpu");
    nn_test_region region = nn_test_region_one(region_path, 1 * GIB, 100, 0), *r = &region;
    char *argv[] = {(char *)g_self, (char *)g_build, "spin", NULL};
    child c = spawn(argv, region_path, gpu);
    nn_test_sleep_ms(300);
    setenv("FAKE_CUDA_STATE", gpu, 1);
    fake_state *oracle = nn_test_oracle();
    double worst = 0;
    for (int round = 0; round < 5; round++) {
        uint64_t t0 = nn_test_now(), last_change = t0;
        uint64_t seen = __atomic_load_n(&oracle->procs[0].launches, __ATOMIC_ACQUIRE);
        __atomic_fetch_or(&r->control->container.control, NN_CTL_PAUSED, __ATOMIC_RELEASE);
        while (nn_test_now() < t0 + 200000000u) { /* watch 200 ms: any launch after the order? */
            uint64_t now_seen = __atomic_load_n(&oracle->procs[0].launches, __ATOMIC_ACQUIRE);
            if (now_seen != seen) {
                seen = now_seen;
                last_change = nn_test_now();
            }
            nn_test_sleep_ms(0.02); /* poll, leaving the CPU to the worker */
        }
        double paused_ms = (double)(last_change - t0) / 1e6;
        uint64_t t1 = nn_test_now();
        __atomic_fetch_and(&r->control->container.control, ~NN_CTL_PAUSED, __ATOMIC_RELEASE);
        while (__atomic_load_n(&oracle->procs[0].launches, __ATOMIC_ACQUIRE) == seen &&
               nn_test_now() < t1 + 1000000000u)
            nn_test_sleep_ms(0.02);
        double resumed_ms = (double)(nn_test_now() - t1) / 1e6;
        fprintf(stderr, "bench: pause round %d: last launch %.3f ms after pause, first %.3f ms after resume\n",
                round, paused_ms, resumed_ms);
        worst = fmax(worst, fmax(paused_ms, resumed_ms));
        nn_test_sleep_ms(20);
    }
    kill(c.pid, SIGKILL);
    waitpid(c.pid, NULL, 0);
    fclose(c.out);
    return worst;
}

static void memory_race(char *json, size_t len) {
    char region[512], gpu[512], race[512];
    path(region, sizeof region, "race");
    path(gpu, sizeof gpu, "race.gpu");
    snprintf(race, sizeof race, "%s/race", g_build);
    char limit[32];
    snprintf(limit, sizeof limit, "%llu", (unsigned long long)GIB);
    char *argv[] = {race, "8", "16", "2000", limit, "1", NULL};
    child c = spawn(argv, region, gpu);
    CHECK(fgets(json, (int)len, c.out) != NULL);
    json[strcspn(json, "\n")] = '\0';
    finish(c);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    g_build = argv[1];
    g_self = argv[0];
    if (argc >= 3 && strcmp(argv[2], "overhead") == 0) return worker_overhead();
    if (argc >= 3 && strcmp(argv[2], "spin") == 0) return worker_spin();
    if (argc == 7 && strcmp(argv[2], "pace") == 0)
        return worker_pace(strtoull(argv[3], NULL, 10), atof(argv[4]), (unsigned)atoi(argv[5]),
                           (unsigned)atoi(argv[6]));
    CHECK(argc == 2 && mkdtemp(g_dir) != NULL);

    double direct, hooked;
    overhead(&direct, &hooked);
    fprintf(stderr, "bench: launch %.1f ns direct, %.1f ns through the shim (x%.2f)\n", direct, hooked,
            hooked / direct);

    const uint32_t quotas[] = {10, 25, 50, 75};
    char pacing[2048] = "";
    for (int i = 0; i < 4; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "pace%u", quotas[i]);
        double a = pacing_run(tag, quotas[i], 0xf);
        snprintf(pacing + strlen(pacing), sizeof pacing - strlen(pacing),
                 "%s{\"quota\": %.2f, \"achieved\": %.4f, \"launch\": \"mixed\"}", i ? ", " : "", quotas[i] / 100.0, a);
    }
    double graph = pacing_run("pace25-graph", 25, 0x8), coop = pacing_run("pace25-coop", 25, 0x4);
    snprintf(pacing + strlen(pacing), sizeof pacing - strlen(pacing),
             ", {\"quota\": 0.25, \"achieved\": %.4f, \"launch\": \"graph\"}"
             ", {\"quota\": 0.25, \"achieved\": %.4f, \"launch\": \"cooperative\"}",
             graph, coop);

    char gpu[512];
    path(gpu, sizeof gpu, "shared.gpu");
    uint64_t start = nn_test_now() + 300000000u; /* both start together on one GPU */
    child a = spawn_pace("tenant30", 30, gpu, start, 0xf, 11), b = spawn_pace("tenant70", 70, gpu, start, 0xf, 23);
    double share_a = read_share(a), share_b = read_share(b);
    fprintf(stderr, "bench: two tenants 30/70 -> %.2f%% / %.2f%%\n", share_a * 100, share_b * 100);

    char race[512];
    memory_race(race, sizeof race);
    double pause_ms = pause_probe();

    printf("{\"direct_call_ns\": %.2f, \"hooked_call_ns\": %.2f, \"overhead_ns\": %.2f, \"overhead_ratio\": %.3f, "
           "\"pacing\": [%s], \"two_tenants\": {\"quota\": [0.3, 0.7], \"achieved\": [%.4f, %.4f]}, "
           "\"memory_race\": %s, \"pause_ms\": %.3f}\n",
           direct, hooked, hooked - direct, hooked / direct, pacing, share_a, share_b, race, pause_ms);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : 1;
}
