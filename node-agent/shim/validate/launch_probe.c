/*
 * launch_probe.c — launches per second of an empty kernel, for the GPU validation's per-launch
 * overhead figure (neuronetes/gpuvalidate, check "shim-compute"): the same program runs without the
 * shim, with it on an unpaced device and with it pacing, and the ratios are the shim's cost.
 *
 *   launch_probe <seconds>      prints one line: RESULT {"launches": N, "seconds": S, "launches_per_s": R}
 *
 * It resolves the driver as the CUDA runtime does (dlopen("libcuda.so.1") + cuGetProcAddress_v2),
 * so the shim's lookup path is the one exercised. On a real driver the kernel is an empty PTX entry
 * the driver compiles at load (no nvcc needed); the fake driver (node-agent/shim/fake) has no
 * modules, so there any function handle is a kernel of the nanoseconds in its first parameter (0).
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char k_ptx[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry nn_empty(.param .u64 nn_empty_param_0)\n"
    "{\n"
    "  ret;\n"
    "}\n";

#define SYNC_EVERY 4096u

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, int rc) {
    printf("RESULT {\"error\": \"%s failed with CUresult %d\"}\n", what, rc);
    exit(1);
}

#define RESOLVE(type, var, name)                                                                  \
    type var = NULL;                                                                              \
    if (proc(name, (void **)&var, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, NULL) != CUDA_SUCCESS) \
        var = NULL;

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf("RESULT {\"error\": \"libcuda.so.1: %s\"}\n", dlerror());
        return 1;
    }
    __typeof__(&cuGetProcAddress_v2) proc = (__typeof__(&cuGetProcAddress_v2))dlsym(lib, "cuGetProcAddress_v2");
    if (proc == NULL) die("dlsym(cuGetProcAddress_v2)", -1);
    RESOLVE(__typeof__(&cuInit), init, "cuInit")
    RESOLVE(__typeof__(&cuDevicePrimaryCtxRetain), retain, "cuDevicePrimaryCtxRetain")
    RESOLVE(__typeof__(&cuCtxSetCurrent), set_current, "cuCtxSetCurrent")
    RESOLVE(__typeof__(&cuStreamCreate), stream_create, "cuStreamCreate")
    RESOLVE(__typeof__(&cuStreamSynchronize), stream_sync, "cuStreamSynchronize")
    RESOLVE(__typeof__(&cuLaunchKernel), launch, "cuLaunchKernel")
    RESOLVE(__typeof__(&cuModuleLoadData), module_load, "cuModuleLoadData")
    RESOLVE(__typeof__(&cuModuleGetFunction), get_function, "cuModuleGetFunction")
    if (!init || !retain || !set_current || !stream_create || !stream_sync || !launch) die("cuGetProcAddress_v2", -1);
    int rc;
    if ((rc = init(0)) != CUDA_SUCCESS) die("cuInit", rc);
    CUcontext ctx;
    if ((rc = retain(&ctx, 0)) != CUDA_SUCCESS) die("cuDevicePrimaryCtxRetain", rc);
    if ((rc = set_current(ctx)) != CUDA_SUCCESS) die("cuCtxSetCurrent", rc);
    CUstream stream;
    if ((rc = stream_create(&stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) die("cuStreamCreate", rc);
    CUfunction fn = (CUfunction)(uintptr_t)0x1; /* the fake driver: any handle is a kernel */
    if (module_load != NULL && get_function != NULL) {
        CUmodule module;
        if ((rc = module_load(&module, k_ptx)) != CUDA_SUCCESS) die("cuModuleLoadData", rc);
        if ((rc = get_function(&fn, module, "nn_empty")) != CUDA_SUCCESS) die("cuModuleGetFunction", rc);
    }
    uint64_t param = 0;
    void *params[] = {&param};
    /* warm up: the first launches pay for lazy loading and the shim's first measurement */
    for (unsigned i = 0; i < SYNC_EVERY; i++)
        if ((rc = launch(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL)) != CUDA_SUCCESS) die("cuLaunchKernel", rc);
    if ((rc = stream_sync(stream)) != CUDA_SUCCESS) die("cuStreamSynchronize", rc);
    unsigned long long n = 0;
    double start = now_s(), elapsed = 0;
    do {
        for (unsigned i = 0; i < SYNC_EVERY; i++)
            if ((rc = launch(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL)) != CUDA_SUCCESS) die("cuLaunchKernel", rc);
        n += SYNC_EVERY;
        if ((rc = stream_sync(stream)) != CUDA_SUCCESS) die("cuStreamSynchronize", rc);
        elapsed = now_s() - start;
    } while (elapsed < seconds);
    printf("RESULT {\"launches\": %llu, \"seconds\": %.6f, \"launches_per_s\": %.1f}\n", n, elapsed, (double)n / elapsed);
    return 0;
}
