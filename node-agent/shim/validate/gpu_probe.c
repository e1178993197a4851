/*
 * gpu_probe.c — a GPU workload that reports what it got, for the real-node e2e tests (the GPU
 * test image, tests/images/gpu-probe): run as a container's command, it says which devices,
 * preload and region the container has, what the CUDA driver API shows it, and whether an
 * allocation past its limit fails — in itself, in a forked child and in an exec'd program — then
 * stays up so that `kubectl exec` can start more processes beside it.
 *
 *   gpu_probe report          one line: PROBE {"what": "report", ...}
 *   gpu_probe alloc MIB       cuMemAlloc of MIB MiB: PROBE {"what": "alloc", "result": "CUDA_…", ...}
 *   gpu_probe serve MIB       a forked child's `alloc MIB`, an exec'd `alloc MIB`, then its own
 *                             report and `alloc MIB`, then "PROBE {"what": "ready"}" and sleeps
 *                             until SIGTERM (exit 0)
 *
 * Every line is one JSON object after "PROBE ", so the test reads them from `kubectl logs`. The
 * driver is resolved as the CUDA runtime does (dlopen("libcuda.so.1") + cuGetProcAddress_v2), the
 * path the shim interposes; the region is read from the files the NRI plugin mounts
 * (/run/neuronetes/control, docs/contracts.md). Works the same on a real driver and on the fake.
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "neuronetes_region.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct driver {
    __typeof__(&cuInit) init;
    __typeof__(&cuDeviceGetCount) count;
    __typeof__(&cuDevicePrimaryCtxRetain) retain;
    __typeof__(&cuCtxSetCurrent) set_current;
    __typeof__(&cuMemGetInfo_v2) mem_info;
    __typeof__(&cuMemAlloc_v2) alloc;
    __typeof__(&cuMemFree_v2) free_;
    __typeof__(&cuGetErrorName) error_name;
} driver;

static const char *err_name(const driver *d, int rc) {
    const char *name = NULL;
    if (d->error_name == NULL || d->error_name((CUresult)rc, &name) != CUDA_SUCCESS || name == NULL)
        return "CUDA_ERROR_UNKNOWN";
    return name;
}

/* JSON string of `s` (quotes, backslashes and control characters escaped); at most 1 KiB. */
static void put_string(const char *s) {
    putchar('"');
    for (size_t i = 0; s != NULL && s[i] != '\0' && i < 1024; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

/* The driver through dlopen + cuGetProcAddress_v2; 0 on success, else a CUresult or -1. */
static int load(driver *d) {
    memset(d, 0, sizeof *d);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) return -1;
    __typeof__(&cuGetProcAddress_v2) proc = (__typeof__(&cuGetProcAddress_v2))dlsym(lib, "cuGetProcAddress_v2");
    if (proc == NULL) return -1;
#define RESOLVE(field, name)                                                                     \
    if (proc(name, (void **)&d->field, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, NULL) != CUDA_SUCCESS) \
        d->field = NULL;
    RESOLVE(init, "cuInit")
    RESOLVE(count, "cuDeviceGetCount")
    RESOLVE(retain, "cuDevicePrimaryCtxRetain")
    RESOLVE(set_current, "cuCtxSetCurrent")
    RESOLVE(mem_info, "cuMemGetInfo")
    RESOLVE(alloc, "cuMemAlloc")
    RESOLVE(free_, "cuMemFree")
    RESOLVE(error_name, "cuGetErrorName")
#undef RESOLVE
    if (!d->init || !d->count || !d->retain || !d->set_current || !d->mem_info || !d->alloc || !d->free_) return -1;
    int rc = d->init(0);
    if (rc != CUDA_SUCCESS) return rc;
    CUcontext ctx;
    if ((rc = d->retain(&ctx, 0)) != CUDA_SUCCESS) return rc;
    return d->set_current(ctx);
}

static int shim_loaded(void) {
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps == NULL) return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, maps) != NULL) found = strstr(line, "libneuronetes-cuda.so") != NULL;
    fclose(maps);
    return found;
}

static void put_file(const char *path) {
    char buf[1025] = "";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0) close(fd);
    if (n < 0) {
        printf("null");
        return;
    }
    buf[n] = '\0';
    put_string(buf);
}

/* The NVIDIA entries of the container's /dev (device nodes, the nvidia-caps folder), sorted by name. */
static void put_devices(void) {
    struct dirent **names = NULL;
    int n = scandir("/dev", &names, NULL, alphasort);
    printf("[");
    int first = 1;
    for (int i = 0; i < n; i++) {
        if (strncmp(names[i]->d_name, "nvidia", 6) == 0) {
            printf("%s\"/dev/%s\"", first ? "" : ", ", names[i]->d_name);
            first = 0;
        }
        free(names[i]);
    }
    free(names);
    printf("]");
}

