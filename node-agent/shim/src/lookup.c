/*
 * lookup.c — how applications reach the hooks.
 *
 *  - Linked or preloaded calls bind to the hooks' exported names directly.
 *  - The CUDA runtime dlopen()s libcuda.so.1 and dlsym()s on that handle, which bypasses
 *    LD_PRELOAD: `dlsym` itself is overridden (the real one is taken with dlvsym and the glibc
 *    version of the architecture), and a pointer it returns that is one of the real functions we
 *    wrap is swapped for the hook.
 *  - Then the runtime asks cuGetProcAddress / cuGetProcAddress_v2 for every entry point, by base
 *    name + CUDA version + per-thread-stream flag. The real one is called first; what it returned
 *    is identified by pointer among the exact variants we wrap (versions, _ptsz) and replaced by
 *    the matching hook. A variant of a wrapped family we do not know (a future `_v3`, a legacy
 *    32-bit entry) is refused as "not found" rather than handed out unaccounted.
 *  - cuGetExportTable and everything else pass through untouched.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

nn_real_table nn_real;

#if defined(__x86_64__)
#define NN_GLIBC_DLSYM_VERSION "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define NN_GLIBC_DLSYM_VERSION "GLIBC_2.17"
#else
#error "unsupported architecture: add glibc's base symbol version for dlsym"
#endif

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;

/* dlsym is called by sanitizer runtimes while they start, before their shadow memory exists:
 * this path must not be instrumented, and calls nothing before it knows the name is CUDA's. */
#define NN_UNINSTRUMENTED __attribute__((no_sanitize_address, no_sanitize_undefined, no_sanitize_thread))

