/*
 * race — processes x threads racing allocations and frees of random sizes through every
 * allocation API against one container limit (run under LD_PRELOAD=libneuronetes-cuda.so over
 * the fake driver). The fake's own account is the verdict: its peak may never pass the limit.
 * With kill=1, one process is SIGKILLed while it holds memory; the parent plays the agent
 * (registers host PIDs) and measures how long until the region stops charging the dead
 * process's memory (the survivors reclaim it once the driver shows it released).
 *
 *   race <processes> <threads> <ms> <limit bytes> <kill 0|1>
 * Prints {"limit_bytes": n, "max_observed_bytes": n, "reclaim_ms": f}; exits 1 on a violation.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "nn_test.h"

static nn_cuda C;
static uint64_t g_deadline;
static uint64_t g_limit;
static CUmemoryPool g_pool;

enum { API_ALLOC, API_MANAGED, API_PITCH, API_ASYNC, API_POOL, API_VMM, API_VMM_MAPPED, API_ARRAY, API_COUNT };

typedef struct held {
    uint64_t key, size;
    int api;
    CUstream stream;
} held;

static void release(held *h) {
    switch (h->api) {
    case API_ASYNC:
    case API_POOL: CHECK_RC(C.cuMemFreeAsync((CUdeviceptr)h->key, h->stream), CUDA_SUCCESS); break;
    case API_VMM: CHECK_RC(C.cuMemRelease((CUmemGenericAllocationHandle)h->key), CUDA_SUCCESS); break;
    case API_VMM_MAPPED: CHECK_RC(C.cuMemUnmap((CUdeviceptr)h->key, h->size), CUDA_SUCCESS); break; /* released at once */
    case API_ARRAY: CHECK_RC(C.cuArrayDestroy((CUarray)(uintptr_t)h->key), CUDA_SUCCESS); break;
    default: CHECK_RC(C.cuMemFree_v2((CUdeviceptr)h->key), CUDA_SUCCESS); break;
    }
    h->key = 0;
}