/* The region's limits as the agent wrote them (the control file the NRI plugin mounts). */
static void put_control(void) {
    int fd = open(NN_CONTROL_PATH, O_RDONLY | O_CLOEXEC);
    void *map = fd < 0 ? MAP_FAILED : mmap(NULL, NN_CONTROL_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (map == MAP_FAILED) {
        printf("null");
        return;
    }
    const nn_control *c = map;
    char pod_uid[NN_POD_UID_BYTES + 1] = "";
    memcpy(pod_uid, c->container.pod_uid, NN_POD_UID_BYTES);
    printf("{\"memory_limit_bytes\": %llu, \"pod_uid\": ", (unsigned long long)c->container.memory_limit_bytes);
    put_string(pod_uid);
    printf(", \"devices\": [");
    unsigned count = c->container.device_count < NN_MAX_DEVICES ? c->container.device_count : NN_MAX_DEVICES;
    for (unsigned i = 0; i < count; i++) {
        char uuid[NN_UUID_BYTES + 1] = "";
        memcpy(uuid, c->devices[i].uuid, NN_UUID_BYTES);
        printf("%s{\"uuid\": ", i ? ", " : "");
        put_string(uuid);
        printf(", \"memory_limit_bytes\": %llu, \"compute_share_percent\": %u}",
               (unsigned long long)c->devices[i].memory_limit_bytes, c->devices[i].compute_share_percent);
    }
    printf("]}");
    munmap(map, NN_CONTROL_SIZE);
}

static int report(void) {
    driver d;
    int rc = load(&d);
    int count = 0;
    size_t free_b = 0, total_b = 0;
    if (rc == 0) d.count(&count);
    if (rc == 0) rc = d.mem_info(&free_b, &total_b);
    printf("PROBE {\"what\": \"report\", \"pid\": %d, \"shim\": %s, \"cuda_visible_devices\": ", (int)getpid(),
           shim_loaded() ? "true" : "false");
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible != NULL)
        put_string(visible);
    else
        printf("null");
    printf(", \"devices\": ");
    put_devices();
    printf(", \"preload\": ");
    put_file("/etc/ld.so.preload");
    printf(", \"control\": ");
    put_control();
    printf(", \"cuda\": {\"result\": ");
    put_string(rc == 0 ? "CUDA_SUCCESS" : rc < 0 ? "no driver" : err_name(&d, rc));
    printf(", \"devices\": %d, \"total_bytes\": %zu, \"free_bytes\": %zu}}\n", count, total_b, free_b);
    fflush(stdout);
    return rc == 0 ? 0 : 1;
}

static int alloc(const char *label, unsigned long long mib) {
    driver d;
    int rc = load(&d);
    CUdeviceptr ptr = 0;
    if (rc == 0) rc = d.alloc(&ptr, (size_t)(mib << 20));
    printf("PROBE {\"what\": \"alloc\", \"by\": ");
    put_string(label);
    printf(", \"pid\": %d, \"shim\": %s, \"mib\": %llu, \"result\": ", (int)getpid(), shim_loaded() ? "true" : "false",
           mib);
    put_string(rc == 0 ? "CUDA_SUCCESS" : rc < 0 ? "no driver" : err_name(&d, rc));
    printf("}\n");
    fflush(stdout);
    if (rc == 0) d.free_(ptr);
    return rc == 0 ? 0 : 1;
}

static volatile sig_atomic_t g_stop;
static void on_term(int sig) {
    (void)sig;
    g_stop = 1;
}

static void run_child(char *self, const char *mib, int exec_it) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (exec_it) {
            char *argv[] = {self, "alloc", (char *)mib, "exec", NULL};
            execv("/proc/self/exe", argv);
            _exit(127);
        }
        _exit(alloc("fork", strtoull(mib, NULL, 10)) == 0 ? 0 : 1);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
}

static int serve(char *self, const char *mib) {
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    /* The children first: a process must not fork after it initialised CUDA. */
    run_child(self, mib, 0);
    run_child(self, mib, 1);
    report();
    alloc("main", strtoull(mib, NULL, 10));
    printf("PROBE {\"what\": \"ready\"}\n");
    fflush(stdout);
    while (!g_stop) pause();
    return 0;
}

int main(int argc, char **argv) {
    const char *cmd = argc > 1 ? argv[1] : "report";
    if (strcmp(cmd, "report") == 0) return report();
    if (strcmp(cmd, "alloc") == 0 && argc > 2) return alloc(argc > 3 ? argv[3] : "alloc", strtoull(argv[2], NULL, 10));
    if (strcmp(cmd, "serve") == 0 && argc > 2) return serve(argv[0], argv[2]);
    fprintf(stderr, "usage: gpu_probe report | alloc MIB | serve MIB\n");
    return 2;
}