NN_UNINSTRUMENTED static dlsym_fn real_dlsym(void) {
    dlsym_fn fn = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (fn == NULL) {
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", NN_GLIBC_DLSYM_VERSION);
        __atomic_store_n(&g_real_dlsym, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

/* ---- the hook table: name, hook, where its real pointer lives ----------------------------------- */

typedef struct nn_hook {
    const char *name;
    void *hook;
    void **real;
} nn_hook;

/* A hook and its real pointer must have the header's type: both are typed from cuda.h/nvml.h. */
#define NN_HOOK_ENTRY(name)                                                                          \
    {#name, (void *)&name, (void **)&nn_real.name},
#define NN_HOOK_CHECK(name)                                                                          \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), __typeof__(nn_real.name)),        \
                   #name " does not have the header's signature");

NN_CUDA_HOOKS(NN_HOOK_CHECK)
NN_NVML_HOOKS(NN_HOOK_CHECK)

static const nn_hook g_hooks[] = {NN_CUDA_HOOKS(NN_HOOK_ENTRY) NN_NVML_HOOKS(NN_HOOK_ENTRY)};
#define NN_HOOK_COUNT (sizeof g_hooks / sizeof g_hooks[0])

/* Base names whose every variant must be one we wrap (else refused, never passed through). */
static const char *const g_guarded[] = {
    "cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemAllocFromPoolAsync",
    "cuMemCreate", "cuMemRelease", "cuMemFree", "cuMemFreeAsync", "cuMemGetInfo", "cuDeviceTotalMem",
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernelMultiDevice",
    "cuGraphLaunch", "cuCtxCreate", "cuDevicePrimaryCtxRetain", "cuGetProcAddress", "cuInit",
    "cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphInstantiate", "cuGraphInstantiateWithFlags",
    "cuGraphInstantiateWithParams", "cuMemPoolCreate", "cuMemMap", "cuMemUnmap", "cuMemRetainAllocationHandle",
    "cuArrayCreate", "cuArray3DCreate", "cuMipmappedArrayCreate", "cuArrayDestroy", "cuMipmappedArrayDestroy",
    "cuGraphAddMemAllocNode", "cuGraphAddMemFreeNode", "cuGraphAddNode", "cuGraphClone", "cuCtxSetLimit",
};

static void *g_cuda_handle, *g_nvml_handle;
static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT, g_nvml_once = PTHREAD_ONCE_INIT;

static void resolve_from(void *handle, const char *prefix) {
    dlsym_fn sym = real_dlsym();
    for (size_t i = 0; i < NN_HOOK_COUNT; i++)
        if (strncmp(g_hooks[i].name, prefix, strlen(prefix)) == 0)
            __atomic_store_n(g_hooks[i].real, sym(handle, g_hooks[i].name), __ATOMIC_RELEASE);
}

static void resolve_cuda_once(void) {
    g_cuda_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (g_cuda_handle == NULL) return;
    resolve_from(g_cuda_handle, "cu");
    dlsym_fn sym = real_dlsym();
#define NN_RESOLVE_HELPER(name) nn_real.name = (__typeof__(&name))sym(g_cuda_handle, #name);
    NN_CUDA_HELPERS(NN_RESOLVE_HELPER)
#undef NN_RESOLVE_HELPER
}

static void resolve_nvml_once(void) {
    g_nvml_handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (g_nvml_handle == NULL) return;
    resolve_from(g_nvml_handle, "nvml");
    dlsym_fn sym = real_dlsym();
#define NN_RESOLVE_HELPER(name) nn_real.name = (__typeof__(&name))sym(g_nvml_handle, #name);
    NN_NVML_HELPERS(NN_RESOLVE_HELPER)
#undef NN_RESOLVE_HELPER
}

void nn_resolve_cuda(void) { pthread_once(&g_cuda_once, resolve_cuda_once); }
void nn_resolve_nvml(void) { pthread_once(&g_nvml_once, resolve_nvml_once); }

/* The hook wrapping real function `fn`, or NULL. */
static void *hook_for(const void *fn) {
    if (fn == NULL) return NULL;
    for (size_t i = 0; i < NN_HOOK_COUNT; i++)
        if (__atomic_load_n(g_hooks[i].real, __ATOMIC_ACQUIRE) == fn || g_hooks[i].hook == fn)
            return g_hooks[i].hook; /* a driver whose own table binds to our interposed names */
    return NULL;
}

static void *substitute_symbol(void *fn, int cuda) {
    if (cuda) nn_resolve_cuda();
    else nn_resolve_nvml();
    void *hook = hook_for(fn);
    return hook != NULL ? hook : fn;
}

static int guarded(const char *symbol) {
    for (size_t i = 0; i < sizeof g_guarded / sizeof g_guarded[0]; i++)
        if (strcmp(symbol, g_guarded[i]) == 0) return 1;
    return 0;
}

/* RTLD_NEXT is relative to the caller, which glibc finds from dlsym's return address: that lookup
 * is passed on as a tail call (a jump), so the real dlsym sees the application's return address,
 * not ours. */
NN_UNINSTRUMENTED __attribute__((optimize("optimize-sibling-calls"))) NN_EXPORT void *dlsym(void *handle,
                                                                                            const char *name) {
    dlsym_fn sym = real_dlsym();
    if (sym == NULL) return NULL;
    if (handle == RTLD_NEXT) return sym(handle, name);
    void *fn = sym(handle, name);
    if (fn == NULL) return fn;
    int cuda = name[0] == 'c' && name[1] == 'u';
    int nvml = name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l';
    if (!cuda && !nvml) return fn;
    return substitute_symbol(fn, cuda);
}

/* ---- cuGetProcAddress ------------------------------------------------------------------------------ */

/* Names cuda.h maps onto a differently named entry point from a CUDA version on (its `#define`s for
 * the default API version): for those versions the driver may hand out a pointer of its own for the
 * old name, with the ABI of the new one, so the new name's hook (which calls the exported function)
 * stands in for it. */
typedef struct nn_alias {
    const char *symbol;
    int since; /* CUDA version, as cuGetProcAddress takes it */
    void *hook;
} nn_alias;

static const nn_alias g_aliases[] = {
    {"cuGraphInstantiate", 12000, (void *)&cuGraphInstantiateWithFlags},
};

static void *alias_for(const char *symbol, int version) {
    for (size_t i = 0; i < sizeof g_aliases / sizeof g_aliases[0]; i++)
        if (version >= g_aliases[i].since && strcmp(symbol, g_aliases[i].symbol) == 0) return g_aliases[i].hook;
    return NULL;
}

/* One line per refused name (at most NN_REFUSED_LOGGED names), so every gap shows, not just the first. */
#define NN_REFUSED_LOGGED 32
static void log_refused(const char *symbol, int version) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static char names[NN_REFUSED_LOGGED][64];
    static unsigned count;
    int fresh = 1;
    pthread_mutex_lock(&lock);
    for (unsigned i = 0; i < count && fresh; i++) fresh = strncmp(names[i], symbol, sizeof names[i] - 1) != 0;
    if (fresh && count < NN_REFUSED_LOGGED) snprintf(names[count++], sizeof names[0], "%s", symbol);
    else fresh = 0;
    pthread_mutex_unlock(&lock);
    if (fresh) nn_log("cuGetProcAddress(\"%s\", %d) returned a variant the shim does not wrap: refused", symbol, version);
}

static CUresult substitute(const char *symbol, int version, void **pfn, CUresult rc,
                           CUdriverProcAddressQueryResult *status) {
    if (rc != CUDA_SUCCESS || pfn == NULL || *pfn == NULL) return rc;
    void *hook = hook_for(*pfn);
    if (hook == NULL && symbol != NULL) hook = alias_for(symbol, version);
    if (hook != NULL) {
        *pfn = hook;
        return rc;
    }
    if (symbol != NULL && guarded(symbol)) {
        log_refused(symbol, version);
        *pfn = NULL;
        if (status != NULL) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    return rc;
}

NN_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status) {
    nn_resolve_cuda();
    if (nn_real.cuGetProcAddress_v2 == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = nn_real.cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    return substitute(symbol, version, pfn, rc, status);
}

NN_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    nn_resolve_cuda();
    if (nn_real.cuGetProcAddress == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = nn_real.cuGetProcAddress(symbol, pfn, version, flags);
    return substitute(symbol, version, pfn, rc, NULL);
}