/* create -> map -> release: the memory is held until the unmap */
static CUresult vmm_mapped(CUdeviceptr va, uint64_t size, const CUmemAllocationProp *prop) {
    CUmemGenericAllocationHandle h;
    CUresult rc = C.cuMemCreate(&h, size, prop, 0);
    if (rc != CUDA_SUCCESS) return rc;
    CHECK_RC(C.cuMemMap(va, size, 0, h, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuMemRelease(h), CUDA_SUCCESS);
    return CUDA_SUCCESS;
}

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    CUcontext ctx;
    CHECK_RC(C.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    CHECK_RC(C.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CUstream s;
    CHECK_RC(C.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    held h[16] = {{0}};
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    uint64_t span = g_limit / 16; /* each slot's own VA range for API_VMM_MAPPED */
    CUdeviceptr va;
    CHECK_RC(C.cuMemAddressReserve(&va, 16 * span, 0, 0, 0), CUDA_SUCCESS);
    while (nn_test_now() < g_deadline) {
        int slot = (int)(rand_r(&seed) % 16);
        held *x = &h[slot];
        if (x->key != 0) {
            release(x);
            continue;
        }
        uint64_t size = ((uint64_t)(rand_r(&seed) % (g_limit / 16 / MIB)) + 1) * MIB;
        x->api = (int)(rand_r(&seed) % API_COUNT);
        x->stream = s;
        x->size = size;
        CUDA_ARRAY_DESCRIPTOR array = {1 << 16, 4 * (size / MIB), CU_AD_FORMAT_FLOAT, 1};
        CUarray a = NULL;
        CUresult rc;
        CUdeviceptr p = 0;
        size_t pitch;
        CUmemGenericAllocationHandle vh = 0;
        switch (x->api) {
        case API_ALLOC: rc = C.cuMemAlloc_v2(&p, size); break;
        case API_MANAGED: rc = C.cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL); break;
        case API_PITCH: rc = C.cuMemAllocPitch_v2(&p, &pitch, 1 * MIB, size / MIB, 4); break;
        case API_ASYNC: rc = C.cuMemAllocAsync(&p, size, s); break;
        case API_POOL: rc = C.cuMemAllocFromPoolAsync(&p, size, g_pool, s); break;
        case API_VMM: rc = C.cuMemCreate(&vh, size, &prop, 0); p = (CUdeviceptr)vh; break;
        case API_VMM_MAPPED: p = va + (CUdeviceptr)slot * span; rc = vmm_mapped(p, size, &prop); break;
        default: rc = C.cuArrayCreate_v2(&a, &array); p = (CUdeviceptr)(uintptr_t)a; break;
        }
        CHECK(rc == CUDA_SUCCESS || rc == CUDA_ERROR_OUT_OF_MEMORY); /* refused, never a crash */
        if (rc == CUDA_SUCCESS) x->key = (uint64_t)p;
    }
    for (int i = 0; i < 16; i++)
        if (h[i].key != 0) release(&h[i]);
    CHECK_RC(C.cuMemAddressFree(va, 16 * span), CUDA_SUCCESS);
    return NULL;
}

static int run_process(int threads) {
    nn_cuda_load(&C, CU_GET_PROC_ADDRESS_DEFAULT);
    nn_cuda_start(&C);
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CHECK_RC(C.cuMemPoolCreate(&g_pool, &props), CUDA_SUCCESS);
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(getpid() * 131 + i));
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s <processes> <threads> <ms> <limit> <kill>\n", argv[0]);
        return 64;
    }
    int procs = atoi(argv[1]), threads = atoi(argv[2]);
    double ms = atof(argv[3]);
    g_limit = strtoull(argv[4], NULL, 10);
    int do_kill = atoi(argv[5]);
    CHECK(procs >= 1 && procs <= 64 && threads >= 1 && threads <= 64 && g_limit >= 16 * MIB);
    const char *region_dir = getenv("NEURONETES_REGION_DIR");
    CHECK(region_dir != NULL);
    nn_test_region region = nn_test_region_one(region_dir, g_limit, 100, 0), *r = &region;
    g_deadline = nn_test_now() + (uint64_t)(ms * 1e6);
    pid_t pids[64];
    for (int i = 0; i < procs; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(run_process(threads));
    }
    fake_state *oracle = NULL;
    double reclaim_ms = -1;
    uint64_t kill_at = nn_test_now() + (uint64_t)(ms * 1e6 / 3);
    int victim_slot = -1;
    while (nn_test_now() < g_deadline) {
        nn_test_agent_register_host_pids(r); /* the agent's part: it finds host PIDs */
        if (oracle == NULL && access(getenv("FAKE_CUDA_STATE"), F_OK) == 0) oracle = nn_test_oracle();
        if (do_kill && victim_slot < 0 && nn_test_now() >= kill_at) {
            for (unsigned i = 0; i < NN_MAX_PROCS && victim_slot < 0; i++)
                if (r->state->procs[i].state == NN_SLOT_ACTIVE && r->state->procs[i].container_pid == pids[0] &&
                    r->state->procs[i].used_bytes[0] > 0)
                    victim_slot = (int)i;
            if (victim_slot >= 0) {
                uint64_t t0 = nn_test_now();
                kill(pids[0], SIGKILL);
                waitpid(pids[0], NULL, 0);
                pids[0] = 0;
                while (nn_test_now() < g_deadline + 2000000000u) {
                    nn_test_agent_register_host_pids(r);
                    const nn_proc_slot *s = &r->state->procs[victim_slot];
                    if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == NN_SLOT_FREE ||
                        s->used_bytes[0] == 0) {
                        reclaim_ms = (double)(nn_test_now() - t0) / 1e6;
                        break;
                    }
                    nn_test_sleep_ms(0.2);
                }
            }
        }
        nn_test_sleep_ms(1);
    }
    int failed = 0;
    for (int i = 0; i < procs; i++) {
        if (pids[i] == 0) continue;
        int status;
        waitpid(pids[i], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "race: worker %d failed (status %d)\n", pids[i], status);
            failed = 1;
        }
    }
    if (oracle == NULL) oracle = nn_test_oracle();
    uint64_t observed = oracle->devices[0].peak_bytes;
    printf("{\"limit_bytes\": %llu, \"max_observed_bytes\": %llu, \"reclaim_ms\": %.3f}\n",
           (unsigned long long)g_limit, (unsigned long long)observed, reclaim_ms);
    if (observed > g_limit || r->state->devices[0].memory_peak_bytes > g_limit) {
        fprintf(stderr, "race: usage passed the limit (oracle %llu, region %llu)\n", (unsigned long long)observed,
                (unsigned long long)r->state->devices[0].memory_peak_bytes);
        failed = 1;
    }
    if (observed < g_limit / 2) {
        fprintf(stderr, "race: the workers never came near the limit (%llu): nothing was tested\n",
                (unsigned long long)observed);
        failed = 1;
    }
    if (do_kill && (reclaim_ms < 0 || reclaim_ms > 1000)) {
        fprintf(stderr, "race: the killed process's memory was not reclaimed within 1 s (%.1f ms)\n", reclaim_ms);
        failed = 1;
    }
    return failed;
}
